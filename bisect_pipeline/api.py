"""`bisect()`: describe, fill, measure the points, isolate, decide, report. Never prints."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from typing import Any, Callable, Iterable, Optional

import torch

from . import allocator, distributed, faults, isolate, replay, stages
from . import state as state_mod
from .errors import BisectError
from .report import PointResult, Report
from .stats import NOISY_REL_IQR, Throughput
from .timing import Plan, measure
from .verdict import POINTS, SETTLE_NOISE_SCALE, Verdict, decide, self_check, settled
from .workload import Workload, default_step, to_device as default_to_device, validate

DEFAULT_MAX_SECONDS = 60.0
DEFAULT_CACHE_MB = 1024.0
# Measured from the ceiling down, so the most trustworthy numbers come first and a
# run cut short by --max-seconds still has a ceiling to compare with.
MEASURE_ORDER = ("device", "host", "collated", "augmented", "raw", "full")
# `full` may take this many times the time of another point per visit: without it there
# is no verdict, and its first batch (worker start-up over the real pipeline) is the
# slowest of all.
FULL_WEIGHT = 2.0
# Share of --max-seconds the cache fill may take before it settles for fewer batches.
CACHE_TIME_SHARE = 0.2
# A hang is cut at the latest this long after --max-seconds (or after the fill's own
# time budget, once a batch is cached): a run ends within --max-seconds plus this plus
# the shutdown of its workers.
HANG_GRACE_S = 5.0
# The step timed alone before and after the allocator is held still (the `allocator`
# advice): this share of --max-seconds, at most ALLOCATOR_SECONDS.
ALLOCATOR_SHARE = 0.02
ALLOCATOR_SECONDS = 1.0


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; `.report` holds the points measured so far."""

    def __init__(self, report: Report) -> None:
        super().__init__("interrupted")
        self.report = report


@dataclasses.dataclass
class Run:
    """What one bisection carries from phase to phase."""

    spec: stages.LoaderSpec
    device: torch.device
    plan: Plan
    clock: Callable[[], float]
    emit: Callable[[dict], None]
    step_timeout: Optional[float]
    start: float
    end: float  # start + max_seconds: the hard end
    deadline: float  # when measuring points stops (room left for the isolated timings)
    step: Any = None
    move: Any = None
    caches: Optional[replay.Caches] = None
    fresh: bool = False  # the step changes its batch in place: cached points hand it copies
    results: dict = dataclasses.field(default_factory=dict)
    warnings: list = dataclasses.field(default_factory=list)
    visits: int = 0

    @property
    def batch_size(self) -> int:
        return self.caches.batch_size if self.caches else (self.spec.batch_size or 1)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def watchdog(self, what: Callable[[], str]) -> faults.Watchdog:
        """A watchdog for one phase: --step-timeout without progress, or the hard end."""
        return faults.Watchdog(self.step_timeout, what, end=self.end + HANG_GRACE_S - self.clock())

    def measured(self) -> tuple[dict, dict]:
        ok = {n: p.throughput for n, p in self.results.items() if p.status == "ok"}
        skipped = {n: p.reason or "" for n, p in self.results.items() if p.status == "skipped"}
        return ok, skipped

    def decide(self, noise_scale: float = 1.0) -> Verdict:
        ok, skipped = self.measured()
        return decide(ok, self.batch_size, skipped, noise_scale=noise_scale)


def bisect(
    model: Optional[torch.nn.Module] = None,
    loader: Any = None,
    *,
    optimizer: Optional[torch.optim.Optimizer] = None,
    loss_fn: Optional[Callable] = None,
    step: Optional[Callable[[Any], Any]] = None,
    to_device: Optional[Callable[[Any, torch.device], Any]] = None,
    workload: Optional[Workload] = None,
    device: Any = None,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    points: Optional[Iterable[str]] = None,
    cache_mb: float = DEFAULT_CACHE_MB,
    cache_batches: int = replay.DEFAULT_CACHE_BATCHES,
    step_timeout: Optional[float] = faults.DEFAULT_STEP_TIMEOUT,
    plan: Optional[Plan] = None,
    hold_allocator: bool = True,
    progress: Optional[Callable[[dict], None]] = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Report:
    """Find the stage of `loader`'s pipeline that starves `model`'s training step.

    Measures training throughput with the data cached at each point (device, host,
    collated, augmented, raw, full), names the stage where it drops, and returns a
    Report. The user's loader is never iterated; model, optimizer, RNG states and thread
    count are restored afterwards. See README "Python API" for every option.
    """
    wl = workload or Workload(model=model, loader=loader, optimizer=optimizer, loss_fn=loss_fn, step=step,
                              to_device=to_device)
    validate(wl, "bisect()")
    dev = resolve_device(device)
    selected = _check_options(points, max_seconds, cache_mb, cache_batches, step_timeout)
    spec = stages.describe(wl.loader)
    _check_not_empty(spec)

    coord = distributed.Coordinator.current()  # None unless a process group of 2+ ranks is up
    if coord is not None:
        coord.watch(wl.model)
        coord.broadcast([0.0])  # every rank starts its clock together
    start = clock()
    room = 0.0 if coord else isolate.budget(max_seconds)  # for the isolated timings
    run = Run(spec, dev, _plan_for(plan or Plan(), spec), clock, progress or (lambda event: None), step_timeout,
              start=start, end=start + max_seconds, deadline=start + max_seconds - room)
    interrupted = False
    isolated: dict = {}
    syncs: dict = {}
    schedule: dict = {}
    waits: dict = {}  # point -> seconds per batch the loop waited for data (distributed only)
    held = allocator.Held(hold_allocator)
    held_step: dict = {}
    snap = state_mod.capture(wl.model, wl.optimizer)
    moved_from = _move_model(wl.model, dev)
    try:
        run.step = _make_step(wl)
        user_move = wl.to_device or default_to_device
        run.move = lambda batch: user_move(batch, dev)  # noqa: E731
        _fill(run, selected, cache_mb, cache_batches, max_seconds)
        _probe_step(run, coord)
        held_step = _hold_allocator(run, held, coord, max_seconds)
        if coord is not None:
            _measure_lockstep(run, coord, selected, waits)
            reason = "not timed under torch.distributed: isolated steps would break the ranks' lockstep"
            isolated, syncs = {"status": "skipped", "reason": reason}, {"status": "skipped", "reason": reason}
        else:
            schedule = _measure_rounds(run, selected)
            isolated, syncs = isolate.after_points(spec, run.caches, dev, run.move, run.step, run.results,
                                                   max_seconds=max_seconds, step_timeout=step_timeout, clock=clock)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        held.release()
        if moved_from is not None:
            wl.model.to(moved_from)
        state_mod.restore(snap, wl.model, wl.optimizer)
    if held_step and isolated.get("status") == "ok":
        isolated["allocator"] = held_step

    report = _report(run, selected, interrupted, isolated, syncs, schedule, held, max_seconds)
    if interrupted:
        raise Interrupted(report)
    if coord is not None:
        report = distributed.combine(report, coord, waits)
    return report


# --------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------


def _fill(run: Run, selected: tuple, cache_mb: float, cache_batches: int, max_seconds: float) -> None:
    """Fill the caches under the watchdog: a hang before the first batch is cut at the
    hard end, one after it at the end of the fill's own time budget."""
    run.emit({"event": "cache", "message": "filling the caches"})
    budget = max(1.0, CACHE_TIME_SHARE * max_seconds)
    t0 = run.clock()
    try:
        with run.watchdog(lambda: "building the caches") as dog:
            def on_batch(n: int) -> None:
                if n == 1:
                    dog.end_in(max(0.0, budget - (run.clock() - t0)) + 1.0, label="the fill's time budget")
            run.caches = replay.fill(run.spec, cache_mb=cache_mb, max_batches=cache_batches, time_budget=budget,
                                     clock=run.clock, on_batch=on_batch)
    except replay.FillError as exc:
        for name in MEASURE_ORDER[:-1]:
            if name in selected:
                run.results[name] = PointResult(name, "failed", reason=f"filling the cache failed: {exc.reason}",
                                                failed_stage="hang" if exc.hang else exc.stage)
        return
    run.warnings.extend(_before_run(run.spec, run.caches))
    for w in run.warnings:
        run.emit({"event": "warning", "message": w})


def _probe_step(run: Run, coord) -> None:
    """One step on a copy of a cached batch: does the step change its input in place?
    (It also makes the step's first, slow calls before anything is timed.) Under
    torchrun every rank steps once, or the others would wait in DDP's all-reduce."""
    if coord is None:
        run.fresh = run.caches is not None and _step_mutates(run)
    else:
        probe: list = []
        coord.unit(lambda: probe.append(_step_mutates(run)), run.caches is None)
        run.fresh = bool(probe and probe[0])
    if run.fresh:
        run.warnings.append("the training step changes its input batch in place: the cached points hand it a fresh "
                            "copy each step (the copy is included in their time).")


def _step_mutates(run: Run) -> bool:
    probe = replay.device_batches(replay.host_batches(run.caches, run.spec, run.device)[:1], run.move, run.device)[0]
    reference = stages.clone_data(probe)
    try:
        run.step(probe)
    except Exception:  # the points will fail with this error themselves
        return False
    run.sync()
    return not stages.same_values(probe, reference)


def _hold_allocator(run: Run, held: allocator.Held, coord, max_seconds: float) -> dict:
    """Hold the allocator still for the rest of the run, timing the step alone just
    before and after (allocator.Held.time_step) when that can be done here: on the CPU,
    with a cached batch, in one process (under torchrun a step on one rank alone would
    wait for the others in DDP's all-reduce)."""
    why = ("the step runs on an accelerator" if run.device.type != "cpu" else
           "not timed under torch.distributed" if coord is not None else
           "the caches could not be filled" if run.caches is None else None)
    if why is not None:
        held.hold()
        return {"status": "skipped", "reason": why}
    batch = replay.device_batches(replay.host_batches(run.caches, run.spec, run.device)[:1], run.move, run.device)[0]
    try:
        with run.watchdog(lambda: "the step timed alone (allocator)"):
            return held.time_step(lambda: run.step(batch), min(ALLOCATOR_SECONDS, ALLOCATOR_SHARE * max_seconds),
                                  run.clock)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # the points will fail with this error themselves
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        held.hold()


def _measure_rounds(run: Run, selected: tuple) -> dict:
    """Visit the points in rounds, the ceiling down then back up, pooling each point's
    windows over its visits, until the verdict is settled (verdict.settled) or the time
    is up. A machine that slows down or speeds up over the run then weighs on every point
    alike instead of showing up as a stage cost between points measured early and late.
    A point found inconsistent (slower than one doing more work) is measured again once,
    next to that point, before anything is decided."""
    todo = []
    for name in MEASURE_ORDER:
        if name not in selected or name in run.results:
            continue
        na = _not_applicable(name, run.device, run.caches)
        if na:
            run.results[name] = PointResult(name, na[0], reason=na[1])
        else:
            todo.append(name)
    info = {"rounds": 0, "settled": False, "remeasured": []}
    remeasured: set = set()
    for r in range(run.plan.max_rounds):
        order = [n for n in (todo if r % 2 == 0 else todo[::-1]) if _live(run, n)]
        if "full" not in order:
            break  # no verdict can come of more rounds
        later = len(order) * max(0, run.plan.min_rounds - r - 1)  # visits still owed to the minimum rounds
        for i, name in enumerate(order):
            if not _visit(run, name, order[i:], later):
                return _finish(run, info)
        info["rounds"] = r + 1
        if r + 1 < run.plan.min_rounds:
            continue
        v = run.decide()
        again = [i for i in v.inconsistent if (i.slower, i.faster) not in remeasured]
        for inc in again:
            remeasured.add((inc.slower, inc.faster))
            info["remeasured"].append([inc.slower, inc.faster])
            for name in (inc.slower, inc.faster):
                if _live(run, name) and not _visit(run, name, [name], 1):
                    return _finish(run, info)
        if again:
            v = run.decide()
        if settled(v, run.decide(SETTLE_NOISE_SCALE)):
            info["settled"] = True
            break
    return _finish(run, info)


def _finish(run: Run, info: dict) -> dict:
    info["verdict_s"] = round(run.clock() - run.start, 3)
    info["visits"] = run.visits
    return info


def _live(run: Run, name: str) -> bool:
    p = run.results.get(name)
    return p is None or p.status == "ok"


def _visit(run: Run, name: str, planned: list, later: int) -> bool:
    """One visit of `name`, pooled into its result. Its deadline is its share of the time
    left, counting the visits `planned` in this round and `later` ones; False (and
    nothing opened) when not even a window's time is left."""
    left = run.deadline - run.clock()
    if left < run.plan.window_seconds:
        p = run.results.get(name)
        if p is not None and p.status == "ok":
            run.results[name] = dataclasses.replace(p, stopped_by_deadline=True)
        return False
    weights = [_weight(n) for n in planned] + [1.0] * later
    share = _weight(name) / sum(weights)
    run.visits += 1
    run.emit({"event": "point", "point": name, "index": run.visits - 1, "total": run.visits + len(planned) - 1 + later})
    now = _measure_point(run, name, run.clock() + left * share)
    run.results[name] = _pool(run.results.get(name), now, run.batch_size)
    return True


def _weight(name: str) -> float:
    return FULL_WEIGHT if name == "full" else 1.0


def _pool(before: Optional[PointResult], now: PointResult, batch_size: int) -> PointResult:
    """A point's result over its visits: the windows of every visit. A visit that ran out
    of time before a window keeps what the others measured; one that failed fails the
    point, with the windows measured before kept in the document."""
    if before is None or before.status != "ok" or before.throughput is None:
        return now
    if now.status == "ok":
        windows = before.throughput.windows + now.throughput.windows
        return dataclasses.replace(before, throughput=Throughput(windows, batch_size),
                                   warmup_steps=before.warmup_steps + now.warmup_steps,
                                   stopped_by_deadline=before.stopped_by_deadline or now.stopped_by_deadline,
                                   visits=before.visits + 1, steady=before.steady and now.steady)
    if now.stopped_by_deadline and now.failed_stage is None:
        return dataclasses.replace(before, stopped_by_deadline=True)
    return dataclasses.replace(now, throughput=before.throughput, visits=before.visits + 1)


def _measure_point(run: Run, name: str, deadline: float) -> PointResult:
    t0 = run.clock()
    opened = 0.0
    try:
        with run.watchdog(lambda: f"point {name}") as dog:
            source, moves = _source(run, name)
            with source as next_batch:
                opened = run.clock() - t0
                m = measure(next_batch, run.move if moves else None, run.step, batch_size=run.batch_size,
                            plan=run.plan, deadline=deadline, clock=run.clock, sync=run.sync,
                            prefetch_depth=run.spec.prefetch_depth if name not in ("host", "device") else 0,
                            on_window=lambda i, w: run.emit({"event": "window", "point": name, "window": i,
                                                             "max_windows": run.plan.windows_per_visit}),
                            beat=dog.beat)
    except KeyboardInterrupt:
        raise
    except BisectError:
        raise
    except Exception as exc:
        return _failed(name, exc, run)
    if m.throughput is None:
        return PointResult(name, "failed", reason="out of time before one window was measured (raise --max-seconds)",
                           first_batch_seconds=opened + m.first_batch_seconds, warmup_steps=m.warmup_steps,
                           stopped_by_deadline=True)
    return PointResult(name, "ok", m.throughput, None, opened + m.first_batch_seconds, m.warmup_steps,
                       m.stopped_by_deadline, steady=m.steady)


def _source(run: Run, name: str):
    """The batch source of a point and whether the loop moves its batches to the device."""
    spec, caches = run.spec, run.caches
    if name == "full":
        return replay.full_loader(spec, caches.dataset if caches else _tagged_copy(spec)), True
    if name == "raw":
        ds = replay.RawReplay(caches.samples, caches.raw_calls)
        return replay.sample_loader(spec, ds, caches.batch_size), True
    if name == "augmented":
        return replay.sample_loader(spec, replay.SampleCache(caches.samples), caches.batch_size), True
    if name == "collated":
        return replay.batch_loader(spec, caches.batches, run.fresh), True
    host = replay.host_batches(caches, spec, run.device)
    if name == "host":
        return replay.cached_source(host, run.fresh), True
    return replay.cached_source(replay.device_batches(host, run.move, run.device), run.fresh), False


def _measure_lockstep(run: Run, coord, selected: tuple, waits: dict) -> None:
    """The points on every rank in the same order, each in lockstep (distributed.py);
    a point no rank can measure is settled without steps."""
    todo = [p for p in MEASURE_ORDER if p in selected]
    for i, name in enumerate(todo):
        local = run.results.get(name)  # already failed here (the cache fill)
        if local is None:
            na = _not_applicable(name, run.device, run.caches)
            if na:
                local = PointResult(name, na[0], reason=na[1])
        if coord.all(local is not None):
            run.results[name] = local
            continue
        run.emit({"event": "point", "point": name, "index": i, "total": len(todo)})
        point_deadline = run.clock() + max(0.0, run.deadline - run.clock()) / max(1, len(todo) - i)
        result, wait = _measure_point_lockstep(run, coord, name, point_deadline, skip=local is not None)
        outcomes = coord.gather((result.status if local is None else "skipped", result.reason))  # agree, then go on
        if local is not None:
            result = local
        elif result.status == "failed" and result.failed_stage == "peer":
            who = [(r, why) for r, (st, why) in enumerate(outcomes) if st == "failed" and r != coord.rank]
            first = who[0] if who else (None, "unknown")
            result = dataclasses.replace(result, reason=f"rank {first[0]} failed at this point: {first[1]}")
        if wait is not None:
            waits[name] = wait
        run.results[name] = result


def _measure_point_lockstep(run: Run, coord, name: str, deadline: float, skip: bool) -> tuple:
    import contextlib

    t0 = run.clock()
    open_error = None
    with contextlib.ExitStack() as stack:
        dog = stack.enter_context(run.watchdog(lambda: f"point {name}"))
        next_batch, moves = None, True
        if not skip:
            try:
                source, moves = _source(run, name)
                next_batch = stack.enter_context(source)
            except Exception as exc:  # this rank takes part without steps, then fails the point
                open_error = exc
        opened = run.clock() - t0
        lm = distributed.measure(next_batch, run.move if moves else None, run.step, batch_size=run.batch_size,
                                 plan=run.plan, deadline=deadline, clock=run.clock, sync=run.sync,
                                 prefetch_depth=run.spec.prefetch_depth if name not in ("host", "device") else 0,
                                 coord=coord, beat=dog.beat,
                                 on_window=lambda i, w: run.emit({"event": "window", "point": name, "window": i,
                                                                  "max_windows": run.plan.windows_per_visit}))
    error = open_error or lm.error
    if error is not None:
        return _failed(name, error, run), None
    if lm.peer_failed or lm.measured is None:
        return PointResult(name, "failed", reason="another rank failed at this point", failed_stage="peer"), None
    m = lm.measured
    wait = lm.wait_seconds / max(lm.steps, 1)
    return PointResult(name, "ok", m.throughput, None, opened + m.first_batch_seconds, m.warmup_steps,
                       m.stopped_by_deadline, steady=m.steady), wait


# --------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------


def _report(run: Run, selected: tuple, interrupted: bool, isolated: dict, syncs: dict, schedule: dict,
            held: allocator.Held, max_seconds: float) -> Report:
    for name in POINTS:
        if name not in selected:
            run.results[name] = PointResult(name, "skipped", reason="not selected (points option)")
        elif name not in run.results:
            run.results[name] = PointResult(name, "not run", reason="interrupted" if interrupted else "out of time")
    verdict = run.decide()
    full = run.results["full"]
    if verdict.bottleneck is None and full.status not in ("ok", "skipped"):
        verdict = dataclasses.replace(verdict, reason=f"the full pipeline was not measured ({full.status}: "
                                                      f"{full.reason})")
    for inc in verdict.inconsistent:  # left out of the verdict: said at the point itself
        p = run.results[inc.slower]
        run.results[inc.slower] = dataclasses.replace(
            p, status="failed", failed_stage="inconsistent",
            reason=f"inconsistent: {inc.describe()}, beyond the noise; left out")
    ordered = tuple(run.results[p] for p in POINTS)
    complete = not interrupted and all(p.status != "not run" and not p.stopped_by_deadline for p in ordered)
    warnings = run.warnings + _warnings(run, ordered, verdict, held)
    info = _run_info(max_seconds, run.clock() - run.start)
    info.update(allocator=held.to_dict(), **schedule)
    report = Report(device=str(run.device), batch_size=run.batch_size, points=ordered, verdict=verdict,
                    loader=run.spec.settings(), cache=_cache_info(run.caches), warnings=tuple(warnings), run=info,
                    complete=complete, interrupted=interrupted, isolated=isolated, syncs=syncs)
    shown = {p: run.batch_size / t for p, t in verdict.fitted.items()}
    problems = self_check(shown, verdict, run.spec.num_workers,
                          pinned_transfer=run.spec.pin_memory and run.device.type != "cpu")
    if problems:
        report = dataclasses.replace(report, warnings=report.warnings + tuple(problems))
    return report


def _warnings(run: Run, points: tuple, verdict: Verdict, held: allocator.Held) -> list:
    out = []
    for inc in verdict.inconsistent:
        out.append(f"{inc.describe()}, beyond the noise: the step did not cost the same at both (the process, not "
                   f"the pipeline: another program, memory, frequency). {inc.slower} is left out and the ceiling is "
                   f"{verdict.ceiling}, the fastest consistent point.")
    for p in points:
        if p.status == "ok" and p.throughput.rel_iqr > NOISY_REL_IQR:
            out.append(f"{p.point}: windows disagree by {p.throughput.rel_iqr * 100:.0f}% (IQR/median); the machine "
                       "is busy or the pipeline is bursty. Close other work or raise --max-seconds for more rounds.")
        if p.status == "ok" and p.stopped_by_deadline:
            out.append(f"{p.point}: cut short by --max-seconds after {p.throughput.n} window(s); raise it for firmer "
                       "numbers.")
        elif p.status == "ok" and not p.steady:
            out.append(f"{p.point}: no two consecutive windows agreed within "
                       f"{run.plan.steady_tolerance * 100:.0f}% in a visit: it never reached a steady state.")
    caches = run.caches
    if caches is not None and caches.limited_by:
        out.append(f"the caches hold {caches.n_batches} batch(es), limited by {caches.limited_by}; "
                   "cached points cycle over fewer distinct batches (raise --cache-mb or --max-seconds).")
    cores = os.cpu_count() or 1
    if run.spec.num_workers > cores:
        out.append(f"num_workers={run.spec.num_workers} is more than this machine's {cores} cores: workers compete "
                   "for CPU.")
    if not held.controlled and run.device.type == "cpu":
        out.append(f"the memory allocator was not held still ({held.reason}): the step's own cost may differ from "
                   "point to point, and the drops with it.")
    return out


def _before_run(spec: stages.LoaderSpec, caches: replay.Caches) -> list:
    """Problems that can be seen before measuring anything."""
    out = list(caches.warnings)  # pipeline problems seen while filling (a non-sharding IterableDataset)
    shm = faults.shm_problem(spec.num_workers, spec.prefetch_depth, caches.batch_bytes, faults.shm_free_bytes())
    if shm:
        out.append(shm)
    if caches.stopped_by:
        out.append(f"filling the caches stopped after {caches.n_batches} batch(es): {caches.stopped_by}")
    return out


def _cache_info(caches) -> dict:
    if caches is None:
        return {}
    return {
        "batches": caches.n_batches,
        "samples": len(caches.samples),
        "batch_bytes": caches.batch_bytes,
        "fill_seconds": round(caches.fill_seconds, 4),
        "limited_by": caches.limited_by,
        "raw_transforms": caches.raw_found,
    }


def _run_info(max_seconds: float, elapsed: float) -> dict:
    import torchvision

    return {
        "max_seconds": max_seconds,
        "elapsed_s": round(elapsed, 3),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


def resolve_device(device: Any) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BisectError(f"device {device!r} is not a torch device ({exc}); use e.g. 'cpu', 'cuda', 'cuda:1'.") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BisectError(f"device {device!r} asked for, but CUDA is not available here; use --device cpu.")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _check_options(points, max_seconds, cache_mb, cache_batches, step_timeout) -> tuple:
    if points is None:
        selected = POINTS
    else:
        selected = tuple(points)
        bad = [p for p in selected if p not in POINTS]
        if bad:
            raise BisectError(f"unknown point(s) {bad}; the points are {', '.join(POINTS)}.")
        if "full" not in selected:
            raise BisectError("the points must include 'full' (the pipeline as it is): every stage is measured against it.")
    if not max_seconds or max_seconds <= 0:
        raise BisectError(f"max_seconds must be > 0, got {max_seconds}.")
    if cache_mb <= 0:
        raise BisectError(f"cache_mb must be > 0, got {cache_mb}.")
    if cache_batches < 1:
        raise BisectError(f"cache_batches must be >= 1, got {cache_batches}.")
    if step_timeout is not None and step_timeout <= 0:
        raise BisectError(f"step_timeout must be > 0 (or None for no watchdog), got {step_timeout}.")
    return selected


def _check_not_empty(spec: stages.LoaderSpec) -> None:
    if spec.iterable:
        return
    try:
        n = len(spec.dataset)
    except TypeError:  # no __len__: fine, the sampler decides
        return
    if n == 0:
        raise BisectError(f"the loader's dataset ({type(spec.dataset).__name__}) is empty: there is nothing to "
                          "measure. Check the data path or filter your entry function uses.")


def _move_model(model: Optional[torch.nn.Module], dev: torch.device) -> Optional[torch.device]:
    if model is None:
        return None
    devices = {t.device for t in model.parameters()} | {t.device for t in model.buffers()}
    if len(devices) == 1:
        (current,) = devices
        if current != dev:
            model.to(dev)
            return current
    return None


def _make_step(wl: Workload) -> Callable[[Any], Any]:
    if wl.step is not None:
        return wl.step
    model = wl.model
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise BisectError("the model has no trainable parameter, so the default step has nothing to train; "
                          "give your own step(batch).")
    optimizer = wl.optimizer or torch.optim.SGD(params, lr=0.01)
    loss_fn = wl.loss_fn or torch.nn.CrossEntropyLoss()
    model.train()  # the default step trains; the flag is restored afterwards
    return default_step(model, optimizer, loss_fn)


def _plan_for(plan: Plan, spec: stages.LoaderSpec) -> Plan:
    # A window must span several batches per worker, or it times one worker's burst.
    need = max(plan.min_window_steps, 2 * spec.num_workers)
    if need == plan.min_window_steps:
        return plan
    return dataclasses.replace(plan, min_window_steps=need)


def _not_applicable(name: str, dev: torch.device, caches) -> Optional[tuple]:
    if name == "host" and dev.type == "cpu":
        return ("skipped", "no accelerator: host and device coincide")
    if name == "raw" and caches is not None and caches.raw_calls is None:
        return ("unavailable", caches.raw_reason)
    return None


def _tagged_copy(spec) -> Any:
    """A copy of the dataset whose transforms name the augment stage when they raise
    (not recording): for the full point when the caches could not be filled."""
    if spec.iterable:
        return None
    try:
        return stages.instrument(spec.dataset).dataset
    except Exception:  # cannot be copied: the full point runs over a plain copy
        return None


def _failed(name: str, exc: BaseException, run: Run) -> PointResult:
    """A failed point: the stage whose code raised, and the original error."""
    if isinstance(exc, faults.StepTimeout):
        batch = faults.hang_location(exc) == "no batch"
        if exc.past_end:
            what = ("no batch came before the end of --max-seconds" if batch
                    else "the training step was still running at the end of --max-seconds")
        else:
            what = (f"no batch in {run.step_timeout:g} s" if batch
                    else f"the training step did not finish in {run.step_timeout:g} s") + " (--step-timeout)"
        return PointResult(name, "failed", reason=f"{what}; its workers were terminated", failed_stage="hang")
    stage, reason = faults.classify(exc)
    if stage is None:
        stage = _stage_from_traceback(exc, name, run.step, run.move)
        if stage is not None:
            reason = f"{stage} raised {reason}"
    return PointResult(name, "failed", reason=reason, failed_stage=stage)


def _stage_from_traceback(exc: BaseException, point: str, train_step, move) -> Optional[str]:
    """Untagged errors: in the step or the transfer (seen from the traceback, at no
    per-step cost), else in the dataset's own __getitem__ (load) at the full point."""
    seen = []
    tb = exc.__traceback__
    while tb is not None:
        seen.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    for stage, fn in (("step", train_step), ("transfer", move)):
        code = _code_of(fn)
        if code is not None and code in seen:
            return stage
    in_fetch = any(c.co_filename.replace(os.sep, "/").endswith("torch/utils/data/_utils/fetch.py") for c in seen)
    if point == "full" and (in_fetch or "DataLoader worker" in str(exc)):
        return "load"
    return None


def _code_of(fn: Any) -> Any:
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(getattr(type(fn), "__call__", None), "__code__", None)
    return code
