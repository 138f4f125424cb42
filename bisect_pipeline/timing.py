"""The only module that reads a clock: warm up, then time windows of training steps."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from .stats import Throughput, Window

Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How long to measure one point.

    Windows are timed as wholes (total steps / total time); a point stops early once
    `min_windows` windows pin the median down to `target_rel_se`, and never runs past
    its deadline. Defaults are sized so a point costs about 2-4 s on a 2-core machine.
    """

    window_seconds: float = 0.5
    min_windows: int = 5
    max_windows: int = 12
    min_window_steps: int = 3
    # Stop once the median's standard error is under 1.5%: well under the 5% drop the
    # verdict needs (verdict.MIN_REL_DROP), so more windows would not change it.
    target_rel_se: float = 0.015
    warmup_seconds: float = 0.3
    min_warmup_steps: int = 3

    def __post_init__(self) -> None:
        for name in ("window_seconds", "warmup_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Plan.{name} must be > 0, got {getattr(self, name)}")
        if not 1 <= self.min_windows <= self.max_windows:
            raise ValueError(f"Plan needs 1 <= min_windows <= max_windows, got {self.min_windows}, {self.max_windows}")
        if self.min_window_steps < 1 or self.min_warmup_steps < 0:
            raise ValueError("Plan.min_window_steps must be >= 1 and min_warmup_steps >= 0")


@dataclasses.dataclass(frozen=True)
class Measured:
    throughput: Optional[Throughput]  # None when no window completed
    first_batch_seconds: float  # the first batch and its step (worker start-up, first calls)
    warmup_steps: int
    warmup_seconds: float
    stopped_by_deadline: bool


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
) -> Measured:
    """Warm up, then time windows of `step(move(next_batch()))` until the point is settled
    or `deadline` (an absolute time on `clock`) passes.

    Algorithm:
        t_first = time of the first batch and its step
        warm-up: run steps until both min_warmup_steps + prefetch_depth steps and
                 warmup_seconds have passed; est = time per step of the second half
        n = max(min_window_steps, window_seconds / est)
        repeat: time one window of n steps (sync at both edges only);
                after the first window, n is re-sized from its measured rate;
                stop when >= min_windows and the median's relative standard
                error <= target_rel_se, or max_windows,
                or the deadline.
    """
    t0 = clock()
    first = next_batch()
    _run_one(first, move, step)
    sync()
    t_first = clock() - t0

    # Warm-up: the batches workers prefetched while starting up come out at once and
    # would inflate a window that included them.
    warm_steps, warm_times = 0, []
    need = plan.min_warmup_steps + prefetch_depth
    w0 = clock()
    while warm_steps < need or clock() - w0 < plan.warmup_seconds:
        if clock() >= deadline:
            break
        s0 = clock()
        _run_one(next_batch(), move, step)
        beat()
        warm_times.append(clock() - s0)
        warm_steps += 1
    sync()
    warm_seconds = clock() - w0
    tail = warm_times[len(warm_times) // 2:] or [max(t_first, 1e-6)]
    est = max(sum(tail) / len(tail), 1e-7)

    n = max(plan.min_window_steps, math.ceil(plan.window_seconds / est))
    windows: list[Window] = []
    stopped = False
    while len(windows) < plan.max_windows:
        if clock() >= deadline:
            stopped = True
            break
        w = _window(next_batch, move, step, n, deadline, clock, sync, beat)
        if w.steps == 0:
            stopped = True
            break
        windows.append(w)
        on_window(len(windows), w)
        if len(windows) == 1:
            n = max(plan.min_window_steps, math.ceil(plan.window_seconds * w.steps / max(w.seconds, 1e-9)))
        if len(windows) >= plan.min_windows:
            tp = Throughput(tuple(windows), batch_size)
            if tp.rel_se <= plan.target_rel_se:
                break
        if w.steps < n and clock() >= deadline:
            stopped = True
            break
    tp = Throughput(tuple(windows), batch_size) if windows else None
    return Measured(tp, t_first, warm_steps, warm_seconds, stopped)


def _run_one(batch: Any, move: Optional[Callable[[Any], Any]], step: Callable[[Any], Any]) -> None:
    if move is not None:
        batch = move(batch)
    step(batch)


def _window(next_batch, move, step, n: int, deadline: float, clock: Clock, sync, beat) -> Window:
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
