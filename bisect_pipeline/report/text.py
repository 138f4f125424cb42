"""The report for a terminal: fits 80 columns, one time unit per table, the verdict and the
advice last (a pure function of the Report)."""

from __future__ import annotations

import math
import textwrap
from typing import Optional

from .. import advice as advice_mod
from ..verdict import POINTS
from .model import Report, gain_if_free


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
    full_rate = r.rate("full")
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
    if r.batch_size_source and r.batch_size_source != "DataLoader.batch_size":
        head += f" ({r.batch_size_source.split(' (')[0]})"
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
        rate = r.rate(name) if tp else None
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
    full = r.rate("full")
    for s in r.verdict.stages:
        if s.status == "ok":
            gain = gain_if_free(s, full)
            notes = []
            if not s.significant:
                notes.append("within noise" + noise_text(s.sigma))
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
    lines.extend(_wrap(r.summary))
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


def noise_text(sigma: Optional[float], unit: str = "") -> str:
    """' (±0.76)' for a stage's noise; ' (noise unknown: too few windows)' without one."""
    if sigma is None:
        return ""
    return f" (±{sigma * 1e3:.2f}{unit})" if math.isfinite(sigma) else " (noise unknown: too few windows)"


def _pooled_note(r: Report, name: str, rate: Optional[float]) -> str:
    """When the shown rate is not the point's own median (verdict.decide pooled it with
    a neighbour that measured faster within the noise), say so and give the median."""
    tp = r.throughput(name)
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
