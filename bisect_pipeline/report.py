"""The result of a run and its renderings: text, JSON, HTML (pure functions of it)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import tempfile
import textwrap
from typing import Any, Optional


from . import advice as advice_mod
from .stats import Throughput, Window
from .verdict import POINTS, Inconsistency, StageCost, Verdict

# Version history of the JSON document:
#   1 - first release: schema_version, device, batch_size, bottleneck, points, stages,
#       verdict, loader, cache, advice, warnings, run, complete, interrupted.
SCHEMA_VERSION = 1

STATUSES = ("ok", "skipped", "unavailable", "failed", "not run")

_POINT_MEANING = {
    "device": "batches cached on the device: step only (the ceiling)",
    "host": "batches cached on the host: transfer + step",
    "collated": "collated batches cached: handoff + transfer + step",
    "augmented": "dataset outputs cached: collate + handoff + transfer + step",
    "raw": "loaded samples cached: augment + collate + handoff + transfer + step",
    "full": "your pipeline as it is",
}


@dataclasses.dataclass(frozen=True)
class PointResult:
    point: str
    status: str
    throughput: Optional[Throughput] = None
    reason: Optional[str] = None
    first_batch_seconds: Optional[float] = None
    warmup_steps: int = 0
    stopped_by_deadline: bool = False
    failed_stage: Optional[str] = None  # for a failed point: the stage whose code raised
    visits: int = 1  # how many times the point was visited (api: rounds); its windows are pooled
    steady: bool = True  # every visit reached two consecutive windows that agree

    def to_dict(self, fitted_sec_per_batch: Optional[float] = None) -> dict:
        """`fitted_sec_per_batch`: the time the verdict uses (verdict.Verdict.fitted),
        which the document shows as the point's throughput; the median of the windows
        stays beside it as `measured_samples_per_sec`."""
        tp = self.throughput
        shown = None
        if tp and self.status == "ok":
            shown = fitted_sec_per_batch or tp.sec_per_batch
        return {
            "point": self.point,
            "status": self.status,
            "samples_per_sec": _r(tp.batch_size / shown, 1) if shown else None,
            "reason": self.reason,
            "ms_per_batch": _r(shown * 1e3, 3) if shown else None,
            "measured_samples_per_sec": _r(tp.samples_per_sec, 1) if tp else None,
            "iqr_samples_per_sec": _r(tp.iqr, 1) if tp else None,
            "rel_spread": _r(tp.rel_iqr, 4) if tp else None,
            "windows": [{"steps": w.steps, "seconds": _r(w.seconds, 6)} for w in tp.windows] if tp else [],
            "time_to_first_batch_s": _r(self.first_batch_seconds, 4),
            "warmup_steps": self.warmup_steps,
            "stopped_by_deadline": self.stopped_by_deadline,
            "failed_stage": self.failed_stage,
            "visits": self.visits,
            "steady": self.steady,
        }


@dataclasses.dataclass(frozen=True)
class Report:
    """What `bisect()` returns. `bottleneck` is the verdict; `str()` the text table;
    `to_dict()` the JSON document; in a notebook it renders as HTML."""

    device: str
    batch_size: int
    points: tuple[PointResult, ...]
    verdict: Verdict
    loader: dict = dataclasses.field(default_factory=dict)
    cache: dict = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    run: dict = dataclasses.field(default_factory=dict)
    complete: bool = True
    interrupted: bool = False
    # Stage costs measured in isolation in this process (see isolate.py), and the
    # host-device syncs counted in the step: filled by api.bisect when measured.
    isolated: dict = dataclasses.field(default_factory=dict)
    syncs: dict = dataclasses.field(default_factory=dict)
    # The JSON document a report was loaded from (from_dict): to_dict gives it back as it
    # was, rather than re-deriving its rounded figures from rounded inputs.
    source: Optional[dict] = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def bottleneck(self) -> Optional[str]:
        return self.verdict.bottleneck

    def point(self, name: str) -> PointResult:
        for p in self.points:
            if p.point == name:
                return p
        raise KeyError(name)

    def stage(self, name: str) -> StageCost:
        for s in self.verdict.stages:
            if s.stage == name:
                return s
        raise KeyError(name)

    @property
    def advice(self) -> list:
        return advice_mod.advise(self)

    @property
    def summary(self) -> str:
        return summary(self)

    def to_dict(self) -> dict:
        return to_dict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save_json(self, path: str) -> None:
        write_atomic(path, self.to_json() + "\n")

    def __str__(self) -> str:
        return to_text(self)

    def _repr_html_(self) -> str:
        return to_html(self)

    def plot(self, ax: Any = None) -> Any:
        """A matplotlib figure of samples/s per point, the bottleneck's drop highlighted
        (drawn into `ax` when given). Needs the optional extra: pip install bisect-pipeline[plot]."""
        from .plot import plot

        return plot(self, ax=ax)

    @classmethod
    def from_dict(cls, doc: dict) -> "Report":
        return from_dict(doc)


def _r(x: Optional[float], nd: int) -> Optional[float]:
    """Rounded for the document; None where there is no finite value (JSON has no inf)."""
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def _ms(x: Optional[float]) -> Optional[float]:
    return _r(None if x is None else x * 1e3, 3)


def _gain_if_free(s: StageCost, full: Optional[float]) -> Optional[float]:
    """Relative throughput gain if the stage were free: if_free / full - 1 (0.33 = +33%);
    `full` is the full pipeline's samples/s as the report shows it."""
    if s.samples_per_sec_if_free is None or not full or full <= 0:
        return None
    return s.samples_per_sec_if_free / full - 1


def stage_dict(s: StageCost, full: Optional[float] = None) -> dict:
    return {
        "stage": s.stage,
        "status": s.status,
        "ms_per_batch": _ms(s.sec_per_batch),
        "share_of_gap": _r(s.share_of_gap, 4),
        "samples_per_sec_if_free": _r(s.samples_per_sec_if_free, 1),
        "gain_if_free": _r(gain, 4) if (gain := _gain_if_free(s, full)) is not None else None,
        "significant": s.significant,
        "noise_ms": _ms(s.sigma),
        "between": [s.lower, s.upper] if s.lower else None,
        "includes": list(s.includes),
        "reason": s.reason,
    }


def to_dict(r: Report) -> dict:
    if r.source is not None:
        return copy.deepcopy(r.source)
    v = r.verdict
    full = shown_rate(r, "full")
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "bisect-pipeline",
        "complete": r.complete,
        "interrupted": r.interrupted,
        "device": r.device,
        "batch_size": r.batch_size,
        "bottleneck": v.bottleneck,
        "verdict": {
            "bottleneck": v.bottleneck,
            "summary": summary(r),
            "reason": v.reason,
            "gap_ms_per_batch": _ms(v.gap_sec_per_batch),
            "input_bound_fraction": _r(v.input_bound_fraction, 4),
            "input_bound_class": advice_mod.input_bound_class(r),
            "input_bound_thresholds": {"moderately": advice_mod.INPUT_BOUND_MODERATE,
                                       "highly": advice_mod.INPUT_BOUND_HIGH},
            "full_samples_per_sec": _r(full, 1),
            "ceiling": v.ceiling,
            "gap_noise_ms": _ms(v.gap_sigma),
            "inconsistent": [dataclasses.asdict(i) for i in v.inconsistent],
        },
        "points": [p.to_dict(v.fitted.get(p.point)) for p in r.points],
        "stages": [stage_dict(s, full) for s in v.stages],
        "advice": [dict(a) for a in r.advice],
        "loader": r.loader,
        "cache": r.cache,
        "warnings": list(r.warnings),
        "run": r.run,
        "isolated": r.isolated,
        "syncs": r.syncs,
    }


def from_dict(doc: dict) -> Report:
    """Rebuild a report from its JSON document (for `compare`, and to check round-trips)."""
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"unsupported schema_version {doc.get('schema_version')!r} (this tool reads {SCHEMA_VERSION})")
    bs = int(doc["batch_size"])
    points = []
    for p in doc["points"]:
        wins = tuple(Window(int(w["steps"]), float(w["seconds"])) for w in p.get("windows", []))
        points.append(PointResult(
            point=p["point"], status=p["status"], throughput=Throughput(wins, bs) if wins else None,
            reason=p.get("reason"), first_batch_seconds=p.get("time_to_first_batch_s"),
            warmup_steps=p.get("warmup_steps", 0), stopped_by_deadline=p.get("stopped_by_deadline", False),
            failed_stage=p.get("failed_stage"), visits=p.get("visits", 1), steady=p.get("steady", True)))
    stages = []
    for s in doc["stages"]:
        between = s.get("between") or [None, None]
        stages.append(StageCost(
            stage=s["stage"], status=s["status"], lower=between[0], upper=between[1],
            sec_per_batch=None if s.get("ms_per_batch") is None else s["ms_per_batch"] / 1e3,
            sigma=None if s.get("noise_ms") is None else s["noise_ms"] / 1e3,
            share_of_gap=s.get("share_of_gap"), samples_per_sec_if_free=s.get("samples_per_sec_if_free"),
            significant=bool(s.get("significant")), includes=tuple(s.get("includes", ())), reason=s.get("reason")))
    v = doc["verdict"]
    fitted = {p["point"]: p["ms_per_batch"] / 1e3 for p in doc["points"]
              if p.get("status") == "ok" and p.get("ms_per_batch")}
    verdict = Verdict(
        bottleneck=doc["bottleneck"], stages=tuple(stages),
        gap_sec_per_batch=None if v.get("gap_ms_per_batch") is None else v["gap_ms_per_batch"] / 1e3,
        input_bound_fraction=v.get("input_bound_fraction"), reason=v.get("reason", ""), ceiling=v.get("ceiling"),
        fitted=fitted, inconsistent=tuple(Inconsistency(**i) for i in v.get("inconsistent", ())),
        gap_sigma=None if v.get("gap_noise_ms") is None else v["gap_noise_ms"] / 1e3)
    return Report(device=doc["device"], batch_size=bs, points=tuple(points), verdict=verdict,
                  loader=doc.get("loader", {}), cache=doc.get("cache", {}), warnings=tuple(doc.get("warnings", ())),
                  run=doc.get("run", {}), complete=doc.get("complete", True), interrupted=doc.get("interrupted", False),
                  isolated=doc.get("isolated", {}), syncs=doc.get("syncs", {}), source=copy.deepcopy(doc))


def write_atomic(path: str, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: never half a document."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------


def _tp(r: Report, name: str) -> Optional[Throughput]:
    for p in r.points:
        if p.point == name and p.status == "ok":
            return p.throughput
    return None


def shown_rate(r: Report, name: str) -> Optional[float]:
    """The samples/s the report shows for a point: the verdict's fitted estimate (see
    verdict.decide), else the median of its windows; None when not measured."""
    t = r.verdict.fitted.get(name)
    if t:
        return r.batch_size / t
    tp = _tp(r, name)
    return tp.samples_per_sec if tp else None


def _fmt_rate(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.1f}"


def summary(r: Report) -> str:
    """The verdict in one sentence."""
    v = r.verdict
    if v.bottleneck is None:
        return f"No verdict: {v.reason}."
    if v.bottleneck == "none":
        return ("The input pipeline keeps up: the full pipeline runs at the ceiling within noise, "
                "so the training step itself is the limit.")
    if v.bottleneck == "inconclusive":
        return f"Inconclusive: {v.reason}."
    s = r.stage(v.bottleneck)
    full_rate = shown_rate(r, "full")
    gain = (s.samples_per_sec_if_free / full_rate - 1) if full_rate else None
    parts = f" (with {', '.join(s.includes[1:])})" if len(s.includes) > 1 else ""
    return (f"Bottleneck: {v.bottleneck}{parts}. It adds {s.sec_per_batch * 1e3:.1f} ms per batch "
            f"({(s.share_of_gap or 0) * 100:.0f}% of the gap to the ceiling); without it you would train at "
            f"{s.samples_per_sec_if_free:,.0f} samples/s instead of {full_rate:,.0f} (+{gain * 100:.0f}%).")


WIDTH = 80  # the text report fits a classic terminal: prose is wrapped, tables' last column too

# What runs at each point, as the text table says it (narrow: the row above plus one stage).
_POINT_SHORT = {
    "device": "step only (the ceiling)",
    "host": "+ transfer",
    "collated": "+ handoff",
    "augmented": "+ collate",
    "raw": "+ augment",
    "full": "+ load (your pipeline)",
}


def _wrap(text: str, first: str = "", rest: str = "") -> list:
    """`text` as lines of at most WIDTH columns, `first` before the first, `rest` before the others."""
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [first]


def _table(title: str, headers: list, rows: list, align: str) -> list:
    """A plain table under its title: columns two spaces apart, `align` one of "l"/"r" per
    column (numbers right-aligned with the same decimals per column, so they line up),
    the last (text) column wrapped so that each line fits WIDTH."""
    cols = len(headers) - 1
    widths = [max([len(headers[i])] + [len(row[i]) for row in rows]) for i in range(cols)]
    room = max(16, WIDTH - sum(widths) - 2 * cols)
    widths.append(min(room, max([len(headers[-1])] + [len(row[-1]) for row in rows])))

    def line(cells: list) -> str:
        out = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)]
        return "  ".join(out).rstrip()

    out = [title, line(headers), line(["-" * w for w in widths])]
    for row in rows:
        wrapped = textwrap.wrap(row[-1], widths[-1], break_on_hyphens=False) or [""]
        out.append(line(row[:-1] + [wrapped[0]]))
        out.extend(line([""] * cols + [more]) for more in wrapped[1:])
    return out


def to_text(r: Report) -> str:
    """The report for a terminal: header, the two tables (times in ms), warnings, then the
    verdict and the advice last, where they stay on screen; wrapped at WIDTH columns."""
    lines = []
    head = f"bisect-pipeline: device {r.device}, batch size {r.batch_size}"
    lw = r.loader.get("num_workers")
    if lw is not None:
        head += f", num_workers {lw}, pin_memory {r.loader.get('pin_memory')}"
    lines.extend(_wrap(head, rest="  "))
    if not r.complete:
        lines.append("(incomplete run: " + ("interrupted" if r.interrupted else "stopped by --max-seconds") + ")")
    rows = []
    for name in reversed(POINTS):
        p = next((p for p in r.points if p.point == name), None)
        if p is None:
            continue
        tp = p.throughput if p.status == "ok" else None
        rate = shown_rate(r, name) if tp else None
        if p.status == "ok":
            note = _POINT_SHORT[name] + _pooled_note(r, name, rate)
        else:
            note = f"{p.status}: {p.reason}" if p.reason else p.status
        rows.append([
            name,
            _fmt_rate(rate),
            f"±{tp.rel_iqr * 100:.1f}%" if tp else "-",
            f"{r.batch_size / rate * 1e3:.2f}" if rate else "-",
            "-" if p.first_batch_seconds is None else f"{p.first_batch_seconds * 1e3:.0f}",
            note,
        ])
    lines.append("")
    lines.extend(_table("Throughput at each point, the ceiling first (times in ms)",
                        ["point", "samples/s", "spread", "per batch", "first batch", "what runs / why not"], rows,
                        "lrrrrl"))
    srows = []
    full = shown_rate(r, "full")
    for s in r.verdict.stages:
        if s.status == "ok":
            gain = _gain_if_free(s, full)
            notes = []
            if not s.significant:
                notes.append("within noise" + _noise_text(s.sigma))
            if len(s.includes) > 1:
                notes.append("includes " + ", ".join(s.includes))
            srows.append([s.stage, f"{s.sec_per_batch * 1e3:.2f}",
                          "-" if s.share_of_gap is None else f"{s.share_of_gap * 100:.0f}%",
                          _fmt_rate(s.samples_per_sec_if_free), "-" if gain is None else f"{gain * 100:+.0f}%",
                          "; ".join(notes)])
        else:
            srows.append([s.stage, "-", "-", "-", "-", f"{s.status}: {s.reason}" if s.reason else s.status])
    lines.append("")
    lines.extend(_table("What each stage costs (times in ms per batch)",
                        ["stage", "added", "of gap", "samples/s if free", "gain", "note"], srows,
                        "lrrrrl"))
    extra = _isolated_lines(r)
    if extra or r.warnings:
        lines.append("")
    for line in extra:
        lines.extend(_wrap(line, rest="  "))
    for w in r.warnings:
        lines.extend(_wrap(w, first="warning: ", rest="  "))
    lines.append("")
    lines.extend(_wrap(summary(r)))
    took = _time_to_verdict(r)
    if took:
        lines.extend(_wrap(took))
    cls = advice_mod.input_bound_class(r)
    if cls == "not" and r.verdict.bottleneck == "none":
        # the estimate may be far from 0 on a noisy run; within noise it is not a loss
        lines.extend(_wrap(f"Input-bound: not (the full pipeline's loss to input, "
                           f"{r.verdict.input_bound_fraction * 100:.0f}% of the ceiling's throughput, is within noise)."))
    elif cls is not None and r.verdict.input_bound_fraction is not None:
        lines.extend(_wrap(
            f"Input-bound: {cls} ({r.verdict.input_bound_fraction * 100:.0f}% of the ceiling's throughput is "
            f"lost to input; not < {advice_mod.INPUT_BOUND_MODERATE * 100:.0f}% <= moderately < "
            f"{advice_mod.INPUT_BOUND_HIGH * 100:.0f}% <= highly)."))
    advice = r.advice
    if advice:
        lines.append("")
        lines.append("What to do:")
        for a in advice:
            lines.extend(_wrap(a["message"], first="  - ", rest="    "))
    return "\n".join(lines)


def _noise_text(sigma: Optional[float], unit: str = "") -> str:
    """' (±0.76)' for a stage's noise; ' (noise unknown: too few windows)' without one."""
    if sigma is None:
        return ""
    return f" (±{sigma * 1e3:.2f}{unit})" if math.isfinite(sigma) else " (noise unknown: too few windows)"


def _pooled_note(r: Report, name: str, rate: Optional[float]) -> str:
    """When the shown rate is not the point's own median (verdict.decide pooled it with
    a neighbour that measured faster within the noise), say so and give the median."""
    tp = _tp(r, name)
    if rate is None or tp is None or abs(tp.samples_per_sec - rate) <= 0.005 * rate:
        return ""
    t = r.verdict.fitted.get(name)
    with_ = [p for p, u in r.verdict.fitted.items() if p != name and abs(u - t) <= 1e-12 * t]
    return f"; measured {tp.samples_per_sec:,.1f}, within noise of {', '.join(with_)}"


def _time_to_verdict(r: Report) -> Optional[str]:
    """How long the verdict took and whether it settled (api._measure_rounds)."""
    run = r.run or {}
    if run.get("verdict_s") is None or r.verdict.bottleneck is None:
        return None
    rounds = run.get("rounds", 0)
    how = ("settled" if run.get("settled") else
           "not settled: the time ran out first; raise --max-seconds for a firmer verdict")
    return f"Verdict after {run['verdict_s']:.1f} s of measuring ({rounds} round{'s' if rounds != 1 else ''}; {how})."


def _isolated_lines(r: Report) -> list:
    """One line of isolated costs (isolate.py) and one of the step's syncs, when measured."""
    iso, out = r.isolated or {}, []
    if iso.get("status") == "ok":
        parts = []
        for key, label, unit in (("load", "load", "ms/sample"), ("augment", "augment", "ms/sample"),
                                 ("collate", "collate", "ms/batch"), ("transfer", "transfer", "ms/batch"),
                                 ("step", "step", "ms/batch")):
            d = iso.get(key) or {}
            val = d.get("ms_per_sample", d.get("ms_per_batch"))
            if d.get("status") == "ok" and val is not None:
                extra = f" at {d['gb_per_s']:.1f} GB/s" if d.get("gb_per_s") else ""
                parts.append(f"{label} {val:.2f} {unit}{extra}")
            elif d.get("status"):
                parts.append(f"{label} {d['status']}")
        w = iso.get("workers") or {}
        if w.get("status") == "ok" and w.get("needed"):
            fit = "enough" if w["fits"] else "not enough"
            threads = w.get("step_threads") or 0
            if threads and threads + w["needed"] > w["cores"]:
                fit += f"; the CPU step uses {threads} threads"
            parts.append(f"workers to feed the step: {w['needed']} ({w['cores']} cores: {fit})")
        out.append("Isolated (this process, no workers): " + "; ".join(parts) + ".")
    s = r.syncs or {}
    if s.get("status") == "ok":
        out.append(f"Host-device syncs in the step: {s['per_step']:g} per step (over {s['steps']} steps).")
    elif s.get("status"):
        out.append(f"Host-device syncs in the step: {s['status']} ({s.get('reason', '')}).")
    return out


# --------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------


def to_html(r: Report) -> str:
    """The report as an HTML fragment with inline CSS and SVG (see render_html.py)."""
    from .render_html import to_html as render

    return render(r)
