"""Every recommended setting measured before it is printed.

When the advice recommends settings the tool can apply itself (num_workers, pin_memory,
prefetch_factor, persistent_workers, the step's torch threads), the full pipeline runs
with them and with the user's own in alternating visits (user, candidate, candidate,
user, ...: a machine drifting over the trial weighs on both alike), within the
verification's budget. The speed-up is the ratio of the two sides' pooled throughputs,
real when beyond the noise by the one rule (stats.is_real on the log ratio). A candidate
that does not help is said so, and the next one is tried while the budget lasts (the
workers with fewer torch threads, the workers alone, one worker fewer).

Two halves: `run_trials` measures (raw windows only, kept in the report's
`verification`); `verified` derives each advice item's `verified` block from those
windows, so a report loaded from JSON says exactly what the run said.

The user's objects are never changed: every visit builds its loader from a modified
copy of the LoaderSpec, and the thread count is set for the candidate's visits only
(and restored after each, and with the rest of the user's state after the run).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Optional

from .stats import Throughput, Window, is_real, noise_threshold

# Share of --max-seconds kept for verification by default, from the rounds that only
# settle the verdict (after the first two): a trial visits the full pipeline four times
# at least, about 1 s each on a 2-core machine, so a quarter of the default 30 s is
# about one candidate and the start of a second. A verdict that settles early leaves more.
VERIFY_SHARE = 0.25
# Visits per trial: decided after each A B B A block from MIN_BLOCKS on, given up (within
# noise) after MAX_BLOCKS. A candidate found slower stops there (it is not a fix, however
# precise the figure); one that helps goes on (budget allowing) until its figure is within
# +-TARGET_SPREAD: "1.55x (+-41%)" decides, but says little about the gain. Each later
# candidate is owed MIN_BLOCKS blocks of the budget, so the first cannot spend it all.
MIN_BLOCKS = 1
MAX_BLOCKS = 3
TARGET_SPREAD = 0.15
_ORDER = (False, True, True, False)  # True: the candidate's visit
# Candidates tried per advice item at most.
MAX_CANDIDATES = 3
LOADER_SETTINGS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
THREADS = "torch_num_threads"
APPLICABLE = LOADER_SETTINGS + (THREADS,)


# --------------------------------------------------------------------------------------
# What to try
# --------------------------------------------------------------------------------------


def candidates(finding: dict, *, threads: int, cores: int, on_cpu: bool) -> list:
    """The settings to try for one advice item, best guess first: the applicable part of
    its recommendation; on the CPU, where workers and the step share the cores, the same
    workers with the step's threads lowered to the cores left (or, when the
    recommendation lowers them already, the workers alone); then one worker fewer
    (workers recommended to a loader without persistent workers come with
    persistent_workers=True, advice._workers, and every candidate keeps it)."""
    rec = dict((finding.get("numbers") or {}).get("recommended") or {})
    first = {k: v for k, v in rec.items() if k in APPLICABLE}
    if not first:
        return []
    out = [first]
    workers = first.get("num_workers")
    if workers:
        alone = {k: v for k, v in first.items() if k != THREADS}
        fewer = max(1, cores - workers)
        if THREADS in first:
            out.append(alone)
        elif on_cpu and threads > fewer:
            out.append(dict(first, **{THREADS: fewer}))
        if workers > 1:
            out.append(dict(first, num_workers=workers - 1))
    unique: list = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return unique[:MAX_CANDIDATES]


# --------------------------------------------------------------------------------------
# Measuring (run_trials: the only part that runs anything)
# --------------------------------------------------------------------------------------


def run_trials(run: Any, advice: list, *, budget_s: float, threads: int, cores: int) -> dict:
    """Measure the candidates of every advice item that recommends applicable settings,
    within `budget_s` seconds of `run.clock`. Returns the report's `verification`:
    {"status", "budget_s", "elapsed_s", "trials": [{"item", "settings", "user_windows",
    "candidate_windows", "error"}]} (raw windows; `verified` derives the rest)."""
    start = run.clock()
    deadline = start + budget_s
    on_cpu = run.device.type == "cpu"
    trials: list = []
    items = [(f, candidates(f, threads=threads, cores=cores, on_cpu=on_cpu)) for f in advice]
    items = [(f, c) for f, c in items if c]
    left = sum(len(c) for _, c in items)  # candidates not yet tried
    for finding, cands in items:
        for k, settings in enumerate(cands):
            left -= 1
            if run.clock() >= deadline:
                break
            run.emit({"event": "verify", "item": finding["kind"], "settings": settings})
            trial = _trial(run, settings, deadline, owed=len(_ORDER) * MIN_BLOCKS * left)
            trials.append({"item": finding["kind"], **trial})
            if outcome(trial, run.batch_size)["status"] == "helps":
                left -= len(cands) - k - 1  # the first candidate that helps is the one to print
                break
    status = "ok" if trials else ("skipped" if not items else "out of time")
    return {"status": status, "budget_s": round(budget_s, 3), "elapsed_s": round(run.clock() - start, 3),
            "trials": trials}


def _trial(run: Any, settings: dict, deadline: float, owed: int = 0) -> dict:
    """The user's settings and the candidate in A B B A blocks of full-pipeline visits,
    until a block ends (from MIN_BLOCKS on) with the candidate decided slower, or decided
    helping within TARGET_SPREAD; MAX_BLOCKS blocks; or the deadline. Each visit gets an
    equal share of what is left, counting the `owed` visits of the candidates after it."""
    sides: dict = {False: [], True: []}  # per side, one list of windows per visit
    error = None
    total = 4 * MAX_BLOCKS
    for i in range(total):
        now = run.clock()
        if now >= deadline:
            break
        candidate = _ORDER[i % 4]
        try:
            windows = visit(run, settings if candidate else {}, now + (deadline - now) / (total - i + owed))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # the candidate's settings break the pipeline: say so
            error = f"{type(exc).__name__}: {exc}"[:300]
            break
        if windows:
            sides[candidate].append(windows)
        if (i + 1) % 4 == 0 and (i + 1) // 4 >= MIN_BLOCKS:
            raw = {"settings": settings, "user_windows": _dump(sides[False]), "candidate_windows": _dump(sides[True])}
            o = outcome(raw, run.batch_size)
            if o["status"] == "slower" or (o["status"] == "helps" and (o["spread"] or math.inf) <= TARGET_SPREAD):
                break
    return {"settings": dict(settings), "user_windows": _dump(sides[False]),
            "candidate_windows": _dump(sides[True]), "error": error}


def visit(run: Any, settings: dict, deadline: float) -> list:
    """One visit of the full pipeline with `settings` applied ({}: the user's own), as the
    bisection visits `full` (run.source: same dataset copy, transfer, step and plan), but
    with the epochs ending as in the user's loop: workers added are forked again every
    epoch unless persistent, and that is part of what they cost."""
    import torch

    from . import faults, run as run_mod
    from .timing import measure

    spec = run.spec.with_settings(settings)
    threads = settings.get(THREADS)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        end = deadline - run.clock() + run_mod.HANG_GRACE_S
        with faults.Watchdog(run.step_timeout, lambda: "verifying the advice", end=end) as dog:
            source, move = run.source("full", spec, epochs=True)
            with source as next_batch:
                m = measure(next_batch, move, run.step, batch_size=run.batch_size,
                            plan=run.plan.for_workers(spec.num_workers), deadline=deadline, clock=run.clock,
                            sync=run.sync, prefetch_depth=spec.prefetch_depth, beat=dog.beat)
    finally:
        if threads:
            torch.set_num_threads(before)
    return list(m.throughput.windows) if m.throughput else []


def _dump(visits: list) -> list:
    return [{"steps": w.steps, "seconds": w.seconds, "visit": v} for v, windows in enumerate(visits) for w in windows]


# --------------------------------------------------------------------------------------
# What the windows say (pure)
# --------------------------------------------------------------------------------------


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
