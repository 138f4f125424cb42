"""Bisecting every rank under torchrun / DistributedDataParallel.

Each rank bisects its own pipeline (its model replica, its loader with its
DistributedSampler shard). Training steps that hold collectives (DDP's all-reduce)
only progress when every rank steps, so the ranks run in lockstep:

- every rank goes through the same points in the same order, and each point through
  the same units (first batch, warm-up, windows) of the same number of steps: rank 0
  decides the warm-up length, the window length and when to stop, and broadcasts it;
  the global deadline is rank 0's, agreed the same way;
- each unit runs inside `torch.distributed.algorithms.join.Join` over the DDP modules,
  so a rank that fails in the middle of a unit stops stepping and *shadows* the others'
  all-reduces until they finish the unit, instead of leaving them blocked;
- after each unit the ranks agree whether any of them failed (one all-reduce on a
  side group); a failure ends the point on every rank, and the point's outcome is
  gathered before the next one starts.

Coordination runs on a gloo group of its own (CPU tensors), whatever the training
backend: NCCL on CUDA, gloo on CPU.

A signal (SIGTERM from a launcher, Ctrl-C) is not raised in the middle of a collective:
while a Coordinator is open, the command line's handler only notes it
(faults.DEFER_INTERRUPTS), and the next agreement carries every rank's pending signal:
when any rank has one, every rank stops there together (`Stopped`), and the ranks gather
what they measured as at the end. A collective that fails (a rank's process died: gloo's
"Connection closed by peer") ends the lockstep on the rank that sees it (`RankLost`):
its document goes to the launcher's store instead (board.py), where the lowest surviving
rank collects them all and writes the job's document, naming the lost ranks and how
they ended.

Under lockstep every rank sees the pace of the slowest one, so the throughput alone
cannot name the straggler. Each visit also records how long its loop waits for its next
batch: the rank that waits at `full` is the one whose input pipeline sets the pace, and
the overall verdict is that rank's bisection (report/ranks.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from ..core import faults
from . import board as board_mod
from .experiment import MEASURE_ORDER
from .visit import Pace, Visit


class Stopped(KeyboardInterrupt):
    """The lockstep stops: a signal reached `signals` ({rank: signal name}). Taken as
    Ctrl-C is (the partial result written). `in_step`: every rank stopped at the same
    agreement, so they can still gather; else the ranks meet on the board (board.py):
    a rank was lost, this rank's main thread was stuck (the rescue), or this rank left
    alone (`left`: its script ended; an interrupt raised outside the agreements, as in
    bisect() called without the command line's handler). `how` says which, in words."""

    AGREED = "every rank stopped at the next agreement"
    STUCK = ("the rank's main thread was stuck (in a collective or a device sync): what was measured was written "
             "from another thread")
    LEFT = "a rank left the lockstep (its script ended, or an interrupt came outside the ranks' agreements)"

    def __init__(self, signals: dict, in_step: bool = True, how: str = AGREED) -> None:
        super().__init__("stopped")
        self.signals = dict(signals)
        self.in_step = in_step
        self.how = how
        self.error: Optional[BaseException] = None
        self.left: Optional[str] = None  # this rank leaves on its own (how, in words): it posts, the others write


class RankLost(Stopped):
    """A collective failed on this rank: another rank's process is gone (or stuck past
    the group's timeout). The lockstep cannot go on; what was measured is kept."""

    def __init__(self, error: BaseException) -> None:
        super().__init__({}, in_step=False, how="a rank was lost")
        self.error = error


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` (raised in a user's own DDP step) is a collective that failed because
    another rank is gone: gloo's "Connection closed by peer", NCCL's errors."""
    backend_error = getattr(dist, "DistBackendError", None)
    if backend_error is not None and isinstance(exc, backend_error):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("gloo/transport" in text or "Connection closed by peer" in text
                                              or "Connection reset by peer" in text)


def _pending_signal() -> int:
    """The signal the command line's handler noted and deferred (0: none)."""
    sig = faults.INTERRUPT_REQUESTED[0]
    return int(sig) if not isinstance(sig, bool) else (2 if sig else 0)


class _Guarded:
    """Join over the DDP modules; a collective of its own that fails (its shadowing of a
    rank that is gone) is RankLost."""

    def __init__(self, join: Any) -> None:
        self.join = join

    def __enter__(self) -> None:
        self.join.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        try:
            return self.join.__exit__(*exc)
        except RuntimeError as error:
            if exc[0] is not None:
                return False  # the exception under way goes on
            raise RankLost(error) from error


def env_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def init_from_env(device: Optional[str]) -> bool:
    """Under torchrun (WORLD_SIZE > 1 in the environment), start the default process
    group before the entry function runs, so it can wrap its model in DDP and give its
    loader a DistributedSampler. NCCL on CUDA, gloo on CPU. True when started here."""
    if env_world_size() <= 1 or not dist.is_available() or dist.is_initialized():
        return False
    on_cuda = torch.cuda.is_available() and not (device or "").startswith("cpu")
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if on_cuda else "gloo")
    return True


def rank() -> int:
    """This process's rank (0 outside torch.distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def shutdown(started_here: bool) -> None:
    if started_here and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a rank lost: its connections are broken, and the process ends anyway
            pass


class Coordinator:
    """The ranks' agreement, on a gloo side group; the board (board.py) for when a rank
    is lost. While it is open, signals wait for the next agreement (module docstring)."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.group = dist.new_group(backend="gloo")
        self.joinables: list = []
        self.board = board_mod.Board.open(self.rank, self.world_size)
        self._deferring = True
        faults.DEFER_INTERRUPTS[0] += 1

    @classmethod
    def current(cls) -> Optional["Coordinator"]:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return cls()
        return None

    def watch(self, model: Any) -> None:
        """Units run inside Join over the DDP modules found in `model`."""
        from torch.distributed.algorithms.join import Joinable

        if model is None:
            return
        self.joinables = [m for m in model.modules() if isinstance(m, Joinable)]

    @staticmethod
    def _collective(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RuntimeError as error:  # gloo's "Connection closed by peer", a timeout, ...
            raise RankLost(error) from error

    def broadcast(self, values: list) -> list:
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        self._collective(lambda: dist.broadcast(t, src=0, group=self.group))
        return t.tolist()

    def any(self, flag: bool) -> bool:
        """Whether any rank's flag is set; every rank's pending signal rides along, and
        one on any rank stops them all here (Stopped)."""
        t = torch.zeros(1 + self.world_size, dtype=torch.int64)
        t[0] = 1 if flag else 0
        t[1 + self.rank] = _pending_signal()
        self._collective(lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group))
        signals = {r: board_mod.signal_name(int(v)) for r, v in enumerate(t[1:].tolist()) if v}
        if signals:
            raise Stopped(signals)
        return bool(t[0].item())

    def all(self, flag: bool) -> bool:
        return not self.any(not flag)

    def gather(self, obj: Any) -> list:
        out: list = [None] * self.world_size
        self._collective(lambda: dist.all_gather_object(out, obj, group=self.group))
        return out

    def release(self) -> None:
        """Signals raise again (once: close and a lost rank's path both call it)."""
        if self._deferring:
            self._deferring = False
            faults.DEFER_INTERRUPTS[0] -= 1

    def close(self) -> None:
        """The last agreement: every rank reaches it before any leaves the side group,
        which is then destroyed, and the user's DDP modules are let go. Held here until
        the interpreter's own teardown, a module's process group was destroyed late, after
        the script had destroyed it, and gloo could abort ("terminate called without an
        active exception")."""
        self.joinables = []
        try:
            if dist.is_initialized():
                self._collective(lambda: dist.barrier(group=self.group))
                dist.destroy_process_group(self.group)
        finally:
            self.release()

    def join(self) -> contextlib.AbstractContextManager:
        if not self.joinables:
            return contextlib.nullcontext()
        from torch.distributed.algorithms.join import Join

        return _Guarded(Join(self.joinables))

    def unit(self, fn: Callable[[], None], skip: bool) -> tuple[Optional[BaseException], bool]:
        """Run `fn` (a fixed number of steps) on every rank that can, under Join; then
        agree. Returns (this rank's error, whether any rank failed)."""
        err: Optional[BaseException] = None
        with self.join():
            if not skip:
                try:
                    fn()
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # shadowed by Join until the others end the unit
                    err = exc
        return err, self.any(err is not None or skip)


class Lockstep(Pace):
    """A visit's pace under torchrun (visit.Pace): every rank runs each unit (the first
    batch, the warm-up, a window) to its end under Join, the ranks agree after it whether
    any failed, and rank 0's decisions (window lengths, deadline, when to stop, which
    windows were warm-up) count on every rank."""

    lockstep = True

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord

    def unit(self) -> contextlib.AbstractContextManager:
        return self.coord.join()

    def agree(self, failed: bool) -> bool:
        return self.coord.any(failed)

    def decide(self, values: list) -> list:
        return self.coord.broadcast(values)


# --------------------------------------------------------------------------------------
# The lockstep schedule: every point on every rank, in the same order
# --------------------------------------------------------------------------------------


class LockstepPoints:
    """The points on every rank in the same order, each one visit in lockstep; a point no
    rank can measure is settled without steps. `waits` gets each point's wait for data
    per batch."""

    def __init__(self, exp: Any, coord: Coordinator, selected: tuple) -> None:
        self.exp = exp
        self.coord = coord
        self.selected = selected
        self.waits: dict = {}

    def __iter__(self) -> Iterator[Visit]:
        exp, coord = self.exp, self.coord
        todo = [p for p in MEASURE_ORDER if p in self.selected]
        for i, name in enumerate(todo):
            local = exp.results.get(name) or exp.not_applicable(name)  # failed here already (the fill), or n/a
            if coord.all(local is not None):
                exp.results[name] = local
                continue
            exp.emit({"event": "point", "point": name, "index": i, "total": len(todo)})
            deadline = exp.clock() + max(0.0, exp.deadline - exp.clock()) / max(1, len(todo) - i)
            visit = exp.visit(name, deadline, pace=Lockstep(coord), skip=local is not None)
            yield visit
            result = exp.result(visit)
            outcomes = coord.gather((result.status if local is None else "skipped", result.reason))  # agree, then go on
            if local is not None:
                result = local
            elif result.failed_stage == "peer":
                who = [(r, why) for r, (st, why) in enumerate(outcomes) if st == "failed" and r != coord.rank]
                first = who[0] if who else (None, "unknown")
                result = dataclasses.replace(result, reason=f"rank {first[0]} failed at this point: {first[1]}")
            if result.wait_per_batch is not None:
                self.waits[name] = result.wait_per_batch
            exp.results[name] = result


@dataclasses.dataclass(frozen=True)
class Gathered:
    """What the ranks measured, at the end: each surviving rank's {"rank", "report",
    "input_wait_ms_per_batch"}, the rank that writes the job's document, the lost ranks
    (board.Board.lost: rank, host, pid, exit_code, signal, how) and the signals that
    stopped the run ({rank: signal name})."""

    docs: list
    world_size: int = 0
    writer: int = 0
    lost: list = dataclasses.field(default_factory=list)
    signals: dict = dataclasses.field(default_factory=dict)
    error: Optional[str] = None  # the failed collective's message, when a rank was lost
    how: Optional[str] = None  # how the run stopped (Stopped.how), when it did


def gather_reports(local: Any, coord: Coordinator, waits: dict, stop: Optional[Stopped] = None) -> Gathered:
    """Every rank's report document and its waits for data: the ranks' last agreement
    (one all_gather_object), after which the coordinator is closed (both drivers:
    bisect() and a user's loop, whose default group is the script's own). After a lost
    rank (`stop` a RankLost, or the gathering fails), through the board instead."""
    mine = {"rank": coord.rank, "report": local.to_dict(),
            "input_wait_ms_per_batch": {k: round(v * 1e3, 3) for k, v in waits.items()}}
    if stop is None or stop.in_step:
        try:
            gathered = coord.gather(mine)
            coord.close()
            return Gathered(gathered, coord.world_size, 0, [], stop.signals if stop else {},
                            how=stop.how if stop else None)
        except RankLost as lost:
            stop = lost
    coord.release()
    return after_loss(mine, coord, stop)


def after_loss(mine: dict, coord: Coordinator, lost: Stopped) -> Gathered:
    """The documents of the surviving ranks, through the board: each posts its own, the
    lowest that posted writes. Without a store, this rank's own, written by rank 0."""
    error = f"{type(lost.error).__name__}: {str(lost.error).strip().splitlines()[0][:300]}" if lost.error else None
    pending = _pending_signal()
    mine = dict(mine, signal=board_mod.signal_name(pending) if pending else None, left=lost.left)
    board = coord.board
    others = [r for r in range(coord.world_size) if r != coord.rank]
    if board is None:
        unknown = [{"rank": r, "host": None, "pid": None, "exit_code": None, "signal": None,
                    "how": "unknown (no store to ask which rank was lost)"} for r in others]
        return Gathered([mine], coord.world_size, 0, unknown, lost.signals, error, lost.how)
    board.post(mine)
    docs = board.collect(board_mod.LEAVE_S if lost.left else board_mod.COLLECT_S)
    docs[coord.rank] = mine
    waiting = [r for r in range(coord.world_size) if r not in docs and not board.gone(r)]
    # a rank that leaves while others still measure writes nothing: they write, its result with theirs
    staying = [r for r, d in docs.items() if not d.get("left")]  # a rank that left may be gone by now
    writer = -1 if lost.left and waiting else board.writer(staying or docs)
    signals = {**{r: d["signal"] for r, d in docs.items() if d.get("signal")}, **lost.signals}
    # the ranks that left count as lost to the ranks still measuring (not when every rank's script ended)
    gone = board.lost(r for r in range(coord.world_size)
                      if r not in docs or (docs[r].get("left") and not lost.left))
    for entry in gone:  # a rank that left said how; its process's record, where there is one, says more
        said = (docs.get(entry["rank"]) or {}).get("left")
        if said and entry["exit_code"] is None and entry["signal"] is None:
            entry["how"] = said
    return Gathered([docs[r] for r in sorted(docs)], coord.world_size, writer, gone, signals, error, lost.how)
