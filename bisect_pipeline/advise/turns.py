"""The advice's check as a schedule: every item's candidates measured within the check's
budget (verify.py measures one candidate: `trial`), the items taking turns.

`Trials` is a schedule (as rounds.Rounds): it yields the visits of the full pipeline to
drive and keeps their raw windows in the report's `verification`; outcome.py derives
each advice item's `verified` block from those windows. The turns (`Lane`, in `order`,
each ending at `turn_end`) keep the first item from spending the check on the precision
of its own figure while the fix of the stage in question waits; where the workers item
helps, each fix is measured on top of its settings too (`add_on_top`).
"""

from __future__ import annotations

from typing import Iterator, Optional

from ..core.results import Trial, Verification
from ..derive.findings import Finding
from ..measure.experiment import Experiment
from ..measure.visit import Visit
from .outcome import FIX, outcome
from .verify import BLOCK, MAX_BLOCKS, MIN_BLOCKS, Lead, candidates, fits, resumed, settled, trial


class Trials:
    """The candidates of every advice item that recommends applicable settings, measured
    within `budget_s` seconds of the experiment's clock. `result` is the report's
    `verification` (results.Verification: raw windows; outcome.verified derives the rest).

    The items take turns (`Lane`, in `order`): each item's first candidate gets up to
    FIRST_BLOCKS blocks before any item gets more, then each undecided one a block more a
    turn, up to MAX_BLOCKS; an item whose candidate is done without helping goes on with
    its next candidate at its next turn. A turn ends at its share of the time left (`turn_end`:
    its visits' part of all those still planned, and at least what one block took so far),
    so the first item (the workers, say) cannot spend the check on the precision of its
    own figure while the fix of the stage in question waits. A first turn that cannot
    hold a block is not started while another item is under way (two pairs are the least
    figure); an item the budget did not reach says so, and which items took the time
    (`unreached`). Where the first item (the workers) helps, each fix gets one candidate
    more: on top of its settings, against them (`add_on_top`)."""

    def __init__(self, exp: Experiment, advice: list, *, budget_s: float, threads: int, cores: int) -> None:
        self.exp = exp
        self.budget_s = budget_s
        on_cpu = exp.device.type == "cpu"
        items = [(f, candidates(f, threads=threads, cores=cores, on_cpu=on_cpu)) for f in advice]
        self.items = order([(f, c) for f, c in items if c])
        self.result = Verification(status="not run")
        self.spent = 0.0  # the time of the turns' visits (turn_end: what a block takes)

    def __iter__(self) -> Iterator[Visit]:
        exp = self.exp
        start = exp.clock()
        deadline = start + self.budget_s
        lanes = [Lane(f, c) for f, c in self.items]
        try:
            moved = True
            while moved and any(not lane.done for lane in lanes):
                moved = False  # a pass in which no visit fitted ends the check
                for lane in lanes:
                    if lane.done:
                        continue
                    if not self._fits(deadline):
                        return
                    settings, resume = lane.next()
                    before = visits(resume) if resume is not None else 0
                    target = min(MAX_BLOCKS, before // len(BLOCK) + (FIRST_BLOCKS if resume is None else 1))
                    ahead = len(BLOCK) * target - before  # this turn's visits, in its own time
                    end = turn_end(self, lanes, lane, ahead, deadline)
                    if end is None:
                        continue
                    exp.emit({"event": "verify", "item": lane.item, "settings": settings})
                    began, made = exp.clock(), []
                    # each visit's share counts every visit planned after it, the other lanes' too
                    owed = max(0, sum(x.owed() for x in lanes) - ahead)
                    t = yield from trial(exp, lane.item, settings, deadline, owed=owed, until=end, resume=resume,
                                         blocks=target, leads=lane.leads, made=made, base=lane.base(),
                                         spare=[s for x in lanes if x is not lane for s in x.open_sides()])
                    self.spent += exp.clock() - began
                    if made or t.error:  # a turn that started no visit leaves the lane as it was
                        moved = True
                        lane.record(t, exp.batch_size)
                        add_on_top(lanes, exp.batch_size)
        finally:
            trials = tuple(t for lane in lanes for t in lane.trials)
            status = "ok" if trials else ("skipped" if not self.items else "out of time")
            self.result = Verification(status=status, budget_s=round(self.budget_s, 3),
                                       elapsed_s=round(exp.clock() - start, 3), trials=trials,
                                       reason=unreached(lanes, self.budget_s))

    def _fits(self, deadline: float) -> bool:
        return fits(self.exp, "full", deadline)


def turn_end(check: Trials, lanes: list, lane: "Lane", ahead: int, deadline: float) -> Optional[float]:
    """When `lane`'s turn of `ahead` visits ends (no block starts after it: alternate's
    `until`): at its visits' part of the time left, all lanes' planned visits counted
    (Lane.owed), and at least what one block of visits took so far in the check (before
    any, what the bisection's visits of the full pipeline took: Lead.of_point), within the
    check's deadline. None where the lane's first turn cannot hold that block while
    another lane is under way: the time left goes to that one's figure, where a block cut
    short would give this one none (two pairs are the least figure)."""
    exp = check.exp
    now = exp.clock()
    done = sum(visits(t) for x in lanes for t in x.trials)
    per_visit = check.spent / done if done else Lead.of_point(exp.results.get("full")).least(2)
    block = len(BLOCK) * per_visit
    if not lane.trials and now + block > deadline and any(x.trials and not x.done for x in lanes):
        return None
    planned = sum(x.owed() for x in lanes)
    return min(deadline, now + max((deadline - now) * ahead / max(planned, ahead, 1), block))


# Blocks a candidate's first turn plans (Trials), before any item gets more: one block's
# two pairs leave one degree of freedom, a figure only where they agree within a few %;
# two blocks' four pairs tell 10-30% on visits a few % apart. A turn whose part of the
# time is spent ends at its block's end (turn_end): a short check's first turns hold
# one block each, and the time left goes to more blocks of the items under way.
FIRST_BLOCKS = 2
# Which stage each fix moves the work of (rules_fixes): where that stage is the one in
# question, the fix of the stage itself, measured before the fixes that move less of it.
FIX_STAGES = {"decode": ("load",), "device_augment": ("augment",), "device_tail": ("collate", "handoff", "transfer")}


def order(items: list) -> list:
    """The advice's items as the check takes them: in the report's order, but the fixes of
    the pipeline (their places in it kept) first the one whose own stage is in question
    (FIX_STAGES: decode for load, the random transforms batched for augment), then the
    others: the device tail moves the conversions at the end of the transforms, a small
    part of an augment or load stage's work (the demo's ToDtype and Normalize: 8% of its
    augment), where the random candidate moves all of it."""
    def fix_of(f: Finding) -> Optional[str]:
        return (f.numbers.get("recommended") or {}).get(FIX)
    fixes = [(f, c) for f, c in items if fix_of(f)]
    own = sorted(fixes, key=lambda fc: 0 if fc[0].stage in FIX_STAGES.get(fix_of(fc[0]), ()) else 1)
    it = iter(own)
    return [next(it) if fix_of(f) else (f, c) for f, c in items]


def add_on_top(lanes: list, batch_size: float) -> None:
    """Where the first item (the workers item: settings, not a fix) is measured to help,
    each fix gets a candidate more, once: the fix on top of those settings, measured
    against them (its `base`): the user would apply both, and what the fix adds there
    is not what it adds on the user's settings (workers that hide a stage leave its fix
    less to gain)."""
    first = lanes[0] if lanes else None
    if first is None or FIX in first.cands[0] or not first.done or not first.trials:
        return
    helped = outcome(first.trials[-1], batch_size)
    if helped.status != "helps":
        return
    settings = dict(first.trials[-1].settings)
    for lane in lanes[1:]:
        fix = lane.cands[0].get(FIX)
        if fix is None or any(lane.bases):
            continue
        lane.cands.append({**settings, FIX: fix})
        lane.bases.append(settings)
        lane.done = False


class Lane:
    """One advice item's candidates as the check measures them, turn by turn (Trials):
    the trial of each candidate tried, the last one cut at its turn's end where it is
    undecided (resumed at the next turn, its pool kept). Done once a candidate helps
    (decided, or MAX_BLOCKS measured), or every candidate was measured without helping."""

    def __init__(self, finding: Finding, cands: list) -> None:
        self.finding, self.cands = finding, list(cands)
        self.bases: list = [None] * len(self.cands)  # each candidate's reference side (None: the user's)
        self.trials: list = []
        self.open = False  # the last trial is undecided and continues at the next turn
        self.leads: dict = {}  # its trial's sides' Leads (alternate), kept between its turns
        self.done = False

    @property
    def item(self) -> str:
        return self.finding.kind

    def next(self) -> tuple[dict, Optional[Trial]]:
        """The candidate to measure at this turn, and its trial so far (None: a new one)."""
        if self.open:
            return self.cands[len(self.trials) - 1], self.trials[-1]
        return self.cands[len(self.trials)], None

    def base(self) -> Optional[dict]:
        """The reference side of the candidate this turn measures (None: the user's)."""
        return self.bases[len(self.trials) - (1 if self.open else 0)]

    def open_sides(self) -> list:
        """The settings of a trial cut at its turn's end, and its base: their pools are kept
        for its next turn."""
        if not self.open or self.done:
            return []
        k = len(self.trials) - 1
        return [s for s in (self.cands[k], self.bases[k]) if s is not None]

    def owed(self) -> int:
        """The visits still planned for this item: its trial to MAX_BLOCKS, MIN_BLOCKS
        blocks of each candidate after it (the share of each visit counts them)."""
        if self.done:
            return 0
        started = len(self.trials) - (1 if self.open else 0)
        later = len(self.cands) - started - 1
        mine = visits(self.trials[-1]) if self.open else 0
        return len(BLOCK) * (MAX_BLOCKS + MIN_BLOCKS * later) - mine

    def record(self, t: Trial, batch_size: float) -> None:
        """The trial of this turn: the lane goes on with it, with the next candidate, or is done."""
        if self.open:
            self.trials[-1] = t
        else:
            self.trials.append(t)
        o = outcome(t, batch_size)
        full = visits(t) >= len(BLOCK) * MAX_BLOCKS
        self.open = not (t.error or full or settled(o))
        if not self.open:
            self.leads.clear()  # the next candidate's visits (and its base's) are not this one's
        if o.status == "helps" and not self.open:
            self.done = True  # the first candidate that helps is the one to print
        elif not self.open and len(self.trials) >= len(self.cands):
            self.done = True


def visits(t: Trial) -> int:
    """The visits a trial took (a visit that kept no window counted in its place)."""
    sides = resumed(t)
    return len(sides[False]) + len(sides[True])


def unreached(lanes: list, budget_s: float) -> Optional[str]:
    """Why an item the check did not reach was not measured: the time went to the items
    before it (which), or there was none; None where every item was reached."""
    if all(lane.trials for lane in lanes):
        return None
    took = [lane.item for lane in lanes if lane.trials]
    if not took:
        return f"out of time: the check's {budget_s:.3g} s did not hold a visit of your pipeline"
    return (f"out of time: the check's {budget_s:.3g} s went to the items measured before it ("
            + ", ".join(took) + ")")
