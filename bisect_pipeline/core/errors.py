"""The one exception type the CLI turns into a clean message and an exit code."""

from __future__ import annotations


class BisectError(Exception):
    """A problem with the user's input: the message names it and says how to fix it.

    The CLI prints the message alone (exit 2) and the traceback only with --debug.
    """

    exit_code = 2
