"""Fill the caches once, in this process, from the first batches in the user's order:
the transforms' inputs (`raw`), the samples (`augmented`) and the collated batches
(`collated`, and from them `host` and `device`)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Iterator, Optional

from ..core import faults, tree
from ..core.errors import BisectError
from ..core.faults import StageError
from ..pipeline import integrations, recording, split
from ..pipeline.loader import LoaderSpec, copy_or_same, index_order
from ..pipeline.recording import SplitError

# Distinct batches kept per cache point: enough that a replay loader with a few workers
# and prefetching cycles through different data, few enough to fill in seconds.
DEFAULT_CACHE_BATCHES = 8
# What the memory budget (--cache-mb) counts: everything the caches hold at once, each
# part by its own size (tree.nbytes), per cached batch: the transforms' recorded inputs
# (`raw`: a decoded image, or a file name, or a whole volume before a crop), the samples
# (`augmented`), the collated batch (`collated`), and the copy of it that the point being
# visited makes while its visit lasts (`host`: pinned; `device`: on the CPU its own copy,
# on an accelerator a host copy while it is moved). The host and device points are never
# open together, so one such copy counts.
HELD_PARTS = ("raw_inputs", "samples", "collated", "point_copy")
# The most items a webdataset pipeline's cut keeps while the caches fill (its shuffle
# buffers read ahead of the batches); trimmed to the cached batches' samples after.
TAP_LIMIT = 4096


@dataclasses.dataclass
class Caches:
    batch_size: float  # samples per step: the mean over the cached batches when they differ
    dataset: Any  # the copy of the user's dataset used to fill (transforms proxied when found)
    samples: list  # dataset outputs (the `augmented` point)
    raw_calls: Optional[list]  # per sample, the transform calls to replay (the `raw` point)
    raw_reason: Optional[str]  # why `raw` is unavailable, when it is
    raw_found: list  # the transforms found on the dataset
    batches: list  # collate_fn outputs (the `collated` point)
    batch_bytes: int
    fill_seconds: float
    limited_by: Optional[str] = None  # "memory budget" or "time" when fewer batches were kept
    held: dict = dataclasses.field(default_factory=dict)  # bytes held at once, per part (HELD_PARTS), all batches
    budget_bytes: Optional[int] = None  # --cache-mb, in bytes
    stopped_by: Optional[str] = None  # an error that ended the fill after the first batch
    warnings: list = dataclasses.field(default_factory=list)  # problems seen while filling: results.Note
    # Positions in `samples` of each batch's samples, as the user's sampler (or batch
    # sampler) grouped them: `raw` and `augmented` replay these same groups.
    groups: list = dataclasses.field(default_factory=list)
    batch_size_source: str = ""
    # A pipeline whose stages are objects (integrations.webdataset.Cuts): the items kept
    # at its cuts, and its `raw` and `augmented` replays; None for the others.
    stages: Any = None
    # The proxies' recorder on `dataset` where the transforms were split (raw_calls):
    # worker_stages.py times them where the dataset calls them (recording.Recorder.timing).
    recorder: Any = None

    @property
    def items_per_batch(self) -> float:
        """The dataset's items (its __getitem__ calls) in a batch, as the sampler grouped
        them: what per-sample costs measured alone multiply by (batch_size counts what the
        step receives: more when one item becomes several). A webdataset pipeline that
        batches its samples itself yields batches: its samples per item count too."""
        per = self.stages.items_per_output if self.stages is not None else 1
        return (sum(len(g) for g in self.groups) / len(self.groups) * per) if self.groups else self.batch_size

    @property
    def has_raw(self) -> bool:
        """Whether `raw` can be replayed: transform calls recorded, or a stage cut."""
        return self.raw_calls is not None or (self.stages is not None and self.stages.has_raw)

    @property
    def n_batches(self) -> int:
        return len(self.batches)


def fill(spec: LoaderSpec, *, cache_mb: float, max_batches: int = DEFAULT_CACHE_BATCHES,
         time_budget: float = 10.0, clock: Callable[[], float] = time.perf_counter,
         on_batch: Callable[[int], None] = lambda n: None, batch_size: Any = None) -> Caches:
    """Build the first batches of the pipeline once, in this process, keeping every
    intermediate product: transform inputs, samples, and collated batches.

    Stops at `max_batches`, at the memory budget, or after `time_budget` seconds (with
    at least one batch). An error after the first batch keeps what was built (said in
    `stopped_by`); an error before it raises FillError naming the stage. A hang is
    ended by the caller's watchdog (faults.StepTimeout): the reason names the sample
    and the stage it hung in. `on_batch(n)` is called after each batch is cached.
    `batch_size` (Workload.batch_size) overrides how many samples a batch holds: a
    number, or a function of a collated batch (see batch_size_of).
    """
    start = clock()
    found_warnings = _pipeline_warnings(spec)
    rec = _Recording(spec)
    kept = _Kept()
    groups = _sample_groups(spec, rec.dataset)
    at = {"index": None, "n": 0}  # the sample being built, for a hang's reason
    limited_by = stopped_by = None
    while limited_by is None:
        try:
            group_samples, batch = _build(next(groups), rec, spec, at)
        except StopIteration:
            break
        except Exception as exc:  # a hang (the watchdog's StepTimeout) or an error: kept what was built
            which = f"sample {at['index']}" if at["index"] is not None else f"sample #{at['n']} of the iterator"
            stopped_by = stopped(exc, which, first=not kept.batches)
            break
        kept.add(group_samples, batch, rec.raw_calls)
        on_batch(len(kept.batches))
        if len(kept.batches) >= max_batches:
            break
        if kept.held_bytes + kept.largest > cache_mb * 2**20:  # the next batch, as large as the largest, would not fit
            limited_by = "memory budget"
        elif clock() - start > time_budget:
            limited_by = "time"
    if not kept.batches:
        raise BisectError("the loader yields no batch: its dataset is empty (or smaller than one batch with "
                          "drop_last=True). Check the dataset your entry function builds.")
    raw_calls = rec.finish(len(kept.samples))
    size, source = batch_size_of(spec, kept.positions, kept.batches, batch_size, samples=kept.samples)
    out = Caches(batch_size=size, dataset=rec.dataset, samples=kept.samples, raw_calls=raw_calls,
                 raw_reason=rec.raw_reason, raw_found=rec.found, batches=kept.batches, batch_bytes=kept.batch_bytes,
                 fill_seconds=clock() - start, limited_by=limited_by, stopped_by=stopped_by,
                 warnings=found_warnings, groups=kept.positions, batch_size_source=source,
                 held=kept.held(raw_calls is not None), budget_bytes=int(cache_mb * 2**20),
                 recorder=rec.inst.recorder if rec.inst is not None and raw_calls is not None else None)
    return rec.with_cuts(out) if rec.cuts is not None else out


@dataclasses.dataclass
class _Kept:
    """What the fill has built so far, and the bytes it holds (HELD_PARTS)."""

    samples: list = dataclasses.field(default_factory=list)
    batches: list = dataclasses.field(default_factory=list)
    positions: list = dataclasses.field(default_factory=list)  # per batch, its samples' positions in `samples`
    batch_bytes: int = 0  # the largest collated batch
    raw_bytes: int = 0
    sample_bytes: int = 0
    collated_bytes: int = 0
    largest: int = 0  # the most one batch holds, all parts together

    def add(self, group_samples: list, batch: Any, raw_calls: Optional[list]) -> None:
        self.positions.append(list(range(len(self.samples), len(self.samples) + len(group_samples))))
        self.samples.extend(group_samples)
        self.batches.append(tree.clone(batch))
        nbytes = tree.nbytes(batch)
        self.batch_bytes = max(self.batch_bytes, nbytes)
        # the raw inputs of this batch's samples, while the split holds (once it is given
        # up, _Recording drops every recorded call: none is held any more)
        raw = 0
        if raw_calls:
            raw = sum(tree.nbytes((c.args, c.kwargs)) for calls in raw_calls[-len(group_samples):] for c in calls)
            self.raw_bytes += raw
        else:
            self.raw_bytes = 0
        samples = tree.nbytes(group_samples)
        self.sample_bytes += samples
        self.collated_bytes += nbytes
        self.largest = max(self.largest, raw + samples + 2 * nbytes)

    @property
    def held_bytes(self) -> int:
        return self.raw_bytes + self.sample_bytes + 2 * self.collated_bytes

    def held(self, raw_kept: bool) -> dict:
        return {"raw_inputs": self.raw_bytes if raw_kept else 0, "samples": self.sample_bytes,
                "collated": self.collated_bytes, "point_copy": self.collated_bytes}


def _build(group: list, rec: "_Recording", spec: LoaderSpec, at: dict) -> tuple:
    """One batch's samples (recorded) and the batch collate_fn makes of them."""
    group_samples = []
    for index, item in group:
        at["index"], at["n"] = index, at["n"] + 1
        group_samples.append(rec.sample(index, item))
    batch = faults.Tagged(spec.collate_fn, "collate")(group_samples if spec.auto_collation else group_samples[0])
    return group_samples, batch


def stopped(exc: Exception, which: str, first: bool) -> str:
    """Why the fill stopped: the reason, naming the stage (and, for a hang, `which`: the
    sample, or the graph, it hung in); before the first batch, FillError instead."""
    if isinstance(exc, faults.StepTimeout):
        stage = faults.stage_in_traceback(exc) or "load"
        reason = f"{which} hung in {stage}: {exc}"
        if first:
            raise FillError(stage, reason, hang=True) from exc
        return reason
    tagged = exc if isinstance(exc, StageError) else faults.stage_error("load", exc)
    stage, reason = faults.classify(tagged)
    if first:
        raise FillError(stage, reason) from exc
    return reason  # the batches already cached are kept


def batch_size_of(spec: LoaderSpec, groups: list, batches: list, override: Any = None, *,
                  samples: Optional[list] = None) -> tuple[float, str]:
    """(samples per step, where that number comes from), in this order: the workload's
    own (a number, or a function of a collated batch, averaged over the cached ones); the
    collated batch's own count when each item of the dataset became several samples
    (several_per_item); the loader's batch_size; the batch sampler's batches (the mean of
    their lengths); else, without automatic batching (the dataset returns whole batches),
    the first dimension of the batch's first tensor, which is the batch only for
    batch-first tensors."""
    if override is not None:
        if callable(override):
            sizes = [float(override(b)) for b in batches]
            return _mean(sizes), f"Workload.batch_size (a function; the mean over {len(sizes)} cached batches)"
        return _mean([override]), "Workload.batch_size"
    several = several_per_item(groups, batches, samples) if spec.auto_collation and samples else None
    if several is not None:
        items = spec.batch_size if spec.batch_size is not None else _mean([len(g) for g in groups])
        by = "loader batch_size" if spec.batch_size is not None else "the batch sampler's batches of"
        return items * several, f"counted in the collated batch: {by} {items} \u00d7 {several} per sample"
    if spec.batch_size is not None:
        return spec.batch_size, "DataLoader.batch_size"
    if spec.batch_sampler is not None:
        sizes = [len(g) for g in groups]
        return _mean(sizes), f"the batch sampler's batches (the mean over {len(sizes)})"
    return tree.leading_dim(batches[0]) or 1, ("the first dimension of the batch's first tensor (no automatic "
                                                      "batching; give Workload(batch_size=...) if it is not the batch)")


def several_per_item(groups: list, batches: list, samples: list) -> Optional[int]:
    """k when each item of the dataset is a list of k >= 2 samples alike (a transform that
    makes several crops of one image, as MONAI's RandCropByPosNegLabeld(num_samples=k))
    and collate_fn flattened them: every tensor of each cached batch has k times the
    batch's items as its first dimension (tree.shared_leading_dim). Else None: the loader's
    count stands (a batch whose tensors disagree is not counted from them)."""
    ks = set()
    for group, batch in zip(groups, batches):
        k = _list_length(samples[i] for i in group)
        if k is None or tree.shared_leading_dim(batch) != k * len(group):
            return None
        ks.add(k)
    return ks.pop() if len(ks) == 1 else None


def _list_length(items: Iterator) -> Optional[int]:
    """k when every item is a list of k >= 2 containers of one structure, else None."""
    lengths = set()
    for item in items:
        if not (isinstance(item, list) and len(item) >= 2 and all(tree.is_container(x) for x in item)
                and all(tree.same_structure(x, item[0]) is None for x in item[1:])):
            return None
        lengths.add(len(item))
    return lengths.pop() if len(lengths) == 1 else None


def _mean(sizes: list) -> float:
    """The mean, an int when it is a whole number (as a batch size usually is)."""
    m = sum(sizes) / len(sizes)
    return int(round(m)) if abs(m - round(m)) < 1e-9 else m


def _pipeline_warnings(spec: LoaderSpec) -> list:
    """Problems of the pipeline itself, seen before it is measured: an IterableDataset
    whose workers all yield the same samples. They reach the report's warnings:
    bisect() never prints."""
    out = []
    if spec.iterable:
        dup = integrations.iterable.duplicates(spec.dataset, spec.num_workers, spec.worker_init_fn)
        if dup:
            out.append(dup)
    return out


def by_index(spec: LoaderSpec) -> bool:
    """Whether the caches are filled through the dataset's per-sample access although it
    is an IterableDataset: a streaming dataset (integrations.streaming) that partitions
    its samples by worker itself. Iterated in this process, MosaicML's would then hang
    in the user's workers (its shared state counts this process as a worker of its own)."""
    return spec.iterable and integrations.streaming.is_streaming(spec.dataset)


class FillError(Exception):
    """Not even one batch could be built: every cached point fails with this reason."""

    def __init__(self, stage: Optional[str], reason: str, hang: bool = False) -> None:
        super().__init__(reason)
        self.stage = stage
        self.reason = reason
        self.hang = hang


class _Recording:
    """Builds samples through proxied transforms while the raw split holds, recording
    each sample's transform calls; gives the split up (with the reason) when it fails."""

    def __init__(self, spec: LoaderSpec) -> None:
        self.spec = spec
        self.inst = None
        self.raw_reason: Optional[str] = None
        self.replayed: set = set()  # the names of the proxies whose calls are replayed
        self.changes: set = set()  # the names of the transforms seen changing their image input (recording.settle_copies)
        self.cuts = None  # a webdataset pipeline's cuts (integrations.webdataset)
        if spec.iterable and not by_index(spec):
            self.cuts, why = integrations.webdataset.cuts(spec.dataset, limit=TAP_LIMIT)
            self.raw_reason = None if self.cuts is not None else (
                f"the dataset is an IterableDataset: {why}" if why else
                "the dataset is an IterableDataset: its samples come out of one iterator, so its "
                "transforms cannot be run apart from loading")
        else:
            try:
                self.inst = split.instrument(spec.dataset)
            except Exception as exc:  # copy.copy refused
                self.raw_reason = f"the dataset could not be copied to proxy its transforms ({type(exc).__name__}: {exc})"
            if self.inst is not None and not self.inst.labels:
                self.raw_reason = self._no_transform()
                self.inst = None
        self.found: list = []
        self.dataset = (self.cuts.tapped if self.cuts is not None else
                        self.inst.dataset if self.inst is not None else copy_or_same(spec.dataset))
        self.raw_calls: Optional[list] = [] if self.inst is not None else None
        self.batched_fetch = self.inst is not None and integrations.hf.fetches_batches(spec.dataset)

    def sample(self, index: Any, item: Any) -> Any:
        if index is None:  # an IterableDataset's item
            return tree.clone(item)
        if self.raw_calls is None:
            return tree.clone(self.dataset[index])
        try:
            sample, calls = recording.record_sample(self.inst, index)
            if len(self.raw_calls) < 2:  # check the split on the first samples
                if not calls:
                    raise SplitError(self._not_called())
                diff = tree.same_structure(recording.replay_sample(sample, calls), sample)
                if diff:
                    raise SplitError(f"replaying the transforms does not rebuild the sample ({diff})")
                recording.settle_copies(sample, calls, self.changes)
            else:
                recording.mark_copies(calls, self.changes)
        except SplitError as exc:
            self.raw_reason, self.raw_calls = str(exc), None
            return tree.clone(self.dataset[index])
        if self.batched_fetch:
            integrations.hf.mark_batched(calls)
        self.raw_calls.append(calls)
        self.replayed.update(c.name for c in calls)
        return tree.clone(sample)

    def finish(self, n_samples: int) -> Optional[list]:
        """After the fill: the calls to replay per sample (None when `raw` is unavailable);
        the tentative proxies settled on the dataset copy; `found`, the transforms replayed."""
        raw_calls = self.raw_calls if self.raw_calls is not None and len(self.raw_calls) == n_samples else None
        if self.inst is not None:
            replayed = self.replayed if raw_calls is not None else self.replayed - set(self.inst.tentative)
            self.inst.settle(replayed)
            self.found = self.inst.found(replayed)
        return raw_calls

    def with_cuts(self, caches: Caches) -> Caches:
        """The caches of a pipeline cut into its stages: the items kept at each cut (as
        many as the cached batches hold samples), `full` on a copy without taps."""
        c = self.cuts
        why = c.settle(sum(len(g) for g in caches.groups) * c.items_per_output)
        held = dict(caches.held, raw_inputs=c.nbytes())
        return dataclasses.replace(caches, stages=c, dataset=c.full, raw_found=c.found() if why is None else [],
                                   raw_reason=why, held=held)

    def _not_called(self) -> str:
        """Why `raw` is unavailable when the first sample replays no transform."""
        declared = [label for name, label in self.inst.labels.items() if name not in self.inst.tentative]
        if not declared:
            return self._no_transform()
        why = "".join(f"; {w}" for w in self.inst.dropped.values())
        return f"{', '.join(declared)} exist(s) but __getitem__ never called them{why}"

    def _no_transform(self) -> str:
        dropped = list(self.inst.dropped.values()) if self.inst is not None else []
        return integrations.no_transform_reason(self.spec.dataset) or (
            f"no per-sample transform {'could be separated' if dropped else 'was found'} on "
            f"{type(self.spec.dataset).__name__} (looked for {', '.join(split.TRANSFORM_ATTRS)} and the dataset's "
            f"other callable attributes, also through Subset and ConcatDataset){': ' if dropped else ''}"
            f"{'; '.join(dropped)}. Keep the transforms in `self.transform` and apply them in __getitem__, as "
            "torchvision datasets do, to separate loading from augmentation")


def _sample_groups(spec: LoaderSpec, dataset: Any) -> Iterator[list]:
    """Yield the (index, sample-or-None) pairs of each batch, in the user's order (a
    streaming dataset's: its first samples by index, by_index)."""
    if by_index(spec):
        indices = iter(range(len(dataset)))
        while True:
            group = [(i, None) for i in itertools.islice(indices, spec.batch_size if spec.auto_collation else 1)]
            if not group:
                return
            yield group
    if spec.iterable:
        it = iter(dataset)
        size = spec.batch_size if spec.auto_collation else 1
        while True:
            group = list(itertools.islice(((None, s) for s in it), size))
            if not group or (spec.drop_last and len(group) < size):
                return
            yield group
    batched = spec.batch_sampler is not None or spec.auto_collation
    for indices in index_batches(spec):
        yield [(i, None) for i in indices] if batched else [(indices, None)]


def index_batches(spec: LoaderSpec) -> Iterator:
    """The user's order as the loader fetches it, forever (index_order): its batch
    sampler's batches, the sampler's indices grouped by batch_size, or single indices
    without automatic batching: the fill's groups, and the batches isolate.py fetches
    between steps after them."""
    order = index_order(spec)
    if spec.batch_sampler is not None or not spec.auto_collation:
        return order
    return ([next(order) for _ in range(spec.batch_size)] for _ in itertools.count())
