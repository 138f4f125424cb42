"""The stage costs measured alone (isolate.py), in this process and without workers
(Isolated and its parts, the augment stage transform by transform, the syncs): apart
from the points' records, as the verdict's second witness and the advice read them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

from .record import Part, Record
from .trials import Trial


@dataclasses.dataclass(frozen=True)
class BreakdownRow(Part):
    """One transform of the augment stage timed alone on the cached inputs (breakdown.py):
    `status` ok, or "not run" when the budget ran out before it; `note` says why a
    transform is one row (not a Compose, or called with several arguments)."""

    name: str = ""
    where: str = ""  # e.g. dataset.transform[1][0]
    ms_per_sample: Optional[float] = None
    share: Optional[float] = None  # of the rows' sum
    input: Optional[str] = None  # e.g. "500x375 RGB", "3x224x224 uint8"
    output: Optional[str] = None
    samples: Optional[int] = None
    note: Optional[str] = None
    ran: Optional[int] = None  # samples it ran on: fewer than `samples` under RandomApply/RandomChoice


@dataclasses.dataclass(frozen=True)
class Reorder(Record):
    """A photometric transform that runs on more pixels than a later crop or resize keeps
    (the seed slides' "blur then crop"), moved to just after that crop and timed on the
    same cached inputs both ways (reorder.py): `real` when the saving is beyond the noise."""

    transform: str = ""  # e.g. ColorJitter
    where: str = ""  # dataset.transform[0]
    after: str = ""  # the crop or resize it moves after, e.g. RandomResizedCrop
    after_where: str = ""
    order: Optional[tuple] = None  # the reordered transforms' names, in their new order
    pixels_before: Optional[int] = None  # what the transform ran on, and what the crop keeps
    pixels_after: Optional[int] = None
    ms_per_sample: Optional[float] = None  # the transforms as they are
    reordered_ms_per_sample: Optional[float] = None
    saving_ms_per_sample: Optional[float] = None
    tolerance_ms: Optional[float] = None
    samples: Optional[int] = None
    real: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class Confirmation(Part):
    """The costliest transform measured in the pipeline (under the user's workers): the
    full pipeline replayed from its cached input, and from its cached output, in
    alternating visits; the difference is its cost as the loop sees it."""

    _nested: ClassVar[dict] = {"trial": Trial}
    transform: str = ""
    where: str = ""
    predicted_ms_per_batch: Optional[float] = None  # isolated ms/sample x items per batch / workers
    measured_ms_per_batch: Optional[float] = None  # with it - without it, per batch
    tolerance_ms: Optional[float] = None
    real: Optional[bool] = None
    with_ms_per_batch: Optional[float] = None
    without_ms_per_batch: Optional[float] = None
    windows: Optional[int] = None
    trial: Optional[Trial] = None  # the raw windows ("with" as the user's side)


@dataclasses.dataclass(frozen=True)
class Breakdown(Part):
    """The augment stage transform by transform, and whether the parts add up to the
    stage timed whole on the same samples; a reorder found cheaper (reorder.py), and the
    costliest transform measured in the pipeline (`confirmed`)."""

    _nested: ClassVar[dict] = {"rows": BreakdownRow, "reorders": Reorder, "confirmed": Confirmation}
    rows: Optional[tuple] = None
    samples: Optional[int] = None
    sum_ms_per_sample: Optional[float] = None  # None unless every row was measured
    augment_ms_per_sample: Optional[float] = None
    tolerance_ms: Optional[float] = None
    tolerance: Optional[str] = None  # how tolerance_ms was set: the noise, or a plain 20%
    agrees: Optional[bool] = None
    reorders: Optional[tuple] = None  # Reorder, one per candidate timed
    confirmed: Optional[Confirmation] = None


@dataclasses.dataclass(frozen=True)
class LoadSplit(Part):
    """load split into reading bytes from storage and the rest (decoding, the dataset's
    own work), measured on the same samples (reads.py); `bound` names the larger."""

    read_ms_per_sample: Optional[float] = None
    decode_ms_per_sample: Optional[float] = None  # loading minus reading: decode and the dataset's other work
    # a streaming dataset's load timed through its iterator (PerSample.index_ms_per_sample
    # beside it): what the iterator adds beyond the samples by index, on which read and
    # decode are split
    iterator_ms_per_sample: Optional[float] = None
    bytes_per_sample: Optional[float] = None
    read_mb_per_s: Optional[float] = None
    files_per_sample: Optional[float] = None
    samples: Optional[int] = None
    bound: Optional[str] = None  # "read", "decode" or "iterator"
    how: Optional[str] = None  # how reads were seen, e.g. "file reads through open()"


# What a load timed alone may include besides loading (PerSample.includes), in words.
MERGED_WITH_LOAD = {"augment": "the transforms", "collate": "the collate"}
# LoadSplit.iterator_ms_per_sample, in words
ITERATOR_PART = ("what getting the samples through the dataset's iterator adds, timed in a worker as the loader "
                 "gets them (its partition, shard bookkeeping and threads), beyond read and decode by index")


@dataclasses.dataclass(frozen=True)
class PerSample(Part):
    """load or augment, one sample at a time in this process."""

    _nested: ClassVar[dict] = {"breakdown": Breakdown, "split": LoadSplit}
    ms_per_sample: Optional[float] = None
    samples: Optional[int] = None
    getitem_ms_per_sample: Optional[float] = None  # load: the whole __getitem__
    includes: Optional[tuple] = None  # load: the stages its figure holds
    note: Optional[str] = None
    breakdown: Optional[Breakdown] = None  # augment: transform by transform
    split: Optional[LoadSplit] = None  # load: read and decode
    # the standard error of ms_per_sample (the samples' spread over sqrt(samples); load's
    # combines __getitem__'s and augment's) and the CPU time of this process per sample,
    # with the time it waited for a CPU (devices.cpu_seconds; well under ms_per_sample:
    # the stage waits, on storage or a network, more than it computes); None in a
    # document written before they were kept
    se_ms_per_sample: Optional[float] = None
    cpu_ms_per_sample: Optional[float] = None
    # augment: the stage replayed whole on the cached inputs (what its breakdown adds up
    # to), where ms_per_sample is its transforms timed where the dataset calls them, in
    # the load's __getitem__ calls (worker_stages.time_load); None where it is the replay itself
    alone_ms_per_sample: Optional[float] = None
    # load of a streaming dataset timed through its iterator in a worker (ms_per_sample):
    # the same load timed by index in this process (get_item), kept beside it
    index_ms_per_sample: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Collate(Part):
    ms_per_batch: Optional[float] = None
    batches: Optional[int] = None
    collate_fn: Optional[str] = None
    default_collate_ms_per_batch: Optional[float] = None  # the same samples through default_collate
    default_collate_reason: Optional[str] = None
    mixes: Optional[tuple] = None  # batch-mixing transforms found in the collate_fn (MixUp, CutMix, ...)
    se_ms_per_batch: Optional[float] = None  # as PerSample's, per batch
    cpu_ms_per_batch: Optional[float] = None
    # each batch collated right after its samples were built, as a worker does (true), or
    # over the cached batches (None): the first reads higher where collating is memory-bound
    in_place: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class InLoop(Part):
    """The loop's own input work at num_workers=0, timed batch by batch between training
    steps as the loop runs it (isolate._in_loop): the batch sampler's next batch and its
    items fetched (`fetch`: load and augment), then collate_fn, each per batch with its
    standard error, over `batches` batches beyond those the caches hold."""

    batches: Optional[int] = None
    fetch_ms_per_batch: Optional[float] = None
    fetch_se_ms: Optional[float] = None
    collate_ms_per_batch: Optional[float] = None
    collate_se_ms: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class LoopStages(Part):
    """Stages the user's loop runs on the loader's batches in its own process (a webdataset
    WebLoader's `.unbatched().shuffle(n).batched(m)`), timed alone on cached batches. They
    run at every point alike, so they are in no stage's drop; their cost is its own line."""

    label: Optional[str] = None  # e.g. "WebLoader: unbatched, shuffle, batched(64)"
    ms_per_batch: Optional[float] = None
    batches: Optional[int] = None
    se_ms_per_batch: Optional[float] = None
    cpu_ms_per_batch: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class TensorInfo(Record):
    path: str
    dtype: str
    shape: tuple
    bytes: int
    image: bool


@dataclasses.dataclass(frozen=True)
class BatchShape(Part):
    """What a collated batch is made of."""

    _nested: ClassVar[dict] = {"tensors": TensorInfo}
    bytes: Optional[int] = None
    n_tensors: Optional[int] = None
    tensors: Optional[tuple] = None


@dataclasses.dataclass(frozen=True)
class SampleStructure(Part):
    """Counts of one sample's nodes by kind: what default_collate turns into tensors."""

    tensors: int = 0
    ndarrays: int = 0
    numbers: int = 0
    strings: int = 0
    images: int = 0
    other: int = 0
    containers: int = 0
    longest_list: int = 0
    leaves: int = 0


@dataclasses.dataclass(frozen=True)
class Transfer(Part):
    ms_per_batch: Optional[float] = None
    bytes_per_batch: Optional[int] = None
    gb_per_s: Optional[float] = None
    pinned: Optional[bool] = None
    batches: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class StepTime(Part):
    ms_per_batch: Optional[float] = None
    steps: Optional[int] = None
    source: Optional[str] = None
    # the step timed alone before the points, kept where ms_per_batch became the device
    # point's once it was measured (isolate.with_ceiling): the step the costs alone were
    # compared with, a reading of it apart from the rounds' (verdict._none_unchecked)
    alone_ms_per_batch: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Memory(Part):
    peak_bytes: Optional[int] = None
    total_bytes: Optional[int] = None
    fraction: Optional[float] = None
    note: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Workers(Part):
    """Workers that would feed the step, from the isolated costs (isolate.workers_needed)."""

    worker_ms_per_batch: Optional[float] = None
    step_ms_per_batch: Optional[float] = None
    needed: Optional[int] = None
    cores: Optional[int] = None
    available: Optional[int] = None
    step_threads: Optional[int] = None
    fits: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class AllocatorTiming(Part):
    """The step alone with this process's malloc settings, then held still (allocator.py)."""

    default_ms_per_batch: Optional[float] = None
    held_ms_per_batch: Optional[float] = None
    cost_ms_per_batch: Optional[float] = None
    noise_ms: Optional[float] = None
    real: Optional[bool] = None
    steps: Optional[tuple] = None
    held: Optional[dict] = None
    source: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Isolated(Part):
    """Stage costs measured alone, in this process, without workers (isolate.py)."""

    _nested: ClassVar[dict] = {"augment": PerSample, "load": PerSample, "collate": Collate, "batch": BatchShape,
                               "sample_structure": SampleStructure, "transfer": Transfer, "step": StepTime,
                               "memory": Memory, "workers": Workers, "allocator": AllocatorTiming,
                               "loop": LoopStages, "in_loop": InLoop}
    budget_s: Optional[float] = None
    batch_size: Optional[float] = None
    items_per_batch: Optional[float] = None  # the dataset's items per batch (cache.Caches.items_per_batch)
    augment: Optional[PerSample] = None
    load: Optional[PerSample] = None
    collate: Optional[Collate] = None
    batch: Optional[BatchShape] = None
    sample_structure: Optional[SampleStructure] = None
    transfer: Optional[Transfer] = None
    step: Optional[StepTime] = None
    memory: Optional[Memory] = None
    workers: Optional[Workers] = None
    elapsed_s: Optional[float] = None
    allocator: Optional[AllocatorTiming] = None
    loop: Optional[LoopStages] = None  # stages in the loop's own process (a webdataset WebLoader's)
    in_loop: Optional[InLoop] = None  # num_workers=0: the input work timed between steps

    def part(self, name: str) -> Optional[Part]:
        """The part `name` when it was measured (status ok), else None."""
        p = getattr(self, name, None) if self.ok else None
        return p if isinstance(p, Part) and p.ok else None


@dataclasses.dataclass(frozen=True)
class SyncSite(Record):
    where: str
    count: int


@dataclasses.dataclass(frozen=True)
class Syncs(Part):
    """Host-device synchronizations per step, counted on CUDA (device_alone.count_syncs)."""

    _nested: ClassVar[dict] = {"sites": SyncSite}
    steps: Optional[int] = None
    total: Optional[int] = None
    per_step: Optional[float] = None
    sites: Optional[tuple] = None
