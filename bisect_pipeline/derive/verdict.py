"""The verdict: the rules that name the bottleneck from the stages' costs (pure).

Why one module: every rule of the decision, to be read and changed together: the rounds'
(`_name`), the second witness's (`_witnessed`), when to stop measuring (`settled`) and
which points can still change it (`deciding_points`). The arithmetic the rules read is
drops.py's; the sentences that say why, reasons.py's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

from ..core.noise import Noise
from ..core.stats import FEW_ROUNDS, MIN_REL_DROP, NOISY_REL_IQR, Z_NOISE, Contrast, Throughput, compare, is_real
from . import drops, reasons, witness
from .drops import MOST_ROUNDS, POINTS, STAGES, Inconsistency, Lead, StageCost

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


@dataclasses.dataclass(frozen=True)
class Verdict:
    # None: no verdict could be made; else a stage, `tie` (stages the measurements cannot
    # order: `tied`), `none`, or `inconclusive` (whether it is input-bound at all is unknown)
    bottleneck: Optional[str]
    stages: tuple[StageCost, ...]
    gap_sec_per_batch: Optional[float] = None
    input_bound_fraction: Optional[float] = None  # share of the step time lost to input
    reason: str = ""
    ceiling: Optional[str] = None  # the point taken as the ceiling
    # each consistent point's time per batch, fitted so that none costs more than one upstream of it (drops.fit)
    fitted: Mapping[str, float] = dataclasses.field(default_factory=dict)
    inconsistent: tuple[Inconsistency, ...] = ()
    gap_sigma: Optional[float] = None
    gap_upper: Optional[float] = None  # the gap's one-sided upper bound (Z_UPPER's confidence)
    gap_rounds: Optional[int] = None
    tied: tuple[str, ...] = ()  # `tie`: the stages in question, costliest first
    leads: tuple[Lead, ...] = ()  # the costliest stage over each other costed stage
    noise: Any = dataclasses.field(default=None, compare=False, repr=False)  # noise.Noise of the points
    # each fitted point's time as a combination of the points' own (drops.fit): {point: {q: weight}}
    fit_coef: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # The second witness (witness.py, _witnessed): which witness the verdict rests on
    # (WITNESSES), each worker stage's predicted drop from its cost alone {stage: (seconds
    # per batch, standard error, the same with the shared model's k's)}, the model
    # (witness.Alone.mode), and the stages whose readings disagree with their prediction
    # beyond both noises, or whose order the two witnesses give the other way round.
    witness: str = "rounds"
    predicted: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    model: Optional[str] = None
    disagree: tuple = ()
    prediction: Any = dataclasses.field(default=None, compare=False, repr=False)  # witness.Prediction
    # A row the rounds read whole ('load (with augment, collate)': a point between not
    # measured) split by the costs alone where a stage in question lies within it
    # (_within): each of its stages' predicted drop, as `predicted`'s
    within: Mapping[str, tuple] = dataclasses.field(default_factory=dict)

    def drop(self, lower: str, upper: str) -> Optional[Contrast]:
        """fitted(lower) - fitted(upper) with its noise (drops.drop), as every rule of this
        verdict weighs it; the points' own difference where one was left out of the fit
        (inconsistent); None without measurements of both."""
        if self.noise is None or lower not in self.noise.mu or upper not in self.noise.mu:
            return None
        if lower not in self.fit_coef or upper not in self.fit_coef:
            return self.noise.contrast({lower: 1, upper: -1})
        return drops.drop(self.noise, self.fit_coef, lower, upper)


def decide(measured: Mapping[str, Throughput], batch_size: float, skipped: Mapping[str, str] = {}, *,
           noise_scale: float = 1.0, alone: Optional[witness.Alone] = None) -> Verdict:
    """Name the bottleneck from the points that were measured. `measured` maps point
    name to its throughput for the points whose status is ok; `skipped` maps a point to
    the reason it does not apply here (`host` without an accelerator, `collated` at
    num_workers=0), so the stage that ends at it is reported as not applicable instead of
    merged; a point merely not selected is not in it.
    `noise_scale` > 1 asks whether the verdict stands with that much more noise;
    `alone`: the worker stages' costs alone (witness.alone), the second witness.

    Algorithm (t = seconds per batch, with what a round shares at every point taken out;
    every difference's noise from its per-round values, noise.Noise; each step's
    docstring says how, each constant's comment why):
        no verdict without `full` and one other point
        inconsistent = points slower than one upstream of them beyond the noise,
                       each left out  (drops.find_inconsistent)
        fitted = the kept points' t, none costing more than one upstream  (drops.fit)
        ceiling = the last kept point; gap = fitted(full) - fitted(ceiling)
        stages = each stage's cost, fitted(lower) - fitted(upper) between adjacent
                 kept points (the costs add up to the gap)  (drops.cost_stages)
        leads = the costliest stage's cost minus each other's  (drops.leads)
        verdict (_name), real = beyond the noise (stats.is_real):
            a stage real or the gap real (input-bound):
                the costliest stage when every lead is real; else `tie` between it
                and the stages it does not lead beyond the noise
            neither: none if the gap's upper bound (Z_UPPER) <= NONE_MAX_LOSS t(full);
                     else inconclusive, with the rounds that would decide it
        then the second witness, the stages' costs alone (_witnessed)
    """
    present = [p for p in POINTS if p in measured]
    unmeasured = drops.unmeasured_stages(skipped)
    if "full" not in measured:  # no verdict, but the points shown still agree (a partial run)
        noise = Noise(measured) if measured else None
        fitted, coef = drops.fit(noise, present) if noise is not None else ({}, {})
        return Verdict(None, unmeasured, reason="the full pipeline was not measured", fitted=fitted, noise=noise,
                       fit_coef=coef)
    if len(present) < 2:
        return Verdict(None, unmeasured, reason="no cache point was measured besides the full pipeline")
    noise = Noise(measured)
    inconsistent = drops.find_inconsistent(measured, present, noise, noise_scale)
    left_out = {i.slower for i in inconsistent}
    fitted, coef = drops.fit(noise, [p for p in present if p not in left_out])
    if len(fitted) < 2:
        return Verdict(None, unmeasured, reason="no cache point was consistent with the full pipeline",
                       inconsistent=inconsistent, fitted=fitted, noise=noise, fit_coef=coef)
    stages = drops.cost_stages(list(fitted), fitted, coef, noise, skipped=skipped, left_out=left_out,
                               batch_size=batch_size, noise_scale=noise_scale)
    return _witnessed(_judge(stages, fitted, coef, noise, measured, inconsistent=inconsistent, noise_scale=noise_scale),
                      alone, noise_scale=noise_scale)


def _judge(stages: tuple, fitted: Mapping[str, float], coef: Mapping, noise: Noise, measured: Mapping[str, Throughput],
           *, inconsistent: tuple, noise_scale: float) -> Verdict:
    """The verdict from the costed stages: the gap, the leads, the name (see decide)."""
    t_full, ceiling = fitted["full"], list(fitted)[-1]
    gap = max(0.0, t_full - fitted[ceiling])
    gap_c = dataclasses.replace(drops.drop(noise, coef, "full", ceiling), estimate=gap)
    leads = drops.leads(stages, coef, noise, t_full, noise_scale)
    bottleneck, tied, reason = _name(stages, leads, gap_c, t_full=t_full, noise_scale=noise_scale, measured=measured)
    return Verdict(bottleneck, stages, reason=reason, gap_sec_per_batch=gap, input_bound_fraction=gap / t_full,
                   ceiling=ceiling, fitted=fitted, inconsistent=inconsistent, gap_sigma=gap_c.sigma,
                   gap_upper=gap_c.upper(Z_UPPER, noise_scale), gap_rounds=gap_c.rounds, tied=tied, leads=leads,
                   noise=noise, fit_coef=coef)


def _name(stages: tuple, leads: tuple, gap: Contrast, *, t_full: float, noise_scale: float,
          measured: Mapping[str, Throughput]) -> tuple[str, tuple, str]:
    """(bottleneck, tied, reason) from the costed stages and the leads (see decide). Which
    stage leads is asked only of a pipeline already known to be input-bound, by the one
    comparison of the tool (drops.leads: stats.compare; how often it errs: docs/how-it-works.md)."""
    costed = drops.costed(stages)
    gap_real = is_real(gap.estimate, gap.sigma, t_full, noise_scale)
    if costed and (gap_real or any(c.significant for c in costed)):
        top = costed[0]
        behind = [lead for lead in leads if not lead.real]
        if not behind:
            return top.stage, (), reasons.named(top, leads)
        tied = (top.stage,) + tuple(lead.over for lead in behind)
        return "tie", tied, reasons.tie(stages, tied, behind, gap if not top.significant else None)
    upper = gap.upper(Z_UPPER, noise_scale)
    if upper <= NONE_MAX_LOSS * t_full:
        return "none", (), "the full pipeline runs at the ceiling within noise"
    return "inconclusive", (), reasons.undecided(gap, upper, t_full, measured, z_upper=Z_UPPER,
                                                 none_max_loss=NONE_MAX_LOSS)


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
        v = _ordered_alone(v, cost, predicted, a, t_full, noise_scale=noise_scale)
    elif v.bottleneck in STAGES:
        top = max(predicted, key=lambda n: predicted[n][0])
        v = dataclasses.replace(v, witness="both" if top == v.bottleneck else "rounds")
    elif v.bottleneck == "inconclusive":
        bound = _bound_alone(v, predicted, pred, gap, t_full=t_full, noise_scale=noise_scale)
        if bound is v:
            return _none_alone(v, pred, base_point, gap, t_full=t_full, noise_scale=noise_scale)
        v = bound
    return _within(v, cost, pred, noise_scale)


def _alone_lead(predicted: Mapping, a: witness.Alone, top: str, other: str, noise_scale: float):
    """stats.compare of the predicted drops of `top` and `other`: the lead by the costs
    alone, against the larger of the two (MIN_REL_DROP of it at least: a stage's own
    cost timed alone drifts by a few percent, not by a share of the loop's time)."""
    (p, e, _), (q, f, _) = predicted[top], predicted[other]
    n = max(2, a.samples)
    return compare(Contrast(p - q, math.hypot(e, f), n - 1 if a.df is None else a.df, n), max(p, q), scale=noise_scale)


def _leads_alone(predicted: Mapping, a: witness.Alone, top: str, other: str, noise_scale: float) -> bool:
    """Whether `top` leads `other` by the costs alone, beyond their noise (_alone_lead)."""
    c = _alone_lead(predicted, a, top, other, noise_scale)
    return c.real and c.estimate > 0


def _disagreeing(v: Verdict, cost: Mapping, predicted: Mapping, a: witness.Alone, t_full: float, *,
                 noise_scale: float) -> tuple:
    """The stages whose reading differs from its prediction beyond both noises, at the
    noise rule's level and floor (serial and shared models: the parallel one only orders),
    then, where the rounds' leader leads a stage beyond the noise that the costs alone put
    ahead of it beyond theirs and by MIN_REL_DROP of t(full), both; in the order found."""
    out = []
    if a.mode != "parallel":
        for name, (p, _, e) in predicted.items():
            c = drops.cost_noise(cost[name])
            diff = Contrast(cost[name].sec_per_batch - p, math.hypot(c.se, e), c.df, c.rounds, pooled=c.pooled)
            if compare(diff, t_full, scale=noise_scale, z=Z_NOISE).real:
                out.append(name)
    costed = drops.costed(v.stages)
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
    up = v.prediction.gap_upper(Z_UPPER) if v.prediction is not None else None
    if up is not None and up <= MIN_REL_DROP * v.fitted["full"] and all(
            cost[n].sec_per_batch > predicted[n][0] for n in disagree):
        # the rounds read input costs that the stages alone do not have, and alone they
        # cost the loop under 5% in all: neither witness holds the pipeline input-bound
        steady_rounds = (min(steady(v, cost[n]).rounds for n in disagree)
                         if steady_disagreement(dataclasses.replace(v, disagree=disagree)) else None)
        reason = reasons.not_input_bound(cost, predicted, disagree, up, v.prediction.alone, steady_rounds=steady_rounds)
        return dataclasses.replace(v, bottleneck="inconclusive", tied=(), witness="disagree", disagree=disagree,
                                   reason=reason)
    if asked == [top_alone]:
        return dataclasses.replace(v, witness="both", disagree=disagree)
    tied = tuple(sorted({top_alone, *asked}, key=lambda n: -cost[n].sec_per_batch))
    return dataclasses.replace(v, bottleneck="tie", tied=tied, witness="disagree", disagree=disagree,
                               reason=reasons.disagreement(tied, cost, predicted, disagree, v.prediction.alone))


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


def _ordered_alone(v: Verdict, cost: Mapping, predicted: Mapping, a: witness.Alone, t_full: float, *,
                   noise_scale: float) -> Verdict:
    """A tie the costs alone order: their leader among the tied stages, where it leads
    each other tied stage beyond their noise and every stage outside the tie by one
    witness or the other, the rounds leading it over none beyond theirs."""
    if any(n not in predicted for n in v.tied):
        return v
    top = max(v.tied, key=lambda n: predicted[n][0])
    leads = {lead.over: lead for lead in drops.leads(v.stages, v.fit_coef, v.noise, t_full, noise_scale, top=top)}
    for other in cost:
        if other == top:
            continue
        by_rounds = leads.get(other)
        alone_ok = other in predicted and _leads_alone(predicted, a, top, other, noise_scale)
        if other in v.tied and not alone_ok:
            return v
        if not alone_ok and not (by_rounds is not None and by_rounds.real):
            return v
    return dataclasses.replace(v, bottleneck=top, tied=(), witness="isolated costs", leads=tuple(leads.values()),
                               reason=reasons.ordered_alone(top, v.tied, cost, predicted, a))


def _bound_alone(v: Verdict, predicted: Mapping, pred: witness.Prediction, gap: Optional[Contrast], *, t_full: float,
                 noise_scale: float) -> Verdict:
    """An inconclusive run whose worker stages, by their costs alone, cost the loop at
    least MIN_REL_DROP of t(full) beyond their noise (witness.Prediction.gap_lower), the
    rounds' own gap not below that beyond theirs: the pipeline is input-bound on that
    witness, and the stage it puts first is named where it leads every other predicted
    stage beyond its noise (else a tie of those it does not)."""
    low = pred.gap_lower(Z_UPPER * noise_scale)
    if low is None or gap is None or low <= MIN_REL_DROP * t_full:
        return v
    short = Contrast(low - gap.estimate, gap.se, gap.df, gap.rounds, pooled=gap.pooled)
    if short.estimate > 0 and compare(short, t_full, scale=noise_scale, z=Z_NOISE).real:
        return v  # the rounds read less than the least the costs alone allow: they disagree
    a = pred.alone
    top = max(predicted, key=lambda n: predicted[n][0])
    behind = [n for n in predicted if n != top and not _leads_alone(predicted, a, top, n, noise_scale)]
    tied = tuple(sorted([top, *behind], key=lambda n: -predicted[n][0])) if behind else ()
    reason = reasons.bound_alone(top, tied, predicted, a, low=low, t_full=t_full, read=gap.estimate)
    return dataclasses.replace(v, bottleneck="tie" if tied else top, tied=tied, witness="isolated costs", reason=reason)


def _within(v: Verdict, cost: Mapping, pred: witness.Prediction, noise_scale: float) -> Verdict:
    """A named stage whose row the rounds read with the next ones ('load (with augment,
    collate)': a point between them not measured), split by the costs alone into each of
    its worker stages' predicted drop (_split): their leader is named where it leads the
    others and every other row's stage by the costs alone beyond their noise (witness
    "isolated costs"); the row stays as the rounds read it. Unchanged where the costs
    alone cannot split the row, put no cost in it beyond their noise, put another row's
    stage first, or cannot order their leader: a tie of the stages within says no more
    than the row does, and loses what the rounds settled on it."""
    row = cost.get(v.bottleneck) if v.bottleneck in STAGES else None
    split = _split(row, pred) if row is not None else {}
    if len(split) < 2:
        return v
    a = pred.alone
    top = max(split, key=lambda n: split[n][0])
    d, se, _ = split[top]
    others = {n: p for n, p in v.predicted.items() if n != row.stage}
    if d <= Z_UPPER * se or any(p[0] > d for p in others.values()):
        return v
    every = {**split, **others}
    if not all(_leads_alone(every, a, top, n, noise_scale) for n in every if n != top):
        return v
    return dataclasses.replace(v, bottleneck=top, tied=(), witness="isolated costs", within=split,
                               reason=f"{v.reason}; {reasons.within(row, top, split)}")


def _split(row: StageCost, pred: witness.Prediction) -> dict:
    """{stage: its predicted drop (witness.Prediction.drop)} for each worker stage within
    `row` that holds several, between the worker stages' points inside it (the last one
    to the row's upper point: collate's with the handoff's, which has no cost alone); {}
    where the row holds one stage or a drop is not predicted (augment not timed apart)."""
    if len(row.includes) < 2 or not row.lower or not row.upper:
        return {}
    lo, up = POINTS.index(row.lower), POINTS.index(row.upper)
    bounds = [row.lower, *(p for p in witness.WORK_POINTS if lo < POINTS.index(p) < up), row.upper]
    out = {}
    for lower, upper in zip(bounds, bounds[1:]):
        d = pred.drop(lower, upper)
        if d is None:
            return {}
        out[STAGES[POINTS.index(lower)]] = d
    return out


def _none_alone(v: Verdict, pred: witness.Prediction, base_point: str, gap: Optional[Contrast], *, t_full: float,
                noise_scale: float) -> Verdict:
    """An inconclusive run whose worker stages, by their costs alone, cost the loop less
    than NONE_ALONE_MAX_LOSS with the rest of the gap (the rounds' drop from base_point to
    the ceiling, its bound), the rounds' own loss to them agreeing: `none`. The loss is
    held against the fastest reading of the step (_fastest_step). Where the rounds are too
    few to bound anything (fewer than CHECKED_ROUNDS), _none_unchecked's rule."""
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
    # makes the input's share look small
    low = _fastest_step(pred, pred.base - Z_UPPER * noise_scale * v.noise.point_sigma(base_point))
    loss = up + rest
    if low <= 0 or loss > NONE_ALONE_MAX_LOSS * (low + loss) or (
            excess.estimate > 0 and compare(excess, t_full, scale=noise_scale, z=Z_NOISE).real):
        if (gap.rounds or 0) < CHECKED_ROUNDS:
            return _none_unchecked(v, pred, base_point, up)
        return v
    reason = reasons.none_alone(pred.alone, up=up, rest=rest, low=low, read=gap.estimate)
    return dataclasses.replace(v, bottleneck="none", witness="isolated costs", reason=reason)


# `none` on the costs alone: their loss (with their error and the rounds' rest of the gap)
# under MIN_REL_DROP of the batch, where no stage's cost is real however many rounds come
# (they could only confirm it or find the witnesses disagree); NONE_MAX_LOSS is the
# rounds' own bound.
NONE_ALONE_MAX_LOSS = MIN_REL_DROP
# With fewer rounds than plan.Plan.min_rounds, the rounds' bound on the loss is no check of
# the costs alone (a step of seconds). Two readings agree within STEP_AGREE of the larger.
CHECKED_ROUNDS = 3
STEP_AGREE = NOISY_REL_IQR


def _fastest_step(pred: witness.Prediction, step: float) -> float:
    """The fastest reading of the step: `step` (the rounds'), or the step timed alone
    beside the costs alone where it read faster. A busy machine only slows a reading, and
    slows a step's threads more than the stages' one: a loss held against the slowed
    reading looks smaller than the loop's."""
    alone = pred.alone.step
    return min(step, alone) if alone is not None and alone > 0 else step


def _none_unchecked(v: Verdict, pred: witness.Prediction, base_point: str, up: float) -> Verdict:
    """`none` on the costs alone where the rounds are too few to check them (_none_alone),
    each point by its own reading (one window will do; a point doing less work read slower
    says the readings are noisy, not that `full` loses more): the costs alone with their
    error (`up`) and the rounds' reading from base_point to the ceiling under
    NONE_ALONE_MAX_LOSS of the batch, held against the fastest reading of the step (the
    ceiling, or the step timed alone); `full` read within STEP_AGREE of that step plus the
    loss: the cheap check that the step the costs were compared with is the loop's, and
    that nothing the costs alone do not see (a batch sampler's work) costs the loop more."""
    if pred.alone.step is None or pred.alone.step <= 0:
        return v
    ceiling, full = v.noise.time(v.ceiling), v.noise.time("full")
    step = _fastest_step(pred, ceiling)
    rest = max(0.0, v.noise.time(base_point) - ceiling)
    loss = up + rest
    if step <= 0 or loss > NONE_ALONE_MAX_LOSS * (step + loss):
        return v
    if full - step - loss > STEP_AGREE * full:  # the costs alone would say none: the reason says what stood against
        return dataclasses.replace(v, reason=v.reason + reasons.unchecked_against(loss=loss, step=step, full=full,
                                                                                  agree=STEP_AGREE))
    reason = reasons.none_unchecked(pred.alone, up=up, rest=rest, ceiling=ceiling, full=full,
                                    rounds=v.gap_rounds or 1)
    return dataclasses.replace(v, bottleneck="none", witness="isolated costs", reason=reason)


def rounds_to_decide(gap: Contrast, t_full: float, most: int = MOST_ROUNDS) -> Optional[int]:
    """The rounds after which, with the gap and the spread of its per-round values as
    measured (drops.projected_sd), the gap would either be real or have its upper bound
    under NONE_MAX_LOSS (at least 2; None when not within `most`)."""
    n = gap.rounds or 0
    if n < 2 or not math.isfinite(gap.se):
        return max(2, n + 2) if n < 2 else None
    sd = drops.projected_sd(gap.se, gap)

    def decides(r: int) -> bool:
        c = Contrast(gap.estimate, sd / math.sqrt(r), r - 1, r)
        return c.upper(Z_UPPER) <= NONE_MAX_LOSS * t_full or is_real(gap.estimate, c.sigma, t_full)
    return drops.first_round(n, decides, most)


def settled(v: Verdict, more_noise: Verdict, less_noise: Verdict) -> bool:
    """Is the verdict firm enough to stop measuring? The same decision made with
    SETTLE_NOISE_SCALE times the noise (`more_noise`) must name the same stage; a `none`
    must stay `none` with 1/SETTLE_NOISE_SCALE of it (`less_noise`: no stage would turn
    real with more rounds); a `tie` settles only where its leads are under MIN_REL_DROP
    of t(full), the floor no amount of measuring lowers (the stages cost the same for any
    purpose), and stays the same tie with less noise and with more (a tie says the
    pipeline is input-bound: like a named stage, that must stand with the margin); a stage
    named within a row the costs alone split (_within), where more noise names it or its
    row (more rounds leave the split as it is: they can only change the row). Never
    an inconclusive verdict, nor one whose two witnesses disagree (`disagree`: a reading
    beyond both noises from its cost alone, or the two ordering stages the other way
    round): its rounds are suspect, and more of them may show it; nor one that names a stage
    merged with the next because the point between them was left out (left_out_in_question:
    more rounds measure it again). (An inconsistent point has been measured again once by
    the scheduler before this is asked.)"""
    if v.bottleneck in (None, "inconclusive") or v.disagree or left_out_in_question(v):
        return False
    if v.bottleneck == "none":
        return less_noise.bottleneck == "none"
    if v.within:  # more rounds leave the costs alone's split as it is: what they can change is the row
        row = row_of(v, v.bottleneck)
        return more_noise.bottleneck in (v.bottleneck, row.stage if row is not None else None)
    if v.bottleneck == "tie":
        floor = MIN_REL_DROP * v.fitted["full"]
        return (less_noise.tied == v.tied == more_noise.tied  # () for any verdict but a tie
                and all(lead.sec_per_batch <= floor for lead in v.leads if lead.over in v.tied))
    return more_noise.bottleneck == v.bottleneck


def in_question(v: Verdict) -> tuple:
    """The stages the user will look inside: the one named, or the stages of a tie
    (costliest first); none for `none`, `inconclusive` or no verdict. The breakdowns are
    shown and the costliest transform confirmed for these."""
    if v.bottleneck in STAGES:
        return (v.bottleneck,)
    return tuple(v.tied) if v.bottleneck == "tie" else ()


def row_of(v: Verdict, name: str) -> Optional[StageCost]:
    """The costed row that holds stage `name`: its own, or the row the rounds read it in
    with the stages before it (merged); None where no row holds it."""
    return next((s for s in v.stages if s.status == "ok" and (s.stage == name or name in s.includes)), None)


def alone_drop(v: Verdict, s: StageCost) -> Optional[tuple]:
    """A stage row's drop by the costs alone, as the report shows it beside the rounds':
    a costed row's (Verdict.predicted), or a stage's within a row they split (within)."""
    return v.predicted.get(s.stage) if s.status == "ok" else v.within.get(s.stage)


def named_cost(v: Verdict, name: str) -> Optional[float]:
    """The seconds per batch the verdict gives stage `name`: its own within a row the
    costs alone split (Verdict.within), else its row's reading; None where not costed."""
    if name in v.within:
        return v.within[name][0]
    s = next((s for s in v.stages if s.stage == name and s.status == "ok"), None)
    return None if s is None else s.sec_per_batch


def left_out_in_question(v: Verdict) -> set:
    """Points left out as inconsistent whose absence merges a stage in question with the
    next (raw left out: load with augment), with the points read faster than them: measured
    again while the run has time, the verdict unsettled till then (settled): two stages
    are merged only for a point the run could not measure again."""
    asked, left = set(in_question(v)), {i.slower: i.faster for i in v.inconsistent}
    out: set = set()
    for s in v.stages:
        if s.status != "ok" or s.stage not in asked or len(s.includes) < 2 or not s.lower or not s.upper:
            continue
        for p in POINTS[POINTS.index(s.lower) + 1:POINTS.index(s.upper)]:
            if p in left:
                out |= {p, left[p]}
    return out


def deciding_points(v: Verdict) -> set:
    """The points whose measurement can still change verdict `v`: around the stages of a
    tie; around the named stage and its runner-up; around the named stage, `full` and the
    ceiling, where it lies within a row the costs alone split; `full` and the
    ceiling when the question is the gap (none, or inconclusive after FEW_ROUNDS rounds); every costed
    point without a verdict or in an inconclusive one of fewer rounds; a point left out
    that merges a stage in question (left_out_in_question)."""
    return _deciding(v) | left_out_in_question(v)


def _deciding(v: Verdict) -> set:
    costed = drops.costed(v.stages)
    if v.bottleneck is None:
        return {p for s in costed for p in (s.lower, s.upper)} | {"full"}
    if v.within:  # named within a row the rounds read whole: the points around it
        i = STAGES.index(v.bottleneck)
        return set(POINTS[i:i + 2]) | {"full", v.ceiling}
    if v.bottleneck == "tie":
        return {p for s in costed if s.stage in v.tied for p in (s.lower, s.upper)} | {"full"}
    if v.bottleneck in STAGES:
        return {p for s in costed[:2] for p in (s.lower, s.upper)} | {"full"}
    if v.bottleneck == "inconclusive" and v.gap_rounds is not None and v.gap_rounds < FEW_ROUNDS:
        # few rounds: a stage's noise is as little known as the gap's, and a stage
        # measured between adjacent visits may turn real before the gap does
        return {p for s in costed for p in (s.lower, s.upper)} | {"full"}
    return {"full", v.ceiling}
