"""The only module that reads a clock: warm up, then time windows of training steps."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from .stats import Throughput, Window

Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long to measure a point.

    Points are measured in visits, scheduled in rounds (api: the ceiling down, then back
    up, and so on until the verdict is settled). A visit times windows of whole steps
    (total steps / total time), `window_seconds` long and at least `min_window_steps`
    steps each; it is warm once two consecutive windows agree within `steady_tolerance`
    (the windows before them are warm-up, at most `max_warmup_windows`), and it keeps
    `windows_per_visit` windows counting that pair. Defaults: about 1 s per visit on a
    2-core machine, so two rounds over five points take about 10 s.
    """

    window_seconds: float = 0.25
    windows_per_visit: int = 3
    min_window_steps: int = 3
    # Untimed steps before the first window (plus the batches the workers prefetched,
    # which come out at once): the step's first calls and the loader's start-up.
    min_warmup_steps: int = 2
    # Two windows within 10% of each other: the spread above which a point is flagged as
    # noisy (stats.NOISY_REL_IQR), so a warm point is one that is not visibly drifting.
    steady_tolerance: float = 0.10
    max_warmup_windows: int = 4
    # Rounds: at least two (a pair, down then up, so that a machine drifting over the
    # run weighs on every point alike), then more until the verdict is settled; those
    # visit only the points that can still change it, so they are short. The deadline
    # bounds them; max_rounds only stops a run that nothing could settle.
    min_rounds: int = 2
    max_rounds: int = 24

    def __post_init__(self) -> None:
        if self.window_seconds <= 0:
            raise ValueError(f"Plan.window_seconds must be > 0, got {self.window_seconds}")
        if self.windows_per_visit < 1 or self.min_window_steps < 1 or self.min_warmup_steps < 0:
            raise ValueError("Plan needs windows_per_visit >= 1, min_window_steps >= 1 and min_warmup_steps >= 0")
        if not 0 < self.steady_tolerance or self.max_warmup_windows < 0:
            raise ValueError("Plan needs steady_tolerance > 0 and max_warmup_windows >= 0")
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"Plan needs 1 <= min_rounds <= max_rounds, got {self.min_rounds}, {self.max_rounds}")

    def for_workers(self, num_workers: int) -> "Plan":
        """This plan for a loader with `num_workers`: a window must span several batches
        per worker, or it times one worker's burst."""
        need = max(self.min_window_steps, 2 * num_workers)
        return self if need == self.min_window_steps else dataclasses.replace(self, min_window_steps=need)


@dataclasses.dataclass(frozen=True)
class Visit:
    """Where a visit stands after its windows so far (pure: see visit_state)."""

    start: Optional[int]  # index of the first window kept, None while still warming up
    steady: bool  # two consecutive windows agreed
    done: bool


def agree(a: Window, b: Window, tolerance: float) -> bool:
    ra, rb = a.steps_per_sec, b.steps_per_sec
    return abs(ra - rb) <= tolerance * max(ra, rb)


def visit_state(windows: list, plan: Plan, keep: Optional[int] = None) -> Visit:
    """Warm-up ends at the first pair of consecutive windows that agree; after
    max_warmup_windows windows without one, the visit goes on from there (not steady).
    Done once `keep` windows (plan.windows_per_visit) are kept."""
    keep = keep or plan.windows_per_visit
    if plan.max_warmup_windows == 0:  # no steadiness asked for: every window counts
        return Visit(0, True, len(windows) >= keep)
    start, steady = None, False
    for i in range(1, len(windows)):
        if i - 1 > plan.max_warmup_windows:
            break
        if agree(windows[i - 1], windows[i], plan.steady_tolerance):
            start, steady = i - 1, True
            break
    if start is None and len(windows) > plan.max_warmup_windows + 1:
        start = plan.max_warmup_windows
    return Visit(start, steady, start is not None and len(windows) - start >= keep)


def kept_windows(windows: list, plan: Plan, keep: Optional[int] = None) -> tuple[tuple, bool]:
    """(windows kept, steady) of a visit that ended, done or not: before a steady pair
    was seen, everything but the first window (the likeliest warm-up) is kept, so a
    visit cut short by the deadline still counts."""
    v = visit_state(windows, plan, keep)
    if v.start is not None:
        return tuple(windows[v.start:]), v.steady
    return tuple(windows[1:] or windows), False


@dataclasses.dataclass(frozen=True)
class Measured:
    throughput: Optional[Throughput]  # None when no window completed
    first_batch_seconds: float  # the first batch and its step (worker start-up, first calls)
    warmup_steps: int
    warmup_seconds: float
    stopped_by_deadline: bool
    steady: bool = True
    warmup_windows: int = 0  # windows timed but left out as warm-up


def measure(
    next_batch: Callable[[], Any],
    move: Optional[Callable[[Any], Any]],
    step: Callable[[Any], Any],
    *,
    batch_size: int,
    plan: Plan,
    deadline: float,
    clock: Clock,
    sync: Callable[[], None] = lambda: None,
    prefetch_depth: int = 0,
    on_window: Callable[[int, Window], None] = lambda i, w: None,
    beat: Callable[[], None] = lambda: None,
    keep: Optional[int] = None,
) -> Measured:
    """One visit: warm up, then time windows of `step(move(next_batch()))` until `keep`
    (plan.windows_per_visit) steady windows are kept, or `deadline` (an absolute time on
    `clock`) passes.

    Algorithm:
        t_first = time of the first batch and its step
        untimed warm-up: min_warmup_steps + prefetch_depth steps;
                         est = time per step of its second half
        n = max(min_window_steps, window_seconds / est)
        repeat: time one window of n steps (sync at both edges only);
                after the first window, n is re-sized from its measured rate;
                stop when visit_state says done, or at the deadline
        kept = the windows from the first steady pair on (kept_windows)
    """
    t0 = clock()
    first = next_batch()
    _run_one(first, move, step)
    beat()
    sync()
    t_first = clock() - t0

    # The batches workers prefetched while starting up come out at once and would
    # inflate a window that included them.
    warm_times = []
    w0 = clock()
    for _ in range(plan.min_warmup_steps + prefetch_depth):
        if clock() >= deadline:
            break
        s0 = clock()
        _run_one(next_batch(), move, step)
        beat()
        warm_times.append(clock() - s0)
    sync()
    warm_seconds = clock() - w0
    tail = warm_times[len(warm_times) // 2:] or [max(t_first, 1e-6)]
    est = max(sum(tail) / len(tail), 1e-7)

    n = max(plan.min_window_steps, math.ceil(plan.window_seconds / est))
    windows: list[Window] = []
    stopped = False
    while len(windows) < plan.max_warmup_windows + 1 + (keep or plan.windows_per_visit):
        if clock() >= deadline:
            stopped = True
            break
        w = _window(next_batch, move, step, n, deadline=deadline, clock=clock, sync=sync, beat=beat)
        if w.steps == 0 or (windows and w.steps < plan.min_window_steps):
            # cut by the deadline below the plan's minimum: it times a fraction of one
            # worker's burst; the windows before it are the measurement
            stopped = True
            break
        windows.append(w)
        on_window(len(windows), w)
        if len(windows) == 1:
            n = max(plan.min_window_steps, math.ceil(plan.window_seconds * w.steps / max(w.seconds, 1e-9)))
        if visit_state(windows, plan, keep).done:
            break
        if w.steps < n and clock() >= deadline:
            stopped = True
            break
    if not windows:
        return Measured(None, t_first, len(warm_times), warm_seconds, stopped, steady=False)
    kept, steady = kept_windows(windows, plan, keep)
    return Measured(Throughput(kept, batch_size), t_first, len(warm_times), warm_seconds, stopped, steady,
                    len(windows) - len(kept))


def _run_one(batch: Any, move: Optional[Callable[[Any], Any]], step: Callable[[Any], Any]) -> None:
    if move is not None:
        batch = move(batch)
    step(batch)


def _window(next_batch, move, step, n: int, *, deadline: float, clock: Clock, sync, beat) -> Window:
    # The per-step path: one clock read for the deadline, one watchdog beat, no
    # allocation, no sync.
    sync()
    start = clock()
    done = 0
    if move is None:
        for _ in range(n):
            step(next_batch())
            done += 1
            beat()
            if clock() >= deadline:
                break
    else:
        for _ in range(n):
            step(move(next_batch()))
            done += 1
            beat()
            if clock() >= deadline:
                break
    sync()
    return Window(done, clock() - start)
