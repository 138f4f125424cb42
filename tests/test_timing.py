"""timing.measure on a fake clock: one visit of a point, warm-up to a steady state."""

import pytest

from bisect_pipeline.stats import Window
from bisect_pipeline.timing import Plan, kept_windows, measure, visit_state


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def run(step_seconds, plan, deadline=1e9, prefetch=0, first_extra=0.0, keep=None):
    clock = FakeClock()
    calls = {"batches": 0, "steps": 0}

    def next_batch():
        calls["batches"] += 1
        if calls["batches"] == 1:
            clock.t += first_extra
        return calls["batches"]

    def step(batch):
        calls["steps"] += 1
        clock.t += step_seconds(calls["steps"])

    m = measure(next_batch, None, step, batch_size=4, plan=plan, deadline=deadline, clock=clock,
                prefetch_depth=prefetch, keep=keep)
    return m, calls, clock


PLAN = Plan(window_seconds=0.1, windows_per_visit=3, min_warmup_steps=2, max_warmup_windows=4)


def test_steady_step_gives_exact_throughput_and_keeps_the_visit_windows():
    m, calls, _ = run(lambda i: 0.01, PLAN, first_extra=0.5)
    tp = m.throughput
    assert tp.samples_per_sec == pytest.approx(400.0)  # 4 samples per 10 ms
    assert tp.n == 3 and m.warmup_windows == 0  # the first two windows agree: no window is warm-up
    assert all(w.steps == 10 for w in tp.windows)
    assert m.first_batch_seconds == pytest.approx(0.51)  # start-up kept apart
    assert m.warmup_steps == 2
    assert m.steady and not m.stopped_by_deadline
    assert calls["steps"] == 1 + 2 + 30


def test_warmup_covers_prefetched_batches():
    # The first 8 steps are instant (prefetched by workers); then 10 ms each.
    m, _, _ = run(lambda i: 0.0 if i <= 8 else 0.01, PLAN, prefetch=8)
    assert m.warmup_steps == 10
    assert m.throughput.samples_per_sec == pytest.approx(400.0)


def test_a_slow_start_is_warm_up_not_measurement():
    # A cold start that decays (caches, page faults, a point measured first of the run):
    # step i costs 10 ms * (1 + 3 * 0.8**i). The windows before two agree are left out,
    # so the point is not slower for being first.
    m, _, _ = run(lambda i: 0.01 * (1 + 3 * 0.8 ** i), PLAN)
    assert m.warmup_windows >= 1
    assert m.steady
    assert m.throughput.samples_per_sec == pytest.approx(400.0, rel=0.1)
    cold, _, _ = run(lambda i: 0.01 * (1 + 3 * 0.8 ** i), Plan(window_seconds=0.1, max_warmup_windows=0))
    assert cold.throughput.samples_per_sec < 0.9 * m.throughput.samples_per_sec  # without the rule, slower


def test_a_point_that_never_settles_is_kept_after_the_cap_and_said():
    # Windows alternate between 5 and 15 ms steps: no two consecutive windows agree.
    m, _, _ = run(lambda i: 0.005 if (i // 10) % 2 else 0.015, Plan(window_seconds=0.1, windows_per_visit=3,
                                                                     max_warmup_windows=2, min_warmup_steps=0))
    assert not m.steady
    assert m.warmup_windows == 2 and m.throughput.n == 3


def test_deadline_is_honoured_and_what_was_measured_is_kept():
    plan = Plan(window_seconds=1.0, windows_per_visit=5)
    m, _, clock = run(lambda i: 0.05, plan, deadline=2.0)
    assert clock.t <= 2.0 + 0.05 + 1e-9  # at most one step past the deadline
    assert m.stopped_by_deadline
    assert m.throughput is not None and m.throughput.n >= 1


def test_keep_asks_for_more_windows():
    m, _, _ = run(lambda i: 0.01, PLAN, keep=6)
    assert m.throughput.n == 6


def test_visit_state_finds_the_first_agreeing_pair():
    w = [Window(10, 0.3), Window(10, 0.2), Window(10, 0.1), Window(10, 0.105), Window(10, 0.1)]
    v = visit_state(w, PLAN)
    assert (v.start, v.steady, v.done) == (2, True, True)
    assert kept_windows(w, PLAN) == (tuple(w[2:]), True)
    assert not visit_state(w[:4], PLAN).done  # 2 of 3 windows kept so far
    # cut short before a steady pair: all but the first window are kept, flagged unsteady
    assert kept_windows(w[:2], PLAN) == ((w[1],), False)


def test_no_warmup_windows_means_every_window_counts():
    plan = Plan(windows_per_visit=1, max_warmup_windows=0)
    assert visit_state([Window(3, 1.0)], plan).done


def test_plan_validates_its_arguments():
    with pytest.raises(ValueError, match="window_seconds"):
        Plan(window_seconds=0)
    with pytest.raises(ValueError, match="min_rounds"):
        Plan(min_rounds=5, max_rounds=2)
    with pytest.raises(ValueError, match="windows_per_visit"):
        Plan(windows_per_visit=0)
