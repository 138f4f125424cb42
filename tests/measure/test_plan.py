"""The pure rules of a visit's windows (plan.py): warm-up, window sizing, when to stop,
which windows to keep."""

import pytest

from bisect_pipeline.measure.plan import Plan, kept_windows, next_window, plan_budget, visit_state
from bisect_pipeline.core.stats import Window

PLAN = Plan(window_seconds=0.1, windows_per_visit=3, min_warmup_steps=2, max_warmup_windows=4)


def test_visit_state_finds_the_first_agreeing_pair():
    w = [Window(10, 0.3), Window(10, 0.2), Window(10, 0.1), Window(10, 0.105), Window(10, 0.1)]
    v = visit_state(w, PLAN)
    assert (v.start, v.steady, v.done) == (2, True, True)
    assert kept_windows(w, PLAN) == (2, True)
    assert not visit_state(w[:4], PLAN).done  # 2 of 3 windows kept so far
    # cut short before a steady pair: all but the first window are kept, flagged unsteady
    assert kept_windows(w[:2], PLAN) == (1, False)


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


def test_the_last_window_is_shortened_to_the_time_left():
    plan = Plan(window_seconds=1.0, min_window_steps=3)
    w = [Window(100, 1.0), Window(100, 1.0)]
    assert next_window(w[:1], 100, plan, seconds_left=0.5).steps == 50
    nxt = next_window(w[:1], 100, plan, seconds_left=0.02)  # not even min_window_steps fit
    assert not nxt.go_on and nxt.out_of_time


def test_windows_are_sized_from_the_step_and_a_plan_fits_its_workers():
    plan = Plan(window_seconds=0.25, min_window_steps=3)
    assert plan.window_steps(0.01) == 25 and plan.window_steps(1.0) == 3  # at least min_window_steps
    assert plan.for_workers(4).min_window_steps == 8 and plan.for_workers(1).min_window_steps == 3
    assert plan.for_workers(0) is plan and plan.for_workers(2).for_workers(2) == plan.for_workers(2)
    nxt = next_window([Window(10, 0.5)], 10, plan, seconds_left=100.0)  # re-sized from the first window's rate
    assert nxt.go_on and nxt.steps == 5
    assert plan.most_windows() == 4 + 1 + 2  # the steady pair is the visit


def test_a_long_step_gets_one_batch_per_worker_windows_no_warmup_and_one_window():
    plan = Plan(window_seconds=0.25, min_window_steps=3)
    assert plan.for_step(None) is plan and plan.for_step(0.2) is plan  # a short step: as it was
    long = plan.for_step(2.0)
    assert (long.min_window_steps, long.min_warmup_steps, long.windows_per_visit) == (1, 0, 1)
    assert long.max_warmup_windows == 0  # one window: its steadiness is not asked
    assert long.window_steps(2.0) == 1 and long.for_step(2.0) == long
    assert plan.for_workers(4).for_step(2.0).min_window_steps == 4  # a burst of the workers' first batches
    # a visit of a 2 s step: 18 s unfitted (the first batch, 2 warm-up steps and 2 windows
    # of 3 steps), 4 s fitted (the first batch and one one-step window)
    assert plan.least_visit_seconds(2.0) == pytest.approx(18.0)
    assert long.least_visit_seconds(2.0) == pytest.approx(4.0)


def test_a_loader_that_ends_short_epochs_gets_windows_of_whole_epochs():
    plan = Plan(window_seconds=0.25, min_window_steps=8).for_epochs(10)
    short = plan.at_step(0.01)  # 10 batches: 0.1 s an epoch
    assert short.min_window_steps == 10 and short.window_steps(0.01) == 30 and short.window_steps(0.1) == 10
    assert short.whole(20) and not short.whole(25)
    # the time left holds 2.5 epochs: 2 of them, never a part of one
    nxt = next_window([Window(30, 0.3)], 30, short, seconds_left=0.25)
    assert nxt.go_on and nxt.steps == 20
    assert next_window([Window(30, 0.3)], 30, short, seconds_left=0.09).out_of_time  # not one epoch left
    # epochs longer than EPOCH_WINDOW_S: windows as usual, the per-epoch cost spread over them
    from bisect_pipeline.measure.plan import EPOCH_WINDOW_S

    long = plan.at_step(1.01 * EPOCH_WINDOW_S / 10)
    assert long.epoch_steps == 0 and long.min_window_steps == 8 and long.whole(7)
    assert Plan().for_epochs(None).at_step(0.01) == Plan()  # no length: no epochs to fit


def test_max_seconds_is_divided_up_front_the_change_s_check_included():
    b = plan_budget(60, check_share=0.4, search_share=0.5, patch=True, startup_s=4.0)
    # one run of the patched script, (4 + 2 + 4) s at least, within the 20% of 60 it gets
    assert (b.patching, b.patch_runs, b.patch_least) == (12.0, 1, 10.0)
    assert b.bisecting + b.checking + b.searching + b.patching == pytest.approx(60)
    assert (b.bisecting, b.searching) == pytest.approx((24.0, 14.4))
    assert b.text() == "of 60 s: 24 bisecting, 10 checking the advice, 14 searching, 12 checking the change"
    assert plan_budget(30, check_share=0.4, search_share=0.5, patch=True, startup_s=5.0).patching == 11.0  # its least
    # too short for its run: nothing kept, and the reason says what would do
    short = plan_budget(30, check_share=0.4, search_share=0.5, patch=True, startup_s=10.0)
    assert short.patching == 0 and "give --max-seconds 40 or more" in short.patch_reason
    assert short.bisecting + short.checking + short.searching == pytest.approx(30)
    # where the time went, beside how it was divided
    spent = b.spending("bisecting", 8.41).spending("searching", 30.0)
    assert spent.to_dict()["spent"] == {"bisecting": 8.41, "searching": 30.0}
    plain = plan_budget(30, check_share=0.25)
    assert plain.to_dict() == {"bisecting": 22.5, "checking": 7.5}
    own = plan_budget(30, check_share=0.25, verify_seconds=20.0)  # a budget of its own, on top
    assert own.bisecting == 30 and "20 s more" in own.text()
