"""`bisect-pipeline run [OPTIONS] SCRIPT [ARGS...]` (or `-m MODULE [ARGS...]`): the user's
script, unchanged, run as `python SCRIPT ARGS` would run it (same sys.argv, __main__,
sys.path[0], working directory), in this process, inside a loop.Session: its own
training loop is the step.

Exit status: 0 with a verdict; 1 without one (the script ended first, raised, or no
training loader was found), a partial report written; 2 on usage errors; 130/143 on
Ctrl-C/SIGTERM. A script that raises shows its own traceback, not the tool's.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import Any, Callable, Optional

from .core.errors import BisectError
from .loop import Session
from .loop_end import ScriptStopped
from .report import Report


class Ended(Exception):
    """How the script ended, for the CLI: `code` to exit with, `message` to print."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def target_of(args: tuple) -> tuple[Optional[str], Optional[str], list]:
    """(script path, module, the script's own arguments) from the command line's
    arguments after the options: SCRIPT ARGS... or -m MODULE ARGS..."""
    args = list(args)
    if not args:
        raise BisectError("give the script to run: bisect-pipeline run train.py [ARGS...] (or -m MODULE [ARGS...]).")
    if args[0] == "-m":
        if len(args) < 2:
            raise BisectError("-m needs a module: bisect-pipeline run -m package.train [ARGS...].")
        return None, args[1], args[2:]
    if args[0].startswith("-"):
        raise BisectError(f"unknown option {args[0]!r} before the script: the tool's options come first, then the "
                          "script and its own arguments (bisect-pipeline run [OPTIONS] train.py [ARGS...]).")
    script = args[0]
    if not os.path.isfile(script):
        raise BisectError(f"no script {script!r} (from {os.getcwd()}): bisect-pipeline run [OPTIONS] train.py [ARGS...].")
    return script, None, args[1:]


def run(args: tuple, session: Session, *, interrupt_code: Callable[[], int]) -> Report:
    """Run the script inside `session`; its report. Raises Ended when the run has no
    verdict, with the exit status and what to say."""
    script, module, script_args = target_of(args)
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    outcome: Any = None
    try:
        with session:
            try:
                _run_target(script, module, script_args)
            except ScriptStopped:
                raise
            except SystemExit as exc:
                outcome = ("exit", exc.code)
            except KeyboardInterrupt:
                outcome = ("interrupt", None)
                raise
            except BaseException as exc:  # the script's own error: shown as its own
                outcome = ("raised", exc)
            session.script_ended(*(outcome or ("ended", None)))
    except KeyboardInterrupt:
        pass
    finally:
        sys.argv[:], sys.path[:] = saved_argv, saved_path
    return _outcome(session, outcome, interrupt_code)


def _run_target(script: Optional[str], module: Optional[str], script_args: list) -> None:
    if module is not None:
        sys.argv[:] = [module] + script_args  # run_module sets argv[0] to the module's file
        sys.path.insert(0, os.getcwd())
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    path = os.path.abspath(script)
    sys.argv[:] = [script] + script_args
    sys.path.insert(0, os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")


def _outcome(session: Session, outcome: Any, interrupt_code: Callable[[], int]) -> Report:
    report = session.report
    kind, detail = outcome or (None, None)
    if kind == "raised":
        _print_script_traceback(detail)
    if kind == "interrupt":
        raise Ended(interrupt_code(), "interrupted" + ("; the partial report is written" if report else ""))
    if getattr(session, "stopped", None) is not None:  # under torchrun: a signal, or a rank lost, stopped every rank
        raise Ended(interrupt_code(report), "stopped; the partial report is written")
    if report is not None and report.bottleneck is not None and kind in (None, "exit"):
        return report  # (exit: the script exited on its own after the verdict, keep_training)
    raise Ended(1, _no_verdict(session, report, kind, detail))


def _no_verdict(session: Session, report: Optional[Report], kind: Optional[str], detail: Any) -> str:
    gave_up = getattr(session, "gave_up", None)
    if gave_up:  # the loop ran its --max-seconds with no loader the tool can cache (loop_end.Ending._waiting)
        return gave_up
    if kind == "raised":
        why = f"your script raised {type(detail).__name__}: {detail}"
    elif kind == "exit":
        why = f"your script exited (sys.exit({detail!r}))"
    else:
        why = "your script ended"
    if session.exp is None:
        return f"{why} before anything was measured: {session.summary_of_what_was_seen()}."
    if report is None:
        return f"{why} before a verdict."
    if session.ended is None:  # the experiment was over first, without a verdict: the tool stopped the script
        return f"no verdict: {report.verdict.reason}; the partial report is written."
    if (report.measurements.source or {}).get("ended"):  # the report opens with what it gave and needed
        return f"{why} before a verdict: no verdict, the partial report is written (see its first paragraph)."
    return f"{why} before a verdict ({report.verdict.reason}); the partial report is written."


def _print_script_traceback(exc: BaseException) -> None:
    """The script's traceback, as python would show it: the frames of runpy and of this
    tool left out."""
    tb = exc.__traceback__
    here = os.path.dirname(os.path.abspath(__file__))
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(here)
                              or os.path.basename(tb.tb_frame.f_code.co_filename) == "runpy.py"
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
