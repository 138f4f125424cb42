"""Compare adjacent points, cost each stage, and name the bottleneck (pure)."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional

from .stats import Throughput

# Upstream to downstream. A stage sits between the point before it and the point after.
POINTS = ("full", "raw", "augmented", "collated", "host", "device")
STAGES = ("load", "augment", "collate", "handoff", "transfer")
STAGE_BETWEEN = {stage: (POINTS[i], POINTS[i + 1]) for i, stage in enumerate(STAGES)}

# A drop is real only if it exceeds Z_NOISE combined standard deviations of the two
# points it separates (about a 1-in-700 false alarm for Gaussian noise) ...
Z_NOISE = 3.0
# ... and also MIN_REL_DROP of the full pipeline's time per batch. Window-to-window
# spread misses slow drift on a shared machine, which we have seen reach a few percent
# between points measured seconds apart; 5% is also the "not input-bound" threshold of
# the TensorFlow input-pipeline analyzer, so smaller drops are not worth acting on.
MIN_REL_DROP = 0.05

BOTTLENECKS = STAGES + ("none", "inconclusive")


@dataclasses.dataclass(frozen=True)
class StageCost:
    stage: str
    status: str  # ok | skipped | merged | unavailable
    upper: Optional[str] = None  # the downstream (faster) point
    lower: Optional[str] = None  # the upstream (slower) point
    sec_per_batch: Optional[float] = None
    sigma: Optional[float] = None
    share_of_gap: Optional[float] = None
    samples_per_sec_if_free: Optional[float] = None
    significant: bool = False
    includes: tuple[str, ...] = ()
    reason: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    bottleneck: Optional[str]  # None: no verdict could be made
    stages: tuple[StageCost, ...]
    gap_sec_per_batch: Optional[float] = None
    input_bound_fraction: Optional[float] = None  # share of the step time lost to input
    reason: str = ""


def _threshold(sigma: float, t_full: float) -> float:
    return max(Z_NOISE * sigma, MIN_REL_DROP * t_full)


def decide(
    measured: Mapping[str, Throughput],
    batch_size: int,
    skipped: Mapping[str, str] = {},
) -> Verdict:
    """Name the bottleneck from the points that were measured.

    `measured` maps point name to its throughput for the points whose status is ok;
    `skipped` maps a point to the reason it does not apply here (e.g. `host` on CPU),
    so the stage it would separate is reported as not applicable instead of merged.

    Rule (each constant above says why):
      gap = t(full) - t(ceiling), t = seconds per batch, ceiling = most downstream point;
      a stage's cost = t(point above it) - t(point below it), spanning missing points;
      none          if gap <= max(Z*sigma_gap, MIN_REL_DROP*t(full));
      inconclusive  if the costliest stage is not above that threshold, or the runner-up
                    is within the threshold of it (two stages cannot be told apart);
      else the costliest stage.
    """
    if "full" not in measured:
        return Verdict(None, _unmeasured_stages(measured, skipped), reason="the full pipeline was not measured")
    present = [p for p in POINTS if p in measured]
    if len(present) < 2:
        return Verdict(None, _unmeasured_stages(measured, skipped), reason="no cache point was measured besides the full pipeline")

    full = measured["full"]
    ceiling = measured[present[-1]]
    t_full, t_ceil = full.sec_per_batch, ceiling.sec_per_batch
    gap = t_full - t_ceil
    gap_sigma = math.hypot(full.sec_per_batch_sigma, ceiling.sec_per_batch_sigma)

    stages: dict[str, StageCost] = {}
    for lower, upper in zip(present, present[1:]):
        lo_i, up_i = POINTS.index(lower), POINTS.index(upper)
        spanned = [s for s in STAGES[lo_i:up_i]]
        applicable = [s for s in spanned if not _not_applicable(s, skipped)]
        for s in spanned:
            if s not in applicable:
                stages[s] = StageCost(s, "skipped", reason=_na_reason(s, skipped))
        if not applicable:
            continue
        head = applicable[0]
        lo_t, up_t = measured[lower], measured[upper]
        cost = lo_t.sec_per_batch - up_t.sec_per_batch
        sigma = math.hypot(lo_t.sec_per_batch_sigma, up_t.sec_per_batch_sigma)
        stages[head] = StageCost(
            head,
            "ok",
            upper=upper,
            lower=lower,
            sec_per_batch=cost,
            sigma=sigma,
            share_of_gap=(max(cost, 0.0) / gap) if gap > 0 else None,
            samples_per_sec_if_free=batch_size / max(t_full - max(cost, 0.0), t_ceil),
            significant=cost > _threshold(sigma, t_full),
            includes=tuple(applicable),
        )
        for s in applicable[1:]:
            stages[s] = StageCost(s, "merged", reason=f"measured together with {head}: a point between them was not measured")
    ordered = tuple(stages.get(s) or StageCost(s, "unavailable", reason="the points around it were not measured") for s in STAGES)

    common = dict(stages=ordered, gap_sec_per_batch=gap, input_bound_fraction=max(gap, 0.0) / t_full)
    if gap <= _threshold(gap_sigma, t_full):
        return Verdict("none", reason="the full pipeline runs at the ceiling within noise", **common)
    costed = sorted((c for c in ordered if c.status == "ok"), key=lambda c: c.sec_per_batch, reverse=True)
    top = costed[0]
    if not top.significant:
        return Verdict("inconclusive", reason="throughput drops, but no single stage's drop is above the noise", **common)
    if len(costed) > 1:
        second = costed[1]
        diff_sigma = math.hypot(top.sigma, second.sigma)
        if second.significant and top.sec_per_batch - second.sec_per_batch <= _threshold(diff_sigma, t_full):
            return Verdict(
                "inconclusive",
                reason=f"{top.stage} and {second.stage} cost about the same; neither can be named alone",
                **common,
            )
    return Verdict(top.stage, reason=f"removing {top.stage} buys the most throughput", **common)


def _not_applicable(stage: str, skipped: Mapping[str, str]) -> bool:
    # `transfer` is host -> device; with no accelerator the two points coincide.
    return stage == "transfer" and "host" in skipped


def _na_reason(stage: str, skipped: Mapping[str, str]) -> str:
    return skipped.get("host", "not applicable")


def _unmeasured_stages(measured: Mapping[str, Throughput], skipped: Mapping[str, str]) -> tuple[StageCost, ...]:
    out = []
    for s in STAGES:
        if _not_applicable(s, skipped):
            out.append(StageCost(s, "skipped", reason=_na_reason(s, skipped)))
        else:
            out.append(StageCost(s, "unavailable", reason="the points around it were not measured"))
    return tuple(out)
