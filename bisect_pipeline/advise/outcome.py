"""What the advice's check measured (verify.py), read from its raw windows: pure.

Each trial holds the windows of the full pipeline with the user's settings and with a
candidate's, visit by visit, the visits alternating (A B B A). `outcome` says whether
the candidate helps, by how much and within what interval: the one comparison of the
tool (stats.compare) on the pairs of visits taken next to each other (stats.paired: the
log of each pair's speed-up, their spread at pairs - 1 degrees of freedom); `verified`
gives each advice item its `verified` block, so a report loaded from JSON says exactly
what the run said; `sentence` is the line the advice's message gets.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from ..core.results import AllocatorTiming, Isolated, Trial, Verification
from ..core.stats import Comparison, Contrast, compare, paired
from ..derive.findings import Checked, Finding, Outcome


LOADER_SETTINGS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
THREADS = "torch_num_threads"
# A fix of the pipeline itself (fixes.py) is tried as the settings {"fix": kind}.
FIX = "fix"
APPLICABLE = LOADER_SETTINGS + (THREADS, FIX)
# What each fix is, as the check's sentences name it.
FIX_WORDS = {"device_tail": "the transforms' tail run batched on the device",
             "decode": "the images decoded by torchvision",
             "device_augment": "the random transforms run batched on the device"}
# The allocator item is checked by the step timed alone (allocator.Held.time_step).
ALLOCATOR_SOURCE = "the training step alone, paired: this process's malloc settings vs held"


def outcome(trial: Trial, batch_size: float) -> Outcome:
    """What one trial's windows say (see Outcome); against its `base` where it has one."""
    if trial.error:
        o = Outcome(trial.settings, "failed", reason=trial.error)
    elif (c := compared(trial)) is None:
        o = Outcome(trial.settings, "not measured",
                    reason="out of time before two pairs of visits (one with your settings, one with these)")
    else:
        o = read(trial.settings, c, per_batch(trial))
    return dataclasses.replace(o, base=dict(trial.base)) if trial.base else o


def read(settings: dict, c: Contrast, ms_per_batch: Optional[tuple]) -> Outcome:
    """The Outcome of a log speed-up `c` (the candidate's over the user's) by the one
    comparison: helps, no gain or slower, its figure, spread and interval."""
    cmp = judged(c)
    real = cmp.real and math.isfinite(cmp.sigma)
    status = "no gain" if not real else ("helps" if c.estimate > 0 else "slower")
    spread = math.expm1(cmp.threshold) if math.isfinite(cmp.threshold) else None
    low, high = (_exp(cmp.low), _exp(cmp.high)) if math.isfinite(cmp.sigma) else (None, None)
    return Outcome(settings, status, round(math.exp(c.estimate), 4), None if spread is None else round(spread, 4),
                   ms_per_batch=ms_per_batch, low=low, high=high, pairs=c.rounds)


def _exp(x: float) -> Optional[float]:
    return round(math.exp(x), 4) if x < 700 else None


def compared(trial: Trial) -> Optional[Contrast]:
    """The log of the candidate's speed-up over the user's from the pairs of visits taken
    next to each other (stats.paired on each visit's time per batch: its windows' total
    time over their steps); None before two pairs. Visit i of one side was taken next to
    visit i of the other (verify.alternate keeps a visit without windows in the count);
    windows written without their visit (an older document) are each a visit."""
    a, b = visit_times(trial.user_windows), visit_times(trial.candidate_windows)
    pairs = sorted(set(a) & set(b))
    if len(pairs) < 2:
        return None
    return paired([b[v] for v in pairs], [a[v] for v in pairs])  # log(user time / candidate time)


def judged(c: Contrast) -> Comparison:
    """The one comparison (stats.compare) of a log speed-up against 1 (the 5% floor)."""
    return compare(c, 1.0)


def visit_times(windows: tuple) -> dict:
    """Each visit's time per step: its windows' total time over their total steps."""
    by_visit: dict = {}
    for k, w in enumerate(windows):
        v = w.visit if w.visit is not None else -1 - k
        steps, seconds = by_visit.get(v, (0, 0.0))
        by_visit[v] = (steps + int(w.steps), seconds + float(w.seconds))
    if any(v < 0 for v in by_visit):  # no visits written: the windows in order
        by_visit = {i: by_visit[v] for i, v in enumerate(sorted(by_visit, reverse=True))}
    return {v: sec / st for v, (st, sec) in by_visit.items() if st > 0 and sec > 0}


def per_batch(trial: Trial) -> Optional[tuple]:
    """Each side's ms per batch, the user's first: total time over total steps (a
    training run pays its stalls); None where a side has no window."""
    out = []
    for ws in (trial.user_windows, trial.candidate_windows):
        steps, seconds = sum(int(w.steps) for w in ws), sum(float(w.seconds) for w in ws)
        if steps <= 0 or seconds <= 0:
            return None
        out.append(round(seconds / steps * 1e3, 3))
    return tuple(out)


def verified(finding: "Finding", verification: Optional[Verification], isolated: Optional[Isolated],
             batch_size: float) -> Optional[Checked]:
    """The advice item's `verified` block, or None when nothing was measured for it. The
    status is the best candidate's: helps (the first that helped), else that of the last
    one measured (no gain, slower), else that of the last one tried; a fix measured on top
    of the workers item's settings (`base`) is in `tried`, said apart (`on_top`), never
    the item's own figure. The allocator item is verified by the step timed alone with
    the default and the held allocator."""
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
    alone = [t for t in tried if not t.base] or list(tried)
    measured = [t for t in alone if t.status in ("no gain", "slower")]
    best = next((t for t in alone if t.status == "helps"), measured[-1] if measured else alone[-1])
    return Checked(best.status, best.speedup, best.spread, best.settings, predicted(finding), tried,
                   "the full pipeline with your settings and with these, in alternating visits", best.reason,
                   best.ms_per_batch, best.low, best.high)


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


def sentence(v: Checked, graph: bool = False) -> str:
    """The measured line added to an advice item's message (`graph`: settings_text)."""
    if v.status == "not measured" and not v.tried:
        return f" Not measured before printing: {v.reason}."
    if v.source == ALLOCATOR_SOURCE:
        return ""  # the allocator message gives its measured numbers itself
    if v.status == "helps":
        pred = f", predicted up to {v.predicted:.2f}\u00d7" if v.predicted else ""
        text = f" Measured before printing: {_fig(v)} with {settings_text(v.settings, graph)}{_ms(v)}{pred}."
        others = [t for t in _alone(v) if t.settings != v.settings]
        if others:
            text += " Tried first: " + "; ".join(_tried_text(t, graph) for t in others) + "."
        return text + on_top(v, graph)
    if v.status == "slower":
        return (" Measured before printing, and not a fix on this machine as it is: "
                + "; ".join(_tried_text(t, graph) for t in _alone(v)) + "." + on_top(v, graph))
    if v.status == "no gain":
        return (" Measured before printing, and no gain beyond the noise on this machine as it is, so not "
                "presented as a fix: " + "; ".join(_tried_text(t, graph) for t in _alone(v)) + "." + on_top(v, graph))
    return " Not measured before printing: " + "; ".join(_tried_text(t, graph) for t in _alone(v)) + "." + on_top(v, graph)


def figure(v: Checked) -> Optional[str]:
    """What the check says of an advice item, as its headline's figure: "measured 1.27×
    (1.12–1.44×)", with the figure on top of the workers item's settings where the fix was
    measured there too; None for the allocator item (its message gives its own figure)."""
    if v.source == ALLOCATOR_SOURCE:
        return None
    if v.status == "helps":
        t = _top(v)  # the fix on top of the workers item's settings: what a user who applies both gets
        if t is None or t.status not in _LABEL:
            return f"measured {_fig(v)}"
        there = {"helps": f"{_fig(t)} more", "no gain": f"no gain beyond the noise ({_fig(t)})",
                 "slower": f"slower ({_fig(t)})"}[t.status]
        return f"measured {_fig(v)} on your settings; on top of the workers item's settings, {there}"
    if v.status == "no gain":
        return "measured no gain beyond the noise on this machine as it is, so not presented as a fix"
    if v.status == "slower":
        return "measured slower, so not a fix on this machine as it is"
    return "not measured"


def detail(v: Checked, graph: bool = False) -> str:
    """What the check measured, beneath an advice item's reasoning (its figure is in the
    headline: figure; `graph`: settings_text)."""
    if v.source == ALLOCATOR_SOURCE:
        return ""
    if v.status == "not measured" and not v.tried:
        return f" Not measured before printing: {v.reason}."
    if v.status == "helps":
        text = (f" Measured before printing in alternating visits of the full pipeline, yours against "
                f"{settings_text(v.settings, graph)}{_ms(v)}.")
        others = [t for t in _alone(v) if t.settings != v.settings]
        if others:
            text += " Tried first: " + "; ".join(_tried_text(t, graph) for t in others) + "."
        return text + on_top(v, graph)
    measured = v.status in ("no gain", "slower")
    return f" {'Measured' if measured else 'Not measured'} before printing: " + "; ".join(
        _tried_text(t, graph) for t in _alone(v)) + "." + on_top(v, graph)


def _alone(v: Checked) -> list:
    """The candidates measured against the user's own settings."""
    return [t for t in v.tried if not t.base]


def _top(v: Checked) -> Optional[Outcome]:
    """The fix's trial on top of the workers item's settings (`base`), or None."""
    return next((t for t in reversed(v.tried) if t.base), None)


def on_top(v: Checked, graph: bool = False) -> str:
    """The fix measured on top of the workers item's settings (`base`), against them: the
    gain it adds where the user applies both ("" where it was not)."""
    t = _top(v)
    if t is None:
        return ""
    alone = dataclasses.replace(t, settings={k: x for k, x in t.settings.items() if k not in t.base})
    return (f" On top of {settings_text(t.base, graph)} (the workers item's settings, which you would apply with "
            f"it), against those settings: {_tried_text(alone, graph)}.")


def _ms(t: Any) -> str:
    """": 128 → 110 ms/batch", yours then the candidate's, when measured."""
    if not t.ms_per_batch:
        return ""
    mine, theirs = t.ms_per_batch
    return f": {mine:.3g} \u2192 {theirs:.3g} ms/batch"


def interval(o: Any) -> str:
    """A speed-up's interval as the report prints it: "2.90-4.55x", the candidate's speed
    over yours at the level it was asked at (stats.compare); "" where unknown. The advice's
    check, --tune and compare print it so alike."""
    low, high = getattr(o, "low", None), getattr(o, "high", None)
    if low is None:
        return ""
    top = f"{high:.2f}" if high is not None and high < 1e3 else "∞"
    return f"{low:.2f}–{top}×"


def _fig(t: Any) -> str:
    around = interval(t)
    return f"{t.speedup:.2f}×" + (f" ({around})" if around else "")


def _tried_text(t: Outcome, graph: bool = False) -> str:
    what = settings_text(t.settings, graph)
    if t.status in ("failed", "not measured"):
        return f"{what}: {t.status} ({t.reason})"
    return f"{what}: {_fig(t)}, {_LABEL[t.status]}"


# A measured outcome's status as a tried candidate's line says it.
_LABEL = {"no gain": "within noise", "slower": "slower", "helps": "helps"}


# The settings of a torchdata.nodes graph, worded on the nodes that hold them
# (pipeline/integrations/nodes.NodeSpec.with_settings applies the same keys).
NODE_SETTING = {"num_workers": "ParallelMapper(num_workers={})", "method": "ParallelMapper(method={!r})",
                "prefetch_factor": "Prefetcher(prefetch_factor={})", "pin_memory": "PinMemory={} (a PinMemory node)"}


def settings_text(settings: dict, graph: bool = False) -> str:
    """Settings as the report names them: 'num_workers=4, persistent_workers=True'; on a
    torchdata.nodes graph (`graph`), on the nodes that hold them: 'ParallelMapper(num_workers=4),
    torch.set_num_threads(1)' (persistent_workers means nothing there: a graph starts its
    threads again at every reset)."""
    if FIX in settings:
        rest = {k: v for k, v in settings.items() if k != FIX}
        return FIX_WORDS.get(settings[FIX], settings[FIX]) + (f" with {settings_text(rest, graph)}" if rest else "")
    if not graph:
        return ", ".join(f"{k}={v}" for k, v in settings.items())
    return ", ".join(NODE_SETTING[k].format(v) if k in NODE_SETTING else
                     f"torch.set_num_threads({v})" if k == THREADS else f"{k}={v}"
                     for k, v in settings.items() if k != "persistent_workers")
