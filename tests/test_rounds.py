"""The paired-rounds schedule on a fake clock: every visit is planted (no loader runs),
so what is asserted is the schedule itself: order, pooling, the stop rule, the deadline."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch

from bisect_pipeline import rounds
from bisect_pipeline.experiment import Experiment
from bisect_pipeline.plan import Plan
from bisect_pipeline.results import PointResult
from bisect_pipeline.stats import Throughput, Window
from bisect_pipeline.verdict import POINTS
from bisect_pipeline.visit import drive
from conftest import FakeClock

BS = 10
DOWN = ["device", "collated", "augmented", "raw", "full"]  # host is skipped on CPU


def windows(ms: float, jitter: float = 0.0) -> tuple:
    return tuple(Window(10, 10 * ms / 1e3 * f) for f in (1 - jitter, 1, 1 + jitter))


class PlantedVisit:
    def __init__(self, point: str, deadline: float) -> None:
        self.point, self.deadline, self.result = point, deadline, None


def make_run(monkeypatch, ms: dict, *, seconds_per_visit: float = 1.0, max_seconds: float = 60.0,
             jitter: dict = {}, later: dict = {}, plan: Plan = Plan(), cut: set = frozenset(),
             settle_deadline: float = 0.0):
    """An Experiment whose visits are planted: point -> ms per batch (`later`: from the
    second visit on), each visit taking `seconds_per_visit` of the fake clock when driven;
    a visit whose share is shorter, or whose index is in `cut`, runs out of time before a
    window."""
    clock = FakeClock()
    seen: list = []
    spec = type("Spec", (), {"batch_size": BS, "num_workers": 2, "pin_memory": False,  # every point applies
                             "prefetch_depth": 4})()
    exp = Experiment(spec, torch.device("cpu"), plan, clock, lambda e: None, None, start=0.0, end=max_seconds,
                     deadline=max_seconds, settle_deadline=settle_deadline)

    def visit(name, deadline, **kw):
        exp.visits += 1
        seen.append((name, deadline))
        return PlantedVisit(name, deadline)

    def result(v):
        name, deadline = v.point, v.deadline
        if deadline - clock.t < seconds_per_visit or seen.index((name, deadline)) in cut:  # out of time
            clock.t = deadline
            return PointResult(name, "failed", reason="out of time before one window was measured",
                               stopped_by_deadline=True)
        clock.t += seconds_per_visit
        n = sum(1 for s, _ in seen if s == name)
        value = later.get(name, ms[name]) if n > 1 else ms[name]
        return PointResult(name, "ok", Throughput(windows(value, jitter.get(name, 0.0)), BS))

    monkeypatch.setattr(exp, "visit", visit)
    monkeypatch.setattr(exp, "result", result)
    return exp, seen, clock


def measure(exp, selected) -> dict:
    """The schedule, driven (each planted visit's time passes in `result`)."""
    schedule = rounds.Rounds(exp, selected)
    for _ in schedule:
        pass
    return schedule.info


def test_a_clear_verdict_settles_after_one_pair_of_rounds(monkeypatch):
    run, seen, _ = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61})
    info = measure(run, POINTS)
    assert [n for n, _ in seen] == DOWN + DOWN[::-1]
    assert info["rounds"] == 2 and info["settled"] and info["visits"] == 10
    assert run.results["host"].status == "skipped"
    assert all(run.results[n].visits == 2 and run.results[n].throughput.n == 6 for n in DOWN)
    assert run.decide().bottleneck == "augment"


def test_an_unsettled_verdict_takes_more_rounds_until_the_time_is_up(monkeypatch):
    # Every point's windows spread +-40%: nothing can be settled; rounds go on until
    # the deadline, and the last visit that finds no time left opens nothing.
    jitter = {n: 0.4 for n in DOWN}
    run, seen, clock = make_run(monkeypatch, {n: 40.0 for n in DOWN}, jitter=jitter, max_seconds=17.5)
    info = measure(run, POINTS)
    assert not info["settled"] and info["rounds"] >= 3
    # after the first pair of rounds only the points that can change the verdict are
    # visited: the question is the gap, so full and the ceiling
    assert all(run.results[n].status == "ok" and run.results[n].visits == 2 for n in ("collated", "augmented", "raw"))
    assert run.results["full"].visits >= 4 and run.results["device"].visits >= 4
    assert clock.t <= run.deadline and run.deadline - clock.t < run.plan.window_seconds
    assert all(deadline <= run.deadline for _, deadline in seen)
    assert run.decide().bottleneck == "inconclusive"


def test_rounds_settling_a_made_verdict_stop_at_the_settle_deadline(monkeypatch):
    # augment is named after the first pair of rounds but (planted) never settles: the
    # rounds after it stop at the settle deadline, leaving the rest for the advice's check
    monkeypatch.setattr(rounds, "settled", lambda *a: False)
    run, seen, clock = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61},
                                max_seconds=40.0, settle_deadline=20.0)
    info = measure(run, POINTS)
    assert run.decide().bottleneck == "augment" and not info["settled"]
    assert info["rounds"] >= 3 and 20.0 - run.plan.window_seconds < clock.t <= 20.0
    assert all(deadline <= 20.0 for _, deadline in seen[10:])


def test_an_undecided_verdict_may_use_the_time_kept_for_the_check(monkeypatch):
    # inconclusive after every round: the settle deadline does not apply, the rounds use
    # the whole budget (advice checked under no verdict is worth less than the verdict)
    jitter = {n: 0.4 for n in DOWN}
    run, seen, clock = make_run(monkeypatch, {n: 40.0 for n in DOWN}, jitter=jitter, max_seconds=17.5,
                                settle_deadline=11.0)
    measure(run, POINTS)
    assert run.decide().bottleneck == "inconclusive"
    assert run.deadline - clock.t < run.plan.window_seconds and clock.t > 11.0


def test_with_tune_an_undecided_verdict_stops_at_the_settle_deadline_after_the_minimum_rounds(monkeypatch):
    # the same inconclusive run under --tune (settle_undecided): the search needs the
    # ceiling and the stage costs, not a named stage, so the rounds after the minimum
    # leave it its share; the minimum rounds themselves had the whole budget
    jitter = {n: 0.4 for n in DOWN}
    run, seen, clock = make_run(monkeypatch, {n: 40.0 for n in DOWN}, jitter=jitter, max_seconds=17.5,
                                settle_deadline=11.0)
    run.settle_undecided = True
    info = measure(run, POINTS)
    assert run.decide().bottleneck == "inconclusive" and info["rounds"] >= run.plan.min_rounds
    assert clock.t <= 11.0 and all(deadline <= 11.0 for _, deadline in seen[2 * len(DOWN):])


def test_a_round_cut_short_keeps_what_the_earlier_round_measured(monkeypatch):
    # device, the last visit of round 2, runs out of time before a window: its round-1
    # windows stay, and it is still the ceiling.
    run, seen, _ = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61},
                            cut={9})
    measure(run, POINTS)
    assert seen[9][0] == "device"
    device = run.results["device"]
    assert device.status == "ok" and device.throughput.n == 3 and device.stopped_by_deadline
    assert run.decide().ceiling == "device"


def test_no_point_opens_without_a_window_of_time_left(monkeypatch):
    run, seen, clock = make_run(monkeypatch, {n: 10.0 for n in DOWN})
    clock.t = run.deadline - run.plan.window_seconds / 2
    measure(run, POINTS)
    assert seen == []
    assert all(n not in run.results for n in DOWN)  # reported as "not run: out of time"


def test_full_gets_twice_the_share_of_another_point(monkeypatch):
    run, seen, _ = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61})
    measure(run, POINTS)
    # round 1: 60 s left for 5 visits now and 5 later, full weighted 2: device's share is
    # 60 * 1/11; full, last of round 1 at t=4: 56 * 2/7 (itself and the 5 of round 2);
    # round 2, the last owed: full first, 55 * 2/6 of what is left.
    assert seen[0][1] == pytest.approx(60 / 11)
    assert seen[4][1] - 4.0 == pytest.approx(56 * 2 / 7)
    assert seen[5][1] - 5.0 == pytest.approx(55 * 2 / 6)


def test_an_inconsistent_pair_is_measured_again_once(monkeypatch):
    # device measures far slower than collated in both rounds (a process effect), then
    # fine when measured again: it is re-measured next to collated, once.
    run, seen, _ = make_run(monkeypatch, {"device": 23, "collated": 16.3, "augmented": 16.5, "raw": 50, "full": 51},
                            later={})
    info = measure(run, POINTS)
    names = [n for n, _ in seen]
    assert names[:10] == DOWN + DOWN[::-1]
    assert names[10:12] == ["device", "collated"]
    assert info["remeasured"] == [["device", "collated"]]
    v = run.decide()
    assert [(i.slower, i.faster) for i in v.inconsistent] == [("device", "collated")]
    assert v.ceiling == "collated" and v.bottleneck == "augment"
    assert info["settled"] and len(names) == 12  # measured again once, then left out: the verdict settles


def test_pool_keeps_earlier_windows_on_a_failure_and_on_running_out():
    before = PointResult("device", "ok", Throughput(windows(10), BS))
    out_of_time = PointResult("device", "failed", reason="out of time", stopped_by_deadline=True)
    kept = rounds.pool(before, out_of_time, BS)
    assert kept.status == "ok" and kept.throughput.n == 3 and kept.stopped_by_deadline
    failed = rounds.pool(before, PointResult("device", "failed", reason="boom", failed_stage="step"), BS)
    assert failed.status == "failed" and failed.throughput.n == 3 and failed.visits == 2
    both = rounds.pool(before, PointResult("device", "ok", Throughput(windows(12), BS)), BS)
    assert both.throughput.n == 6 and both.visits == 2


def budget_notes(exp) -> list:
    return [n.message for n in exp.notes if n.kind == "budget"]


def test_a_budget_too_short_for_a_heavy_step_says_how_long_a_verdict_needs(monkeypatch):
    # a 2 s step, --max-seconds 10: said once the first point gives the step's time, and
    # what fits is still measured
    heavy = {n: 2000.0 for n in DOWN}
    run, seen, _ = make_run(monkeypatch, heavy, seconds_per_visit=0.5, max_seconds=10.0)
    measure(run, POINTS)
    notes = budget_notes(run)
    assert len(notes) == 1 and "one step takes 2 s" in notes[0] and "--max-seconds 10" in notes[0], notes
    needed = int(re.search(r"needs at least about (\d+) s", notes[0]).group(1))
    assert needed > 10 and needed % 10 == 0
    assert run.results["device"].ok  # measured regardless
    again, _, _ = make_run(monkeypatch, heavy, seconds_per_visit=0.5, max_seconds=needed)
    measure(again, POINTS)
    assert budget_notes(again) == []  # the budget it names is one it would not complain of


def test_a_step_timed_alone_gives_the_budget_check_before_any_point(monkeypatch):
    run, seen, _ = make_run(monkeypatch, {n: 2000.0 for n in DOWN}, seconds_per_visit=0.5, max_seconds=10.0)
    run.step_alone = 2.0
    schedule = iter(rounds.Rounds(run, POINTS))
    next(schedule)  # the first visit is handed out, not yet driven
    assert len(budget_notes(run)) == 1 and len(seen) == 1


def test_a_light_step_in_the_default_budget_gets_no_budget_note(monkeypatch):
    run, _, _ = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61},
                         max_seconds=30.0)
    measure(run, POINTS)
    assert budget_notes(run) == []


def heavy_run(monkeypatch, ms: dict, max_seconds: float):
    """Real visits (Experiment.visit, visit.drive) on a fake clock: a 2 s step (a 1% wobble
    every other step) behind sources whose batches cost what `ms` plants beyond it."""
    clock = FakeClock()
    spec = type("Spec", (), {"batch_size": BS, "num_workers": 0, "pin_memory": False, "prefetch_depth": 0})()
    exp = Experiment(spec, torch.device("cpu"), Plan(), clock, lambda e: None, None, start=0.0, end=max_seconds,
                     deadline=max_seconds)
    exp.step_alone = 2.0  # the step timed alone (hold_allocator)
    opened: list = []
    steps = {"n": 0}

    @contextlib.contextmanager
    def source(name, spec=None, epochs=False, threads=None, calls=None):
        opened.append(name)

        def next_batch():
            clock.t += (ms[name] - 2000.0) / 1e3
            return name
        yield next_batch, None

    def step(batch):
        steps["n"] += 1
        clock.t += 2.0 * (1.01 if steps["n"] % 2 else 1.0)

    monkeypatch.setattr(exp, "open", source)
    schedule = rounds.Rounds(exp, ("device", "augmented", "raw", "full"))
    for v in schedule:
        drive(v, step)
    return exp, opened, clock, schedule.info


def test_a_two_second_step_in_thirty_seconds_measures_full_second_and_gets_a_verdict(monkeypatch):
    # 15 steps in all: windows of one step, no warm-up beyond the first batch, two
    # windows a visit, `full` right after the ceiling; the noise pooled over the points
    exp, opened, clock, info = heavy_run(monkeypatch, {"device": 2000, "augmented": 2000, "raw": 2000,
                                                       "full": 3000}, max_seconds=30.0)
    assert opened[:2] == ["device", "full"]
    assert len(budget_notes(exp)) == 1  # said before measuring, and what fits is measured
    assert clock.t <= 30.0
    assert all(exp.results[n].ok and exp.results[n].throughput.n >= 2 for n in ("device", "full"))
    v = exp.decide()
    assert v.bottleneck == "load", (v.bottleneck, v.reason)
    load = next(s for s in v.stages if s.stage == "load")
    assert load.sec_per_batch == pytest.approx(1.0, rel=0.05) and load.sigma < 0.1


def test_the_same_step_with_an_unfitted_plan_would_not_fit_one_round(monkeypatch):
    # what a 2 s step cost before the plan fitted it: 2 warm-up steps and 3 windows of
    # 3 steps a visit, 24 s; a budget of 30 s would measure barely one point
    plan = Plan()
    assert plan.least_visit_seconds(2.0) > 20 and plan.for_step(2.0).least_visit_seconds(2.0) <= 6.0
