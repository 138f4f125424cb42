"""What the advice's check measured (verify.py), read from its raw windows: pure.

Each trial holds the windows of the full pipeline with the user's settings and with a
candidate's, visit by visit. `outcome` says whether the candidate helps, by how much and
within what spread (the one rule, stats.is_real, on the log of the speed-up); `verified`
gives each advice item its `verified` block, so a report loaded from JSON says exactly
what the run said; `sentence` is the line the advice's message gets.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from .results import AllocatorTiming, Isolated, Record, Trial, Verification
from .stats import Throughput, Window, is_real, noise_threshold

if TYPE_CHECKING:  # pragma: no cover
    from .advice import Finding

LOADER_SETTINGS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
THREADS = "torch_num_threads"
APPLICABLE = LOADER_SETTINGS + (THREADS,)
# The allocator item is checked by the step timed alone (allocator.Held.time_step).
ALLOCATOR_SOURCE = "the training step alone, paired: this process's malloc settings vs held"


@dataclasses.dataclass(frozen=True)
class Outcome(Record):
    """One candidate against the user's settings: status helps, no gain, slower, failed or
    not measured; the speed-up (candidate over user, total steps over total time), the
    spread the noise alone could make (Z_NOISE combined standard errors, at least the 5%
    floor), and the time per batch of each side, the user's first (the same totals)."""

    settings: dict = dataclasses.field(default_factory=dict)
    status: str = "not measured"
    speedup: Optional[float] = None
    spread: Optional[float] = None
    reason: Optional[str] = None
    ms_per_batch: Optional[tuple] = None


@dataclasses.dataclass(frozen=True)
class Checked(Record):
    """An advice item's `verified` block: the best candidate's figure, the prediction
    beside it, and every candidate tried."""

    _nested: ClassVar[dict] = {"tried": Outcome}
    _keep_none: ClassVar[tuple] = ("speedup", "spread", "predicted")
    status: str = "not measured"
    speedup: Optional[float] = None
    spread: Optional[float] = None
    settings: Optional[dict] = None
    predicted: Optional[float] = None
    tried: tuple = ()
    source: Optional[str] = None
    reason: Optional[str] = None
    ms_per_batch: Optional[tuple] = None


def outcome(trial: Trial, batch_size: float) -> Outcome:
    """What one trial's windows say (see Outcome)."""
    if trial.error:
        return Outcome(trial.settings, "failed", reason=trial.error)
    compared = speedup(trial, batch_size)
    if compared is None:
        return Outcome(trial.settings, "not measured", reason="out of time before both settings had two windows")
    ratio, se, per_batch = compared
    spread = math.expm1(noise_threshold(se, 1.0)) if math.isfinite(se) else None
    real = math.isfinite(se) and is_real(abs(math.log(ratio)), se, 1.0)
    status = "no gain" if not real else ("helps" if ratio > 1 else "slower")
    return Outcome(trial.settings, status, round(ratio, 4), None if spread is None else round(spread, 4),
                   ms_per_batch=tuple(round(x, 3) for x in per_batch))


def speedup(trial: Trial, batch_size: float) -> Optional[tuple]:
    """(the candidate's speed-up over the user's, the relative standard error of its log,
    each side's ms per batch, the user's first), or None before both sides have two
    windows. The speed-up is total steps over total time, not the median window: a
    training run pays its stalls, and a worker competing with the step for the cores
    stalls now and then (measured: w1 + 1 thread on 2 cores, the median of 3 windows
    10-20% above the visit's own total rate and a hand loop's; at num_workers=0 the two
    agree)."""
    sides = (trial.user_windows, trial.candidate_windows)
    a, b = (_throughput(ws, batch_size) for ws in sides)
    if a is None or b is None:
        return None
    se = math.hypot(*(max(tp.rel_se, _visit_rel_se(ws)) for tp, ws in zip((a, b), sides)))
    return _rate(b) / _rate(a), se, tuple(1e3 / _rate(tp) for tp in (a, b))


def _rate(tp: Throughput) -> float:
    return tp.steps / tp.seconds if tp.seconds > 0 else math.inf


def _visit_rel_se(windows: tuple) -> float:
    """The relative standard error of a side's throughput from its visits' agreement:
    windows of one visit share its conditions (the machine's state for that second or
    two), so n windows from a few visits are fewer than n independent measurements, and
    visits that disagree (measured here: a 2-thread step on 2 cores scatters +-10-15%
    from one 1-s visit to the next in a hand loop, settings unchanged) must widen the
    figure. sd of the visits' log throughputs over sqrt(visits); 0 with fewer than two
    visits, or windows written without their visit."""
    by_visit: dict = {}
    for w in windows:
        if w.visit is None:
            return 0.0
        steps, seconds = by_visit.get(w.visit, (0, 0.0))
        by_visit[w.visit] = (steps + int(w.steps), seconds + float(w.seconds))
    logs = [math.log(st / sec) for st, sec in by_visit.values() if st > 0 and sec > 0]
    if len(logs) < 2:
        return 0.0
    return statistics.stdev(logs) / math.sqrt(len(logs))


def _throughput(windows: tuple, batch_size: float) -> Optional[Throughput]:
    ws = tuple(Window(int(w.steps), float(w.seconds)) for w in windows)
    return Throughput(ws, batch_size) if len(ws) >= 2 else None


def verified(finding: "Finding", verification: Optional[Verification], isolated: Optional[Isolated],
             batch_size: float) -> Optional[Checked]:
    """The advice item's `verified` block, or None when nothing was measured for it. The
    status is the best candidate's: helps (the first that helped), else that of the last
    one measured (no gain, slower), else that of the last one tried. The allocator item
    is verified by the step timed alone with the default and the held allocator."""
    if finding.kind == "allocator":
        return _allocator_verified(isolated.allocator if isolated is not None else None)
    trials = verification.trials if verification is not None else ()
    tried = tuple(outcome(t, batch_size) for t in trials if t.item == finding.kind)
    recommended = finding.numbers.get("recommended")
    if not tried:
        if not recommended:
            return None
        reason = finding.numbers.get("not_checked") or (verification.reason if verification is not None else None) \
            or "out of time: the bisection used the verification's budget"
        if not any(k in APPLICABLE for k in recommended):
            reason = "not a setting this tool can apply to your loop; check it with compare (before/after runs)"
        return Checked("not measured", predicted=predicted(finding), reason=reason)
    measured = [t for t in tried if t.status in ("no gain", "slower")]
    best = next((t for t in tried if t.status == "helps"), measured[-1] if measured else tried[-1])
    return Checked(best.status, best.speedup, best.spread, best.settings, predicted(finding), tried,
                   "the full pipeline with your settings and with these, in alternating visits", best.reason,
                   best.ms_per_batch)


def predicted(finding: "Finding") -> Optional[float]:
    """The advice's own prediction: throughput if the stage were free over today's."""
    h = finding.numbers.get("headroom") or {}
    if h.get("samples_per_sec") and h.get("samples_per_sec_if_free"):
        return round(h["samples_per_sec_if_free"] / h["samples_per_sec"], 4)
    return None


def _allocator_verified(a: Optional[AllocatorTiming]) -> Optional[Checked]:
    if a is None or not a.default_ms_per_batch or not a.held_ms_per_batch:
        return None
    d, h = a.default_ms_per_batch, a.held_ms_per_batch
    return Checked("helps" if a.real else "no gain", round(d / h, 4), round((a.noise_ms or 0.0) / h, 4),
                   {"malloc": "freed memory kept (mallopt)"}, None, (), ALLOCATOR_SOURCE)


def sentence(v: Checked) -> str:
    """The measured line added to an advice item's message."""
    if v.status == "not measured" and not v.tried:
        return f" Not measured before printing: {v.reason}."
    if v.source == ALLOCATOR_SOURCE:
        return ""  # the allocator message gives its measured numbers itself
    if v.status == "helps":
        pred = f", predicted up to {v.predicted:.2f}\u00d7" if v.predicted else ""
        text = f" Measured before printing: {_fig(v)} with {settings_text(v.settings)}{_ms(v)}{pred}."
        others = [t for t in v.tried if t.settings != v.settings]
        if others:
            text += " Tried first: " + "; ".join(_tried_text(t) for t in others) + "."
        return text
    if v.status == "slower":
        return (" Measured before printing, and not a fix on this machine as it is: "
                + "; ".join(_tried_text(t) for t in v.tried) + ".")
    if v.status == "no gain":
        return (" Measured before printing, and no gain beyond the noise on this machine as it is, so not "
                "presented as a fix: " + "; ".join(_tried_text(t) for t in v.tried) + ".")
    return " Not measured before printing: " + "; ".join(_tried_text(t) for t in v.tried) + "."


def _ms(t: Any) -> str:
    """": 128 → 110 ms/batch", yours then the candidate's, when measured."""
    if not t.ms_per_batch:
        return ""
    mine, theirs = t.ms_per_batch
    return f": {mine:.3g} \u2192 {theirs:.3g} ms/batch"


def pm(spread: Optional[float]) -> str:
    """A speed-up's spread as the report prints it: "±8%"; beyond 100% ("±>100%") it says
    only that the figure is unknown (a side with two windows: Student's t at one degree of
    freedom makes it e38%). The advice's check and --tune print it so alike."""
    if spread is None:
        return ""
    return "\u00b1>100%" if spread >= 1 else f"\u00b1{spread * 100:.0f}%"


def _fig(t: Outcome) -> str:
    spread = f" ({pm(t.spread)})" if t.spread is not None else ""
    return f"{t.speedup:.2f}\u00d7{spread}"


def _tried_text(t: Outcome) -> str:
    what = settings_text(t.settings)
    if t.status in ("failed", "not measured"):
        return f"{what}: {t.status} ({t.reason})"
    label = {"no gain": "within noise", "slower": "slower", "helps": "helps"}[t.status]
    return f"{what}: {_fig(t)}, {label}"


def settings_text(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())
