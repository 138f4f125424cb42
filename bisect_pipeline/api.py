"""`bisect()`: describe, fill, hold, isolate, measure the points, report. Never prints."""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Iterable, Optional

import torch

from . import phases
from .advise.tune import CHECK_SHARE, TUNE_SHARE
from .advise.verify import VERIFY_SHARE
from .core import faults
from .core.errors import BisectError
from .derive.drops import POINTS
from .measure import allocator, board, devices, distributed
from .measure.cache import DEFAULT_CACHE_BATCHES
from .measure.experiment import Experiment
from .measure.plan import DEFAULT_CACHE_MB, DEFAULT_MAX_SECONDS, Budget, Plan, plan_budget
from .measure.visit import drive_all
from .phases import Options
from .pipeline import integrations, state
from .pipeline import loader as loader_mod
from .pipeline.workload import Workload, validate
from .report import Report
from .report.ranks import combine


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; `.report` holds the points measured so far."""

    def __init__(self, report: Report) -> None:
        super().__init__("interrupted")
        self.report = report


def bisect(
    model: Optional[torch.nn.Module] = None,
    loader: Any = None,
    *,
    optimizer: Optional[torch.optim.Optimizer] = None,
    loss_fn: Optional[Callable] = None,
    step: Optional[Callable[[Any], Any]] = None,
    to_device: Optional[Callable[[Any, torch.device], Any]] = None,
    batch_size: Any = None,
    workload: Optional[Workload] = None,
    device: Any = None,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    points: Optional[Iterable[str]] = None,
    cache_mb: float = DEFAULT_CACHE_MB,
    cache_batches: int = DEFAULT_CACHE_BATCHES,
    step_timeout: Optional[float] = faults.DEFAULT_STEP_TIMEOUT,
    verify_seconds: Optional[float] = None,
    plan: Optional[Plan] = None,
    hold_allocator: bool = True,
    tune: bool = False,
    progress: Optional[Callable[[dict], None]] = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Report:
    """Find the stage of `loader`'s pipeline that starves `model`'s training step: the
    throughput with the data cached at each point, the stage where it drops, and advice
    measured before it is printed (verify.py), as a Report. The loader is never iterated;
    model, optimizer, RNG states and thread count are restored. Options: README "Python API"."""
    wl = workload or Workload(model=model, loader=loader, optimizer=optimizer, loss_fn=loss_fn, step=step,
                              to_device=to_device, batch_size=batch_size)
    validate(wl, "bisect()")
    dev = devices.resolve(device)
    options = Options(check_options(points, max_seconds=max_seconds, cache_mb=cache_mb, cache_batches=cache_batches,
                                    step_timeout=step_timeout, verify_seconds=verify_seconds),
                      max_seconds, cache_mb, cache_batches, step_timeout, verify_seconds, plan, hold_allocator, tune)
    coord = distributed.Coordinator.current()  # None unless a process group of 2+ ranks is up
    try:
        if coord is not None:
            coord.watch(wl.model)
        exp = start(describe(wl.loader), dev, options, coord=coord, clock=clock, progress=progress)
        held = allocator.Held(hold_allocator)
        rescue_with(exp, coord, lambda: Report.of(exp.measurements(options.points, held=held.record(),
                                                                    interrupted=True)))
        stop = _measure(exp, wl, options, coord=coord, held=held)
        if faults.RESCUE[0] is not None:
            faults.RESCUE[0].final()  # the rescue of a stuck main thread stands aside (or holds it here)
        report = Report.of(exp.measurements(options.points, held=held.record(), interrupted=stop is not None))
        if coord is not None:  # every surviving rank's result, also when stopped (distributed.gather_reports)
            report = combine(report, distributed.gather_reports(report, coord, exp.waits, stop), coord.rank)
    finally:
        if coord is not None:
            coord.release()
            if faults.RESCUE[0] is not None:
                faults.RESCUE[0].report = None
    if stop is not None:
        raise Interrupted(report)
    return report


def rescue_with(exp: Experiment, coord: Any, local: Callable[[], Report]) -> None:
    """Under torchrun with the command line's rescue armed (faults.Rescue): what it writes
    when the main thread is stuck (this rank's report so far, `local()`, with every rank's
    through the board), and the run's hard end it watches."""
    rescue = faults.RESCUE[0]
    if rescue is None or coord is None:
        return

    def partial(signum: int) -> Report:
        report = local()
        stop = distributed.Stopped({coord.rank: board.signal_name(signum)} if signum else {}, in_step=False,
                                   how=distributed.Stopped.STUCK)
        return combine(report, distributed.gather_reports(report, coord, exp.waits, stop), coord.rank)

    rescue.report = partial
    rescue.watch(time.monotonic() + max(0.0, exp.end - exp.clock()))


def _measure(exp: Experiment, wl: Workload, options: Options, *, coord: Any,
             held: allocator.Held) -> Optional[KeyboardInterrupt]:
    """Every phase (phases.measure) driven by the workload's step, inside the user's
    preserved state. The interruption (Ctrl-C, SIGTERM; under torchrun every rank stopped
    together, or a rank lost: distributed.Stopped), or None."""
    try:
        with state.preserved(wl.model, wl.optimizer, exp.device):
            exp.use(wl)
            drive_all(phases.measure(exp, options, coord=coord, held=held, batch_size=wl.batch_size), exp.step)
    except KeyboardInterrupt as stop:
        if coord is None or isinstance(stop, distributed.Stopped):
            return stop
        return distributed.Stopped({coord.rank: "SIGINT"}, in_step=False, how=distributed.Stopped.LEFT)
    finally:
        exp.close_kept()  # a replay loader the rounds kept open, if they were cut short
        held.release()
        if exp.isolated is None:
            exp.isolated, exp.syncs = phases.not_isolated()
    return None


def start(spec: loader_mod.LoaderSpec, dev: torch.device, options: Options, *, coord: Any,
          clock: Callable[[], float], progress: Optional[Callable[[dict], None]] = None,
          loop: bool = False, started: Optional[float] = None) -> Experiment:
    """The Experiment, its clock started (on every rank together under torchrun) at
    `started` where the run began before (a user's script: when it created its training
    loader), else now; --max-seconds divided up front (plan_budget): the change's check
    (--patch) is kept after `end`, and the rounds that only settle a verdict stop where
    the bisection's share ends, leaving the check and the search theirs (with --tune an
    inconclusive verdict too: the search needs the ceiling and the stage costs, not a
    named stage; without, an undecided verdict may take all of it)."""
    if coord is not None:
        coord.broadcast([0.0])
    now = clock()
    start_t = now if started is None else min(started, now)
    budget = run_budget(options, coord is None, startup_s(start_t, clock))
    m = options.max_seconds
    end = start_t + m - budget.patching
    settle = start_t + budget.bisecting if coord is None and options.verify_seconds is None else end
    exp = Experiment(spec, dev, (options.plan or Plan()).for_workers(spec.num_workers), clock,
                     progress or (lambda e: None), options.step_timeout, start=start_t, end=end,
                     deadline=end, settle_deadline=settle, loop=loop, settle_undecided=options.tune)
    exp.budget = budget
    return exp


def run_budget(options: Options, one_process: bool = True, startup: Optional[float] = None) -> Budget:
    """--max-seconds divided for these options (plan.plan_budget): the check's share
    (verify.VERIFY_SHARE; with --tune, tune.CHECK_SHARE of the search's tune.TUNE_SHARE),
    and the change's check with --patch. Under torchrun only the points run."""
    if not one_process:
        return Budget(options.max_seconds, options.max_seconds, startup_s=startup)
    return plan_budget(options.max_seconds, check_share=CHECK_SHARE if options.tune else VERIFY_SHARE,
                       search_share=TUNE_SHARE if options.tune else 0.0, patch=options.patch and options.tune,
                       startup_s=startup, verify_seconds=options.verify_seconds)


# When this program started, on time.perf_counter's clock: set by the command line
# (mark_process_start), so that a run's start-up (imports, the entry function or the
# script up to its loader) is reported; None in a Python session, where it means nothing.
PROCESS_START: list = [None]
# The interpreter's own start before this program's first line (python's bootstrap, site,
# the console script's wrapper): tens of milliseconds, well under this on any machine that
# can train. A process forked more than this before that line was exec'd after other work
# (bash -c "pip install -e . && bisect-pipeline demo" execs its last command in place, the
# install's minute in the same process): that work is not this program's start-up.
BOOT_S = 0.5


def mark_process_start() -> None:
    """Note when this program started (program_start)."""
    PROCESS_START[0] = program_start()


def program_start(first_code: Optional[float] = None) -> float:
    """When this program started, on time.perf_counter's clock: the process's fork time
    (Linux: /proc/self/stat's start time against /proc/uptime), which counts the
    interpreter's own start, unless it lies more than BOOT_S before this program's first
    line ran (`first_code`: bisect_pipeline's import, before torch's), the process exec'd
    in place after other work (an exec keeps the fork time): then that first line, the
    shell's work not counted. Elsewhere (no /proc): that first line."""
    import bisect_pipeline

    first = bisect_pipeline._FIRST_CODE_AT if first_code is None else first_code
    age = _process_age()
    if age is None:
        return first
    forked = time.perf_counter() - age
    return forked if first - forked <= BOOT_S else first


def _process_age() -> Optional[float]:
    """Seconds since this process was forked (None where /proc cannot tell)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def startup_s(start_t: float, clock: Callable[[], float]) -> Optional[float]:
    """Seconds from this process's start to `start_t` (on `clock`), where the command line
    marked it and `clock` is time.perf_counter's."""
    born = PROCESS_START[0]
    if born is None or clock is not time.perf_counter:
        return None
    return round(max(0.0, start_t - born), 3)


def check_options(points: Optional[Iterable[str]], *, max_seconds: float, cache_mb: float, cache_batches: int,
                  step_timeout: Optional[float], verify_seconds: Optional[float] = None) -> tuple:
    """The selected points, after every option is checked (a BisectError names the bad one)."""
    if points is None:
        selected = POINTS
    else:
        selected = tuple(points)
        bad = [p for p in selected if p not in POINTS]
        if bad:
            raise BisectError(f"unknown point(s) {bad}; the points are {', '.join(POINTS)}.")
        if "full" not in selected:
            raise BisectError("the points must include 'full' (the pipeline as it is): every stage is measured against it.")
    if not max_seconds or max_seconds <= 0 or not math.isfinite(max_seconds):
        raise BisectError(f"max_seconds must be a finite number > 0, got {max_seconds}.")
    if cache_mb <= 0:
        raise BisectError(f"cache_mb must be > 0, got {cache_mb}.")
    if cache_batches < 1:
        raise BisectError(f"cache_batches must be >= 1, got {cache_batches}.")
    if step_timeout is not None and step_timeout <= 0:
        raise BisectError(f"step_timeout must be > 0 (or None for no watchdog), got {step_timeout}.")
    if verify_seconds is not None and not (verify_seconds >= 0 and math.isfinite(verify_seconds)):
        raise BisectError(f"verify_seconds must be a finite number >= 0 (0: off), got {verify_seconds}.")
    return selected


def describe(loader: Any) -> Any:
    """The loader's settings (a LoaderSpec; a torchdata.nodes graph's NodeSpec), and a
    clear error for an empty dataset."""
    if integrations.nodes.is_graph(loader):
        try:
            return integrations.nodes.describe(loader)
        except Exception as exc:
            raise BisectError(f"the torchdata.nodes graph could not be read: {type(exc).__name__}: {exc}") from exc
    spec = loader_mod.describe(loader)
    try:
        n = None if spec.iterable else len(spec.dataset)
    except TypeError:  # no __len__: fine, the sampler decides
        n = None
    if n == 0:
        raise BisectError(f"the loader's dataset ({type(spec.dataset).__name__}) is empty: there is nothing to "
                          "measure. Check the data path or filter your entry function uses.")
    return spec
