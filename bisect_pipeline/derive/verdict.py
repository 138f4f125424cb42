"""Compare adjacent points, cost each stage, and name the bottleneck (pure).

Why one module: the ordered fit, the stage costs, the leads, the second witness heard
and the reasons are the one decision `decide` makes, each step reading the `Verdict` the
step before it made; its types are what the rest of the package reads.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional

from ..core.noise import Noise
from ..core.stats import (FEW_ROUNDS, MIN_REL_DROP, Z_NOISE, Contrast, Throughput, compare, decreasing_blocks, is_real,
                          level, noise_threshold, normal_cdf, t_factor, t_quantile)
from . import witness

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
# Which stage leads is asked only of a pipeline already known to be input-bound (a stage
# or the gap real by the noise rule, Z_NOISE): it picks among the stages that cost, by the
# one comparison of the tool (stats.compare: 97.7% one-sided, Student's t at the lead's
# degrees of freedom, Z_NOISE where its noise is pooled over the points from fewer than
# FEW_ROUNDS rounds). Z_NOISE (99.865%) everywhere asked 9.2 se at 4 rounds where this
# asks 3.3: leads of 60-90 ms on steps of 500 ms and more, a 60-s run's 4-7 rounds, stayed
# ties (docs/benchmarks.md). Two stages alike are named as one of them about 1 time in
# 20 (either can lead, so both tails count: 4.6% for Gaussian noise; simulated, 3-9% at
# 10-4 rounds where Z_NOISE gave 0.3-1%), and such a stage is within its noise of the
# costliest; a lead of 1.5x at 6 rounds is named in 84% of simulated runs where Z_NOISE
# named it in 45% (tests/derive/test_verdict.py). Stopping early still asks it with
# SETTLE_NOISE_SCALE more noise.
# A run stops measuring once its verdict would stand with this much more noise than
# measured (a named stage) or this much less (`none`: more data could only reveal a
# stage): the margin of the sequential rule, since each extra look at the data is another
# chance for noise to pass a threshold, so stopping early asks for more than deciding.
SETTLE_NOISE_SCALE = 1.5
# Relative noise below which a point's standard error is not trusted when weighting the
# points against each other: a few windows that happen to agree are not a 0.1% estimate.
MIN_REL_SE = 0.01


# A contrast whose noise comes from fewer than FEW_ROUNDS rounds says so in the verdict's
# reason: its standard error is itself known only roughly (t at 2 degrees of freedom is
# 6.4 z at the noise rule's level), and more rounds of the deciding points would firm it.
# The most rounds a projection looks at (rounds_to_decide, rounds_to_tell): a verdict
# further off than that is not one more measuring would give on this machine.
MOST_ROUNDS = 400
# What the verdict may say: a stage, `tie` (two or more stages lead and the measurements
# cannot tell which costs more: `Verdict.tied`), `none`, or `inconclusive` (whether the
# pipeline is input-bound at all is unknown).
VERDICTS = STAGES + ("tie", "none", "inconclusive")


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
    # A lead within its noise: the rounds (in all) after which it would be real if it and
    # the spread of its per-round values stayed as measured (rounds_to_tell); None where
    # it is real, has no spread yet, or is not within MOST_ROUNDS (one under
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


@dataclasses.dataclass(frozen=True)
class Verdict:
    bottleneck: Optional[str]  # None: no verdict could be made; else one of VERDICTS
    stages: tuple[StageCost, ...]
    gap_sec_per_batch: Optional[float] = None
    input_bound_fraction: Optional[float] = None  # share of the step time lost to input
    reason: str = ""
    ceiling: Optional[str] = None  # the point taken as the ceiling
    # Each consistent point's time per batch as the verdict uses it: the measured times
    # fitted so that no point costs more than one upstream of it (stats.decreasing_fit, by blocks: fit_coef).
    fitted: Mapping[str, float] = dataclasses.field(default_factory=dict)
    inconsistent: tuple[Inconsistency, ...] = ()
    gap_sigma: Optional[float] = None
    gap_upper: Optional[float] = None  # the gap's one-sided upper bound (Z_UPPER's confidence)
    gap_rounds: Optional[int] = None
    tied: tuple[str, ...] = ()  # `tie`: the stages in question, costliest first
    leads: tuple[Lead, ...] = ()  # the costliest stage over each other costed stage
    noise: Any = dataclasses.field(default=None, compare=False, repr=False)  # noise.Noise of the points
    # each fitted point's time as a combination of the points' own (_fit): {point: {q: weight}}
    fit_coef: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # The second witness (witness.py, _witnessed): which witness the verdict rests on
    # (WITNESSES), each worker stage's predicted drop from its cost alone {stage: (seconds
    # per batch, standard error, the same with the shared model's k's)}, the model
    # (witness.Alone.mode), and the stages whose
    # readings disagree with their prediction beyond both noises, or whose order the two
    # witnesses give the other way round.
    witness: str = "rounds"
    predicted: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    model: Optional[str] = None
    disagree: tuple = ()
    prediction: Any = dataclasses.field(default=None, compare=False, repr=False)  # witness.Prediction

    def drop(self, lower: str, upper: str) -> Optional[Contrast]:
        """fitted(lower) - fitted(upper) with its noise (_drop), as every rule of this
        verdict weighs it; the points' own difference where one was left out of the fit
        (inconsistent); None without measurements of both."""
        if self.noise is None or lower not in self.noise.mu or upper not in self.noise.mu:
            return None
        if lower not in self.fit_coef or upper not in self.fit_coef:
            return self.noise.contrast({lower: 1, upper: -1})
        return _drop(self.noise, self.fit_coef, lower, upper)


def decide(
    measured: Mapping[str, Throughput],
    batch_size: float,
    skipped: Mapping[str, str] = {},
    *,
    noise_scale: float = 1.0,
    alone: Optional[witness.Alone] = None,
) -> Verdict:
    """Name the bottleneck from the points that were measured. `measured` maps point
    name to its throughput for the points whose status is ok;
    `skipped` maps a point to the reason it does not apply here (`host` without an
    accelerator, `collated` at num_workers=0), so the stage that ends at it is reported as
    not applicable instead of merged; a point merely not selected is not in it.
    `noise_scale` > 1 asks whether the verdict stands with that much more noise;
    `alone`: the worker stages' costs alone (witness.alone), the second witness.

    Algorithm (t = seconds per batch; every difference's noise from its per-round
    values, noise.Noise; each constant above says why):
        no verdict without `full` and one other point
        t(p) = each point's time with what a round shares at every point taken out
        inconsistent = points slower than one upstream of them beyond the noise,
                       worst first, each left out before looking again  (find_inconsistent)
        fitted = the kept points' t, fitted so none costs more than one upstream of it,
                 weights 1/sigma^2 (violations within the noise pooled)  (_fit)
        ceiling = the last kept point; gap = fitted(full) - fitted(ceiling)
        stages = for each pair of adjacent kept points (lower, upper), the first stage
                 between them costs fitted(lower) - fitted(upper) (the costs add up to
                 the gap), its noise that of the points pooled into either  (_drop),
                 the others between merged into it, one whose end point does not
                 apply here skipped  (_cost_stages)
        leads = the costliest stage's cost minus each other's, real or not by
                stats.compare, its noise from the per-round values of that difference,
                at most the sum of the two costs' own noise  (_leads)
        verdict (_name), real = beyond the noise (stats.is_real):
            a stage real or the gap real (input-bound):
                the costliest stage when every lead is real; else `tie` between it
                and the stages it does not lead beyond the noise
            neither: none if the gap's upper bound (Z_UPPER) <= NONE_MAX_LOSS t(full);
                     else inconclusive, with the rounds that would decide it
        then the second witness, the stages' costs alone (_witnessed)
    """
    present = [p for p in POINTS if p in measured]
    if "full" not in measured:  # no verdict, but the points shown still agree (a partial run)
        noise = Noise(measured) if measured else None
        fitted, coef = _fit(noise, present) if noise is not None else ({}, {})
        return Verdict(None, _unmeasured_stages(skipped), reason="the full pipeline was not measured",
                       fitted=fitted, noise=noise, fit_coef=coef)
    if len(present) < 2:
        return Verdict(None, _unmeasured_stages(skipped), reason="no cache point was measured besides the full pipeline")
    noise = Noise(measured)
    inconsistent = find_inconsistent(measured, present, noise, noise_scale)
    left_out = {i.slower for i in inconsistent}
    fitted, coef = _fit(noise, [p for p in present if p not in left_out])
    if len(fitted) < 2:
        return Verdict(None, _unmeasured_stages(skipped), reason="no cache point was consistent with the full pipeline",
                       inconsistent=inconsistent, fitted=fitted, noise=noise, fit_coef=coef)
    stages = _cost_stages(list(fitted), fitted, coef, noise, skipped=skipped, left_out=left_out,
                          batch_size=batch_size, noise_scale=noise_scale)
    return _witnessed(_judge(stages, fitted, coef, noise, measured, inconsistent=inconsistent, noise_scale=noise_scale),
                      alone, noise_scale=noise_scale)


def _judge(stages: tuple, fitted: Mapping[str, float], coef: Mapping, noise: Noise, measured: Mapping[str, Throughput],
           *, inconsistent: tuple, noise_scale: float) -> Verdict:
    """The verdict from the costed stages: the gap, the leads, the name (see decide)."""
    t_full, ceiling = fitted["full"], list(fitted)[-1]
    gap = max(0.0, t_full - fitted[ceiling])
    gap_c = dataclasses.replace(_drop(noise, coef, "full", ceiling), estimate=gap)
    leads = _leads(stages, coef, noise, t_full, noise_scale)
    bottleneck, tied, reason = _name(stages, leads, gap_c, t_full=t_full, noise_scale=noise_scale, measured=measured)
    return Verdict(bottleneck, stages, reason=reason, gap_sec_per_batch=gap, input_bound_fraction=gap / t_full,
                   ceiling=ceiling, fitted=fitted, inconsistent=inconsistent, gap_sigma=gap_c.sigma,
                   gap_upper=gap_c.upper(Z_UPPER, noise_scale), gap_rounds=gap_c.rounds, tied=tied, leads=leads,
                   noise=noise, fit_coef=coef)


# Which witness a verdict rests on: the drops of the rounds alone (no second witness, or
# it adds nothing), both (the costs alone put the named stage first too), the isolated
# costs (they ordered what the rounds could not, or bounded a loss the rounds could not),
# or neither (the two disagree: no stage named on either alone).
WITNESSES = ("rounds", "both", "isolated costs", "disagree")


def _witnessed(v: Verdict, a: Optional[witness.Alone], *, noise_scale: float) -> Verdict:
    """The verdict with the second witness heard (decide): each worker stage's drop
    predicted from its cost alone (witness.predict), held against the rounds':
        a reading beyond both noises from its prediction (serial and shared models), or
        two stages ordered one way by the rounds and the other by the costs alone:
            no stage named on either alone (a tie of both leaders; `disagree`)
        a tie whose stages the costs alone order beyond their noise: their leader
            (witness "isolated costs")
        a named stage: "both" where the costs alone put it first too
        inconclusive, where the predicted loss and the rounds' rest of the gap stay under
            NONE_MAX_LOSS and the rounds agree: none (witness "isolated costs")"""
    if a is None or v.bottleneck is None or v.noise is None or "full" not in v.fitted:
        return v
    t_full = v.fitted["full"]
    base_point = witness.first_after(v.fitted)
    gap = v.drop("full", base_point) if base_point is not None else None
    pred = witness.predict(a, v.fitted, None if gap is None else (max(0.0, gap.estimate), gap.se))
    cost = {s.stage: s for s in v.stages if s.status == "ok"}
    predicted = {name: d for name, d in ((n, pred.drop(s.lower, s.upper)) for n, s in cost.items()) if d is not None} \
        if pred is not None else {}
    if not predicted:
        return v
    v = dataclasses.replace(v, predicted=predicted, model=a.mode, prediction=pred)
    disagree = _disagreeing(v, cost, predicted, a, t_full, noise_scale=noise_scale)
    if disagree:
        return _disagreement(v, cost, predicted, disagree)
    if v.bottleneck == "tie":
        return _ordered_alone(v, cost, predicted, a, t_full, noise_scale=noise_scale)
    if v.bottleneck in STAGES:
        top = max(predicted, key=lambda n: predicted[n][0])
        return dataclasses.replace(v, witness="both" if top == v.bottleneck else "rounds")
    if v.bottleneck == "inconclusive":
        bound = _bound_alone(v, cost, predicted, pred, gap, noise_scale=noise_scale)
        return bound if bound is not v else _none_alone(v, pred, base_point, gap, noise_scale=noise_scale)
    return v


def _alone_lead(predicted: Mapping, a: witness.Alone, top: str, other: str, noise_scale: float):
    """stats.compare of the predicted drops of `top` and `other`: the lead by the costs
    alone, against the larger of the two (MIN_REL_DROP of it at least: a stage's own
    cost timed alone drifts by a few percent, not by a share of the loop's time)."""
    (p, e, _), (q, f, _) = predicted[top], predicted[other]
    n = max(2, a.samples)
    return compare(Contrast(p - q, math.hypot(e, f), n - 1, n), max(p, q), scale=noise_scale)


def _disagreeing(v: Verdict, cost: Mapping, predicted: Mapping, a: witness.Alone, t_full: float, *,
                 noise_scale: float) -> tuple:
    """The stages whose reading differs from its prediction beyond both noises, at the
    noise rule's level and floor (serial and shared models: the parallel one only orders),
    then, where the rounds' leader leads a stage beyond the noise that the costs alone put
    ahead of it beyond theirs and by MIN_REL_DROP of t(full), both; in the order found."""
    out = []
    if a.mode != "parallel":
        for name, (p, _, e) in predicted.items():
            c = cost_noise(cost[name])
            diff = Contrast(cost[name].sec_per_batch - p, math.hypot(c.se, e), c.df, c.rounds, pooled=c.pooled)
            if compare(diff, t_full, scale=noise_scale, z=Z_NOISE).real:
                out.append(name)
    costed = _costed(v.stages)
    top = costed[0].stage if costed else None
    for lead in v.leads:
        if lead.real and top in predicted and lead.over in predicted:
            behind = _alone_lead(predicted, a, lead.over, top, noise_scale)
            # the other way round by as much as a stage's cost can matter (MIN_REL_DROP of
            # t(full)): two stages that both cost next to nothing alone are no disagreement
            if behind.real and behind.estimate > MIN_REL_DROP * t_full:
                out += [s for s in (top, lead.over) if s not in out]
    return tuple(out)


def _disagreement(v: Verdict, cost: Mapping, predicted: Mapping, disagree: tuple) -> Verdict:
    """The two witnesses disagree: no stage is named on either alone. The rounds' stage or
    tie and the costs' own leader, costliest first by the rounds, are the stages in
    question (a tie), unless both name the same one (it stays named; the disagreement
    elsewhere keeps the run from settling: verdict.settled)."""
    top_alone = max(predicted, key=lambda n: predicted[n][0])
    asked = list(in_question(v))
    if v.bottleneck not in STAGES + ("tie",):
        return dataclasses.replace(v, disagree=disagree)
    words = [_disagree_words(n, cost[n], predicted[n]) for n in disagree]
    up = v.prediction.gap_upper(Z_UPPER) if v.prediction is not None else None
    if up is not None and up <= MIN_REL_DROP * v.fitted["full"] and all(
            cost[n].sec_per_batch > predicted[n][0] for n in disagree):
        # the rounds read input costs that the stages alone do not have, and alone they
        # cost the loop under 5% in all: neither witness holds the pipeline input-bound
        # (a drifting step-bound MLP once read 12.8 ms of load where alone it costs 0.3);
        # why, as the rounds show it (_why_above)
        return dataclasses.replace(v, bottleneck="inconclusive", tied=(), witness="disagree", disagree=disagree,
                                   reason=(f"the rounds read input costs the stages alone do not have ({'; '.join(words)}), "
                                           f"and alone the worker stages add at most {_ms(up)} ms per batch, under "
                                           f"{MIN_REL_DROP * 100:.0f}%{_model_note(v.prediction.alone)}: "
                                           + _why_above(v, cost, disagree)))
    if asked == [top_alone]:
        return dataclasses.replace(v, witness="both", disagree=disagree)
    tied = tuple(sorted(set(asked) | {top_alone} | {s for s in disagree if s in asked + [top_alone]},
                        key=lambda n: -cost[n].sec_per_batch))
    if len(tied) < 2:
        tied = tuple(sorted({top_alone, *asked}, key=lambda n: -cost[n].sec_per_batch))
    reason = (f"{_and(list(tied))}: the rounds and the stages' costs alone disagree ({'; '.join(words)}), so "
              "neither names a stage alone")
    return dataclasses.replace(v, bottleneck="tie", tied=tied, witness="disagree", disagree=disagree, reason=reason)


def steady(v: Verdict, s: StageCost) -> Optional[Contrast]:
    """A stage's reading, where its own per-round values (not the noise pooled over the
    points) make it real over at least FEW_ROUNDS rounds, at the noise rule's level and
    floor: the same in round after round, down and up, so not a drift of the step (the
    rounds alternate their direction: a drift flips its sign from one to the next) nor a
    burst of another program (one round's). None where they do not."""
    d = v.drop(s.lower, s.upper) if s.lower else None
    if d is None or (d.rounds or 0) < FEW_ROUNDS or not math.isfinite(d.own_se):
        return None
    own = Contrast(d.estimate, d.own_se, d.rounds - 1, d.rounds)
    return own if compare(own, v.fitted["full"], z=Z_NOISE).real else None


def steady_disagreement(v: Verdict) -> bool:
    """Whether every stage whose reading disagrees with its cost alone reads steadily
    (steady): more rounds would read it the same."""
    cost = {s.stage: s for s in v.stages if s.status == "ok"}
    return bool(v.disagree) and all(n in cost and steady(v, cost[n]) is not None for n in v.disagree)


def _why_above(v: Verdict, cost: Mapping, disagree: tuple) -> str:
    """Why the rounds read more than the stages alone, as the rounds show it: a drift or
    another program where some reading's own per-round values spread beyond it; where
    every one is steady (steady), not that: the loop pays for more than the stages' own
    work, and the isolated timing misses it."""
    if not steady_disagreement(dataclasses.replace(v, disagree=disagree)):
        return "the step drifted while the points were measured, or another program slowed some of them"
    rounds = min(steady(v, cost[n]).rounds for n in disagree)
    return (f"{_and(list(disagree))} {'reads' if len(disagree) == 1 else 'read'} so in each of {rounds} rounds, "
            "not a drift of the step: the loop pays for more than the stages' own work, and the stages timed alone "
            "miss it")


def _disagree_words(name: str, s: StageCost, pred: tuple) -> str:
    """'collate reads 3.1 ms per batch in the loop where alone it costs 0.1'."""
    return f"{name} reads {_ms(s.sec_per_batch)} ms per batch in the loop where alone it costs {_ms(pred[0])}"


def _ordered_alone(v: Verdict, cost: Mapping, predicted: Mapping, a: witness.Alone, t_full: float, *,
                   noise_scale: float) -> Verdict:
    """A tie the costs alone order: their leader among the tied stages, where it leads
    each other tied stage beyond their noise and every stage outside the tie by one
    witness or the other, the rounds leading it over none beyond theirs."""
    if any(n not in predicted for n in v.tied):
        return v
    top = max(v.tied, key=lambda n: predicted[n][0])
    leads = {lead.over: lead for lead in _leads(v.stages, v.fit_coef, v.noise, t_full, noise_scale, top=top)}
    for other in cost:
        if other == top:
            continue
        by_rounds = leads.get(other)
        by_alone = _alone_lead(predicted, a, top, other, noise_scale) if other in predicted else None
        alone_ok = by_alone is not None and by_alone.real and by_alone.estimate > 0
        if other in v.tied and not alone_ok:
            return v
        if not alone_ok and not (by_rounds is not None and by_rounds.real):
            return v
    runner = max((n for n in v.tied if n != top), key=lambda n: predicted[n][0])
    ratio = predicted[top][0] / predicted[runner][0] if predicted[runner][0] > 0 else math.inf
    times = f"{ratio:.1f}\u00d7 what {runner} does" if math.isfinite(ratio) else f"more than {runner}"
    read = ", ".join(f"{n} {_ms(cost[n].sec_per_batch)}" for n in v.tied)
    reason = (f"{top} leads: the rounds cannot separate it from {_and([n for n in v.tied if n != top])} yet "
              f"({read} ms per batch); alone it costs {times} "
              f"({_ms(predicted[top][0])} against {_ms(predicted[runner][0])} ms per batch{_model_note(a)})")
    return dataclasses.replace(v, bottleneck=top, tied=(), witness="isolated costs", reason=reason,
                               leads=tuple(leads.values()))


def _bound_alone(v: Verdict, cost: Mapping, predicted: Mapping, pred: witness.Prediction, gap: Optional[Contrast], *,
                 noise_scale: float) -> Verdict:
    """An inconclusive run whose worker stages, by their costs alone, cost the loop at
    least MIN_REL_DROP of t(full) beyond their noise (witness.Prediction.gap_lower), the
    rounds' own gap not below that beyond theirs: the pipeline is input-bound on that
    witness, and the stage it puts first is named where it leads every other predicted
    stage beyond its noise (else a tie of those it does not)."""
    t_full = v.fitted["full"]
    low = pred.gap_lower(Z_UPPER * noise_scale)
    if low is None or gap is None or low <= MIN_REL_DROP * t_full:
        return v
    short = Contrast(low - gap.estimate, gap.se, gap.df, gap.rounds, pooled=gap.pooled)
    if short.estimate > 0 and compare(short, t_full, scale=noise_scale, z=Z_NOISE).real:
        return v  # the rounds read less than the least the costs alone allow: they disagree
    a = pred.alone
    top = max(predicted, key=lambda n: predicted[n][0])
    behind = [n for n in predicted if n != top and not (lambda c: c.real and c.estimate > 0)(
        _alone_lead(predicted, a, top, n, noise_scale))]
    words = (f"the pipeline loses at least {_ms(low)} ms per batch to input by its worker stages' costs alone "
             f"({low / t_full * 100:.0f}% of {_ms(t_full)} ms{_model_note(a)}), and the rounds, which cannot tell "
             f"yet, read {_ms(gap.estimate)} ms")
    if not behind:
        runner = max((n for n in predicted if n != top), key=lambda n: predicted[n][0], default=None)
        ahead = (f"; by the costs alone {top} costs the loop {_ms(predicted[top][0])} ms per batch against "
                 f"{runner}'s {_ms(predicted[runner][0])}" if runner else "")
        return dataclasses.replace(v, bottleneck=top, witness="isolated costs", reason=words + ahead)
    tied = tuple(sorted([top, *behind], key=lambda n: -predicted[n][0]))
    return dataclasses.replace(v, bottleneck="tie", tied=tied, witness="isolated costs",
                               reason=f"{words}; {_and(list(tied))}, tied alone: "
                                      f"{_and([_ms(predicted[n][0]) for n in tied])} ms per batch")


def _model_note(a: witness.Alone) -> str:
    return "" if a.mode == "serial" else f", as the loop would pay it: {a.describe()}"


def _none_alone(v: Verdict, pred: witness.Prediction, base_point: str, gap: Optional[Contrast], *,
                noise_scale: float) -> Verdict:
    """An inconclusive run whose worker stages, by their costs alone, cost the loop less
    than NONE_MAX_LOSS with the rest of the gap (the rounds' drop from base_point to the
    ceiling, its bound), the rounds' own loss to them agreeing: `none`."""
    t_full = v.fitted["full"]
    up = pred.gap_upper(Z_UPPER * noise_scale)
    if up is None or gap is None:
        return v
    below = None if base_point == v.ceiling else v.drop(base_point, v.ceiling)
    if base_point != v.ceiling and below is None:
        return v
    rest = 0.0 if below is None else max(0.0, below.upper(Z_UPPER, noise_scale))
    predicted_gap = pred.times["full"] - pred.base
    excess = Contrast(gap.estimate - predicted_gap, math.hypot(gap.se, pred.se["full"]), gap.df, gap.rounds,
                      pooled=gap.pooled)
    # the step's own time at its lower bound: a busy machine that slowed every point
    # makes the input's share look small (the MNIST example once read 127 ms a batch where
    # it runs at 60, and its 8 ms of input 6%)
    low = pred.base - Z_UPPER * noise_scale * v.noise.point_sigma(base_point)
    loss = up + rest
    if low <= 0 or loss > NONE_MAX_LOSS * (low + loss) or (
            excess.estimate > 0 and compare(excess, t_full, scale=noise_scale, z=Z_NOISE).real):
        return v
    reason = (f"the full pipeline keeps up by its costs alone: its worker stages add at most {_ms(up)} ms to a "
              f"batch of at least {_ms(low + loss)} ms ({loss / (low + loss) * 100:.1f}% with "
              + (f"the rest of the gap, at most {_ms(rest)} ms" if rest > 0 else "nothing else between")
              + f"{_model_note(pred.alone)}); the rounds, which cannot bound the loss yet, read "
              f"{_ms(gap.estimate)} ms and agree")
    return dataclasses.replace(v, bottleneck="none", witness="isolated costs", reason=reason)


def _fit(noise: Noise, kept: list) -> tuple[dict, dict]:
    """The kept points' times per batch, fitted so that none costs more than a point
    upstream of it (stats.decreasing_blocks), each weighted by 1/sigma^2 (its noise, at
    least MIN_REL_SE of it: a few windows that happen to agree are not a 0.1% estimate);
    and each fitted time as the weighted mean of the points pooled into it, {point: {q:
    weight}}, so that a difference of fitted times is a contrast of the points' own and
    its noise is that contrast's (_drop)."""
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


def _drop(noise: Noise, coef: Mapping, lower: str, upper: str) -> Contrast:
    """fitted(lower) - fitted(upper) and its noise. Each fitted time is the weighted mean
    of the points pooled into it (_fit), so the difference is sum(a_i b_j (t_i - t_j))
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


def _cost_stages(kept: list, fitted: Mapping[str, float], coef: Mapping, noise: Noise, *, skipped: Mapping[str, str],
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
        c = _drop(noise, coef, lower, upper)
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


def _costed(stages: tuple) -> list:
    """The stages measured, costliest first."""
    return sorted((c for c in stages if c.status == "ok"), key=lambda c: c.sec_per_batch, reverse=True)


def _leads(stages: tuple, coef: Mapping, noise: Noise, t_full: float, noise_scale: float, *,
           top: Optional[str] = None) -> tuple:
    """The costliest stage's lead over each other costed stage. Each lead's noise comes
    from the per-round values of the difference of the two costs (a point the two stages
    share, adjacent stages, counts with its sign in each round: t(full) - 2 t(raw) +
    t(augmented) for load over augment), so noise common to both costs cancels; it is
    never taken as more than the sum of the two costs' own noise. Where a point of either
    was pooled with another in the ordered fit, the same difference of the fitted times
    (over the rounds all its points share) counts too, where its noise is the larger.
    `top`: that stage's lead over each other (its lead may then be negative)."""
    costed = _costed(stages)
    if top is not None:  # another stage's lead over the rest (_witnessed)
        costed = [c for c in costed if c.stage == top] + [c for c in costed if c.stage != top]
    out = []
    for other in costed[1:]:
        top = costed[0]
        c = noise.contrast(_lead_coef(top, other, lambda p: {p: 1.0}))
        if _pooled(coef, top.lower, top.upper, other.lower, other.upper):
            # the costs are fitted ones: the same difference of the fitted times, paired
            # over the rounds all of its points share, where that says more
            fitted = _lead_coef(top, other, coef.__getitem__)
            if fitted:
                c = max(c, noise.contrast(fitted), key=lambda x: x.sigma)
        # the noise of a difference is at most the sum of its terms' (sd(a - b) <= sd(a) +
        # sd(b)): where the per-round estimate of the difference says more (few rounds, the
        # estimators differ), the two costs' own noise bounds it; a runner-up whose upper
        # bound is below the leader's lower bound is then always behind (stats.compare, at
        # the level stats.level asks: Z_LEAD, or Z_NOISE where pooled over few rounds)
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
    sd = _projected_sd(sigma * z_now / t_quantile(normal_cdf(z_now), c.df), c)  # (c.df: pooled, or n - 1)

    def tells(r: int) -> bool:
        z = level(Contrast(lead, math.nan, r - 1, r, pooled=c.pooled))
        return lead > noise_threshold(sd / math.sqrt(r) * t_quantile(normal_cdf(z), r - 1) / z, t_full, noise_scale, z)
    return first_round(n, tells)


def _projected_sd(se: float, c: Contrast) -> float:
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


def _name(stages: tuple, leads: tuple, gap: Contrast, *, t_full: float, noise_scale: float,
          measured: Mapping[str, Throughput]) -> tuple[str, tuple, str]:
    """(bottleneck, tied, reason) from the costed stages and the leads (see decide)."""
    costed = _costed(stages)
    gap_real = is_real(gap.estimate, gap.sigma, t_full, noise_scale)
    if costed and (gap_real or any(c.significant for c in costed)):
        top = costed[0]
        behind = [lead for lead in leads if not lead.real]
        if not behind:
            return top.stage, (), _named_reason(top, leads)
        tied = (top.stage,) + tuple(lead.over for lead in behind)
        return "tie", tied, _tie_reason(stages, tied, behind, gap if not top.significant else None)
    upper = gap.upper(Z_UPPER, noise_scale)
    if upper <= NONE_MAX_LOSS * t_full:
        return "none", (), "the full pipeline runs at the ceiling within noise"
    return "inconclusive", (), undecided(gap, upper, t_full, measured)


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _and(names: list) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _rounds_note(rounds: Optional[int]) -> str:
    """', from 2 rounds' where the noise comes from few rounds (FEW_ROUNDS)."""
    if rounds is None or rounds >= FEW_ROUNDS:
        return ""
    return f", noise from {rounds} round{'s' if rounds != 1 else ''}"


def _named_reason(top: StageCost, leads: tuple) -> str:
    if not leads:
        return f"removing {top.stage} buys the most throughput ({_ms(top.sec_per_batch)} ms per batch)"
    close = min(leads, key=lambda lead: lead.sec_per_batch / lead.threshold if lead.threshold > 0 else math.inf)
    return (f"removing {top.stage} buys the most throughput: {_ms(top.sec_per_batch)} ms per batch, ahead of "
            f"{close.over} by {_ms(close.sec_per_batch)} ms (real above {_ms(close.threshold)} ms)")


def _tie_reason(stages: tuple, tied: tuple, behind: list, gap: Optional[Contrast]) -> str:
    """'load and augment, tied: 45.0 and 42.0 ms per batch; ...' (or, where only the
    leader's cost is real, 'augment leads, load not ruled out: 30.0 and 0.6 ms per
    batch; ...') with, for each stage the leader does not lead beyond the noise, why: the
    lead within its noise, or the other stage's own cost too noisy to rule out. The
    rounds after which a lead would be real (Lead.rounds_to_tell) are the report's next
    step (report/summary.py), not the reason's."""
    cost = {s.stage: s for s in stages if s.status == "ok"}
    parts = []
    for lead in behind:
        other = cost[lead.over]
        if not math.isfinite(lead.sigma):
            parts.append(f"{lead.stage}'s lead over {lead.over}, {_ms(lead.sec_per_batch)} ms, has no noise "
                         "estimate yet (their points were measured together in fewer than 2 rounds)")
            continue
        within = (f"{lead.stage}'s lead over {lead.over}, {_ms(lead.sec_per_batch)} ms, is within the noise (real "
                  f"above {_ms(lead.threshold)} ms{_rounds_note(lead.rounds)})")
        if not other.significant:
            within = (f"{lead.over}'s own cost is known only to ±{_ms(other.sigma)} ms, so {within}"
                      if math.isfinite(other.sigma) else f"{lead.over}'s own cost has no noise estimate, so {within}")
        parts.append(within)
    head = (f"the pipeline loses a real {_ms(gap.estimate)} ms per batch to input, spread over stages: "
            if gap is not None else "")
    costs = _and([_ms(cost[s].sec_per_batch) for s in tied])
    if cost[tied[0]].significant and not any(cost[s].significant for s in tied[1:]):
        # the leader's cost is real, the others' are not known well enough to rule them out
        return (f"{head}{tied[0]} leads, {_and(list(tied[1:]))} not ruled out: {costs} ms per batch; "
                + "; ".join(parts))
    return f"{head}{_and(list(tied))}, tied: {costs} ms per batch; " + "; ".join(parts)


def undecided(gap: Contrast, upper: float, t_full: float, measured: Mapping[str, Throughput]) -> str:
    """Why a run without a real cost cannot say `none`: the gap's bound against
    NONE_MAX_LOSS. What would decide it (about how many rounds of `full` and the ceiling:
    rounds_to_decide) is the report's next step, said there (report/summary.py), not here."""
    if gap.rounds is None:  # noise from the windows (a document of schema 1)
        return too_noisy(measured, upper / t_full)
    bound = (f"could be up to {min(upper / t_full, 9.99) * 100:.0f}% at {normal_cdf(Z_UPPER) * 100:.1f}% confidence"
             if math.isfinite(upper) else "has no bound yet")
    return (f"the loss to input {bound} (from {gap.rounds} round{'s' if gap.rounds != 1 else ''}), and `none` needs "
            f"that bound under {NONE_MAX_LOSS * 100:.0f}%")


def rounds_to_decide(gap: Contrast, t_full: float, most: int = MOST_ROUNDS) -> Optional[int]:
    """The rounds after which, with the gap and the spread of its per-round values as
    measured (its standard error, or where larger the one its own per-round values give:
    Contrast.own_se, as rounds_to_tell), the gap would either be real or have its upper
    bound under NONE_MAX_LOSS (at least 2; None when not within `most`)."""
    n = gap.rounds or 0
    if n < 2 or not math.isfinite(gap.se):
        return max(2, n + 2) if n < 2 else None
    sd = _projected_sd(gap.se, gap)

    def decides(r: int) -> bool:
        c = Contrast(gap.estimate, sd / math.sqrt(r), r - 1, r)
        return c.upper(Z_UPPER) <= NONE_MAX_LOSS * t_full or is_real(gap.estimate, c.sigma, t_full)
    return first_round(n, decides, most)


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


def too_noisy(measured: Mapping[str, Throughput], upper_loss: float) -> str:
    """Why a run without a real drop cannot say `none` (noise from the windows: a
    document of schema 1): the points of one window, and the loss to input's bound. The
    noisy points are the report's warning, what to do its next step."""
    few = "; ".join(f"{p}: {tp.n} window" for p, tp in measured.items() if tp.n < 2)
    return (f"the measurements are too noisy to tell ({few + '; ' if few else ''}the loss to input could be up to "
            f"{min(upper_loss, 1.0) * 100:.0f}%)")


def settled(v: Verdict, more_noise: Verdict, less_noise: Verdict) -> bool:
    """Is the verdict firm enough to stop measuring? The same decision made with
    SETTLE_NOISE_SCALE times the noise (`more_noise`) must name the same stage; a `none`
    must stay `none` with 1/SETTLE_NOISE_SCALE of it (`less_noise`: no stage would turn
    real with more rounds); a `tie` settles only where its leads are under MIN_REL_DROP
    of t(full), the floor no amount of measuring lowers (the stages cost the same for any
    purpose), and stays the same tie with less noise and with more (a tie says the
    pipeline is input-bound: like a named stage, that must stand with the margin; a
    drifting step-bound MLP settled a tie with `collate` real after 4 rounds, where its
    input costs under 1% of the step). Never an inconclusive verdict, nor one whose two
    witnesses disagree (`disagree`: a reading beyond both noises from its cost alone, or
    the two ordering stages the other way round): its rounds are suspect, and more of
    them may show it (the MNIST example settled a tie of load and collate at 4 rounds,
    collate reading 3.1 ms where alone it costs 0.08 and augment, the costliest alone,
    left out). (An inconsistent point has been measured again once by the scheduler before
    this is asked, then left out.)"""
    if v.bottleneck in (None, "inconclusive") or v.disagree:
        return False
    if v.bottleneck == "none":
        return less_noise.bottleneck == "none"
    if v.bottleneck == "tie":
        floor = MIN_REL_DROP * v.fitted["full"]
        return (less_noise.tied == v.tied == more_noise.tied  # () for any verdict but a tie
                and all(lead.sec_per_batch <= floor for lead in v.leads if lead.over in v.tied))
    return more_noise.bottleneck == v.bottleneck


def in_question(v: Verdict) -> tuple:
    """The stages the user will look inside: the one named, or the stages of a tie
    (costliest first); none for `none`, `inconclusive` or no verdict. The breakdowns are
    shown and the costliest transform confirmed for these (a decode-heavy ImageNet-like
    pipeline often has load and augment tied)."""
    if v.bottleneck in STAGES:
        return (v.bottleneck,)
    return tuple(v.tied) if v.bottleneck == "tie" else ()


def deciding_points(v: Verdict) -> set:
    """The points whose measurement can still change verdict `v`: around the stages of a
    tie; around the named stage and its runner-up; `full` and the ceiling when the
    question is the gap (none, or inconclusive after FEW_ROUNDS rounds); every costed
    point without a verdict or in an inconclusive one of fewer rounds."""
    costed = _costed(v.stages)
    if v.bottleneck is None:
        return {p for s in costed for p in (s.lower, s.upper)} | {"full"}
    if v.bottleneck == "tie":
        return {p for s in costed if s.stage in v.tied for p in (s.lower, s.upper)} | {"full"}
    if v.bottleneck in STAGES:
        return {p for s in costed[:2] for p in (s.lower, s.upper)} | {"full"}
    if v.bottleneck == "inconclusive" and v.gap_rounds is not None and v.gap_rounds < FEW_ROUNDS:
        # few rounds: a stage's noise is as little known as the gap's, and a stage
        # measured between adjacent visits may turn real before the gap does
        return {p for s in costed for p in (s.lower, s.upper)} | {"full"}
    return {"full", v.ceiling}


def self_check(points: Mapping[str, float], v: Verdict, num_workers: Optional[int], pinned_transfer: bool) -> list:
    """The report's rules (SPEC.md, "Rules that are not negotiable") checked on the
    numbers the report will show: `points` maps each ok point to the samples/s it shows.
    Returns one warning line per broken rule (none when the report agrees with itself)."""
    out = []
    names = [p for p in POINTS if p in points]
    for i, up in enumerate(names):
        for down in names[i + 1:]:
            if points[down] < points[up] * (1 - 1e-6):  # the shown rates are fitted: any slower is a bug
                out.append(f"{down} slower than {up}")
    real = [s for s in v.stages if s.status == "ok" and s.significant]
    for s in real:
        if (s.share_of_gap or 0) > 1.0 + 1e-9:
            out.append(f"{s.stage} at {s.share_of_gap:.0%} of the gap")
    if v.bottleneck == "none" and real:
        out.append(f"none beside a real cost of {', '.join(s.stage for s in real)}")
    if v.bottleneck in STAGES and v.witness != "isolated costs" and any(not lead.real for lead in v.leads):
        out.append(f"{v.bottleneck} named on a lead within the noise")
    if v.bottleneck == "tie" and v.witness != "disagree" and any(lead.real for lead in v.leads if lead.over in v.tied):
        out.append(f"a tie of {', '.join(v.tied)} led beyond the noise")
    if num_workers == 0 and not pinned_transfer and any(s.stage == "handoff" for s in real):
        out.append("a real handoff at num_workers=0")
    # a rule broken is the tool's bug, not the pipeline's: the document reproduces it
    return [f"Tool bug ({p}): report it with the --json file." for p in out]


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
