"""One experiment: what a bisection carries from phase to phase (Experiment: the caches,
the points' sources, the visits and their results) and the measurements it returns. Every
phase (phases.py, prepare.py) reads and writes this one object, and every schedule asks
it for the visits of its points: rounds.py (one process), distributed.py (torchrun),
verify.py (the advice's check) and sweep.py. The points' sources: point_sources.py.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Optional, Union

import torch

from ..core import causes, faults
from ..core.fixes import Variant
from ..core.results import (NOT_SELECTED, AllocatorHold, AllocatorTiming, CacheInfo, Isolated, Measurements,
                            PointResult, RunInfo, Syncs, Tuning, Verification)
from ..core.stats import MIN_REL_DROP, Throughput, Window
from ..derive import drops, witness
from ..derive.verdict import Z_UPPER, Verdict, decide
from ..pipeline.integrations import nodes
from ..pipeline.loader import LoaderSpec
from ..pipeline.step import make_step, to_device as default_to_device
from . import cache, devices
from .plan import Budget, Plan
from .point_sources import PointSources
from .visit import LOCAL, Pace, Visit

# Measured from the ceiling down, so the most trustworthy numbers come first and a
# run cut short by --max-seconds still has a ceiling to compare with.
MEASURE_ORDER = tuple(reversed(drops.POINTS))
# A hang is cut at the latest this long after --max-seconds (or after the fill's own
# time budget, once a batch is cached): a run ends within --max-seconds plus this plus
# the shutdown of its workers.
HANG_GRACE_S = 5.0
# In a user's loop (loop.py), a pause between two requests longer than this many times
# the warm-up's step (and than a window) is not the loop's own work: an evaluation, a
# checkpoint, an epoch's end the loader could not see; its window is discarded. Periodic
# work shorter than that (a log line every N steps) is part of the loop and stays in.
LOOP_GAP_FACTOR = 20.0


@dataclasses.dataclass
class Experiment(PointSources):
    """One bisection: the pipeline, the device, the plan and clock, the step and transfer,
    the caches once filled, and the points' results as they come."""

    spec: LoaderSpec
    device: torch.device
    plan: Plan
    clock: Callable[[], float]
    progress: Callable[[dict], None]  # where `emit` sends the events (progress.py words them)
    step_timeout: Optional[float]
    start: float
    end: float  # start + max_seconds: the hard end
    deadline: float  # when measuring points stops
    # when the rounds that only settle the verdict stop (after plan.min_rounds): room
    # left for the verification of the advice (verify.py)
    settle_deadline: float = 0.0
    # the rounds after the minimum stop at settle_deadline with an inconclusive verdict
    # too (--tune: the search needs the ceiling and the stage costs, not a named stage)
    settle_undecided: bool = False
    step: Any = None
    move: Any = None
    caches: Optional[cache.Caches] = None
    fresh: bool = False  # the step changes its batch in place: cached points hand it copies
    # The step is a user's own loop (loop.py): batches are handed over as the loader
    # yields them (the loop moves them itself), the windows its pauses fall in are
    # discarded, and the watchdog watches the fetching only.
    loop: bool = False
    room: Callable[[], Optional[int]] = lambda: None  # the batches left in the loop's epoch (loop.py)
    # the batches the user's script has left to give, where it is known (loop.py: its
    # loader's length times the epochs its command line asks for); None: as many as asked
    batches_left: Callable[[], Optional[int]] = lambda: None
    wrapper: Any = None  # the user's loader wrapper every point's batches go through (integrations.timm)
    # stages the user's loop runs in its own process on the loader's batches (a webdataset
    # WebLoader's: integrations.webdataset.LoopStages), timed alone as their own line
    loop_stages: Any = None
    results: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)  # results.Note, as seen while measuring
    visits: int = 0
    # What the phases besides the points measured, as they run.
    allocator_timing: Optional[AllocatorTiming] = None
    schedule: dict = dataclasses.field(default_factory=dict)  # the RunInfo fields of the schedule (rounds.Rounds)
    isolated: Optional[Isolated] = None
    syncs: Optional[Syncs] = None
    verification: Optional[Verification] = None
    tuning: Optional[Tuning] = None  # the search of --tune (tune.py)
    waits: dict = dataclasses.field(default_factory=dict)  # lockstep: per point, the wait for data per batch
    step_alone: Optional[float] = None  # seconds of one step timed alone (hold_allocator), when it was
    # the step timed alone as a window of the device point's work: whole steps on a cached
    # device batch, their total (hold_allocator's one step, or device_alone.time_step's
    # pair); None where it was a median of many (the allocator's blocks) or not timed
    step_window: Optional[Window] = None
    at: Optional[dict] = None  # the last "point" event, while its visit's windows come
    # point -> (ExitStack, next_batch, move, source): replay loaders kept between the visits
    # of the rounds, their workers started once (keeps; open, keep=True; close_kept)
    kept: dict = dataclasses.field(default_factory=dict)
    budget: Optional[Budget] = None  # --max-seconds divided up front (api.start)
    epoch_start: Optional[dict] = None  # the pause at each epoch's start (phases.epoch_start)
    variants: dict = dataclasses.field(default_factory=dict)  # the usable fixes' Variants by kind (advise/fixes.py)

    def __post_init__(self) -> None:
        self.settle_deadline = min(self.settle_deadline or self.deadline, self.deadline)

    def emit(self, event: dict) -> None:
        """Send a progress event (progress.describe lists them). A window event carries the
        index and total of the point event before it, so that it is worded on its own."""
        kind = event.get("event")
        if kind == "point":
            self.at = event
        elif kind == "window" and self.at is not None and self.at.get("point") == event.get("point"):
            event = dict(event, index=self.at["index"], total=self.at["total"])
        elif kind != "warning":  # another phase: its windows are not the point's
            self.at = None
        self.progress(event)

    @property
    def batch_size(self) -> float:
        return self.caches.batch_size if self.caches else (self.spec.batch_size or 1)

    def sync(self) -> None:
        devices.synchronizer(self.device)()

    def step_estimate(self) -> Optional[float]:
        """Seconds a training step takes at most, from what was measured so far: the
        fastest point (its time per batch includes the step), else the step timed alone
        (hold_allocator's, else the isolated timing's window: step_window), else the
        fastest first batch of a visit that ended before a window (a batch and its step:
        steps of seconds show here first); None before any."""
        measured = [p.throughput.sec_per_batch for p in self.results.values() if p.ok]
        if measured:
            return min(measured)
        if self.step_alone is not None:
            return self.step_alone
        if self.step_window is not None:
            return self.step_window.seconds / self.step_window.steps
        firsts = [p.first_batch_seconds for p in self.results.values() if no_window(p) and p.first_batch_seconds]
        return min(firsts) if firsts else None

    def ceiling_alone(self, name: str) -> Optional[PointResult]:
        """Point `name`'s reading from the step timed alone before the points (step_window),
        where that is the point's own work and a visit of it would time no more: `device`
        (a batch cached on the device, stepped on), a step that does not change its batch
        (else the point hands it copies, in its time), the tool's own step (not a user's
        loop), and a long one (a visit's windows are of one step: Plan.for_step). Its visit
        holds the first batch's step untimed beside that window: where the minimum rounds
        do not fit, reading the ceiling so in the first round gives `full` that time
        (rounds.Rounds). None elsewhere."""
        w = self.step_window
        if name != "device" or w is None or self.fresh or self.loop or not self.plan.long(w.seconds / w.steps):
            return None
        return PointResult(name, "ok", Throughput((w,), self.batch_size), visits=0, step_alone=True)

    def least_visit_steps(self, name: str) -> int:
        """The fewest batches a visit of `name` takes: its first batch, its warm-up (and the
        prefetched batches) and its windows at their least (Plan.least_visit_steps of a
        step too long for more than min_window_steps a window)."""
        plan, prefetch = self.visit_plan(name, fit=False)
        return plan.least_visit_steps(math.inf, self.start_prefetch(name, prefetch, self.keeps(name)))

    def least_visit_seconds(self, name: str, spec: Optional[LoaderSpec] = None, *, windows: Optional[int] = None,
                            spare: int = 0) -> float:
        """The least time a visit of `name` takes as `visit` would plan it (Plan.
        least_visit_seconds at step_estimate), with `windows` windows (the plan's by
        default) and `spare` more; 0 while the step's time is not known."""
        sec_per_step = self.step_estimate()
        if sec_per_step is None:
            return 0.0
        plan, prefetch = self.visit_plan(name, spec)
        n = (plan.windows_per_visit if windows is None else windows) + spare
        return plan.least_visit_seconds(sec_per_step, self.start_prefetch(name, prefetch, spec is None), n)

    def visit_plan(self, name: str, spec: Optional[LoaderSpec] = None, epochs: bool = False,
                   fit: bool = True) -> tuple[Plan, int]:
        """The plan a visit of point `name` follows, fitted to the step as far as it is
        known (Plan.for_step), and the batches its loader has prefetched when it starts:
        none where the batches are cached on the host or device; behind a long step, the
        first batch of each worker at most (workers start together, so only those come
        out at once: the queue fills beyond them only when the workers outpace the step),
        none where the costs alone show them outpacing it (input_light), whose windows are
        then of one step (Plan.outpaced). `fit=False`: not fitted here (under torchrun each rank knows its own step, and the
        ranks' warm-ups must be alike: the visit fits the plan to rank 0's estimate).
        With `epochs` (the loader ends its epochs: open), windows of whole epochs
        (Plan.for_epochs) where the user's loader starts its workers again every epoch, a
        cost the check must count at its rate, on both sides of a trial alike (elsewhere an
        epoch's end costs little, and windows stay short); not in a user's loop, whose own
        epoch ends void its windows."""
        spec = spec or self.spec
        est = self.step_estimate() if fit else None
        cached = name in ("host", "device")  # no worker hands these batches over
        plan = self.plan.for_workers(0 if cached else spec.num_workers)
        if epochs and not self.loop and self.spec.num_workers > 0 and not self.spec.persistent_workers:
            plan = plan.for_epochs(spec.batches_per_epoch)
        plan = plan.for_step(est)
        prefetch = 0 if cached else spec.prefetch_depth
        if not plan.long(est):
            return plan, prefetch
        if spec.num_workers and self.input_light(est, spec.num_workers):
            return plan.outpaced(), 0
        return plan, min(prefetch, spec.num_workers)

    def input_light(self, step: float, workers: int) -> bool:
        """Whether, by the stages' costs alone, the input's whole work a batch (at `full`,
        over the `workers`, or the loop's own without) is under MIN_REL_DROP of `step`
        with its error. Behind a long step, workers so outpaced (the step the slower side
        by 20 times at least) hand out prefetched batches that are what their steady state
        gives too, which need not be stepped through untimed, nor need a window hold a
        batch of each (Plan.outpaced); and the ceiling and `full` once each are what a
        verdict needs (rounds.Rounds.least_verdict_seconds)."""
        a = self.alone()
        w = a.at("full") if a is not None else None
        return w is not None and (w[0] + Z_UPPER * w[1]) / max(1, workers) <= MIN_REL_DROP * step

    def visit_deadline(self, name: str, share: float, limit: float, spec: Optional[LoaderSpec] = None,
                       least: float = 0.0) -> float:
        """When a visit of `name` given `share` seconds of a schedule ends: at least its
        least time with a spare window (for a first pair that disagrees), or `least` where
        the schedule saw more (verify.Lead), where that is left before `limit`: a share
        too short for two windows measures no spread."""
        now = self.clock()
        return now + min(limit - now, max(share, least, self.least_visit_seconds(name, spec, spare=1)))

    def watchdog(self, what: Callable[[], str], end: Optional[float] = None) -> faults.Watchdog:
        """A watchdog for one phase: --step-timeout without progress, or `end` (the hard
        end by default) plus HANG_GRACE_S."""
        return faults.Watchdog(self.step_timeout, what, end=(self.end if end is None else end) + HANG_GRACE_S
                               - self.clock())

    def decide(self, noise_scale: float = 1.0) -> Verdict:
        ok = {n: p.throughput for n, p in self.results.items() if p.status == "ok"}
        skipped = {n: p.reason or "" for n, p in self.results.items()
                   if p.status == "skipped" and p.reason != NOT_SELECTED}
        return decide(ok, self.batch_size, skipped, noise_scale=noise_scale, alone=self.alone())

    def alone(self) -> Optional[witness.Alone]:
        """The stages' costs alone as the verdict reads them (witness.alone): the second witness."""
        if not nodes.witnessed(self.spec):
            return None
        return witness.alone(self.isolated, {"num_workers": getattr(self.spec, "num_workers", 0)}, str(self.device))

    def use(self, wl: Any) -> None:
        """The workload's step (the default one built now: inside the run, whose state is
        restored afterwards), its transfer to this device, and its loader wrapper."""
        self.step = make_step(wl.model, wl.optimizer, wl.loss_fn, wl.step)
        move, dev = wl.to_device or default_to_device, self.device
        self.move = lambda batch: move(batch, dev)
        self.wrapper = wl.wrapper
        self.loop_stages = wl.loop_stages

    def not_applicable(self, name: str) -> Optional[PointResult]:
        if name == "host" and self.device.type == "cpu":
            return PointResult(name, "skipped", reason="no accelerator: host and device coincide")
        if isinstance(self.spec, nodes.NodeSpec):  # a node graph's cuts (node_chain.cuts_of)
            why = self.spec.cuts.why.get(name)
            return None if why is None else PointResult(name, "skipped" if name == "collated" else "unavailable",
                                                        reason=why)
        if name == "collated" and self.spec.num_workers == 0 and not (self.spec.pin_memory and self.device.type != "cpu"):
            return PointResult(name, "skipped", reason="num_workers=0: no worker hands batches over and nothing pins "
                                                       "them, so collated and host coincide (no handoff)")
        if name == "raw" and self.caches is not None and not self.caches.has_raw:
            return PointResult(name, "unavailable", reason=self.caches.raw_reason)
        return None

    def visit(self, name: str, deadline: float, *, spec: Optional[LoaderSpec] = None, epochs: bool = False,
              threads: Optional[int] = None, keep: Optional[int] = None, pace: Pace = LOCAL,
              end: Optional[float] = None, skip: bool = False, calls: Optional[list] = None,
              keep_open: Union[bool, str] = False, max_steps: Optional[int] = None,
              variant: Optional[Variant] = None) -> Visit:
        """One visit of point `name` until `deadline`, for a schedule to hand to its driver
        (visit.drive, or a user's loop). `spec`, `epochs`, `threads`, `calls`: see `open`;
        `keep`: windows to keep (plan.windows_per_visit); `end`: the watchdog's hard end
        (the run's by default); `skip`: take part in a lockstep point without steps;
        `keep_open`: the source stays open for the next visit (`open`, keep: True, or the
        key it is kept under); `max_steps`: the most batches it may take (Plan.for_steps:
        a script's batches shared out); `variant`: a fix's (`open`)."""
        spec = spec or self.spec
        plan, prefetch = self.visit_plan(name, spec, epochs, fit=not pace.lockstep)
        key = name if keep_open is True else keep_open
        first_prefetch = self.start_prefetch(key or name, prefetch, bool(keep_open), pace.lockstep)
        plan = plan.for_steps(max_steps, first_prefetch)
        # a visit that starts the workers (not a cached point, not a parked pool resumed)
        starts = self.worker_point(name, spec) and not (
            keep_open and self.resumes(key or name))
        self.visits += 1
        return Visit(
            name, None if skip else (lambda: self.open(name, spec, epochs, threads, calls, keep=keep_open,
                                                       variant=variant)),
            batch_size=self.batch_size, plan=plan, deadline=deadline, clock=self.clock, sync=self.sync, keep=keep,
            pace=pace, prefetch_depth=prefetch, first_prefetch=first_prefetch,
            watchdog=lambda: self.watchdog(lambda: f"point {name}", end),
            on_window=lambda i, w: self.emit({"event": "window", "point": name, "window": i,
                                              "max_windows": keep or self.plan.windows_per_visit}),
            # under torchrun a pause seen on one rank only would break the lockstep: there
            # only the epoch ends, which every rank sees at the same step, void a window
            gap_factor=LOOP_GAP_FACTOR if self.loop and not pace.lockstep else None,
            consumer_unwatched=self.loop, room=self.room,
            pool_start=self.step_estimate() if starts else None)

    def result(self, visit: Visit, batch_size: Optional[float] = None) -> PointResult:
        """The point's result of one visit: ok with its windows, failed with the stage
        whose code raised, or out of time before a window."""
        m, name = visit.measured, visit.point
        first = None if m.first_batch_seconds is None else m.opened_seconds + m.first_batch_seconds
        if m.error is not None:
            return self.failed(name, m.error)
        if m.peer_failed:
            return PointResult(name, "failed", reason="another rank failed at this point", failed_stage="peer")
        if not m.windows:
            return PointResult(name, "failed", reason="out of time before one window was measured (raise --max-seconds)",
                               first_batch_seconds=first, warmup_steps=m.warmup_steps, stopped_by_deadline=True,
                               discarded=m.discarded, pauses=m.pauses, paused_seconds=m.paused_seconds)
        return PointResult(name, "ok", Throughput(m.windows, batch_size or self.batch_size), None, first,
                           m.warmup_steps, m.stopped_by_deadline, steady=m.steady, wait_seconds=m.wait_seconds,
                           discarded=m.discarded, pauses=m.pauses, paused_seconds=m.paused_seconds)

    def failed(self, name: str, exc: BaseException) -> PointResult:
        """A failed point: the stage whose code raised, and the original error."""
        if isinstance(exc, faults.StepTimeout):
            batch = faults.hang_location(exc) == "no batch"
            if exc.past_end:
                what = ("no batch came before the end of --max-seconds" if batch
                        else "the training step was still running at the end of --max-seconds")
            else:
                what = (f"no batch in {self.step_timeout:g} s" if batch
                        else f"the training step did not finish in {self.step_timeout:g} s") + " (--step-timeout)"
            return PointResult(name, "failed", reason=f"{what}; its workers were terminated", failed_stage="hang")
        where = causes.Where(batch_bytes=self.caches.batch_bytes if self.caches is not None else None,
                             num_workers=getattr(self.spec, "num_workers", 0) or 0,
                             prefetch_factor=getattr(self.spec, "prefetch_factor", None))
        stage, reason = faults.classify(exc, where)
        if stage is None:
            stage = _stage_from_traceback(exc, name, self.step, self.move)
            if stage is not None:
                known = causes.explain(causes.texts(exc), where) is not None
                reason = f"{stage} failed: {reason}" if known else f"{stage} raised {reason}"
        return PointResult(name, "failed", reason=reason, failed_stage=stage, error=faults.raw(exc))

    # -- what it measured ---------------------------------------------------------------

    def measurements(self, selected: tuple, *, held: AllocatorHold, interrupted: bool, mode: str = "entry",
                     source: Optional[dict] = None, unreached: Optional[str] = None) -> Measurements:
        """Everything measured so far, typed: the input of diagnosis.diagnose. Points not
        selected are `skipped`, points not reached `not run` (`unreached`: why, where it
        was neither an interruption nor the time: a user's script that ended first)."""
        for name in drops.POINTS:
            if name not in selected:
                self.results[name] = PointResult(name, "skipped", reason=NOT_SELECTED)
            elif name not in self.results:
                why = "interrupted" if interrupted else (unreached or "out of time")
                self.results[name] = PointResult(name, "not run", reason=why)
            elif unreached and not interrupted and no_window(self.results[name]):
                # its visits ran out before a window and the script then ended: more
                # --max-seconds would not have measured it
                self.results[name] = dataclasses.replace(self.results[name], reason=f"no window measured: {unreached}")
                # nor is "raise --max-seconds" the next step the point's budget note said it was
                self.notes = [n for n in self.notes if not (n.kind == "budget" and n.point == name)]
        complete = not interrupted and all(p.status != "not run" and not p.stopped_by_deadline
                                           for p in self.results.values())
        b = self.budget
        run = RunInfo(max_seconds=round(b.max_seconds if b else self.end - self.start, 6),
                      elapsed_s=round(self.clock() - self.start, 3), **_versions(), allocator=held, **self.schedule,
                      budget=b.to_dict() if b else None, startup_s=b.startup_s if b else None,
                      epoch_start=self.epoch_start)
        isolated = self.isolated
        if isolated is not None and isolated.ok and self.allocator_timing is not None:
            isolated = dataclasses.replace(isolated, allocator=self.allocator_timing)
        return Measurements(device=str(self.device), batch_size=self.batch_size, points=tuple(self.results.values()),
                            batch_size_source=self._size_source(), loader=self.spec.settings(),
                            cache=self._cache_info(), run=run, isolated=isolated, syncs=self.syncs,
                            verification=self.verification, tune=self.tuning, notes=tuple(self.notes),
                            complete=complete, interrupted=interrupted, mode=mode, source=source)

    def _size_source(self) -> str:
        if self.caches is not None:
            return self.caches.batch_size_source
        return "DataLoader.batch_size" if self.spec.batch_size is not None else "unknown (the caches could not be filled)"

    def _cache_info(self) -> CacheInfo:
        c = self.caches
        if c is None:
            return CacheInfo()
        return CacheInfo(batches=c.n_batches, samples=len(c.samples), batch_bytes=c.batch_bytes,
                         fill_seconds=round(c.fill_seconds, 4), limited_by=c.limited_by,
                         raw_transforms=tuple(c.raw_found), held=dict(c.held) or None, budget_bytes=c.budget_bytes)


def _versions() -> dict:
    import platform

    import torchvision

    return {"torch": torch.__version__, "torchvision": torchvision.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu_count": os.cpu_count()}


def _stage_from_traceback(exc: BaseException, point: str, train_step: Any, move: Any) -> Optional[str]:
    """Untagged errors: in the step or the transfer (seen from the traceback, at no
    per-step cost), else in the dataset's own __getitem__ (load) at the full point."""
    seen = []
    tb = exc.__traceback__
    while tb is not None:
        seen.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    for stage, fn in (("step", train_step), ("transfer", move)):
        code = _code_of(fn)
        if code is not None and code in seen:
            return stage
    in_fetch = any(c.co_filename.replace(os.sep, "/").endswith("torch/utils/data/_utils/fetch.py") for c in seen)
    if point == "full" and (in_fetch or "DataLoader worker" in str(exc)):
        return "load"
    return None


def _code_of(fn: Any) -> Any:
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(getattr(type(fn), "__call__", None), "__code__", None)
    return code


def no_window(p: Optional[PointResult]) -> bool:
    """A point whose visits all ran out of time before a window (no error); False for
    one not visited yet (None)."""
    return (p is not None and p.status == "failed" and p.stopped_by_deadline and p.failed_stage is None
            and p.throughput is None)
