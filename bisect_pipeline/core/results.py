"""What was measured, as typed frozen values: the bottom layer. Measuring code makes
them, derivations (verdict, advice, outcome, diagnosis) read them, the report renders
what was derived; nothing here imports either.

Each record has the JSON form the document stores (`to_dict`, `from_dict`): fields in
the document's order, None left out unless the document always carries the key.

Why one module: every record of a run with its JSON form, in the order the document
lists them; they share the `Record` base, and the document's schema reads as this one
file.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

from .stats import Throughput, Window

STATUSES = ("ok", "skipped", "unavailable", "failed", "not run")
# The reason of a point skipped because the points option left it out (not because it
# does not apply here: its stage is then measured together with the next one).
NOT_SELECTED = "not selected (points option)"


def plain(x: Any) -> Any:
    """The JSON form of a value: records as dicts, tuples as lists."""
    if isinstance(x, Record):
        return x.to_dict()
    if isinstance(x, (tuple, list)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


@dataclasses.dataclass(frozen=True)
class Record:
    """A typed value with a JSON form. `_nested` maps a field to the record type of its
    value (or of the items of its list); `_keep_none` names fields written even as None."""

    _nested: ClassVar[dict] = {}
    _keep_none: ClassVar[tuple] = ()

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None or f.name in self._keep_none:
                out[f.name] = plain(v)
        return out

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> Any:
        """The record of a document's dict (None for None or {}); keys it does not know
        are left out (a document of another version)."""
        if not d:
            return None
        if isinstance(d, cls):
            return d
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            v, sub = d[f.name], cls._nested.get(f.name)
            if sub is not None and v is not None:
                v = tuple(sub.from_dict(x) for x in v) if isinstance(v, list) else sub.from_dict(v)
            elif isinstance(v, list):
                v = tuple(v)
            kw[f.name] = v
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class Part(Record):
    """One measurement that may not have been made: `status` ok, skipped, unavailable or
    failed, with its `reason` when not ok."""

    status: str = "ok"
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def missing(cls, status: str, reason: str) -> Any:
        return cls(status=status, reason=reason)


# --------------------------------------------------------------------------------------
# Points
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Measured:
    """One visit (visit.Visit) as it ended: the windows it kept and how it got there."""

    windows: tuple[Window, ...]  # kept: the warm-up windows are left out
    opened_seconds: float = 0.0  # opening the point's source (its workers' start)
    first_batch_seconds: Optional[float] = None  # the first batch and its step
    warmup_steps: int = 0
    warmup_seconds: float = 0.0
    stopped_by_deadline: bool = False
    steady: bool = False  # two consecutive windows agreed
    warmup_windows: int = 0  # windows timed but left out as warm-up
    wait_seconds: float = 0.0  # of the kept windows, the time spent waiting for a batch
    discarded: int = 0  # windows voided by a pause of the consumer (a user's loop)
    pauses: int = 0  # the consumer's pauses, windows or not (epoch ends, evaluations, other loaders)
    paused_seconds: float = 0.0
    error: Optional[BaseException] = None
    peer_failed: bool = False  # another rank failed (lockstep)

    @property
    def steps(self) -> int:
        return sum(w.steps for w in self.windows)


@dataclasses.dataclass(frozen=True)
class PointResult:
    point: str
    status: str
    throughput: Optional[Throughput] = None
    reason: Optional[str] = None
    first_batch_seconds: Optional[float] = None
    warmup_steps: int = 0
    stopped_by_deadline: bool = False
    failed_stage: Optional[str] = None  # for a failed point: the stage whose code raised
    visits: int = 1  # how many times the point was visited (rounds); its windows are pooled
    steady: bool = True  # every visit reached two consecutive windows that agree
    wait_seconds: float = 0.0  # of its windows, the time the loop waited for a batch
    discarded: int = 0  # windows discarded because the loop paused (a user's loop)
    pauses: int = 0  # the loop's pauses, left out of every window (epoch ends, evaluations, other loaders)
    paused_seconds: float = 0.0

    def __post_init__(self) -> None:
        # Kept at the precision of the JSON document (0.1 ms), as windows are: a report
        # rebuilt from its document renders the same.
        if self.first_batch_seconds is not None:
            object.__setattr__(self, "first_batch_seconds", round(float(self.first_batch_seconds), 4))
        object.__setattr__(self, "wait_seconds", round(float(self.wait_seconds), 6))
        object.__setattr__(self, "paused_seconds", round(float(self.paused_seconds), 4))

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.throughput is not None

    @property
    def wait_per_batch(self) -> Optional[float]:
        """Seconds per batch the loop waited for its next batch, over the kept windows."""
        if not self.ok or not self.throughput.steps:
            return None
        return self.wait_seconds / self.throughput.steps


@dataclasses.dataclass(frozen=True)
class Note(Record):
    """A warning as a value: `kind` says what it is about (`loader`, `pipeline`, `shm`,
    `cache`, `step`, `budget`, `batches`, `noise`, `deadline`, `unsteady`, `paused`, `inconsistent`,
    `workers`, `allocator`, `rules`, ...), `message` is what the report prints: one line,
    what was seen with its figure, then the next step; `detail` the why beneath it, if
    any (the HTML folds it, the JSON keeps it); `point` the point it concerns, if one;
    `derived` when the report derives it from the numbers (else it was seen while
    measuring)."""

    kind: str
    message: str
    point: Optional[str] = None
    derived: bool = False
    detail: Optional[str] = None

    def __str__(self) -> str:
        return self.message


# --------------------------------------------------------------------------------------
# Stage costs measured alone (isolate.py)
# --------------------------------------------------------------------------------------


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

    transform: str = ""
    where: str = ""
    predicted_ms_per_batch: Optional[float] = None  # isolated ms/sample x items per batch / workers
    measured_ms_per_batch: Optional[float] = None  # with it - without it, per batch
    tolerance_ms: Optional[float] = None
    real: Optional[bool] = None
    with_ms_per_batch: Optional[float] = None
    without_ms_per_batch: Optional[float] = None
    windows: Optional[int] = None
    trial: Optional[Any] = None  # the raw windows: Trial ("with" as the user's side), nested once Trial is defined


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
    bytes_per_sample: Optional[float] = None
    read_mb_per_s: Optional[float] = None
    files_per_sample: Optional[float] = None
    samples: Optional[int] = None
    bound: Optional[str] = None  # "read" or "decode"
    how: Optional[str] = None  # how reads were seen, e.g. "file reads through open()"


# What a load timed alone may include besides loading (PerSample.includes), in words.
MERGED_WITH_LOAD = {"augment": "the transforms", "collate": "the collate"}


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
    # the load's __getitem__ calls (isolate._load); None where it is the replay itself
    alone_ms_per_sample: Optional[float] = None


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
    """Host-device synchronizations per step, counted on CUDA (isolate.count_syncs)."""

    _nested: ClassVar[dict] = {"sites": SyncSite}
    steps: Optional[int] = None
    total: Optional[int] = None
    per_step: Optional[float] = None
    sites: Optional[tuple] = None


# --------------------------------------------------------------------------------------
# The advice's check (verify.py)
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VisitWindow(Record):
    """A window of a trial, with the visit it belongs to (visits of one side disagree
    more than the windows of one visit: outcome._visit_rel_se)."""

    steps: int
    seconds: float
    visit: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Trial(Record):
    """The full pipeline with the user's settings and with a candidate's, in alternating
    visits: the raw windows of each side."""

    _nested: ClassVar[dict] = {"user_windows": VisitWindow, "candidate_windows": VisitWindow}
    _keep_none: ClassVar[tuple] = ("error",)
    item: Optional[str] = None  # the advice item (its kind) the candidate is for
    settings: dict = dataclasses.field(default_factory=dict)
    user_windows: tuple = ()
    candidate_windows: tuple = ()
    error: Optional[str] = None
    # the candidate's first visit's opening and first batch: its workers' start, paid once
    # where its pool is kept between its visits (verify.pool_start)
    candidate_start_s: Optional[float] = None
    # the patched script's run (change.check): the pause at each epoch's start its windows
    # leave out, per batch, as that run estimated it (run.epoch_start.ms_per_batch)
    epoch_ms_per_batch: Optional[float] = None


Confirmation._nested = {"trial": Trial}


@dataclasses.dataclass(frozen=True)
class Verification(Part):
    _nested: ClassVar[dict] = {"trials": Trial}
    budget_s: Optional[float] = None
    elapsed_s: Optional[float] = None
    trials: tuple = ()


@dataclasses.dataclass(frozen=True)
class Tuning(Part):
    """The search of --tune (tune.py): the space searched, each candidate's trial against
    the user's settings (raw windows; tune.summarize derives the rest), why it stopped;
    the driver adds the change written against the user's script (`patch`, patch.Patch's
    JSON form) and the patched script measured against the original (`applied`)."""

    _nested: ClassVar[dict] = {"trials": Trial, "applied": Trial}
    budget_s: Optional[float] = None
    elapsed_s: Optional[float] = None
    user: Optional[dict] = None  # the user's settings as the search writes them (tune.KEYS)
    workers: Optional[tuple] = None  # the num_workers the search could try, after pruning
    start: Optional[int] = None  # the num_workers tried first
    why: Optional[str] = None  # how the space was pruned, in words
    ceiling_ms_per_batch: Optional[float] = None
    ceiling_rel_se: Optional[float] = None
    trials: tuple = ()
    stopped: Optional[str] = None
    patch: Optional[dict] = None
    applied: Optional[Trial] = None
    applied_reason: Optional[str] = None


# --------------------------------------------------------------------------------------
# The run as a whole
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheInfo(Record):
    """What the caches hold (cache.Caches); `limited_by` says why fewer batches than asked;
    `held` the bytes they hold at once, per part (cache.HELD_PARTS), against `budget_bytes`."""

    _keep_none: ClassVar[tuple] = ("limited_by",)
    batches: Optional[int] = None
    samples: Optional[int] = None
    batch_bytes: Optional[int] = None
    fill_seconds: Optional[float] = None
    limited_by: Optional[str] = None
    raw_transforms: Optional[tuple] = None
    held: Optional[dict] = None
    budget_bytes: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class AllocatorHold(Record):
    """Whether glibc's malloc was held still during the run (allocator.Held)."""

    controlled: bool = False
    allocator: Optional[str] = None
    during: Optional[dict] = None
    after: Optional[dict] = None
    note: Optional[str] = None
    reason: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class RunInfo(Record):
    """The run's context and schedule."""

    _nested: ClassVar[dict] = {"allocator": AllocatorHold}
    max_seconds: Optional[float] = None
    elapsed_s: Optional[float] = None
    torch: Optional[str] = None
    torchvision: Optional[str] = None
    python: Optional[str] = None
    platform: Optional[str] = None
    cpu_count: Optional[int] = None
    allocator: Optional[AllocatorHold] = None
    rounds: Optional[int] = None
    settled: Optional[bool] = None
    # what settled it beyond the stop rule's margin: "both witnesses" (rounds.witnessed)
    settled_by: Optional[str] = None
    remeasured: Optional[tuple] = None
    verdict_s: Optional[float] = None
    visits: Optional[int] = None
    # --max-seconds divided before anything was measured (plan.Budget.to_dict: seconds of
    # bisecting, checking, searching, patching), and the seconds before the tool could act
    # (imports; under `run`, the script up to its training loader's creation), not counted
    budget: Optional[dict] = None
    startup_s: Optional[float] = None
    # the pause at the start of each epoch of your loader, which no point's window holds
    # (phases.epoch_start): epoch_batches, ms_per_epoch, ms_per_batch, samples_per_sec
    # (the full point's) and samples_per_sec_with_epochs, how it was measured; timed:
    # epochs_timed and ms_per_epoch_se (the epochs' standard error)
    epoch_start: Optional[dict] = None

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> Any:
        r = super().from_dict(d)
        if r is not None and r.remeasured is not None:  # pairs stay lists, as written
            r = dataclasses.replace(r, remeasured=tuple(list(p) for p in r.remeasured))
        return r


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Everything one run measured, with what is needed to read it: the input of every
    derivation (diagnosis.diagnose)."""

    device: str
    batch_size: float
    points: tuple[PointResult, ...]
    batch_size_source: str = ""
    loader: dict = dataclasses.field(default_factory=dict)  # the user's settings (LoaderSpec.settings)
    cache: CacheInfo = CacheInfo()
    run: RunInfo = RunInfo()
    isolated: Optional[Isolated] = None
    syncs: Optional[Syncs] = None
    verification: Optional[Verification] = None  # None: no check was asked for (a loaded older document)
    tune: Optional[Tuning] = None  # None: --tune was not asked for
    notes: tuple[Note, ...] = ()  # seen while measuring
    complete: bool = True
    interrupted: bool = False
    # Who drove the loop: "entry" (the tool's step) or "loop" (the user's own loop,
    # loop.py), and, for a loop, which loader it chose and where it was created.
    mode: str = "entry"
    source: Optional[dict] = None

    def point(self, name: str) -> Optional[PointResult]:
        return next((p for p in self.points if p.point == name), None)
