"""One visit on a fake clock (visit.py, plan.py): warm-up to a steady state, windows,
the deadline, and whoever drives it: the tool's step, a consumer that fails or pauses,
a lockstep pace."""

from typing import Optional

import pytest

from bisect_pipeline.core.faults import StepTimeout
from bisect_pipeline.measure.plan import Plan
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.measure.visit import Pace, Visit, drive, fixed_source
from conftest import FakeClock


def run(step_seconds, plan, deadline=1e9, prefetch=0, first_extra=0.0, keep=None, **kw):
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

    visit = Visit("p", lambda: fixed_source(next_batch), batch_size=4, plan=plan, deadline=deadline, clock=clock,
                  prefetch_depth=prefetch, keep=keep, **kw)
    return drive(visit, step), calls, clock


def rate(m) -> float:
    """samples/s of a visit's kept windows (4 samples a batch)."""
    return Throughput(m.windows, 4).samples_per_sec


PLAN = Plan(window_seconds=0.1, windows_per_visit=3, min_warmup_steps=2, max_warmup_windows=4)


def test_a_cost_paid_once_an_epoch_is_counted_at_its_rate_in_windows_of_whole_epochs():
    # 10-batch epochs whose first batch waits 50 ms more (workers forked again), 10 ms a
    # step, 4 workers (8 steps a window at least, 8 batches prefetched): 15 ms a batch
    def visit(plan):
        clock, batches = FakeClock(), [0]

        def next_batch():
            batches[0] += 1
            clock.t += 0.05 if batches[0] % 10 == 1 else 0.0
            return batches[0]

        def step(batch):
            clock.t += 0.01

        return drive(Visit("full", lambda: fixed_source(next_batch), batch_size=1, plan=plan, deadline=1e9,
                           clock=clock, prefetch_depth=8), step)

    plan = Plan(window_seconds=0.08).for_workers(4)
    m = visit(plan.for_epochs(10))
    assert all(w.steps == 10 for w in m.windows) and m.steady
    assert sum(w.seconds for w in m.windows) / m.steps == pytest.approx(0.015)
    # windows of 8 steps: the steady pair keeps three that hold a restart each, 16.25 ms
    m = visit(plan)
    assert sum(w.seconds for w in m.windows) / m.steps == pytest.approx(0.01625)


def test_steady_step_gives_exact_throughput_and_keeps_the_visit_windows():
    m, calls, _ = run(lambda i: 0.01, PLAN, first_extra=0.5)
    assert rate(m) == pytest.approx(400.0)  # 4 samples per 10 ms
    assert len(m.windows) == 3 and m.warmup_windows == 0  # the first two windows agree: no window is warm-up
    assert all(w.steps == 10 for w in m.windows)
    assert m.first_batch_seconds == pytest.approx(0.51)  # start-up kept apart
    assert m.warmup_steps == 2
    assert m.steady and not m.stopped_by_deadline
    assert calls["steps"] == 1 + 2 + 30


def test_warmup_covers_prefetched_batches():
    # The first 8 steps are instant (prefetched by workers); then 10 ms each.
    m, _, _ = run(lambda i: 0.0 if i <= 8 else 0.01, PLAN, prefetch=8)
    assert m.warmup_steps == 10
    assert rate(m) == pytest.approx(400.0)


def test_a_slow_start_is_warm_up_not_measurement():
    # A cold start that decays (caches, page faults, a point measured first of the run):
    # step i costs 10 ms * (1 + 3 * 0.8**i). The windows before two agree are left out,
    # so the point is not slower for being first.
    m, _, _ = run(lambda i: 0.01 * (1 + 3 * 0.8 ** i), PLAN)
    assert m.warmup_windows >= 1
    assert m.steady
    assert rate(m) == pytest.approx(400.0, rel=0.1)
    cold, _, _ = run(lambda i: 0.01 * (1 + 3 * 0.8 ** i), Plan(window_seconds=0.1, max_warmup_windows=0))
    assert rate(cold) < 0.9 * rate(m)  # without the rule, slower


def test_a_point_that_never_settles_is_kept_after_the_cap_and_said():
    # Windows alternate between 5 and 15 ms steps: no two consecutive windows agree.
    m, _, _ = run(lambda i: 0.005 if (i // 10) % 2 else 0.015, Plan(window_seconds=0.1, windows_per_visit=3,
                                                                     max_warmup_windows=2, min_warmup_steps=0))
    assert not m.steady
    assert m.warmup_windows == 2 and len(m.windows) == 3


def test_deadline_is_honoured_and_what_was_measured_is_kept():
    plan = Plan(window_seconds=1.0, windows_per_visit=5)
    m, _, clock = run(lambda i: 0.05, plan, deadline=2.0)
    assert clock.t <= 2.0 + 0.05 + 1e-9  # at most one step past the deadline
    assert m.stopped_by_deadline
    assert len(m.windows) >= 1


def test_keep_asks_for_more_windows():
    m, _, _ = run(lambda i: 0.01, PLAN, keep=6)
    assert len(m.windows) == 6


# --- whoever drives it -------------------------------------------------------------------------


def test_a_step_that_raises_ends_the_visit_keeps_the_error_and_closes_the_source():
    clock, closed, handed = FakeClock(), [], []

    class Source:
        def __enter__(self):
            def next_batch():
                handed.append(1)
                return len(handed)
            return next_batch, None

        def __exit__(self, *exc):
            closed.append(exc[0])

    def step(batch):
        clock.t += 0.01
        if batch == 7:
            raise ValueError("planted")

    visit = Visit("p", Source, batch_size=4, plan=PLAN, deadline=1e9, clock=clock)
    m = drive(visit, step)  # the error is the visit's, not the driver's
    assert isinstance(m.error, ValueError) and len(handed) == 7
    assert closed == [ValueError]  # the source saw the error: a loader terminates its workers
    assert m.windows == ()


def test_a_pipeline_that_raises_is_the_visits_error_too_and_the_source_sees_it():
    clock, closed = FakeClock(), []

    def next_batch():
        clock.t += 0.001
        if clock.t > 0.05:
            raise OSError("disk gone")  # or the watchdog's StepTimeout in a hung fetch
        return 0

    class Source:
        def __enter__(self):
            return next_batch, None

        def __exit__(self, *exc):
            closed.append(exc[0])

    m = drive(Visit("p", Source, batch_size=4, plan=PLAN, deadline=1e9, clock=clock), lambda b: None)
    assert isinstance(m.error, OSError)
    assert closed == [OSError]  # a loader terminates workers that may hang, instead of joining them


def closing_fails(fail_step_at: Optional[int] = None):
    """A source whose closing raises, as a loader's shutdown cut by the watchdog does."""
    clock = FakeClock()

    class Source:
        def __enter__(self):
            return (lambda: 0), None

        def __exit__(self, *exc):
            raise StepTimeout("the end passed while workers shut down")

    def step(batch):
        clock.t += 0.01
        if fail_step_at is not None and clock.t > fail_step_at * 0.01 - 1e-9:
            raise ValueError("planted")

    return drive(Visit("p", Source, batch_size=4, plan=PLAN, deadline=1e9, clock=clock), step)


def test_a_source_that_fails_to_close_fails_its_point_not_the_run():
    m = closing_fails()  # returns: the run goes on to the next point with this one failed
    assert isinstance(m.error, StepTimeout)  # every driver reports a point with an error as failed
    failed_first = closing_fails(fail_step_at=7)
    assert isinstance(failed_first.error, ValueError)  # the error that ended it is kept


def test_the_wait_for_each_batch_is_counted_over_the_kept_windows():
    clock = FakeClock()

    def next_batch():
        clock.t += 0.004  # the pipeline: 4 ms of every 10
        return 0

    visit = Visit("p", lambda: fixed_source(next_batch), batch_size=4, plan=PLAN, deadline=1e9, clock=clock)
    m = drive(visit, lambda b: setattr(clock, "t", clock.t + 0.006))
    assert m.wait_seconds == pytest.approx(0.004 * m.steps)
    assert rate(m) == pytest.approx(400.0)


def pausing(pause_at: set, pause_s: float, gap: float = float("inf"), void: bool = False):
    """A visit driven by a loop that pauses `pause_s` after the steps in `pause_at`
    (an evaluation pass), telling the visit (`void`) or not."""
    clock, paused = FakeClock(), []
    visit = Visit("p", lambda: fixed_source(lambda: 0), batch_size=4, plan=PLAN, deadline=1e9, clock=clock,
                  prefetch_depth=2, gap=gap, on_pause=paused.append)
    n = [0]
    with visit as batches:
        for _ in batches:
            n[0] += 1
            clock.t += 0.01
            if n[0] in pause_at:
                clock.t += pause_s
                if void:
                    visit.void()
    return visit.measured, paused, n[0]


def test_a_pause_of_the_loop_voids_its_window_and_the_visit_warms_up_again():
    m, paused, steps = pausing({20}, 5.0, void=True)  # step 20 falls in the first window
    assert m.discarded == 1 and paused == [pytest.approx(5.01)]
    assert rate(m) == pytest.approx(400.0)  # the pause is in no kept window
    assert all(w.seconds < 1.0 for w in m.windows)
    assert m.warmup_steps == 2 + 2 + 2 + 2  # warm-up, then again after the pause
    plain, _, plain_steps = pausing(set(), 0.0)
    assert steps > plain_steps  # the discarded window was made up


def test_a_pause_far_beyond_a_step_is_found_without_being_told():
    m, paused, _ = pausing({20}, 5.0, gap=1.0)
    assert m.discarded == 1 and rate(m) == pytest.approx(400.0)
    # a pause below the gap is part of the loop (logging every N steps): it stays in
    m, paused, _ = pausing({20}, 0.5, gap=1.0)
    assert m.discarded == 0 and not paused


class ScriptedPeer(Pace):
    """Rank 1's view of a lockstep visit: rank 0's decisions come from a script."""

    lockstep = True

    def __init__(self, decisions: list) -> None:
        self.decisions = list(decisions)

    def decide(self, values: list) -> list:
        return self.decisions.pop(0)


def test_under_a_lockstep_pace_every_rank_keeps_the_windows_rank_0_kept():
    """A rank whose own windows agree from the first must still leave out the warm-up
    windows rank 0 left out, or the ranks' figures cover different steps (seen on CI)."""
    clock = FakeClock()
    decisions = [[10, 100.0]] + [[1, 10, 0]] * 4 + [[0, 10, 0]] + [[2, 0]]  # rank 0: windows 3..5 kept, not steady
    peer = ScriptedPeer(decisions)
    visit = Visit("p", lambda: fixed_source(lambda: 0), batch_size=4, plan=Plan(), deadline=100.0, clock=clock,
                  pace=peer)
    m = drive(visit, lambda b: setattr(clock, "t", clock.t + 0.01))  # steady from this rank's first window
    assert not peer.decisions
    assert [w.steps for w in m.windows] == [10, 10, 10]
    assert m.warmup_windows == 2 and m.steady is False


def test_a_long_step_seen_in_the_warm_up_gets_a_one_step_window():
    # nothing known of the step before the visit (a user's loop's first visit): the
    # warm-up shows a 2 s step, and the visit is fitted to it (Plan.for_step): one window
    # of one step (the noise comes from the rounds)
    m, calls, clock = run(lambda i: 2.0 * (1.01 if i % 2 else 1.0), Plan())
    assert [w.steps for w in m.windows] == [1] and m.warmup_steps == 2
    assert calls["steps"] == 1 + 2 + 1 and clock.t == pytest.approx(2 * 2.02 + 2 * 2.0)
    assert rate(m) == pytest.approx(4 / 2.01, rel=0.01)


def test_a_long_step_after_the_workers_start_is_timed_past_one_untimed_step_where_the_time_holds_it():
    # 2 workers, a 2-s step known before the visit (Plan.for_step: no warm-up, windows of
    # one batch per worker); the pool's start slows the step after the first batch by 15%
    # (the loop's copy-on-write after the fork: docs/benchmarks.md)
    plan = Plan().for_workers(2).for_step(2.0)
    slowed = (lambda i: 2.3 if i == 2 else 2.0)
    m, calls, clock = run(slowed, plan, deadline=100.0, pool_start=2.0)
    assert m.warmup_steps == 1 and [w.steps for w in m.windows] == [2]
    assert rate(m) == pytest.approx(4 / 2.0)  # the steady step, not the slowed one
    # no time for a step more before the deadline: the window follows the first batch, as before
    m, calls, clock = run(slowed, plan, deadline=2.0 + 3 * 2.0 - 0.1, pool_start=2.0)
    assert m.warmup_steps == 0 and rate(m) == pytest.approx(4 / 2.15)
    # no pool started (cached batches, a parked pool resumed): as before
    m, calls, clock = run(slowed, plan, deadline=100.0)
    assert m.warmup_steps == 0 and rate(m) == pytest.approx(4 / 2.15)
