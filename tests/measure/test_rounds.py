"""The paired-rounds schedule on a fake clock: every visit is planted (no loader runs),
so what is asserted is the schedule itself: order, pooling, the stop rule, the deadline."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Optional

import pytest
import torch

from bisect_pipeline.measure import point_sources, rounds
from bisect_pipeline.measure.experiment import Experiment
from bisect_pipeline.measure.plan import Plan
from bisect_pipeline.core.results import PointResult
from bisect_pipeline.derive.verdict import rounds_to_decide
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.derive import witness
from bisect_pipeline.derive.drops import POINTS
from bisect_pipeline.measure.visit import drive
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
    """An Experiment whose visits are planted: point -> ms per batch, or a list of them
    cycled visit by visit (`later`: from the second visit on), each visit taking `seconds_per_visit` of the fake clock when driven;
    a visit whose share is shorter, or whose index is in `cut`, runs out of time before a
    window."""
    clock = FakeClock()
    seen: list = []
    spec = type("Spec", (), {"batch_size": BS, "num_workers": 2, "pin_memory": False,  # every point applies
                             "prefetch_depth": 4, "persistent_workers": False, "loader_cls": None, "iterable": False})()
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
        if isinstance(value, (list, tuple)):  # per visit, cycled: a machine that drifts between visits
            value = value[(n - 1) % len(value)]
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


def test_a_clear_verdict_settles_after_the_minimum_rounds(monkeypatch):
    run, seen, _ = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61})
    info = measure(run, POINTS)
    assert [n for n, _ in seen] == DOWN + DOWN[::-1] + DOWN
    assert info["rounds"] == 3 and info["settled"] and info["visits"] == 15
    assert run.results["host"].status == "skipped"
    assert all(run.results[n].visits == 3 and run.results[n].throughput.n == 9 for n in DOWN)
    # every window carries the round it was measured in
    assert [w.round for w in run.results["raw"].throughput.windows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert run.decide().bottleneck == "augment"


# full drifts from visit to visit by up to 50% of the step (its windows agree within a
# visit): the loss to input is unknown, and no number of windows would tell
DRIFT = {"device": 40.0, "collated": 40.0, "augmented": 40.0, "raw": 40.0, "full": [40.0, 60.0, 30.0, 55.0, 35.0]}


def test_an_unsettled_verdict_takes_more_rounds_until_the_time_is_up(monkeypatch):
    run, seen, clock = make_run(monkeypatch, DRIFT, max_seconds=30.0)
    info = measure(run, POINTS)
    assert not info["settled"] and info["rounds"] >= 6
    # after FEW_ROUNDS rounds of every point only the points that can change the verdict
    # are visited: the question is the gap, so full and the ceiling
    assert all(run.results[n].status == "ok" and run.results[n].visits == 4 for n in ("collated", "augmented", "raw"))
    assert run.results["full"].visits >= 6 and run.results["device"].visits >= 6
    assert clock.t <= run.deadline and run.deadline - clock.t < run.plan.window_seconds
    assert all(deadline <= run.deadline for _, deadline in seen)
    v = run.decide()
    assert v.bottleneck == "inconclusive" and "(from " in v.reason and "would tell" not in v.reason
    # the rounds that would tell are the report's next step (report/summary._next)
    gap = dataclasses.replace(v.drop("full", v.ceiling), estimate=v.gap_sec_per_batch)
    assert rounds_to_decide(gap, v.fitted["full"]) > info["rounds"]


def test_an_undecided_run_goes_on_past_24_rounds_while_time_is_left(monkeypatch):
    # full scatters +-14 ms around the ceiling's 40 ms from one visit to the next, no
    # input cost: `none` needs its loss bounded under 10%, which takes about 60 rounds of
    # full and the ceiling; the rounds are not capped before the time is up (a cap of 24,
    # as before, left it inconclusive with half the budget unused)
    ms = {"device": 40.0, "collated": 40.0, "augmented": 40.0, "raw": 40.0, "full": [26.0, 32, 36, 40, 44, 48, 54]}
    run, _, clock = make_run(monkeypatch, ms, max_seconds=120.0, seconds_per_visit=0.5)
    info = measure(run, POINTS)
    v = run.decide()
    assert v.bottleneck == "none" and info["settled"] and 24 < info["rounds"] < run.plan.max_rounds, (info, v.reason)
    assert clock.t < run.deadline
    capped, _, capped_clock = make_run(monkeypatch, ms, max_seconds=120.0, seconds_per_visit=0.5,
                                       plan=Plan(max_rounds=24))
    info = measure(capped, POINTS)
    assert capped.decide().bottleneck == "inconclusive" and info["rounds"] == 24 and capped_clock.t < 60.0


def test_a_step_alternating_between_two_speeds_is_never_a_stage_however_many_rounds(monkeypatch):
    # full is 10 ms slower or faster than the ceiling in alternate visits, no input cost:
    # the per-round differences fall in two clusters, and their median sits on one of
    # them; an error from their IQR took that median as known to +-2 ms and, after 60
    # rounds, named `load` at 9 ms a batch. The order of the values (stats.order_se)
    # says the median is anywhere between the clusters.
    for wobble in ([12, -10, 9, -11, 10, -10], [8, -7, 6, -8, 7, -6]):
        ms = {"device": 40.0, "collated": 40.0, "augmented": 40.0, "raw": 40.0, "full": [40.0 + w for w in wobble]}
        run, _, _ = make_run(monkeypatch, ms, max_seconds=120.0, seconds_per_visit=0.5)
        info = measure(run, POINTS)
        v = run.decide()
        assert v.bottleneck == "inconclusive" and info["rounds"] > 24, (wobble, info, v.reason)
        assert not any(s.significant for s in v.stages)


def test_rounds_settling_a_made_verdict_stop_at_the_settle_deadline(monkeypatch):
    # augment is named after the minimum rounds but (planted) never settles: the rounds
    # after them stop at the settle deadline, leaving the rest for the advice's check
    monkeypatch.setattr(rounds, "settled", lambda *a: False)
    run, seen, clock = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61},
                                max_seconds=40.0, settle_deadline=20.0)
    info = measure(run, POINTS)
    assert run.decide().bottleneck == "augment" and not info["settled"]
    assert info["rounds"] >= 4 and 20.0 - run.plan.window_seconds < clock.t <= 20.0
    assert all(deadline <= 20.0 for _, deadline in seen[15:])


def test_an_undecided_verdict_may_use_the_time_kept_for_the_check(monkeypatch):
    # inconclusive after every round: the settle deadline does not apply, the rounds use
    # the whole budget (advice checked under no verdict is worth less than the verdict)
    run, seen, clock = make_run(monkeypatch, DRIFT, max_seconds=25.5, settle_deadline=16.0)
    measure(run, POINTS)
    assert run.decide().bottleneck == "inconclusive"
    assert run.deadline - clock.t < 1.0 and clock.t > 16.0  # less than one (planted, 1-s) visit left


def test_with_tune_an_undecided_verdict_stops_at_the_settle_deadline_after_the_minimum_rounds(monkeypatch):
    # the same inconclusive run under --tune (settle_undecided): the search needs the
    # ceiling and the stage costs, not a named stage, so the rounds after the minimum
    # leave it its share; the minimum rounds themselves had the whole budget
    run, seen, clock = make_run(monkeypatch, DRIFT, max_seconds=25.5, settle_deadline=16.0)
    run.settle_undecided = True
    info = measure(run, POINTS)
    assert run.decide().bottleneck == "inconclusive" and info["rounds"] >= run.plan.min_rounds
    assert clock.t <= 16.0 and all(deadline <= 16.0 for _, deadline in seen[run.plan.min_rounds * len(DOWN):])


def test_a_round_cut_short_keeps_what_the_earlier_round_measured(monkeypatch):
    # device, the last visit of round 2, runs out of time before a window: its windows of
    # rounds 1 and 3 stay, and it is still the ceiling.
    run, seen, _ = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61},
                            cut={9})
    measure(run, POINTS)
    assert seen[9][0] == "device"
    device = run.results["device"]
    assert device.status == "ok" and device.throughput.n == 6 and device.stopped_by_deadline
    assert {w.round for w in device.throughput.windows} == {0, 2}
    assert run.decide().ceiling == "device"


def test_a_first_round_without_a_window_is_not_the_end_of_the_run(monkeypatch):
    # every visit of the first round runs out before a window (a short epoch whose workers
    # start again, steps of seconds): the points stay to be measured, the later rounds give
    # each visit the whole time left, and the run reaches a verdict instead of stopping
    # with nothing at a third of its budget (a MONAI tutorial at 25 s of 60)
    # a visit needs 5 s for its first window; the first share is 60 s / 16 visits
    run, seen, clock = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61},
                                seconds_per_visit=5.0)
    info = measure(run, POINTS)
    assert seen[0][0] == "device" and run.results["device"].status == "ok"  # measured again later
    assert seen[1][0] == "full"  # the first visit without a window turns the budget tight: full next
    assert all(run.results[n].status == "ok" for n in DOWN)
    assert run.decide().bottleneck == "augment" and info["rounds"] > 1
    assert any(n.message == "A visit of device got no timed window: raise --max-seconds." for n in run.notes)


def test_a_first_visit_without_a_window_names_the_budget_its_first_batch_shows(monkeypatch):
    # steps of 7 s (bf16 autocast on a CPU without bf16 units): no visit of a 60-s run
    # gets a window, and the first one's first batch says how long a verdict would take
    run, seen, clock = make_run(monkeypatch, {n: 7000.0 for n in DOWN}, seconds_per_visit=30.0)
    planted = run.result
    monkeypatch.setattr(run, "result", lambda v: dataclasses.replace(planted(v), first_batch_seconds=7.0))
    measure(run, POINTS)
    budget = [n.message for n in run.notes if n.kind == "budget"]
    assert len(budget) == 1 and budget[0].startswith("Steps of 7 s need about")
    assert "rerun with --max-seconds" in budget[0]
    assert int(budget[0].split("rerun with --max-seconds ")[1].rstrip(".")) > 60
    assert seen[1][0] == "full"  # and the budget is tight: full next


def test_no_point_opens_without_a_window_of_time_left(monkeypatch):
    run, seen, clock = make_run(monkeypatch, {n: 10.0 for n in DOWN})
    clock.t = run.deadline - run.plan.window_seconds / 2
    measure(run, POINTS)
    assert seen == []
    assert all(n not in run.results for n in DOWN)  # reported as "not run: out of time"


def test_full_gets_twice_the_share_of_another_point(monkeypatch):
    run, seen, _ = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61})
    measure(run, POINTS)
    # round 1: 60 s left for 5 visits now and 10 later, full weighted 2: device's share is
    # 60 * 1/16; full, last of round 1 at t=4: 56 * 2/12 (itself and the 10 of rounds 2
    # and 3); round 2: full first, 55 * 2/11 of what is left (round 3 owes 5 more).
    assert seen[0][1] == pytest.approx(60 / 16)
    assert seen[4][1] - 4.0 == pytest.approx(56 * 2 / 12)
    assert seen[5][1] - 5.0 == pytest.approx(55 * 2 / 11)


def test_an_inconsistent_pair_is_measured_again_once(monkeypatch):
    # device measures far slower than collated in every round (a process effect): after
    # the minimum rounds it is re-measured next to collated, once, then left out.
    run, seen, _ = make_run(monkeypatch, {"device": 23, "collated": 16.3, "augmented": 16.5, "raw": 50, "full": 51},
                            later={})
    info = measure(run, POINTS)
    names = [n for n, _ in seen]
    assert names[:15] == DOWN + DOWN[::-1] + DOWN
    assert names[15:17] == ["device", "collated"]
    assert info["remeasured"] == [["device", "collated"]]
    v = run.decide()
    assert [(i.slower, i.faster) for i in v.inconsistent] == [("device", "collated")]
    assert v.ceiling == "collated" and v.bottleneck == "augment"
    assert info["settled"] and len(names) == 17  # measured again once, then left out: the verdict settles


def test_a_point_read_slow_in_its_first_rounds_is_measured_again_not_dropped(monkeypatch):
    # raw reads 80 ms a batch in its first three visits (a burst of another program),
    # slower than full's 61, which does all its work and more: left out, it would merge
    # load and augment into "load (with augment)". The rounds measure it and full again
    # while the time lasts; raw's later visits read 50, and augment is named on its own.
    run, seen, _ = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 80, "full": 61},
                            later={"raw": [80, 80, 50]})
    info = measure(run, POINTS)
    assert info["remeasured"] == [["raw", "full"]]
    names = [n for n, _ in seen]
    assert names.count("raw") > 4  # beyond the minimum rounds and the one remeasure
    v = run.decide()
    assert not v.inconsistent and v.bottleneck == "augment", (v.bottleneck, v.reason)
    assert next(s for s in v.stages if s.stage == "augment").includes == ("augment",)
    assert info["settled"]


def test_a_point_left_out_merges_the_stage_in_question_only_when_out_of_time(monkeypatch):
    # raw reads slow at every visit (a replay that costs more than it saves): measured
    # again in every round until the rounds that settle a verdict end, then left out, and
    # load is named with augment in it
    run, seen, clock = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 80, "full": 61},
                                settle_deadline=45.0)
    info = measure(run, POINTS)
    v = run.decide()
    assert [(i.slower, i.faster) for i in v.inconsistent] == [("raw", "full")]
    assert v.bottleneck == "load" and next(s for s in v.stages if s.stage == "load").includes == ("load", "augment")
    assert not info["settled"] and clock.t > 44.0 and [n for n, _ in seen].count("raw") > 10


def test_pool_keeps_earlier_windows_on_a_failure_and_on_running_out():
    before = PointResult("device", "ok", Throughput(windows(10), BS))
    out_of_time = PointResult("device", "failed", reason="out of time", stopped_by_deadline=True)
    kept = rounds.pool(before, out_of_time, BS)
    assert kept.status == "ok" and kept.throughput.n == 3 and kept.stopped_by_deadline
    failed = rounds.pool(before, PointResult("device", "failed", reason="boom", failed_stage="step"), BS)
    assert failed.status == "failed" and failed.throughput.n == 3 and failed.visits == 2
    both = rounds.pool(before, PointResult("device", "ok", Throughput(windows(12), BS)), BS)
    assert both.throughput.n == 6 and both.visits == 2


def test_pool_keeps_the_first_batch_of_the_visit_that_started_the_workers():
    # a kept loader's later visits do not start its workers: the first visit's first
    # batch is the start the advice reads, also when that visit ran out before a window
    started = PointResult("full", "ok", Throughput(windows(10), BS), first_batch_seconds=2.5)
    later = PointResult("full", "ok", Throughput(windows(10), BS), first_batch_seconds=0.9)
    assert rounds.pool(started, later, BS).first_batch_seconds == 2.5
    late = PointResult("full", "failed", reason="out of time", stopped_by_deadline=True, first_batch_seconds=2.5)
    assert rounds.pool(late, later, BS).first_batch_seconds == 2.5
    assert rounds.pool(None, later, BS).first_batch_seconds == 0.9


def budget_notes(exp) -> list:
    return [n.message for n in exp.notes if n.kind in ("budget", "batches")]


def test_a_budget_too_short_for_a_heavy_step_says_how_long_a_verdict_needs(monkeypatch):
    # a 2 s step, --max-seconds 10: said once the first point gives the step's time, and
    # what fits is still measured
    heavy = {n: 2000.0 for n in DOWN}
    run, seen, _ = make_run(monkeypatch, heavy, seconds_per_visit=0.5, max_seconds=10.0)
    measure(run, POINTS)
    notes = budget_notes(run)
    assert len(notes) == 1 and notes[0].startswith("Steps of 2 s need about"), notes
    assert "more than --max-seconds 10;" in next(n.detail for n in run.notes if n.kind == "budget")
    needed = int(re.search(r"need about (\d+) s for a verdict: rerun with --max-seconds \1\.", notes[0]).group(1))
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


def heavy_run(monkeypatch, ms: dict, max_seconds: float, alone: Optional[witness.Alone] = None,
              wobble: tuple = (0.01, 0.0), before: float = 0.0, step_window: Optional[Window] = None, **exp_fields):
    """Real visits (Experiment.visit, visit.drive) on a fake clock: a 2 s step (by default
    a 1% wobble every other step; `wobble`: each step's share more, in turn) behind
    sources whose batches cost what `ms` plants beyond it; `alone`: the stages' costs
    alone the verdict and the plan read; `before`: seconds spent before the points (the
    caches, the step alone); `step_window`: the step alone as a window of the device
    point's work (Experiment.step_window); `exp_fields`: other Experiment fields."""
    clock = FakeClock()
    spec = type("Spec", (), {"batch_size": BS, "num_workers": 0, "pin_memory": False, "prefetch_depth": 0})()
    exp = Experiment(spec, torch.device("cpu"), Plan(), clock, lambda e: None, None, start=0.0, end=max_seconds,
                     deadline=max_seconds)
    monkeypatch.setattr(exp, "alone", lambda: alone)
    exp.step_alone = 2.0  # the step timed alone (hold_allocator)
    exp.step_window = step_window
    for k, v in exp_fields.items():
        setattr(exp, k, v)
    opened: list = []
    steps = {"n": 0}

    @contextlib.contextmanager
    def source(name, spec=None, epochs=False, threads=None, calls=None, keep=False, variant=None):
        opened.append(name)

        def next_batch():
            clock.t += (ms[name] - 2000.0) / 1e3
            return name
        yield next_batch, None

    def step(batch):
        steps["n"] += 1
        clock.t += 2.0 * (1 + wobble[(steps["n"] - 1) % len(wobble)])

    monkeypatch.setattr(exp, "open", source)
    clock.t += before
    schedule = rounds.Rounds(exp, ("device", "augmented", "raw", "full"))
    for v in schedule:
        drive(v, step)
    return exp, opened, clock, schedule.info


def test_a_two_second_step_in_thirty_seconds_says_the_budget_first_and_names_no_wrong_stage(monkeypatch):
    # one-step windows, one window a visit, no warm-up beyond the first batch, `full`
    # right after the ceiling; three rounds do not fit in 30 s: said before measuring
    exp, opened, clock, info = heavy_run(monkeypatch, {"device": 2000, "augmented": 2000, "raw": 2000,
                                                       "full": 3000}, max_seconds=30.0)
    assert opened[:2] == ["device", "full"]
    notes = budget_notes(exp)
    assert len(notes) == 1 and "rerun with --max-seconds" in notes[0]  # said before measuring, and what fits is measured
    assert clock.t <= 30.0
    assert all(exp.results[n].ok for n in ("device", "full"))
    v = exp.decide()
    assert v.bottleneck == "load" or (v.bottleneck == "tie" and v.tied[0] == "load"), (v.bottleneck, v.reason)


def test_a_heavy_step_s_first_round_is_planned_from_the_costs_alone(monkeypatch):
    # 2-s steps in 30 s: the ceiling and full first, then where the costs alone put the
    # most work: augment's points (raw, augmented), or load's (raw, before augmented)
    ms = {"device": 2000, "augmented": 2000, "raw": 3000, "full": 3000}
    by_augment = witness.Alone({"load": 0.01, "augment": 0.9, "collate": 0.001}, {"load": 0.001, "augment": 0.01,
                                                                                  "collate": 0.0001}, "serial", 0, 2)
    exp, opened, clock, _ = heavy_run(monkeypatch, ms, 30.0, alone=by_augment)
    assert opened[:4] == ["device", "full", "raw", "augmented"] and clock.t <= 30.0
    by_load = dataclasses.replace(by_augment, work={"load": 0.9, "augment": 0.01, "collate": 0.001})
    _, opened, _, _ = heavy_run(monkeypatch, {**ms, "raw": 2000}, 30.0, alone=by_load)
    assert opened[:3] == ["device", "full", "raw"]
    # without the costs alone: the points in their order after the two
    _, opened, _, _ = heavy_run(monkeypatch, ms, 30.0)
    assert opened[:4] == ["device", "full", "augmented", "raw"]
    # in 12 s, the ceiling and full only: the others say what the time held
    exp, opened, _, info = heavy_run(monkeypatch, ms, 12.0, alone=by_augment)
    assert opened == ["device", "full"] and info["rounds"] == 1  # a round cut short still counts
    assert exp.results["raw"].status == "not run" and exp.results["raw"].reason == (
        "out of time: --max-seconds 12 held 2 of the 4 points at steps of 2 s, the ceiling and full first")


def test_a_heavy_step_with_little_input_is_none_in_one_round_of_thirty_seconds(monkeypatch):
    # the detection reference: 2-s steps, 25 ms of input a batch alone, the step timed
    # alone before the points; 30 s hold one round: none on the costs alone, the rounds agreeing
    ms = {"device": 2000, "augmented": 2000, "raw": 2020, "full": 2025}
    a = witness.Alone({"load": 0.005, "augment": 0.0195, "collate": 0.0005},
                      {"load": 0.0005, "augment": 0.002, "collate": 0.00005}, "serial", 0, 2, step=2.0)
    # each step off by up to 7%, so that the rounds alone cannot bound the loss
    exp, opened, clock, info = heavy_run(monkeypatch, ms, 30.0, alone=a, wobble=(0.05, -0.03, 0.07, -0.04, 0.0))
    assert opened[:2] == ["device", "full"] and clock.t <= 30.0
    v = exp.decide()
    assert v.bottleneck == "none" and v.witness == "isolated costs", (v.bottleneck, v.reason)
    assert v.gap_rounds < 3
    monkeypatch.setattr(exp, "alone", lambda: None)
    assert exp.decide().bottleneck == "inconclusive"  # the rounds alone


def test_a_heavy_step_whose_budget_holds_only_the_ceiling_says_the_least_that_holds_a_verdict(monkeypatch):
    # a 2-s step, 10 s spent before the points, --max-seconds 16: the ceiling only (its
    # first batch and a window). The costs alone put the input far under 5% of the step:
    # the ceiling and full are what a `none` on them needs; the figure said holds both,
    # and a rerun with it measures full
    ms = {"device": 2000, "augmented": 2000, "raw": 2000, "full": 2030}
    light = witness.Alone({"load": 0.005, "augment": 0.0195, "collate": 0.0005},
                          {"load": 0.0005, "augment": 0.002, "collate": 0.00005}, "serial", 0, 2, step=2.0)
    exp, opened, _, info = heavy_run(monkeypatch, ms, 16.0, alone=light, before=10.0)
    assert opened == ["device"] and not exp.results["full"].ok
    least = info["least_verdict_s"]
    assert least == 20  # 10 s before, the ceiling's 4 s and full's 4 s, rounded up to 10 s
    note = budget_notes(exp)[0]
    assert note.startswith(f"Steps of 2 s need about {least} s for a verdict on the stages' costs alone, ") and (
        note.endswith(f"rerun with --max-seconds {least} or more."))
    again, opened, clock, info = heavy_run(monkeypatch, ms, float(least), alone=light, before=10.0)
    assert opened[:2] == ["device", "full"] and again.results["full"].ok and "least_verdict_s" not in info
    assert clock.t <= least
    # they put 0.9 s of augment in a batch: a stage named needs the points around it too,
    # which the first round visits next (raw, augmented): 4 visits of 4 s after the 10
    by_augment = witness.Alone({"load": 0.01, "augment": 0.9, "collate": 0.001},
                               {"load": 0.001, "augment": 0.01, "collate": 0.0001}, "serial", 0, 2)
    exp, opened, _, info = heavy_run(monkeypatch, ms, 16.0, alone=by_augment, before=10.0)
    assert info["least_verdict_s"] == 30
    _, opened, clock, _ = heavy_run(monkeypatch, ms, 30.0, alone=by_augment, before=10.0)
    assert opened[:4] == ["device", "full", "raw", "augmented"] and clock.t <= 30.0
    # without the costs alone no verdict rests on them: the minimum rounds' figure alone
    exp, _, _, info = heavy_run(monkeypatch, ms, 16.0, before=10.0)
    assert "least_verdict_s" not in info and budget_notes(exp)[0].endswith("for a verdict: rerun with --max-seconds 60.")


def test_a_tight_first_round_reads_the_ceiling_from_the_step_alone_and_gives_full_its_visit(monkeypatch):
    # the budget of the test above that held only the ceiling (10 s before the points, 16 s
    # in all): with the step alone a window of the device point's work, the first round
    # makes no visit of the ceiling, full gets its 4 s, and the costs alone say none
    ms = {"device": 2000, "augmented": 2000, "raw": 2000, "full": 2030}
    light = witness.Alone({"load": 0.005, "augment": 0.0195, "collate": 0.0005},
                          {"load": 0.0005, "augment": 0.002, "collate": 0.00005}, "serial", 0, 2, step=2.0)
    exp, opened, clock, info = heavy_run(monkeypatch, ms, 16.0, alone=light, before=10.0, step_window=Window(1, 2.0))
    assert opened == ["full"] and clock.t <= 16.0 and "least_verdict_s" not in info
    device = exp.results["device"]
    assert device.step_alone and device.visits == 0 and device.first_batch_seconds is None
    assert [(w.steps, w.seconds, w.round) for w in device.throughput.windows] == [(1, 2.0, 0)]
    v = exp.decide()
    assert v.bottleneck == "none" and v.witness == "isolated costs", (v.bottleneck, v.reason)
    assert "the step read 2000.0 ms alone (the ceiling's reading)" in v.reason and "in the loop" not in v.reason
    # the budget note asks for the rounds' figure only: the one reading of each is held
    note = budget_notes(exp)[0]
    assert note.startswith("Steps of 2 s need about ") and " s for a verdict the rounds settle: rerun with" in note
    # with more time the later rounds visit the ceiling, pooled with its first reading
    exp, opened, _, info = heavy_run(monkeypatch, ms, 34.0, alone=light, before=10.0, step_window=Window(1, 2.0))
    assert opened[0] == "full" and "device" in opened and info["rounds"] >= 2
    device = exp.results["device"]
    assert device.step_alone and device.visits == opened.count("device")
    assert device.first_batch_seconds == pytest.approx(2.0, rel=0.02)  # its first visit's
    rounds_read = [w.round for w in device.throughput.windows]
    assert rounds_read[0] == 0 and all(r > 0 for r in rounds_read[1:]) and len(rounds_read) == 1 + device.visits


def test_a_ceiling_read_from_the_step_alone_is_visited_in_the_next_round_though_the_verdict_is_about_a_stage(
        monkeypatch):
    # the costs alone put 0.9 s of augment in a batch: after the first round the deciding
    # points are augment's; the ceiling, read only from the step alone, has no reading of
    # the rounds' yet (the gap's noise comes from them): the second round visits it too
    ms = {"device": 2000, "augmented": 2000, "raw": 3000, "full": 3000}
    by_augment = witness.Alone({"load": 0.01, "augment": 0.9, "collate": 0.001},
                               {"load": 0.001, "augment": 0.01, "collate": 0.0001}, "serial", 0, 2)
    exp, opened, clock, info = heavy_run(monkeypatch, ms, 48.0, alone=by_augment, before=10.0,
                                         step_window=Window(1, 2.0))
    assert opened[:3] == ["full", "raw", "augmented"] and "device" in opened[3:] and clock.t <= 48.0
    assert [w.round for w in exp.results["device"].throughput.windows] == [0, 1]
    assert exp.decide().bottleneck == "augment"


@pytest.mark.parametrize("why", ["roomy budget", "fresh copies", "user's loop", "short step", "not timed so"])
def test_the_ceiling_is_visited_where_the_step_alone_is_not_its_reading(monkeypatch, why):
    # the step alone stands for the ceiling's visit only where the rounds are tight, it is
    # the device point's work (no copy the point would hand, the tool's own step) and a
    # visit would time one step a window
    ms = {"device": 2000, "augmented": 2000, "raw": 2000, "full": 2030}
    window = {"short step": Window(1, 0.1), "not timed so": None}.get(why, Window(1, 2.0))
    fields = {"fresh copies": {"fresh": True}, "user's loop": {"loop": True}}.get(why, {})
    exp, opened, _, _ = heavy_run(monkeypatch, ms, 60.0 if why == "roomy budget" else 16.0, before=10.0,
                                  step_window=window, **fields)
    assert opened[0] == "device" and not exp.results["device"].step_alone

    exp, opened, clock, info = heavy_run(monkeypatch, {"device": 2000, "augmented": 2000, "raw": 2000,
                                                       "full": 3000}, max_seconds=60.0)
    assert budget_notes(exp) == [] and info["rounds"] == 3 and info["settled"] and clock.t <= 60.0
    v = exp.decide()
    assert v.bottleneck == "load", (v.bottleneck, v.reason)
    load = next(s for s in v.stages if s.stage == "load")
    assert load.sec_per_batch == pytest.approx(1.0, rel=0.05) and load.rounds == 3 and load.sigma < 0.1


def test_the_same_step_with_an_unfitted_plan_would_not_fit_one_round(monkeypatch):
    # what a 2 s step would cost unfitted: 2 warm-up steps and 2 windows of 3 steps a
    # visit, 18 s; fitted, 4 s (the first batch and one window of one step)
    plan = Plan()
    assert plan.least_visit_seconds(2.0) > 15 and plan.for_step(2.0).least_visit_seconds(2.0) <= 4.0


def kept_run(monkeypatch, ms: dict, max_seconds: float, fail_at: Optional[tuple] = None):
    """Real visits on a fake clock over sources that count their openings and closings;
    the loader has workers, so the rounds keep each worker point's source open."""
    clock = FakeClock()
    spec = type("Spec", (), {"batch_size": BS, "num_workers": 2, "pin_memory": False, "prefetch_depth": 0,
                             "persistent_workers": True, "loader_cls": None, "iterable": False})()
    exp = Experiment(spec, torch.device("cpu"), Plan(), clock, lambda e: None, None, start=0.0, end=max_seconds,
                     deadline=max_seconds)
    events: list = []
    fetched: dict = {}

    @contextlib.contextmanager
    def counted(name):
        events.append(("open", name))

        def next_batch():
            fetched[name] = fetched.get(name, 0) + 1
            if fail_at == (name, fetched[name]):
                raise RuntimeError("boom")
            clock.t += ms[name] / 1e3
            return name
        try:
            yield next_batch
        except BaseException as exc:
            events.append(("close", name, type(exc).__name__))
            raise
        events.append(("close", name, None))

    monkeypatch.setattr(exp, "_source", lambda name, spec, epochs, calls=None, park=False, variant=None: (counted(name), None))
    monkeypatch.setattr(point_sources, "room_for_a_pool", lambda: True)
    schedule = rounds.Rounds(exp, ("device", "augmented", "raw", "full"))
    for v in schedule:
        drive(v, lambda batch: None)
    return exp, events, schedule.info


def test_a_worker_points_loader_is_started_once_and_closed_when_no_longer_visited(monkeypatch):
    exp, events, info = kept_run(monkeypatch, {"device": 10, "augmented": 10.2, "raw": 60, "full": 61}, 60.0)
    assert info["rounds"] == 3 and info["settled"] and exp.decide().bottleneck == "augment"
    opened = [e[1] for e in events if e[0] == "open"]
    assert sorted(opened) == ["augmented", "device", "device", "device", "full", "raw"]  # device: cached, opened per visit
    assert sorted(e[1:] for e in events if e[0] == "close" and e[1] != "device") == [
        ("augmented", None), ("full", None), ("raw", None)]  # each closed once, at the end
    assert exp.kept == {} and all(exp.results[n].visits == 3 for n in ("augmented", "raw", "full"))


def test_a_kept_loader_that_fails_is_closed_with_its_error_and_the_point_fails(monkeypatch):
    exp, events, info = kept_run(monkeypatch, {"device": 10, "augmented": 10.2, "raw": 60, "full": 61}, 60.0,
                                 fail_at=("raw", 30))  # in its second visit
    assert ("close", "raw", "RuntimeError") in events
    assert exp.results["raw"].status == "failed" and exp.kept == {}
    assert [e[1] for e in events if e[0] == "open"].count("raw") == 1


def fast_script_run(monkeypatch, ms: dict, batches: int, max_seconds: float = 30.0):
    """Real visits on a fake clock for a user's script of `batches` batches (Experiment.
    batches_left counts them down as the visits hand them out): a 2 ms step that does
    not use the CPU (a GPU's) behind one worker whose sources add what `ms` plants beyond it
    (a list: visit by visit, cycled)."""
    clock = FakeClock()
    spec = type("Spec", (), {"batch_size": BS, "num_workers": 1, "pin_memory": False, "prefetch_depth": 2,
                             "persistent_workers": False, "loader_cls": None, "iterable": False})()
    exp = Experiment(spec, torch.device("cpu"), Plan().for_workers(1), clock, lambda e: None, None, start=0.0,
                     end=max_seconds, deadline=max_seconds, settle_deadline=0.75 * max_seconds, loop=True)
    handed = {"n": 0}
    exp.batches_left = lambda: batches - handed["n"]

    opened: dict = {}

    @contextlib.contextmanager
    def source(name, spec=None, epochs=False, threads=None, calls=None, keep=False, variant=None):
        opened[name] = opened.get(name, 0) + 1
        value = ms[name] if not isinstance(ms[name], list) else ms[name][(opened[name] - 1) % len(ms[name])]

        def next_batch():
            handed["n"] += 1
            clock.t += (value - 2.0) / 1e3
            return name
        yield next_batch, None

    def step(batch):
        clock.t += 2e-3

    monkeypatch.setattr(exp, "open", source)
    schedule = rounds.Rounds(exp, ("device", "collated", "augmented", "raw", "full"))
    for v in schedule:
        drive(v, step)
    return exp, handed["n"], schedule


def test_a_two_ms_step_in_a_script_of_1316_batches_gets_its_verdict_before_the_script_ends(monkeypatch):
    # the MNIST example's 14 epochs of 94 batches on a GPU: windows of 0.25 s would hold
    # 125 steps, 3 rounds over 5 points about 4,000 batches; fitted to the script's batches
    # the minimum rounds fit, with a quarter kept for the check, and nothing is said
    ms = {"device": 2.0, "collated": 2.05, "augmented": 2.1, "raw": 4.0, "full": 4.1}
    exp, used, schedule = fast_script_run(monkeypatch, ms, batches=1316)
    assert budget_notes(exp) == [] and schedule.info["rounds"] >= 3
    assert used <= 1316 - schedule.reserve and schedule.reserve == 329
    v = exp.decide()
    assert v.bottleneck == "augment", (v.bottleneck, v.reason)


def test_a_script_too_short_for_three_rounds_says_so_before_they_start(monkeypatch):
    ms = {"device": 2.0, "collated": 2.05, "augmented": 2.1, "raw": 4.0, "full": 4.1}
    exp, used, schedule = fast_script_run(monkeypatch, ms, batches=120)
    notes = budget_notes(exp)
    assert len(notes) == 1 and re.fullmatch(r"Your script has about 120 batches left, \d+ needed: run more epochs\.",
                                            notes[0]), notes
    assert used <= 120 and schedule.reserve == 0


def test_rounds_ended_by_the_script_s_batches_say_so(monkeypatch):
    # load and augment alike (a tie the rounds cannot tell apart): the rounds go on until
    # the script's batches for them are used, and say that it was the batches, not the time
    ms = {"device": 2.0, "collated": 2.05, "augmented": 2.1, "raw": [3.4, 4.8, 3.0, 4.6], "full": 6.0}
    exp, used, schedule = fast_script_run(monkeypatch, ms, batches=1316, max_seconds=60.0)
    assert exp.decide().bottleneck == "tie"
    assert used <= 1316 - schedule.reserve and schedule.info["limited_by"] == "batches"
    assert not schedule.info["settled"] and exp.clock() < 30.0
    light = {"device": 2.0, "collated": 2.05, "augmented": 2.1, "raw": 4.0, "full": 4.1}
    assert "limited_by" not in fast_script_run(monkeypatch, light, batches=1316)[2].info  # settled first


@pytest.mark.parametrize("witness", ["both", "rounds"])
def test_a_stage_both_witnesses_name_stops_the_rounds_at_their_minimum(monkeypatch, witness):
    # issue 51: the rounds past the minimum only widen the margin of a named stage; where
    # the stages' costs alone put it first too (verdict witness "both") they stop there,
    # and the time goes to the check, the search and the change's check
    run, seen, clock = make_run(monkeypatch, {"device": 10, "collated": 10.2, "augmented": 10.4, "raw": 60, "full": 61})
    decide = run.decide
    monkeypatch.setattr(run, "decide", lambda scale=1.0: dataclasses.replace(decide(scale), witness=witness))
    monkeypatch.setattr(rounds, "settled", lambda *a: False)  # the margin not yet there
    info = measure(run, POINTS)
    assert run.decide().bottleneck == "augment"
    if witness == "both":
        assert info["rounds"] == 3 and info["settled"] and info["settled_by"] == "both witnesses"
    else:
        assert info["rounds"] > 3 and not info["settled"] and "settled_by" not in info
