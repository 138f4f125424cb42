"""One visit of one point: the code that reads the clock at every step.

A visit hands out batches and times whoever consumes them: the time from one request
for a batch to the next is one step, the batch's wait included. So one visit serves any
driver: the tool's own training step (`drive`: `for batch in visit: step(batch)`), or a
user's training loop iterating a loader whose batches come from the visit (loop.py).

    with Visit(...) as batches:      # opens the point's source (workers start)
        for batch in batches:        # warm-up, then timed windows, until done
            step(batch)
    visit.measured                   # the windows kept, first batch, warm-up, waits

Algorithm (one visit):
    t_first = time of the first batch and its step
    untimed warm-up: min_warmup_steps + first_prefetch steps (the batches the loader may
                     hold ready at its start: prefetch_depth, none where a parked
                     pool resumes); est = time per step of its second half
                     (the batches workers prefetched come out at once)
    plan = plan.at_step(est)  (a long step: windows of one batch per worker; a loader
                               that ends short epochs: windows of whole epochs)
    n = plan.window_steps(est)
    repeat: time one window of n steps, syncing the device at both edges only;
            after each window plan.next_window says whether to go on and how long
            (re-sized from the first window's rate, shortened to the time left)
    kept = the windows from the first steady pair on (plan.kept_windows)

Who decides is the visit's `pace`: this process (`Pace`), or rank 0 for every rank under
torchrun (distributed.Lockstep), where the steps of a unit (the first batch, the warm-up,
one window) run to their end on every rank and the ranks agree after each whether any
failed. A failure in the consumer's step or in the pipeline ends the visit and is kept
(`error`); KeyboardInterrupt and BisectError go through.

A consumer that pauses (a user's loop evaluating, saving a checkpoint, or iterating
another loader between two requests: `void()`, or a pause longer than `gap` seconds,
`gap_factor` times the warm-up's step) voids the window under way: it is discarded and
counted, and the visit warms up again before the next one, so batches the workers
prefetched meanwhile do not flatter it. A consumer whose pauses are known ahead (`room()`:
the batches left in a user's epoch) gets windows that end before them. With `consumer_unwatched`, the watchdog watches
only the fetching of batches, not the consumer's own time (a user's loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional

from ..core.errors import BisectError
from ..core.results import Measured
from ..core.stats import Window
from .plan import Plan, kept_windows, next_window

Clock = Callable[[], float]


def _nothing(*args: Any) -> None:
    return None


class Pace:
    """Who decides a visit's window lengths, its deadline and when it stops: this process.
    Each decision is a list of numbers; `decide` returns the ones that count (here, its
    own). distributed.Lockstep makes rank 0's count on every rank."""

    lockstep = False

    def unit(self) -> ContextManager:
        """Around the steps of one unit (lockstep: torch.distributed Join)."""
        return contextlib.nullcontext()

    def agree(self, failed: bool) -> bool:
        """After a unit: did it fail anywhere?"""
        return failed

    def decide(self, values: list) -> list:
        return values


LOCAL = Pace()


class _StepFailed(Exception):
    """The consumer's step raised: thrown into the visit so that it ends its unit."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


@dataclasses.dataclass
class _Unit:
    steps: int = 0
    seconds: float = 0.0
    wait: float = 0.0
    voided: bool = False
    failed: bool = False


class Visit:
    """One visit of one point. `open_source()` is a context manager that yields
    (next_batch, move): `move` runs on each batch before it is handed out (the transfer
    to the device), or is None. None for `open_source`: this process takes part without
    steps (a lockstep point another rank measures). `watchdog()`: a context manager with
    a `beat()` per step (faults.Watchdog), or None. `deadline` is on `clock`.
    `prefetch_depth`: the batches the loader can hold ready after a pause (the warm-up
    after a voided window steps through them); `first_prefetch`: those it may hold at
    the visit's start (prefetch_depth by default)."""

    def __init__(self, point: str, open_source: Optional[Callable[[], ContextManager]], *, batch_size: float,
                 plan: Plan, deadline: float, clock: Clock, sync: Callable[[], None] = _nothing,
                 prefetch_depth: int = 0, first_prefetch: Optional[int] = None, keep: Optional[int] = None,
                 pace: Pace = LOCAL,
                 watchdog: Optional[Callable[[], Any]] = None,
                 on_window: Callable[[int, Window], None] = _nothing, gap: float = math.inf,
                 gap_factor: Optional[float] = None, on_pause: Callable[[float], None] = _nothing,
                 consumer_unwatched: bool = False, room: Callable[[], Optional[int]] = lambda: None,
                 pool_start: Optional[float] = None) -> None:
        self.point = point
        self.batch_size = batch_size
        self.plan = plan
        self.deadline = deadline
        self.clock = clock
        self.sync = sync
        self.prefetch_depth = prefetch_depth
        self.first_prefetch = prefetch_depth if first_prefetch is None else first_prefetch
        self.keep = keep
        self.pace = pace
        self.on_window = on_window
        self.gap = gap
        self.gap_factor = gap_factor
        self.on_pause = on_pause
        self.consumer_unwatched = consumer_unwatched
        self.room = room
        self.pool_start = pool_start
        self._dog: Any = None
        self._open = open_source
        self._watchdog = watchdog
        self._stack = contextlib.ExitStack()
        self._gen: Optional[Iterator] = None
        self._void = False
        self.next_batch: Optional[Callable[[], Any]] = None
        self.move: Optional[Callable[[Any], Any]] = None
        self.beat: Callable[[], None] = _nothing
        self.error: Optional[BaseException] = None
        self.peer_failed = False  # another rank failed (lockstep)
        self.windows: list = []
        self.waits: list = []
        self.opened_seconds = 0.0
        self.first_batch_seconds: Optional[float] = None
        self.warmup_steps = 0
        self.warmup_seconds = 0.0
        self.stopped_by_deadline = False
        self.discarded = 0  # windows under way when the consumer paused
        self.pauses = 0  # every pause of the consumer (windows, warm-up or the rest of an epoch)
        self.paused_seconds = 0.0
        self.used = 0  # steps handed out so far (the first batch, warm-ups and windows)
        self.kept_from = 0
        self.steady = False
        self.finished = False  # the visit ran to its end (kept_from and steady decided)
        self.measured: Optional[Measured] = None
        # a visit that starts a pool kept for later visits: its share is counted from its
        # first batch, the deadline moved by the opening and the first batch, up to this
        self.first_free: Optional[float] = None

    # -- the protocol -------------------------------------------------------------

    def __enter__(self) -> Iterator:
        t0 = self.clock()
        try:
            if self._watchdog is not None:
                self._dog = self._stack.enter_context(self._watchdog())
                self.beat = self._dog.beat
            if self._open is not None:
                self.next_batch, self.move = self._stack.enter_context(self._open())
        except (KeyboardInterrupt, BisectError):
            self._stack.close()
            raise
        except Exception as exc:  # the point fails; a lockstep rank still takes part, without steps
            self.error = exc
        self.opened_seconds = self.clock() - t0
        self._gen = self._steps()
        return self._gen

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        swallow = isinstance(exc, Exception) and not isinstance(exc, BisectError)
        try:
            self._end(_StepFailed(exc) if swallow else None)
        finally:
            self.measured = self._measured()
            # the source sees the visit's error (the consumer's, or one the pipeline raised
            # inside the visit): a loader terminates its workers, which may hang
            err = exc if exc is not None else self.error
            if err is not None and self._dog is not None:
                # a failed point's loader stops its workers within a grace of its own
                # (sources._terminate); the watchdog, whose --step-timeout may be as short,
                # would cut that and leave hung workers alive until garbage collection
                self._dog.pause()
            try:
                self._stack.__exit__(type(err) if err is not None else None, err, err.__traceback__ if err else None)
            except (KeyboardInterrupt, BisectError):
                raise
            except Exception as close_exc:  # the source failed to close (or the watchdog cut its
                if self.error is None:       # shutdown): this point's failure, not the run's
                    self.error = close_exc
                    self.measured = self._measured()
        return swallow

    def void(self) -> None:
        """The consumer paused (an epoch's end, another loader): the window under way is
        discarded at the next request and the visit warms up again."""
        self._void = True

    # -- the steps ------------------------------------------------------------------

    def _end(self, failure: Optional[_StepFailed]) -> None:
        """The consumer is done: a failure is thrown in where the visit waits (a lockstep
        unit ends and agrees before the visit ends); otherwise the visit is closed."""
        gen = self._gen
        if gen is None:
            return
        if failure is not None and self.error is None:
            self.error = failure.exc
        try:
            if failure is not None and inspect.getgeneratorstate(gen) == inspect.GEN_SUSPENDED:
                gen.throw(failure)
        except (StopIteration, _StepFailed):
            pass
        finally:
            gen.close()

    def _unit(self, n: int, per_step: Optional[list] = None):
        """Hand out `n` batches and time them: one unit (the first batch, the warm-up or
        a window). Locally it ends early at the deadline or when voided. Returns a _Unit."""
        u = _Unit()
        clock, beat, nb, move, gap = self.clock, self.beat, self.next_batch, self.move, self.gap
        local, deadline = not self.pace.lockstep, self.deadline
        dog = self._dog if self.consumer_unwatched else None  # the consumer's time is not watched
        with self.pace.unit():
            try:
                if nb is not None and self.error is None:
                    self.sync()
                    start = t_in = clock()
                    for _ in range(n):
                        b = nb()
                        t_out = clock()
                        if dog is not None:
                            dog.pause()
                        yield b if move is None else move(b)
                        now = clock()
                        if dog is not None:
                            dog.resume()
                        beat()
                        u.steps += 1
                        u.wait += t_out - t_in
                        if per_step is not None:
                            per_step.append(now - t_in)
                        if self._void or now - t_out > gap:
                            u.voided, self._void = True, False
                            self.pauses += 1
                            self.paused_seconds += now - t_out
                            self.on_pause(now - t_out)
                            break
                        t_in = now
                        if local and now >= deadline:
                            break
                    self.sync()
                    u.seconds = clock() - start
            except _StepFailed as failure:
                self.error = self.error or failure.exc
            except (KeyboardInterrupt, BisectError):
                raise
            except Exception as exc:  # the pipeline raised (or the watchdog fired) while fetching
                self.error = exc
        self.used += u.steps
        u.failed = self.pace.agree(self.error is not None or nb is None)
        if u.failed and self.error is None and nb is not None:
            self.peer_failed = True
        return u

    def _warm(self, n: int, per_step: Optional[list] = None):
        """Untimed steps, again whenever a pause voids them. Returns False on failure."""
        while True:
            u = yield from self._unit(n, per_step)
            self.warmup_steps += u.steps
            if u.failed:
                return False
            if not u.voided:
                return True
            if per_step is not None:
                per_step.clear()

    def _start(self):
        """The first batch apart, the untimed warm-up, and the plan fitted to the step it
        showed: returns the first window's length, or None when a unit failed."""
        plan, clock, pace = self.plan, self.clock, self.pace
        t0 = clock()
        first = yield from self._unit(1)
        if first.failed:
            return None
        self.first_batch_seconds = clock() - t0
        if self.first_free is not None and not pace.lockstep:  # the pool's start is in no share
            self.deadline = min(self.first_free, self.deadline + self.opened_seconds + self.first_batch_seconds)
        times: list = []
        w0 = clock()
        if not (yield from self._warm(plan.min_warmup_steps + self.first_prefetch + self._after_start(), times)):
            return None
        self.warmup_seconds = clock() - w0
        tail = times[len(times) // 2:] or [max(self.first_batch_seconds, 1e-6)]
        est, left = pace.decide([sum(tail) / len(tail), self.deadline - clock()])
        self.deadline = clock() + left  # the deciding rank's deadline, on this clock
        if self.gap_factor:  # a pause far beyond a step is not the loop's (see the module's docstring)
            self.gap = max(self.gap_factor * est, plan.window_seconds)
        # fitted to the step: a long one (seen first here in a user's loop's first visit),
        # and whole-epoch windows where the loader ends short epochs
        self.plan = plan.at_step(est)
        return self.plan.window_steps(est)

    def _after_start(self) -> int:
        """One untimed step after the first batch of a visit that started the workers, where
        a long step's plan takes no warm-up (Plan.for_step) and the time left holds it and a
        window: the loop's next steps after a pool's start are slowed by it (a fork's
        copy-on-write of the loop's memory, the workers' own start), and a window right
        after the first batch would time that (docs/benchmarks.md: the detection reference
        with 2 workers, 13% over its steady step). `pool_start`: the step as estimated
        before the visit, or None where the visit starts no pool (cached batches, a parked
        pool resumed). None under torchrun's lockstep either: every rank's warm-up must be
        alike."""
        est, plan = self.pool_start, self.plan
        if est is None or not plan.long(est) or plan.min_warmup_steps or self.pace.lockstep or plan.max_steps \
                or self.room() is not None:  # (a script's batches shared out, or its epoch's end ahead)
            return 0
        return int(self.clock() + (1 + plan.min_window_steps) * est <= self.deadline)

    def _steps(self):
        steps = yield from self._start()
        if steps is None:
            return
        plan, clock, pace = self.plan, self.clock, self.pace
        while True:
            if not pace.lockstep and clock() >= self.deadline:
                self.stopped_by_deadline = True
                break
            if plan.max_steps and self.windows and self.used + plan.min_window_steps > plan.max_steps:
                break  # its share of the script's batches is used (Plan.for_steps)
            room = self.room()
            if room is not None and room - 1 < plan.min_window_steps:
                # too little of the consumer's epoch is left for a window: the rest of it
                # untimed (its end voids it, as expected), then warm up again
                u = yield from self._unit(room)
                if u.failed or not (yield from self._warm(plan.min_warmup_steps + self.prefetch_depth)):
                    return
                continue
            if plan.max_steps and self.windows:
                steps = max(plan.min_window_steps, min(steps, plan.max_steps - self.used))
            # a window ends before the epoch's last batch, whose step takes in the epoch's end
            u = yield from self._unit(steps if room is None else min(steps, room - 1))
            if u.failed:
                return
            if u.voided:  # the consumer paused inside the window: discard it, warm up again
                self.discarded += 1
                if not (yield from self._warm(plan.min_warmup_steps + self.prefetch_depth)):
                    return
                continue
            if u.steps == 0 or (self.windows and u.steps < plan.min_window_steps) or not plan.whole(u.steps):
                # cut by the deadline below the plan's minimum (it times a fraction of one
                # worker's burst) or inside an epoch (it holds a share of the epoch ends
                # that is not its own): the windows before it are the measurement
                self.stopped_by_deadline = True
                break
            self.windows.append(Window(u.steps, u.seconds))
            self.waits.append(u.wait)
            self.on_window(len(self.windows), self.windows[-1])
            nxt = next_window(self.windows, steps, plan, self.deadline - clock(), self.keep)
            go_on, steps, out = pace.decide([nxt.go_on, nxt.steps, nxt.out_of_time])
            self.stopped_by_deadline = bool(out)
            steps = int(steps)
            if not go_on:
                break
        if self.windows:
            start, steady = pace.decide(list(kept_windows(self.windows, plan, self.keep)))
            self.kept_from, self.steady = int(start), bool(steady)
        self.finished = True

    def _measured(self) -> Measured:
        if not self.finished and self.windows:  # closed early: the local rule keeps what it can
            self.kept_from, self.steady = kept_windows(self.windows, self.plan, self.keep)
        kept = tuple(self.windows[self.kept_from:])
        return Measured(windows=kept, opened_seconds=self.opened_seconds,
                        first_batch_seconds=self.first_batch_seconds, warmup_steps=self.warmup_steps,
                        warmup_seconds=self.warmup_seconds, stopped_by_deadline=self.stopped_by_deadline,
                        steady=self.steady and bool(kept), warmup_windows=len(self.windows) - len(kept),
                        wait_seconds=sum(self.waits[self.kept_from:]), discarded=self.discarded,
                        pauses=self.pauses, paused_seconds=self.paused_seconds,
                        error=self.error, peer_failed=self.peer_failed)


def drive(visit: Visit, step: Callable[[Any], Any]) -> Measured:
    """The tool's own driver: `step` on every batch the visit hands out."""
    with visit as batches:
        for batch in batches:
            step(batch)
    return visit.measured


def drive_all(schedule: Iterable[Visit], step: Callable[[Any], Any]) -> None:
    """Every visit of a schedule (rounds.Rounds, turns.Trials, ...), driven by `step`."""
    for visit in schedule:
        drive(visit, step)


@contextlib.contextmanager
def fixed_source(next_batch: Callable[[], Any], move: Optional[Callable[[Any], Any]] = None):
    """A source that is already open: `next_batch` as it is (tests, benchmarks)."""
    yield next_batch, move


def time_steps(next_batch: Callable[[], Any], step: Callable[[Any], Any], *, plan: Plan, deadline: float,
               clock: Clock, prefetch_depth: int = 0, keep: Optional[int] = None) -> Measured:
    """One visit of `step` over `next_batch`, as the tool times a point (benchmarks:
    a hand loop timed by the same rule)."""
    return drive(Visit("steps", lambda: fixed_source(next_batch), batch_size=1, plan=plan, deadline=deadline,
                       clock=clock, prefetch_depth=prefetch_depth, keep=keep), step)
