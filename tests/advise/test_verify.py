"""Every recommended setting measured before it is printed (verify.py, the check's turns: turns.py).

The schedule, the budget and the candidates are tested on a fake clock with planted
rates; the report's `verified` blocks from planted windows; end to end, a planted
recommendation that helps (sleeping augment, workers overlap it) and one that cannot
(CPU-bound augment on one core that the advice believes to be two).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from bisect_pipeline import BisectError, bisect
from bisect_pipeline.advise import outcome, turns, verify
from bisect_pipeline.measure import sources
from bisect_pipeline.measure.experiment import Experiment
from bisect_pipeline.measure.visit import drive
from bisect_pipeline.core.results import Measured
from bisect_pipeline.report import PointResult, Report, build
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.testing import CLASSES, FEATURES, PlantedDataset, Spin, make_loader, tiny_model
from bisect_pipeline.derive.drops import POINTS
from conftest import FAST_PLAN, FakeClock, Sleep
from test_outcome import BS, item, outcome_of, verified  # the advice items and how their trials read


# --- what to try -------------------------------------------------------------------------------


def test_candidates_start_with_the_recommendation_then_vary_the_threads_and_the_workers():
    both = item({"num_workers": 2, "torch_num_threads": 2})
    assert verify.candidates(both, threads=4, cores=4, on_cpu=True) == [
        {"num_workers": 2, "torch_num_threads": 2}, {"num_workers": 2}, {"num_workers": 1, "torch_num_threads": 2}]
    # workers alone on a CPU step using every core: the workers with the step's threads lowered next
    alone = item({"num_workers": 1})
    assert verify.candidates(alone, threads=2, cores=2, on_cpu=True) == [
        {"num_workers": 1}, {"num_workers": 1, "torch_num_threads": 1}]
    # on an accelerator the step does not use the cores: no thread candidate
    assert verify.candidates(alone, threads=2, cores=2, on_cpu=False) == [{"num_workers": 1}]
    # only the settings this tool can apply to the loop it runs
    assert verify.candidates(item({"pin_memory": True, "non_blocking": True}), threads=1, cores=2,
                             on_cpu=False) == [{"pin_memory": True}]
    assert verify.candidates(item({"env": {"MALLOC_TRIM_THRESHOLD_": "-1"}}), threads=1, cores=2, on_cpu=True) == []
    # workers started again every epoch: persistent ones, alone
    restart = item({"persistent_workers": True}, kind="persistent_workers")
    assert verify.candidates(restart, threads=2, cores=2, on_cpu=True) == [{"persistent_workers": True}]
    # workers recommended persistent (rules_workers.workers, for a loader whose workers are not) stay
    # persistent in every candidate: the measured loop ends its epochs and would fork them again
    kept = item({"num_workers": 2, "torch_num_threads": 2, "persistent_workers": True})
    assert verify.candidates(kept, threads=4, cores=4, on_cpu=True) == [
        {"num_workers": 2, "torch_num_threads": 2, "persistent_workers": True},
        {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 1, "torch_num_threads": 2, "persistent_workers": True}]
    # a fix of the pipeline itself (fixes.py): the fix alone, on the user's settings
    assert verify.candidates(item({"fix": "device_tail"}, kind="device_tail"), threads=2, cores=2, on_cpu=True) == [
        {"fix": "device_tail"}]


# --- the schedule on a fake clock --------------------------------------------------------------


class FakeRun:
    """What turns.Trials reads of an Experiment."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.device, self.batch_size = clock, torch.device("cpu"), BS
        self.events: list = []
        self.emit = self.events.append
        self.least = 0.0  # the least time of a visit (0: the step's time not known)
        self.results: dict = {}  # the bisection's points (verify.Lead.of_point)
        self.end = 0.0  # the hard end (tune.Search moves it into the change's share)
        self.kept: dict = {}  # no pool is kept (close_kept)

    def least_visit_seconds(self, name, spec=None, *, windows=None, spare=0) -> float:
        return self.least

    def visit_deadline(self, name, share, limit, spec=None, least=0.0) -> float:
        return Experiment.visit_deadline(self, name, share, limit, spec, least)

    def close_kept(self, keep=(), only=None) -> None:  # planted visits keep no pool
        return None


class PlantedVisit:
    """A visit that takes `seconds` of the fake clock (or what is left before its
    deadline) when driven and keeps `windows()`, or fails with `error`."""

    def __init__(self, clock: FakeClock, deadline: float, seconds: float, windows, error=None) -> None:
        self.clock, self.deadline, self.seconds, self.windows, self.error = clock, deadline, seconds, windows, error
        self.measured = None

    def drive(self) -> None:
        t = min(self.seconds, max(0.0, self.deadline - self.clock.t))
        self.clock.t += t
        self.measured = Measured(windows=tuple(self.windows()) if t > 0 and not self.error else (), error=self.error)


def run_trials(run, advice, **kw) -> dict:
    """turns.Trials driven: each planted visit's time passes when it is driven."""
    trials = turns.Trials(run, advice, **kw)
    for visit in trials:
        visit.drive()
    return trials.result.to_dict()  # the document's form


def plant_visits(monkeypatch, clock: FakeClock, rates: dict, visit_s: float = 1.0, jitter: float = 0.01,
                 between: float = 0.0) -> list:
    """verify's visits planted: each takes `visit_s` of the fake clock (or what is left
    before its deadline) and yields 3 windows at rates[settings] steps/s (+-jitter), the
    visit's rate moved by 1 - between, 1 + between, 1, ... in the order of the visits
    (what a machine's state does to one visit and not the next)."""
    calls: list = []

    def visit(exp, settings, deadline, end):
        g = 1 + between * ((len(calls) + 2) % 3 - 1)
        calls.append((dict(settings), clock.t, deadline))
        rate = rates[tuple(sorted(settings.items()))] * g
        return PlantedVisit(clock, deadline, visit_s,
                            lambda: [Window(10, 10 / (rate * f)) for f in (1 - jitter, 1.0, 1 + jitter)])

    monkeypatch.setattr(verify, "_visit", visit)
    return calls


USER, W1, W1T1 = (), (("num_workers", 1),), (("num_workers", 1), ("torch_num_threads", 1))


def test_a_candidate_that_helps_is_measured_in_alternating_visits_and_stops_once_decided(monkeypatch):
    clock = FakeClock(1000.0)
    calls = plant_visits(monkeypatch, clock, {USER: 10.0, W1: 20.0, W1T1: 30.0})
    out = run_trials(FakeRun(clock), [item({"num_workers": 1})], budget_s=60, threads=1, cores=2)
    assert out["status"] == "ok" and len(out["trials"]) == 1
    assert [c[0] for c in calls] == [{}, {"num_workers": 1}, {"num_workers": 1}, {}]  # A B B A, then decided
    o = outcome_of(out["trials"][0])
    assert o["status"] == "helps" and o["speedup"] == pytest.approx(2.0, rel=1e-3)
    assert 0.05 <= o["spread"] < 0.2


def test_a_candidate_that_does_not_help_is_said_so_and_the_next_one_is_tried(monkeypatch):
    clock = FakeClock(1000.0)
    plant_visits(monkeypatch, clock, {USER: 10.0, W1: 10.1, W1T1: 13.0})
    advice = [item({"num_workers": 1}, headroom={"samples_per_sec": 80.0, "samples_per_sec_if_free": 120.0})]
    out = run_trials(FakeRun(clock), advice, budget_s=60, threads=2, cores=2)
    first, second = out["trials"]
    assert first["settings"] == {"num_workers": 1} and second["settings"] == {"num_workers": 1, "torch_num_threads": 1}
    assert outcome_of(first)["status"] == "no gain"
    assert len(first["user_windows"]) == 3 * 2 * verify.MAX_BLOCKS  # undecided: every block was measured
    v = verified(advice[0], out)
    assert v.status == "helps" and v.settings == {"num_workers": 1, "torch_num_threads": 1}
    assert v.speedup == pytest.approx(1.3, rel=1e-3) and v.predicted == pytest.approx(1.5)
    assert [t.status for t in v.tried] == ["no gain", "helps"]
    text = outcome.sentence(v)
    assert "Measured before printing: 1.30\u00d7 (1.30\u2013" in text and "predicted up to 1.50\u00d7" in text
    assert "Tried first: num_workers=1: 1.01\u00d7" in text and "within noise" in text


def test_slower_everywhere_is_not_presented_as_a_fix(monkeypatch):
    clock = FakeClock(1000.0)
    plant_visits(monkeypatch, clock, {USER: 10.0, W1: 7.0, W1T1: 8.0})
    advice = [item({"num_workers": 1})]
    out = run_trials(FakeRun(clock), advice, budget_s=60, threads=2, cores=2)
    v = verified(advice[0], out)
    assert v.status == "slower" and [t.status for t in v.tried] == ["slower", "slower"]
    assert outcome.sentence(v).startswith(" Measured before printing, and not a fix on this machine as it is:")


def test_a_slower_candidate_stops_after_one_block_and_leaves_the_budget_to_the_next(monkeypatch):
    clock = FakeClock(1000.0)
    # visits +-15% apart: "slower" is decided after one block, with a figure far wider
    # than TARGET_SPREAD; a slower candidate needs no more precision
    calls = plant_visits(monkeypatch, clock, {USER: 10.0, W1T1: 3.0, W1: 30.0}, jitter=0.25, between=0.15)
    out = run_trials(FakeRun(clock), [item({"num_workers": 1, "torch_num_threads": 1})], budget_s=60,
                            threads=2, cores=2)
    first, second = out["trials"]
    o = outcome_of(first)
    assert o["status"] == "slower" and o["spread"] > verify.TARGET_SPREAD and len(first["user_windows"]) == 3 * 2
    assert second["settings"] == {"num_workers": 1} and outcome_of(second)["status"] == "helps"
    rec = {"num_workers": 1, "torch_num_threads": 1}
    assert [c[0] for c in calls[:5]] == [{}, rec, rec, {}, {}]  # one block, then the next candidate's A


def test_a_first_visit_gets_what_the_bisection_s_visits_of_full_took(monkeypatch):
    # the bisection's full: its first batch (the workers' start) 3 s, windows of 0.5 s. A
    # check of 8 s split evenly would give each visit 0.67 s, none a window; each visit
    # gets the 4 s two windows need, so one pair fits, and no visit starts that cannot
    clock = FakeClock(1000.0)
    calls = plant_visits(monkeypatch, clock, {USER: 10.0, W1: 20.0}, visit_s=1e9)
    run = FakeRun(clock)
    full = PointResult("full", "ok", Throughput((Window(5, 0.5, 0), Window(5, 0.5, 0)), BS),
                       first_batch_seconds=3.0, warmup_steps=0)
    run.results = {"full": full}
    out = run_trials(run, [item({"num_workers": 1})], budget_s=8.0, threads=1, cores=2)
    assert [c[2] - c[1] for c in calls] == [pytest.approx(4.0), pytest.approx(4.0)]
    assert verify.Lead.of_point(full).least(2) == pytest.approx(4.0)
    assert outcome_of(out["trials"][0])["status"] == "not measured"  # one pair: no figure, and said so


def test_a_first_candidate_that_stays_undecided_cannot_spend_the_next_ones_budget(monkeypatch):
    # every visit takes all of its share: the first candidate (within noise, so measured
    # for every block) may use only what the second's owed block leaves
    clock = FakeClock(1000.0)
    start = clock.t
    calls = plant_visits(monkeypatch, clock, {USER: 10.0, W1T1: 10.05, W1: 20.0}, visit_s=1e9)
    out = run_trials(FakeRun(clock), [item({"num_workers": 1, "torch_num_threads": 1})], budget_s=32,
                            threads=2, cores=2)
    first, second = out["trials"]
    assert outcome_of(first)["status"] == "no gain"
    assert outcome_of(second)["status"] == "helps"
    assert calls[0][2] - start == pytest.approx(32 / (4 * verify.MAX_BLOCKS + 4 * verify.MIN_BLOCKS))
    assert clock.t - start <= 32 + 1e-9


@pytest.mark.parametrize("budget", [0.5, 3.0, 7.0, 20.0])
def test_the_trials_stay_within_their_budget(monkeypatch, budget):
    clock = FakeClock(1000.0)
    calls = plant_visits(monkeypatch, clock, {USER: 10.0, W1: 10.0, W1T1: 10.0})
    start = clock.t
    out = run_trials(FakeRun(clock), [item({"num_workers": 1})], budget_s=budget, threads=2, cores=2)
    assert clock.t - start <= budget + 1e-9
    assert all(deadline <= start + budget + 1e-9 for _, _, deadline in calls)
    assert out["elapsed_s"] <= budget + 1e-6 and out["budget_s"] == budget


def test_no_visit_starts_where_a_window_of_the_step_would_not_fit(monkeypatch):
    # a 3 s step behind the full pipeline: a visit's first batch and one window take 6 s,
    # so 5 s left opens nothing (its first step alone would outrun --max-seconds)
    clock = FakeClock(1000.0)
    calls = plant_visits(monkeypatch, clock, {USER: 0.33, W1: 0.33, W1T1: 0.33}, visit_s=6.0)
    run = FakeRun(clock)
    run.least = 6.0
    out = run_trials(run, [item({"num_workers": 1})], budget_s=5.0, threads=2, cores=2)
    assert calls == [] and out["status"] == "out of time" and clock.t == 1000.0
    run_trials(run, [item({"num_workers": 1})], budget_s=7.0, threads=2, cores=2)
    assert len(calls) == 1 and calls[0][2] == 1006.0  # 7 s: one visit fits, given its least time, and no second


def fix_item(kind: str, stage: str):
    from bisect_pipeline.derive.findings import Finding
    return Finding(kind, stage, "Fix it.", {"recommended": {"fix": kind}, "headroom": {}})


WORKERS = {"num_workers": 1, "persistent_workers": True, "torch_num_threads": 1}
TAIL, AUGMENT = (("fix", "device_tail"),), (("fix", "device_augment"),)


def demo_like(monkeypatch, budget: float) -> tuple:
    """The demo's check on a fake clock: its items in the report's order (the workers,
    the device tail, the random transforms batched: the fix of augment, the stage in
    question), visits of at least 0.8 s (the bisection's full: 0.4 s windows) that
    disagree by a few %, the rates the demo measured (1.27x, 0.98x, 1.84x)."""
    clock = FakeClock(1000.0)
    rates = {USER: 30.0, tuple(sorted(WORKERS.items())): 38.1, TAIL: 29.4, AUGMENT: 55.2,
             # on top of the workers' settings: the random transforms batched add 1.5x, the tail nothing
             tuple(sorted({**WORKERS, "fix": "device_augment"}.items())): 57.2,
             tuple(sorted({**WORKERS, "fix": "device_tail"}.items())): 37.7}
    calls = plant_visits(monkeypatch, clock, rates, visit_s=1e9, between=0.02, jitter=0.02)
    run = FakeRun(clock)
    run.results = {"full": PointResult("full", "ok", Throughput((Window(5, 0.4, 0), Window(5, 0.4, 0)), BS),
                                       first_batch_seconds=0.0, warmup_steps=0)}
    advice = [item(WORKERS), fix_item("device_tail", "augment"), fix_item("device_augment", "augment")]
    return advice, run_trials(run, advice, budget_s=budget, threads=2, cores=2), calls, clock


def test_the_fix_of_the_stage_in_question_gets_its_pairs_beside_the_workers_in_a_short_check(monkeypatch):
    # 7.5 s (the demo's default check): the workers item took it all, the fixes "not
    # measured". Turns: each item's first turn ends at a block's end once its part of
    # the time is spent; the fix of augment goes before the tail, which the time left
    # cannot hold a block of: not started, and said why
    advice, out, calls, clock = demo_like(monkeypatch, 7.5)
    assert clock.t - 1000.0 <= 7.5 + 1e-9
    by_item = {t["item"]: t for t in out["trials"]}
    assert set(by_item) == {"num_workers", "device_augment"}
    assert [c[0] for c in calls[:8]] == [{}, WORKERS, WORKERS, {}, {}, {"fix": "device_augment"},
                                         {"fix": "device_augment"}, {}]  # a block each, the fix of augment next
    workers, tail, augment = (verified(a, out) for a in advice)
    assert workers.status == "helps" and workers.speedup == pytest.approx(1.27, rel=0.05)
    assert augment.status == "helps" and augment.speedup == pytest.approx(1.84, rel=0.05)
    assert tail.status == "not measured" and tail.reason == (
        "out of time: the check's 7.5 s went to the items measured before it (num_workers, device_augment)")
    assert len(by_item["num_workers"]["user_windows"]) > 3 * 2  # the time left: more pairs of an item under way


def test_with_time_for_every_item_each_gets_its_first_turn_before_any_gets_more(monkeypatch):
    advice, out, calls, clock = demo_like(monkeypatch, 10.0)
    assert [t["item"] for t in out["trials"]] == ["num_workers", "device_augment", "device_tail"]
    firsts = [next(i for i, c in enumerate(calls) if c[0] == s) for s in (WORKERS, {"fix": "device_augment"},
                                                                           {"fix": "device_tail"})]
    assert firsts == [1, 5, 9]  # a block each before any item's second block
    workers, tail, augment = (verified(a, out) for a in advice)
    assert tail.status == "no gain" and {workers.status, augment.status} == {"helps"}
    assert out.get("reason") is None


def test_where_the_workers_help_each_fix_is_measured_on_top_of_their_settings_too(monkeypatch):
    # 30 s: every item's own figure, then each fix with the workers' settings against
    # those settings (the user would apply both), said apart from its own figure
    advice, out, calls, clock = demo_like(monkeypatch, 30.0)
    top = [t for t in out["trials"] if t.get("base")]
    assert {t["item"] for t in top} == {"device_augment", "device_tail"}
    assert all(t["base"] == WORKERS and t["settings"] == {**WORKERS, "fix": t["item"]} for t in top)
    reference = [c for c in calls if c[0] == WORKERS]
    assert len(reference) > 4 * verify.MIN_BLOCKS  # the base side is visited as the reference too
    workers, tail, augment = (verified(a, out) for a in advice)
    assert workers.status == "helps"
    assert augment.status == "helps" and augment.speedup == pytest.approx(1.84, rel=0.05)  # its own figure
    (on_top,) = [t for t in augment.tried if t.base]
    assert on_top.status == "helps" and on_top.speedup == pytest.approx(1.5, rel=0.05)
    text = outcome.sentence(augment)
    assert " On top of num_workers=1, persistent_workers=True" in text and "against those settings: the random " \
        "transforms run batched on the device: 1.5" in text
    # the headline gives both figures: the one alone is not what the user gets with the workers item
    assert outcome.figure(augment) == (f"measured {outcome._fig(augment)} on your settings; on top of the workers "
                                       f"item's settings, {outcome._fig(on_top)} more")
    assert outcome.figure(workers) == f"measured {outcome._fig(workers)}"  # nothing on top of itself
    assert [t.status for t in tail.tried if t.base] in (["no gain"], ["not measured"])
    assert clock.t - 1000.0 <= 30.0 + 1e-9


def test_a_fix_is_not_measured_on_top_of_workers_that_do_not_help(monkeypatch):
    clock = FakeClock(1000.0)
    plant_visits(monkeypatch, clock, {USER: 30.0, tuple(sorted(WORKERS.items())): 30.1, TAIL: 45.0,
                                      tuple(sorted({"num_workers": 1, "persistent_workers": True}.items())): 30.0})
    advice = [item(WORKERS), fix_item("device_tail", "handoff")]
    out = run_trials(FakeRun(clock), advice, budget_s=60.0, threads=2, cores=2)
    assert not [t for t in out["trials"] if t.get("base")]
    assert verified(advice[1], out).status == "helps" and "On top of" not in outcome.sentence(verified(advice[1], out))


def test_the_check_s_order_puts_the_fix_of_the_stage_in_question_first_among_the_fixes():
    w, tail, aug = item(WORKERS), fix_item("device_tail", "augment"), fix_item("device_augment", "augment")
    load_tail, decode = fix_item("device_tail", "load"), fix_item("decode", "load")
    assert [f for f, _ in turns.order([(w, [1]), (tail, [2]), (aug, [3])])] == [w, aug, tail]
    assert [f for f, _ in turns.order([(load_tail, [1]), (w, [2]), (decode, [3])])] == [decode, w, load_tail]
    handoff = fix_item("device_tail", "handoff")
    assert [f for f, _ in turns.order([(w, [1]), (handoff, [2]), (aug, [3])])] == [w, handoff, aug]


class SlowStartVisit:
    """A visit that spends `lead` seconds before its first window (workers forked, first
    batch, warm-up) and then times windows of `window` seconds until its deadline (3 at
    most): one given less than lead + window keeps none."""

    def __init__(self, clock: FakeClock, deadline: float, lead: float, window: float, steps: int) -> None:
        self.clock, self.deadline, self.lead, self.window, self.steps = clock, deadline, lead, window, steps
        self.measured = None

    def drive(self) -> None:
        given = max(0.0, self.deadline - self.clock.t)
        n = min(3, int((given - self.lead) / self.window + 1e-9)) if given >= self.lead else 0
        self.clock.t += min(given, self.lead + 3 * self.window)
        wins = tuple(Window(self.steps, self.window * f) for f in (1.0, 0.99, 1.01)[:n])
        self.measured = Measured(windows=wins, opened_seconds=self.lead / 2, first_batch_seconds=self.lead / 4,
                                 warmup_seconds=self.lead / 4)


def test_a_side_that_takes_longer_than_its_share_to_start_gets_what_its_last_visit_took(monkeypatch):
    # the user's side forks its workers again every 4-batch epoch: 2.5 s before its first
    # window, 0.5 s a window (a 4-batch epoch); persistent workers: 0.2 s, 0.1 s. The
    # schedule's share is 12 s / 12 visits = 1 s, the plan's least time 0.1 s: every user
    # visit ended before a window, and the trial was "not measured". Its first visit
    # shows what one takes; the next ones get it, and the trial is decided in the budget.
    clock = FakeClock(1000.0)
    calls: list = []

    def visit(exp, settings, deadline, end):
        calls.append((dict(settings), clock.t, deadline))
        return SlowStartVisit(clock, deadline, 0.2, 0.1, 8) if settings else SlowStartVisit(clock, deadline, 2.5, 0.5, 4)

    monkeypatch.setattr(verify, "_visit", visit)
    run = FakeRun(clock)
    run.least = 0.1
    restart = item({"persistent_workers": True}, kind="persistent_workers")
    out = run_trials(run, [restart], budget_s=12.0, threads=2, cores=2)
    (trial,) = out["trials"]
    users = [c for c in calls if not c[0]]
    assert users[0][2] - users[0][1] == pytest.approx(1.0)  # the first: the share, no window
    assert users[1][2] - users[1][1] == pytest.approx(3.0)  # the next: three times that (one window)
    assert all(d - t >= 3.5 - 1e-9 for _, t, d in users[2:])  # then its lead and two windows
    assert len(trial["user_windows"]) >= 3 and len({w["visit"] for w in trial["user_windows"]}) == 2
    assert not [c for c in calls if not c[0] and c[1] > 1000.0 + 12.0 - 3.0]  # none opened that cannot hold a window
    o = outcome_of(trial)
    assert o["status"] == "helps" and o["speedup"] == pytest.approx((8 / 0.1) / (4 / 0.5), rel=0.02)
    assert clock.t - 1000.0 <= 12.0 + 1e-9


class FakePool(sources.LoaderSource):
    """A parkable pool on the fake clock: its first batch after it starts takes `start_s`
    (its workers' start), each batch `ms`; `starts` counts the pools of workers started."""

    starts = 0

    def __init__(self, clock: FakeClock, start_s: float, ms: float) -> None:
        super().__init__(lambda: None)
        self.clock, self.start_s, self.ms, self.fresh = clock, start_s, ms, True

    def __enter__(self):
        self.gate = object()  # parkable (Experiment._kept)
        return self._batch

    def _batch(self):
        if self.fresh:
            self.clock.t += self.start_s
            self.fresh = False
            FakePool.starts += self.start_s > 0
        self.clock.t += self.ms / 1e3
        return torch.zeros(1)

    def park(self) -> bool:
        self._parked = True
        return True

    def resume(self) -> None:
        self._parked = False

    def __exit__(self, *exc) -> None:
        return None


def test_a_candidate_whose_fresh_pool_takes_3_s_to_its_first_batch_still_gets_its_windows(monkeypatch):
    # issue 51: on a GPU machine a candidate with 16 fresh workers took 2-3 s to its first
    # batch at every visit, and every visit ended before a window in its share. Its pool
    # (persistent workers) now starts once, in a visit whose share counts from its first
    # batch, and is parked between its visits: real visits on a fake clock, the user's
    # side 50 ms a batch (no workers), the candidate's 10 ms after a 3-s start, a 5-ms step
    from bisect_pipeline.measure import point_sources
    from bisect_pipeline.measure.plan import Plan
    from bisect_pipeline.pipeline.loader import describe

    clock = FakeClock(1000.0)
    monkeypatch.setattr(point_sources, "room_for_a_pool", lambda: True)
    FakePool.starts = 0
    spec = describe(make_loader(PlantedDataset(n=64), batch_size=BS))
    exp = Experiment(spec, torch.device("cpu"), Plan(), clock, lambda e: None, None, start=1000.0, end=1100.0,
                     deadline=1100.0)

    def source(name, spec, epochs, calls=None, park=False, variant=None):
        return (FakePool(clock, 3.0, 10.0) if spec.num_workers else FakePool(clock, 0.0, 50.0)), None
    monkeypatch.setattr(exp, "_source", source)

    def step(batch):
        clock.t += 0.005
    settings = {"num_workers": 2, "persistent_workers": True}
    schedule = verify.trial(exp, "tune", settings, 1000.0 + 12.0)
    try:
        visit = next(schedule)
        while True:
            drive(visit, step)
            visit = schedule.send(None)
    except StopIteration as stop:
        t = stop.value
    visits = {w.visit for w in t.candidate_windows}
    assert visits == {0, 1} and len({w.visit for w in t.user_windows}) == 2  # one A B B A block, every visit timed
    assert FakePool.starts == 1 and t.candidate_start_s == pytest.approx(3.015)  # started once (its first step in)
    assert not exp.kept  # the candidate's pool closed with its trial
    o = outcome.outcome(t, BS)
    assert o.status == "helps" and o.speedup == pytest.approx(55 / 15, rel=0.02)
    assert clock.t <= 1012.0 + 1e-9


def test_a_candidate_that_breaks_the_pipeline_is_a_failed_trial(monkeypatch):
    clock = FakeClock(1000.0)

    def visit(exp, settings, deadline, end):
        error = RuntimeError("DataLoader worker (pid 1) is killed by signal: Bus error") if settings else None
        return PlantedVisit(clock, deadline, 0.5, lambda: [Window(10, 1.0), Window(10, 1.0)], error)

    monkeypatch.setattr(verify, "_visit", visit)
    out = run_trials(FakeRun(clock), [item({"num_workers": 1})], budget_s=30, threads=1, cores=2)
    o = outcome_of(out["trials"][0])
    assert o["status"] == "failed" and "Bus error" in o["reason"]


# --- the report --------------------------------------------------------------------------------


def planted_report(verification: dict) -> Report:
    """An augment-bound CPU report at num_workers=0 whose advice recommends one worker."""
    ms = {"device": 10, "augmented": 11, "raw": 60, "full": 61}
    points = []
    for name in POINTS:
        if name in ms:
            wins = tuple(Window(10, 10 * ms[name] / 1e3 * f) for f in (0.99, 0.995, 1, 1.005, 1.01))
            points.append(PointResult(name, "ok", Throughput(wins, BS)))
        else:
            points.append(PointResult(name, "skipped", reason="not selected"))
    iso = {"status": "ok", "workers": {"status": "ok", "needed": 1, "worker_ms_per_batch": 50.0,
                                       "step_ms_per_batch": 10.0, "cores": 2, "available": 1, "fits": True}}
    return build(points, BS, "cpu", loader={"num_workers": 0, "pin_memory": False}, run={"cpu_count": 2},
                 isolated=iso, verification=verification)


def windows(rate: float, n: int = 6) -> list:
    return [{"steps": 10, "seconds": round(10 / (rate * (1 + 0.01 * (i % 3 - 1))), 6)} for i in range(n)]


def test_the_report_carries_predicted_and_measured_and_reads_back_the_same(tmp_path):
    ver = {"status": "ok", "budget_s": 7.5, "elapsed_s": 4.2, "trials": [
        {"item": "num_workers", "settings": {"num_workers": 1}, "user_windows": windows(16.0),
         "candidate_windows": windows(60.0), "error": None}]}
    r = planted_report(ver)
    f = next(a for a in r.advice if a.kind == "num_workers")
    assert f.verified.status == "helps" and f.verified.speedup == pytest.approx(3.75, rel=1e-3)
    assert f.verified.predicted is not None and f.verified.settings == {"num_workers": 1}
    # the action and its measured figure first (the settings measured), the check's detail beneath
    assert f.message.startswith("Set num_workers=1: measured 3.75\u00d7") and "Measured before printing" in f.message
    text = " ".join(str(r).split())  # wrapped at 80 columns
    assert "First change: set num_workers=1: measured 3.75\u00d7" in text and "measured 3.75" in r._repr_html_()
    # the prediction is the bottleneck's headroom: the summary's verdict says it, once
    said = int(r.summary.rsplit("(", 1)[1].split("%")[0])
    assert abs(said - (f.verified.predicted - 1) * 100) <= 1 and "predicted up to" not in text
    doc = r.to_dict()
    assert doc["verification"] == ver
    path = tmp_path / "r.json"
    r.save_json(str(path))
    again = Report.from_dict(json.loads(path.read_text()))
    assert again.to_dict() == doc


def test_without_a_verification_block_the_advice_is_as_written_and_off_says_so():
    r = planted_report({})
    f = next(a for a in r.advice if a.kind == "num_workers")
    assert f.verified is None and "Measured" not in f.message
    off = planted_report({"status": "off", "reason": "verification turned off (verify_seconds=0)", "trials": []})
    f = next(a for a in off.advice if a.kind == "num_workers")
    assert f.verified.status == "not measured" and "turned off" in f.message


def test_verify_seconds_is_checked():
    from conftest import planted

    model, loader = planted("augment")
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(BisectError, match="verify_seconds"):
            bisect(model, loader, verify_seconds=bad)


# --- end to end ----------------------------------------------------------------------------------


class SpinLayer(torch.nn.Module):
    """A layer whose forward costs `ms` of CPU time (a step that uses its core)."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.spin = Spin(ms)

    def forward(self, x):
        return self.spin(x)


@pytest.mark.e2e
def test_planted_workers_that_help_are_measured_and_the_users_objects_are_unchanged(no_leftover_workers):
    # 8 x 4 ms of sleeping augment per batch against a 25 ms step: at num_workers=0 they
    # add up (57 ms); one worker overlaps them (about 32 ms), a 1.6x gain
    model = tiny_model(25.0)
    loader = make_loader(PlantedDataset(n=64, transform=Sleep(4.0)), batch_size=8, num_workers=0)
    threads = torch.get_num_threads()
    r = bisect(model, loader, max_seconds=30, plan=FAST_PLAN)
    assert r.bottleneck == "augment", str(r)
    f = next(a for a in r.advice if a.kind == "num_workers")
    v = f.verified
    assert v.status == "helps" and v.speedup > 1.3, v
    assert "Measured before printing" in f.message
    assert r.to_dict()["verification"]["trials"][0]["settings"] == v.settings
    assert loader.num_workers == 0 and torch.get_num_threads() == threads  # the user's objects as they were


@pytest.mark.e2e
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")
@pytest.mark.alone  # its core to itself: under pytest -n another test's process would share it and give the
# workers its share (1.19x measured)
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # planted: more workers than cores
def test_planted_workers_that_cannot_help_are_reported_as_not_helping(monkeypatch, no_leftover_workers):
    # CPU-bound augment (8 x 6 ms of CPU time per batch) and a CPU-bound step (20 ms) on
    # ONE core, while the advice is told the machine has three: it recommends two workers
    # (then one is tried), and each competes with the step for the same core.
    from bisect_pipeline.measure import isolate

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    monkeypatch.setattr(isolate, "cores", lambda: 3)
    try:
        model = torch.nn.Sequential(SpinLayer(20.0), torch.nn.Linear(FEATURES, CLASSES))
        loader = make_loader(PlantedDataset(n=64, transform=Spin(6.0)), batch_size=8, num_workers=0)
        r = bisect(model, loader, max_seconds=40, plan=FAST_PLAN)
    finally:
        os.sched_setaffinity(0, before)
    assert r.bottleneck == "augment", str(r)
    f = next(a for a in r.advice if a.kind == "num_workers")
    v = f.verified
    assert v.status in ("no gain", "slower"), v
    assert [t.settings for t in v.tried] == [  # the next one too; workers tried persistent
        {"num_workers": 2, "persistent_workers": True}, {"num_workers": 1, "persistent_workers": True}]
    assert all(t.status in ("no gain", "slower") for t in v.tried), v
    assert ("not a fix on this machine" in f.message or "no gain beyond the noise" in f.message), f.message
    assert math.isfinite(v.speedup) and v.speedup < 1.1


def slow_start(worker_id: int) -> None:
    """A worker that takes 0.2 s to start (imports, files opened, MONAI's transforms set up)."""
    import time

    time.sleep(0.2)


@pytest.mark.e2e
@pytest.mark.alone  # the check's pairs read 88 against 18 ms, 0.8-31x, under pytest -n 3 in a clean clone (passes alone)
def test_workers_started_again_every_short_epoch_are_measured_and_named(no_leftover_workers):
    # 4 batches an epoch (32 samples of 8), 2 workers that take 0.2 s to start, a 10 ms
    # step: a loop that ends its epochs waits about 0.2 s every 4 batches (60 ms a batch),
    # persistent workers start once (about 12 ms a batch). The bisection's points never end
    # an epoch; the check does, as the loop would.
    loader = make_loader(PlantedDataset(n=32, transform=Sleep(0.5)), batch_size=8, num_workers=2,
                         worker_init_fn=slow_start)
    r = bisect(tiny_model(10.0), loader, max_seconds=10, verify_seconds=12, plan=FAST_PLAN, points=["full", "device"])
    f = next((a for a in r.advice if a.kind == "persistent_workers"), None)
    assert f is not None, str(r)
    v = f.verified
    assert v.status == "helps" and v.speedup > 2.0, v
    mine, theirs = v.ms_per_batch
    assert mine > 2 * theirs and f"persistent_workers=True: {mine:.3g} \u2192 {theirs:.3g} ms/batch" in f.message
    assert r.to_dict()["verification"]["trials"][0]["settings"] == {"persistent_workers": True}
    assert loader.persistent_workers is False  # the user's loader as it was


# --- the same figure in compare and the sweep ----------------------------------------------------


def test_compare_shows_predicted_measured_and_this_comparison():
    from bisect_pipeline import compare

    ver = {"status": "ok", "trials": [{"item": "num_workers", "settings": {"num_workers": 1},
                                       "user_windows": windows(16.0), "candidate_windows": windows(60.0)}]}
    before = planted_report(ver)
    after = dataclasses_replace_loader(planted_report({}), num_workers=1)
    c = compare.compare(before, after)
    (a,) = c["advice_checked"]
    assert a["applied"] and a["measured"] == pytest.approx(3.75, rel=1e-3) and a["predicted"] is not None
    assert a["this_comparison"] == pytest.approx(1.0, abs=0.02)  # planted: the same numbers in both runs
    text = compare.to_text(c)
    assert "Advice of the first run, num_workers=1: measured 3.75\u00d7" in text and "this comparison: 1.00\u00d7" in text
    # a second run without the setting: the figure, and no comparison claimed
    (b,) = compare.compare(before, planted_report({}))["advice_checked"]
    assert not b["applied"] and b["this_comparison"] is None


def dataclasses_replace_loader(r: Report, **settings) -> Report:
    import dataclasses

    return Report.of(dataclasses.replace(r.measurements, loader={**r.loader, **settings}))


def test_sweep_torch_threads_is_a_setting_applied_per_row_and_restored():
    from bisect_pipeline import sweep

    assert sweep.parse(["torch_threads=1,2"]) == {"torch_threads": [1, 2]}
    seen = []

    class Threads(torch.nn.Module):  # the threads the step runs on
        def forward(self, x):
            seen.append(torch.get_num_threads())
            return x

    model = torch.nn.Sequential(Threads(), tiny_model(1.0))
    loader = make_loader(PlantedDataset(n=32), batch_size=8)
    res = sweep.run(bisect_workload(model, loader), {"torch_threads": [2]}, device="cpu", max_seconds=4,
                    plan=FAST_PLAN)
    assert [r.settings["torch_threads"] for r in res.rows] == [1, 2]
    first = seen.index(2)
    assert set(seen[:first]) == {1} and set(seen[first:]) == {2}  # each row on its threads
    assert torch.get_num_threads() == 1


def bisect_workload(model, loader):
    from bisect_pipeline import Workload

    return Workload(model=model, loader=loader)


def test_a_trial_cut_short_before_two_windows_each_says_not_measured_and_why():
    ver = {"status": "ok", "trials": [{"item": "num_workers", "settings": {"num_workers": 1},
                                       "user_windows": windows(16.0, 1), "candidate_windows": [], "error": None}]}
    f = next(a for a in planted_report(ver).advice if a.kind == "num_workers")
    assert f.verified.status == "not measured" and "two pairs of visits" in f.verified.reason
    assert "Not measured before printing: num_workers=1: not measured (out of time" in " ".join(f.message.split())
