"""What follows from the measurements: the derivation layer, pure.

    diagnose(measurements) -> Diagnosis
        verdict  = verdict.decide(the points measured ok)
        points   = the points, the inconsistent ones marked (left out by the verdict)
        notes    = the measured notes + those the numbers call for (derived_notes)
        advice   = advice.findings(...), each with what its check measured
                   (outcome.verified) when the run has a verification block
        summary  = the verdict in one sentence
        tune     = what the search of --tune found (tune.summarize), when it ran

`to_check(measurements)` is the advice before it is checked: what turns.Trials measures
(the draft); `diagnose` of the measurements with the trials' windows is the final report.
A report loaded from JSON is diagnosed again from its measurements, so it says exactly
what the run said.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..core.results import NOT_SELECTED, CacheInfo, Measurements, Note, PointResult
from ..core.stats import NOISY_REL_IQR
from ..derive import drops, witness
from ..derive.findings import Diagnosis, Finding
from ..derive.self_check import self_check
from ..derive.verdict import Verdict, decide, row_of
from . import advice as advice_mod, context, outcome, tune, wording


def diagnose(m: Measurements) -> Diagnosis:
    """The final report's content (see the module's docstring)."""
    d = judged(m)
    d = dataclasses.replace(d, notes=m.notes + tuple(derived_notes(d)))
    checked = advice_mod.ranked(tuple(_checked(f, m) for f in advice_mod.findings(d)))
    d = dataclasses.replace(d, advice=checked)
    checks = m.verification.trials if m.verification is not None else ()
    found = tune.summarize(m.tune, m.batch_size, context.is_graph(m.loader), checks) if m.tune is not None else None
    return dataclasses.replace(d, summary=summary(d), tune=found)


def to_check(m: Measurements) -> tuple[Finding, ...]:
    """The advice as it stands before its check (turns.Trials measures its settings)."""
    return tuple(advice_mod.findings(judged(m)))


def judged(m: Measurements) -> Diagnosis:
    """The verdict and points of the measurements, before notes and advice (what
    tune.space_of prunes the search from)."""
    points = tuple(sorted(m.points, key=lambda p: drops.POINTS.index(p.point)))
    lo = m.loader or {}
    # a node graph whose stages run in threads of their own is named on the rounds alone
    # (pipeline/integrations/nodes.witnessed: the costs alone model DataLoader's workers)
    alone = witness.alone(m.isolated, lo, m.device) if lo.get("witnessed", True) else None
    v = _verdict(points, m.batch_size, alone)
    return Diagnosis(m, v, tuple(_mark_inconsistent(p, v) for p in points))


def _verdict(points: tuple, batch_size: float, alone: Optional[witness.Alone] = None) -> Verdict:
    # Points already left out as inconsistent (a loaded document) are given back to
    # decide, which leaves them out again: the same verdict either way.
    measured = {p.point: p.throughput for p in points if p.throughput is not None
                and (p.status == "ok" or p.failed_stage == "inconsistent")}
    skipped = {p.point: p.reason or "" for p in points if p.status == "skipped" and p.reason != NOT_SELECTED}
    v = decide(measured, batch_size, skipped, alone=alone)
    full = next((p for p in points if p.point == "full"), None)
    if v.bottleneck is None and full is not None and full.status not in ("ok", "skipped"):
        v = dataclasses.replace(v, reason=f"the full pipeline was not measured ({full.status}: {full.reason})")
    return v


def _mark_inconsistent(p: PointResult, v: Verdict) -> PointResult:
    inc = next((i for i in v.inconsistent if i.slower == p.point), None)
    if inc is None:
        return p
    return dataclasses.replace(p, status="failed", failed_stage="inconsistent",
                               reason=f"inconsistent: {inc.describe()}, beyond the noise; left out")


def _checked(f: Finding, m: Measurements) -> Finding:
    """An advice item with what its check measured (outcome.verified), when the run has a
    verification block (a document without one is left as it was written)."""
    if m.verification is None and f.kind != "allocator":
        return f
    v = outcome.verified(f, m.verification, m.isolated, m.batch_size)
    if v is None:
        return f
    return wording.checked(f, v)


def derived_notes(d: Diagnosis) -> list:
    """What the numbers call for, each note one line with its next step (Note): points
    left out, noisy, cut short, unsteady or paused, a cache smaller than asked, more
    workers than cores, an allocator not held still, and any rule of the report's own
    that the numbers break."""
    out = []
    v = d.verdict
    for inc in v.inconsistent:
        slower = 1 - inc.slower_samples_per_sec / inc.faster_samples_per_sec if inc.faster_samples_per_sec else 0.0
        out.append(Note("inconsistent", f"{inc.slower} ran {slower * 100:.0f}% slower than {inc.faster}: close other "
                                        "programs and rerun.", inc.slower, True,
                        "the step did not cost the same at both points (the process, not the pipeline: another "
                        f"program, memory, frequency); the ceiling is {v.ceiling}, the fastest consistent point"))
    for p in d.points:
        out.extend(points_note(kind, [p]) for kind in point_kinds(p))
    if d.cache.limited_by:
        out.append(cache_note(d.cache))
    workers, cores = d.loader.get("num_workers") or 0, d.run.cpu_count
    threads = context.is_graph(d.loader) and d.loader.get("method") == "thread"  # (threads that wait share cores)
    if cores and workers > cores and not threads:
        out.append(Note("workers", f"num_workers={workers} is more than this machine's {cores} cores: use {cores} or "
                                   "fewer.", derived=True, detail="the workers compete for CPU"))
    held = d.run.allocator
    if held is not None and not held.controlled and str(d.device).startswith("cpu"):
        off = str(held.reason or "").startswith("turned off")
        out.append(Note("allocator", "The memory allocator was not held still (turned off): drop --no-hold-allocator."
                        if off else "The memory allocator could not be held still: read small drops with care.",
                        derived=True, detail=f"{held.reason}: the step's own cost may differ from point to point, "
                                             "and the drops with it"))
    shown = {p: d.batch_size / t for p, t in v.fitted.items()}
    loader_pins = bool(d.loader.get("pin_memory")) and not str(d.device).startswith("cpu")
    out.extend(Note("rules", w, derived=True)
               for w in self_check(shown, v, d.loader.get("num_workers"), pinned_transfer=loader_pins))
    return out


# What the caches hold at once, per part (cache.HELD_PARTS), as the cache note names them.
_HELD = (("collated", "collated"), ("samples", "as samples"), ("raw_inputs", "of the transforms' inputs"),
         ("point_copy", "for the copy the host or device point makes while it is measured"))
# What raises what limits the caches.
_RAISE = {"memory budget": "--cache-mb", "time": "--max-seconds"}


def cache_note(c: CacheInfo) -> Note:
    """The caches hold fewer batches than asked: how many, what limited them and what to
    raise; beneath, for the memory budget, its arithmetic: what one batch holds in every
    part at once, and the budget it fills."""
    n = c.batches or 0
    what = "the memory budget" if c.limited_by == "memory budget" else c.limited_by
    line = (f"The caches hold {n} batch{'es' if n != 1 else ''}, limited by {what}: raise "
            f"{_RAISE.get(c.limited_by, '--cache-mb or --max-seconds')}.")
    detail = "cached points cycle over fewer distinct batches"
    held = c.held or {}
    if c.limited_by == "memory budget" and held and n and c.budget_bytes:
        parts = " + ".join(f"{_mb(held[k] / n)} {label}" for k, label in _HELD if k in held)
        total = sum(held.values())
        detail = (f"--cache-mb counts everything cached at once: per batch {parts} = {_mb(total / n)}; {n} batch(es) "
                  f"hold {_mb(total)} of {_mb(c.budget_bytes)}, and one more would not fit; {detail}")
    return Note("cache", line, derived=True, detail=detail)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MB"


# The notes about a point that the report groups, one line for all the points of a kind
# (report/summary.warnings), in this order.
POINT_KINDS = ("noise", "deadline", "unsteady", "paused")


def point_kinds(p: PointResult) -> list:
    """The kinds of note (POINT_KINDS) that a point's numbers call for."""
    out = []
    if p.status == "ok" and p.throughput is not None:
        if p.throughput.rel_iqr > NOISY_REL_IQR:
            out.append("noise")
        if p.stopped_by_deadline:
            out.append("deadline")
        elif not p.steady:
            out.append("unsteady")
    if p.pauses:
        out.append("paused")
    return out


def points_note(kind: str, points: list) -> Note:
    """One line for the points (PointResult) that have a note of `kind` (POINT_KINDS):
    what was seen at them with its figure, then the next step. One point: its own note
    (`point` set); several: the report's grouped line."""
    at = " and ".join(p.point for p in points) if len(points) <= 2 else f"{len(points)} points"
    one = points[0].point if len(points) == 1 else None
    if kind == "noise":
        fig = _span([p.throughput.rel_iqr * 100 for p in points])
        return Note(kind, f"Windows spread \u00b1{fig}% at {at}: close other programs.", one, True,
                    "the machine is busy or the pipeline is bursty; more rounds (--max-seconds) average it out")
    if kind == "deadline":
        n = [p.throughput.n for p in points]
        return Note(kind, f"Cut short by --max-seconds at {at} ({_span(n)} window{_s(max(n))}): raise it.",
                    one, True, "fewer windows, wider noise")
    if kind == "unsteady":
        return Note(kind, f"No steady state at {at}: raise --max-seconds for longer visits.", one, True,
                    "the windows kept changing from one to the next within a visit")
    pauses, seconds = sum(p.pauses for p in points), sum(p.paused_seconds for p in points)
    voided = sum(p.discarded for p in points)
    seen = f"Loop paused {pauses} time{_s(pauses)} at {at} ({seconds:.1f} s"
    line = (f"{seen}, {voided} window{_s(voided)} voided): raise --max-seconds." if voided
            else f"{seen}, in no window): nothing to do.")
    why = (f"the window{_s(voided)} under way when one came {'was' if voided == 1 else 'were'} discarded, so that "
           "no window holds the pause" if voided else f"{'it' if pauses == 1 else 'they'} came between windows")
    return Note(kind, line, one, True, f"epoch ends, evaluations, other loaders: {why}")


def _span(values: list) -> str:
    """'15', or '11-15' for values that differ once rounded."""
    lo, hi = f"{min(values):.0f}", f"{max(values):.0f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def summary(d: Diagnosis) -> str:
    """The verdict in one sentence or two, on one line (--quiet prints it; the report's
    summary opens with it): the stage, what it costs of every batch and what input holds
    back of the ceiling's throughput, or why no stage is named. The reasoning (the
    verdict's reason) is the report's, beneath it."""
    v = d.verdict
    if v.bottleneck is None:
        return f"No verdict: {v.reason}."
    t_full = v.fitted.get("full")
    if v.bottleneck == "none":
        if v.witness == "isolated costs":
            return ("The input pipeline keeps up, by the stages' costs alone: the training step itself is the "
                    "limit.")
        bound = (f" (it loses at most {v.gap_upper / t_full * 100:.0f}% to input)"
                 if v.gap_upper is not None and t_full and math.isfinite(v.gap_upper) else "")
        return (f"The input pipeline keeps up: the full pipeline runs at the ceiling within noise{bound}, so the "
                "training step itself is the limit.")
    lost = _lost(d)
    if v.bottleneck == "inconclusive":
        return (f"Inconclusive: whether input holds the step back is not known yet{' (' + lost + ')' if lost else ''}"
                ".")
    if v.within:
        return _within_summary(d)
    if v.bottleneck == "tie":
        return _tie_summary(d)
    s = d.stage(v.bottleneck)
    full_rate = d.rate("full")
    gain = (s.samples_per_sec_if_free / full_rate - 1) if full_rate else None
    parts = f" (with {', '.join(s.includes[1:])})" if len(s.includes) > 1 else ""
    alone = ", named on the stages' costs alone" if v.witness == "isolated costs" else ""
    of = f" of every {t_full * 1e3:.1f}-ms batch" if t_full else " per batch"
    by = (v.predicted or {}).get(v.bottleneck)
    if v.witness == "isolated costs" and not s.significant and by is not None:
        # the rounds cannot tell yet (verdict._bound_alone): the figure is the costs
        # alone's, and what the loop would gain without the stage is not measured
        return (f"Bottleneck: {v.bottleneck}{parts}{alone}: by them it costs the loop {by[0] * 1e3:.1f} ms{of}, "
                f"where the rounds read {s.sec_per_batch * 1e3:.1f} ms, within their noise; what the loop would gain "
                "without it is not measured yet.")
    return (f"Bottleneck: {v.bottleneck}{parts}{alone}. It costs {s.sec_per_batch * 1e3:.1f} ms{of}"
            + (f": {lost}" if lost else "") + f"; without it, {s.samples_per_sec_if_free:,.0f} samples/s instead "
            f"of {full_rate:,.0f} ({gain * 100:+.0f}%).")


def _lost(d: Diagnosis) -> str:
    """'64% of the ceiling's throughput is lost to input (highly input-bound)'; '' where
    the verdict has no such figure."""
    f, cls = d.verdict.input_bound_fraction, context.input_bound_class(d)
    if f is None:
        return ""
    how = f" ({cls} input-bound)" if cls in ("moderately", "highly") else ""
    if d.verdict.bottleneck == "inconclusive":
        return f"it loses {f * 100:.0f}% of the ceiling's throughput to input, within the noise"
    return f"{f * 100:.0f}% of the ceiling's throughput is lost to input{how}"


def _within_summary(d: Diagnosis) -> str:
    """A stage named within a row the rounds read whole, by the costs alone
    (verdict._within): its cost alone as the loop pays it, the row's reading beside it."""
    v = d.verdict
    row = row_of(v, v.bottleneck)
    t_full = v.fitted.get("full")
    of = f" of every {t_full * 1e3:.1f}-ms batch" if t_full else " per batch"
    noise = "" if row.significant else ", within their noise"
    return (f"Bottleneck: {v.bottleneck}, named on the stages' costs alone: by them it costs the loop "
            f"{v.within[v.bottleneck][0] * 1e3:.1f} ms{of}, where the rounds read {row.sec_per_batch * 1e3:.1f} ms "
            f"for {', '.join(row.includes[:-1])} and {row.includes[-1]} together{noise}; what the loop would gain "
            "without it is not measured yet.")


def _tie_summary(d: Diagnosis) -> str:
    """A tie in one sentence: the stages, what each costs of a batch, and what input
    holds back (what each would buy if free is the stage table's)."""
    v = d.verdict
    tied = [d.stage(s) for s in v.tied]
    names = ", ".join(s.stage for s in tied[:-1]) + " and " + tied[-1].stage
    costs = " and ".join(f"{s.sec_per_batch * 1e3:.1f}" for s in tied)
    t_full = v.fitted.get("full")
    of = f" of every {t_full * 1e3:.1f}-ms batch" if t_full else " per batch"
    how = "; the loop and their costs alone disagree on which costs more" if v.witness == "disagree" else ""
    lost = _lost(d)
    return f"Bottleneck: {names}, tied: {costs} ms{of}{how}." + (f" {lost[:1].upper()}{lost[1:]}." if lost else "")
