"""What was measured, as typed frozen values with the JSON form the document stores
(record.Record): the bottom layer. Measuring code makes them, derivations (verdict,
advice, outcome, diagnosis) read them, the report renders what was derived; nothing here
imports either. Here the points, the notes, the run and Measurements, which holds them
all; the stage costs alone (isolated.py) and the check's trials (trials.py) are imported
from here with them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

from .isolated import (ITERATOR_PART, MERGED_WITH_LOAD, AllocatorTiming, BatchShape, Breakdown,  # noqa: F401
                       BreakdownRow, Collate, Confirmation, InLoop, Isolated, LoadSplit, LoopStages, Memory, PerSample,
                       Reorder, SampleStructure, StepTime, SyncSite, Syncs, TensorInfo, Transfer, Workers)
from .record import Part, Record  # noqa: F401
from .stats import Throughput, Window
from .trials import Trial, Tuning, Verification, VisitWindow  # noqa: F401

STATUSES = ("ok", "skipped", "unavailable", "failed", "not run")
# The reason of a point skipped because the points option left it out (not because it
# does not apply here: its stage is then measured together with the next one).
NOT_SELECTED = "not selected (points option)"


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
    error: Optional[str] = None  # for a failed point: the original error's text (`reason` tells its cause)
    # its first window is the step timed alone before the points, not a visit's (the
    # ceiling of a first round the budget holds no visit of it in: Experiment.ceiling_alone)
    step_alone: bool = False

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
    # what ended the rounds short of a settled verdict where it was not --max-seconds:
    # "batches" (a user's script had no more batches for them: rounds.Rounds._visit)
    limited_by: Optional[str] = None
    # where a step of seconds left `full` unmeasured: about the --max-seconds that holds one
    # reading of each point a verdict needs (rounds.Rounds.least_verdict_seconds)
    least_verdict_s: Optional[int] = None
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
