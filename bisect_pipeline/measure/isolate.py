"""Stage costs measured in isolation, in this process, without workers.

The bisection measures what each stage costs *under the user's parallelism*; this
module measures what each stage costs *alone*, one sample or batch at a time in the
main process, so the advice can say how many workers would feed the step:

    worker work per batch = (load + augment) ms per sample * batch size + collate ms per batch
    workers needed        = ceil(worker work per batch / step ms per batch)

It also records what crosses the bus (bytes and dtypes of a batch), the achieved
host-to-device bandwidth, and, on CUDA, the host-device synchronizations of the step
and its peak memory. Every measurement is bounded by a small time budget.

Why one module: the stages timed alone in this process, in the slice before the points;
the parts share the workers' stand-in, the replayed transforms and one budget.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import math
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import default_collate

from ..core import faults, tree
from ..core.results import (BatchShape, Breakdown, Collate, InLoop, Isolated, LoadSplit, LoopStages, Memory, Part,
                            PerSample, SampleStructure, StepTime, SyncSite, Syncs, TensorInfo, Transfer, Workers)
from ..core.stats import mean_se, median
from ..pipeline import integrations, recording
from ..pipeline.loader import LoaderSpec, copy_or_same, index_order
from . import breakdown, devices, reads, reorder, sources
from .cache import by_index, index_batches

# The isolation measurements take at most this share of --max-seconds, and never more
# than ISOLATE_MAX_SECONDS: they refine the advice, the bisection is the measurement.
ISOLATE_SHARE = 0.05
ISOLATE_MAX_SECONDS = 2.0
# The isolated step: untimed warm-up steps, then at most this many timed ones.
STEP_WARMUP = 3
STEP_MAX_TIMED = 20
# Training steps run under torch.cuda.set_sync_debug_mode("warn") to count syncs.
SYNC_STEPS = 3
# The input work timed between steps (_in_loop): at least this many batches, each after
# a step, or none. It stands in the second witness for load and collate timed alone over
# hundreds of items: a standard error from fewer batches is too rough for that (its
# degrees of freedom set how far the costs alone can order two stages).
IN_LOOP_MIN_BATCHES = 8
# The collate is timed over the cached batches, and again over them while fewer than this
# many calls were timed (within its share): its first calls run colder than a worker's
# batch after batch (litdata's collate_fn on 4 samples: 27, 17, 13 us for its first
# three calls, 10 after), and the caches hold a few batches only.
COLLATE_CALLS = 64
# Where the load's timing built at least this many whole batches, the collate is the one
# timed right after each of them was built (_CollateInPlace), as a worker runs it.
COLLATE_IN_PLACE = 3
# At most this many tensors of a batch are described in the JSON.
_MAX_TENSORS = 16


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
                step_estimate_s: Optional[float] = None,
                step_source: str = "the device point (batches cached on the device)",
                loop_stages: Any = None) -> tuple[Isolated, Syncs]:
    """(isolated, syncs). Never raises for a failing measurement: a part that fails says
    so with its reason; KeyboardInterrupt propagates. `train_step` None: the step is the
    user's own loop (loop.py), timed only at the device point; no syncs are counted here.
    `end` (on `clock`): the run's hard end; the parts that run the training step (the
    step alone, the sync count) are skipped when `step_estimate_s` says they would pass it.
    `loop_stages`: stages the loop runs in its own process (integrations.webdataset.
    LoopStages), timed on the cached batches."""
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
        augment, load, collates = _augment_and_load(spec, caches, share, clock)
        parts = dict(augment=augment, load=load,
                     collate=_guard(Collate, lambda: _collate(spec, caches, share, clock, in_place=collates)))
    parts.update(batch=_guard(BatchShape, lambda: describe_batch(caches.batches[0])),
                 sample_structure=_guard(SampleStructure, lambda: sample_structure(caches.samples[0])),
                 transfer=_guard(Transfer, lambda: _transfer(spec, caches, device, move, share=share, clock=clock)))
    if loop_stages is not None:
        parts["loop"] = _guard(LoopStages, lambda: _loop(loop_stages, caches, share, clock))
    device_batch, syncs = None, None
    try:
        device_batch = sources.device_batches(sources.host_batches(caches, spec, device, 1), move, device)[0]
    except Exception as exc:
        syncs = Syncs.missing("failed", _reason(exc))
    if step_sec_per_batch is not None:
        parts["step"] = StepTime(ms_per_batch=round(step_sec_per_batch * 1e3, 3), source=step_source)
    elif device_batch is not None and train_step is not None and not fits(STEP_WARMUP + 1):
        parts["step"] = StepTime.missing("skipped", out_of_time(STEP_WARMUP + 1))
    elif device_batch is not None and train_step is not None:
        parts["step"] = _guard(StepTime, lambda: _step(train_step, device_batch, device, share, clock))
    else:
        parts["step"] = StepTime.missing("unavailable", "no batch on the device to step on")
    parts["in_loop"] = _in_loop_part(spec, caches, train_step, device_batch, device, parts=parts, fits=fits,
                                     clock=clock, step_s=step_estimate_s, share=min(share, budget_s - clock() + start))
    if device_batch is not None:
        if train_step is not None and (device.type != "cuda" or fits(SYNC_STEPS)):
            syncs = _guard(Syncs, lambda: count_syncs(train_step, device_batch, device))
        elif train_step is not None:
            syncs = Syncs.missing("skipped", out_of_time(SYNC_STEPS))
        if device.type == "cuda":
            parts["memory"] = _guard(Memory, lambda: _memory(device))
    items = caches.items_per_batch
    out = Isolated(budget_s=round(budget_s, 3), batch_size=caches.batch_size, items_per_batch=round(items, 4), **parts)
    workers = workers_needed(out, items, cores(), step_threads=torch.get_num_threads() if device.type == "cpu" else 0)
    return dataclasses.replace(out, workers=workers, elapsed_s=round(clock() - start, 4)), syncs


@contextlib.contextmanager
def worker_threads(spec: LoaderSpec) -> Iterator[None]:
    """The work of the workers (load, augment, collate) timed with the intra-op threads
    a worker has: DataLoader sets one in each worker process, while this process may run
    several; a tensor transform timed on 2 threads of a busy 2-core machine was measured
    2-60x slower than on one (Normalize of 3x224x224: 0.54 ms on one thread, 33 ms on two
    beside other work). Without workers it runs in this process, on its threads."""
    before = torch.get_num_threads()
    if spec.num_workers > 0:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _guard(kind: type, fn: Callable[[], Part]) -> Part:
    try:
        return fn()
    except (KeyboardInterrupt, faults.StepTimeout):  # the watchdog ends all of the isolation
        raise
    except Exception as exc:
        return kind.missing("failed", _reason(exc))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


@dataclasses.dataclass(frozen=True)
class Timed:
    """What _timed_loop measured: the items timed, their wall time in all and each one's,
    and the CPU time of this process over them."""

    n: int
    seconds: float
    each: tuple = ()
    cpu_seconds: float = 0.0

    @property
    def ms(self) -> float:
        return self.seconds / self.n * 1e3

    @property
    def se_ms(self) -> Optional[float]:
        """The standard error of the mean item (ms): their spread over sqrt(n); None
        below two items."""
        return se_ms(self.each)

    @property
    def cpu_ms(self) -> float:
        return self.cpu_seconds / self.n * 1e3


def se_ms(seconds: Any) -> Optional[float]:
    """The standard error of the mean of per-item `seconds`, in ms (None below two)."""
    return round(mean_se(seconds) * 1e3, 5) if len(seconds) >= 2 else None


def _timed_loop(items: list, fn: Callable[[Any], Any], share: float, clock,
                started: Optional[Callable[[], None]] = None) -> Timed:
    """Run fn over items until `share` seconds pass (at least one call). The first call
    is a warm-up when there are more: it is not timed. `started` is called as the timing
    starts (after the warm-up). Each call is timed, and the process's CPU time over all.
    A call that raises StopIteration (an iterator that ended before the items) ends it."""
    if len(items) > 1:
        fn(items[0])
        items = items[1:]
    if started is not None:
        started()
    cpu0 = devices.cpu_seconds()
    t0 = last = clock()
    each = []
    for item in items:
        try:
            fn(item)
        except StopIteration:
            if not each:
                raise RuntimeError("the iterator ended before one item could be timed") from None
            break
        now = clock()  # one read an item: its end is the next one's start
        each.append(now - last)
        last = now
        if now - t0 >= share:
            break
    return Timed(len(each), last - t0, tuple(each), max(0.0, devices.cpu_seconds() - cpu0))


def _repeated(items: list, fn: Callable[[Any], Any], share: float, clock, at_least: int) -> Timed:
    """_timed_loop over the items, then again over them while fewer than `at_least` calls
    were timed and the share is not spent: the timings of every pass together. A pass
    that fails (a function that changes its input in place cannot run twice on it) ends
    it with the calls timed before."""
    timed = _timed_loop(items, fn, share, clock)
    while timed.n < at_least and timed.seconds < share and len(items) > 1:
        try:
            more = _timed_loop(items, fn, share - timed.seconds, clock)
        except (KeyboardInterrupt, faults.StepTimeout):
            raise
        except Exception:
            break
        timed = Timed(timed.n + more.n, timed.seconds + more.seconds, timed.each + more.each,
                      timed.cpu_seconds + more.cpu_seconds)
    return timed


def _augment_and_load(spec, caches, share, clock) -> tuple[PerSample, PerSample, Optional["_CollateInPlace"]]:
    """(augment, load, the collates timed in place): augment replayed alone, then load on
    the dataset's own calls, where augment and collate are timed again in place when they
    can be (_load)."""
    augment, in_place = _guard(PerSample, lambda: _augment(caches, share, clock)), {}
    load = _guard(PerSample, lambda: _load(spec, caches, augment, share, clock, in_place=in_place))
    return in_place.get("augment", augment), load, in_place.get("collate")


class _CollateInPlace:
    """Each batch collated right after its samples were built, as a worker does: the
    samples _load builds, grouped as the loader groups them (`sizes`, a batch sampler's
    batches as they were taken, else the batch size), and collate_fn called on each group
    as it fills (with torch's default_collate too, where collate_fn is another: the two
    in turn, as the one run second finds its samples warmer). Their time is taken out of
    the load's (`exclude`). A collate over batches built before runs warmer than this:
    MosaicML's 1000 MNIST samples, 0.8-1.0 ms a batch in a loop over cached batches,
    1.4-1.8 right after each batch was built."""

    def __init__(self, spec: LoaderSpec, sizes: list, clock) -> None:
        self.fn, self.clock, self.sizes, self.batch_size = spec.collate_fn, clock, sizes, spec.batch_size
        self.also_default = spec.collate_fn is not default_collate
        self.samples: list = []
        self.own: list = []  # seconds per batch: collate_fn's
        self.default: list = []  # default_collate's
        self.excluded: list = []  # per sample added, the seconds collating after it
        self.own_cpu, self.cpu_excluded = 0.0, 0.0
        self.failed: Optional[str] = None
        self.default_failed: Optional[str] = None

    def add(self, sample: Any) -> None:
        took = 0.0
        if self.failed is None:
            self.samples.append(sample)
            k = len(self.own)
            if len(self.samples) >= (self.sizes[k] if k < len(self.sizes) else self.batch_size):
                took = self._collate()
        self.excluded.append(took)

    def _collate(self) -> float:
        group, self.samples = self.samples, []
        fns = [(self.fn, self.own)] + ([(default_collate, self.default)]
                                       if self.also_default and self.default_failed is None else [])
        if len(self.own) % 2:
            fns.reverse()
        start, cpu = self.clock(), time.process_time()
        for fn, into in fns:
            t, c = self.clock(), time.process_time()
            try:
                fn(group)
            except (KeyboardInterrupt, faults.StepTimeout):
                raise
            except Exception as exc:  # the warm timing stands in (_collate)
                if fn is self.fn:
                    self.failed = _reason(exc)
                else:
                    self.default_failed = _reason(exc)
                continue
            into.append(self.clock() - t)
            if fn is self.fn:
                self.own_cpu += time.process_time() - c
        self.cpu_excluded += time.process_time() - cpu
        return self.clock() - start

    def exclude(self, timed: Timed) -> Timed:
        """The load's timing without the collates run between its items."""
        out = self.excluded[-timed.n:]  # (the warm-up's first)
        return Timed(timed.n, timed.seconds - sum(out), tuple(e - x for e, x in zip(timed.each, out)),
                     max(0.0, timed.cpu_seconds - self.cpu_excluded))


def _sized(batches: Iterator, sizes: list) -> Iterator:
    """A batch sampler's batches, their sizes noted in `sizes` as they are taken."""
    for b in batches:
        sizes.append(len(b))
        yield b


def _load(spec, caches, augment: PerSample, share, clock, *, in_place: Optional[dict] = None) -> PerSample:
    """Building a sample through the dataset (loading + its transforms), minus the
    transforms: what loading costs; split into reading files and the rest on the same
    calls (reads.py). Where the transforms were split (caches.recorder), they are timed
    where the dataset calls them, sample by sample (recording.Recorder.timing): load is
    each __getitem__ less its own transforms, and `in_place["augment"]` the augment stage
    as the dataset runs it (its figure replayed alone kept as `alone_ms_per_sample`): on
    MosaicML's MNIST, ToTensor right after the sample's decoding took 49 us, replayed
    alone on the cached images 56-60, so that load read 0.75-0.8 of a hand's. The samples
    built are collated in the loader's groups as they fill (`in_place["collate"]`,
    _CollateInPlace), their time taken out of the load's.

    A streaming dataset (cache.by_index) reads its samples in chunks or shards of many
    samples, and a worker pays a chunk's opening once for all of them: it is timed over
    as many of its samples as the share allows (one epoch of this process's partition at
    most), not only as many as the caches hold, which a first chunk holds whole (litdata's
    example: 3 us a sample inside one chunk, 7 over an epoch). Through its iterator, as
    the workers read it, where it can be iterated here (integrations.streaming.
    iterates_here), else by index in its order."""
    # a pipeline cut into its stages loads in the stages up to `raw` (integrations.webdataset)
    stages = _stages(caches)
    recorder = getattr(caches, "recorder", None) if stages is None and augment.ok else None
    dataset = (stages.loading() if stages is not None else caches.dataset if recorder is not None
               else copy_or_same(spec.dataset))
    streaming, sizes = by_index(spec), []
    transforms: list = []  # per item built, the seconds of its transforms where they are timed in place
    collating = (_CollateInPlace(spec, sizes, clock)
                 if in_place is not None and stages is None and isinstance(spec, LoaderSpec) and spec.auto_collation
                 else None)

    def built(fetch: Callable[[], Any]) -> Any:
        before = recorder.seconds if recorder is not None else 0.0
        out = fetch()
        transforms.append(recorder.seconds - before if recorder is not None else 0.0)
        if collating is not None:
            collating.add(out)
        return out
    timing = recorder.timing(clock) if recorder is not None else contextlib.nullcontext()
    with reads.Reads(clock) as seen, timing:
        if spec.iterable and (not streaming or integrations.streaming.iterates_here(spec.dataset)):
            it = iter(dataset)
            n_items = (len(dataset) - 1 if streaming else len(stages.items("raw")) if stages is not None
                       else len(caches.samples))
            timed = _timed_loop(list(range(n_items + 1)), lambda _: built(it.__next__), share, clock, started=seen.reset)
        else:
            order = iter(range(len(dataset))) if streaming else index_order(spec)  # a streaming dataset: by index
            if spec.batch_sampler is not None and not streaming:
                order = itertools.chain.from_iterable(_sized(order, sizes))
            n_items = len(dataset) - 1 if streaming else len(caches.samples)
            indices = list(itertools.islice(order, max(2, n_items + 1)))
            timed = _timed_loop(indices, lambda i: built(lambda: dataset[i]), share, clock, started=seen.reset)
    if collating is not None:
        timed = collating.exclude(timed)
        in_place["collate"] = collating
    load = _load_figure(spec, caches, augment, timed, transforms=transforms[-timed.n:] if any(transforms) else None,
                        in_place=in_place)
    return dataclasses.replace(load, split=_guard(LoadSplit, lambda: reads.split(seen, timed.n, load)))


def _load_figure(spec, caches, augment: PerSample, timed: Timed, *, transforms: Optional[list],
                 in_place: Optional[dict]) -> PerSample:
    """The load part from the __getitem__ calls `timed`, less the transforms: those timed in
    place on the same calls (`transforms`, seconds per item; the augment part as timed so
    put in `in_place`), else `augment` replayed alone."""
    n, stages = timed.n, _stages(caches)
    getitem = round(timed.ms, 4)
    measured = dict(samples=n, se_ms_per_sample=timed.se_ms, cpu_ms_per_sample=round(timed.cpu_ms, 4))
    if stages is not None:
        return PerSample(ms_per_sample=getitem, getitem_ms_per_sample=getitem, includes=("load",),
                         note=f"the pipeline's stages up to {stages.loaded_by}", **measured)
    if getattr(caches, "whole_batches", False):  # a node graph that batches its keys (graph.GraphCaches)
        return PerSample(ms_per_sample=getitem, getitem_ms_per_sample=getitem, includes=("load", "augment", "collate"),
                         note=WHOLE_BATCHES, **measured)
    if spec.iterable and not augment.ok:
        return PerSample(ms_per_sample=getitem, includes=("load", "augment"),
                         note="IterableDataset: loading and transforms run together", **measured)
    if not augment.ok:
        return PerSample(ms_per_sample=getitem, getitem_ms_per_sample=getitem, includes=("load", "augment"),
                         note="the transforms could not be split from loading: both are included", **measured)
    cpu_share = (augment.cpu_ms_per_sample / augment.ms_per_sample  # the transforms' CPU per wall second
                 if augment.cpu_ms_per_sample is not None and augment.ms_per_sample else None)
    if transforms is not None and len(transforms) == n:
        # each __getitem__ less its own transforms: the paired differences' error
        aug_ms = sum(transforms) / n * 1e3
        aug_cpu = None if cpu_share is None else round(min(aug_ms, aug_ms * cpu_share), 4)
        if in_place is not None:
            in_place["augment"] = dataclasses.replace(
                augment, ms_per_sample=round(aug_ms, 4), samples=n, se_ms_per_sample=se_ms(transforms),
                cpu_ms_per_sample=aug_cpu, alone_ms_per_sample=augment.ms_per_sample)
        return PerSample(ms_per_sample=round(max(0.0, timed.ms - aug_ms), 4), samples=n,
                         getitem_ms_per_sample=getitem, includes=("load",),
                         se_ms_per_sample=se_ms([g - a for g, a in zip(timed.each, transforms)]),
                         cpu_ms_per_sample=None if aug_cpu is None else round(max(0.0, timed.cpu_ms - aug_cpu), 4))
    # __getitem__ less the transforms replayed alone: both errors, and both CPU times
    both = (None if timed.se_ms is None or augment.se_ms_per_sample is None
            else round(math.hypot(timed.se_ms, augment.se_ms_per_sample), 5))
    cpu = (None if augment.cpu_ms_per_sample is None
           else round(max(0.0, timed.cpu_ms - augment.cpu_ms_per_sample), 4))
    return PerSample(ms_per_sample=round(max(0.0, timed.ms - augment.ms_per_sample), 4), samples=n,
                     getitem_ms_per_sample=getitem, includes=("load",), se_ms_per_sample=both, cpu_ms_per_sample=cpu)


WHOLE_BATCHES = ("the graph batches its keys before the Mapper that reads them: each item is a whole batch, read, "
                 "transformed and collated by that Mapper, so load includes augment and collate")


def _augment(caches, share, clock) -> PerSample:
    """The stage replayed whole and transform by transform on the same samples, in turn
    (breakdown.measure_with_whole); the first sample, untimed, is the warm-up of both."""
    stages = _stages(caches)
    if stages is not None and stages.has_raw:  # the stages between the cuts, on the cached raw items
        items, fn = stages.augmenting()
        timed = _timed_loop(items, fn, share, clock)
        return PerSample(ms_per_sample=round(timed.ms, 4), samples=timed.n, se_ms_per_sample=timed.se_ms,
                         cpu_ms_per_sample=round(timed.cpu_ms, 4))
    if caches.raw_calls is None:
        return PerSample.missing("unavailable", caches.raw_reason or "the transforms could not be split from loading")
    pairs = list(zip(caches.samples, caches.raw_calls))
    start = clock()
    if len(pairs) > 1:
        recording.replay_sample(*pairs[0])
        pairs = pairs[1:]
    # A reorder the transforms' classes allow (reorder.py) takes half of the share.
    movable = reorder.possible(caches.raw_calls)
    try:
        whole, parts = breakdown.measure_with_whole([calls for _, calls in pairs], share / 2 if movable else share,
                                                    clock, lambda i: recording.prepared_sample(*pairs[i]))
    except (KeyboardInterrupt, faults.StepTimeout):
        raise
    except Exception as exc:  # a transform that fails alone: the stage is still timed whole
        timed = _timed_loop(pairs, lambda p: recording.replay_sample(*p), share / 2, clock)
        whole = PerSample(ms_per_sample=round(timed.ms, 4), samples=timed.n, se_ms_per_sample=timed.se_ms,
                          cpu_ms_per_sample=round(timed.cpu_ms, 4))
        parts = Breakdown.missing("failed", _reason(exc))
    if movable and parts.ok and clock() - start < share:  # else none is timed: the share is spent
        parts = dataclasses.replace(parts, reorders=_reorders(caches.raw_calls, share - (clock() - start), clock))
    return dataclasses.replace(whole, breakdown=parts)


def _reorders(calls_per_sample: list, share: float, clock) -> Optional[tuple]:
    """The reorders timed (reorder.measure) within what is left of the share; None when
    they failed (a transform that raised on a cached input): the breakdown stands."""
    try:
        return reorder.measure(calls_per_sample, max(0.0, share), clock)
    except (KeyboardInterrupt, faults.StepTimeout):
        raise
    except Exception:
        return None


def _loop(stages: Any, caches: Any, share: float, clock) -> LoopStages:
    """The loop's own stages, making batches out of the cached ones (LoopStages.timing)."""
    items, fn = stages.timing(caches.batches)
    timed = _timed_loop(items, fn, share, clock)
    return LoopStages(label=stages.label, ms_per_batch=round(timed.ms, 4), batches=timed.n,
                      se_ms_per_batch=timed.se_ms, cpu_ms_per_batch=round(timed.cpu_ms, 4))


def _stages(caches: Any) -> Any:
    """A pipeline cut into its stages (integrations.webdataset.Cuts), or None."""
    return getattr(caches, "stages", None)


def _groups(spec, caches) -> list:
    """The cached samples as collate_fn got them: the user's sampler's groups."""
    if not spec.auto_collation:
        return list(caches.samples)
    return [[caches.samples[i] for i in g] for g in caches.groups]


def _collate(spec, caches, share, clock, *, in_place: Optional[_CollateInPlace] = None) -> Collate:
    """collate_fn right after each batch's samples were built (_CollateInPlace) where at
    least COLLATE_IN_PLACE batches were, else over the cached batches, warm (_repeated)."""
    name = getattr(spec.collate_fn, "__qualname__", type(spec.collate_fn).__name__)
    if in_place is not None and len(in_place.own) >= COLLATE_IN_PLACE:
        own, n = in_place.own, len(in_place.own)
        dflt = in_place.default if len(in_place.default) >= COLLATE_IN_PLACE else None
        return Collate(ms_per_batch=round(sum(own) / n * 1e3, 4), batches=n, collate_fn=name,
                       mixes=batch_mixers(spec.collate_fn) or None, se_ms_per_batch=se_ms(own),
                       cpu_ms_per_batch=round(in_place.own_cpu / n * 1e3, 4), in_place=True,
                       default_collate_ms_per_batch=None if dflt is None else round(sum(dflt) / len(dflt) * 1e3, 4),
                       default_collate_reason=in_place.default_failed if dflt is None else None)
    groups, fn, stages = _groups(spec, caches), spec.collate_fn, _stages(caches)
    if stages is not None:  # the pipeline's own batching, then the loader's collate_fn
        groups, fn = stages.collating(spec.collate_fn, spec.batch_size if spec.auto_collation else None)
    timed = _repeated(groups, fn, share / 2, clock, COLLATE_CALLS)
    n = timed.n
    info = Collate(ms_per_batch=round(timed.ms, 4), batches=n, collate_fn=name,
                   mixes=batch_mixers(spec.collate_fn) or None, se_ms_per_batch=timed.se_ms,
                   cpu_ms_per_batch=round(timed.cpu_ms, 4))
    if spec.collate_fn is not default_collate and spec.auto_collation and stages is None:
        # The same samples through torch's default_collate: tells the function's own work
        # apart from what the batch structure costs.
        try:
            again = _repeated(groups[:n + 1], default_collate, share / 2, clock, n)  # the batches timed above
            info = dataclasses.replace(info, default_collate_ms_per_batch=round(again.ms, 4))
        except Exception as exc:
            info = dataclasses.replace(info, default_collate_reason=_reason(exc))
    return info


# Transforms that mix the samples of a batch, by class name: torchvision v2's, timm's
# collate-time one (timm.data.FastCollateMixup) and its loop-time one.
BATCH_MIXERS = ("MixUp", "CutMix", "FastCollateMixup", "Mixup")


def batch_mixers(fn: Any) -> tuple:
    """The batch-mixing transforms a collate_fn holds: itself, its attributes, a lambda's
    or closure's cells, a partial's arguments, and the children of a container among
    those (the torchvision reference's RandomChoice([MixUp, CutMix])), one level each."""
    seen: list = []
    near = [fn, *getattr(fn, "__dict__", {}).values(), *getattr(fn, "args", ()), *getattr(fn, "keywords", {}).values()]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            near.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    for obj in near:
        for o in [obj, *(getattr(obj, "transforms", None) or ())] if isinstance(getattr(obj, "transforms", None),
                                                                                 (list, tuple)) else [obj]:
            name = type(o).__name__
            if name in BATCH_MIXERS and name not in seen:
                seen.append(name)
    return tuple(seen)


def _transfer(spec, caches, device, move, *, share, clock) -> Transfer:
    host = sources.host_batches(caches, spec, device)
    nbytes = tree.nbytes(host[0])
    if device.type == "cpu":
        return Transfer(status="skipped", reason="no accelerator: host and device coincide", bytes_per_batch=nbytes)
    sync = devices.synchronizer(device)

    def one(batch):
        move(batch)
        sync()
    timed = _timed_loop(host, one, share, clock)
    n, per = timed.n, timed.seconds / timed.n
    return Transfer(ms_per_batch=round(per * 1e3, 4), bytes_per_batch=nbytes,
                    gb_per_s=round(nbytes / per / 1e9, 3) if per > 0 else None, pinned=bool(spec.pin_memory),
                    batches=n)


def in_loop_applies(spec: LoaderSpec, train_step: Optional[Callable[[Any], Any]]) -> bool:
    """Whether the input work is timed between steps (_in_loop): the tool's own step, a
    map-style dataset, and num_workers=0, where the loop's own process does that work
    between its steps."""
    return train_step is not None and spec.num_workers == 0 and not spec.iterable


def _in_loop_part(spec, caches, train_step, batch, device, *, parts: dict, step_s: Optional[float], share: float,
                  clock, fits: Callable[[int], bool]) -> Optional[InLoop]:
    """_in_loop where it applies (in_loop_applies, a device batch to step on; else None),
    in `share`: what the parts before it left of the budget, a part's share at most (on
    the CPU the transfer's, with nothing to time, and the step's where it was timed for
    the allocator); or skipped where IN_LOOP_MIN_BATCHES + 1 of its batches would not fit in
    that by the step's time (the step part's, else `step_s`) and the work of a batch timed
    alone: steps this long hold a batch's input work that is small enough to be missed
    alone as a small part of them (the loop's conditions do not decide), and a batch of
    seconds of work would overrun the share."""
    if not in_loop_applies(spec, train_step) or batch is None:
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
    return _guard(InLoop, lambda: _in_loop(spec, caches, train_step, batch, device, share=share, clock=clock,
                                           fits=fits))


def _in_loop(spec, caches, train_step, batch, device, *, share: float, clock, fits: Callable[[int], bool]) -> InLoop:
    """The loop's own input work at num_workers=0, in the loop's conditions: a training
    step on a device batch, untimed, then the batch sampler's next batch and its items
    fetched as the DataLoader's fetcher does (`__getitems__` where the dataset has it),
    timed, then collate_fn on them, timed; batch after batch, beyond the batches the
    caches hold (data the fill has not just touched, as most of the full point's). The
    stages timed one item after another (_load, _collate) run in a tight loop over items
    the fill has just built, with nothing between them: they miss what the loop's own
    conditions add per batch (the caches the step evicts, the threads it leaves spinning,
    the allocator's state after it, the batch sampler's own work), which decides on a step
    of a few ms (a 3-ms step over variable-length token sequences: the items' tensors
    built in 0.59 ms a batch in a tight loop, 0.90 after each step)."""
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


def _step(train_step, batch, device, share, clock) -> StepTime:
    """The step alone on one device batch, after STEP_WARMUP untimed steps: a fresh
    step's first calls are several times slower (lazy initialisation, the optimizer's
    first update), which would overstate the step and understate the workers needed."""
    sync = devices.synchronizer(device)

    def one(b):
        train_step(b)
        sync()
    for _ in range(STEP_WARMUP):
        one(batch)
    # The median step: on a shared machine a few steps wait for a core, and the step's
    # own time is what the workers must keep up with.
    times: list = []
    t0 = clock()
    while len(times) < STEP_MAX_TIMED:
        t = clock()
        one(batch)
        times.append(clock() - t)
        if clock() - t0 >= share:
            break
    return StepTime(ms_per_batch=round(median(times) * 1e3, 3), steps=len(times),
                    source="median of steps timed in isolation")


# Frames a sync is not attributed to: torch's own (the call that synchronizes is inside
# torch; its caller is the site) and the warnings machinery. A sync whose innermost
# other frame is this package's (a window edge, a batch moved for the step) is the
# tool's, not the step's: not counted. The planted workloads are user code.
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_WORKLOADS = (os.path.join(_OWN_DIR, "testing.py"), os.path.join(_OWN_DIR, "demo.py"))


def sync_site(frame: Any) -> Optional[str]:
    """Where a host-device sync was asked for, from the Python frame it was reported in:
    "file:line" of the innermost frame outside torch and the warnings module; None when
    that frame is this package's (the tool's own sync) or there is none."""
    f = frame
    while f is not None and (f.f_code.co_filename.startswith(_TORCH_DIR)
                             or f.f_globals.get("__name__") in ("warnings", "_py_warnings")):
        f = f.f_back
    if f is None:
        return None
    name = os.path.abspath(f.f_code.co_filename)
    if name.startswith(_OWN_DIR) and name not in _WORKLOADS:
        return None
    return f"{f.f_code.co_filename}:{f.f_lineno}"


class SyncRecorder:
    """Records the host-device syncs torch reports as warnings (their message says
    "synchronizing") while it is open, with the site each was asked for at (sync_site):
    only those of the thread that opened it (the loop's; a sync in another thread does
    not stall the step) and not the tool's own. Other warnings are swallowed, as the
    "always" filter would repeat them every step."""

    def __init__(self) -> None:
        self.sites: list = []
        self._catch = warnings.catch_warnings()
        self._thread = None

    def __enter__(self) -> "SyncRecorder":
        self._thread = threading.get_ident()
        self._catch.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._show
        return self

    def __exit__(self, *exc: Any) -> None:
        self._catch.__exit__(*exc)

    def _show(self, message: Any, *_: Any) -> None:  # warnings.showwarning's arguments
        if "synchroniz" not in str(message).lower() or threading.get_ident() != self._thread:
            return
        site = sync_site(sys._getframe(1))
        if site is not None:
            self.sites.append(site)

    def syncs(self, steps: int) -> Syncs:
        top = collections.Counter(self.sites).most_common(5)  # ties in the order first seen, as before
        return Syncs(steps=steps, total=len(self.sites), per_step=round(len(self.sites) / max(steps, 1), 2),
                     sites=tuple(SyncSite(k, c) for k, c in top))


class SyncCounter:
    """Counts host-device synchronizations while it is open, with
    torch.cuda.set_sync_debug_mode("warn") (the mode is restored on exit) and a
    SyncRecorder; `syncs(steps)` is the count per step over the `steps` that ran inside.
    Around the tool's own step (count_syncs) or a span of the user's loop
    (phases.SyncCount)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._recorder = SyncRecorder()
        self._previous = 0

    def __enter__(self) -> "SyncCounter":
        torch.cuda.synchronize(self.device)
        self._previous = torch.cuda.get_sync_debug_mode()
        self._recorder.__enter__()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            torch.cuda.set_sync_debug_mode(self._previous)
        finally:
            self._recorder.__exit__(*exc)
        torch.cuda.synchronize(self.device)

    def syncs(self, steps: int) -> Syncs:
        return self._recorder.syncs(steps)


def no_syncs_counted(device: torch.device) -> Optional[Syncs]:
    """Why syncs are not counted on this device (None on CUDA, where they are)."""
    if device.type == "cuda":
        return None
    return Syncs.missing("skipped", f"no CUDA device (running on {device.type}): host-device syncs are counted on "
                                    "CUDA only")


def count_syncs(train_step: Callable[[Any], Any], batch: Any, device: torch.device, steps: int = SYNC_STEPS) -> Syncs:
    """Host-device synchronizations per training step, over `steps` steps on one device
    batch (SyncCounter)."""
    skipped = no_syncs_counted(device)
    if skipped is not None:
        return skipped
    with SyncCounter(device) as counter:
        for _ in range(steps):
            train_step(batch)
    return counter.syncs(steps)


def _memory(device: torch.device) -> Memory:
    total = torch.cuda.get_device_properties(device).total_memory
    peak = torch.cuda.max_memory_allocated(device)
    return Memory(peak_bytes=int(peak), total_bytes=int(total), fraction=round(peak / total, 4) if total else None,
                  note="peak since the process started (includes the tool's cached batches): an upper bound")


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
        return Workers.missing("unavailable", "the step, load or collate cost was not measured")
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


# --------------------------------------------------------------------------------------
# What a batch and a sample are made of (for the payload and collate advice)
# --------------------------------------------------------------------------------------


def is_image(shape: list, dtype: str) -> bool:
    """A batch of images: rank 4, channels (1, 3 or 4) first or last, and 2-D extent."""
    if len(shape) != 4:
        return False
    c_first = shape[1] in (1, 3, 4) and min(shape[2], shape[3]) >= 8
    c_last = shape[3] in (1, 3, 4) and min(shape[1], shape[2]) >= 8
    return c_first or c_last


def describe_batch(batch: Any) -> BatchShape:
    tensors = []
    for path, t in tree.tensors(batch):
        shape = tuple(t.shape)
        dtype = str(t.dtype).replace("torch.", "")
        tensors.append(TensorInfo(path="batch" + "".join(f"[{k!r}]" for k in path), dtype=dtype, shape=shape,
                                  bytes=t.element_size() * t.nelement(),
                                  image=t.is_floating_point() and is_image(list(shape), dtype)))
    return BatchShape(bytes=int(tree.nbytes(batch)), n_tensors=len(tensors), tensors=tuple(tensors[:_MAX_TENSORS]))


def sample_structure(sample: Any) -> SampleStructure:
    """Counts of the nodes of one sample by kind: what default_collate turns into tensors."""
    counts = {"tensors": 0, "ndarrays": 0, "numbers": 0, "strings": 0, "images": 0, "other": 0, "containers": 0,
              "longest_list": 0}
    for _, node in tree.nodes(sample):
        counts[_kind(node)] += 1
        if isinstance(node, list):
            counts["longest_list"] = max(counts["longest_list"], len(node))
    counts["leaves"] = sum(counts[k] for k in ("tensors", "ndarrays", "numbers", "strings", "images", "other"))
    return SampleStructure(**counts)


def _kind(obj: Any) -> str:
    module = type(obj).__module__ or ""
    if isinstance(obj, torch.Tensor):
        return "tensors"
    if module.startswith("numpy") and hasattr(obj, "shape") and getattr(obj, "ndim", 0) > 0:
        return "ndarrays"
    if isinstance(obj, (bool, int, float, complex)) or module.startswith("numpy"):
        return "numbers"
    if isinstance(obj, (str, bytes)):
        return "strings"
    if module.startswith("PIL"):
        return "images"
    return "containers" if tree.is_container(obj) else "other"


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
            return time_stages(exp.spec, exp.caches, exp.device, exp.move, exp.step, step_sec_per_batch=exp.step_alone,
                               budget_s=min(budget(max_seconds), left), clock=beating_clock, end=exp.end,
                               step_estimate_s=exp.step_estimate(), step_source=STEP_ALONE,
                               loop_stages=exp.loop_stages)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # never costs the run its verdict
        return Isolated.missing("failed", _reason(exc)), no_cuda or Syncs.missing("failed", _reason(exc))


STEP_ALONE = "the step timed alone while the allocator was held"
STEP_CEILING = "the device point (batches cached on the device)"


def with_ceiling(iso: Optional[Isolated], results: dict) -> Optional[Isolated]:
    """The isolated costs once the points are measured: the step's time taken from the
    device point (the ceiling, the step as the rounds ran it) where it was measured, and
    the workers that would feed it computed again from it."""
    dp = results.get("device")
    if iso is None or not iso.ok or dp is None or not dp.ok:
        return iso
    step = StepTime(ms_per_batch=round(dp.throughput.sec_per_batch * 1e3, 3), source=STEP_CEILING)
    out = dataclasses.replace(iso, step=step)
    w = iso.workers
    threads = w.step_threads if w is not None and w.step_threads is not None else 0
    return dataclasses.replace(out, workers=workers_needed(out, iso.items_per_batch or iso.batch_size or 1, cores(),
                                                           step_threads=threads))
