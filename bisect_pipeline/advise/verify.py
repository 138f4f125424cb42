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

`Trials` is a schedule (as rounds.Rounds): it yields the visits of the full pipeline to
drive and keeps their raw windows in the report's `verification`; outcome.py derives
each advice item's `verified` block from those windows.

The user's objects are never changed: every visit builds its loader from a modified
copy of the LoaderSpec, and the thread count is set for the candidate's visits only
(and restored after each, and with the rest of the user's state after the run).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from ..core.results import Measured, Trial, Verification, VisitWindow
from ..derive.findings import Finding
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


# --------------------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------------------


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
    own figure while the fix of the stage in question waits (the demo at its default 30 s:
    the workers item took all 10 s, 12 visits, and the fixes read "not measured"). A
    first turn that cannot hold a block is not started (two pairs are the least figure);
    an item the budget did not reach says so, and which items took the time (`unreached`)."""

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
                                         blocks=target, leads=lane.leads, made=made,
                                         spare=[x.open_settings() for x in lanes if x is not lane])
                    self.spent += exp.clock() - began
                    if made or t.error:  # a turn that started no visit leaves the lane as it was
                        moved = True
                        lane.record(t, exp.batch_size)
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


class Lane:
    """One advice item's candidates as the check measures them, turn by turn (Trials):
    the trial of each candidate tried, the last one cut at its turn's end where it is
    undecided (resumed at the next turn, its pool kept). Done once a candidate helps
    (decided, or MAX_BLOCKS measured), or every candidate was measured without helping."""

    def __init__(self, finding: Finding, cands: list) -> None:
        self.finding, self.cands = finding, list(cands)
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

    def open_settings(self) -> Optional[dict]:
        """The settings of a trial cut at its turn's end: its pool is kept for the next."""
        return self.cands[len(self.trials) - 1] if self.open and not self.done else None

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
        decided = o.status == "slower" or (o.status == "helps" and (o.spread or float("inf")) <= TARGET_SPREAD)
        self.open = not (t.error or full or decided)
        if not self.open:
            self.leads.pop(True, None)  # the next candidate's visits are not this one's
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


def trial(exp: Experiment, item: str, settings: dict, deadline: float, *, owed: int = 0,
          resume: Optional[Trial] = None, blocks: int = MAX_BLOCKS, spare: list = (), until: Optional[float] = None,
          leads: Optional[dict] = None, made: Optional[list] = None):
    """The user's settings and the candidate `settings` in A B B A blocks of full-pipeline
    visits (`alternate`), until a block ends with the candidate decided slower, or decided
    helping within TARGET_SPREAD: a Trial. The advice's check (Trials) and the search of
    --tune (tune.Search) measure each candidate so. `resume`: a trial of the same settings
    cut short by an earlier deadline (the check's, for the search), continued where it
    stopped: its visits kept, its pool (kept open when it was cut) resumed, not started
    again (a GPU machine's or a loaded 2-core machine's pool: seconds, paid once).
    `until`, `leads`: the end of the check's turn and what its visits showed (alternate),
    the trial cut there is resumed at the next; `made`: each visit started is added to it."""

    def decided(sides: dict) -> bool:
        o = outcome(Trial(item, dict(settings), dump(sides[False]), dump(sides[True])), exp.batch_size)
        return o.status == "slower" or (o.status == "helps" and (o.spread or float("inf")) <= TARGET_SPREAD)
    firsts: list = []

    def visit_of(candidate: bool, visit_deadline: float) -> Visit:
        v = _visit(exp, settings if candidate else {}, visit_deadline, deadline)
        if made is not None:
            made.append(v)
        if candidate and not firsts:
            firsts.append(v)
        return v
    close_sides(exp, keep=settings, spare=spare)  # a pool kept from a trial cut short, but this one's
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
    return Trial(item, dict(settings), dump(sides[False]), dump(sides[True]), error, candidate_start_s=started)


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
        share of a short budget ended before a window where the workers start slowly (a
        GPU machine's 15 workers: no window in 24 s of --tune on the torchvision
        reference, every candidate 'not measured')."""
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
