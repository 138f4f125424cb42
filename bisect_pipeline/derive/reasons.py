"""The verdict's reason: the sentence that says why, from the numbers its rules weighed.

Separate from the rules (verdict.py) so that each rule reads as what it decides. Pure:
every figure comes in as an argument.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

from ..core.stats import FEW_ROUNDS, MIN_REL_DROP, Contrast, Throughput, normal_cdf
from . import witness
from .drops import StageCost


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _and(names: list) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _rounds_note(rounds: Optional[int]) -> str:
    """', noise from 2 rounds' where the noise comes from fewer than FEW_ROUNDS rounds: its
    standard error is itself known only roughly, and more rounds would firm it."""
    if rounds is None or rounds >= FEW_ROUNDS:
        return ""
    return f", noise from {rounds} round{'s' if rounds != 1 else ''}"


def _model_note(a: witness.Alone) -> str:
    return "" if a.mode == "serial" else f", as the loop would pay it: {a.describe()}"


def named(top: StageCost, leads: tuple) -> str:
    if not leads:
        return f"removing {top.stage} buys the most throughput ({_ms(top.sec_per_batch)} ms per batch)"
    close = min(leads, key=lambda lead: lead.sec_per_batch / lead.threshold if lead.threshold > 0 else math.inf)
    return (f"removing {top.stage} buys the most throughput: {_ms(top.sec_per_batch)} ms per batch, ahead of "
            f"{close.over} by {_ms(close.sec_per_batch)} ms (real above {_ms(close.threshold)} ms)")


def tie(stages: tuple, tied: tuple, behind: list, gap: Optional[Contrast]) -> str:
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


def undecided(gap: Contrast, upper: float, t_full: float, measured: Mapping[str, Throughput], *, z_upper: float,
              none_max_loss: float) -> str:
    """Why a run without a real cost cannot say `none`: the gap's bound (`upper`, z_upper
    standard errors above it) against none_max_loss of t(full) (verdict.NONE_MAX_LOSS).
    What would decide it (about how many rounds of `full` and the ceiling:
    rounds_to_decide) is the report's next step, said there (report/summary.py), not here."""
    if gap.rounds is None:  # noise from the windows (a document of schema 1): the points of one window
        few = "; ".join(f"{p}: {tp.n} window" for p, tp in measured.items() if tp.n < 2)
        return (f"the measurements are too noisy to tell ({few + '; ' if few else ''}the loss to input could be up to "
                f"{min(upper / t_full, 1.0) * 100:.0f}%)")
    bound = (f"could be up to {min(upper / t_full, 9.99) * 100:.0f}% at {normal_cdf(z_upper) * 100:.1f}% confidence"
             if math.isfinite(upper) else "has no bound yet")
    return (f"the loss to input {bound} (from {gap.rounds} round{'s' if gap.rounds != 1 else ''}), and `none` needs "
            f"that bound under {none_max_loss * 100:.0f}%")


def _readings(cost: Mapping, predicted: Mapping, disagree: tuple, a: Optional[witness.Alone] = None) -> str:
    """'collate reads 3.1 ms per batch in the loop where alone it costs 0.1; ...', and where
    load was timed through a streaming dataset's iterator as well as by index, what the
    two timed differently."""
    return "; ".join(f"{n} reads {_ms(cost[n].sec_per_batch)} ms per batch in the loop where alone it costs "
                     f"{_ms(predicted[n][0])}{_iterator_note(a) if n == 'load' else ''}" for n in disagree)


def _iterator_note(a: Optional[witness.Alone]) -> str:
    """' (through its iterator in a worker; by index, get_item costs 4.0 ms a batch: the
    iterator 2.2 more)' where load was timed both ways (witness.Alone.index_load)."""
    if a is None or a.index_load is None or "load" not in a.work:
        return ""
    more = a.work["load"] - a.index_load
    return (f" (through its iterator in a worker; by index, get_item costs {_ms(a.index_load)} ms a batch: the "
            f"iterator {_ms(abs(more))} {'more' if more >= 0 else 'less'})")


def disagreement(tied: tuple, cost: Mapping, predicted: Mapping, disagree: tuple,
                 a: Optional[witness.Alone] = None) -> str:
    """The tie of the stages the two witnesses name apart (verdict._disagreement)."""
    return (f"{_and(list(tied))}: the rounds and the stages' costs alone disagree "
            f"({_readings(cost, predicted, disagree, a)}), so neither names a stage alone")


def not_input_bound(cost: Mapping, predicted: Mapping, disagree: tuple, up: float, a: witness.Alone, *,
                    steady_rounds: Optional[int]) -> str:
    """Why neither witness holds the pipeline input-bound (verdict._disagreement), as the
    rounds show it: a drift or another program (steady_rounds None), or, each reading
    steady over steady_rounds rounds, the loop paying for more than the stages' own work."""
    if steady_rounds is None:
        why = "the step drifted while the points were measured, or another program slowed some of them"
    else:
        why = (f"{_and(list(disagree))} {'reads' if len(disagree) == 1 else 'read'} so in each of {steady_rounds} "
               "rounds, not a drift of the step: the loop pays for more than the stages' own work, and the stages "
               "timed alone miss it")
    return (f"the rounds read input costs the stages alone do not have ({_readings(cost, predicted, disagree, a)}), "
            f"and alone the worker stages add at most {_ms(up)} ms per batch, under "
            f"{MIN_REL_DROP * 100:.0f}%{_model_note(a)}: {why}")


def ordered_alone(top: str, tied: tuple, cost: Mapping, predicted: Mapping, a: witness.Alone) -> str:
    """A tie the costs alone order (verdict._ordered_alone): `top` against the runner-up
    of the tied stages, alone."""
    runner = max((n for n in tied if n != top), key=lambda n: predicted[n][0])
    ratio = predicted[top][0] / predicted[runner][0] if predicted[runner][0] > 0 else math.inf
    times = f"{ratio:.1f}\u00d7 what {runner} does" if math.isfinite(ratio) else f"more than {runner}"
    read = ", ".join(f"{n} {_ms(cost[n].sec_per_batch)}" for n in tied)
    return (f"{top} leads: the rounds cannot separate it from {_and([n for n in tied if n != top])} yet "
            f"({read} ms per batch); alone it costs {times} "
            f"({_ms(predicted[top][0])} against {_ms(predicted[runner][0])} ms per batch{_model_note(a)})")


def bound_alone(top: str, tied: tuple, predicted: Mapping, a: witness.Alone, *, low: float, t_full: float,
                read: float) -> str:
    """Input-bound by the costs alone (verdict._bound_alone): at least `low` lost, the
    rounds reading `read`; `top` against the runner-up alone, or the stages `tied` alone."""
    words = (f"the pipeline loses at least {_ms(low)} ms per batch to input by its worker stages' costs alone "
             f"({low / t_full * 100:.0f}% of {_ms(t_full)} ms{_model_note(a)}), and the rounds, which cannot tell "
             f"yet, read {_ms(read)} ms")
    if tied:
        return f"{words}; {_and(list(tied))}, tied alone: {_and([_ms(predicted[n][0]) for n in tied])} ms per batch"
    runner = max((n for n in predicted if n != top), key=lambda n: predicted[n][0], default=None)
    return words + (f"; by the costs alone {top} costs the loop {_ms(predicted[top][0])} ms per batch against "
                    f"{runner}'s {_ms(predicted[runner][0])}" if runner else "")


def within(row: StageCost, top: str, split: Mapping) -> str:
    """A row the rounds read whole, split by the costs alone (verdict._within): each of
    its stages' drop, as the loop would pay it, and `top` first."""
    figures = _and([f"{n} {_ms(split[n][0])}" for n in split])
    return (f"within {_and(list(row.includes))}, which the rounds read together as {row.stage}'s row (a point "
            f"between them not measured), the costs alone give {figures} ms per batch: {top} first")


def none_alone(a: witness.Alone, *, up: float, rest: float, low: float, read: float) -> str:
    """`none` by the costs alone (verdict._none_alone): the worker stages add at most `up`,
    the rest of the gap at most `rest`, to a step of at least `low`; the rounds read `read`."""
    loss = up + rest
    return (f"the full pipeline keeps up by its costs alone: its worker stages add at most {_ms(up)} ms to a "
            f"batch of at least {_ms(low + loss)} ms ({loss / (low + loss) * 100:.1f}% with "
            + (f"the rest of the gap, at most {_ms(rest)} ms" if rest > 0 else "nothing else between")
            + f"{_model_note(a)}); the rounds, which cannot bound the loss yet, read {_ms(read)} ms and agree")


def none_unchecked(a: witness.Alone, *, up: float, rest: float, ceiling: float, full: float, rounds: int) -> str:
    """`none` by the costs alone where the rounds are too few to check them
    (verdict._none_unchecked): the worker stages add at most `up`, the rest of the gap
    `rest`, to the step's faster reading; the step alone, the ceiling and `full` as the
    rounds read them."""
    loss = up + rest
    step = a.step if a.step is not None else ceiling
    # the ceiling's one reading may be the step alone itself (rounds.Rounds._read_alone)
    one = _ms(step) == _ms(ceiling)
    readings = (f"the step read {_ms(step)} ms alone (the ceiling's reading)" if one else
                f"the step read {_ms(ceiling)} ms in the loop and {_ms(step)} alone")
    return (f"the full pipeline keeps up by its costs alone: its worker stages add at most {_ms(up)} ms to a step of "
            f"{_ms(min(step, ceiling))} ms{'' if one else ', its faster reading'} "
            f"({loss / (min(step, ceiling) + loss) * 100:.1f}% with "
            + (f"the rest of the gap, {_ms(rest)} ms" if rest > 0 else "nothing else between")
            + f"{_model_note(a)}), under the {MIN_REL_DROP * 100:.0f}% at which no stage's cost could be real; the "
            f"rounds, too few to bound the loss ({rounds} round{'s' if rounds != 1 else ''}), agree: {readings}, "
            f"the full pipeline {_ms(full)} ms")


def unchecked_against(*, loss: float, step: float, full: float, agree: float) -> str:
    """What kept a `none` on the costs alone from one round (verdict._none_unchecked): they
    put the loss at `loss` of a step of `step`, but `full` read more than `agree` of itself
    over the two."""
    return (f"; by their costs alone the worker stages add at most {_ms(loss)} ms to a step of {_ms(step)} ms "
            f"({loss / (step + loss) * 100:.1f}%), but the one reading of the full pipeline, {_ms(full)} ms, is "
            f"{(full - step - loss) / full * 100:.0f}% over the two, more than the {agree * 100:.0f}% one reading "
            "allows: the loop pays for something the costs alone do not see, or that reading was slowed")
