"""Every recommended setting measured before it is printed.

When the advice recommends settings the tool can apply itself (num_workers, pin_memory,
prefetch_factor, persistent_workers, the step's torch threads), the full pipeline runs
with them and with the user's own in alternating visits (user, candidate, candidate,
user, ...: a machine drifting over the trial weighs on both alike), within the
verification's budget. The speed-up is the geometric mean of the pairs of visits taken
next to each other, real when beyond the noise by the one comparison (outcome.py,
stats.compare on stats.paired). A candidate that does not help
is said so, and the next one is tried while the budget lasts (the workers with fewer
torch threads, the workers alone, one worker fewer).

The check's schedule of every item's candidates is turns.py (`Trials`): it yields the
visits of the full pipeline to drive and keeps their raw windows in the report's
`verification`; outcome.py derives each advice item's `verified` block from those windows.

The user's objects are never changed: every visit builds its loader from a modified
copy of the LoaderSpec, and the thread count is set for the candidate's visits only
(and restored after each, and with the rest of the user's state after the run).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..core.results import Measured, Trial, VisitWindow
from ..derive.findings import Finding, Outcome
from ..measure.experiment import Experiment
from ..measure.visit import Visit
from .outcome import APPLICABLE, FIX, THREADS, outcome


# Share of --max-seconds kept for verification by default, from the rounds that only
# settle the verdict (after the first two): a trial visits the full pipeline four times
# at least, about 1 s each on a 2-core machine, so a quarter of the default 30 s is
# about one candidate and the start of a second. A verdict that settles early leaves more.
VERIFY_SHARE = 0.25
# Visits per trial: decided after each A B B A block from MIN_BLOCKS on, given up (within
# noise) after MAX_BLOCKS. A candidate found slower stops there (it is not a fix, however
# precise the figure); one that helps goes on (budget allowing) until its figure is within
# +-TARGET_SPREAD: "1.55x (+-41%)" decides, but says little about the gain. Each later
# candidate is owed MIN_BLOCKS blocks of the budget, so the first cannot spend it all.
MIN_BLOCKS = 1
MAX_BLOCKS = 3
TARGET_SPREAD = 0.15
BLOCK = (False, True, True, False)  # True: the candidate's visit
# Candidates tried per advice item at most.
MAX_CANDIDATES = 3


# --------------------------------------------------------------------------------------
# What to try
# --------------------------------------------------------------------------------------


def candidates(finding: Finding, *, threads: int, cores: int, on_cpu: bool) -> list:
    """The settings to try for one advice item, best guess first: the applicable part of
    its recommendation; on the CPU, where workers and the step share the cores, the same
    workers with the step's threads lowered to the cores left (or, when the
    recommendation lowers them already, the workers alone); then one worker fewer
    (workers recommended to a loader without persistent workers come with
    persistent_workers=True, rules_workers.workers, and every candidate keeps it)."""
    rec = dict(finding.numbers.get("recommended") or {})
    first = {k: v for k, v in rec.items() if k in APPLICABLE}
    if not first or finding.numbers.get("not_checked"):  # an item this check cannot measure says why itself
        return []
    if FIX in first:  # a fix of the pipeline (fixes.py): the fix alone, on the user's settings
        return [first]
    out = [first]
    workers = first.get("num_workers")
    if workers:
        alone = {k: v for k, v in first.items() if k != THREADS}
        fewer = max(1, cores - workers)
        if THREADS in first:
            out.append(alone)
        elif on_cpu and threads > fewer:
            out.append(dict(first, **{THREADS: fewer}))
        if workers > 1:
            out.append(dict(first, num_workers=workers - 1))
    unique: list = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return unique[:MAX_CANDIDATES]


def trial(exp: Experiment, item: str, settings: dict, deadline: float, *, owed: int = 0,
          resume: Optional[Trial] = None, blocks: int = MAX_BLOCKS, spare: list = (), until: Optional[float] = None,
          leads: Optional[dict] = None, made: Optional[list] = None, base: Optional[dict] = None):
    """The user's settings and the candidate `settings` in A B B A blocks of full-pipeline
    visits (`alternate`), until a block ends with the candidate decided slower, or decided
    helping within TARGET_SPREAD: a Trial. The advice's check (Trials) and the search of
    --tune (tune.Search) measure each candidate so. `resume`: a trial of the same settings
    cut short by an earlier deadline (the check's, for the search), continued where it
    stopped: its visits kept, its pool (kept open when it was cut) resumed, not started
    again (a GPU machine's or a loaded 2-core machine's pool: seconds, paid once).
    `until`, `leads`: the end of the check's turn and what its visits showed (alternate),
    the trial cut there is resumed at the next; `made`: each visit started is added to it;
    `base`: the reference side's settings, where not the user's own (Trial.base)."""

    def decided(sides: dict) -> bool:
        return settled(outcome(Trial(item, dict(settings), dump(sides[False]), dump(sides[True])), exp.batch_size))
    firsts: list = []

    def visit_of(candidate: bool, visit_deadline: float) -> Visit:
        v = _visit(exp, settings if candidate else (base or {}), visit_deadline, deadline)
        if made is not None:
            made.append(v)
        if candidate and not firsts:
            firsts.append(v)
        return v
    close_sides(exp, keep=settings, spare=[*spare, base])  # a pool kept from a trial cut short, but this one's
    sides = resumed(resume) if resume is not None else None
    cut = False
    try:
        sides, error = yield from alternate(exp, "full", visit_of, deadline, owed=owed, decided=decided, sides=sides,
                                            blocks=blocks, until=until, leads=leads)
        cut = error is None and len(sides[False]) + len(sides[True]) < len(BLOCK) * MAX_BLOCKS and not decided(sides)
    finally:
        if not cut:  # the candidate's pool; the user's serves the next trial (a cut one's, its continuation)
            exp.close_kept(only=(side_key(settings),))
    started = resume.candidate_start_s if resume is not None and resume.candidate_start_s is not None else \
        pool_start(firsts[0].measured if firsts else None)
    return Trial(item, dict(settings), dump(sides[False]), dump(sides[True]), error, candidate_start_s=started,
                 base=dict(base) if base else None)


def settled(o: Outcome) -> bool:
    """A candidate's trial needs no more blocks: decided slower, or helping within
    TARGET_SPREAD (trial's stop, and the check's turns: turns.Lane)."""
    return o.status == "slower" or (o.status == "helps" and (o.spread or float("inf")) <= TARGET_SPREAD)


def resumed(t: Trial) -> dict:
    """A trial's visits as `alternate` keeps them ({side: [windows of each visit]}), in
    the A B B A order: a side whose last visit kept no window gets it back, empty."""
    sides = {False: _visits(t.user_windows), True: _visits(t.candidate_windows)}
    n, i = {False: 0, True: 0}, 0
    while n[False] < len(sides[False]) or n[True] < len(sides[True]):
        n[BLOCK[i % len(BLOCK)]] += 1
        i += 1
    return {side: sides[side] + [[] for _ in range(n[side] - len(sides[side]))] for side in sides}


def _visits(windows: tuple) -> list:
    return [[w for w in windows if w.visit == v] for v in range(1 + max((w.visit for w in windows), default=-1))]


def close_sides(exp: Experiment, keep: Optional[dict] = None, spare: list = ()) -> None:
    """Close the candidates' pools kept open (a trial cut short keeps its own for its
    continuation), but the user's side's, `keep`'s and those of the settings in `spare`."""
    kept = {side_key(s) for s in [{}, keep, *spare] if s is not None}
    exp.close_kept(only=[k for k in exp.kept if isinstance(k, str) and k.startswith("full ") and k not in kept])


def pool_start(m: Optional[Measured]) -> Optional[float]:
    """A side's start-up: its first visit's opening and first batch (its workers started,
    their first batches made), once: a kept pool pays it in no other visit."""
    if m is None or m.first_batch_seconds is None:
        return None
    return round(m.opened_seconds + m.first_batch_seconds, 3)


def fits(exp: Experiment, point: str, deadline: float, least: float = 0.0) -> bool:
    """Is there time before `deadline` for a visit of `point` with one window (`least`:
    what the side's earlier visits showed one takes, see `Lead`)? (Its first step runs
    whatever is left: a long step would outrun --max-seconds.)"""
    return deadline - exp.clock() >= max(1e-9, least, exp.least_visit_seconds(point, windows=1))


class Lead:
    """What a side's visits took, learned from its last one: the time before its first
    kept window (opening, first batch, warm-up and warm-up windows) and its longest
    window. The plan's estimate (Experiment.least_visit_seconds) knows only the step:
    a side whose loader ends its epochs and forks its workers again at each (the user's
    side of a persistent_workers trial: 0.2 s of start-up every 4 batches) or whose
    workers take long to start needs several times that, and visits given the plan's
    share ended before a window, one after the other (a busy 2-core machine: 2 windows
    in 12 s on the user's side). A visit that ended with no window counts its whole time
    for both, so the next gets at least three times as long."""

    def __init__(self) -> None:
        self.lead = self.window = 0.0

    @classmethod
    def of_point(cls, p: Any) -> "Lead":
        """A side's first guess, before its own first visit: what the bisection's visits
        of the same point took (its first batch, which started its workers, the warm-up
        steps of a visit, its longest window). Without it, a first visit given an equal
        share of a short budget ended before a window where the workers start slowly."""
        out = cls()
        tp = getattr(p, "throughput", None) if p is not None and getattr(p, "ok", False) else None
        if tp is None or not tp.windows:
            return out
        out.window = max(w.seconds for w in tp.windows)
        visits = max(1, getattr(p, "visits", 1) or 1)
        out.lead = (p.first_batch_seconds or 0.0) + p.warmup_steps / visits * tp.sec_per_batch
        return out

    def learn(self, m: Measured, seconds: float, started: bool = False) -> None:
        """From a side's last visit (`started`: it started a pool kept for the next
        visits, which resume it: its opening and first batch, the pool's start, are in
        none of them; a step of its windows stands for their first batch)."""
        if not m.windows:
            self.lead = self.window = seconds
            return
        self.window = max(w.seconds for w in m.windows)
        first = (m.windows[0].seconds / max(m.windows[0].steps, 1) if started
                 else m.opened_seconds + (m.first_batch_seconds or 0.0))
        self.lead = first + m.warmup_seconds + m.warmup_windows * self.window

    def least(self, windows: int) -> float:
        """The least time a visit of this side needs for `windows` windows (0 before any)."""
        return self.lead + windows * self.window


def alternate(exp: Experiment, point: str, visit_of: Callable[[bool, float], Visit], deadline: float, *,
              owed: int = 0, decided: Callable[[dict], bool] = lambda sides: False, blocks: int = MAX_BLOCKS,
              sides: Optional[dict] = None, until: Optional[float] = None, leads: Optional[dict] = None):
    """Two sides of a comparison in A B B A blocks of visits of `point` (a machine drifting
    over them weighs on both alike): `visit_of(side, visit_deadline)` builds a side's visit
    (False: the reference, True: the other). Until a block ends, from MIN_BLOCKS on, with
    `decided(sides)`; `blocks` blocks; the deadline; or a visit's error. Each visit gets
    an equal share of what is left, counting `owed` visits of later comparisons, and at
    least what the side's last visit showed two windows take (`Lead`; before its first,
    what the bisection's visits of the point took: Lead.of_point). Returns
    (the windows of each side, one list per visit; the error, or None). `sides`: the
    visits of a comparison cut short before, continued. `until`: the end of a turn of the
    check (Trials): no block starts after it, the one under way ends (a turn always holds
    one block: its two pairs), within `deadline`; `leads`: each side's Lead, kept from the
    turn before (updated in place). The advice's check (Trials) and
    the confirmation in the pipeline (confirm.py) are its two users."""
    sides = {False: list(sides[False]), True: list(sides[True])} if sides else {False: [], True: []}
    if leads is None:
        leads = {}
    for side in (False, True):
        leads.setdefault(side, Lead.of_point(exp.results.get(point)))
    total = len(BLOCK) * blocks
    first, began = len(sides[False]) + len(sides[True]), exp.clock()
    for i in range(first, total):
        side = BLOCK[i % len(BLOCK)]
        now = exp.clock()
        if not fits(exp, point, deadline, leads[side].least(1)):
            break
        if until is not None and i % len(BLOCK) == 0:
            if i > first and now + (now - began) > until:
                break  # the turn is over: a block as long as the last one would end after it
            began = now
        share = (deadline - now) / (total - i + owed)
        visit = visit_of(side, exp.visit_deadline(point, share, deadline, least=leads[side].least(2)))
        yield visit
        m = visit.measured
        leads[side].learn(m, exp.clock() - now, started=getattr(visit, "first_free", None) is not None)
        if m.error is not None:  # this side breaks the pipeline: say so
            return sides, f"{type(m.error).__name__}: {m.error}"[:300]
        # a visit without a window keeps its place: visit i of one side is paired with
        # visit i of the other (outcome.compared)
        sides[side].append(list(m.windows))
        if (i + 1) % len(BLOCK) == 0 and (i + 1) // len(BLOCK) >= MIN_BLOCKS and decided(sides):
            break
    return sides, None


def _visit(exp: Experiment, settings: dict, deadline: float, end: float) -> Visit:
    """One visit of the full pipeline with `settings` applied ({}: the user's own), as the
    bisection visits `full` (same dataset copy, transfer, step and plan), but with the
    epochs ending as in the user's loop: workers added are forked again every epoch
    unless persistent, and that is part of what they cost. Persistent workers start once
    (Experiment.keeps_side): their pool is kept for the side's next visits, parked
    between them, and the visit that starts it has its share counted from its first
    batch (`first_free`, up to `end`): a pool that takes seconds to start (a GPU
    machine's 16 workers: 2-3 s) pays them once, in no window and no share."""
    spec = exp.spec.with_settings(settings)
    key = side_key(settings) if exp.keeps_side(spec) else False
    visit = exp.visit("full", deadline, spec=spec, epochs=True, threads=settings.get(THREADS), end=end,
                      keep_open=key, variant=exp.variants.get(settings.get(FIX)))
    if key and key not in exp.kept:
        visit.first_free = end
    return visit


def side_key(settings: dict) -> str:
    """The key a trial side's kept pool goes by (Experiment.kept): its settings."""
    return "full " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))


def dump(visits: list) -> tuple:
    """The windows of a side's visits as the document keeps them, each with its visit."""
    return tuple(VisitWindow(w.steps, w.seconds, v) for v, windows in enumerate(visits) for w in windows)
