"""The JSON document of a report, both ways.

`to_dict` writes what was measured (points with their raw windows, loader, cache, run,
isolated timings, syncs, the check's windows, the measured notes) beside what was
derived from it (verdict, stages, advice, warnings, summary). `measurements_of` reads the
measured part back (windows at the precision they are kept at, stats.WINDOW_DECIMALS);
diagnosing it again gives the same document: one source of truth, the measurements.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..advise import context
from ..advise.diagnose import derived_notes, diagnose
from ..core.results import CacheInfo, Isolated, Measurements, Note, PointResult, RunInfo, Syncs, Tuning, Verification
from ..core.stats import Throughput, Window
from ..derive.findings import Diagnosis
from ..derive.drops import StageCost
from ..derive.verdict import alone_drop, row_of
from . import summary as summary_mod
from .figures import finite, gain_if_free, ms


# The document's version: docs/json-schema.md says what each added (new keys may come
# within a version). A document of version 1 is still read: its windows have no round,
# so its noise is the windows', as it was decided. The `tune` section is versioned on
# its own (TUNE_SCHEMA_VERSION).
SCHEMA_VERSION = 2
READS = (1, 2)


def to_dict(r: "Diagnosis") -> dict:
    v = r.verdict
    full = r.rate("full")
    return {
        **_document(r.measurements),
        "bottleneck": v.bottleneck,
        "verdict": {
            "bottleneck": v.bottleneck,
            "summary": r.summary,
            "reason": v.reason,
            "next": summary_mod.next_step(r) or None,
            "gap_ms_per_batch": ms(v.gap_sec_per_batch),
            "input_bound_fraction": finite(v.input_bound_fraction, 4),
            "input_bound_class": context.input_bound_class(r),
            "input_bound_thresholds": {"moderately": context.INPUT_BOUND_MODERATE,
                                       "highly": context.INPUT_BOUND_HIGH},
            "full_samples_per_sec": finite(full, 1),
            "ceiling": v.ceiling,
            "gap_noise_ms": ms(v.gap_sigma),
            "gap_upper_ms": ms(v.gap_upper),
            "gap_rounds": v.gap_rounds,
            "tied": list(v.tied),
            "leads": [{"stage": lead.stage, "over": lead.over, "ms_per_batch": ms(lead.sec_per_batch),
                       "noise_ms": ms(lead.sigma), "threshold_ms": ms(lead.threshold), "real": lead.real,
                       "rounds": lead.rounds, "rounds_to_tell": lead.rounds_to_tell} for lead in v.leads],
            "inconsistent": [dataclasses.asdict(i) for i in v.inconsistent],
            "witness": v.witness,
            "model": v.model,
            "disagree": list(v.disagree),
            "within": row_of(v, v.bottleneck).stage if v.within else None,
        },
        "points": [point_dict(p, v.fitted.get(p.point), r.measured_rate(p.point)) for p in r.points],
        "stages": [stage_dict(s, full, alone_drop(v, s)) for s in v.stages],
        "advice": [f.to_dict() for f in r.advice],
        "warnings": list(r.warnings),
        "notes": [n.to_dict() for n in r.notes],
        "tune": tune_dict(r),
    }


def measured_dict(m: Measurements, error: str) -> dict:
    """What a run measured, in the document's own form, where deriving its report failed
    (errors.AnalysisFailed): no verdict, the error as its reason; everything measurements_of
    reads, so that a fixed version diagnoses it again (Report.from_dict)."""
    return {
        **_document(m),
        "verdict": {"bottleneck": None, "reason": error, "analysis_failed": True},
        "points": [point_dict(p) for p in m.points],
        "warnings": [n.message for n in m.notes],
        "notes": [n.to_dict() for n in m.notes],
        "tune": {"schema_version": TUNE_SCHEMA_VERSION, **m.tune.to_dict()} if m.tune is not None else {},
    }


def _document(m: Measurements) -> dict:
    """The document's keys in their order, with what the measurements alone give; what
    diagnosing them gives (the verdict, the points as fitted, the stages, the advice, the
    notes and warnings, the search's findings) empty, for to_dict or measured_dict to fill
    (a key filled later keeps its place)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "bisect-pipeline",
        "mode": m.mode,
        "complete": m.complete,
        "interrupted": m.interrupted,
        "device": m.device,
        "batch_size": m.batch_size,
        "batch_size_source": m.batch_size_source,
        "bottleneck": None,
        "verdict": {},
        "points": [],
        "stages": [],
        "advice": [],
        "loader": m.loader,
        "source": m.source,
        "cache": m.cache.to_dict() if m.cache.batches is not None else {},
        "warnings": [],
        "notes": [],
        "run": m.run.to_dict(),
        "isolated": m.isolated.to_dict() if m.isolated is not None else {},
        "syncs": m.syncs.to_dict() if m.syncs is not None else {},
        "verification": m.verification.to_dict() if m.verification is not None else {},
        "tune": {},
    }


# Version of the `tune` section (--tune), within the document's own schema_version:
#   1 - the search's record (results.Tuning: the space, the raw windows of each candidate's
#       trial, why it stopped, the patch, the patched script's trial), and what was derived
#       from it: tried (each candidate's outcome), best, at_ceiling, ceiling_speedup,
#       summary, applied_outcome and agrees; compared_with (the figure the patched script is
#       compared with, in words) and whole (false: that figure is the settings' alone, the
#       change holds the device tail too), added within version 1.
TUNE_SCHEMA_VERSION = 1


def tune_dict(r: "Diagnosis") -> dict:
    """The document's `tune` section: {} without --tune."""
    t, f = r.measurements.tune, r.tune
    if t is None or f is None:
        return {}
    b = f.best
    return {"schema_version": TUNE_SCHEMA_VERSION, **t.to_dict(),
            "tried": [{"settings": x.settings, "item": x.item, **x.outcome.to_dict()} for x in f.tried],
            "best": None if b is None else {"settings": b.settings, **b.outcome.to_dict()},
            "at_ceiling": f.at_ceiling, "ceiling_speedup": f.ceiling_speedup, "summary": f.summary,
            "applied_outcome": None if f.applied is None else f.applied.to_dict(), "agrees": f.agrees,
            "compared_with": f.compared, "whole": f.whole}


def point_dict(p: PointResult, fitted_sec_per_batch: Optional[float] = None,
               measured: Optional[float] = None) -> dict:
    """`fitted_sec_per_batch`: the time the verdict uses (verdict.Verdict.fitted), which
    the document shows as the point's throughput; the point's own rate before that fit
    (`measured`: Diagnosis.measured_rate; the median of the windows by default) stays
    beside it as `measured_samples_per_sec`."""
    tp = p.throughput
    shown = (fitted_sec_per_batch or tp.sec_per_batch) if tp is not None and p.status == "ok" else None
    return {
        "point": p.point,
        "status": p.status,
        "samples_per_sec": finite(tp.batch_size / shown, 1) if shown else None,
        "reason": p.reason,
        "ms_per_batch": ms(shown),
        "measured_samples_per_sec": finite(measured or tp.samples_per_sec, 1) if tp else None,
        "iqr_samples_per_sec": finite(tp.iqr, 1) if tp else None,
        "rel_spread": finite(tp.rel_iqr, 4) if tp else None,
        "windows": [_window(w) for w in tp.windows] if tp else [],
        "time_to_first_batch_s": finite(p.first_batch_seconds, 4),
        "warmup_steps": p.warmup_steps,
        "stopped_by_deadline": p.stopped_by_deadline,
        "failed_stage": p.failed_stage,
        "visits": p.visits,
        "steady": p.steady,
        "wait_seconds": p.wait_seconds,
        "input_wait_ms_per_batch": ms(p.wait_per_batch),
        "discarded_windows": p.discarded,
        "pauses": p.pauses,
        "paused_seconds": p.paused_seconds,
        **({"error": p.error} if p.error is not None else {}),
        **({"step_alone": True} if p.step_alone else {}),
    }


def _window(w: Window) -> dict:
    out = {"steps": w.steps, "seconds": w.seconds}
    if w.round is not None:
        out["round"] = w.round
    return out


def stage_dict(s: StageCost, full: Optional[float] = None, alone: Optional[tuple] = None) -> dict:
    return {
        "stage": s.stage,
        "status": s.status,
        "ms_per_batch": ms(s.sec_per_batch),
        "share_of_gap": finite(s.share_of_gap, 4),
        "samples_per_sec_if_free": finite(s.samples_per_sec_if_free, 1),
        "gain_if_free": finite(gain_if_free(s, full), 4),
        "significant": s.significant,
        "noise_ms": ms(s.sigma),
        "between": [s.lower, s.upper] if s.lower else None,
        "includes": list(s.includes),
        "reason": s.reason,
        "rounds": s.rounds,
        "alone_ms_per_batch": ms(alone[0]) if alone else None,
        "alone_se_ms": ms(alone[1]) if alone else None,
    }


def measurements_of(doc: dict) -> Measurements:
    """The measurements a document holds (for `compare`, and Report.from_dict): points
    and windows, loader, cache, run, isolated timings, syncs, the check's windows and the
    notes seen while measuring; everything derived is derived again from them."""
    if doc.get("schema_version") not in READS:
        raise ValueError(f"unsupported schema_version {doc.get('schema_version')!r} (this tool reads "
                         f"{', '.join(map(str, READS))})")
    bs = doc["batch_size"]
    points = tuple(_point_of(p, bs) for p in doc["points"])
    m = Measurements(device=doc["device"], batch_size=bs, points=points,
                     batch_size_source=doc.get("batch_size_source", ""), loader=doc.get("loader", {}),
                     cache=CacheInfo.from_dict(doc.get("cache")) or CacheInfo(),
                     run=RunInfo.from_dict(doc.get("run")) or RunInfo(),
                     isolated=Isolated.from_dict(doc.get("isolated")), syncs=Syncs.from_dict(doc.get("syncs")),
                     verification=Verification.from_dict(doc.get("verification")),
                     tune=Tuning.from_dict(doc.get("tune")), complete=doc.get("complete", True),
                     interrupted=doc.get("interrupted", False),
                     source=doc.get("source"), mode=doc.get("mode", "entry"))
    if "notes" in doc:
        measured = tuple(Note.from_dict(n) for n in doc["notes"] if not n.get("derived"))
    else:  # an older document: its warnings, but those this version derives itself
        derived = {n.message for n in derived_notes(diagnose(m))}
        measured = tuple(Note("measured", w) for w in doc.get("warnings", ()) if w not in derived)
    return dataclasses.replace(m, notes=measured)


def _point_of(p: dict, batch_size: float) -> PointResult:
    wins = tuple(Window(int(w["steps"]), float(w["seconds"]), w.get("round")) for w in p.get("windows", []))
    return PointResult(
        point=p["point"], status=p["status"], throughput=Throughput(wins, batch_size) if wins else None,
        reason=p.get("reason"), first_batch_seconds=p.get("time_to_first_batch_s"),
        warmup_steps=p.get("warmup_steps", 0), stopped_by_deadline=p.get("stopped_by_deadline", False),
        failed_stage=p.get("failed_stage"), visits=p.get("visits", 1), steady=p.get("steady", True),
        wait_seconds=p.get("wait_seconds", 0.0), discarded=p.get("discarded_windows", 0), pauses=p.get("pauses", 0),
        paused_seconds=p.get("paused_seconds", 0.0), error=p.get("error"), step_alone=p.get("step_alone", False))
