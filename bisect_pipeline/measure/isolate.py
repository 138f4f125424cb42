"""Stage costs measured in isolation, in this process, without workers: the parts timed
in turn within one small budget (time_stages), the input work between steps sized from
them, the workers they say would feed the step, and the run's way in (before_points,
with_ceiling). What each part times lives beside it (worker_stages, device_alone, on
timed.py's loop): a new cost alone gets a module there and its turn in time_stages."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
from typing import Any, Callable, Optional

import torch

from ..core.results import (BatchShape, Collate, InLoop, Isolated, LoopStages, Memory, PerSample, SampleStructure,
                            StepTime, Syncs, Transfer, Workers)
from ..core.stats import Window
from ..pipeline.loader import LoaderSpec, copy_or_same
from . import devices, sources
from .cache import index_batches
from .device_alone import (STEP_WARMUP, count_syncs, describe_batch, memory, no_syncs_counted, sync_steps, time_step,
                           time_transfer)
from .timed import guard, reason_of, se_ms, timed_loop, worker_threads
from .worker_stages import sample_structure, time_augment_and_load, time_collate

# The isolation measurements take at most this share of --max-seconds, and never more
# than ISOLATE_MAX_SECONDS: they refine the advice, the bisection is the measurement.
ISOLATE_SHARE = 0.05
ISOLATE_MAX_SECONDS = 2.0
# The input work timed between steps (_in_loop): at least this many batches, each after
# a step, or none. It stands in the second witness for load and collate timed alone over
# hundreds of items: a standard error from fewer batches is too rough for that (its
# degrees of freedom set how far the costs alone can order two stages).
IN_LOOP_MIN_BATCHES = 8
# Where the step part's time came from (before_points, with_ceiling).
STEP_ALONE = "the step timed alone while the allocator was held"
STEP_CEILING = "the device point (batches cached on the device)"


def budget(max_seconds: float) -> float:
    """Seconds reserved for isolation out of a run of `max_seconds`."""
    return min(ISOLATE_MAX_SECONDS, ISOLATE_SHARE * max_seconds)


def cores() -> int:
    """CPU cores this process may run on (affinity-aware where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def time_stages(spec: LoaderSpec, caches: Any, device: torch.device, move: Callable[[Any], Any],
                train_step: Optional[Callable[[Any], Any]], *, step_sec_per_batch: Optional[float], budget_s: float,
                clock: Callable[[], float] = time.perf_counter, end: float = math.inf,
                step_estimate_s: Optional[float] = None, step_source: str = STEP_CEILING,
                loop_stages: Any = None, long_s: float = math.inf) -> tuple[Isolated, Syncs]:
    """(isolated, syncs). Never raises for a failing measurement: a part that fails says
    so with its reason; KeyboardInterrupt propagates. `train_step` None: the step is the
    user's own loop (loop.py), timed only at the device point; no syncs are counted here.
    `end` (on `clock`): the run's hard end; the parts that run the training step (the
    step alone, the sync count) are skipped when `step_estimate_s` says they would pass it.
    `loop_stages`: stages the loop runs in its own process (integrations.webdataset.
    LoopStages), timed on the cached batches. `long_s`: a step this long or longer is a
    long one (Plan.long): its timing and its sync count take fewer calls (time_step,
    sync_steps)."""
    if caches is None:
        reason = "the caches could not be filled"
        return Isolated.missing("unavailable", reason), Syncs.missing("unavailable", reason)
    start = clock()
    share = budget_s / 5  # augment, load, collate, transfer, step

    def fits(steps: int) -> bool:
        return step_estimate_s is None or clock() + steps * step_estimate_s <= end

    def out_of_time(steps: int) -> str:
        return (f"out of time: {steps} training steps of about {step_estimate_s:.3g} s would run past the end "
                "of --max-seconds")
    with worker_threads(spec):
        augment, load, collates = time_augment_and_load(spec, caches, share, clock)
        parts = dict(augment=augment, load=load,
                     collate=guard(Collate, lambda: time_collate(spec, caches, share, clock, in_place=collates)))
    parts.update(batch=guard(BatchShape, lambda: describe_batch(caches.batches[0])),
                 sample_structure=guard(SampleStructure, lambda: sample_structure(caches.samples[0])),
                 transfer=guard(Transfer, lambda: time_transfer(spec, caches, device, move, share=share, clock=clock)))
    if loop_stages is not None:
        parts["loop"] = guard(LoopStages, lambda: _loop(loop_stages, caches, share, clock))
    device_batch, syncs = None, None
    try:
        device_batch = sources.device_batches(sources.host_batches(caches, spec, device, 1), move, device)[0]
    except Exception as exc:
        syncs = Syncs.missing("failed", reason_of(exc))
    parts["step"] = _step_part(step_sec_per_batch, step_source, batch=device_batch, step=train_step, fits=fits,
                               out_of_time=out_of_time,
                               time_it=lambda: time_step(train_step, device_batch, device, share, clock, long_s=long_s))
    parts["in_loop"] = _in_loop_part(spec, caches, train_step, device_batch, device, parts=parts, fits=fits,
                                     clock=clock, step_s=step_estimate_s, share=min(share, budget_s - clock() + start))
    if device_batch is not None:
        timed = parts["step"]
        n = sync_steps(timed.ms_per_batch / 1e3 if timed.ok and timed.ms_per_batch else None, long_s)
        if train_step is not None and (device.type != "cuda" or fits(n)):
            syncs = guard(Syncs, lambda: count_syncs(train_step, device_batch, device, steps=n))
        elif train_step is not None:
            syncs = Syncs.missing("skipped", out_of_time(n))
        if device.type == "cuda":
            parts["memory"] = guard(Memory, lambda: memory(device))
    items = caches.items_per_batch
    out = Isolated(budget_s=round(budget_s, 3), batch_size=caches.batch_size, items_per_batch=round(items, 4), **parts)
    workers = workers_needed(out, items, cores(), step_threads=torch.get_num_threads() if device.type == "cpu" else 0)
    return dataclasses.replace(out, workers=workers, elapsed_s=round(clock() - start, 4)), syncs


def _step_part(seconds: Optional[float], source: str, *, batch: Any, step: Any, fits: Callable[[int], bool],
               out_of_time: Callable[[int], str], time_it: Callable[[], StepTime]) -> StepTime:
    """The step's part: the `seconds` it was given (the step timed alone while the
    allocator was held: STEP_ALONE), else timed here (time_it) where its steps fit before
    the end. A step timed alone is kept as `alone_ms_per_batch` too: with_ceiling puts
    the device point's figure in ms_per_batch, and the verdict checks one against the other."""
    if seconds is not None:
        ms = round(seconds * 1e3, 3)
        return StepTime(ms_per_batch=ms, source=source, alone_ms_per_batch=ms if source == STEP_ALONE else None)
    if batch is None or step is None:
        return StepTime.missing("unavailable", "no batch on the device to step on")
    if not fits(STEP_WARMUP + 1):
        return StepTime.missing("skipped", out_of_time(STEP_WARMUP + 1))
    timed = guard(StepTime, time_it)
    return dataclasses.replace(timed, alone_ms_per_batch=timed.ms_per_batch) if timed.ok else timed


def _loop(stages: Any, caches: Any, share: float, clock) -> LoopStages:
    """The loop's own stages, making batches out of the cached ones (LoopStages.timing)."""
    items, fn = stages.timing(caches.batches)
    timed = timed_loop(items, fn, share, clock)
    return LoopStages(label=stages.label, ms_per_batch=round(timed.ms, 4), batches=timed.n,
                      se_ms_per_batch=timed.se_ms, cpu_ms_per_batch=round(timed.cpu_ms, 4))


def _in_loop_part(spec, caches, train_step, batch, device, *, parts: dict, step_s: Optional[float], share: float,
                  clock, fits: Callable[[int], bool]) -> Optional[InLoop]:
    """_in_loop where it applies (the tool's own step, a map-style dataset, num_workers=0:
    the loop's own process does that work between its steps; a device batch to step on),
    in `share`: what the parts before it left of the budget, a part's share at most (on
    the CPU the transfer's, with nothing to time, and the step's where it was timed for
    the allocator); or skipped where IN_LOOP_MIN_BATCHES + 1 of its batches would not fit in
    that by the step's time (the step part's, else `step_s`) and the work of a batch timed
    alone: steps this long hold a batch's input work that is small enough to be missed
    alone as a small part of them (the loop's conditions do not decide), and a batch of
    seconds of work would overrun the share."""
    if train_step is None or spec.num_workers != 0 or spec.iterable or batch is None:
        return None
    timed = parts.get("step")
    step = timed.ms_per_batch / 1e3 if isinstance(timed, StepTime) and timed.ok else step_s
    load, col = parts.get("load"), parts.get("collate")
    items = ((load.getitem_ms_per_sample or load.ms_per_sample or 0.0) * caches.items_per_batch
             if isinstance(load, PerSample) and load.ok else 0.0)
    collate = (col.ms_per_batch or 0.0) if isinstance(col, Collate) and col.ok else 0.0
    work = (items + collate) / 1e3
    per_batch = (step or 0.0) + work
    if (IN_LOOP_MIN_BATCHES + 1) * per_batch > share:
        return InLoop.missing("skipped", f"batches of about {per_batch * 1e3:.3g} ms with their steps: "
                                         f"{IN_LOOP_MIN_BATCHES + 1} of them do not fit in its share ({share:.2g} s)")
    return guard(InLoop, lambda: _in_loop(spec, caches, train_step, batch, device, share=share, clock=clock,
                                          fits=fits))


def _in_loop(spec, caches, train_step, batch, device, *, share: float, clock, fits: Callable[[int], bool]) -> InLoop:
    """The loop's own input work at num_workers=0, in the loop's conditions: a training
    step on a device batch, untimed, then the batch sampler's next batch and its items
    fetched as the DataLoader's fetcher does (`__getitems__` where the dataset has it),
    timed, then collate_fn on them, timed; batch after batch, beyond the batches the
    caches hold (data the fill has not just touched, as most of the full point's). The
    stages timed one item after another (worker_stages) run in a tight loop over items
    the fill has just built, with nothing between them: they miss what the loop's own
    conditions add per batch (the caches the step evicts, the threads it leaves spinning,
    the allocator's state after it, the batch sampler's own work), which decides on a step
    of a few ms (docs/benchmarks.md: 0.59 ms a batch in a tight loop, 0.90 after a step)."""
    sync = devices.synchronizer(device)
    dataset = copy_or_same(spec.dataset)
    fetch_many = getattr(dataset, "__getitems__", None)
    order = itertools.islice(index_batches(spec), len(caches.groups), None)

    def fetch(idx):
        if not spec.auto_collation:
            return dataset[idx]
        return fetch_many(list(idx)) if fetch_many is not None else [dataset[i] for i in idx]
    fetched, collated = [], []
    t0 = clock()
    first = True
    while (first or clock() - t0 < share) and fits(1):
        train_step(batch)
        sync()
        a = clock()
        items = fetch(next(order))
        b = clock()
        spec.collate_fn(items)
        c = clock()
        if not first:  # the first, a warm-up: untimed
            fetched.append(b - a)
            collated.append(c - b)
        first = False
    if len(fetched) < IN_LOOP_MIN_BATCHES:
        return InLoop.missing("skipped", f"fewer than {IN_LOOP_MIN_BATCHES} steps fit in its share "
                                         f"({share:.2g} s) or before the end of --max-seconds")
    return InLoop(batches=len(fetched), fetch_ms_per_batch=round(sum(fetched) / len(fetched) * 1e3, 4),
                  fetch_se_ms=se_ms(fetched), collate_ms_per_batch=round(sum(collated) / len(collated) * 1e3, 4),
                  collate_se_ms=se_ms(collated))


def workers_needed(iso: Isolated, items_per_batch: float, n_cores: int, step_threads: int = 0) -> Workers:
    """Workers that would produce batches as fast as the step consumes them.

    worker work per batch = (load + augment) ms per sample * items per batch + collate ms
    per batch; needed = ceil(work / step ms). A "sample" here is one item of the dataset
    (one __getitem__, as load and augment are timed), so items per batch is the sampler's
    count (cache.Caches.items_per_batch), not the batch size when an item becomes several. The training loop's process keeps one core, so
    the machine can supply at most n_cores - 1 workers. `step_threads` is the number of
    intra-op threads a CPU step runs on (torch.get_num_threads(); 0 on an accelerator):
    workers beyond n_cores - step_threads compete with the step for cores.
    """
    step, load, aug, col = iso.part("step"), iso.part("load"), iso.part("augment"), iso.part("collate")
    if step is None or load is None or col is None:
        # the cores and the step's threads are still known: the second witness's model reads
        # them before the step is (a user's loop: its step comes from the device point)
        return dataclasses.replace(Workers.missing("unavailable", "the step, load or collate cost was not measured"),
                                   cores=n_cores, step_threads=step_threads)
    # When the transforms could not be split from loading, load's time already holds them.
    merged = "augment" in (load.includes or ())
    per_sample = load.ms_per_sample + (aug.ms_per_sample if aug is not None and not merged else 0.0)
    work = per_sample * items_per_batch + col.ms_per_batch
    step_ms = step.ms_per_batch
    needed = max(1, math.ceil(work / step_ms)) if step_ms > 0 else None
    available = max(0, n_cores - 1)
    return Workers(worker_ms_per_batch=round(work, 3), step_ms_per_batch=round(step_ms, 3), needed=needed,
                   cores=n_cores, available=available, step_threads=step_threads,
                   fits=needed is not None and needed <= available)


def before_points(exp: Any, *, max_seconds: float) -> tuple[Isolated, Syncs]:
    """Before the points are measured, once the caches are filled and the step probed:
    the stages timed alone, so that every verdict of the rounds (verdict.decide, the
    second witness) can hold the drops it measures against them (after them where only
    `full` is measured: no drop to witness, and the change's short check runs so). The step's time is the
    one timed alone while the allocator was held (Experiment.step_alone) where it was,
    else timed here (the tool's step), else left to the device point (a user's loop:
    with_ceiling). Guarded by the run's watchdog, within what is left of --max-seconds (a
    hard bound: the parts that run the training step are skipped where they would pass
    it). Not on CUDA, syncs say so whatever happened here."""
    no_cuda = no_syncs_counted(exp.device)
    left = exp.end - exp.clock()
    if left <= 0:
        reason = "out of time: the caches used all of --max-seconds"
        return Isolated.missing("skipped", reason), no_cuda or Syncs.missing("skipped", reason)
    try:
        with exp.watchdog(lambda: "the isolated stage timing") as dog:
            def beating_clock() -> float:  # every timed item beats the watchdog
                dog.beat()
                return exp.clock()
            iso, syncs = time_stages(exp.spec, exp.caches, exp.device, exp.move, exp.step,
                                     step_sec_per_batch=exp.step_alone, budget_s=min(budget(max_seconds), left),
                                     clock=beating_clock, end=exp.end, step_estimate_s=exp.step_estimate(),
                                     step_source=STEP_ALONE, loop_stages=exp.loop_stages,
                                     long_s=exp.plan.window_seconds)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # never costs the run its verdict
        return Isolated.missing("failed", reason_of(exc)), no_cuda or Syncs.missing("failed", reason_of(exc))
    exp.step_window = exp.step_window or _step_window(iso.part("step"))
    return iso, syncs


def _step_window(timed: Any) -> Optional[Window]:
    """The step timed here (device_alone.time_step) as a window of the device point's work
    (Experiment.step_window) where it is a total of whole steps: one or two (whose median
    is their mean), not the median of more."""
    if not isinstance(timed, StepTime) or timed.source == STEP_ALONE or not timed.ms_per_batch:
        return None
    n = timed.steps or 0
    return Window(n, n * timed.ms_per_batch / 1e3) if 1 <= n <= 2 else None


def with_ceiling(iso: Optional[Isolated], results: dict) -> Optional[Isolated]:
    """The isolated costs once the points are measured: the step's time taken from the
    device point (the ceiling, the step as the rounds ran it) where it was measured, and
    the workers that would feed it computed again from it."""
    dp = results.get("device")
    if iso is None or not iso.ok or dp is None or not dp.ok:
        return iso
    alone = iso.step.alone_ms_per_batch if iso.step is not None else None  # the step alone, kept beside it
    step = StepTime(ms_per_batch=round(dp.throughput.sec_per_batch * 1e3, 3), source=STEP_CEILING,
                    alone_ms_per_batch=alone)
    out = dataclasses.replace(iso, step=step)
    w = iso.workers
    threads = w.step_threads if w is not None and w.step_threads is not None else 0
    return dataclasses.replace(out, workers=workers_needed(out, iso.items_per_batch or iso.batch_size or 1, cores(),
                                                           step_threads=threads))
