"""Faults of the pipeline under test: which stage failed, what a killed worker means,
a watchdog for hangs, and the /dev/shm check. The pipelines we run are in trouble by
definition: every failure must end up as a clear reason at one point, never a hang."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
import time
from typing import Any, Callable, Iterator, Optional

from . import causes
from .results import Note

# Default --step-timeout: generous, so a slow but healthy first batch (a large model's
# first CUDA call, workers importing heavy modules) is never mistaken for a hang.
DEFAULT_STEP_TIMEOUT = 120.0
# How often the watchdog looks; a hang is reported at most this much late.
_WATCH_INTERVAL = 0.2

class StageError(Exception):
    """Raised by our wrappers around user code, naming the stage it belongs to.

    Its message survives a DataLoader worker (which re-raises exceptions by type and
    message only): "<stage> failed: <OriginalType>: <message>".
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)


def stage_error(stage: str, exc: BaseException) -> StageError:
    return StageError(f"{stage} failed: {type(exc).__name__}: {exc}")


# Set by the CLI's signal handlers. The KeyboardInterrupt they raise is lost when the
# signal lands in code whose exceptions Python ignores (an at-fork hook while workers
# start, a __del__): the next watchdog beat, every step, raises it again.
INTERRUPT_REQUESTED = [False]
# While above 0 (a torchrun lockstep is open: measure/distributed.py), a signal is only
# noted in INTERRUPT_REQUESTED (its number): raised in the middle of a collective it
# would leave the other ranks waiting there; the next agreement stops every rank.
DEFER_INTERRUPTS = [0]
# While above 0 (`signals_held`: a worker pool starting or shutting down), a signal is
# owed (OWED) and raised when the last such block ends; the watchdog's alarm waits too.
HELD = [0]
OWED = [False]


def interrupt_now() -> bool:
    """In a SIGINT or SIGTERM handler: whether to raise its KeyboardInterrupt now. Not
    in a lockstep (DEFER_INTERRUPTS: only noted) nor in a held block (owed to its end)."""
    if DEFER_INTERRUPTS[0]:
        return False
    if HELD[0]:
        OWED[0] = True
        return False
    return True


def _owe(signum: int, frame: Any) -> None:
    """Python's own SIGINT handler as a held block puts it off: raised at the block's end,
    also in a lockstep (Python's handler does not wait for its agreement)."""
    OWED[0] = True


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and the watchdog's alarm while the block runs, then raise
    what came meanwhile: for code that starts or stops a worker pool (DataLoader's iter():
    its workers forked, their index queues primed; its shutdown).

    Python raises a signal's exception between any two bytecodes, also inside
    multiprocessing's and threading's own `with lock:` blocks; one raised between a
    lock's acquire and its block's start leaves the lock held for good. A queue's lock
    held so at a pool's start hangs the process at its exit: multiprocessing's exit
    handler waits on it before it terminates the workers (the report printed, the
    process and its workers left running: tests/core/test_faults.py's interrupt test in
    CI). Under the command line's handler (cli._on_sigterm) the signal is only noted
    here; under Python's own (bisect() in a notebook) SIGINT is owed by one put in for
    the block (_owe). In other threads than the main one (signals go to the main thread) the
    block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    own = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if own:
        signal.signal(signal.SIGINT, _owe)
        undo = undo_in_child(lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
    HELD[0] += 1
    try:
        yield
    finally:
        HELD[0] -= 1
        if own:
            forget_in_child(undo)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if OWED[0] and not HELD[0]:  # (in place of what the block raised, if it did: as Python would)
            OWED[0] = False
            raise KeyboardInterrupt()


# What the tool installs in its own process while it runs (loop_patches.py's patches of
# DataLoader, loop.Session's of os._exit, the CLI's signal handlers) must not act in a process forked
# from it: DataLoader workers started with fork inherit all of it, and a worker that
# exits would otherwise run the tool's os._exit (its report, its --json) in the worker.
# Each installer registers its undo here while installed; a forked child runs them all
# first thing (os.register_at_fork). A spawned worker starts a fresh interpreter, with
# none of it installed.
_UNDO_IN_CHILD: list = []


def undo_in_child(undo: Callable[[], None]) -> Callable[[], None]:
    """Run `undo` in every process forked from this one, until `forget_in_child(undo)`."""
    _UNDO_IN_CHILD.append(undo)
    return undo


def forget_in_child(undo: Callable[[], None]) -> None:
    if undo in _UNDO_IN_CHILD:
        _UNDO_IN_CHILD.remove(undo)


def _after_fork_in_child() -> None:
    undos = _UNDO_IN_CHILD[::-1]
    _UNDO_IN_CHILD.clear()
    INTERRUPT_REQUESTED[0] = False
    DEFER_INTERRUPTS[0] = 0
    HELD[0], OWED[0] = 0, False
    for undo in undos:
        try:
            undo()
        except Exception:  # an at-fork hook must not raise; what it could not undo stays
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class StepTimeout(Exception):
    """Raised in the main thread by the watchdog when a step makes no progress, or is
    still running at the run's hard end (`past_end`)."""

    def __init__(self, message: str, seconds: float = 0.0, past_end: bool = False) -> None:
        super().__init__(message)
        self.seconds = seconds
        self.past_end = past_end


_STAGE_LINE = re.compile(r"StageError: (\S+) failed: (.*)")


def classify(exc: BaseException, where: Optional[causes.Where] = None) -> tuple[Optional[str], str]:
    """(failed stage or None, one-paragraph reason) for an exception raised at a point: a
    known failure (causes.explain: /dev/shm full, a worker killed, a broken shard, the
    descriptor limit, a missing file) told as its cause and fix, else the original error's
    headline. The original text is `raw(exc)`."""
    text = causes.texts(exc)
    known = causes.explain(text, where)
    if known is not None and known.kind == "worker killed":
        return "worker", known.text() + "."
    if isinstance(exc, StepTimeout):
        return None, str(exc)
    text = str(exc)
    if isinstance(exc, StageError) and not text.startswith("Caught"):
        stage, _, rest = text.partition(" failed: ")
        return stage, f"{stage} failed: {known.text()}." if known else f"{stage} raised {rest}"
    hits = _STAGE_LINE.findall(text)
    if hits:  # re-raised from a worker: "Caught StageError in DataLoader worker process N ..."
        stage, rest = hits[-1]
        worker = re.search(r"worker process (\d+)", text)
        where_ = f" (in DataLoader worker {worker.group(1)})" if worker else ""
        if known:
            return stage, f"{stage} failed{where_}: {known.text()}."
        return stage, f"{stage} raised {rest.strip()}{where_}"
    if known:
        return None, known.text() + "."
    if "out of memory" in text.lower() or type(exc).__name__ == "OutOfMemoryError":
        return "step", (f"{type(exc).__name__}: {_headline(text)}. Lower --cache-mb (the caches hold batches on the "
                        "device too) or the batch size.")
    return None, f"{type(exc).__name__}: {_headline(text)}"


RAW_CHARS = 4000  # of the original text kept beside a known cause


def raw(exc: BaseException) -> str:
    """The original text of a failure (its messages and those it was raised from; a
    worker's traceback), what --debug shows beside the cause classify told."""
    text = causes.texts(exc)
    return text if len(text) <= RAW_CHARS else text[:RAW_CHARS // 2] + "\n...\n" + text[-RAW_CHARS // 2:]


def _headline(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) > 2:  # a worker's re-raised traceback: its headline and its last line
        return f"{lines[0]} ... {lines[-1]}"[:500]
    return " ".join(lines)[:500]


class Tagged:
    """Calls `fn`; an exception from it becomes a StageError naming `stage` (module level:
    it crosses to workers)."""

    def __init__(self, fn: Callable, stage: str) -> None:
        self.fn = fn
        self.stage = stage

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.fn(*args, **kwargs)
        except (StageError, StepTimeout):
            raise
        except Exception as exc:
            raise stage_error(self.stage, exc) from exc


def tag(fn: Optional[Callable], stage: str) -> Optional[Callable]:
    return None if fn is None else Tagged(fn, stage)


class Watchdog:
    """Interrupts the main thread when no step finishes for `timeout` seconds, or when
    the work is still running `end` seconds from now (the run's hard end, --max-seconds).

    The timed loop calls `beat()` once per step (one attribute store: nothing else on
    the per-step path). A background thread checks the beat; on a hang it sends SIGALRM
    to this process, whose handler raises StepTimeout in the main thread — a real signal
    also wakes a main thread blocked in a sleep or a queue wait. Only in the main thread
    (signal handlers live there); elsewhere it is a no-op and the DataLoader `timeout`
    still guards the workers.
    """

    def __init__(self, timeout: Optional[float], what: Callable[[], str] = lambda: "the step",
                 end: Optional[float] = None) -> None:
        self.timeout = timeout
        self.what = what
        self.count = 0
        self._stop = threading.Event()
        self._fired: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self._previous = None
        self._since = time.monotonic()
        self._end = None if end is None else time.monotonic() + max(0.0, end)
        self._end_label = "--max-seconds"
        self.paused = False
        self.active = ((bool(timeout) or end is not None) and threading.current_thread() is threading.main_thread()
                       and hasattr(signal, "SIGALRM"))

    def beat(self) -> None:
        self.count += 1
        if INTERRUPT_REQUESTED[0] and not DEFER_INTERRUPTS[0] and not HELD[0]:  # a signal whose KeyboardInterrupt Python swallowed
            raise KeyboardInterrupt()

    def pause(self) -> None:
        """Stop watching until `resume`: the time belongs to someone else (a user's own
        loop, between two batches: loop.py); neither a timeout nor the end fires."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self.count += 1

    def end_in(self, seconds: float, label: str = "--max-seconds") -> None:
        """Move the hard end to `seconds` from now (e.g. when a phase gets its own budget)."""
        self._end = time.monotonic() + max(0.0, seconds)
        self._end_label = label

    def __enter__(self) -> "Watchdog":
        if self.active:
            self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
            self._thread = threading.Thread(target=self._watch, name="bisect-pipeline-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            self._stop.set()
            self._thread.join()
            signal.signal(signal.SIGALRM, self._previous)

    def _watch(self) -> None:
        seen, self._since = self.count, time.monotonic()
        while not self._stop.wait(_WATCH_INTERVAL):
            now = time.monotonic()
            if self.paused:
                if self._end is not None:  # the time paused is not the run's
                    self._end += now - self._since
                self._since = now
                continue
            if self.count != seen:
                seen, self._since = self.count, now
            fire = None
            if self.timeout and now - self._since > self.timeout:
                fire = "timeout"
            elif self._end is not None and now > self._end:
                fire = "end"
            if fire:
                self._fired = fire
                # Again after as long, if the code swallowed the exception and hangs on.
                self._since = now
                if fire == "end":
                    self._end = now + max(self.timeout or 0.0, 2.0)
                os.kill(os.getpid(), signal.SIGALRM)

    def _on_alarm(self, signum, frame) -> None:
        if not self._fired or HELD[0]:  # (held: the watchdog fires again, `_watch`)
            return
        stalled = self.timeout or 0.0
        if self._fired == "end":
            raise StepTimeout(f"{self.what()} was still running at the end of {self._end_label}", stalled,
                              past_end=True)
        raise StepTimeout(f"{self.what()} made no progress in {self.timeout:g} s (--step-timeout)", stalled)


class Rescue:
    """The last resort under torchrun, when the main thread cannot answer a signal.

    Python runs a signal's handler in the main thread, between two bytecodes; a main
    thread blocked in native code (a CUDA synchronize behind an NCCL all-reduce whose peer
    is gone, a gloo collective whose peer hangs) never gets there, and the launcher kills
    the rank 30 s after its SIGTERM, with nothing written. The C-level handler still
    writes the signal's number to the wakeup fd (signal.set_wakeup_fd): a thread reads it
    and, when the run has not ended `grace` seconds after a SIGTERM or SIGINT, or `grace`
    plus `late` seconds after the run's hard end (`watch`), calls `act(signal number, or
    0 for the end)`: the command line writes what was measured (`report`, set by the run
    in progress) and exits from that thread. A main thread that got to the end of the run
    (`final`: gathering the ranks' results, writing them) is let finish it, and one that
    gets there once the rescue acts waits there for the exit: the two never both write."""

    def __init__(self, act: Callable[[int], None], grace: float = 10.0, late: float = 0.0) -> None:
        self.act = act
        self.grace = grace
        self.late = late
        self.report: Optional[Callable[[int], Any]] = None  # the run in progress: its partial report
        self._end: Optional[float] = None
        self._done = threading.Event()
        self._final = threading.Lock()
        self._final_held = False
        self._fds: Optional[tuple] = None
        self._previous_fd = -1

    def arm(self) -> "Rescue":
        """In the main thread: the wakeup fd and the thread that reads it."""
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "set_wakeup_fd"):
            return self
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:
            os.close(r)
            os.close(w)
            return self
        self._fds = (r, w)
        threading.Thread(target=self._watch, name="bisect-pipeline-rescue", daemon=True).start()
        return self

    def watch(self, end: float) -> None:
        """The run's hard end (time.monotonic)."""
        self._end = end

    def final(self) -> None:
        """In the main thread, at the run's end: from here on the main thread writes, the
        rescue only if this never ends (it then waits here for the rescue's exit)."""
        if not self._final_held:
            self._final.acquire()
            self._final_held = True

    def disarm(self) -> None:
        """The run ended: nothing to rescue (the wakeup fd as it was)."""
        self._done.set()
        if self._final_held:
            self._final_held = False
            self._final.release()
        if self._fds is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_fd)
            os.close(self._fds[1])

    def _watch(self) -> None:
        import select

        r = self._fds[0]
        since: Optional[float] = None  # when the first SIGTERM or SIGINT came
        signum = 0
        try:
            while not self._done.is_set():
                now = time.monotonic()
                if since is not None and now >= since + self.grace:
                    return self._act(signum)
                if self._end is not None and now >= self._end + self.grace + self.late:
                    return self._act(0)
                if select.select([r], [], [], 0.2)[0]:
                    data = os.read(r, 64)
                    if not data:  # the write end closed: disarmed
                        return None
                    if since is None and (signal.SIGTERM in data or signal.SIGINT in data):
                        since, signum = now, (signal.SIGTERM if signal.SIGTERM in data else signal.SIGINT)
        finally:
            os.close(r)
        return None


    def _act(self, signum: int) -> None:
        self._final.acquire(timeout=2 * self.grace)  # a main thread writing is let finish
        if not self._done.is_set():
            self.act(signum)


RESCUE: list = [None]  # the command line's Rescue while a torchrun run is armed


def stage_in_traceback(exc: BaseException) -> Optional[str]:
    """The stage whose tagged code was running when `exc` was raised (the innermost
    Tagged wrapper or transform proxy in the traceback), or None."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self") if tb.tb_frame.f_code.co_name == "__call__" else None
        stage = getattr(owner, "stage", None)
        if isinstance(stage, str):
            found = stage
        tb = tb.tb_next
    return found


def hang_location(exc: BaseException) -> str:
    """'no batch' when a StepTimeout was raised while waiting for data, else 'step'."""
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if "torch/utils/data/" in filename:
            return "no batch"
        tb = tb.tb_next
    return "step"


def shm_free_bytes(path: str = "/dev/shm") -> Optional[int]:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


# Batches in flight through shared memory are counted twice: the worker's output and
# the copy a pin-memory thread or the loop may still hold.
SHM_SAFETY = 2.0


def shm_problem(num_workers: int, prefetch_depth: int, batch_bytes: int, free: Optional[int]) -> Optional[Note]:
    """A warning when /dev/shm cannot hold the batches the workers keep in flight."""
    if num_workers == 0 or free is None or batch_bytes <= 0:
        return None
    need = int(prefetch_depth * batch_bytes * SHM_SAFETY)
    if need <= free:
        return None
    return Note("shm", f"/dev/shm has {free / 2**20:.0f} MiB free, workers need about {need / 2**20:.0f}: give docker "
                       "--shm-size=2g.",
                detail=f"{num_workers} workers x prefetch keep about {need / 2**20:.0f} MiB of batches in shared "
                       "memory: workers may die with a bus error. Else use fewer workers, a smaller prefetch_factor "
                       "or smaller batches")
