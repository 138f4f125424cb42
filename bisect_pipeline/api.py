"""`bisect()`: describe, fill, hold, isolate, measure the points, report. Never prints."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable, Optional

import torch

from . import allocator, devices, distributed, faults, phases, state
from . import loader as loader_mod
from .cache import DEFAULT_CACHE_BATCHES
from .errors import BisectError
from .experiment import Experiment
from .phases import Options
from .plan import DEFAULT_CACHE_MB, DEFAULT_MAX_SECONDS, Plan
from .report import Report
from .report.ranks import combine
from .verdict import POINTS
from .tune import TUNE_SHARE
from .verify import VERIFY_SHARE
from .visit import drive_all
from .workload import Workload, validate


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
    if coord is not None:
        coord.watch(wl.model)
    exp = start(describe(wl.loader), dev, options, coord=coord, clock=clock, progress=progress)
    held = allocator.Held(hold_allocator)
    interrupted = _measure(exp, wl, options, coord=coord, held=held)
    report = Report.of(exp.measurements(options.points, held=held.record(), interrupted=interrupted))
    if interrupted:
        raise Interrupted(report)
    if coord is None:
        return report
    return combine(report, distributed.gather_reports(report, coord, exp.waits), coord.rank)


def _measure(exp: Experiment, wl: Workload, options: Options, *, coord: Any, held: allocator.Held) -> bool:
    """Every phase (phases.measure) driven by the workload's step, inside the user's
    preserved state. True when interrupted (Ctrl-C)."""
    try:
        with state.preserved(wl.model, wl.optimizer, exp.device):
            exp.use(wl)
            drive_all(phases.measure(exp, options, coord=coord, held=held, batch_size=wl.batch_size), exp.step)
    except KeyboardInterrupt:
        return True
    finally:
        exp.close_kept()  # a replay loader the rounds kept open, if they were cut short
        held.release()
        if exp.isolated is None:
            exp.isolated, exp.syncs = phases.not_isolated()
    return False


def start(spec: loader_mod.LoaderSpec, dev: torch.device, options: Options, *, coord: Any,
          clock: Callable[[], float], progress: Optional[Callable[[dict], None]] = None,
          loop: bool = False) -> Experiment:
    """The Experiment, its clock started (on every rank together under torchrun)."""
    if coord is not None:
        coord.broadcast([0.0])
    start_t = clock()
    m = options.max_seconds
    # the verification's share (and the search's, with tune) is kept from the rounds that
    # only settle the verdict; with tune, an inconclusive one too (the search needs the
    # ceiling and the stage costs, not a named stage: an undecided verdict would otherwise
    # take all of it)
    share = TUNE_SHARE if options.tune else VERIFY_SHARE
    keep = share * m if coord is None and options.verify_seconds is None else 0.0
    return Experiment(spec, dev, (options.plan or Plan()).for_workers(spec.num_workers), clock,
                      progress or (lambda e: None), options.step_timeout, start=start_t, end=start_t + m,
                      deadline=start_t + m, settle_deadline=start_t + m - keep, loop=loop,
                      settle_undecided=options.tune)


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


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


def describe(loader: Any) -> loader_mod.LoaderSpec:
    """The loader's settings, and a clear error for an empty dataset."""
    spec = loader_mod.describe(loader)
    try:
        n = None if spec.iterable else len(spec.dataset)
    except TypeError:  # no __len__: fine, the sampler decides
        n = None
    if n == 0:
        raise BisectError(f"the loader's dataset ({type(spec.dataset).__name__}) is empty: there is nothing to "
                          "measure. Check the data path or filter your entry function uses.")
    return spec
