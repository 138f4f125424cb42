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
cannot name the straggler. Each rank also records how long its loop waits for its next
batch: the rank that waits at `full` is the one whose input pipeline sets the pace, and
the overall verdict is that rank's bisection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .report import PointResult, Report
from .run import MEASURE_ORDER, failed
from .stats import Throughput, Window
from .timing import Measured, Plan, kept_windows, visit_state
from .verdict import POINTS

# A rank is a straggler when its loop waits for data at `full` for at least this share
# of the time per batch (the verdict's own "real drop" floor, stats.MIN_REL_DROP)...
STRAGGLER_MIN_WAIT_SHARE = 0.05
# ...and for at least this share of the longest wait of any rank (ranks with about the
# same stall are named together).
STRAGGLER_REL_TO_MAX = 0.5


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


@dataclasses.dataclass
class LockstepMeasured:
    measured: Optional[Measured]
    error: Optional[BaseException]  # this rank's
    peer_failed: bool  # another rank failed, so the point ended everywhere
    wait_seconds: float  # time the timed windows spent waiting for a batch
    steps: int


def measure(next_batch: Optional[Callable[[], Any]], move, step, *, batch_size: int, plan: Plan, deadline: float,
            clock, sync, prefetch_depth: int, coord: Coordinator, beat: Callable[[], None] = lambda: None,
            on_window: Callable[[int, Window], None] = lambda i, w: None) -> LockstepMeasured:
    """timing.measure in lockstep: the same steps on every rank, rank 0 deciding.
    `next_batch` None means this rank cannot measure the point (it takes part with no
    steps, so that no rank waits for it)."""
    skip = next_batch is None
    wait = [0.0]
    span = [0.0]  # the last unit's own time, without the agreement after it

    def steps(n: int) -> Callable[[], None]:
        def run() -> None:
            sync()
            start = clock()
            for _ in range(n):
                t = clock()
                b = next_batch()
                wait[0] += clock() - t
                step(move(b) if move is not None else b)
                beat()
            sync()
            span[0] = clock() - start
        return run

    t0 = clock()
    err, failed = coord.unit(steps(1), skip)
    t_first = clock() - t0
    if failed:
        return LockstepMeasured(None, err, err is None, 0.0, 0)

    need = max(1, plan.min_warmup_steps + prefetch_depth)
    w0 = clock()
    err, failed = coord.unit(steps(need), skip)
    if failed:
        return LockstepMeasured(None, err, err is None, 0.0, 0)
    est = (clock() - w0) / need
    # rank 0 decides the window length and the deadline
    n, remaining = coord.broadcast([max(plan.min_window_steps, math.ceil(plan.window_seconds / max(est, 1e-7))),
                                    deadline - clock()])
    deadline = clock() + remaining  # rank 0's deadline, on this rank's clock
    warm_seconds = clock() - w0

    windows: list[Window] = []
    wait[0] = 0.0
    stopped = False
    n = int(n)
    while True:
        err, failed = coord.unit(steps(n), skip)
        if failed:
            return LockstepMeasured(None, err, err is None, 0.0, 0)
        windows.append(Window(n, span[0]))
        on_window(len(windows), windows[-1])
        # rank 0 decides whether to go on and how long the next window is
        go, n_next, out_of_time = coord.broadcast(_decide(windows, n, plan, deadline, clock))
        stopped = bool(out_of_time)
        if not go:
            break
        n = int(n_next)
    # rank 0 also decides which windows were warm-up, so every rank keeps the same ones
    kept, steady = kept_windows(windows, plan)
    start, steady = coord.broadcast([len(windows) - len(kept), steady])
    kept, steady = tuple(windows[int(start):]), bool(steady)
    tp = Throughput(kept, batch_size)
    return LockstepMeasured(Measured(tp, t_first, need, warm_seconds, stopped, steady, int(start)),
                            None, False, wait[0], sum(w.steps for w in windows))


def _decide(windows: list, n: int, plan: Plan, deadline: float, clock) -> list:
    """[go on, next window's steps, stopped by the deadline] (rank 0's figures count):
    the single-process visit's rule (timing.visit_state)."""
    if len(windows) == 1:
        w = windows[0]
        n = max(plan.min_window_steps, math.ceil(plan.window_seconds * w.steps / max(w.seconds, 1e-9)))
    if visit_state(windows, plan).done:
        return [0, n, 0]
    per_step = windows[-1].seconds / max(windows[-1].steps, 1)
    left = deadline - clock()
    if left < plan.min_window_steps * per_step:
        return [0, n, 1]
    return [1, max(1, min(n, int(left / max(per_step, 1e-9)))), 0]


# --------------------------------------------------------------------------------------
# The lockstep scheduler: every point on every rank, in the same order
# --------------------------------------------------------------------------------------


def measure_points(run: Any, coord: Coordinator, selected: tuple, waits: dict) -> None:
    """The points on every rank in the same order, each in lockstep; a point no rank can
    measure is settled without steps. `waits` gets each point's wait for data per batch."""
    todo = [p for p in MEASURE_ORDER if p in selected]
    for i, name in enumerate(todo):
        local = run.results.get(name) or run.not_applicable(name)  # failed here already (the fill), or n/a
        if coord.all(local is not None):
            run.results[name] = local
            continue
        run.emit({"event": "point", "point": name, "index": i, "total": len(todo)})
        deadline = run.clock() + max(0.0, run.deadline - run.clock()) / max(1, len(todo) - i)
        result, wait = _point(run, coord, name, deadline, skip=local is not None)
        outcomes = coord.gather((result.status if local is None else "skipped", result.reason))  # agree, then go on
        if local is not None:
            result = local
        elif result.status == "failed" and result.failed_stage == "peer":
            who = [(r, why) for r, (st, why) in enumerate(outcomes) if st == "failed" and r != coord.rank]
            first = who[0] if who else (None, "unknown")
            result = dataclasses.replace(result, reason=f"rank {first[0]} failed at this point: {first[1]}")
        if wait is not None:
            waits[name] = wait
        run.results[name] = result


def _point(run: Any, coord: Coordinator, name: str, deadline: float, skip: bool) -> tuple:
    t0 = run.clock()
    open_error = None
    with contextlib.ExitStack() as stack:
        dog = stack.enter_context(run.watchdog(lambda: f"point {name}"))
        next_batch, move = None, run.move
        if not skip:
            try:
                source, move = run.source(name)
                next_batch = stack.enter_context(source)
            except Exception as exc:  # this rank takes part without steps, then fails the point
                open_error = exc
        opened = run.clock() - t0
        lm = measure(next_batch, move, run.step, batch_size=run.batch_size, plan=run.plan,
                     deadline=deadline, clock=run.clock, sync=run.sync, prefetch_depth=run.prefetch_depth(name),
                     coord=coord, beat=dog.beat,
                     on_window=lambda i, w: run.emit({"event": "window", "point": name, "window": i,
                                                      "max_windows": run.plan.windows_per_visit}))
    error = open_error or lm.error
    if error is not None:
        return failed(run, name, error), None
    if lm.peer_failed or lm.measured is None:
        return PointResult(name, "failed", reason="another rank failed at this point", failed_stage="peer"), None
    m = lm.measured
    return (PointResult(name, "ok", m.throughput, None, opened + m.first_batch_seconds, m.warmup_steps,
                        m.stopped_by_deadline, steady=m.steady), lm.wait_seconds / max(lm.steps, 1))


# --------------------------------------------------------------------------------------
# The ranks' results together
# --------------------------------------------------------------------------------------


def stragglers(waits: list) -> list:
    """Ranks whose loop waits for data at `full`: `waits` holds each rank's
    (wait seconds per batch, seconds per batch) or None."""
    shares = [(w / t if w is not None and t else 0.0) for w, t in (x or (None, None) for x in waits)]
    top = max(shares, default=0.0)
    if top < STRAGGLER_MIN_WAIT_SHARE:
        return []
    return [r for r, s in enumerate(shares) if s >= STRAGGLER_REL_TO_MAX * top]


def combine(local: Any, coord: Coordinator, waits: dict) -> Any:
    """Gather every rank's report (one all_gather_object) and build the combined
    DistributedReport on every rank; only rank 0 prints or writes it (the CLI)."""
    mine = {"rank": coord.rank, "report": local.to_dict(),
            "input_wait_ms_per_batch": {k: round(v * 1e3, 3) for k, v in waits.items()}}
    docs = coord.gather(mine)
    full = []
    for d in docs:
        p = next((p for p in d["report"]["points"] if p["point"] == "full"), None)
        w = d["input_wait_ms_per_batch"].get("full")
        full.append((w, p["ms_per_batch"]) if p and p["status"] == "ok" and w is not None else None)
    slow = stragglers(full)
    pace = slow[0] if len(slow) == 1 else (max(slow, key=lambda r: full[r][0]) if slow else _slowest_full(docs))
    base = local if pace == coord.rank else Report.from_dict(docs[pace]["report"])
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Report)}
    out = DistributedReport(**fields, world_size=coord.world_size, rank=coord.rank, ranks=tuple(docs),
                            pace_rank=pace, straggler_ranks=tuple(slow))
    return dataclasses.replace(out, summary=f"{out.who()} {base.summary}")


def _slowest_full(docs: list) -> int:
    def tp(d: dict) -> float:
        p = next((p for p in d["report"]["points"] if p["point"] == "full"), None)
        return p["samples_per_sec"] if p and p["samples_per_sec"] is not None else math.inf
    return min(range(len(docs)), key=lambda r: tp(docs[r]))


def _point_table(docs: list) -> list:
    rows = []
    for name in POINTS:
        vals = []
        for d in docs:
            p = next((p for p in d["report"]["points"] if p["point"] == name), None)
            if p and p["status"] == "ok" and p["samples_per_sec"] is not None:
                vals.append((p["samples_per_sec"], d["rank"]))
        if not vals:
            rows.append({"point": name, "median_samples_per_sec": None, "slowest_samples_per_sec": None,
                         "slowest_rank": None, "ranks_ok": 0})
            continue
        s = sorted(v for v, _ in vals)
        mid = len(s) // 2
        median = s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
        slowest = min(vals)
        rows.append({"point": name, "median_samples_per_sec": round(median, 1),
                     "slowest_samples_per_sec": slowest[0], "slowest_rank": slowest[1], "ranks_ok": len(vals)})
    return rows


@dataclasses.dataclass(frozen=True)
class DistributedReport(Report):
    """A Report for the whole job: the verdict is that of the rank that sets the pace
    (`pace_rank`); `ranks` holds every rank's own result."""

    world_size: int = 1
    rank: int = 0
    ranks: tuple = ()
    pace_rank: Optional[int] = None
    straggler_ranks: tuple = ()

    def to_dict(self) -> dict:
        doc = Report.to_dict(self)
        doc["world_size"] = self.world_size
        doc["ranks"] = [dict(d) for d in self.ranks]
        doc["distributed"] = {
            "pace_rank": self.pace_rank,
            "straggler_ranks": list(self.straggler_ranks),
            "straggler_rule": (f"a rank whose loop waits for its next batch at `full` for >= "
                               f"{STRAGGLER_MIN_WAIT_SHARE:.0%} of its time per batch, and >= "
                               f"{STRAGGLER_REL_TO_MAX:.0%} of the longest wait of any rank"),
            "points": _point_table(self.ranks),
        }
        return doc

    def who(self) -> str:
        if self.straggler_ranks:
            names = ", ".join(str(r) for r in self.straggler_ranks)
            return (f"[{self.world_size} ranks] straggler rank(s) {names}: its input pipeline sets the pace of "
                    f"every rank; rank {self.pace_rank}'s verdict follows.")
        return (f"[{self.world_size} ranks] no rank waits for its data at full; verdict of rank "
                f"{self.pace_rank} (the slowest at full).")

    def __str__(self) -> str:
        from tabulate import tabulate

        rows = []
        for r in _point_table(self.ranks):
            rows.append([r["point"], _fmt(r["median_samples_per_sec"]), _fmt(r["slowest_samples_per_sec"]),
                         "-" if r["slowest_rank"] is None else r["slowest_rank"]])
        waits = [[d["rank"], _fmt(d["input_wait_ms_per_batch"].get("full"), 2),
                  d["report"]["bottleneck"] or "-"] for d in self.ranks]
        return "\n".join([
            f"torch.distributed: world size {self.world_size}, lockstep (rank 0 decides window lengths)",
            "",
            tabulate(rows, headers=["point", "median samples/s", "slowest samples/s", "slowest rank"],
                     disable_numparse=True, colalign=("left", "right", "right", "right")),
            "",
            tabulate(waits, headers=["rank", "waits for data at full (ms/batch)", "own verdict"],
                     disable_numparse=True, colalign=("right", "right", "left")),
            "",
            Report.__str__(self),
        ])


def _fmt(x: Optional[float], nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"
