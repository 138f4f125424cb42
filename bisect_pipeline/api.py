"""`bisect()`: wire the stages together. Never prints."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import platform
import time
from typing import Any, Callable, Iterable, Optional

import torch

from . import distributed, faults, isolate, replay, stages
from . import state as state_mod
from .errors import BisectError
from .report import PointResult, Report
from .stats import NOISY_REL_IQR, Throughput
from .timing import Plan, measure
from .verdict import POINTS, decide
from .workload import Workload, default_step, to_device as default_to_device, validate

DEFAULT_MAX_SECONDS = 60.0
DEFAULT_CACHE_MB = 1024.0
# Measured from the ceiling down, so the most trustworthy numbers come first and a
# run cut short by --max-seconds still has a ceiling to compare with.
MEASURE_ORDER = ("device", "host", "collated", "augmented", "raw", "full")
# Points are measured in paired rounds, the ceiling down then back up (see _measure_rounds).
ROUNDS = 2
FULL_WEIGHT = 2.0
# Share of --max-seconds the cache fill may take before it settles for fewer batches.
CACHE_TIME_SHARE = 0.2


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
    workload: Optional[Workload] = None,
    device: Any = None,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    points: Optional[Iterable[str]] = None,
    cache_mb: float = DEFAULT_CACHE_MB,
    cache_batches: int = replay.DEFAULT_CACHE_BATCHES,
    step_timeout: Optional[float] = faults.DEFAULT_STEP_TIMEOUT,
    plan: Optional[Plan] = None,
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
    plan = plan or Plan()
    spec = stages.describe(wl.loader)
    _check_not_empty(spec)
    emit = progress or (lambda event: None)

    coord = distributed.Coordinator.current()  # None unless a process group of 2+ ranks is up
    if coord is not None:
        coord.watch(wl.model)
        coord.broadcast([0.0])  # every rank starts its clock together
    start = clock()
    deadline = start + max_seconds - (0.0 if coord else isolate.budget(max_seconds))  # room for isolation
    snap = state_mod.capture(wl.model, wl.optimizer)
    moved_from = _move_model(wl.model, dev)
    results: dict[str, PointResult] = {}
    caches = None
    warnings: list[str] = []
    interrupted = False
    isolated, syncs = {}, {}
    waits: dict = {}  # point -> seconds per batch the loop waited for data (distributed only)
    try:
        train_step = _make_step(wl)
        user_move = wl.to_device or default_to_device
        move = lambda batch: user_move(batch, dev)  # noqa: E731
        emit({"event": "cache", "message": "filling the caches"})
        try:
            caches = replay.fill(spec, cache_mb=cache_mb, max_batches=cache_batches,
                                 time_budget=max(1.0, CACHE_TIME_SHARE * max_seconds), clock=clock)
        except replay.FillError as exc:
            for name in MEASURE_ORDER[:-1]:
                if name in selected:
                    results[name] = PointResult(name, "failed", reason=f"filling the cache failed: {exc.reason}",
                                                failed_stage=exc.stage)
        fresh = False
        if caches is not None:
            warnings.extend(_before_run(spec, caches))
            for w in warnings:
                emit({"event": "warning", "message": w})
            if coord is None:
                fresh = _step_mutates(train_step, move, caches, spec, dev)
        if coord is not None:  # every rank steps once, or the others would wait in DDP's all-reduce
            probe: list = []
            coord.unit(lambda: probe.append(_step_mutates(train_step, move, caches, spec, dev)), caches is None)
            fresh = bool(probe and probe[0])
        if caches is not None:
            if fresh:
                warnings.append("the training step changes its input batch in place: the host and device points hand "
                                "it a fresh copy each step (the copy is included in their time).")
        batch_size = caches.batch_size if caches else (spec.batch_size or 1)
        plan = _plan_for(plan, spec)
        if coord is not None:
            _measure_lockstep(coord, results, selected, spec, caches, dev, move, train_step, batch_size, plan,
                              deadline, clock, emit, step_timeout, fresh, waits)
        if coord is None:
            _measure_rounds(results, selected, spec, caches, dev, move, train_step, batch_size, plan, deadline,
                            clock, emit, step_timeout, fresh)
        if coord is not None:
            reason = "not timed under torch.distributed: isolated steps would break the ranks' lockstep"
            isolated, syncs = {"status": "skipped", "reason": reason}, {"status": "skipped", "reason": reason}
        else:
            isolated, syncs = isolate.after_points(spec, caches, dev, move, train_step, results, max_seconds=max_seconds,
                                                   step_timeout=step_timeout, clock=clock)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if moved_from is not None:
            wl.model.to(moved_from)
        state_mod.restore(snap, wl.model, wl.optimizer)

    for name in POINTS:
        if name not in selected:
            results[name] = PointResult(name, "skipped", reason="not selected (points option)")
        elif name not in results:
            results[name] = PointResult(name, "not run", reason="interrupted" if interrupted else "out of time")
    ordered = tuple(results[p] for p in POINTS)
    measured = {p.point: p.throughput for p in ordered if p.status == "ok"}
    skipped = {p.point: p.reason or "" for p in ordered if p.status == "skipped"}
    batch_size = caches.batch_size if caches else (spec.batch_size or 1)
    verdict = decide(measured, batch_size, skipped)

    complete = not interrupted and all(p.status != "not run" and not p.stopped_by_deadline for p in ordered)
    warnings.extend(_warnings(ordered, caches, spec))
    report = Report(
        device=str(dev),
        batch_size=batch_size,
        points=ordered,
        verdict=verdict,
        loader=spec.settings(),
        cache=_cache_info(caches),
        warnings=tuple(warnings),
        run=_run_info(max_seconds, clock() - start),
        complete=complete,
        interrupted=interrupted,
        isolated=isolated,
        syncs=syncs,
    )
    if interrupted:
        raise Interrupted(report)
    if coord is not None:
        report = distributed.combine(report, coord, waits)
    return report


def _round_plan(plan: Plan, rounds: int) -> Plan:
    """Each round measures its share of the windows; together they meet the plan."""
    if rounds == 1:
        return plan
    lo = max(2, math.ceil(plan.min_windows / rounds))
    return dataclasses.replace(plan, min_windows=lo, max_windows=max(lo, math.ceil(plan.max_windows / rounds)),
                               target_rel_se=plan.target_rel_se * math.sqrt(rounds))


def _measure_rounds(results, selected, spec, caches, dev, move, train_step, batch_size, plan, deadline, clock, emit,
                    step_timeout, fresh) -> None:
    """The points in ROUNDS paired rounds: the ceiling down, then back up. Each point's
    windows from both rounds are pooled, so a machine that slows down (or speeds up)
    over the run weighs on every point alike instead of showing up as a stage cost
    between the points measured early and late."""
    todo = []
    for name in MEASURE_ORDER:
        if name not in selected or name in results:
            continue
        unavailable = _not_applicable(name, dev, caches)
        if unavailable:
            results[name] = PointResult(name, unavailable[0], reason=unavailable[1])
        else:
            todo.append(name)
    rounds = ROUNDS if len(todo) > 1 else 1
    slots = [name for r in range(rounds) for name in (todo if r % 2 == 0 else todo[::-1])]
    sub = _round_plan(plan, rounds)
    for i, name in enumerate(slots):
        before = results.get(name)
        if before is not None and before.status != "ok":
            continue  # failed in the first round: not run again
        emit({"event": "point", "point": name, "index": i, "total": len(slots)})
        share = _weight(name) / sum(_weight(n) for n in slots[i:])
        point_deadline = clock() + max(0.0, deadline - clock()) * share
        now = _measure_point(name, spec, caches, dev, move, train_step, batch_size, sub, point_deadline, clock, emit,
                             step_timeout, fresh)
        results[name] = now if before is None else _pool(before, now, batch_size)


def _weight(name: str) -> float:
    """Share of the time left that a point may take, relative to the others: `full`
    gets more, since without it there is no verdict, and its first batch (worker
    start-up over the real pipeline) is the slowest of all."""
    return FULL_WEIGHT if name == "full" else 1.0


def _pool(first: PointResult, second: PointResult, batch_size: int) -> PointResult:
    """One point's result from two rounds (a failure in the second round fails it)."""
    if second.status != "ok":
        return second
    windows = first.throughput.windows + second.throughput.windows
    return dataclasses.replace(first, throughput=Throughput(windows, batch_size),
                               warmup_steps=first.warmup_steps + second.warmup_steps,
                               stopped_by_deadline=first.stopped_by_deadline or second.stopped_by_deadline)


def _measure_lockstep(coord, results, selected, spec, caches, dev, move, train_step, batch_size, plan, deadline,
                      clock, emit, step_timeout, fresh, waits) -> None:
    """The points on every rank in the same order, each in lockstep (distributed.py);
    a point no rank can measure is settled without steps."""
    todo = [p for p in MEASURE_ORDER if p in selected]
    for i, name in enumerate(todo):
        local = results.get(name)  # already failed here (the cache fill)
        if local is None:
            na = _not_applicable(name, dev, caches)
            if na:
                local = PointResult(name, na[0], reason=na[1])
        if coord.all(local is not None):
            results[name] = local
            continue
        emit({"event": "point", "point": name, "index": i, "total": len(todo)})
        remaining = len(todo) - i
        point_deadline = clock() + max(0.0, deadline - clock()) / max(1, remaining)
        result, wait = _measure_point_lockstep(name, spec, caches, dev, move, train_step, batch_size, plan,
                                               point_deadline, clock, emit, step_timeout, fresh, coord,
                                               skip=local is not None)
        outcomes = coord.gather((result.status if local is None else "skipped", result.reason))  # agree, then go on
        if local is not None:
            result = local
        elif result.status == "failed" and result.failed_stage == "peer":
            who = [(r, why) for r, (st, why) in enumerate(outcomes) if st == "failed" and r != coord.rank]
            first = who[0] if who else (None, "unknown")
            result = dataclasses.replace(result, reason=f"rank {first[0]} failed at this point: {first[1]}")
        if wait is not None:
            waits[name] = wait
        results[name] = result


def _measure_point_lockstep(name, spec, caches, dev, move, train_step, batch_size, plan, deadline, clock, emit,
                            step_timeout, fresh, coord, skip) -> tuple:
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    t0 = clock()
    open_error = None
    with contextlib.ExitStack() as stack:
        dog = stack.enter_context(faults.Watchdog(step_timeout, lambda: f"point {name}"))
        next_batch, moves = None, True
        if not skip:
            try:
                source, moves = _source(name, spec, caches, dev, move, fresh)
                next_batch = stack.enter_context(source)
            except Exception as exc:  # this rank takes part without steps, then fails the point
                open_error = exc
        opened = clock() - t0
        lm = distributed.measure(next_batch, move if moves else None, train_step, batch_size=batch_size, plan=plan,
                                 deadline=deadline, clock=clock, sync=sync,
                                 prefetch_depth=spec.prefetch_depth if name not in ("host", "device") else 0,
                                 coord=coord, beat=dog.beat,
                                 on_window=lambda i, w: emit({"event": "window", "point": name, "window": i,
                                                               "max_windows": plan.max_windows}))
    error = open_error or lm.error
    if error is not None:
        return _failed(name, error, step_timeout, train_step, move), None
    if lm.peer_failed or lm.measured is None:
        return PointResult(name, "failed", reason="another rank failed at this point", failed_stage="peer"), None
    m = lm.measured
    wait = lm.wait_seconds / max(lm.steps, 1)
    return PointResult(name, "ok", m.throughput, None, opened + m.first_batch_seconds, m.warmup_steps,
                       m.stopped_by_deadline), wait


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


def _before_run(spec: stages.LoaderSpec, caches: replay.Caches) -> list:
    """Problems that can be seen before measuring anything."""
    out = list(caches.warnings)  # pipeline problems seen while filling (a non-sharding IterableDataset)
    shm = faults.shm_problem(spec.num_workers, spec.prefetch_depth, caches.batch_bytes, faults.shm_free_bytes())
    if shm:
        out.append(shm)
    if caches.stopped_by:
        out.append(f"filling the caches stopped after {caches.n_batches} batch(es): {caches.stopped_by}")
    return out


def _step_mutates(train_step, move, caches: replay.Caches, spec, dev: torch.device) -> bool:
    """Run one step on a copy of a cached batch: does it change its input in place?
    (It also makes the step's first, slow calls before anything is timed.)"""
    probe = replay.device_batches(replay.host_batches(caches, spec, dev)[:1], move, dev)[0]
    reference = stages.clone_data(probe)
    try:
        train_step(probe)
    except Exception:  # the points will fail with this error themselves
        return False
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return not stages.same_values(probe, reference)


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


def _source(name: str, spec, caches, dev: torch.device, move, fresh: bool):
    """The batch source of a point and whether the loop moves its batches to the device."""
    if name == "full":
        return replay.full_loader(spec, caches.dataset if caches else _tagged_copy(spec)), True
    if name == "raw":
        ds = replay.RawReplay(caches.samples, caches.raw_calls)
        return replay.sample_loader(spec, ds, caches.batch_size), True
    if name == "augmented":
        return replay.sample_loader(spec, replay.SampleCache(caches.samples), caches.batch_size), True
    if name == "collated":
        return replay.batch_loader(spec, caches.batches), True
    host = replay.host_batches(caches, spec, dev)
    if name == "host":
        return replay.cached_source(host, fresh), True
    return replay.cached_source(replay.device_batches(host, move, dev), fresh), False


def _tagged_copy(spec) -> Any:
    """A copy of the dataset whose transforms name the augment stage when they raise
    (not recording): for the full point when the caches could not be filled."""
    if spec.iterable:
        return None
    try:
        return stages.instrument(spec.dataset).dataset
    except Exception:  # cannot be copied: the full point runs over a plain copy
        return None


def _measure_point(name, spec, caches, dev, move, train_step, batch_size, plan, deadline, clock, emit,
                   step_timeout, fresh) -> PointResult:
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    t0 = clock()
    opened = 0.0
    try:
        with faults.Watchdog(step_timeout, lambda: f"point {name}") as dog:
            source, moves = _source(name, spec, caches, dev, move, fresh)
            with source as next_batch:
                opened = clock() - t0
                m = measure(next_batch, move if moves else None, train_step, batch_size=batch_size, plan=plan,
                            deadline=deadline, clock=clock, sync=sync,
                            prefetch_depth=spec.prefetch_depth if name not in ("host", "device") else 0,
                            on_window=lambda i, w: emit({"event": "window", "point": name, "window": i,
                                                          "max_windows": plan.max_windows}),
                            beat=dog.beat)
    except KeyboardInterrupt:
        raise
    except BisectError:
        raise
    except Exception as exc:
        return _failed(name, exc, step_timeout, train_step, move)
    if m.throughput is None:
        return PointResult(name, "failed", reason="out of time before one window was measured (raise --max-seconds)",
                           first_batch_seconds=opened + m.first_batch_seconds, warmup_steps=m.warmup_steps,
                           stopped_by_deadline=True)
    return PointResult(name, "ok", m.throughput, None, opened + m.first_batch_seconds, m.warmup_steps,
                       m.stopped_by_deadline)


def _failed(name: str, exc: BaseException, step_timeout, train_step, move) -> PointResult:
    """A failed point: the stage whose code raised, and the original error."""
    if isinstance(exc, faults.StepTimeout):
        what = (f"no batch in {step_timeout:g} s" if faults.hang_location(exc) == "no batch"
                else f"the training step did not finish in {step_timeout:g} s")
        return PointResult(name, "failed", reason=f"{what} (--step-timeout); its workers were terminated",
                           failed_stage="hang")
    stage, reason = faults.classify(exc)
    if stage is None:
        stage = _stage_from_traceback(exc, name, train_step, move)
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


def _warnings(points, caches, spec) -> list:
    out = []
    for p in points:
        if p.status == "ok" and p.throughput.rel_iqr > NOISY_REL_IQR:
            out.append(f"{p.point}: windows disagree by {p.throughput.rel_iqr * 100:.0f}% (IQR/median); the machine "
                       "is busy or the pipeline is bursty. Close other work or raise --max-seconds for more windows.")
        if p.status == "ok" and p.stopped_by_deadline:
            out.append(f"{p.point}: cut short by --max-seconds after {p.throughput.n} window(s); raise it for firmer numbers.")
    if caches is not None and caches.limited_by:
        out.append(f"the caches hold {caches.n_batches} batch(es), limited by {caches.limited_by}; "
                   "cached points cycle over fewer distinct batches (raise --cache-mb or --max-seconds).")
    cores = os.cpu_count() or 1
    if spec.num_workers > cores:
        out.append(f"num_workers={spec.num_workers} is more than this machine's {cores} cores: workers compete for CPU.")
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

