"""The second witness: what the worker stages should cost in the loop, from their costs
alone (pure).

The bisection reads each stage's cost as a drop between two points of the training loop:
a few rounds of windows, each a difference of two long times. The isolated timings
(isolate.py) time the workers' stages alone, one sample or batch at a time in this
process, over many more items: each stage's work per batch with its standard error. From
those, the user's workers and cores, and the time the loop takes at the first point
measured after `augmented` (`base`: collated, host or device), this module predicts the
drop the loop should show at each worker stage (load, augment, collate), and its noise:

    work(p)   the workers' work per batch still to do at point p, on one core:
              full: load + augment + collate; raw: augment + collate; augmented: collate

    serial    num_workers=0: the loop does the work itself, item after item:
              t(p) = base + work(p), each stage's drop its own work. It holds exactly,
              but for the noise of both measurements.
    parallel  workers on cores of their own (an accelerator's step, num_workers at most
              the cores less the loop's one): t(p) = max(base, work(p) / num_workers);
              the workers hide what the step covers. Assumes the work divides evenly
              among the workers and a batch's handoff costs nothing beyond `base`.
    shared    workers sharing the cores with a CPU step (its threads and the workers more
              than the cores), or more workers than cores: t(p) = base + k work(p), k the
              loop's cost of a unit of the workers' work, at least 1 / cores (the cores
              shared perfectly) and often more than 1 (on 2 cores with a 2-thread step and
              2 workers, the public pipelines read k of 1-1.7: the step's parallel regions
              stall on a descheduled thread). k is taken from the rounds' own gap
              (t(full) - base over work(full)): the rounds say what the input costs the
              loop in all, the isolated costs how it divides among the stages.

verdict.decide holds the drops against these (verdict._witnessed): where the rounds cannot
order two stages the prediction may; where the two disagree beyond both noises no stage
is named on either alone; a run whose rounds cannot bound the gap may still say `none`
where the predicted loss is small beyond its noise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

# The worker stages, upstream to downstream, and the points their work is still to do at.
WORKER_STAGES = ("load", "augment", "collate")
WORK_POINTS = ("full", "raw", "augmented")
# Each stage is timed alone in a slice of its own (a few tenths of a second), and a
# machine's state moves from one slice to the next: the standard error of a stage's
# items misses that (docs/benchmarks.md: 5-25% from run to run where it said 1-7%). So
# each stage's cost alone carries at least this much noise, relative, beside its items'.
SLICE_NOISE = 0.10


@dataclasses.dataclass(frozen=True)
class Alone:
    """The isolated costs as the verdict reads them: each worker stage's work per batch
    on one core (seconds) and its standard error; how the loop runs the work (`mode`,
    see the module's docstring), the workers and the cores, and the assumptions in
    words. A stage whose cost was not timed apart (the transforms not split from
    loading) is missing: `load` then holds augment's work too."""

    work: Mapping[str, float]
    se: Mapping[str, float]
    mode: str
    workers: int
    cores: int
    merged: bool = False  # load's work holds augment's
    samples: int = 0  # the fewest items any stage was timed over
    # the degrees of freedom of the stages' noise (_df): the items' standard errors are
    # estimated from `samples` and the slice's floor is not; None: samples - 1
    df: Optional[float] = None
    in_loop: bool = False  # load and collate timed between steps, in the loop's conditions (serial)
    # the training step timed alone before the points (seconds per batch): the step the
    # costs alone were compared with (isolate: workers_needed), a reading of the step
    # apart from the rounds' (verdict._none_unchecked); None where it was not timed so
    step: Optional[float] = None
    # a streaming dataset's load timed through its iterator in a worker (`work`): the same
    # load timed by index in this process (get_item), per batch, where it was
    index_load: Optional[float] = None

    def at(self, point: str) -> Optional[tuple]:
        """(work per batch still to do at `point`, its standard error), or None where
        it is not known (raw when augment was not timed apart)."""
        stages = WORKER_STAGES[WORK_POINTS.index(point):]
        if self.merged and point == "raw":
            return None
        if any(s not in self.work for s in stages if not (self.merged and s == "augment")):
            return None
        keep = [s for s in stages if s in self.work]
        return sum(self.work[s] for s in keep), math.sqrt(sum(self.se[s] ** 2 for s in keep))

    def describe(self) -> str:
        """The model's assumptions, as the report states them."""
        if self.mode == "serial":
            return ("num_workers=0: the loop does every stage's work itself, one after the other"
                    + (", timed between its steps" if self.in_loop else ""))
        if self.mode == "parallel":
            return (f"{self.workers} worker(s) on cores of their own ({self.cores} cores): the workers hide the work "
                    "the step covers, shared evenly among them")
        return f"{self.workers} worker(s) share {self.cores} cores with the step"


def alone(isolated: Any, loader: Mapping, device: str) -> Optional[Alone]:
    """The isolated costs of a run (results.Isolated) as the verdict reads them, or None
    where they cannot witness: not measured, no standard error kept (a document written
    before they were), an IterableDataset (load and augment together, no raw point)."""
    if isolated is None or not getattr(isolated, "ok", False):
        return None
    items = isolated.items_per_batch or isolated.batch_size
    load, aug, col = isolated.part("load"), isolated.part("augment"), isolated.part("collate")
    if not items or load is None or col is None or load.se_ms_per_sample is None or col.se_ms_per_batch is None:
        return None
    merged = "augment" in (load.includes or ())
    work = {"load": load.ms_per_sample * items / 1e3, "collate": col.ms_per_batch / 1e3}
    se = {"load": _noise(load.ms_per_sample, load.se_ms_per_sample) * items / 1e3,
          "collate": _noise(col.ms_per_batch, col.se_ms_per_batch) / 1e3}
    samples = [load.samples or 0, col.batches or 0]
    own = {"load": (load.se_ms_per_sample * items / 1e3, load.samples), "collate": (col.se_ms_per_batch / 1e3, col.batches)}
    if not merged:
        if aug is None or aug.se_ms_per_sample is None:
            return None
        work["augment"] = aug.ms_per_sample * items / 1e3
        se["augment"] = _noise(aug.ms_per_sample, aug.se_ms_per_sample) * items / 1e3
        samples.append(aug.samples or 0)
        own["augment"] = (aug.se_ms_per_sample * items / 1e3, aug.samples)
    w = isolated.workers  # its cores and the step's threads, also before the step's time is known
    cores = int(w.cores) if w is not None and w.cores else 1
    threads = int(w.step_threads or 0) if w is not None else 0
    workers = int(loader.get("num_workers") or 0)
    on_cpu = str(device).startswith("cpu")
    if workers == 0:
        mode = "serial"
    elif waits(isolated) or (workers <= cores - 1 and not (on_cpu and workers + max(1, min(threads, cores)) > cores)):
        mode = "parallel"  # cores of their own, or work that waits and needs none
    else:
        mode = "shared"
    timed = isolated.part("step")
    step = timed.alone_ms_per_batch / 1e3 if timed is not None and timed.alone_ms_per_batch else None
    index_load = load.index_ms_per_sample * items / 1e3 if load.index_ms_per_sample is not None else None
    in_loop = isolated.part("in_loop")
    if mode == "serial" and in_loop is not None and in_loop.fetch_se_ms is not None and in_loop.collate_se_ms is not None:
        # the loop's own conditions (isolate._in_loop): what the loop pays for the same
        # work; fetching holds load and augment, augment's share its cost alone
        fetch, other = in_loop.fetch_ms_per_batch / 1e3, work.get("augment", 0.0)
        work["load"] = max(0.0, fetch - other)
        se["load"] = math.hypot(_noise(fetch, in_loop.fetch_se_ms / 1e3), se.get("augment", 0.0))
        work["collate"] = in_loop.collate_ms_per_batch / 1e3
        se["collate"] = _noise(work["collate"], in_loop.collate_se_ms / 1e3)
        samples = [in_loop.batches or 0] + samples[2:]
        own = {"fetch": (in_loop.fetch_se_ms / 1e3, in_loop.batches), "collate": (in_loop.collate_se_ms / 1e3,
                                                                                   in_loop.batches),
               **({"augment": own["augment"]} if "augment" in own else {})}
        return Alone(work, se, mode, workers, cores, merged, min(samples), in_loop=True, step=step,
                     df=_df(se.values(), own.values()))
    return Alone(work, se, mode, workers, cores, merged, min(samples), step=step, index_load=index_load,
                 df=_df(se.values(), own.values()))


def _noise(cost: float, se: float) -> float:
    """A stage's noise alone: its items' standard error and the slice's (SLICE_NOISE)."""
    return math.hypot(se, SLICE_NOISE * cost)


def _df(noise, own) -> float:
    """The degrees of freedom of the stages' noise (`noise`: each stage's, _noise), by
    Welch-Satterthwaite: only the items' standard errors (`own`: (se, items timed)) are
    estimated, with items - 1 each; the slice's floor is a fixed share. Two items of a
    1-s augment whose noise is all the floor's compare as the floor says, not as two
    items would (Student's t at 1 degree of freedom: 13 times the noise at 97.5%)."""
    var = sum(x * x for x in noise)
    parts = [se ** 4 / (n - 1) if n and n >= 2 else math.inf for se, n in own if se]
    denom = sum(parts)
    return math.inf if denom == 0 else var * var / denom if math.isfinite(denom) else 1.0


# A worker stage whose CPU time alone is under this share of its wall time waits more than
# it computes (storage, a network, an object store, a sleep): its workers overlap their
# waits without taking cores from the step (the parallel model), and scale past the cores
# (tune.py lets the search go there).
WAITING_SHARE = 0.5


def waits(isolated: Any) -> str:
    """'the workers' stages wait: CPU 12% of their time alone' where the CPU time of load
    and augment together, alone, is under WAITING_SHARE of their wall time; "" where they
    compute (or a document written before the CPU time was kept). Together, not stage by
    stage: a stage of next to nothing (load 0.13 ms a sample where the MONAI tutorial's
    transforms do the loading) is all noise in its share."""
    parts = [isolated.part(n) if isolated is not None and isolated.ok else None for n in ("load", "augment")]
    parts = [p for p in parts if p is not None and p.ms_per_sample and p.cpu_ms_per_sample is not None]
    wall = sum(p.ms_per_sample for p in parts)
    if not parts or wall <= 0:
        return ""
    share = sum(min(p.cpu_ms_per_sample, p.ms_per_sample) for p in parts) / wall
    if share >= WAITING_SHARE:
        return ""
    return f"the workers' stages wait: CPU {share * 100:.0f}% of their time alone"


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the loop should read at the worker stages' points: each point's predicted time
    (`times`, with `base` at `base_point`) and its standard error, the contention factor
    k (shared: fitted from the rounds' gap, with its standard error; serial 1), and the
    model (Alone)."""

    alone: Alone
    base_point: str
    base: float
    times: Mapping[str, float]
    se: Mapping[str, float]
    k: float = 1.0
    k_se: float = 0.0

    def drop(self, lower: str, upper: str) -> Optional[tuple]:
        """(the predicted t(lower) - t(upper), the standard error of the work it stands
        for, and its standard error with the shared model's k's too), or None where either
        point is not predicted (beyond base_point, or raw without augment apart). Two
        drops compare on the second (k, common to both, moves neither's order); a drop
        against its reading on the third."""
        if lower not in self.times or upper not in self.times:
            return None
        d = self.times[lower] - self.times[upper]
        if self.alone.mode == "parallel":
            # both over the step: the stages between over the workers (the work they share
            # is one measurement, not two); else the one over it alone (the other's is 0)
            both = self.se[lower] > 0 and self.se[upper] > 0
            se = (_between_se(self.alone, lower, upper, self.base_point) / self.alone.workers if both
                  else math.hypot(self.se[lower], self.se[upper]))
            return d, se, se
        # serial and shared: k (work(lower) - work(upper)), the stages between counted once
        wl, wu = self.alone.at(lower), (self.alone.at(upper) if upper != self.base_point else (0.0, 0.0))
        if wl is None or wu is None:
            return None
        work, se = wl[0] - wu[0], _between_se(self.alone, lower, upper, self.base_point)
        return d, self.k * se, math.hypot(self.k * se, work * self.k_se)

    def gap_upper(self, z: float) -> Optional[float]:
        """What the worker stages could cost the loop in all (t(full) - base) at most, z
        standard errors up: serial exactly, parallel by its model, shared with k = 1 (no
        sharing; a loop that stalls on its workers pays more, which the rounds' own gap
        then shows: verdict._none_alone holds it against that)."""
        w = self.alone.at("full")
        if w is None:
            return None
        if self.alone.mode == "parallel":
            return max(0.0, (w[0] + z * w[1]) / self.alone.workers - self.base)
        return w[0] + z * w[1]

    def gap_lower(self, z: float) -> Optional[float]:
        """What they cost the loop at least, z standard errors down: serial exactly,
        parallel by its model (what the workers cannot hide behind the step: a handoff
        only adds to it), shared with k = 1 / cores (the cores shared perfectly: the
        step's threads keep them busy, so the work's CPU time comes on top, spread over
        all of them)."""
        w = self.alone.at("full")
        if w is None:
            return None
        work = max(0.0, w[0] - z * w[1])
        if self.alone.mode == "parallel":
            return max(0.0, work / self.alone.workers - self.base)
        return work / self.alone.cores if self.alone.mode == "shared" else work


def _between_se(a: Alone, lower: str, upper: str, base_point: str) -> float:
    """The standard error of the work of the stages between two points."""
    first = WORK_POINTS.index(lower)
    last = len(WORK_POINTS) if upper == base_point else WORK_POINTS.index(upper)
    stages = [s for s in WORKER_STAGES[first:last] if s in a.se]
    return math.sqrt(sum(a.se[s] ** 2 for s in stages))


def first_after(fitted: Mapping[str, float]) -> Optional[str]:
    """The base point: the first fitted point after the worker stages' points (collated,
    host or device), or None."""
    return next((p for p in fitted if p not in WORK_POINTS), None)


def predict(a: Optional[Alone], fitted: Mapping[str, float], gap: Optional[tuple] = None) -> Optional[Prediction]:
    """The prediction for one verdict's fitted points (drops.fit: point -> seconds per
    batch, upstream to downstream), at every worker stage's point the costs alone know,
    measured or not; None without `full` or a point after `augmented`.
    `gap`: the rounds' t(full) - base and its standard error, for the shared model's k."""
    if a is None or "full" not in fitted:
        return None
    base_point = first_after(fitted)
    if base_point is None:
        return None
    base = fitted[base_point]
    times, se = {base_point: base}, {base_point: 0.0}
    k, k_se = 1.0, 0.0
    if a.mode == "shared":
        w = a.at("full")
        if w is None or w[0] <= 0 or gap is None:
            return None
        # at least 1 / cores (the cores shared perfectly); no ceiling: a loop whose step's
        # threads stall on descheduled workers pays more than the work itself (the public
        # pipelines on 2 cores read k of 1.3-1.7), and k's noise is the gap's
        k = max(1.0 / a.cores, gap[0] / w[0])
        k_se = gap[1] / w[0]
    for p in WORK_POINTS:  # the points not measured too: a row the rounds read whole is split (verdict._within)
        w = a.at(p)
        if w is None:
            continue
        if a.mode == "parallel":
            over = w[0] / a.workers > base
            times[p], se[p] = max(base, w[0] / a.workers), (w[1] / a.workers if over else 0.0)
        else:
            times[p], se[p] = base + k * w[0], math.hypot(k * w[1], w[0] * k_se)
    return Prediction(a, base_point, base, times, se, k, k_se)
