"""`bisect()`: describe, fill, hold, measure the points, isolate, report. Never prints."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable, Optional

import torch

from . import allocator, devices, distributed, experiment, faults, isolate, state
from . import loader as loader_mod
from .cache import DEFAULT_CACHE_BATCHES
from .errors import BisectError
from .experiment import Experiment
from .plan import DEFAULT_CACHE_MB, DEFAULT_MAX_SECONDS, Plan
from .diagnosis import to_check
from .report import Report
from .report.ranks import combine
from .results import Isolated, Syncs, Verification
from .rounds import Rounds
from .verdict import POINTS
from .verify import VERIFY_SHARE, Trials
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
    selected = check_options(points, max_seconds=max_seconds, cache_mb=cache_mb, cache_batches=cache_batches,
                             step_timeout=step_timeout, verify_seconds=verify_seconds)
    spec = _describe(wl.loader)
    coord = distributed.Coordinator.current()  # None unless a process group of 2+ ranks is up
    exp = _start(spec, dev, coord, wl.model, plan=plan, clock=clock, progress=progress, step_timeout=step_timeout,
                 max_seconds=max_seconds, verify_seconds=verify_seconds)
    held = allocator.Held(hold_allocator)
    waits, interrupted = _measure(exp, wl, coord, selected, held, cache_mb=cache_mb, cache_batches=cache_batches,
                                  max_seconds=max_seconds, verify_seconds=verify_seconds)
    report = Report.of(exp.measurements(selected, held=held.record(), interrupted=interrupted))
    if interrupted:
        raise Interrupted(report)
    if coord is None:
        return report
    return combine(report, distributed.gather_reports(report, coord, waits), coord.rank)


def _measure(exp: Experiment, wl: Workload, coord: Any, selected: tuple, held: allocator.Held, *,
             cache_mb: float, cache_batches: int, max_seconds: float, verify_seconds: Optional[float]) -> tuple:
    """The phases that run the user's code, inside its preserved state: fill, probe, hold
    the allocator, the points (rounds, or lockstep under torchrun), the isolated timings
    and the advice's check, each keeping what it measured in `exp`. Returns (the waits
    for data per point under torchrun, interrupted by Ctrl-C)."""
    waits: dict = {}
    try:
        with state.preserved(wl.model, wl.optimizer, exp.device):
            exp.use(wl)
            experiment.fill(exp, selected, cache_mb=cache_mb, cache_batches=cache_batches, max_seconds=max_seconds,
                            batch_size=wl.batch_size)
            experiment.probe_step(exp, coord)
            exp.allocator_timing = experiment.hold_allocator(exp, held, coord, max_seconds)
            if coord is None:
                schedule = Rounds(exp, selected)
                drive_all(schedule, exp.step)
                exp.schedule = schedule.info
                exp.isolated, exp.syncs = isolate.after_points(exp, max_seconds=max_seconds)
                draft = exp.measurements(selected, held=held.record(), interrupted=False)
                exp.verification = _verify(exp, to_check(draft), verify_seconds)
            else:
                schedule = distributed.LockstepPoints(exp, coord, selected)
                drive_all(schedule, exp.step)
                waits = schedule.waits
    except KeyboardInterrupt:
        return waits, True
    finally:
        held.release()
        if exp.isolated is None:
            exp.isolated, exp.syncs = _not_isolated()
    return waits, False


def _start(spec, dev, coord, model, *, plan, clock, progress, step_timeout, max_seconds,
           verify_seconds) -> Experiment:
    """The Experiment, its clock started (on every rank together under torchrun, whose
    units run under Join over the model's DDP modules)."""
    if coord is not None:
        coord.watch(model)
        coord.broadcast([0.0])
    start = clock()
    room = 0.0 if coord else isolate.budget(max_seconds)  # for the isolated timings
    # the verification's share is kept from the rounds that only settle the verdict
    keep = VERIFY_SHARE * max_seconds if coord is None and verify_seconds is None else 0.0
    return Experiment(spec, dev, (plan or Plan()).for_workers(spec.num_workers), clock, progress or (lambda e: None),
                      step_timeout, start=start, end=start + max_seconds, deadline=start + max_seconds - room,
                      settle_deadline=start + max_seconds - room - keep)


def _verify(exp: Experiment, advice: tuple, verify_seconds: Optional[float]) -> Verification:
    """The advice's recommended settings measured against the user's (verify.Trials).
    verify_seconds None: in what the bisection leaves of max_seconds (the rounds that
    only settle a verdict already made stop VERIFY_SHARE of it early; an undecided
    verdict may use it all); 0: off; a number: a budget of its own, on top of max_seconds."""
    if verify_seconds == 0:
        return Verification(status="off", reason="verification turned off (verify_seconds=0)")
    budget = max(0.0, exp.end - exp.clock()) if verify_seconds is None else float(verify_seconds)
    if budget < 2 * exp.plan.window_seconds:
        return Verification(status="out of time", budget_s=round(budget, 3),
                            reason="the bisection used --max-seconds; give the check a budget of its own with "
                                   "--verify-seconds")
    trials = Trials(exp, list(advice), budget_s=budget, threads=torch.get_num_threads(), cores=isolate.cores())
    drive_all(trials, exp.step)
    return trials.result


def _not_isolated() -> tuple[Isolated, Syncs]:
    reason = ("not timed under torch.distributed: isolated steps would break the ranks' lockstep"
              if distributed.env_world_size() > 1 else "interrupted before the isolated timings")
    return Isolated.missing("skipped", reason), Syncs.missing("skipped", reason)


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


def _describe(loader: Any) -> loader_mod.LoaderSpec:
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
