"""The costliest transform of the augment stage, measured in the pipeline.

The breakdown (breakdown.py) times each transform alone, in this process. What the
training loop pays for one of them depends on the user's workers: run in parallel, a
transform costs the loop about its isolated time over the workers, or nothing at all
when another stage is slower. So the costliest step of a Compose (a transform, or a
random container as a whole) is measured where it runs: two sub-points of `raw`, each a
full pipeline run by the user's loader settings and workers, alternating in A B B A
blocks (verify.alternate, the advice's check's schedule):

    with     the step's cached input;  the step and the transforms after it replayed
    without  the step's cached output; only the transforms after it replayed

Everything else is the same on both sides (the loader, the collation, the transforms
after the step, on the same inputs), so the difference of their times per batch is the
step's cost as the loop sees it. It is printed beside the prediction from its isolated
cost: ms per sample x samples per batch / max(1, num_workers).

The caches are computed once here, in this process: the inputs of the transforms before
the step are run on every cached sample's recorded input (twice the step's intermediate
data held in memory for the time of the confirmation).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, Optional

from ..core import tree
from ..core.results import Confirmation, Isolated, Trial
from ..measure import breakdown
from ..measure.experiment import Experiment
from ..measure.visit import Visit
from ..pipeline.recording import Call
from .outcome import outcome
from .verify import TARGET_SPREAD, alternate, dump

# Share of the check's budget (phases._verify) the confirmation may take when augment is
# the bottleneck; the advice's check gets the rest.
CONFIRM_SHARE = 0.5
# A B B A blocks at most. Each visit of `raw` must warm up (the workers start, their
# prefetched batches are drained) before its windows count: in the default budget (half
# of a quarter of 30 s) two blocks give each visit about a second, three too little for
# a window past the drain.
BLOCKS = 2


@dataclasses.dataclass(frozen=True)
class Target:
    """The step to confirm: the recorded call it belongs to, its index among the call's
    steps (breakdown.parts_of), its name, where, and isolated ms per sample."""

    call: str
    index: int
    name: str
    where: str
    ms_per_sample: float


class Rest:
    """The steps of a Compose from one on, called as the Compose calls them (a v2 Compose
    passes several inputs on unpacked): what `raw` replays from a cached intermediate.
    `kwargs` go to the first step only (a call that is one row keeps its keywords)."""

    def __init__(self, fns: list, unpack: bool, kwargs: Optional[dict] = None) -> None:
        self.fns = fns
        self.unpack = unpack
        self.kwargs = kwargs or {}

    def __call__(self, *inputs: Any) -> Any:
        kwargs = self.kwargs
        for fn in self.fns:
            out = fn(*inputs, **kwargs)
            inputs, kwargs = (tuple(out) if self.unpack else (out,)), {}
        return inputs if self.unpack else inputs[0]


def target(isolated: Optional[Isolated], calls_per_sample: Optional[list]) -> tuple[Optional[Target], str]:
    """(the costliest step of the breakdown, or None; why not). A step's cost is the sum
    of its rows (a random container's children together)."""
    aug = isolated.part("augment") if isolated is not None else None
    b = aug.breakdown if aug is not None else None
    if b is None or not b.ok or not b.rows or not calls_per_sample:
        return None, "the augment stage was not broken down"
    ms = {(r.where): r.ms_per_sample for r in b.rows if r.ok and r.ms_per_sample is not None}
    best: Optional[Target] = None
    for call in calls_per_sample[0]:
        for k, step in enumerate(breakdown.parts_of(call)[0]):
            cost = [ms.get(leaf.where) for leaf in step.leaves()]
            if None in cost:
                continue
            if best is None or sum(cost) > best.ms_per_sample:
                best = Target(call.name, k, step.name, step.where, sum(cost))
    if best is None or best.ms_per_sample <= 0:
        return None, "no transform was timed within the budget"
    return best, ""


def sub_calls(calls_per_sample: list, t: Target) -> tuple[list, list]:
    """The calls `raw` replays on each side: the target's call replaced, on every cached
    sample, by the rest of its steps from the target's cached input (with) or output
    (without); the sample's other calls as recorded."""
    with_, without = [], []
    for calls in calls_per_sample:
        a, b = [], []
        for call in calls:
            if call.name != t.call:
                a.append(call)
                b.append(call)
                continue
            x, y = _around(call, t.index)
            a.append(x)
            b.append(y)
        with_.append(a)
        without.append(b)
    return with_, without


def _around(call: Call, k: int) -> tuple[Call, Call]:
    """One call as two: from step k's input, and from its output."""
    steps, unpack = breakdown.parts_of(call)
    fns = [s.fn for s in steps]
    inputs, kwargs = breakdown.call_inputs(call, steps)
    if k:
        inputs = Rest(fns[:k], unpack, kwargs)(*inputs)
        inputs, kwargs = (tuple(inputs) if unpack else (inputs,)), {}
    out = Rest(fns[k:k + 1], unpack, kwargs)(*tree.clone(inputs))
    outputs = tuple(out) if unpack else (out,)
    before = Call(Rest(fns[k:], unpack, kwargs), call.name, inputs, {}, placements=call.placements)
    after = Call(Rest(fns[k + 1:], unpack), call.name, outputs, {}, placements=call.placements)
    return before, after


class Confirm:
    """A schedule (as turns.Trials): yields the visits of the two sides within `budget_s`
    seconds; `result` is the Confirmation, or None when augment is not the bottleneck."""

    def __init__(self, exp: Experiment, *, budget_s: float) -> None:
        self.exp = exp
        self.budget_s = budget_s
        self.result: Optional[Confirmation] = None

    def __iter__(self) -> Iterator[Visit]:
        exp = self.exp
        t, why = target(exp.isolated, exp.caches.raw_calls if exp.caches is not None else None)
        if t is None:
            self.result = Confirmation.missing("unavailable", why)
            return
        predicted = _predicted(exp, t)
        deadline = exp.clock() + self.budget_s
        try:
            too_big = _over_budget(exp.caches, t) or _over_time(exp.caches, exp.isolated, self.budget_s)
            if too_big:
                self.result = _missing(t, "skipped", too_big, predicted)
                return
            with_, without = sub_calls(exp.caches.raw_calls, t)
        except Exception as exc:  # the replay from an intermediate cannot be built: say so
            self.result = _missing(t, "failed", f"{type(exc).__name__}: {exc}"[:300], predicted)
            return
        exp.emit({"event": "confirm", "transform": t.name, "where": t.where})

        def decided(sides: dict) -> bool:
            o = outcome(Trial("confirm", {}, dump(sides[False]), dump(sides[True])), exp.batch_size)
            return o.status == "helps" and (o.spread or math.inf) <= TARGET_SPREAD

        sides, error = yield from alternate(
            exp, "raw", lambda side, visit_deadline: exp.visit("raw", visit_deadline, calls=without if side else with_,
                                                               end=deadline),
            deadline, decided=decided, blocks=BLOCKS)
        trial = Trial("confirm", {}, dump(sides[False]), dump(sides[True]), error)
        self.result = confirmation(t, trial, exp.batch_size, predicted)


def _over_budget(caches: Any, t: Target) -> Optional[str]:
    """Why the step's inputs and outputs for every cached sample would not fit in what
    --cache-mb leaves beside the caches (estimated from the first sample), or None."""
    if caches.budget_bytes is None:
        return None
    first = [c for c in caches.raw_calls[0] if c.name == t.call]
    if not first:
        return None
    before, after = _around(first[0], t.index)
    need = (tree.nbytes(before.args) + tree.nbytes(after.args)) * len(caches.raw_calls)
    left = caches.budget_bytes - sum((caches.held or {}).values())
    if need <= left:
        return None
    return (f"its inputs and outputs for the {len(caches.raw_calls)} cached samples would hold about "
            f"{need / 2**20:.0f} MB, more than the {max(0, left) / 2**20:.0f} MB --cache-mb leaves beside the caches: "
            "raise --cache-mb")


def _over_time(caches: Any, isolated: Optional[Isolated], budget_s: float) -> Optional[str]:
    """Why computing the step's inputs and outputs for every cached sample (the transforms
    up to it, at most the augment stage's cost alone a sample) would not fit in the
    confirmation's budget, or None: a heavy step's run may leave its check a second."""
    aug = isolated.part("augment") if isolated is not None else None
    need = (aug.ms_per_sample or 0.0) / 1e3 * len(caches.raw_calls) if aug is not None else 0.0
    if need <= budget_s:
        return None
    return (f"out of time: its inputs and outputs for the {len(caches.raw_calls)} cached samples would take about "
            f"{need:.1f} s to compute, more than the {budget_s:.1f} s the check gives it")


def _predicted(exp: Experiment, t: Target) -> float:
    items = exp.caches.items_per_batch if exp.caches is not None else exp.batch_size
    return round(t.ms_per_sample * items / max(1, exp.spec.num_workers), 3)


def _missing(t: Target, status: str, reason: str, predicted: Optional[float]) -> Confirmation:
    return Confirmation(status=status, reason=reason, transform=t.name, where=t.where,
                        predicted_ms_per_batch=predicted)


def confirmation(t: Target, trial: Trial, batch_size: float, predicted: Optional[float]) -> Confirmation:
    """The Confirmation of one trial's windows (with: the reference side; without: the
    other): pure, from outcome.outcome's figures."""
    o = outcome(trial, batch_size)
    if o.status in ("failed", "not measured"):
        return _missing(t, "failed" if o.status == "failed" else "not run", o.reason or o.status, predicted)
    with_ms, without_ms = o.ms_per_batch
    return Confirmation(transform=t.name, where=t.where, predicted_ms_per_batch=predicted,
                        measured_ms_per_batch=round(with_ms - without_ms, 3),
                        tolerance_ms=None if o.spread is None else round(without_ms * o.spread, 3),
                        real=o.status == "helps", with_ms_per_batch=with_ms, without_ms_per_batch=without_ms,
                        windows=len(trial.user_windows) + len(trial.candidate_windows), trial=trial)


def with_confirmation(isolated: Isolated, c: Optional[Confirmation]) -> Isolated:
    """`isolated` with the augment breakdown's `confirmed` set (unchanged without one)."""
    aug = isolated.part("augment") if isolated is not None else None
    if c is None or aug is None or aug.breakdown is None:
        return isolated
    b = dataclasses.replace(aug.breakdown, confirmed=c)
    return dataclasses.replace(isolated, augment=dataclasses.replace(aug, breakdown=b))


def skipped(isolated: Isolated, questioned: tuple, reason: str) -> Isolated:
    """Where the confirmation would have run (augment in question: verdict.in_question)
    but the check did not."""
    if "augment" not in questioned:
        return isolated
    return with_confirmation(isolated, Confirmation.missing("skipped", reason))
