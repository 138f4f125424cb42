"""What the advice's check measured (verify.py), read from its raw windows: pure.

Each trial holds the windows of the full pipeline with the user's settings and with a
candidate's, visit by visit. `outcome` says whether the candidate helps, by how much and
within what spread (the one rule, stats.is_real, on the log of the speed-up); `verified`
gives each advice item its `verified` block, so a report loaded from JSON says exactly
what the run said; `sentence` is the line the advice's message gets.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

from .stats import Throughput, Window, is_real, noise_threshold

LOADER_SETTINGS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
THREADS = "torch_num_threads"
APPLICABLE = LOADER_SETTINGS + (THREADS,)


def outcome(trial: dict, batch_size: float) -> dict:
    """status (helps | no gain | slower | failed | not measured), speedup (candidate over
    the user's settings, ratio of the two sides' total steps over total time) and spread (the relative
    change the noise alone could make: Z_NOISE combined standard errors, at least the 5%
    floor, as for every other "is it real" in the tool)."""
    if trial.get("error"):
        return {"status": "failed", "reason": trial["error"]}
    sides = [trial.get(k) or [] for k in ("user_windows", "candidate_windows")]
    a, b = (_throughput(ws, batch_size) for ws in sides)
    if a is None or b is None:
        return {"status": "not measured", "reason": "out of time before both settings had two windows"}
    # total steps over total time, not the median window: a training run pays its
    # stalls, and a worker competing with the step for the cores stalls now and then
    # (measured: w1 + 1 thread on 2 cores, the median of 3 windows 10-20% above the
    # visit's own total rate and a hand loop's; at num_workers=0 the two agree)
    ratio = _rate(b) / _rate(a)
    se = math.hypot(*(max(tp.rel_se, _visit_rel_se(ws)) for tp, ws in zip((a, b), sides)))
    spread = math.expm1(noise_threshold(se, 1.0)) if math.isfinite(se) else None
    real = math.isfinite(se) and is_real(abs(math.log(ratio)), se, 1.0)
    status = "no gain" if not real else ("helps" if ratio > 1 else "slower")
    return {"status": status, "speedup": round(ratio, 4), "spread": None if spread is None else round(spread, 4)}


def _rate(tp: Throughput) -> float:
    return tp.steps / tp.seconds if tp.seconds > 0 else math.inf


def _visit_rel_se(windows: list) -> float:
    """The relative standard error of a side's throughput from its visits' agreement:
    windows of one visit share its conditions (the machine's state for that second or
    two), so n windows from a few visits are fewer than n independent measurements, and
    visits that disagree (measured here: a 2-thread step on 2 cores scatters +-10-15%
    from one 1-s visit to the next in a hand loop, settings unchanged) must widen the
    figure. sd of the visits' log throughputs over sqrt(visits); 0 with fewer than two
    visits, or windows written without their visit."""
    by_visit: dict = {}
    for w in windows:
        if "visit" not in w:
            return 0.0
        steps, seconds = by_visit.get(w["visit"], (0, 0.0))
        by_visit[w["visit"]] = (steps + int(w["steps"]), seconds + float(w["seconds"]))
    logs = [math.log(st / sec) for st, sec in by_visit.values() if st > 0 and sec > 0]
    if len(logs) < 2:
        return 0.0
    return statistics.stdev(logs) / math.sqrt(len(logs))


def _throughput(windows: list, batch_size: float) -> Optional[Throughput]:
    ws = tuple(Window(int(w["steps"]), float(w["seconds"])) for w in windows)
    return Throughput(ws, batch_size) if len(ws) >= 2 else None


def verified(finding: dict, verification: dict, isolated: dict, batch_size: float) -> Optional[dict]:
    """The advice item's `verified` block, or None when nothing was measured for it:
    {"status", "speedup", "spread", "settings", "predicted", "tried": [...], "source"}.
    The status is the best candidate's: helps (the first that helped), else that of the
    last one measured (no gain, slower), else that of the last one tried. The allocator item is verified by the step timed alone with the
    default and the held allocator (allocator.Held.time_step)."""
    if finding["kind"] == "allocator":
        return _allocator_verified(isolated.get("allocator") or {})
    tried = [dict(settings=t["settings"], **outcome(t, batch_size))
             for t in (verification or {}).get("trials", []) if t.get("item") == finding["kind"]]
    if not tried:
        if not (finding.get("numbers") or {}).get("recommended"):
            return None
        reason = (verification or {}).get("reason") or "out of time: the bisection used the verification's budget"
        if not any(k in APPLICABLE for k in finding["numbers"]["recommended"]):
            reason = "not a setting this tool can apply to your loop; check it with compare (before/after runs)"
        return {"status": "not measured", "reason": reason, "predicted": predicted(finding), "tried": []}
    measured = [t for t in tried if t["status"] in ("no gain", "slower")]
    best = next((t for t in tried if t["status"] == "helps"), measured[-1] if measured else tried[-1])
    out = {"status": best["status"], "speedup": best.get("speedup"), "spread": best.get("spread"),
           "settings": best["settings"], "predicted": predicted(finding), "tried": tried,
           "source": "the full pipeline with your settings and with these, in alternating visits"}
    if best.get("reason"):
        out["reason"] = best["reason"]
    return out


def predicted(finding: dict) -> Optional[float]:
    """The advice's own prediction: throughput if the stage were free over today's."""
    h = (finding.get("numbers") or {}).get("headroom") or {}
    if h.get("samples_per_sec") and h.get("samples_per_sec_if_free"):
        return round(h["samples_per_sec_if_free"] / h["samples_per_sec"], 4)
    return None


def _allocator_verified(a: dict) -> Optional[dict]:
    d, h = a.get("default_ms_per_batch"), a.get("held_ms_per_batch")
    if not d or not h:
        return None
    spread = (a.get("noise_ms") or 0.0) / h
    return {"status": "helps" if a.get("real") else "no gain", "speedup": round(d / h, 4),
            "spread": round(spread, 4), "settings": {"malloc": "freed memory kept (mallopt)"}, "predicted": None,
            "tried": [], "source": "the training step alone, paired: this process's malloc settings vs held"}


def sentence(v: dict) -> str:
    """The measured line added to an advice item's message."""
    status = v["status"]
    if status == "not measured" and not v.get("tried"):
        return f" Not measured before printing: {v.get('reason')}."
    if v.get("source", "").startswith("the training step alone"):
        return ""  # the allocator message gives its measured numbers itself
    tried = v.get("tried") or []
    if status == "helps":
        pred = f", predicted up to {v['predicted']:.2f}\u00d7" if v.get("predicted") else ""
        text = f" Measured before printing: {_fig(v)} with {settings_text(v['settings'])}{pred}."
        others = [t for t in tried if t["settings"] != v["settings"]]
        if others:
            text += " Tried first: " + "; ".join(_tried_text(t) for t in others) + "."
        return text
    if status == "slower":
        return (" Measured before printing, and not a fix on this machine as it is: "
                + "; ".join(_tried_text(t) for t in tried) + ".")
    if status == "no gain":
        return (" Measured before printing, and no gain beyond the noise on this machine as it is, so not "
                "presented as a fix: " + "; ".join(_tried_text(t) for t in tried) + ".")
    return " Not measured before printing: " + "; ".join(_tried_text(t) for t in tried) + "."


def _fig(t: dict) -> str:
    spread = f" (\u00b1{t['spread'] * 100:.0f}%)" if t.get("spread") is not None else ""
    return f"{t['speedup']:.2f}\u00d7{spread}"


def _tried_text(t: dict) -> str:
    what = settings_text(t["settings"])
    if t["status"] in ("failed", "not measured"):
        return f"{what}: {t['status']} ({t.get('reason')})"
    label = {"no gain": "within noise", "slower": "slower", "helps": "helps"}[t["status"]]
    return f"{what}: {_fig(t)}, {label}"


def settings_text(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())
