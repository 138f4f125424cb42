"""The drops between the points: each stage's cost with its noise, and the leads (pure).

Separate from the verdict (verdict.py) because this is the arithmetic its rules read, not
a rule: verdict.decide says the steps in their order, each function here one of them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Optional

from ..core.noise import Noise
from ..core.stats import (Contrast, Throughput, compare, decreasing_blocks, is_real, level, noise_threshold, normal_cdf,
                          t_factor, t_quantile)

# Upstream to downstream. A stage sits between the point before it and the point after.
POINTS = ("full", "raw", "augmented", "collated", "host", "device")
STAGES = ("load", "augment", "collate", "handoff", "transfer")
# Relative noise below which a point's standard error is not trusted when weighting the
# points against each other: a few windows that happen to agree are not a 0.1% estimate.
MIN_REL_SE = 0.01
# The most rounds a projection looks at (rounds_to_decide, rounds_to_tell): a verdict
# further off than that is not one more measuring would give on this machine.
MOST_ROUNDS = 400


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
    rounds: Optional[int] = None  # the rounds its noise was paired over (None: from the windows)
    df: Optional[float] = None  # the degrees of freedom of its noise (None: from the windows)


@dataclasses.dataclass(frozen=True)
class Lead:
    """The costliest stage's lead over another costed stage: the difference of their
    costs, its noise (from the per-round values of that difference, its standard error
    widened for its degrees of freedom at the level the lead is asked at: Z_LEAD, or
    Z_NOISE over fewer than FEW_ROUNDS rounds; Contrast.widened), the least lead that is
    real there (stats.noise_threshold), and whether this one is."""

    stage: str
    over: str
    sec_per_batch: float
    sigma: float
    threshold: float
    real: bool
    rounds: Optional[int] = None
    # A lead within its noise: the rounds (in all) after which it would be real
    # (rounds_to_tell); None where it is real or would not be within MOST_ROUNDS (one under
    # MIN_REL_DROP of t(full) never is: the stages cost the same for any purpose).
    rounds_to_tell: Optional[int] = None


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


# The stage that ends at a point: when that point does not apply here (it coincides with
# the point after it), neither does the stage. `transfer` ends at `host` (no accelerator:
# host and device coincide); `handoff` at `collated` (num_workers=0 and no pinning in
# the loop: nothing runs between collate_fn and the step).
_ENDS_AT = {"transfer": "host", "handoff": "collated"}


def _skipped(stage: str, skipped: Mapping[str, str]) -> Optional[StageCost]:
    """The stage as not applicable here, where the point it ends at is skipped; else None."""
    end = _ENDS_AT.get(stage)
    return StageCost(stage, "skipped", reason=skipped[end]) if end in skipped else None


def unmeasured_stages(skipped: Mapping[str, str]) -> tuple[StageCost, ...]:
    """Every stage of a run without costs: skipped where it does not apply here."""
    return tuple(_skipped(s, skipped) or StageCost(s, "unavailable", reason="the points around it were not measured")
                 for s in STAGES)


def find_inconsistent(measured: Mapping[str, Throughput], present: list, noise: Noise,
                      noise_scale: float = 1.0) -> tuple:
    """Points slower than a point upstream of them beyond the noise (of their difference,
    noise.Noise.contrast), worst first; each one found is left out before looking again
    (one slow point makes one inconsistency)."""
    t = {p: noise.time(p) for p in present}
    kept, found = list(present), []
    while True:
        worst = None
        for i, up in enumerate(kept):
            for down in kept[i + 1:]:
                sigma = noise.contrast({down: 1, up: -1}).sigma
                excess = (t[down] - t[up]) / noise_threshold(sigma, t[present[0]], noise_scale)
                if excess > 1.0 and (worst is None or excess > worst[0]):
                    worst = (excess, down, up)
        if worst is None:
            return tuple(found)
        _, down, up = worst
        found.append(Inconsistency(down, up, measured[down].batch_size / t[down], measured[up].batch_size / t[up]))
        kept.remove(down)


def fit(noise: Noise, kept: list) -> tuple[dict, dict]:
    """The kept points' times per batch, fitted so that none costs more than a point
    upstream of it (stats.decreasing_blocks), each weighted by 1/sigma^2 (its noise, at
    least MIN_REL_SE of it); and each fitted time as the weighted mean of the points
    pooled into it, {point: {q: weight}}, so that a difference of fitted times is a
    contrast of the points' own and its noise is that contrast's (drop)."""
    t = {p: noise.time(p) for p in kept}
    sigma = {p: noise.point_sigma(p) for p in kept}
    weights = [1.0 / max(sigma[p], MIN_REL_SE * t[p], 1e-12) ** 2 if math.isfinite(sigma[p]) else 1e-30
               for p in kept]
    fitted, coef = {}, {}
    for block in decreasing_blocks([t[p] for p in kept], weights):  # consecutive, in kept's order
        total = sum(weights[i] for i in block)
        c = {kept[i]: weights[i] / total for i in block}
        value = sum(w * t[q] for q, w in c.items())
        for i in block:
            fitted[kept[i]], coef[kept[i]] = value, c
    return fitted, coef


def _pooled(coef: Mapping, *points: str) -> bool:
    """Whether any of `points` was pooled with another in the ordered fit."""
    return any(len(coef[p]) > 1 for p in points)


def drop(noise: Noise, coef: Mapping, lower: str, upper: str) -> Contrast:
    """fitted(lower) - fitted(upper) and its noise. Each fitted time is the weighted mean
    of the points pooled into it (fit), so the difference is sum(a_i b_j (t_i - t_j))
    over the points i pooled into `lower` and j into `upper` (weights a, b): its noise is
    at most sum(a_i b_j sigma_ij) (sd(x + y) <= sd(x) + sd(y)), each pair's own from the
    rounds that pair shares (a point measured in a few early rounds and pooled with one
    measured in all of them weighs with its few rounds, by its weight), and never less
    than the noise of the two points' own difference. Two points pooled together differ
    by nothing; the noise of that nothing is their own difference's."""
    own = noise.contrast({lower: 1, upper: -1})
    if coef[lower] is coef[upper]:
        return dataclasses.replace(own, estimate=0.0)
    estimate = (sum(a * noise.time(i) for i, a in coef[lower].items())
                - sum(b * noise.time(j) for j, b in coef[upper].items()))
    if not _pooled(coef, lower, upper):
        return dataclasses.replace(own, estimate=estimate)
    pairs = [(a * b, noise.contrast({i: 1, j: -1})) for i, a in coef[lower].items() for j, b in coef[upper].items()]
    sigma = sum(w * c.sigma for w, c in pairs)
    if own.sigma >= sigma:
        return dataclasses.replace(own, estimate=estimate)
    main = max(pairs, key=lambda wc: wc[0] * wc[1].sigma)[1]  # its degrees of freedom and rounds are said
    return Contrast(estimate, sigma / t_factor(main.df) if math.isfinite(sigma) else math.inf, main.df, main.rounds,
                    own.own_se, main.pooled)


def cost_stages(kept: list, fitted: Mapping[str, float], coef: Mapping, noise: Noise, *, skipped: Mapping[str, str],
                left_out: set, batch_size: float, noise_scale: float) -> tuple:
    """Every stage's StageCost, in STAGES order (see verdict.decide)."""
    t_full, ceiling = fitted["full"], kept[-1]
    gap = max(0.0, t_full - fitted[ceiling])
    stages: dict = {}
    for lower, upper in zip(kept, kept[1:]):
        spanned = list(STAGES[POINTS.index(lower):POINTS.index(upper)])
        applicable = [s for s in spanned if _skipped(s, skipped) is None]
        stages.update((s, _skipped(s, skipped)) for s in spanned if s not in applicable)
        if not applicable:
            continue
        head = applicable[0]
        cost = max(0.0, fitted[lower] - fitted[upper])
        c = drop(noise, coef, lower, upper)
        stages[head] = StageCost(
            head, "ok", upper=upper, lower=lower, sec_per_batch=cost, sigma=c.sigma,
            share_of_gap=(cost / gap) if gap > 0 else None,
            samples_per_sec_if_free=batch_size / max(t_full - cost, fitted[ceiling]),
            significant=is_real(cost, c.sigma, t_full, noise_scale), includes=tuple(applicable), rounds=c.rounds,
            df=c.df)
        between = [p for p in POINTS[POINTS.index(lower) + 1:POINTS.index(upper)] if p in left_out]
        why = (f"measured together with {head}: {', '.join(between)} was inconsistent (left out)" if between
               else f"measured together with {head}: a point between them was not measured")
        for s in applicable[1:]:
            stages[s] = StageCost(s, "merged", reason=why)
    return tuple(stages.get(s) or StageCost(s, "unavailable", reason="the points around it were not measured")
                 for s in STAGES)


def costed(stages: tuple) -> list:
    """The stages measured, costliest first."""
    return sorted((c for c in stages if c.status == "ok"), key=lambda c: c.sec_per_batch, reverse=True)


def leads(stages: tuple, coef: Mapping, noise: Noise, t_full: float, noise_scale: float, *,
          top: Optional[str] = None) -> tuple:
    """The costliest stage's lead over each other costed stage. Each lead's noise comes
    from the per-round values of the difference of the two costs (a point the two stages
    share, adjacent stages, counts with its sign in each round: t(full) - 2 t(raw) +
    t(augmented) for load over augment), so noise common to both costs cancels; it is
    never taken as more than the sum of the two costs' own noise. Where a point of either
    was pooled with another in the ordered fit, the same difference of the fitted times
    (over the rounds all its points share) counts too, where its noise is the larger.
    `top`: that stage's lead over each other (its lead may then be negative)."""
    ranked = costed(stages)
    if top is not None:  # another stage's lead over the rest (verdict._ordered_alone)
        ranked = [c for c in ranked if c.stage == top] + [c for c in ranked if c.stage != top]
    out = []
    for other in ranked[1:]:
        top = ranked[0]
        c = noise.contrast(_lead_coef(top, other, lambda p: {p: 1.0}))
        if _pooled(coef, top.lower, top.upper, other.lower, other.upper):
            # the costs are fitted ones: the same difference of the fitted times, paired
            # over the rounds all of its points share, where that says more
            fitted = _lead_coef(top, other, coef.__getitem__)
            if fitted:
                c = max(c, noise.contrast(fitted), key=lambda x: x.sigma)
        # sd(a - b) <= sd(a) + sd(b): where the per-round estimate says more (few rounds), the
        # two costs' own noise bounds it, so a runner-up whose upper bound is below the
        # leader's lower bound is always behind (stats.compare, at the level stats.level asks)
        lead = top.sec_per_batch - other.sec_per_batch
        cmp = compare(dataclasses.replace(c, estimate=lead), t_full, scale=noise_scale,
                      bound=(cost_noise(top), cost_noise(other)))
        real = lead > cmp.threshold
        tell = None if real else rounds_to_tell(lead, cmp.sigma, c, t_full, noise_scale)
        out.append(Lead(top.stage, other.stage, lead, cmp.sigma, cmp.threshold, real, c.rounds, tell))
    return tuple(out)


def rounds_to_tell(lead: float, sigma: float, c: Contrast, t_full: float, noise_scale: float = 1.0) -> Optional[int]:
    """The rounds after which a lead would be real, its estimate and the spread of its
    per-round values staying as measured over c.rounds rounds. Its standard error, the
    one under its noise `sigma` (widened at the level asked there) or, where larger, the
    one its own per-round values give (c.own_se: the noise pooled over the points reads
    low on small tables, e.g. where only `full` is noisy), narrows as 1/sqrt(r), widened
    again for r - 1 degrees of freedom at the level asked at r rounds. None where there is
    no spread yet, or not within MOST_ROUNDS."""
    n = c.rounds
    if n is None or n < 2 or not math.isfinite(sigma) or lead <= 0:
        return None
    z_now = level(c)
    sd = projected_sd(sigma * z_now / t_quantile(normal_cdf(z_now), c.df), c)  # (c.df: pooled, or n - 1)

    def tells(r: int) -> bool:
        z = level(Contrast(lead, math.nan, r - 1, r, pooled=c.pooled))
        return lead > noise_threshold(sd / math.sqrt(r) * t_quantile(normal_cdf(z), r - 1) / z, t_full, noise_scale, z)
    return first_round(n, tells)


def projected_sd(se: float, c: Contrast) -> float:
    """The spread of one round's value that a projection to more rounds keeps: `se`
    (the standard error over c.rounds rounds) or, where larger, the one the contrast's
    own per-round values give (Contrast.own_se), times sqrt(rounds)."""
    if math.isfinite(c.own_se):
        se = max(se, c.own_se)
    return se * math.sqrt(c.rounds)


def cost_noise(s: StageCost) -> Contrast:
    """A costed stage's cost with its noise as a Contrast (its sigma is the standard error
    widened at Z_NOISE's level for `df`; no df: noise from windows, known): what the
    leads, the second witness and `compare` weigh a stage's cost with."""
    df = math.inf if s.df is None else s.df
    se = s.sigma / t_factor(df) if s.sigma is not None and math.isfinite(s.sigma) else math.inf
    return Contrast(s.sec_per_batch, se, df, s.rounds)


def _lead_coef(top: StageCost, other: StageCost, of) -> dict:
    """cost(top) - cost(other) as coefficients of the points' own times, each point's
    time standing for `of(point)` ({q: weight}: itself, or the points pooled into it).
    A point the two stages share counts with its sign in each (t(full) - 2 t(raw) +
    t(augmented) for load over augment)."""
    out: dict = {}
    for s, sign in ((top, 1.0), (other, -1.0)):
        for p, k in ((s.lower, sign), (s.upper, -sign)):
            for q, w in of(p).items():
                out[q] = out.get(q, 0.0) + k * w
    return {q: w for q, w in out.items() if abs(w) > 1e-12}


def first_round(n: int, decides: Callable[[int], bool], most: int = MOST_ROUNDS) -> Optional[int]:
    """The fewest rounds after `n` at which `decides` holds (more rounds only narrow a
    bound, so a bisection finds the first); None when not within `most`."""
    if n + 1 > most or not decides(most):
        return None
    lo, hi = n + 1, most  # decides(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid + 1, hi)
    return lo
