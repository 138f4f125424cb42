"""Before the points (prepare.py): the step probed for a batch it changes in place, and
the step timed alone around the allocator held still."""

import pytest

from bisect_pipeline.measure import allocator, prepare
from conftest import FakeClock
from test_experiment import experiment


def test_a_step_that_changes_its_batch_is_found_before_anything_is_timed():
    exp = experiment()
    exp.step = lambda batch: batch[0].mul_(2)
    prepare.probe_step(exp, None)
    assert exp.fresh and any(n.kind == "step" for n in exp.notes)
    calm = experiment()
    calm.step = lambda batch: None
    prepare.probe_step(calm, None)
    assert not calm.fresh



def test_a_long_step_is_not_timed_alone_for_the_allocator_but_its_time_is_kept():
    # the allocator's timing takes allocator.LEAST_STEPS steps at least: 28 s of a 2 s
    # step; past a tenth of --max-seconds it is skipped, said, and the one step timed
    clock = FakeClock()
    exp = experiment(clock=clock)
    exp.step = lambda batch: setattr(clock, "t", clock.t + 2.0)
    held = allocator.Held(True)
    try:
        timing = prepare.hold_allocator(exp, held, None, max_seconds=60.0)
    finally:
        held.release()
    assert timing.status == "skipped" and "one step takes 2 s" in timing.reason and "28 s" in timing.reason
    assert exp.step_alone == pytest.approx(2.0) and clock.t == pytest.approx(2.0)  # one step, no more
    assert exp.visit_plan("device")[0] == exp.plan.for_step(2.0)  # and the visits are fitted to it
    # that step is a window of the device point's work (a tight first round's ceiling)
    assert (exp.step_window.steps, exp.step_window.seconds) == (1, pytest.approx(2.0))
    assert exp.ceiling_alone("device").step_alone and exp.ceiling_alone("full") is None


def test_a_first_step_slowed_by_its_lazy_start_is_timed_again_before_the_step_is_called_long():
    # a 3-ms step whose first call took 0.3 s (its lazy initialisation): 14 steps of that
    # would pass a tenth of 30 s, but it cost no more than the timing's own 2%: the second
    # call says the step is short, and the allocator is timed
    clock = FakeClock()
    exp = experiment(clock=clock)
    calls = []

    def step(batch):
        clock.t += 0.3 if not calls else 0.003
        calls.append(1)
    exp.step = step
    held = allocator.Held(True)
    try:
        timing = prepare.hold_allocator(exp, held, None, max_seconds=30.0)
    finally:
        held.release()
    assert timing.status == "ok" and len(calls) > 2
    assert exp.step_alone == pytest.approx(0.003)
    assert exp.step_window is None  # the allocator's blocks give a median, no window
