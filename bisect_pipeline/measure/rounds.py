"""The points measured in one process: visits in paired rounds until the verdict settles.

Points are visited from the ceiling down, then back up, and so on; each point pools the
windows of its visits, so a machine that slows down or speeds up over the run weighs on
every point alike instead of showing up as a stage cost between points measured early
and late. After `plan.min_rounds` the verdict is checked after every round and measuring
stops once it is settled (verdict.settled); otherwise until `plan.max_rounds` or the
deadline, each further round visiting only the points that can still change the verdict
(verdict.deciding_points: around the two costliest stages, or `full` and the ceiling
when the question is the gap). A point found inconsistent (slower than one doing more
work) is measured again once, next to that point, before anything is decided, and in
each round after while leaving it out would merge the stage in question with the next
(verdict.left_out_in_question): the verdict does not settle before. Once a
step's time is known, a budget too short for the minimum rounds is said (a `budget`
note and a warning event), and what fits is measured: the ceiling and `full` first, the
ceiling's first reading the step timed alone before the points where that is its work
(Experiment.ceiling_alone). A point's replay loader with
workers is kept from one visit to the next, parked between them (Experiment.keeps,
open), until the point leaves the deciding points or the rounds end.

`Rounds` is a schedule: it yields the visits to make, and whoever drives them (the
tool's step, visit.drive; or a user's loop, loop.py) hands each back measured when it
asks for the next one.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Iterator, Optional

from ..core.results import Note, PointResult
from ..core.stats import Throughput
from ..derive.drops import POINTS, STAGES
from ..derive.verdict import SETTLE_NOISE_SCALE, deciding_points, left_out_in_question, settled
from .experiment import MEASURE_ORDER, Experiment, no_window
from .plan import tight_order
from .visit import Visit

# `full` may take this many times the time of another point per visit: without it there
# is no verdict, and its first batch (worker start-up over the real pipeline) is the
# slowest of all.
FULL_WEIGHT = 2.0
# A user's script whose batches are counted (Experiment.batches_left): the share of them
# kept from the rounds for the advice's check (verify.VERIFY_SHARE of the time), where the
# minimum rounds leave that much; the rounds come first.
BATCH_CHECK_SHARE = 0.25


class Rounds:
    """The visits of the selected points, in paired rounds; `info` is the report's
    schedule (rounds, settled, the pairs measured again, visits, verdict_s) once done."""

    def __init__(self, exp: Experiment, selected: tuple) -> None:
        self.exp = exp
        self.selected = selected
        self.info: dict = {"rounds": 0, "settled": False, "remeasured": []}
        self._budget_checked = False
        self.round = 0  # the round under way: each window is tagged with it (noise.Noise pairs by round)
        self.tight = False  # the minimum rounds do not fit in --max-seconds (_budget_check)
        self.reserve = 0  # batches of the user's script kept for the check (_batches_check)
        self._visited: Optional[int] = None  # the last round a visit measured a window in
        self._points_from = exp.start  # when the first visit began (least_verdict_seconds)
        self._least: Optional[int] = None  # least_verdict_seconds as the budget warning said it

    def __iter__(self) -> Iterator[Visit]:
        exp = self.exp
        todo = []
        for name in MEASURE_ORDER:
            if name not in self.selected or name in exp.results:
                continue
            na = exp.not_applicable(name)
            if na is not None:
                exp.results[name] = na
            else:
                todo.append(name)
        focus, decided = set(todo), False
        self._points_from = exp.clock()
        self._batches_check(todo)
        self._budget_check(todo, visited=())
        try:
            for r in range(exp.plan.max_rounds):
                self.round = r
                order = [n for n in (todo if r % 2 == 0 else todo[::-1]) if _live(exp, n) and n in focus]
                if "full" not in order:
                    break  # no verdict can come of more rounds
                # rounds that only settle a verdict already made leave the verification its
                # share; an undecided verdict has the whole budget (advice checked under a
                # verdict that is not there is worth less than the verdict)
                limit = exp.settle_deadline if decided else exp.deadline
                visits = len(order)
                while order:
                    order = self._tight_order(order, todo[0]) if r == 0 else order
                    # the visits still owed to the minimum rounds (none once they do not fit)
                    later = 0 if self.tight else visits * max(0, exp.plan.min_rounds - r - 1)
                    if not (yield from self._visit(order[0], order, later, limit)):
                        return
                    order = order[1:]
                self.info["rounds"] = r + 1
                if self.tight and r == 0:  # the second round visits only what can change the verdict
                    v = yield from self._consistent()
                    if v is None:
                        return
                    # and the points no visit has measured yet: without them there is no verdict;
                    # nor, for a ceiling read from the step alone, any noise of the rounds' gap
                    focus = self._refocus(v, {n for n in todo if _unvisited(exp.results.get(n))})
                    continue
                if r + 1 < exp.plan.min_rounds:
                    continue
                v = yield from self._consistent()
                if v is None:
                    return
                # a tie may still be told apart by more rounds: it keeps the whole budget,
                # unless --tune wants the rest for its search (exp.settle_undecided)
                decided = v.bottleneck is not None and (v.bottleneck not in ("inconclusive", "tie")
                                                        or exp.settle_undecided)
                how = _settled(exp, v)
                if how:
                    self.info.update(how)
                    break
                focus = self._refocus(v)
        finally:
            self._end(todo)

    def _end(self, todo: list) -> None:
        """The rounds' end, however they end: the kept loaders closed, the schedule's info
        (a round cut short by the time counts where it measured a point); where the minimum
        rounds did not fit and nothing interrupted them, the points no visit reached say
        what the time held (instead of a bare "out of time"): the ceiling and `full` first."""
        exp = self.exp
        exp.close_kept()
        self.info["verdict_s"] = round(exp.clock() - exp.start, 3)
        self.info["visits"] = exp.visits
        if self._visited == self.round:
            self.info["rounds"] = max(self.info["rounds"], self.round + 1)
        step = exp.step_estimate()
        if not self.tight or step is None or sys.exc_info()[0] is not None:
            return
        held = sum(1 for n in todo if exp.results.get(n) is not None)
        budget = _max_seconds(exp)
        full = exp.results.get("full")
        least = (self._least or self.least_verdict_seconds(todo)) if full is None or no_window(full) else None
        if least is not None:  # the warning's, where it said one
            self.info["least_verdict_s"] = least
        for name in todo:
            if name not in exp.results:
                exp.results[name] = PointResult(name, "not run", reason=(
                    f"out of time: --max-seconds {budget:g} held {held} of the {len(todo)} points at steps of "
                    f"{step:.2g} s, the ceiling and full first"))

    def _refocus(self, v, also: set = frozenset()) -> set:
        """The points the next rounds visit: those that can change verdict `v`
        (verdict.deciding_points) and `also`; the workers of the others are closed. Where a
        point left out merges the stage in question with the next, measuring it again comes
        before the check: the script's batches kept for the check are the rounds' too."""
        focus = deciding_points(v) | set(also)
        if left_out_in_question(v):
            self.reserve = 0
        self.exp.close_kept(keep=focus)
        return focus

    def _tight_order(self, order: list, ceiling: str) -> list:
        """The first round's visits still to make, planned where the minimum rounds do not
        fit (plan.tight_order): the ceiling (unless the step alone reads it: _read_alone)
        and `full` first, then the points around the stage the costs alone put first."""
        if not self.tight or "full" not in order:
            return order
        order = tight_order(order, ceiling, alone_first(self.exp.alone()))
        return order[1:] if self._read_alone(order[0]) else order

    def _read_alone(self, name: str) -> bool:
        """Where the minimum rounds do not fit, the first round's reading of the ceiling is
        the step timed alone before the points (Experiment.ceiling_alone), not a visit:
        the time goes to `full` and the points after it. The later rounds visit it."""
        p = self.exp.ceiling_alone(name) if self.tight and name not in self.exp.results else None
        if p is None:
            return False
        self.exp.results[name] = in_round(p, self.round)
        self._visited = self.round
        return True

    def _consistent(self):
        """The verdict after each point found inconsistent for the first time is measured
        again beside the point it contradicts (None when out of time)."""
        exp, v = self.exp, self.exp.decide()
        seen = {tuple(p) for p in self.info["remeasured"]}
        again = [i for i in v.inconsistent if (i.slower, i.faster) not in seen]
        for inc in again:
            self.info["remeasured"].append([inc.slower, inc.faster])
            for name in (inc.slower, inc.faster):
                if _live(exp, name) and not (yield from self._visit(name, [name], 1, exp.deadline)):
                    return None
        return exp.decide() if again else v

    def _visit(self, name: str, planned: list, later: int, limit: float):
        """One visit of `name`, pooled into its result once driven. Its deadline is its
        share of the time left before `limit`, counting the visits `planned` in this round
        and `later` ones; False (and nothing opened) when not even a window's time is left."""
        exp = self.exp
        left = limit - exp.clock()
        if left < max(exp.plan.window_seconds, exp.least_visit_seconds(name, windows=1)):  # not even one window fits
            p = exp.results.get(name)
            if p is not None and p.status == "ok":
                exp.results[name] = dataclasses.replace(p, stopped_by_deadline=True)
            return False
        share = _weight(name) / (sum(_weight(n) for n in planned) + later)
        cap = self._batch_share(name, share)
        if cap == 0:  # the script's batches for the rounds are used: what was measured is the measurement
            self.info["limited_by"] = "batches"
            return False
        exp.emit({"event": "point", "point": name, "index": exp.visits, "total": exp.visits + len(planned) + later})
        visit = exp.visit(name, exp.visit_deadline(name, left * share, limit), keep_open=exp.keeps(name),
                          max_steps=cap)
        yield visit
        exp.results[name] = pool(exp.results.get(name), in_round(exp.result(visit), self.round), exp.batch_size)
        if exp.results[name].ok and exp.results[name].throughput.windows[-1].round == self.round:
            self._visited = self.round
        if exp.results[name].ok:
            self._budget_check(planned, visited=(name,))
        elif no_window(exp.results[name]) and not self.tight:
            # its share ran out before one window (steps of seconds, a short epoch whose
            # workers start again): the minimum rounds do not fit as planned, so from now
            # on each visit gets the whole time left in its round, `full` next; where its
            # first batch shows the step, the warning names the budget that would fit
            self._budget_check(planned, visited=())
            if not self.tight:  # said once: the budget is tight from now on
                self.tight = True
                self._budget_note(no_window_note(name))
        return True

    def _budget_check(self, todo: list, visited: tuple) -> None:
        """Once a step's time is known (Experiment.step_estimate: the step timed alone,
        else the first point measured), say whether the minimum rounds fit in
        --max-seconds: the least time of the visits they still owe (each as
        Experiment.visit would plan it) and the time spent.
        Measuring goes on either way: what fits is measured."""
        exp = self.exp
        sec_per_step = None if self._budget_checked else exp.step_estimate()
        if sec_per_step is None:
            return
        self._budget_checked = True
        plan = exp.plan
        least = exp.least_visit_seconds
        owed = plan.min_rounds * sum(least(n) for n in todo) - sum(least(n) for n in visited)
        needed = (exp.clock() - exp.start) + owed + (exp.end - exp.deadline)
        max_s = exp.end - exp.start
        if needed <= max_s:
            return
        self.tight = True
        suggest = _tens(needed)
        exact = self.least_verdict_seconds(todo, exact=True)
        least = None if exact is None else _tens(exact)
        self._least = least if least is not None and max_s < exact and least < suggest else None
        self._budget_note(step_budget_note(sec_per_step, suggest, plan.min_rounds, len(todo), max_s, least=self._least,
                                           holds=exact is not None and exact <= max_s))

    def least_verdict_seconds(self, todo: list, exact: bool = False) -> Optional[float]:
        """About the --max-seconds that holds the first round as planned where the minimum
        rounds do not fit (plan.tight_order), once each, for a verdict the stages' costs
        alone decide (said only where they were timed): the ceiling (todo[0]) and `full`,
        which with the stages' costs alone give `none` where those put the input's work
        under MIN_REL_DROP of the step (verdict._none_unchecked), else the points around
        the stage they put first too, which a stage named needs. The time before the first
        visit, each visit's least with one window (none for a ceiling read from the step
        alone: _read_alone; not the untimed step after a pool's start, which a visit takes
        only where the time holds it: Visit._after_start), over the share of --max-seconds
        the rounds may use; rounded up to 10 s (`exact`: not rounded). None without `full`
        to measure or without the costs alone."""
        exp, alone = self.exp, self.exp.alone()
        if "full" not in todo or alone is None:
            return None
        step = exp.step_estimate() or 0.0
        light = exp.input_light(step, exp.spec.num_workers)
        names = {todo[0], "full"} | (set() if light else set(alone_first(alone)) & set(todo))
        names -= {n for n in names if exp.ceiling_alone(n) is not None}  # read from the step alone (_read_alone)
        need = self._points_from - exp.start + sum(exp.least_visit_seconds(n, windows=1) for n in names)
        usable = (exp.deadline - exp.start) / max(_max_seconds(exp), 1e-9)
        need /= max(usable, 0.1)
        return need if exact else _tens(need)

    def _batches_check(self, todo: list) -> None:
        """Where the user's script says how many batches it has left (Experiment.
        batches_left), whether the minimum rounds fit in them, said before they start (a
        `budget` note), and the batches kept for the check (BATCH_CHECK_SHARE, from what
        the minimum rounds leave)."""
        exp = self.exp
        left = exp.batches_left()
        if left is None:
            return
        need = exp.plan.min_rounds * sum(exp.least_visit_steps(n) for n in todo)
        self.reserve = max(0, min(int(BATCH_CHECK_SHARE * left), left - need))
        if need > left:
            self._budget_note(batches_note(left, need, exp.plan.min_rounds, len(todo)))

    def _batch_share(self, name: str, share: float) -> Optional[int]:
        """The most batches a visit of `name` given `share` of the rounds' time may take
        of those the script has left (less the check's), at least what one window needs;
        0 when not even that is left; None where the script's length is not known."""
        exp = self.exp
        left = exp.batches_left()
        if left is None:
            return None
        avail = left - self.reserve
        least = exp.least_visit_steps(name)
        if avail < least:
            return 0
        return max(least, int(avail * share))

    def _budget_note(self, note: Note) -> None:
        """A `budget` note in the report, and its line as a warning event."""
        self.exp.notes.append(note)
        self.exp.emit({"event": "warning", "message": note.message})


# The `budget` notes: the minimum rounds do not fit, said when it shows.

def no_window_note(name: str) -> Note:
    """A visit of `name` ran out of its share before one window (no step time known yet)."""
    return Note("budget", f"A visit of {name} got no timed window: raise --max-seconds.", point=name,
                detail="its share of --max-seconds was too short for one (slow steps, or an epoch too short for a "
                       "window after its workers start); from now on each visit gets all the time left in its round, "
                       "the full pipeline first")


def step_budget_note(sec_per_step: float, suggest: int, min_rounds: int, points: int, max_s: float, *,
                     least: Optional[int] = None, holds: bool = False) -> Note:
    """The minimum rounds at this step's time need `suggest` seconds, more than `max_s`;
    `least`: the seconds that hold one reading of each point a verdict needs (Rounds.
    least_verdict_seconds), where they are more than `max_s` too and fewer than `suggest`;
    `holds`: `max_s` holds those readings (a verdict on the costs alone may come)."""
    if least is not None:
        return Note("budget", f"Steps of {sec_per_step:.2g} s need about {least} s for a verdict on the stages' "
                              f"costs alone, {suggest} s for one the rounds settle: rerun with --max-seconds {least} "
                              "or more.",
                    detail=f"one reading of the ceiling, full and the points around the stage the costs alone put "
                           f"first (none where they put the input under 5% of the step), or at least {min_rounds} "
                           f"rounds over {points} points; "
                           f"more than --max-seconds {max_s:g}; what fits is measured")
    if holds:
        return Note("budget", f"Steps of {sec_per_step:.2g} s need about {suggest} s for a verdict the rounds settle: "
                              f"rerun with --max-seconds {suggest} for one.",
                    detail=f"at least {min_rounds} rounds over {points} points, more than --max-seconds {max_s:g}; it "
                           "holds one reading of each point a verdict on the stages' costs alone needs (the ceiling, "
                           "full and, unless they put the input under 5% of the step, the points around the stage "
                           "they put first); what fits is measured")
    return Note("budget", f"Steps of {sec_per_step:.2g} s need about {suggest} s for a verdict: rerun with "
                          f"--max-seconds {suggest}.",
                detail=f"at least {min_rounds} rounds over {points} points, more than --max-seconds {max_s:g}; what "
                       "fits is measured")


def batches_note(left: int, need: int, min_rounds: int, points: int) -> Note:
    """The user's script has `left` batches to give, the minimum rounds need `need` (a
    `batches` note: said before the rounds, superseded by what happened where the script
    did end first, report/summary.warnings)."""
    return Note("batches", f"Your script has about {left} batches left, {need} needed: run more epochs.",
                detail=f"at least {min_rounds} rounds over {points} points, each visit its first batch, a warm-up and "
                       "its shortest windows; what fits is measured")


def _settled(exp: Experiment, v) -> dict:
    """Whether the rounds stop here, as the schedule's `info` says it: settled by the
    stop rule's margin (verdict.settled), or by both witnesses at the minimum rounds
    (`witnessed`: the rest of the time goes to the work after the verdict); {} to go on."""
    if settled(v, exp.decide(SETTLE_NOISE_SCALE), exp.decide(1 / SETTLE_NOISE_SCALE)):
        return {"settled": True}
    return {"settled": True, "settled_by": "both witnesses"} if witnessed(v) else {}


def witnessed(v) -> bool:
    """Does verdict `v` name a stage on both witnesses (verdict.WITNESSES "both": the rounds
    name it beyond the noise and the stages' costs alone put it first, nowhere do they
    disagree)? The rounds then stop at their minimum, as a settled verdict does: more of
    them would only widen the margin of a stage two independent measurements name, and
    the time goes to what is still undecided after the verdict (the check, the search, the
    change's check)."""
    return v.bottleneck in STAGES and v.witness == "both" and not v.disagree and not left_out_in_question(v)


def alone_first(a) -> tuple:
    """The points around the worker stage that costs the most alone (witness.Alone), the
    drop that would name it: () without the costs alone, or where none costs anything."""
    if a is None or not a.work or max(a.work.values()) <= 0:
        return ()
    stage = max(a.work, key=a.work.get)
    i = STAGES.index(stage)
    return POINTS[i], POINTS[i + 1]


def in_round(result: PointResult, r: int) -> PointResult:
    """A visit's result with its windows tagged as measured in round `r`."""
    if result.throughput is None:
        return result
    windows = tuple(dataclasses.replace(w, round=r) for w in result.throughput.windows)
    return dataclasses.replace(result, throughput=Throughput(windows, result.throughput.batch_size))


def _unvisited(p: Optional[PointResult]) -> bool:
    """No visit has measured the point yet: no window, or only the step timed alone's (a
    tight first round's ceiling: Rounds._read_alone)."""
    return no_window(p) or (p is not None and p.step_alone and p.visits == 0)


def _live(exp: Experiment, name: str) -> bool:
    """Still to be visited: measured ok, not yet, or only out of time before a window so
    far (a later visit with more time may measure it; one that failed is done)."""
    p = exp.results.get(name)
    return p is None or p.status == "ok" or no_window(p)


def _max_seconds(exp: Experiment) -> float:
    """The run's --max-seconds (the schedule's own span where no budget was divided)."""
    return exp.budget.max_seconds if exp.budget is not None else exp.end - exp.start


def _tens(seconds: float) -> int:
    """A budget said to the user: `seconds` rounded up to 10 s."""
    return int(math.ceil(seconds / 10.0) * 10)


def _weight(name: str) -> float:
    return FULL_WEIGHT if name == "full" else 1.0


def pool(before: Optional[PointResult], now: PointResult, batch_size: float) -> PointResult:
    """A point's result over its visits: the windows of every visit. A visit that ran out
    of time before a window keeps what the others measured; one that failed fails the
    point, with the windows measured before kept in the document. The first batch is the
    first visit's: the one that started the point's workers (a kept loader's next visits
    do not start them again; rules_workers.restart reads their start from it), or the
    first that had one (a ceiling first read from the step alone: Rounds._read_alone)."""
    if before is None:
        return now
    if before.status != "ok" or before.throughput is None:
        return dataclasses.replace(now, first_batch_seconds=before.first_batch_seconds or now.first_batch_seconds)
    if now.status == "ok":
        windows = before.throughput.windows + now.throughput.windows
        return dataclasses.replace(before, throughput=Throughput(windows, batch_size),
                                   warmup_steps=before.warmup_steps + now.warmup_steps,
                                   stopped_by_deadline=before.stopped_by_deadline or now.stopped_by_deadline,
                                   visits=before.visits + 1, steady=before.steady and now.steady,
                                   wait_seconds=before.wait_seconds + now.wait_seconds,
                                   first_batch_seconds=before.first_batch_seconds or now.first_batch_seconds,
                                   **_paused(before, now))
    if now.stopped_by_deadline and now.failed_stage is None:
        return dataclasses.replace(before, stopped_by_deadline=True, **_paused(before, now))
    return dataclasses.replace(now, throughput=before.throughput, visits=before.visits + 1)


def _paused(before: PointResult, now: PointResult) -> dict:
    """The loop's pauses over both visits (a user's loop: loop.py)."""
    return {"discarded": before.discarded + now.discarded, "pauses": before.pauses + now.pauses,
            "paused_seconds": before.paused_seconds + now.paused_seconds}
