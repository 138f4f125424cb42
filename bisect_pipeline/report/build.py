"""Build a Report once from the raw measurements, and its JSON document both ways.

Everything a report says beyond the measured windows is derived here, once: the verdict
(verdict.decide), the points left out as inconsistent, the warnings the numbers call for,
the report's check of its own rules (verdict.self_check), the advice and the summary.
A document loaded with `from_dict` is built the same way from its windows (stored at the
precision they are kept at, stats.WINDOW_DECIMALS), so it serializes back to the
same document: one source of truth, the measurements.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

from .. import advice as advice_mod, outcome
from ..stats import NOISY_REL_IQR, Throughput, Window
from ..verdict import POINTS, StageCost, Verdict, decide, self_check
from .model import NOT_SELECTED, SCHEMA_VERSION, PointResult, Report, finite, gain_if_free, ms
from .text import summary


def build(points: Iterable[PointResult], batch_size: int, device: str, *, loader: Optional[dict] = None,
          cache: Optional[dict] = None, warnings: Iterable[str] = (), run: Optional[dict] = None,
          complete: bool = True, interrupted: bool = False, isolated: Optional[dict] = None,
          syncs: Optional[dict] = None, batch_size_source: str = "", verification: Optional[dict] = None) -> Report:
    """The report of a run: `points` in any order (each point once), `warnings` those seen
    while measuring; the rest is derived."""
    points = tuple(sorted(points, key=lambda p: POINTS.index(p.point)))
    verdict = _verdict(points, batch_size)
    points = tuple(_mark_inconsistent(p, verdict) for p in points)
    r = Report(device=device, batch_size=batch_size, points=points, verdict=verdict, loader=loader or {},
               cache=cache or {}, warnings=(), run=run or {}, complete=complete, interrupted=interrupted,
               isolated=isolated or {}, syncs=syncs or {}, batch_size_source=batch_size_source,
               verification=verification or {})
    r = dataclasses.replace(r, warnings=tuple(warnings) + tuple(derived_warnings(r)))
    return dataclasses.replace(r, advice=tuple(_checked(a, r) for a in advice_mod.advise(r)), summary=summary(r))


def _checked(item: dict, r: Report) -> dict:
    """An advice item with what its verification measured (outcome.verified), when the
    run has a verification block (a document without one is left as it was written)."""
    if not r.verification and item["kind"] != "allocator":
        return item
    v = outcome.verified(item, r.verification, r.isolated, r.batch_size)
    if v is None:
        return item
    return dict(item, message=item["message"] + outcome.sentence(v), verified=v)


def _verdict(points: tuple, batch_size: int) -> Verdict:
    # Points already left out as inconsistent (a loaded document) are given back to
    # decide, which leaves them out again: the same verdict either way.
    measured = {p.point: p.throughput for p in points if p.throughput is not None
                and (p.status == "ok" or p.failed_stage == "inconsistent")}
    skipped = {p.point: p.reason or "" for p in points if p.status == "skipped" and p.reason != NOT_SELECTED}
    v = decide(measured, batch_size, skipped)
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


def derived_warnings(r: Report) -> list:
    """What the numbers call for: points left out, noisy or cut short, a cache smaller
    than asked, more workers than cores, an allocator not held still, and any rule of
    the report's own that the numbers break."""
    out = []
    v = r.verdict
    for inc in v.inconsistent:
        out.append(f"{inc.describe()}, beyond the noise: the step did not cost the same at both (the process, not "
                   f"the pipeline: another program, memory, frequency). {inc.slower} is left out and the ceiling is "
                   f"{v.ceiling}, the fastest consistent point.")
    for p in r.points:
        if p.status != "ok" or p.throughput is None:
            continue
        if p.throughput.rel_iqr > NOISY_REL_IQR:
            out.append(f"{p.point}: windows disagree by {p.throughput.rel_iqr * 100:.0f}% (IQR/median); the machine "
                       "is busy or the pipeline is bursty. Close other work or raise --max-seconds for more rounds.")
        if p.stopped_by_deadline:
            out.append(f"{p.point}: cut short by --max-seconds after {p.throughput.n} window(s); raise it for firmer "
                       "numbers.")
        elif not p.steady:
            out.append(f"{p.point}: its windows kept changing from one to the next in a visit: it never reached a "
                       "steady state.")
    if r.cache.get("limited_by"):
        out.append(f"the caches hold {r.cache.get('batches')} batch(es), limited by {r.cache['limited_by']}; "
                   "cached points cycle over fewer distinct batches (raise --cache-mb or --max-seconds).")
    workers, cores = r.loader.get("num_workers") or 0, r.run.get("cpu_count")
    if cores and workers > cores:
        out.append(f"num_workers={workers} is more than this machine's {cores} cores: workers compete for CPU.")
    held = r.run.get("allocator") or {}
    if held and not held.get("controlled") and str(r.device).startswith("cpu"):
        out.append(f"the memory allocator was not held still ({held.get('reason')}): the step's own cost may differ "
                   "from point to point, and the drops with it.")
    shown = {p: r.batch_size / t for p, t in v.fitted.items()}
    loader_pins = bool(r.loader.get("pin_memory")) and not str(r.device).startswith("cpu")
    out.extend(self_check(shown, v, r.loader.get("num_workers"), pinned_transfer=loader_pins))
    return out


# --------------------------------------------------------------------------------------
# The JSON document
# --------------------------------------------------------------------------------------


def to_dict(r: Report) -> dict:
    v = r.verdict
    full = r.rate("full")
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "bisect-pipeline",
        "complete": r.complete,
        "interrupted": r.interrupted,
        "device": r.device,
        "batch_size": r.batch_size,
        "batch_size_source": r.batch_size_source,
        "bottleneck": v.bottleneck,
        "verdict": {
            "bottleneck": v.bottleneck,
            "summary": r.summary,
            "reason": v.reason,
            "gap_ms_per_batch": ms(v.gap_sec_per_batch),
            "input_bound_fraction": finite(v.input_bound_fraction, 4),
            "input_bound_class": advice_mod.input_bound_class(r),
            "input_bound_thresholds": {"moderately": advice_mod.INPUT_BOUND_MODERATE,
                                       "highly": advice_mod.INPUT_BOUND_HIGH},
            "full_samples_per_sec": finite(full, 1),
            "ceiling": v.ceiling,
            "gap_noise_ms": ms(v.gap_sigma),
            "inconsistent": [dataclasses.asdict(i) for i in v.inconsistent],
        },
        "points": [point_dict(p, v.fitted.get(p.point)) for p in r.points],
        "stages": [stage_dict(s, full) for s in v.stages],
        "advice": [dict(a) for a in r.advice],
        "loader": r.loader,
        "cache": r.cache,
        "warnings": list(r.warnings),
        "run": r.run,
        "isolated": r.isolated,
        "syncs": r.syncs,
        "verification": r.verification,
    }


def point_dict(p: PointResult, fitted_sec_per_batch: Optional[float] = None) -> dict:
    """`fitted_sec_per_batch`: the time the verdict uses (verdict.Verdict.fitted), which
    the document shows as the point's throughput; the median of the windows stays beside
    it as `measured_samples_per_sec`."""
    tp = p.throughput
    shown = (fitted_sec_per_batch or tp.sec_per_batch) if tp is not None and p.status == "ok" else None
    return {
        "point": p.point,
        "status": p.status,
        "samples_per_sec": finite(tp.batch_size / shown, 1) if shown else None,
        "reason": p.reason,
        "ms_per_batch": ms(shown),
        "measured_samples_per_sec": finite(tp.samples_per_sec, 1) if tp else None,
        "iqr_samples_per_sec": finite(tp.iqr, 1) if tp else None,
        "rel_spread": finite(tp.rel_iqr, 4) if tp else None,
        "windows": [{"steps": w.steps, "seconds": w.seconds} for w in tp.windows] if tp else [],
        "time_to_first_batch_s": finite(p.first_batch_seconds, 4),
        "warmup_steps": p.warmup_steps,
        "stopped_by_deadline": p.stopped_by_deadline,
        "failed_stage": p.failed_stage,
        "visits": p.visits,
        "steady": p.steady,
    }


def stage_dict(s: StageCost, full: Optional[float] = None) -> dict:
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
    }


def from_dict(doc: dict) -> Report:
    """Rebuild a report from its JSON document (for `compare`): the points and their
    windows, the loader, cache, run and isolated measurements are read; everything
    derived from them is derived again, exactly as when the run ended."""
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"unsupported schema_version {doc.get('schema_version')!r} (this tool reads {SCHEMA_VERSION})")
    bs = doc["batch_size"]
    points = []
    for p in doc["points"]:
        wins = tuple(Window(int(w["steps"]), float(w["seconds"])) for w in p.get("windows", []))
        points.append(PointResult(
            point=p["point"], status=p["status"], throughput=Throughput(wins, bs) if wins else None,
            reason=p.get("reason"), first_batch_seconds=p.get("time_to_first_batch_s"),
            warmup_steps=p.get("warmup_steps", 0), stopped_by_deadline=p.get("stopped_by_deadline", False),
            failed_stage=p.get("failed_stage"), visits=p.get("visits", 1), steady=p.get("steady", True)))
    common = dict(loader=doc.get("loader", {}), cache=doc.get("cache", {}), run=doc.get("run", {}),
                  batch_size_source=doc.get("batch_size_source", ""),
                  complete=doc.get("complete", True), interrupted=doc.get("interrupted", False),
                  isolated=doc.get("isolated", {}), syncs=doc.get("syncs", {}),
                  verification=doc.get("verification", {}))
    derived = list(build(points, bs, doc["device"], **common).warnings)
    loaded = list(doc.get("warnings", ()))
    if derived and loaded[-len(derived):] == derived:
        raw = loaded[:-len(derived)]
    else:  # written by another version: keep what this one would not derive
        raw = list(loaded)
        for w in derived:
            if w in raw:
                raw.remove(w)
    return build(points, bs, doc["device"], warnings=raw, **common)

