"""The one exception type the CLI turns into a clean message and an exit code."""

from __future__ import annotations


class BisectError(Exception):
    """A problem with the user's input: the message names it and says how to fix it.

    The CLI prints the message alone (exit 2) and the traceback only with --debug.
    """

    exit_code = 2


class AnalysisFailed(BisectError):
    """Deriving the report from a run's measurements failed: a bug of the tool's, not a
    problem with the user's input. `measurements` keeps what was measured: the CLI writes
    them to --json (report.document.measured_dict), for a fixed version to diagnose again
    (Report.from_dict), so that a bug in the analysis loses none of the run."""

    exit_code = 1

    def __init__(self, measurements, cause: BaseException) -> None:
        super().__init__(f"the report could not be derived from the measurements: {type(cause).__name__}: {cause} "
                         "(a bug in bisect-pipeline: please report it with the traceback --debug prints)")
        self.measurements = measurements
