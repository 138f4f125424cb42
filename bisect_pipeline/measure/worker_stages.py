"""The stages the workers run timed alone, as a worker runs them: load on the dataset's
own calls (reads.py splits it), augment where the dataset calls it and replayed alone
(breakdown.py, reorder.py), each batch collated as its samples are built. Separate from
the step's side (device_alone) and the loop's (isolate._in_loop): these build samples."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import default_collate

from ..core import faults, tree
from ..core.results import Breakdown, Collate, LoadSplit, PerSample, SampleStructure
from ..pipeline import integrations, recording
from ..pipeline.loader import LoaderSpec, copy_or_same, index_order
from . import breakdown, iterator_alone, reads, reorder
from .cache import by_index
from .timed import Timed, attempt, guard, reason_of, repeated, se_ms, timed_loop

# The collate is timed over the cached batches, and again over them while fewer than this
# many calls were timed (within its share): its first calls run colder than a worker's
# batch after batch (docs/benchmarks.md), and the caches hold a few batches only.
COLLATE_CALLS = 64
# Where the load's timing built at least this many whole batches, the collate is the one
# timed right after each of them was built (CollateInPlace), as a worker runs it.
COLLATE_IN_PLACE = 3


def time_augment_and_load(spec, caches, share, clock) -> tuple[PerSample, PerSample, Optional[CollateInPlace]]:
    """(augment, load, the collates timed in place): augment replayed alone, then load,
    which times augment and collate again where the dataset builds its samples."""
    augment, in_place = guard(PerSample, lambda: time_augment(caches, share, clock)), {}
    load = guard(PerSample, lambda: time_load(spec, caches, augment, share, clock, in_place=in_place))
    return in_place.get("augment", augment), load, in_place.get("collate")


def _sized(batches: Iterator, sizes: list) -> Iterator:
    """A batch sampler's batches, their sizes noted in `sizes` as they are taken."""
    for b in batches:
        sizes.append(len(b))
        yield b


def time_load(spec, caches, augment: PerSample, share, clock, *, in_place: Optional[dict] = None) -> PerSample:
    """Building a sample through the dataset (loading + its transforms), minus the
    transforms: what loading costs; split into reading files and the rest on the same
    calls (reads.py). Where the transforms were split (caches.recorder), they are timed
    where the dataset calls them, sample by sample (recording.Recorder.timing): load is
    each __getitem__ less its own transforms, and `in_place["augment"]` the augment stage
    as the dataset runs it (its figure replayed alone kept as `alone_ms_per_sample`: a
    replay runs warmer or colder than the dataset's own call). The samples built are
    collated in the loader's groups as they fill (`in_place["collate"]`, CollateInPlace),
    their time taken out of the load's.

    A streaming dataset (cache.by_index) reads its samples in chunks of many, a chunk's
    opening paid once for all: it is timed over as many samples as the share allows (one
    epoch of this process's partition at most). Through its iterator where it can be
    iterated here (integrations.streaming.iterates_here), else by index and, with the
    loader's workers, through its iterator in a worker (_through_iterator), half each."""
    # a pipeline cut into its stages loads in the stages up to `raw` (integrations.webdataset)
    stages = getattr(caches, "stages", None)
    recorder = getattr(caches, "recorder", None) if stages is None and augment.ok else None
    dataset = (stages.loading() if stages is not None else caches.dataset if recorder is not None
               else copy_or_same(spec.dataset))
    streaming, sizes = by_index(spec), []
    iterated = streaming and not integrations.streaming.iterates_here(spec.dataset) and spec.num_workers > 0
    transforms: list = []  # per item built, the seconds of its transforms where they are timed in place
    collating = (CollateInPlace(spec, sizes, clock)
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
            timed = timed_loop(list(range(n_items + 1)), lambda _: built(it.__next__), share, clock, started=seen.reset)
        else:
            order = iter(range(len(dataset))) if streaming else index_order(spec)  # a streaming dataset: by index
            if spec.batch_sampler is not None and not streaming:
                order = itertools.chain.from_iterable(_sized(order, sizes))
            n_items = len(dataset) - 1 if streaming else len(caches.samples)
            indices = list(itertools.islice(order, max(2, n_items + 1)))
            timed = timed_loop(indices, lambda i: built(lambda: dataset[i]), share / 2 if iterated else share, clock,
                               started=seen.reset)
    if collating is not None:
        timed = collating.exclude(timed)
        in_place["collate"] = collating
    load = _load_figure(spec, caches, augment, timed, transforms=transforms[-timed.n:] if any(transforms) else None,
                        in_place=in_place)
    if iterated:  # partitioned among the user's workers: also timed as they get it
        load = _through_iterator(spec, caches, augment, load, dataset=dataset, share=share / 2, in_place=in_place)
    return dataclasses.replace(load, split=guard(LoadSplit, lambda: reads.split(seen, timed.n, load)))


def _through_iterator(spec, caches, augment: PerSample, by_index: PerSample, *, dataset, share: float,
                      in_place: Optional[dict]) -> PerSample:
    """A streaming dataset's load as its loader gets the samples: through its iterator,
    in a worker of its own (iterator_alone.in_a_worker), less the transforms as timed
    without it (by index, where the dataset calls them: as the raw point replays them, so
    that what the iterator adds is load's, as in the rounds); the figure by index kept
    beside it (`index_ms_per_sample`). By index alone, with the reason, where the worker
    timed none or failed."""
    got = attempt(lambda: iterator_alone.in_a_worker(spec, dataset, share), lambda exc: exc)
    if got is None or isinstance(got, Exception):
        why = "it gave no sample in its share" if got is None else reason_of(got)
        return dataclasses.replace(by_index, note=f"{BY_INDEX}; through its iterator in a worker: {why}")
    load = _load_figure(spec, caches, (in_place or {}).get("augment", augment), got, transforms=None, in_place=None)
    note = "; ".join(x for x in (load.note, THROUGH_ITERATOR) if x)
    return dataclasses.replace(load, index_ms_per_sample=by_index.ms_per_sample, note=note)


BY_INDEX = "timed by index in this process (get_item and the transforms)"
THROUGH_ITERATOR = ("timed through its iterator in a worker of its own, as the loader gets its samples; "
                    "index_ms_per_sample: by index in this process (get_item)")


def _load_figure(spec, caches, augment: PerSample, timed: Timed, *, transforms: Optional[list],
                 in_place: Optional[dict]) -> PerSample:
    """The load part from the __getitem__ calls `timed`, less the transforms: those timed in
    place on the same calls (`transforms`, seconds per item; the augment part as timed so
    put in `in_place`), else `augment` replayed alone."""
    n, stages = timed.n, getattr(caches, "stages", None)
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


def time_augment(caches, share, clock) -> PerSample:
    """The stage replayed whole and transform by transform on the same samples, in turn
    (breakdown.measure_with_whole); the first sample, untimed, is the warm-up of both."""
    stages = getattr(caches, "stages", None)
    if stages is not None and stages.has_raw:  # the stages between the cuts, on the cached raw items
        items, fn = stages.augmenting()
        timed = timed_loop(items, fn, share, clock)
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
        timed = timed_loop(pairs, lambda p: recording.replay_sample(*p), share / 2, clock)
        whole = PerSample(ms_per_sample=round(timed.ms, 4), samples=timed.n, se_ms_per_sample=timed.se_ms,
                          cpu_ms_per_sample=round(timed.cpu_ms, 4))
        parts = Breakdown.missing("failed", reason_of(exc))
    if movable and parts.ok and clock() - start < share:  # else none is timed: the share is spent
        left = share - (clock() - start)
        # the reorders timed in what is left (reorder.measure); None where they failed (a
        # transform that raised on a cached input): the breakdown stands
        reorders = attempt(lambda: reorder.measure(caches.raw_calls, max(0.0, left), clock), lambda exc: None)
        parts = dataclasses.replace(parts, reorders=reorders)
    return dataclasses.replace(whole, breakdown=parts)


class CollateInPlace:
    """Each batch collated right after its samples were built, as a worker does: the samples
    time_load builds, grouped as the loader groups them (`sizes`, a batch sampler's batches
    as they were taken, else the batch size), and collate_fn called on each group as it
    fills (with torch's default_collate too, where collate_fn is another: the two in turn,
    as the one run second finds its samples warmer). Their time is taken out of the load's
    (`exclude`). A collate over batches built before runs warmer than this
    (docs/benchmarks.md: 1.4-1.8 ms against 0.8-1.0 on MosaicML's MNIST)."""

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
            except Exception as exc:  # the warm timing stands in (time_collate)
                if fn is self.fn:
                    self.failed = reason_of(exc)
                else:
                    self.default_failed = reason_of(exc)
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


def _groups(spec, caches) -> list:
    """The cached samples as collate_fn got them: the user's sampler's groups."""
    if not spec.auto_collation:
        return list(caches.samples)
    return [[caches.samples[i] for i in g] for g in caches.groups]


def time_collate(spec, caches, share, clock, *, in_place: Optional[CollateInPlace] = None) -> Collate:
    """collate_fn right after each batch's samples were built (CollateInPlace) where at
    least COLLATE_IN_PLACE batches were, else over the cached batches, warm (repeated)."""
    name = getattr(spec.collate_fn, "__qualname__", type(spec.collate_fn).__name__)
    if in_place is not None and len(in_place.own) >= COLLATE_IN_PLACE:
        own, n = in_place.own, len(in_place.own)
        dflt = in_place.default if len(in_place.default) >= COLLATE_IN_PLACE else None
        return Collate(ms_per_batch=round(sum(own) / n * 1e3, 4), batches=n, collate_fn=name,
                       mixes=batch_mixers(spec.collate_fn) or None, se_ms_per_batch=se_ms(own),
                       cpu_ms_per_batch=round(in_place.own_cpu / n * 1e3, 4), in_place=True,
                       default_collate_ms_per_batch=None if dflt is None else round(sum(dflt) / len(dflt) * 1e3, 4),
                       default_collate_reason=in_place.default_failed if dflt is None else None)
    groups, fn, stages = _groups(spec, caches), spec.collate_fn, getattr(caches, "stages", None)
    if stages is not None:  # the pipeline's own batching, then the loader's collate_fn
        groups, fn = stages.collating(spec.collate_fn, spec.batch_size if spec.auto_collation else None)
    timed = repeated(groups, fn, share / 2, clock, COLLATE_CALLS)
    n = timed.n
    info = Collate(ms_per_batch=round(timed.ms, 4), batches=n, collate_fn=name, se_ms_per_batch=timed.se_ms,
                   mixes=batch_mixers(spec.collate_fn) or None, cpu_ms_per_batch=round(timed.cpu_ms, 4))
    if spec.collate_fn is not default_collate and spec.auto_collation and stages is None:
        # The same samples through torch's default_collate: tells the function's own work
        # apart from what the batch structure costs.
        try:
            again = repeated(groups[:n + 1], default_collate, share / 2, clock, n)  # the batches timed above
            info = dataclasses.replace(info, default_collate_ms_per_batch=round(again.ms, 4))
        except Exception as exc:
            info = dataclasses.replace(info, default_collate_reason=reason_of(exc))
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
