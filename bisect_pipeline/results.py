"""What was measured, as typed frozen values: the bottom layer. Measuring code makes
them, derivations (verdict, advice, outcome, diagnosis) read them, the report renders
what was derived; nothing here imports either.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .stats import Throughput, Window

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

    def __post_init__(self) -> None:
        # Kept at the precision of the JSON document (0.1 ms), as windows are: a report
        # rebuilt from its document renders the same.
        if self.first_batch_seconds is not None:
            object.__setattr__(self, "first_batch_seconds", round(float(self.first_batch_seconds), 4))
        object.__setattr__(self, "wait_seconds", round(float(self.wait_seconds), 6))

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
class Note:
    """A warning as a value: `kind` names what it is about (a stage, `cache`, `shm`,
    `workers`, `pipeline`, ...), `message` is what the report prints, `point` the point it
    concerns, if one."""

    kind: str
    message: str
    point: Optional[str] = None

    def __str__(self) -> str:
        return self.message
