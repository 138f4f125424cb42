"""Compare adjacent points, cost each stage, and name the bottleneck (pure)."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional

from .stats import NOISY_REL_IQR, Throughput, decreasing_fit, is_real, noise_threshold, point_sigmas

# Upstream to downstream. A stage sits between the point before it and the point after.
POINTS = ("full", "raw", "augmented", "collated", "host", "device")
STAGES = ("load", "augment", "collate", "handoff", "transfer")

# `none` says the input pipeline keeps up, so the loss to input must be known to be
# small: its upper confidence bound, Z_UPPER standard errors above the estimate (97.7%
# one-sided), must stay under NONE_MAX_LOSS of t(full). 10% is the middle of the
# TensorFlow analyzer's "moderately input-bound" band (5-20%): a run that cannot rule
# out more than that has not shown that the pipeline keeps up, and says `inconclusive`.
Z_UPPER = 2.0
NONE_MAX_LOSS = 0.10
# A run stops measuring once its verdict would stand with this much more noise than
# measured (a named stage) or this much less (`none`: more data could only reveal a
# stage): the margin of the sequential rule, since each extra look at the data is another
# chance for noise to pass a threshold, so stopping early asks for more than deciding.
SETTLE_NOISE_SCALE = 1.5
# Relative noise below which a point's standard error is not trusted when weighting the
# points against each other: a few windows that happen to agree are not a 0.1% estimate.
MIN_REL_SE = 0.01


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
class Inconsistency:
    """`slower` ran slower than `faster`, a point upstream of it that does all of its work
    and more, beyond the noise: the step did not cost the same at both."""

    slower: str
    faster: str
    slower_samples_per_sec: float
    faster_samples_per_sec: float

    def describe(self) -> str:
        return (f"{self.slower} ({self.slower_samples_per_sec:,.0f} samples/s) ran slower than {self.faster} "
                f"({self.faster_samples_per_sec:,.0f} samples/s), which does all of its work and more")


@dataclasses.dataclass(frozen=True)
class Verdict:
    bottleneck: Optional[str]  # None: no verdict could be made
    stages: tuple[StageCost, ...]
    gap_sec_per_batch: Optional[float] = None
    input_bound_fraction: Optional[float] = None  # share of the step time lost to input
    reason: str = ""
    ceiling: Optional[str] = None  # the point taken as the ceiling
    # Each consistent point's time per batch as the verdict uses it: the measured times
    # fitted so that no point costs more than one upstream of it (stats.decreasing_fit).
    fitted: Mapping[str, float] = dataclasses.field(default_factory=dict)
    inconsistent: tuple[Inconsistency, ...] = ()
    gap_sigma: Optional[float] = None


def decide(
    measured: Mapping[str, Throughput],
    batch_size: float,
    skipped: Mapping[str, str] = {},
    *,
    noise_scale: float = 1.0,
) -> Verdict:
    """Name the bottleneck from the points that were measured.

    `measured` maps point name to its throughput for the points whose status is ok;
    `skipped` maps a point to the reason it does not apply here (`host` without an
    accelerator, `collated` at num_workers=0), so the stage that ends at it is reported as
    not applicable instead of merged; a point merely not selected is not in it.
    `noise_scale` > 1 asks whether the verdict stands with that much more noise.

    Algorithm (t = seconds per batch, sigma its standard error; each constant above says why):
        no verdict without `full` and one other point
        inconsistent = points slower than one upstream of them beyond the noise,
                       worst first, each left out before looking again  (find_inconsistent)
        fitted = the kept points' t, fitted so none costs more than one upstream of it,
                 weights 1/sigma^2 (violations within the noise pooled)  (_fit)
        ceiling = the last kept point; gap = fitted(full) - fitted(ceiling)
        stages = for each pair of adjacent kept points (lower, upper), the first stage
                 between them costs fitted(lower) - fitted(upper) (the costs add up to
                 the gap), the others between are merged into it, and a stage whose
                 end point does not apply here is skipped  (_cost_stages)
        real = stages whose cost is beyond the noise (stats.is_real)
        verdict (_name):
            some stage real: the costliest stage when it is real and its lead over the
                             runner-up is real too; else inconclusive
            no stage real:   inconclusive if the gap itself is real (spread over stages);
                             none if gap + Z_UPPER sigma <= NONE_MAX_LOSS t(full);
                             else inconclusive (too noisy to tell)
    """
    if "full" not in measured:
        return Verdict(None, _unmeasured_stages(skipped), reason="the full pipeline was not measured")
    present = [p for p in POINTS if p in measured]
    if len(present) < 2:
        return Verdict(None, _unmeasured_stages(skipped), reason="no cache point was measured besides the full pipeline")
    sigma = point_sigmas(measured)
    inconsistent = find_inconsistent(measured, present, sigma, noise_scale)
    left_out = {i.slower for i in inconsistent}
    fitted = _fit(measured, [p for p in present if p not in left_out], sigma)
    if len(fitted) < 2:
        return Verdict(None, _unmeasured_stages(skipped), reason="no cache point was consistent with the full pipeline",
                       inconsistent=inconsistent, fitted=fitted)
    kept = list(fitted)
    t_full, ceiling = fitted["full"], kept[-1]
    gap = max(0.0, t_full - fitted[ceiling])
    gap_sigma = math.hypot(sigma["full"], sigma[ceiling])
    stages = _cost_stages(kept, fitted, sigma, skipped=skipped, left_out=left_out, batch_size=batch_size,
                          noise_scale=noise_scale)
    bottleneck, reason = _name(stages, sigma, gap=gap, gap_sigma=gap_sigma, t_full=t_full, noise_scale=noise_scale,
                               measured=measured)
    return Verdict(bottleneck, stages, reason=reason, gap_sec_per_batch=gap, input_bound_fraction=gap / t_full,
                   ceiling=ceiling, fitted=fitted, inconsistent=inconsistent, gap_sigma=gap_sigma)


def _fit(measured: Mapping[str, Throughput], kept: list, sigma: Mapping[str, float]) -> dict:
    """The kept points' times per batch, fitted so that none costs more than a point
    upstream of it (stats.decreasing_fit), each weighted by 1/sigma^2 (its noise, at
    least MIN_REL_SE of it: a few windows that happen to agree are not a 0.1% estimate)."""
    t = {p: measured[p].sec_per_batch for p in kept}
    weights = [1.0 / max(sigma[p], MIN_REL_SE * t[p], 1e-12) ** 2 if math.isfinite(sigma[p]) else 1e-30
               for p in kept]
    return dict(zip(kept, decreasing_fit([t[p] for p in kept], weights)))


def _cost_stages(kept: list, fitted: Mapping[str, float], sigma: Mapping[str, float], *, skipped: Mapping[str, str],
                 left_out: set, batch_size: float, noise_scale: float) -> tuple:
    """Every stage's StageCost, in STAGES order (see decide)."""
    t_full, ceiling = fitted["full"], kept[-1]
    gap = max(0.0, t_full - fitted[ceiling])
    stages: dict = {}
    for lower, upper in zip(kept, kept[1:]):
        spanned = list(STAGES[POINTS.index(lower):POINTS.index(upper)])
        applicable = [s for s in spanned if not _not_applicable(s, skipped)]
        for s in spanned:
            if s not in applicable:
                stages[s] = StageCost(s, "skipped", reason=_na_reason(s, skipped))
        if not applicable:
            continue
        head = applicable[0]
        cost = max(0.0, fitted[lower] - fitted[upper])
        s_cost = math.hypot(sigma[lower], sigma[upper])
        stages[head] = StageCost(
            head, "ok", upper=upper, lower=lower, sec_per_batch=cost, sigma=s_cost,
            share_of_gap=(cost / gap) if gap > 0 else None,
            samples_per_sec_if_free=batch_size / max(t_full - cost, fitted[ceiling]),
            significant=is_real(cost, s_cost, t_full, noise_scale), includes=tuple(applicable))
        between = [p for p in POINTS[POINTS.index(lower) + 1:POINTS.index(upper)] if p in left_out]
        why = (f"measured together with {head}: {', '.join(between)} was inconsistent (left out)" if between
               else f"measured together with {head}: a point between them was not measured")
        for s in applicable[1:]:
            stages[s] = StageCost(s, "merged", reason=why)
    return tuple(stages.get(s) or StageCost(s, "unavailable", reason="the points around it were not measured")
                 for s in STAGES)


def _name(stages: tuple, sigma: Mapping[str, float], *, gap: float, gap_sigma: float, t_full: float,
          noise_scale: float, measured: Mapping[str, Throughput]) -> tuple[str, str]:
    """(bottleneck, reason) from the costed stages (see decide)."""
    costed = sorted((c for c in stages if c.status == "ok"), key=lambda c: c.sec_per_batch, reverse=True)
    real = [c for c in costed if c.significant]
    if real:
        top = costed[0]
        if not top.significant:
            return "inconclusive", (
                f"{real[0].stage} adds a real {real[0].sec_per_batch * 1e3:.1f} ms per batch, but {top.stage} may cost "
                f"more ({top.sec_per_batch * 1e3:.1f} ± {top.sigma * 1e3:.1f} ms, within the noise): measure longer or "
                "on a quieter machine")
        second = costed[1] if len(costed) > 1 else None
        if second is not None and not is_real(top.sec_per_batch - second.sec_per_batch,
                                              _lead_sigma(top, second, sigma), t_full, noise_scale):
            return "inconclusive", (
                f"{top.stage} and {second.stage} cost about the same; neither can be named alone" if second.significant
                else f"{top.stage} adds a real {top.sec_per_batch * 1e3:.1f} ms per batch, but {second.stage} may cost "
                     f"as much ({second.sec_per_batch * 1e3:.1f} ± {second.sigma * 1e3:.1f} ms, within the noise)")
        return top.stage, f"removing {top.stage} buys the most throughput"
    if is_real(gap, gap_sigma, t_full, noise_scale):
        return "inconclusive", (f"throughput drops by {gap * 1e3:.1f} ms per batch, but no single stage's drop is "
                                "above the noise")
    upper_bound = gap + Z_UPPER * gap_sigma * noise_scale
    if upper_bound <= NONE_MAX_LOSS * t_full:
        return "none", "the full pipeline runs at the ceiling within noise"
    return "inconclusive", too_noisy(measured, upper_bound / t_full)


def _lead_sigma(top: StageCost, second: StageCost, sigma: Mapping[str, float]) -> float:
    """Standard error of top's cost minus second's, from the points' own: each cost is
    t(lower) - t(upper), so a point the two stages share (adjacent stages) counts twice."""
    coef: dict = {}
    for s, sign in ((top, 1), (second, -1)):
        coef[s.lower] = coef.get(s.lower, 0) + sign
        coef[s.upper] = coef.get(s.upper, 0) - sign
    return math.sqrt(sum((c * sigma[p]) ** 2 for p, c in coef.items()))


def find_inconsistent(measured: Mapping[str, Throughput], present: list, sigma: Mapping[str, float],
                      noise_scale: float = 1.0) -> tuple:
    """Points slower than a point upstream of them beyond the noise (`sigma`: each
    point's standard error, stats.point_sigmas), worst first; each one found is left out
    before looking again (one slow point makes one inconsistency)."""
    t = {p: measured[p].sec_per_batch for p in present}
    kept, found = list(present), []
    while True:
        worst = None
        for i, up in enumerate(kept):
            for down in kept[i + 1:]:
                excess = (t[down] - t[up]) / noise_threshold(math.hypot(sigma[up], sigma[down]), t[present[0]],
                                                             noise_scale)
                if excess > 1.0 and (worst is None or excess > worst[0]):
                    worst = (excess, down, up)
        if worst is None:
            return tuple(found)
        _, down, up = worst
        found.append(Inconsistency(down, up, measured[down].samples_per_sec, measured[up].samples_per_sec))
        kept.remove(down)


def too_noisy(measured: Mapping[str, Throughput], upper_loss: float) -> str:
    """Why a run without a real drop cannot say `none`, and what to do."""
    noisy = sorted(((tp.rel_iqr, p) for p, tp in measured.items() if tp.rel_iqr > NOISY_REL_IQR), reverse=True)
    where = ", ".join([f"{p} ±{r * 100:.0f}%" for r, p in noisy[:3]]
                      + [f"{p}: {tp.n} window" for p, tp in measured.items() if tp.n < 2])
    return (f"the measurements are too noisy to tell ({where + '; ' if where else ''}the loss to input could be up to "
            f"{min(upper_loss, 1.0) * 100:.0f}%): close other work on this machine, or raise --max-seconds for more rounds")


def settled(v: Verdict, more_noise: Verdict, less_noise: Verdict) -> bool:
    """Is the verdict firm enough to stop measuring? The same decision made with
    SETTLE_NOISE_SCALE times the noise (`more_noise`) must name the same stage; a `none`
    must stay `none` with 1/SETTLE_NOISE_SCALE of it (`less_noise`: no stage would turn
    real with more windows). Never an inconclusive verdict. (An inconsistent point has
    been measured again once by the scheduler before this is asked, then left out.)"""
    if v.bottleneck in (None, "inconclusive"):
        return False
    if v.bottleneck == "none":
        return less_noise.bottleneck == "none"
    return more_noise.bottleneck == v.bottleneck


def in_question(v: Verdict) -> tuple:
    """The stages the user will look inside: the one named, or, when two lead the
    verdict too closely to name either (inconclusive, and a stage's cost is real), the
    two costliest; none for `none`, no verdict, or a gap spread below the noise. The
    breakdowns are shown and the costliest transform confirmed for these (a decode-heavy
    ImageNet-like pipeline often has load and augment tied)."""
    if v.bottleneck in STAGES:
        return (v.bottleneck,)
    if v.bottleneck != "inconclusive":
        return ()
    costed = sorted((s for s in v.stages if s.status == "ok"), key=lambda s: s.sec_per_batch, reverse=True)
    if not any(s.significant for s in costed):
        return ()
    return tuple(s.stage for s in costed[:2])


def deciding_points(v: Verdict) -> set:
    """The points whose measurement can still change verdict `v`: around the costliest
    stage and its runner-up when a stage is named or two are tied; `full` and the
    ceiling when the question is the gap (none, or too noisy); every costed point when
    the gap is real but spread over stages."""
    costed = sorted((s for s in v.stages if s.status == "ok"), key=lambda s: s.sec_per_batch, reverse=True)
    every = {p for s in costed for p in (s.lower, s.upper)} | {"full"}
    if v.bottleneck is None:
        return every
    if any(s.significant for s in costed):
        return {p for s in costed[:2] for p in (s.lower, s.upper)} | {"full"}
    t_full = v.fitted.get("full")
    if t_full and v.gap_sigma is not None and is_real(v.gap_sec_per_batch or 0.0, v.gap_sigma, t_full):
        return every  # the gap is real but spread over stages
    return {"full", v.ceiling}


def self_check(points: Mapping[str, float], v: Verdict, num_workers: Optional[int], pinned_transfer: bool) -> list:
    """The report's rules (SPEC.md, "Rules that are not negotiable") checked on the
    numbers the report will show: `points` maps each ok point to the samples/s it shows.
    Returns one warning per broken rule (none when the report agrees with itself)."""
    out = []
    names = [p for p in POINTS if p in points]
    for i, up in enumerate(names):
        for down in names[i + 1:]:
            if points[down] < points[up] * (1 - 1e-6):  # the shown rates are fitted: any slower is a bug
                out.append(f"the report shows {down} slower than {up}, which does more work")
    real = [s for s in v.stages if s.status == "ok" and s.significant]
    for s in real:
        if (s.share_of_gap or 0) > 1.0 + 1e-9:
            out.append(f"the report shows {s.stage} at {s.share_of_gap:.0%} of the gap")
    if v.bottleneck == "none" and real:
        out.append(f"the verdict is none beside real stage cost(s): {', '.join(s.stage for s in real)}")
    if num_workers == 0 and not pinned_transfer and any(s.stage == "handoff" for s in real):
        out.append("handoff shows a real cost at num_workers=0, where the loop has no handoff work")
    return [f"the report breaks its own rules: {p}. Please report this with the JSON document." for p in out]


# The stage that ends at a point: when that point does not apply here (it coincides with
# the point after it), neither does the stage. `transfer` ends at `host` (no accelerator:
# host and device coincide); `handoff` at `collated` (num_workers=0 and no pinning in
# the loop: nothing runs between collate_fn and the step).
_ENDS_AT = {"transfer": "host", "handoff": "collated"}


def _not_applicable(stage: str, skipped: Mapping[str, str]) -> bool:
    return _ENDS_AT.get(stage) in skipped


def _na_reason(stage: str, skipped: Mapping[str, str]) -> str:
    return skipped.get(_ENDS_AT.get(stage), "not applicable")


def _unmeasured_stages(skipped: Mapping[str, str]) -> tuple[StageCost, ...]:
    out = []
    for s in STAGES:
        if _not_applicable(s, skipped):
            out.append(StageCost(s, "skipped", reason=_na_reason(s, skipped)))
        else:
            out.append(StageCost(s, "unavailable", reason="the points around it were not measured"))
    return tuple(out)
