"""The command line: parse, call `bisect`, render, exit. Thin by design."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import traceback
from typing import Any, Callable, Optional

import click

from . import api
from .core import faults
from .core.errors import AnalysisFailed, BisectError
from .derive.drops import POINTS
from .measure import board, distributed
from .pipeline import entry
from .progress import make_progress
from .report import Report

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143

SECURITY_NOTE = ("--entry imports and runs your code (like `uvicorn app:app`): point it only at code you trust.")


def run_options(f: Callable) -> Callable:
    """The options of a run, shared by the main command and `demo`."""
    options = [
        click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True),
                     help="Write the result as JSON to this file (atomically; a partial result on failure or Ctrl-C)."),
        click.option("--html", "html_path", type=click.Path(dir_okay=False, writable=True),
                     help="Write the report as one self-contained HTML file."),
        click.option("--max-seconds", type=click.FloatRange(min=1.0), default=api.DEFAULT_MAX_SECONDS, show_default=True,
                     help="Hard bound on the whole run: the bisection, the advice's check, --tune's search and "
                          "--patch's check all fit in it (divided up front; the report says how). Only the start-up "
                          "before (imports; under run, your script up to its training loader) is not counted."),
        click.option("--device", default=None,
                     help="Device to train on, e.g. cpu, cuda, cuda:1.  [default: cuda if available, else cpu]"),
        click.option("--points", default=None, metavar="LIST",
                     help=f"Comma-separated subset of the points to measure (full is always needed): {','.join(POINTS)}."),
        click.option("--cache-mb", type=click.FloatRange(min=1.0), default=api.DEFAULT_CACHE_MB, show_default=True,
                     help="Memory budget of the caches; fewer distinct batches are kept when it is reached."),
        click.option("--step-timeout", type=click.FloatRange(min=0.1), default=faults.DEFAULT_STEP_TIMEOUT,
                     show_default=True,
                     help="Watchdog: a point whose step or batch makes no progress for this long fails "
                          "(\"no batch in N s\"), its workers are terminated, and the run goes on."),
        click.option("--hold-allocator/--no-hold-allocator", default=True, show_default=True,
                     help="Hold glibc's malloc still during the run (freed memory reused, not handed back to the OS), "
                          "so the step costs the same at every point; the step is timed alone before and after, for "
                          "the 'allocator' advice. Only on Linux with glibc."),
        click.option("--verify-seconds", type=click.FloatRange(min=0.0), default=None, metavar="SECONDS",
                     help="Time to measure the settings the advice recommends (num_workers, threads, pin_memory, ...) "
                          "against yours before printing them, and, when augment is the bottleneck (or tied for the lead), its costliest "
                          "transform within the pipeline. 0 turns it off; a number is a budget of its own, on "
                          "top of --max-seconds.  [default: what the bisection leaves of --max-seconds; at least 25% once a verdict is made]"),
        click.option("--breakdown", type=click.Choice(["bottleneck", "all"]), default="bottleneck", show_default=True,
                     help="Which stages the text and HTML reports show part by part (the augment stage transform "
                          "by transform; load's reading and decoding; collate's stacking and your collate_fn's own "
                          "work): the bottleneck only (or the two stages an inconclusive verdict could not tell apart), or every stage measured by parts (the JSON always holds them)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress; print only the verdict line."),
        click.option("--brief", is_flag=True,
                     help="Print only the report's summary (at most 6 lines: the verdict, how firm it is, the first "
                          "change with its measured figure, what to measure next): for logs and CI."),
        click.option("--debug", is_flag=True,
                     help="Show tracebacks of errors, and each failed point's original error beside the cause the "
                          "report tells."),
        click.option("--tune", is_flag=True,
                     help="After the bisection and the check, search the loader's settings (num_workers, "
                          "persistent_workers, prefetch_factor, pin_memory on an accelerator, the step's threads on a "
                          "CPU) by measuring them against yours on the full pipeline; under `run`, the best is also "
                          "written against your script (a diff, or the flags to rerun with). Takes half of "
                          "--max-seconds; raise it (e.g. 120) for a search that covers your cores."),
        click.option("--sweep", "sweep", multiple=True, metavar="NAME=V1,V2,...",
                     help="What-if sweep instead of the bisection: rerun the full pipeline under each combination "
                          "of these settings and compare with yours. Repeatable; NAME is num_workers, pin_memory, "
                          "prefetch_factor, persistent_workers, batch_size or torch_threads (e.g. --sweep num_workers=0,2,4)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=SECURITY_NOTE)
@click.option("--entry", "entry_spec", metavar="MODULE:FUNCTION",
              help="Entry function returning your workload: mymod:make (importable from the current directory) "
                   "or path/to/file.py:make. It returns bisect_pipeline.Workload(model=..., loader=...), a dict with "
                   "those keys, or a (model, loader) tuple.")
@run_options
@click.version_option(package_name="bisect-pipeline", prog_name="bisect-pipeline")
@click.pass_context
def main(ctx: click.Context, entry_spec: Optional[str], **opts: Any) -> None:
    """Find which stage of a PyTorch input pipeline starves the training step.

    Trains with the data cached at each point of the pipeline (device, host, collated,
    augmented, raw, full) and names the stage where throughput drops: load, augment,
    collate, handoff, transfer, or none.

    \b
      bisect-pipeline --entry mymod:make --json result.json
      bisect-pipeline demo
    """
    api.mark_process_start()  # the start-up before the run (imports, the entry or the script) is reported
    board.supervise()  # under torchrun: this process becomes the rank's supervisor, its child the rank
    if ctx.invoked_subcommand is not None:
        return
    if not entry_spec:
        raise click.UsageError("give --entry MODULE:FUNCTION (or run `bisect-pipeline demo`).")
    _run(lambda: entry.load(entry_spec), **opts)


@main.command()
@run_options
def demo(**opts: Any) -> None:
    """Run the built-in demo workload (a small CNN on CPU with a slow augmentation)."""
    from .demo import make

    _run(make, **opts)


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                       "help_option_names": ["-h", "--help"]})
@run_options
@click.option("--loader", "loader_index", type=click.IntRange(min=1), default=None, metavar="N",
              help="Measure the N-th DataLoader your script iterates (from 1) instead of the one it takes optimizer "
                   "steps on.")
@click.option("--keep-training", is_flag=True,
              help="After the verdict, hand the loop back to your real loader and let the script run to its end "
                   "(by default it is stopped cleanly: its finally blocks run).")
@click.option("--patch", "patch_path", type=click.Path(dir_okay=False, writable=True), default=None, metavar="FILE",
              help="With --tune: write the change as a unified diff to FILE (git apply FILE, or patch -p1 < FILE; "
                   "your script is never written), then run your script with the change against it as it is, in "
                   "alternating runs, and report the speed-up with the change applied.")
@click.argument("script", nargs=-1, type=click.UNPROCESSED)
def run_script(script: tuple, loader_index: Optional[int], keep_training: bool, patch_path: Optional[str],
               **opts: Any) -> None:
    """Diagnose your own training script, unchanged: SCRIPT [ARGS...] or -m MODULE [ARGS...].

    Runs it as python would (same sys.argv, __main__, sys.path[0], working directory) and
    makes its own training loop the step: the loader it trains on hands the loop batches
    cached at each point in turn, and the time between its requests is measured. The
    report goes to stderr (your script keeps stdout), --json and --html as usual.

    The model trains on repeated cached batches during the experiment: run it on a copy
    of your checkpoint, or let it stop at the verdict (the default).

    \b
      bisect-pipeline run train.py --epochs 30
      bisect-pipeline run --json r.json -m mypkg.train --lr 0.1
    """
    if opts.pop("sweep"):
        raise click.UsageError("--sweep takes an entry (--entry MODULE:FUNCTION), not a script.")
    if patch_path and not opts["tune"]:
        raise click.UsageError("--patch writes the change the search of --tune finds: give --tune too.")
    _run_script(script, loader_index=loader_index, keep_training=keep_training, patch_path=patch_path, **opts)


@main.command()
@click.argument("before", type=click.Path(dir_okay=False))
@click.argument("after", type=click.Path(dir_okay=False))
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True),
              help="Write the comparison as JSON to this file.")
def compare(before: str, after: str, json_path: Optional[str]) -> None:
    """Compare two results written with --json: per point and stage, what changed beyond the noise."""
    from . import compare as compare_mod

    sys.exit(compare_mod.main(before, after, json_path))


_signals_seen: list = []


def _on_sigterm(signum, frame) -> None:
    # SIGTERM takes the Ctrl-C path (partial result written, workers shut down), exit 143;
    # SIGINT comes here too, so that both are remembered if their exception is swallowed.
    # Under a torchrun lockstep it is only noted: the next agreement stops every rank;
    # while a worker pool starts or stops, until it has (faults.signals_held).
    _signals_seen.append(signum)
    faults.INTERRUPT_REQUESTED[0] = signum
    if faults.interrupt_now():
        raise KeyboardInterrupt()


def _handle_signals(*signums: int) -> Callable[[], None]:
    """Send these signals to _on_sigterm; the function that puts the handlers back. A
    process forked meanwhile (a DataLoader worker) gets them back at once
    (faults.undo_in_child): a worker that is told to stop stops as it would without us."""
    previous = {signum: signal.signal(signum, _on_sigterm) for signum in signums}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    undo = faults.undo_in_child(restore)

    def put_back() -> None:
        faults.forget_in_child(undo)
        if board.supervised():  # a torchrun rank, about to exit: the launcher's late SIGTERM must not kill it
            for signum in previous:  # with the code it is about to exit with written and said
                signal.signal(signum, signal.SIG_IGN)
        else:
            restore()

    return put_back


def _interrupt_code(report: Optional[Report] = None) -> int:
    """130/143 for the signal this process got; under torchrun, a rank no signal reached
    exits as the signal that stopped the job did, or 1 when a rank was lost."""
    if _signals_seen:
        return EXIT_SIGTERM if signal.SIGTERM in _signals_seen else EXIT_SIGINT
    if getattr(report, "lost_ranks", None):
        return EXIT_FAILED
    if any(sig == "SIGTERM" for _, sig in getattr(report, "stopped_by", ())):
        return EXIT_SIGTERM
    return EXIT_SIGINT


def _writes(report: Report) -> bool:
    """Whether this process prints and writes the report: rank 0, or under torchrun the
    rank the job's report names (the lowest surviving one when rank 0 was lost)."""
    writer = getattr(report, "writer", None)
    return distributed.rank() == 0 if writer is None else writer == report.rank


def _run(make_workload: Callable, *, json_path, html_path, max_seconds, device, points, cache_mb, quiet, debug,
         step_timeout=faults.DEFAULT_STEP_TIMEOUT, sweep=(), hold_allocator=True, verify_seconds=None,
         breakdown="bottleneck", tune=False, brief=False) -> None:
    if sweep and tune:
        raise click.UsageError("--sweep and --tune: the sweep measures the settings you list, the search finds "
                               "them; give one of them.")
    # Under torchrun: start the process group before the entry builds its DDP model.
    started = distributed.init_from_env(device)
    rank0 = distributed.rank() == 0
    progress = make_progress(max_seconds, quiet=quiet or not rank0)  # None when quiet or stderr is not a terminal
    _signals_seen.clear()
    faults.INTERRUPT_REQUESTED[0] = False
    put_back = _handle_signals(signal.SIGTERM, signal.SIGINT)
    if distributed.env_world_size() > 1:
        _arm_rescue(step_timeout, json_path=json_path, html_path=html_path, breakdown=breakdown, quiet=quiet,
                    brief=brief)
    code = EXIT_OK
    try:
        try:
            if sweep:
                from . import sweep as sweep_mod

                sys.exit(sweep_mod.main(make_workload, sweep, json_path=json_path, max_seconds=max_seconds, device=device,
                                        quiet=quiet, debug=debug, progress=progress, interrupt_code=_interrupt_code))
            point_list = [p.strip() for p in points.split(",") if p.strip()] if points else None
            workload = make_workload()
            try:
                report = api.bisect(workload=workload, device=device, max_seconds=max_seconds, points=point_list,
                                    step_timeout=step_timeout, hold_allocator=hold_allocator,
                                    verify_seconds=verify_seconds, tune=tune,
                                    cache_mb=cache_mb, progress=progress)
            finally:
                if progress:
                    progress.done()  # a clean line for the report, or for the error that follows
        except api.Interrupted as exc:
            report = exc.report
            code = _interrupt_code(report)
        except KeyboardInterrupt:
            _fail("interrupted before anything was measured", _interrupt_code())
        except BisectError as exc:
            if debug:
                traceback.print_exc()
            _fail(_saved(exc, json_path), exc.exit_code)
        except Exception as exc:
            if debug:
                traceback.print_exc()
            _fail(f"the run failed: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", EXIT_FAILED)
        if _writes(report):  # only rank 0 (or the lowest surviving rank) writes files and prints the report
            _write_outputs(report, json_path, html_path, breakdown)
            click.echo(_shown(report, quiet, brief, breakdown))
            if debug:
                _show_errors(report)
        if code == EXIT_OK and _signals_seen:  # interrupted, though the run got to its end
            code = _interrupt_code()
        if code == EXIT_OK and report.bottleneck is None:
            code = EXIT_FAILED
    finally:
        if progress:
            progress.done()  # gives the cursor back on every path (done twice is a no-op)
        _disarm_rescue()
        try:
            distributed.shutdown(started)
        finally:  # a signal during the shutdown still takes the handler's path
            put_back()
            faults.INTERRUPT_REQUESTED[0] = False
    sys.exit(code)


# Under torchrun, how long a rank's main thread has to answer a SIGTERM before the rescue
# writes what was measured from another thread (the launcher kills it 30 s after).
RESCUE_GRACE_S = 10.0


def _arm_rescue(step_timeout: Optional[float], **outputs: Any) -> None:
    """Under torchrun: the last resort (faults.Rescue) of a rank whose main thread is stuck
    in native code when a SIGTERM comes, or long past the run's end: what was measured is
    written (by the writer rank), and the process exits from the rescue's thread."""

    def act(signum: int) -> None:
        code = (EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT) if signum else EXIT_FAILED
        why = (f"{board.signal_name(signum)} came {RESCUE_GRACE_S:g} s ago" if signum else
               "the run is long past its end")
        try:
            click.echo(f"bisect-pipeline: rank {distributed.rank()}: {why} and the run has not stopped (stuck in "
                       "native code: a collective or a device sync): writing what was measured", err=True)
            rescue = faults.RESCUE[0]
            report = rescue.report(signum) if rescue is not None and rescue.report is not None else None
            if report is not None and _writes(report):
                _write_outputs(report, outputs["json_path"], outputs["html_path"], outputs["breakdown"])
                click.echo(_shown(report, outputs["quiet"], outputs["brief"], outputs["breakdown"]),
                           err=outputs.get("err", False))
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(code)

    faults.RESCUE[0] = faults.Rescue(act, RESCUE_GRACE_S, late=step_timeout or 0.0).arm()


def _disarm_rescue() -> None:
    if faults.RESCUE[0] is not None:
        faults.RESCUE[0].disarm()
        faults.RESCUE[0] = None


def _run_script(script: tuple, *, loader_index, keep_training, json_path, html_path, max_seconds, device, points,
                cache_mb, quiet, debug, step_timeout, hold_allocator, verify_seconds, breakdown="bottleneck", tune=False,
                patch_path=None, brief=False) -> None:
    from . import script as script_mod
    from .progress import Lines
    from .loop import Session

    rank0 = distributed.rank() == 0
    made: list = []

    def on_report(report: Report) -> None:  # once: at the verdict, or partial at the end
        made.append(report)
        if _writes(report):  # rank 0, or under torchrun the lowest surviving rank
            _write_outputs(report, json_path, html_path, breakdown)
            if (report.measurements.source or {}).get("ended", {}).get("no_loader"):
                return  # nothing measured: the one paragraph that says why is script.run's
            if not patch_path:  # with --patch: printed once the change is checked
                click.echo(_shown(report, quiet, brief, breakdown), err=True)
            if debug:
                _show_errors(report)

    _signals_seen.clear()
    faults.INTERRUPT_REQUESTED[0] = False
    put_back = _handle_signals(signal.SIGTERM)
    if distributed.env_world_size() > 1:
        _arm_rescue(step_timeout, json_path=json_path, html_path=html_path, breakdown=breakdown, quiet=quiet,
                    brief=brief, err=True)  # under run, the report goes to stderr
    code = EXIT_OK
    try:
        point_list = [p.strip() for p in points.split(",") if p.strip()] if points else None
        session = Session(loader=loader_index, keep_training=keep_training, device=device, max_seconds=max_seconds,
                          points=point_list, cache_mb=cache_mb, step_timeout=step_timeout,
                          verify_seconds=verify_seconds, hold_allocator=hold_allocator, tune=tune,
                          patch=bool(patch_path), progress=None if quiet or not rank0 else Lines(),
                          on_report=on_report)
        session.argv = list(script) if script[:1] != ("-m",) else ["-m", *script[1:]]
        script_mod.run(script, session, interrupt_code=_interrupt_code)
    except script_mod.Ended as end:
        if end.message and rank0:
            click.echo(f"bisect-pipeline: {end.message}", err=True)
        code = end.code
    except BisectError as exc:
        if debug:
            traceback.print_exc()
        _fail(_saved(exc, json_path), exc.exit_code)
    try:  # SIGTERM still takes the Ctrl-C path: the check's copy of the script is removed
        if patch_path and made and rank0:
            # the check ends with --max-seconds, counted from the training loader's creation
            end = session.exp.start + max_seconds if session.exp is not None else None
            interrupted = _change(made[-1], script, patch_path=patch_path, json_path=json_path, html_path=html_path,
                                  breakdown=breakdown, quiet=quiet, brief=brief, end=end,
                                  checked=code == EXIT_OK and not _signals_seen)
            if interrupted and code == EXIT_OK:
                code = _interrupt_code()
    finally:
        _disarm_rescue()
        put_back()
        faults.INTERRUPT_REQUESTED[0] = False
    if code == EXIT_OK and _signals_seen:
        code = _interrupt_code()
    sys.exit(code)


def _change(report: Report, script: tuple, *, patch_path, json_path, html_path, breakdown, quiet, end,
            checked: bool, brief: bool = False) -> bool:
    """--patch: the diff written to `patch_path`, the change checked by running the
    script with it against it as it is (change.check; not after an interrupt or a run
    without a verdict), the outputs written again, the report printed. True when the
    check was interrupted."""
    from .advise import change
    from . import script as script_mod
    from .report import write_atomic

    m = report.measurements
    interrupted = False
    p = (m.tune.patch or {}) if m.tune is not None else {}
    if p.get("diff"):
        write_atomic(patch_path, p["diff"])
        m = dataclasses.replace(m, tune=dataclasses.replace(m.tune, patch={**p, "written": patch_path}))
    elif not quiet:
        click.echo(f"bisect-pipeline: no diff to write to {patch_path}: "
                   + (p.get("reason") or "the change is the command line only" if p else "--tune found no change"),
                   err=True)
    if checked and m.tune is not None:
        path, module, args = script_mod.target_of(script)
        try:
            m = change.check(m, change.Target(path, module, tuple(args)), end=end,
                             emit=(lambda s: None) if quiet else (lambda s: click.echo(f"bisect-pipeline: {s}",
                                                                                       err=True)))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the report without the check
            interrupted = True
            m = dataclasses.replace(m, tune=dataclasses.replace(m.tune, applied_reason="interrupted"))
    report = Report.of(m)
    _write_outputs(report, json_path, html_path, breakdown)
    click.echo(_shown(report, quiet, brief, breakdown), err=True)
    return interrupted


def _shown(report: Report, quiet: bool, brief: bool, breakdown: str) -> str:
    """What is printed of the report: the verdict line (--quiet), the summary (--brief), or all of it."""
    return report.summary if quiet else report.brief() if brief else report.text(breakdown=breakdown)


def _write_outputs(report: Report, json_path: Optional[str], html_path: Optional[str],
                   breakdown: str = "bottleneck") -> None:
    if json_path:
        report.save_json(json_path)
    if html_path:
        from .report import write_atomic
        from .report.html import to_document

        write_atomic(html_path, to_document(report, breakdown=breakdown))


def _show_errors(report: Report) -> None:
    """--debug: each failed point's original error (the report tells its cause)."""
    for p in report.points:
        if p.status == "failed" and p.error:
            click.echo(f"bisect-pipeline: {p.point} failed; the original error:\n{p.error}", err=True)


def _saved(exc: BisectError, json_path: Optional[str]) -> str:
    """The error's message; where it is AnalysisFailed (a bug deriving the report) and
    --json was given, the measurements written there first (document.measured_dict),
    and the message says so: a bug in the analysis loses none of the run."""
    if not isinstance(exc, AnalysisFailed) or not json_path or distributed.rank() != 0:
        return str(exc)
    import json

    from .report import write_atomic
    from .report.document import measured_dict

    write_atomic(json_path, json.dumps(measured_dict(exc.measurements, str(exc)), indent=2) + "\n")
    return (f"{exc}. What was measured is in {json_path}: a fixed version reads it back with "
            "bisect_pipeline.Report.from_dict")


def _fail(message: str, code: int) -> None:
    click.echo(f"bisect-pipeline: error: {message}", err=True)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
