"""What one bisection carries from phase to phase (Run), the phases before any point is
measured (fill the caches, probe the step, hold the allocator), and one visit of a point,
which both schedulers use: rounds.py (one process) and distributed.py (torchrun)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

import torch

from . import allocator, cache, devices, faults, sources, split, tree
from .errors import BisectError
from .loader import LoaderSpec
from .report import NOT_SELECTED, PointResult
from .step import make_step, to_device as default_to_device
from .timing import Plan, measure
from .verdict import Verdict, decide

# Measured from the ceiling down, so the most trustworthy numbers come first and a
# run cut short by --max-seconds still has a ceiling to compare with.
MEASURE_ORDER = ("device", "host", "collated", "augmented", "raw", "full")
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


@dataclasses.dataclass
class Run:
    """One bisection: the pipeline, the device, the plan and clock, the step and transfer,
    the caches once filled, and the points' results as they come."""

    spec: LoaderSpec
    device: torch.device
    plan: Plan
    clock: Callable[[], float]
    emit: Callable[[dict], None]
    step_timeout: Optional[float]
    start: float
    end: float  # start + max_seconds: the hard end
    deadline: float  # when measuring points stops (room left for the isolated timings)
    # when the rounds that only settle the verdict stop (after plan.min_rounds): room
    # left for the verification of the advice (verify.py)
    settle_deadline: float = 0.0
    step: Any = None
    move: Any = None
    caches: Optional[cache.Caches] = None
    fresh: bool = False  # the step changes its batch in place: cached points hand it copies
    wrapper: Any = None  # the user's loader wrapper every point's batches go through (integrations.timm)
    results: dict = dataclasses.field(default_factory=dict)
    warnings: list = dataclasses.field(default_factory=list)
    visits: int = 0

    def __post_init__(self) -> None:
        self.settle_deadline = min(self.settle_deadline or self.deadline, self.deadline)

    @property
    def batch_size(self) -> float:
        return self.caches.batch_size if self.caches else (self.spec.batch_size or 1)

    def sync(self) -> None:
        devices.synchronizer(self.device)()

    def watchdog(self, what: Callable[[], str]) -> faults.Watchdog:
        """A watchdog for one phase: --step-timeout without progress, or the hard end."""
        return faults.Watchdog(self.step_timeout, what, end=self.end + HANG_GRACE_S - self.clock())

    def decide(self, noise_scale: float = 1.0) -> Verdict:
        ok = {n: p.throughput for n, p in self.results.items() if p.status == "ok"}
        skipped = {n: p.reason or "" for n, p in self.results.items()
                   if p.status == "skipped" and p.reason != NOT_SELECTED}
        return decide(ok, self.batch_size, skipped, noise_scale=noise_scale)

    def use(self, wl: Any) -> None:
        """The workload's step (the default one built now: inside the run, whose state is
        restored afterwards), its transfer to this device, and its loader wrapper."""
        self.step = make_step(wl.model, wl.optimizer, wl.loss_fn, wl.step)
        move, dev = wl.to_device or default_to_device, self.device
        self.move = lambda batch: move(batch, dev)
        self.wrapper = wl.wrapper

    def not_applicable(self, name: str) -> Optional[PointResult]:
        if name == "host" and self.device.type == "cpu":
            return PointResult(name, "skipped", reason="no accelerator: host and device coincide")
        if name == "collated" and self.spec.num_workers == 0 and not (self.spec.pin_memory and self.device.type != "cpu"):
            return PointResult(name, "skipped", reason="num_workers=0: no worker hands batches over and nothing pins "
                                                       "them, so collated and device coincide (no handoff)")
        if name == "raw" and self.caches is not None and self.caches.raw_calls is None:
            return PointResult(name, "unavailable", reason=self.caches.raw_reason)
        return None

    def source(self, name: str, spec: Optional[LoaderSpec] = None, epochs: bool = False) -> tuple:
        """(the point's batch source, what the loop applies to each batch before the step:
        the transfer, or None when the batches are already on the device). `spec`: other
        loader settings for `full` (verify.py); the user's own by default. `epochs`: `full`
        ends its epochs as the user's loop does (sources.full_loader)."""
        spec, caches = spec or self.spec, self.caches
        if name == "device":
            host = sources.host_batches(caches, spec, self.device)
            return sources.cached_source(sources.device_batches(host, self.move, self.device), self.fresh), None
        if name == "full":
            source = sources.full_loader(spec, caches.dataset if caches else _tagged_copy(spec), epochs)
        elif name == "raw":
            source = sources.sample_loader(spec, sources.RawReplay(caches.samples, caches.raw_calls), caches.groups)
        elif name == "augmented":
            source = sources.sample_loader(spec, sources.SampleCache(caches.samples), caches.groups)
        elif name == "collated":
            source = sources.batch_loader(spec, caches.batches, self.fresh and self.device.type == "cpu")
        else:  # host
            source = sources.cached_source(sources.host_batches(caches, spec, self.device))
        if self.wrapper is not None:  # the user's wrapper moves the batches, overlapping the step
            from .integrations import timm

            return timm.through(self.wrapper, source), None
        if self.fresh and self.device.type != "cpu":
            # A step that changes its batch gets a copy made on the device after the
            # transfer, as the device point makes one: the host batch stays pinned, and
            # both sides of `transfer` pay the same copy.
            return source, self._move_then_copy
        return source, self.move

    def _move_then_copy(self, batch: Any) -> Any:
        return tree.clone(self.move(batch))

    def prefetch_depth(self, name: str) -> int:
        return self.spec.prefetch_depth if name not in ("host", "device") else 0


# --------------------------------------------------------------------------------------
# Before the points
# --------------------------------------------------------------------------------------


def fill(run: Run, selected: tuple, *, cache_mb: float, cache_batches: int, max_seconds: float,
         batch_size: Any = None) -> None:
    """Fill the caches under the watchdog: a hang before the first batch is cut at the
    hard end, one after it at the end of the fill's own time budget. When not even one
    batch can be built, every cached point fails with the reason. First, the class the
    replay loaders are built through (sources.loader_class)."""
    run.emit({"event": "cache", "message": "filling the caches"})
    run.spec, why = sources.loader_class(run.spec)
    if why:
        run.warnings.append(why)
    budget = max(1.0, CACHE_TIME_SHARE * max_seconds)
    t0 = run.clock()
    try:
        with run.watchdog(lambda: "building the caches") as dog:
            def on_batch(n: int) -> None:
                if n == 1:
                    dog.end_in(max(0.0, budget - (run.clock() - t0)) + 1.0, label="the fill's time budget")
            run.caches = cache.fill(run.spec, cache_mb=cache_mb, max_batches=cache_batches, time_budget=budget,
                                    clock=run.clock, on_batch=on_batch, batch_size=batch_size)
    except cache.FillError as exc:
        for name in MEASURE_ORDER[:-1]:
            if name in selected:
                run.results[name] = PointResult(name, "failed", reason=f"filling the cache failed: {exc.reason}",
                                                failed_stage="hang" if exc.hang else exc.stage)
        return
    caches = run.caches
    run.warnings.extend(caches.warnings)  # pipeline problems seen while filling (a non-sharding IterableDataset)
    shm = faults.shm_problem(run.spec.num_workers, run.spec.prefetch_depth, caches.batch_bytes, faults.shm_free_bytes())
    if shm:
        run.warnings.append(shm)
    if caches.stopped_by:
        run.warnings.append(f"filling the caches stopped after {caches.n_batches} batch(es): {caches.stopped_by}")
    for w in run.warnings:
        run.emit({"event": "warning", "message": w})


def probe_step(run: Run, coord: Any) -> None:
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
    batch = sources.device_batches(sources.host_batches(run.caches, run.spec, run.device, 1), run.move, run.device)[0]
    reference = tree.clone(batch)
    try:
        run.step(batch)
    except Exception:  # the points will fail with this error themselves
        return False
    run.sync()
    return not tree.same_values(batch, reference)


def hold_allocator(run: Run, held: allocator.Held, coord: Any, max_seconds: float) -> dict:
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
    batch = sources.device_batches(sources.host_batches(run.caches, run.spec, run.device, 1), run.move, run.device)[0]
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


# --------------------------------------------------------------------------------------
# One visit of a point
# --------------------------------------------------------------------------------------


def visit(run: Run, name: str, deadline: float) -> PointResult:
    """Open the point's source, time one visit (timing.measure), shut its workers down."""
    t0 = run.clock()
    opened = 0.0
    try:
        with run.watchdog(lambda: f"point {name}") as dog:
            source, move = run.source(name)
            with source as next_batch:
                opened = run.clock() - t0
                m = measure(next_batch, move, run.step, batch_size=run.batch_size,
                            plan=run.plan, deadline=deadline, clock=run.clock, sync=run.sync,
                            prefetch_depth=run.prefetch_depth(name),
                            on_window=lambda i, w: run.emit({"event": "window", "point": name, "window": i,
                                                             "max_windows": run.plan.windows_per_visit}),
                            beat=dog.beat)
    except (KeyboardInterrupt, BisectError):
        raise
    except Exception as exc:
        return failed(run, name, exc)
    if m.throughput is None:
        return PointResult(name, "failed", reason="out of time before one window was measured (raise --max-seconds)",
                           first_batch_seconds=opened + m.first_batch_seconds, warmup_steps=m.warmup_steps,
                           stopped_by_deadline=True)
    return PointResult(name, "ok", m.throughput, None, opened + m.first_batch_seconds, m.warmup_steps,
                       m.stopped_by_deadline, steady=m.steady)


def failed(run: Run, name: str, exc: BaseException) -> PointResult:
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


def _stage_from_traceback(exc: BaseException, point: str, train_step: Any, move: Any) -> Optional[str]:
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


def _tagged_copy(spec: LoaderSpec) -> Any:
    """A copy of the dataset whose transforms name the augment stage when they raise
    (not recording): for the full point when the caches could not be filled."""
    if spec.iterable:
        return None
    try:
        return split.instrument(spec.dataset).dataset
    except Exception:  # cannot be copied: the full point runs over a plain copy
        return None
