"""The records of the advice's check (verify.py) and --tune's search (tune.py): the raw
windows of the user's settings and a candidate's in alternating visits (Trial), apart
from the points' records: a trial measures a change, not the pipeline as it is. The
check's record (Verification) also keeps the pipeline's own fixes as it built them
(fixes.Fix).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

from .fixes import Fix
from .record import Part, Record


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



@dataclasses.dataclass(frozen=True)
class Verification(Part):
    _nested: ClassVar[dict] = {"trials": Trial, "fixes": Fix}
    budget_s: Optional[float] = None
    elapsed_s: Optional[float] = None
    trials: tuple = ()
    fixes: Optional[tuple] = None  # the pipeline's own fixes as built and checked before timing (advise/fixes.py)


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
