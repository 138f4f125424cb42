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

from .experiment import MEASURE_ORDER
from .visit import Pace, Visit


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
        dist.destroy_process_group()


class Coordinator:
    """The ranks' agreement, on a gloo side group."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.group = dist.new_group(backend="gloo")
        self.joinables: list = []

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

    def broadcast(self, values: list) -> list:
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.broadcast(t, src=0, group=self.group)
        return t.tolist()

    def any(self, flag: bool) -> bool:
        t = torch.tensor([1 if flag else 0], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def all(self, flag: bool) -> bool:
        return not self.any(not flag)

    def gather(self, obj: Any) -> list:
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def close(self) -> None:
        """The last agreement: every rank reaches it before any leaves the side group,
        which is then destroyed, and the user's DDP modules are let go. Held here until
        the interpreter's own teardown, a module's process group was destroyed late, after
        the script had destroyed it, and gloo could abort ("terminate called without an
        active exception")."""
        self.joinables = []
        if dist.is_initialized():
            dist.barrier(group=self.group)
            dist.destroy_process_group(self.group)

    def join(self) -> contextlib.AbstractContextManager:
        if not self.joinables:
            return contextlib.nullcontext()
        from torch.distributed.algorithms.join import Join

        return Join(self.joinables)

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


def gather_reports(local: Any, coord: Coordinator, waits: dict) -> list:
    """Every rank's report document and its waits for data (one all_gather_object): the
    ranks' last agreement, after which the coordinator is closed (both drivers: bisect()
    and a user's loop, whose default group is the script's own)."""
    mine = {"rank": coord.rank, "report": local.to_dict(),
            "input_wait_ms_per_batch": {k: round(v * 1e3, 3) for k, v in waits.items()}}
    gathered = coord.gather(mine)
    coord.close()
    return gathered
