import pytest

from bisect_pipeline.timing import Plan, measure


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def run(step_seconds, plan, deadline=1e9, prefetch=0, first_extra=0.0):
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
                prefetch_depth=prefetch)
    return m, calls, clock


def test_steady_step_gives_exact_throughput_and_stops_at_min_windows():
    plan = Plan(window_seconds=0.1, min_windows=4, max_windows=10, warmup_seconds=0.05, min_warmup_steps=2)
    m, calls, _ = run(lambda i: 0.01, plan, first_extra=0.5)
    tp = m.throughput
    assert tp.samples_per_sec == pytest.approx(400.0)  # 4 samples per 10 ms
    assert tp.n == 4  # no spread: stops as soon as it may
    assert all(w.steps == 10 for w in tp.windows)
    assert m.first_batch_seconds == pytest.approx(0.51)  # start-up kept apart
    assert m.warmup_steps == 5  # 0.05 s of warm-up at 10 ms per step
    assert not m.stopped_by_deadline


def test_warmup_covers_prefetched_batches():
    plan = Plan(window_seconds=0.1, min_windows=3, warmup_seconds=0.001, min_warmup_steps=2)
    # The first 8 steps are instant (prefetched by workers); then 10 ms each.
    m, _, _ = run(lambda i: 0.0 if i <= 8 else 0.01, plan, prefetch=8)
    assert m.warmup_steps >= 10
    assert m.throughput.samples_per_sec == pytest.approx(400.0)


def test_deadline_is_honoured():
    plan = Plan(window_seconds=1.0, min_windows=5, max_windows=10, warmup_seconds=0.1)
    m, _, clock = run(lambda i: 0.05, plan, deadline=2.0)
    assert clock.t <= 2.0 + 0.05 + 1e-9  # at most one step past the deadline
    assert m.stopped_by_deadline
    assert m.throughput is not None and m.throughput.n >= 1


def test_noisy_steps_use_more_windows():
    plan = Plan(window_seconds=0.05, min_windows=3, max_windows=9, warmup_seconds=0.01)
    # alternate 5 and 15 ms steps in long runs: windows disagree
    m, _, _ = run(lambda i: 0.005 if (i // 7) % 2 else 0.015, plan)
    assert m.throughput.n > 3


def test_plan_validates_its_arguments():
    with pytest.raises(ValueError, match="window_seconds"):
        Plan(window_seconds=0)
    with pytest.raises(ValueError, match="min_windows"):
        Plan(min_windows=5, max_windows=2)
