"""The typed results of deriving and advising, below every module that fills or reads them:
what a candidate measured against the user's settings (`Outcome`) and an advice item's
check (`Checked`), the advice's `Finding`, what `--tune` tried and found (`Tried`,
`Found`), and the `Diagnosis`: the measurements and what follows from them.

Records only: the rules that make them live in advise/ (outcome.py, advice.py and its
rules_*.py, tune.py, diagnose.py), and the report (report/) renders them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

from ..core.results import Measurements, Note, PointResult, Record
from ..core.stats import Contrast, Throughput
from .drops import StageCost
from .verdict import Verdict


@dataclasses.dataclass(frozen=True)
class Outcome(Record):
    """One candidate against the user's settings: status helps, no gain, slower, failed or
    not measured; the speed-up (candidate over user: the geometric mean of its pairs of
    visits), the least relative change that is real at its noise (`spread`: the
    comparison's threshold, at least the 5% floor), the speed-up's interval at the level
    it is asked at (`low`, `high`), the pairs it came from, and the time per batch of each
    side, the user's first (total steps over total time)."""

    _keep_none: ClassVar[tuple] = ()
    settings: dict = dataclasses.field(default_factory=dict)
    status: str = "not measured"
    speedup: Optional[float] = None
    spread: Optional[float] = None
    reason: Optional[str] = None
    ms_per_batch: Optional[tuple] = None
    low: Optional[float] = None
    high: Optional[float] = None
    pairs: Optional[int] = None
    base: Optional[dict] = None  # measured against these settings, not the user's (core.trials.Trial.base)


@dataclasses.dataclass(frozen=True)
class Checked(Record):
    """An advice item's `verified` block: the best candidate's figure, the prediction
    beside it, and every candidate tried."""

    _nested: ClassVar[dict] = {"tried": Outcome}
    _keep_none: ClassVar[tuple] = ("speedup", "spread", "predicted")
    status: str = "not measured"
    speedup: Optional[float] = None
    spread: Optional[float] = None
    settings: Optional[dict] = None
    predicted: Optional[float] = None
    tried: tuple = ()
    source: Optional[str] = None
    reason: Optional[str] = None
    ms_per_batch: Optional[tuple] = None
    low: Optional[float] = None  # the speed-up's interval (Outcome)
    high: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Finding(Record):
    """One thing to change: `kind` (num_workers, cores, pin_memory, persistent_workers,
    uint8_payload, collate, storage, augment, reorder, handoff, batch_size, syncs, allocator), the
    stage it is about (or "step", or "epoch" for the workers started again every epoch),
    the message, the measured numbers and settings it rests on, and what the advice's
    check measured of it (outcome.verified), once checked.

    The message is composed (`compose`) action first: `action`, what to do, in the
    imperative; with its figure (what the check measured, else the finding's own
    `figure`); then `why`, the reasoning; then what the check measured in detail, or
    `check`, how to check it yourself, when the tool did not."""

    _nested: ClassVar[dict] = {"verified": Checked}
    kind: str
    stage: str
    message: str
    numbers: dict = dataclasses.field(default_factory=dict)
    verified: Optional[Checked] = None
    action: Optional[str] = None
    figure: Optional[str] = None
    why: Optional[str] = None
    check: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Tried:
    """One candidate as measured: its settings (those that differ from the user's), the
    effective whole, the trial's outcome, and the log of its speed-up over the user's
    with its noise, from its pairs of visits (outcome.compared)."""

    settings: dict
    full: dict
    outcome: Outcome
    log: Optional[Contrast] = None
    item: str = "tune"

    @property
    def speedup(self) -> Optional[float]:
        return self.outcome.speedup

    @property
    def ms_per_batch(self) -> Optional[float]:
        return self.outcome.ms_per_batch[1] if self.outcome.ms_per_batch else None


@dataclasses.dataclass(frozen=True)
class Found:
    """What the search found: every candidate tried, the best (None: nothing beat the
    user's within the noise), whether it reached the ceiling, the ceiling as a speed-up
    over the user's, the summary sentence, and the patched script against the original."""

    tried: tuple
    best: Optional[Tried]
    at_ceiling: bool
    ceiling_speedup: Optional[float]
    summary: str
    applied: Optional[Outcome] = None
    agrees: Optional[bool] = None  # the patched script's speed-up and the best's, within their combined noise
    compared: Optional[str] = None  # which figure the patched script is compared with, in words (advise/tune.written)
    whole: bool = True  # False: that figure is the settings' alone, the change holds a fix too
    fix: str = ""  # the fix the change holds, as the summary's last sentence says it (advise/written.fix_said)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The measurements and what follows from them (see the module's docstring)."""

    measurements: Measurements
    verdict: Verdict
    points: tuple[PointResult, ...]
    notes: tuple[Note, ...] = ()
    advice: tuple[Finding, ...] = ()
    summary: str = ""
    tune: Optional[Found] = None  # what the search of --tune found (tune.summarize)

    # -- the measurements, as the report reads them ----------------------------------

    @property
    def bottleneck(self) -> Optional[str]:
        return self.verdict.bottleneck

    @property
    def device(self) -> str:
        return self.measurements.device

    @property
    def batch_size(self) -> float:
        return self.measurements.batch_size

    @property
    def batch_size_source(self) -> str:
        return self.measurements.batch_size_source

    @property
    def loader(self) -> dict:
        return self.measurements.loader

    @property
    def cache(self):
        return self.measurements.cache

    @property
    def run(self):
        return self.measurements.run

    @property
    def isolated(self):
        return self.measurements.isolated

    @property
    def syncs(self):
        return self.measurements.syncs

    @property
    def verification(self):
        return self.measurements.verification

    @property
    def complete(self) -> bool:
        return self.measurements.complete

    @property
    def interrupted(self) -> bool:
        return self.measurements.interrupted

    @property
    def warnings(self) -> tuple[str, ...]:
        """The notes as the report prints them."""
        return tuple(n.message for n in self.notes)

    # -- queries ------------------------------------------------------------------------

    def point(self, name: str) -> PointResult:
        for p in self.points:
            if p.point == name:
                return p
        raise KeyError(name)

    def stage(self, name: str) -> StageCost:
        for s in self.verdict.stages:
            if s.stage == name:
                return s
        raise KeyError(name)

    def throughput(self, name: str) -> Optional[Throughput]:
        """The windows of a point measured ok, else None."""
        p = next((p for p in self.points if p.point == name), None)
        return p.throughput if p is not None and p.status == "ok" else None

    def sigma(self, name: str) -> Optional[float]:
        """A point's own standard error of seconds per batch as the verdict weighs it (the
        ordered fit's weight: noise.Noise.point_sigma), else None."""
        noise = self.verdict.noise
        return noise.point_sigma(name) if noise is not None and name in noise.mu else None

    def drop_sigma(self, upper: str, lower: str) -> Optional[float]:
        """The noise of t(lower) - t(upper) as the verdict weighs it (noise.Noise: from
        the per-round differences), else None."""
        c = self.verdict.drop(lower, upper)
        return None if c is None else c.sigma

    def measured_rate(self, name: str) -> Optional[float]:
        """A point's own samples/s before the ordered fit: its time in a middling round
        (noise.Noise, the rounds' shared factor taken out), or its windows' median where
        the windows have no rounds; None when not measured."""
        noise = self.verdict.noise
        if noise is not None and name in noise.mu:
            return self.batch_size / noise.time(name)
        tp = self.throughput(name)
        return tp.samples_per_sec if tp else None

    def rate(self, name: str) -> Optional[float]:
        """The samples/s the report shows for a point: the verdict's fitted estimate
        (verdict.decide), else the median of its windows; None when not measured."""
        t = self.verdict.fitted.get(name)
        if t:
            return self.batch_size / t
        tp = self.throughput(name)
        return tp.samples_per_sec if tp else None
