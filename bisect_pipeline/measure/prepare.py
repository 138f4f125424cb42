"""Before the points: the caches filled (a node graph's by graph.py, a DataLoader's by
cache.py), the step probed for a batch it changes in place, and the allocator held still
with the step timed alone before and after. Apart from experiment.py because these run
once, before any visit (phases.measure), and leave on the Experiment what they found.
"""

from __future__ import annotations

from typing import Any

from ..core import faults, tree
from ..core.results import AllocatorTiming, Note, PointResult
from ..core.stats import Window
from ..pipeline.integrations import nodes
from . import allocator, cache, graph, sources
from .experiment import MEASURE_ORDER, Experiment

# Share of --max-seconds the cache fill may take before it settles for fewer batches.
CACHE_TIME_SHARE = 0.2
# The step timed alone before and after the allocator is held still (the `allocator`
# advice): this share of --max-seconds, at most ALLOCATOR_SECONDS.
ALLOCATOR_SHARE = 0.02
ALLOCATOR_SECONDS = 1.0
# It takes at least allocator.LEAST_STEPS steps: where those would take more than this
# share of --max-seconds (a step of a second or more), the step is not timed alone.
ALLOCATOR_MAX_SHARE = 0.1


def fill(exp: Experiment, selected: tuple, *, cache_mb: float, cache_batches: int, max_seconds: float,
         batch_size: Any = None) -> None:
    """Fill the caches under the watchdog: a hang before the first batch is cut at the
    hard end, one after it at the end of the fill's own time budget. When not even one
    batch can be built, every cached point fails with the reason. First, the class the
    replay loaders are built through (sources.loader_class)."""
    exp.emit({"event": "cache", "message": "filling the caches"})
    fill_caches = cache.fill
    if isinstance(exp.spec, nodes.NodeSpec):  # a node graph: its own fill, its own notes
        fill_caches = graph.fill
        exp.notes.extend(nodes.notes(exp.spec))
    else:
        cls = exp.spec.loader_cls
        exp.spec, why = sources.loader_class(exp.spec)
        if why:
            exp.notes.append(loader_note(cls, why))
    budget = max(1.0, CACHE_TIME_SHARE * max_seconds)
    t0 = exp.clock()
    try:
        with exp.watchdog(lambda: "building the caches") as dog:
            def on_batch(n: int) -> None:
                if n == 1:
                    dog.end_in(max(0.0, budget - (exp.clock() - t0)) + 1.0, label="the fill's time budget")
            exp.caches = fill_caches(exp.spec, cache_mb=cache_mb, max_batches=cache_batches, time_budget=budget,
                                     clock=exp.clock, on_batch=on_batch, batch_size=batch_size)
    except cache.FillError as exc:
        for name in MEASURE_ORDER[:-1]:
            if name in selected:
                exp.results[name] = PointResult(name, "failed", reason=f"filling the cache failed: {exc.reason}",
                                                failed_stage="hang" if exc.hang else exc.stage,
                                                error=faults.raw(exc.__cause__) if exc.__cause__ else None)
        return
    caches = exp.caches
    exp.notes.extend(caches.warnings)  # pipeline problems seen while filling (a non-sharding IterableDataset)
    shm = faults.shm_problem(exp.spec.num_workers, exp.spec.prefetch_depth, caches.batch_bytes, faults.shm_free_bytes())
    if shm:
        exp.notes.append(shm)
    if caches.stopped_by:
        exp.notes.append(fill_failed_note(caches.n_batches, caches.stopped_by))
    for n in exp.notes:
        exp.emit({"event": "warning", "message": n.message})


def loader_note(cls: type, why: str) -> Note:
    """The user's DataLoader subclass could not be rebuilt (sources.loader_class says why)."""
    return Note("loader", f"{cls.__qualname__} could not be rebuilt: let it take DataLoader's arguments.", detail=why)


def fill_failed_note(kept: int, reason: str) -> Note:
    """Filling the caches stopped on an error after `kept` batches (kept and measured)."""
    return Note("cache", f"Filling the caches failed after {kept} batch{'es' if kept != 1 else ''}: fix the error "
                         "for more batches.", detail=reason)


def fresh_copy_note(who: str = "The step") -> Note:
    """`who` (the step, or the user's loop: phases.Probe) changes its input batch in place."""
    return Note("step", f"{who} changes its input batch in place: leave the batch as it is given.",
                detail="the cached points hand the step a fresh copy each step, and the copy is in their time, "
                       "not in the full pipeline's")


def probe_step(exp: Experiment, coord: Any) -> None:
    """One step on a copy of a cached batch: does the step change its input in place?
    (It also makes the step's first, slow calls before anything is timed.) Under
    torchrun every rank steps once, or the others would wait in DDP's all-reduce."""
    if coord is None:
        exp.fresh = exp.caches is not None and _step_mutates(exp)
    else:
        probe: list = []
        coord.unit(lambda: probe.append(_step_mutates(exp)), exp.caches is None)
        exp.fresh = bool(probe and probe[0])
    if exp.fresh:
        exp.notes.append(fresh_copy_note())


def one_device_batch(exp: Experiment) -> Any:
    """A cached batch on the device, as the `device` point hands it out."""
    return sources.device_batches(sources.host_batches(exp.caches, exp.spec, exp.device, 1), exp.move, exp.device)[0]


def _step_mutates(exp: Experiment) -> bool:
    batch = one_device_batch(exp)
    reference = tree.clone(batch)
    try:
        exp.step(batch)
    except Exception:  # the points will fail with this error themselves
        return False
    exp.sync()
    return not tree.same_values(batch, reference)


def hold_allocator(exp: Experiment, held: allocator.Held, coord: Any, max_seconds: float) -> AllocatorTiming:
    """Hold the allocator still for the rest of the run, timing the step alone just
    before and after (allocator.Held.time_step) when that can be done here: on the CPU,
    with a cached batch, in one process (under torchrun a step on one rank alone would
    wait for the others in DDP's all-reduce)."""
    why = ("the step runs on an accelerator" if exp.device.type != "cpu" else
           "not timed under torch.distributed" if coord is not None else
           "the caches could not be filled" if exp.caches is None else None)
    if why is not None:
        held.hold()
        return AllocatorTiming.missing("skipped", why)
    batch = one_device_batch(exp)
    try:
        with exp.watchdog(lambda: "the step timed alone (allocator)"):
            t0 = exp.clock()
            exp.step(batch)  # the first of the timing's warm-up steps, timed: is the step long?
            exp.step_alone = exp.clock() - t0
            least = exp.step_alone * allocator.LEAST_STEPS
            if least > ALLOCATOR_MAX_SHARE * max_seconds and exp.step_alone <= ALLOCATOR_SHARE * max_seconds:
                # a fresh step's first call pays its lazy initialisation: where it cost no
                # more than this timing's own share, a second call says whether the step is long
                t0 = exp.clock()
                exp.step(batch)
                exp.step_alone = exp.clock() - t0
                least = exp.step_alone * allocator.LEAST_STEPS
            if least > ALLOCATOR_MAX_SHARE * max_seconds:
                exp.step_window = Window(1, exp.step_alone)  # one whole step: a window of the device point's
                return AllocatorTiming.missing(
                    "skipped", f"one step takes {exp.step_alone:.2g} s: timing it before and after would take "
                               f"{least:.0f} s, more than {ALLOCATOR_MAX_SHARE:.0%} of --max-seconds")
            timing = held.time_step(lambda: exp.step(batch), min(ALLOCATOR_SECONDS, ALLOCATOR_SHARE * max_seconds),
                                    exp.clock)
            if timing.held_ms_per_batch:
                exp.step_alone = timing.held_ms_per_batch / 1e3
            return timing
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # the points will fail with this error themselves
        return AllocatorTiming.missing("failed", f"{type(exc).__name__}: {exc}"[:300])
    finally:
        held.hold()
