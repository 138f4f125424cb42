"""The points measured in one process: visits in paired rounds until the verdict settles.

Points are visited from the ceiling down, then back up, and so on; each point pools the
windows of its visits, so a machine that slows down or speeds up over the run weighs on
every point alike instead of showing up as a stage cost between points measured early
and late. After `plan.min_rounds` the verdict is checked after every round and measuring
stops once it is settled (verdict.settled); otherwise until `plan.max_rounds` or the
deadline, each further round visiting only the points that can still change the verdict
(verdict.deciding_points: around the two costliest stages, or `full` and the ceiling
when the question is the gap). A point found inconsistent (slower than one doing more
work) is measured again once, next to that point, before anything is decided.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .report import PointResult
from .run import MEASURE_ORDER, Run, visit
from .stats import Throughput
from .verdict import SETTLE_NOISE_SCALE, deciding_points, settled
# `full` may take this many times the time of another point per visit: without it there
# is no verdict, and its first batch (worker start-up over the real pipeline) is the
# slowest of all.
FULL_WEIGHT = 2.0


def measure(run: Run, selected: tuple) -> dict:
    """Measure the selected points into `run.results`; returns the schedule for the
    report's run block (rounds, settled, the pairs measured again, visits, verdict_s)."""
    todo = []
    for name in MEASURE_ORDER:
        if name not in selected or name in run.results:
            continue
        na = run.not_applicable(name)
        if na is not None:
            run.results[name] = na
        else:
            todo.append(name)
    info = {"rounds": 0, "settled": False, "remeasured": []}
    remeasured: set = set()
    focus, decided = set(todo), False
    for r in range(run.plan.max_rounds):
        order = [n for n in (todo if r % 2 == 0 else todo[::-1]) if _live(run, n) and n in focus]
        if "full" not in order:
            break  # no verdict can come of more rounds
        later = len(order) * max(0, run.plan.min_rounds - r - 1)  # visits still owed to the minimum rounds
        # rounds that only settle a verdict already made leave the verification its
        # share; an undecided verdict has the whole budget (advice checked under a
        # verdict that is not there is worth less than the verdict)
        limit = run.settle_deadline if decided else run.deadline
        for i, name in enumerate(order):
            if not _visit(run, name, order[i:], later, limit):
                return _finish(run, info)
        info["rounds"] = r + 1
        if r + 1 < run.plan.min_rounds:
            continue
        v = run.decide()
        again = [i for i in v.inconsistent if (i.slower, i.faster) not in remeasured]
        for inc in again:
            remeasured.add((inc.slower, inc.faster))
            info["remeasured"].append([inc.slower, inc.faster])
            for name in (inc.slower, inc.faster):
                if _live(run, name) and not _visit(run, name, [name], 1, run.deadline):
                    return _finish(run, info)
        if again:
            v = run.decide()
        decided = v.bottleneck not in (None, "inconclusive")
        if settled(v, run.decide(SETTLE_NOISE_SCALE), run.decide(1 / SETTLE_NOISE_SCALE)):
            info["settled"] = True
            break
        focus = deciding_points(v)
    return _finish(run, info)


def _finish(run: Run, info: dict) -> dict:
    info["verdict_s"] = round(run.clock() - run.start, 3)
    info["visits"] = run.visits
    return info


def _live(run: Run, name: str) -> bool:
    p = run.results.get(name)
    return p is None or p.status == "ok"


def _visit(run: Run, name: str, planned: list, later: int, limit: float) -> bool:
    """One visit of `name`, pooled into its result. Its deadline is its share of the time
    left before `limit`, counting the visits `planned` in this round and `later` ones;
    False (and nothing opened) when not even a window's time is left."""
    left = limit - run.clock()
    if left < run.plan.window_seconds:
        p = run.results.get(name)
        if p is not None and p.status == "ok":
            run.results[name] = dataclasses.replace(p, stopped_by_deadline=True)
        return False
    share = _weight(name) / (sum(_weight(n) for n in planned) + later)
    run.visits += 1
    run.emit({"event": "point", "point": name, "index": run.visits - 1, "total": run.visits + len(planned) - 1 + later})
    now = visit(run, name, run.clock() + left * share)
    run.results[name] = pool(run.results.get(name), now, run.batch_size)
    return True


def _weight(name: str) -> float:
    return FULL_WEIGHT if name == "full" else 1.0


def pool(before: Optional[PointResult], now: PointResult, batch_size: int) -> PointResult:
    """A point's result over its visits: the windows of every visit. A visit that ran out
    of time before a window keeps what the others measured; one that failed fails the
    point, with the windows measured before kept in the document."""
    if before is None or before.status != "ok" or before.throughput is None:
        return now
    if now.status == "ok":
        windows = before.throughput.windows + now.throughput.windows
        return dataclasses.replace(before, throughput=Throughput(windows, batch_size),
                                   warmup_steps=before.warmup_steps + now.warmup_steps,
                                   stopped_by_deadline=before.stopped_by_deadline or now.stopped_by_deadline,
                                   visits=before.visits + 1, steady=before.steady and now.steady)
    if now.stopped_by_deadline and now.failed_stage is None:
        return dataclasses.replace(before, stopped_by_deadline=True)
    return dataclasses.replace(now, throughput=before.throughput, visits=before.visits + 1)
