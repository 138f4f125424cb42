"""The report as HTML (pure functions of it): `to_html` is the fragment a notebook shows
(`Report._repr_html_`), `to_document` the standalone file `--html` writes.

Inline SVG and inline CSS only: no JavaScript, nothing fetched, so it renders the same
offline and in exported notebooks. Every string that comes from the user's code or the
run (class names, reasons, loader settings, advice) is escaped. The markup is also
well-formed XML, which is how the tests check it strictly.

Why one module: one renderer, section by section in the order the page shows them
(text.py is its sibling).
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any, Optional

from ..advise import tune, wording
from ..derive.findings import Diagnosis
from ..derive.drops import STAGES
from ..derive.verdict import in_question
from . import plot as plot_mod
from . import summary as summary_mod, text as text_mod
from .figures import POINT_MEANING, Footnotes, batch_size_text, ended_parts
from .text import noise_text


CSS = """
.bisect-pipeline{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;font-size:14px;
 line-height:1.45;color:#1f2328;background:#fff;max-width:960px;padding:16px 18px;box-sizing:border-box;text-align:left}
.bisect-pipeline *{box-sizing:border-box}
.bisect-pipeline .title{margin:0 0 8px;font-size:12px;color:#6b7280;letter-spacing:.02em}
.bisect-pipeline h3{font-size:14px;margin:18px 0 6px;color:#1f2328}
.bisect-pipeline .summary{margin:0 0 6px;padding:10px 14px;border-left:5px solid #8a94a6;border-radius:4px;
 background:#f2f4f7}
.bisect-pipeline .summary.named{border-color:#e4572e;background:#fdf0ec}
.bisect-pipeline .summary.none{border-color:#2e9e5b;background:#edf7f0}
.bisect-pipeline .summary.failed{border-color:#b42318;background:#fdecea}
.bisect-pipeline .summary p{margin:0;overflow-wrap:anywhere}
.bisect-pipeline .summary p+p{margin-top:6px}
.bisect-pipeline .summary .verdict{font-size:16px;font-weight:600}
.bisect-pipeline .summary .first{font-size:15px}
.bisect-pipeline ol.advice{margin:4px 0;padding-left:22px}
.bisect-pipeline ol.advice li{margin:6px 0}
.bisect-pipeline ol.advice p.action{margin:0;font-weight:600}
.bisect-pipeline details{margin:2px 0 0;color:#374151}
.bisect-pipeline details summary{cursor:pointer;color:#6b7280;font-size:13px}
.bisect-pipeline details p{margin:4px 0 0}
.bisect-pipeline p.why{margin:4px 0 8px;color:#374151}
.bisect-pipeline p.footnote{margin:4px 0 0;font-size:12px;color:#6b7280;overflow-wrap:anywhere}
.bisect-pipeline .incomplete{margin:6px 0;color:#b42318;font-size:13px}
.bisect-pipeline .chart svg{display:block;width:100%;height:auto;max-width:760px}
.bisect-pipeline .legend{font-size:12px;color:#4b5563;margin:2px 0 0}
.bisect-pipeline .legend span{display:inline-block;margin-right:16px;white-space:nowrap}
.bisect-pipeline .swatch{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:-1px;border-radius:2px}
.bisect-pipeline .wrap{overflow-x:auto;max-width:100%}
.bisect-pipeline table{border-collapse:collapse;font-size:13px;margin:0;border:none}
.bisect-pipeline th,.bisect-pipeline td{padding:4px 10px;border:none;border-bottom:1px solid #e5e7eb;text-align:left;
 vertical-align:top;background:transparent;color:#1f2328}
.bisect-pipeline th{font-weight:600;background:#f6f8fa;white-space:nowrap}
.bisect-pipeline th.num,.bisect-pipeline td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.bisect-pipeline td.text{overflow-wrap:anywhere;min-width:14em}
.bisect-pipeline tr.bottleneck td{background:#fdf0ec;font-weight:600}
.bisect-pipeline .muted{color:#6b7280}
.bisect-pipeline ul{margin:4px 0;padding-left:22px}
.bisect-pipeline li{margin:3px 0;overflow-wrap:anywhere}
.bisect-pipeline ul.warnings li{color:#8a4b00}
.bisect-pipeline dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:3px 14px;margin:0;font-size:13px}
.bisect-pipeline dt{color:#6b7280}
.bisect-pipeline dd{margin:0;overflow-wrap:anywhere}
.bisect-pipeline h4{font-size:13px;margin:12px 0 4px;font-weight:600;color:#1f2328}
.bisect-pipeline table.parts{width:100%;table-layout:fixed}
.bisect-pipeline table.parts col.name{width:14em}
.bisect-pipeline table.parts col.ms{width:9.5em}
.bisect-pipeline table.parts col.share{width:4.5em}
.bisect-pipeline table.parts col.bar{width:244px}
.bisect-pipeline td.part-bar{padding:6px 10px 2px;line-height:0}
.bisect-pipeline .where{display:block;font-size:11px;color:#6b7280}
.bisect-pipeline tr.not-run td{color:#6b7280;font-style:italic}
.bisect-pipeline tr.whole td{border-top:1px solid #c9ced6;color:#4b5563}
.bisect-pipeline p.parts-note{margin:4px 0 0;font-size:13px;color:#4b5563;overflow-wrap:anywhere}
.bisect-pipeline pre.diff{font-size:12px;background:#f6f8fa;padding:8px 10px;overflow-x:auto;margin:4px 0;border-radius:4px}
.bisect-pipeline pre.diff .add{color:#116329;background:#dafbe1}
.bisect-pipeline pre.diff .del{color:#82071e;background:#ffebe9}
.bisect-pipeline pre.diff .hunk{color:#6b7280}
""".strip()

DOCUMENT_CSS = "html,body{margin:0;padding:0;background:#fff}\n.bisect-pipeline{margin:0 auto}"

# Chart geometry, in SVG user units (the SVG scales down with its container).
WIDTH = 760
LABEL_W = 118  # point names, right-aligned at LABEL_W - 8
VALUE_W = 96  # samples/s, right-aligned at WIDTH - 6
BAR_X0 = LABEL_W
BAR_X1 = WIDTH - VALUE_W - 14
TOP = 26
ROW_H = 34
BAR_H = 20
AXIS_H = 26
CHAR_W = 6.8  # average width of a 12px sans-serif character, to fit text in a box


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: float, nd: int = 1) -> str:
    return f"{x:,.{nd}f}"


def _fit(text: str, width: float) -> str:
    n = max(4, int(width / CHAR_W))
    return text if len(text) <= n else text[: n - 1].rstrip() + "\u2026"


def _verdict_class(bottleneck: Optional[str]) -> str:
    if bottleneck in STAGES or bottleneck == "tie":
        return "named"
    if bottleneck in ("none", "inconclusive"):
        return bottleneck
    return "failed"


def _nice_step(span: float) -> float:
    """A 1-2-5 step giving four to ten gridlines over `span`."""
    raw = span / 5
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag  # pragma: no cover


def _stage_ms(r: "Diagnosis", name: str) -> Optional[float]:
    """ms per batch added by the stage a drop is drawn for (named by its first stage)."""
    try:
        s = r.stage(name.split("+")[0])
    except KeyError:
        return None
    return None if s.sec_per_batch is None else s.sec_per_batch * 1e3


@dataclasses.dataclass(frozen=True)
class _Row:
    point: str
    y: float  # the bar's top
    sub: Optional[str]  # "ceiling", "your pipeline" or None
    bar_width: Optional[float]  # None: not measured (`note` says why)
    color: str = ""
    value: str = ""
    note: str = ""
    tip: str = ""  # the reason a point was not measured, on hover (the tables' notes say it)


@dataclasses.dataclass(frozen=True)
class _DropBox:
    stage: str
    point: str
    x0: float
    x1: float
    y: float
    bottleneck: bool
    tip: str
    label: Optional[str]  # the stage (and its ms) when it fits on the box


@dataclasses.dataclass(frozen=True)
class _ChartLayout:
    height: int
    bottom: int
    ticks: tuple  # (x, label)
    ceiling_x: Optional[float]
    rows: tuple
    drops: tuple


def chart_svg(r: "Diagnosis") -> str:
    """Horizontal bars of samples/s per point, the ceiling on top, the full pipeline at
    the bottom; each stage's loss drawn on its upstream point's row, the bottleneck's
    highlighted. One `rect.bar` per measured point."""
    c = plot_mod.chart(r)
    return '<div class="chart">' + _svg(_chart_layout(c, r)) + _legend(c) + "</div>"


def _chart_layout(c: "plot_mod.Chart", r: "Diagnosis") -> _ChartLayout:
    """Where everything goes, in SVG user units (no markup)."""
    bottom = TOP + len(c.bars) * ROW_H

    def x(rate: float) -> float:
        return BAR_X0 + (BAR_X1 - BAR_X0) * rate / c.max_rate

    step = _nice_step(c.max_rate)
    ticks, tick = [], 0.0
    while tick <= c.max_rate * 1.0001:
        ticks.append((x(tick), _num(tick, 0 if step >= 1 else 2)))
        tick += step
    ceiling = c.measured[0] if c.measured else None
    rows, y_of = [], {}
    for i, b in enumerate(c.bars):
        y = y_of[b.point] = TOP + i * ROW_H + (ROW_H - BAR_H) / 2
        sub = "ceiling" if b is ceiling else ("your pipeline" if b.point == "full" else None)
        if b.samples_per_sec is None:
            rows.append(_Row(b.point, y, sub, None, note=b.status, tip=f"{b.status}: {b.reason}" if b.reason else ""))
        else:
            rows.append(_Row(b.point, y, sub, max(x(b.samples_per_sec) - BAR_X0, 0.5),
                             plot_mod.CEILING_COLOR if b is ceiling else plot_mod.BAR_COLOR, _num(b.samples_per_sec)))
    drops = []
    for d in c.drops:
        x0, x1, ms = x(d.from_rate), x(d.to_rate), _stage_ms(r, d.stage)
        tip = (f"{d.stage} ({d.lower} \u2192 {d.upper}): {_num(d.to_rate - d.from_rate)} samples/s lost"
               + ("" if ms is None else f", {ms:.2f} ms per batch"))
        # Name the stage on its loss, with its cost in ms per batch when that fits too: the
        # bars are rates, and a stage's share of the rate lost is not its share of the time.
        label = next((t for t in ([f"{d.stage} +{ms:.1f} ms"] if ms is not None else []) + [d.stage]
                      if (x1 - x0) >= len(t) * CHAR_W + 10), None)
        drops.append(_DropBox(d.stage, d.lower, x0, x1, y_of[d.lower], d.bottleneck, tip, label))
    return _ChartLayout(bottom + AXIS_H, bottom, tuple(ticks),
                        None if ceiling is None else x(ceiling.samples_per_sec), tuple(rows), tuple(drops))


def _svg(g: _ChartLayout) -> str:
    """The chart's markup, from its layout."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {g.height}" width="{WIDTH}" '
           f'height="{g.height}" role="img" aria-label="samples per second at each point of the pipeline" '
           'font-size="12">']
    for tx, label in g.ticks:  # gridlines and the axis
        out.append(f'<line x1="{tx:.1f}" y1="{TOP - 4}" x2="{tx:.1f}" y2="{g.bottom}" stroke="#e5e7eb" stroke-width="1"/>')
        out.append(f'<text x="{tx:.1f}" y="{g.bottom + 16}" text-anchor="middle" fill="#6b7280" font-size="11">'
                   f'{_e(label)}</text>')
    out.append(f'<text x="{WIDTH - 6}" y="{TOP - 10}" text-anchor="end" fill="#6b7280" font-size="11">samples/s</text>')
    if g.ceiling_x is not None:  # drawn first, behind the bars and their labels
        out.append(f'<line class="ceiling" x1="{g.ceiling_x:.1f}" y1="{TOP - 4}" x2="{g.ceiling_x:.1f}" y2="{g.bottom}" '
                   f'stroke="{plot_mod.CEILING_COLOR}" stroke-width="1" stroke-dasharray="3 3"/>')
    for row in g.rows:
        out.extend(_row_svg(row))
    for d in g.drops:
        out.extend(_drop_svg(d))
    out.append("</svg>")
    return "".join(out)


def _row_svg(row: _Row) -> list:
    mid = row.y + BAR_H / 2
    if row.sub:
        out = [f'<text x="{LABEL_W - 8}" y="{mid - 2:.1f}" text-anchor="end" fill="#1f2328" font-size="13" '
               f'font-weight="600">{_e(row.point)}</text>',
               f'<text x="{LABEL_W - 8}" y="{mid + 11:.1f}" text-anchor="end" fill="#6b7280" '
               f'font-size="10">{_e(row.sub)}</text>']
    else:
        out = [f'<text x="{LABEL_W - 8}" y="{mid + 4.5:.1f}" text-anchor="end" fill="#1f2328" '
               f'font-size="13">{_e(row.point)}</text>']
    if row.bar_width is None:
        # a white halo (stroke painted under the fill) keeps the gridlines and the
        # ceiling line from running through the words
        return out + [f'<text class="missing" x="{BAR_X0 + 6}" y="{mid + 4:.1f}" fill="#6b7280" font-style="italic" '
                      f'stroke="#fff" stroke-width="4" stroke-linejoin="round" paint-order="stroke">'
                      f'<title>{_e(row.tip or row.note)}</title>{_e(_fit(row.note, WIDTH - BAR_X0 - 12))}</text>']
    return out + [f'<rect class="bar" data-point="{_e(row.point)}" x="{BAR_X0}" y="{row.y:.1f}" '
                  f'width="{row.bar_width:.1f}" height="{BAR_H}" fill="{row.color}" rx="2">'
                  f'<title>{_e(row.point)}: {_e(row.value)} samples/s</title></rect>',
                  f'<text class="value" x="{WIDTH - 6}" y="{mid + 4:.1f}" text-anchor="end" fill="#1f2328" '
                  f'font-variant-numeric="tabular-nums">{_e(row.value)}</text>']


def _drop_svg(d: _DropBox) -> list:
    cls = "drop bottleneck" if d.bottleneck else "drop"
    fill = plot_mod.BOTTLENECK_COLOR if d.bottleneck else plot_mod.DROP_COLOR
    out = [f'<rect class="{cls}" data-stage="{_e(d.stage)}" data-point="{_e(d.point)}" x="{d.x0:.1f}" '
           f'y="{d.y:.1f}" width="{d.x1 - d.x0:.1f}" height="{BAR_H}" fill="{fill}" rx="2">'
           f'<title>{_e(d.tip)}</title></rect>']
    if d.label:
        color = "#fff" if d.bottleneck else "#374151"
        weight = ' font-weight="600"' if d.bottleneck else ""
        out.append(f'<text class="drop-label" x="{(d.x0 + d.x1) / 2:.1f}" y="{d.y + BAR_H / 2 + 4:.1f}" '
                   f'text-anchor="middle" fill="{color}"{weight}>{_e(d.label)}</text>')
    return out


def _legend(c: "plot_mod.Chart") -> str:
    legend = [f'<span><span class="swatch" style="background:{plot_mod.BAR_COLOR}"></span>samples/s at this point</span>']
    if any(d.bottleneck for d in c.drops):
        legend.append(f'<span><span class="swatch" style="background:{plot_mod.BOTTLENECK_COLOR}"></span>'
                      f'lost to {_e(plot_mod.bottleneck_label(c))}</span>')
    if any(not d.bottleneck for d in c.drops):
        legend.append(f'<span><span class="swatch" style="background:{plot_mod.DROP_COLOR}"></span>'
                      f'lost to another stage</span>')
    return '<p class="legend">' + "".join(legend) + "</p>"


def _table(headers: list, rows: list, numeric: set, row_classes: Optional[list] = None) -> str:
    head = "".join(f'<th class="num">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for k, row in enumerate(rows):
        cls = row_classes[k] if row_classes and row_classes[k] else None
        cells = "".join(f'<td class="num">{_e(v)}</td>' if i in numeric else
                        f'<td class="text">{_e(v)}</td>' if i == len(row) - 1 else f"<td>{_e(v)}</td>"
                        for i, v in enumerate(row))
        body.append((f'<tr class="{cls}">' if cls else "<tr>") + cells + "</tr>")
    return ('<div class="wrap"><table><thead><tr>' + head + "</tr></thead><tbody>" + "".join(body)
            + "</tbody></table></div>")


def stage_table(r: "Diagnosis", marks: Optional[Footnotes] = None) -> str:
    marks = marks if marks is not None else Footnotes()
    rows, classes = [], []
    predicted = r.verdict.predicted  # the second witness: each worker stage's drop from its cost alone
    for s in r.verdict.stages:
        if s.status == "ok":
            note = []
            if len(s.includes) > 1:
                note.append("includes " + ", ".join(s.includes))
            if not s.significant:
                note.append("within the measurement noise" + noise_text(s.sigma, " ms"))
            if s.stage in r.verdict.disagree:
                note.append("disagrees with its cost alone")
            alone = predicted.get(s.stage)
            rows.append([s.stage, f"{s.sec_per_batch * 1e3:.2f}", "-" if alone is None else f"{alone[0] * 1e3:.2f}",
                         "-" if s.share_of_gap is None else f"{s.share_of_gap * 100:.0f}%",
                         "-" if s.samples_per_sec_if_free is None else _num(s.samples_per_sec_if_free),
                         "; ".join(note)])
        else:
            rows.append([s.stage, "-", "-", "-", "-", marks.mark(s.status, s.reason)])
        classes.append("bottleneck" if s.stage in in_question(r.verdict) else None)
    loop = text_mod.loop_row(r)  # the stages in the loop's own process: at every point, in no stage
    if loop is not None:
        rows.append(loop[:5] + loop[6:])
        classes.append("loop")
    return _table(["stage", "ms per batch added", "alone", "share of gap", "samples/s if free", "note"], rows,
                  {1, 2, 3, 4}, classes) + footnotes(marks)


def footnotes(marks: Footnotes) -> str:
    """The reasons first marked in the table above, one note each."""
    return "".join(f'<p class="footnote">[{i}] {_e(reason)}</p>' for i, reason in marks.new())


def point_table(r: "Diagnosis", marks: Optional[Footnotes] = None) -> str:
    marks = marks if marks is not None else Footnotes()
    rows = []
    for b in plot_mod.chart(r).bars:
        p = r.point(b.point)
        tp = p.throughput if p.status == "ok" else None
        rate = r.rate(p.point) if tp else None
        rows.append([
            p.point, p.status,
            _num(rate) if rate else "-",
            f"±{tp.rel_iqr * 100:.1f}%" if tp else "-",
            f"{r.batch_size / rate * 1e3:.2f}" if rate else "-",
            "-" if p.first_batch_seconds is None else f"{p.first_batch_seconds * 1e3:.0f}",
            _meaning(r, p.point) if p.status == "ok" else marks.mark("", p.reason).strip() or "-",
        ])
    return _table(["point", "status", "samples/s", "spread", "ms per batch", "first batch, ms", "what runs / why not"],
                  rows, {2, 3, 4, 5}) + footnotes(marks)


def _meaning(r: "Diagnosis", point: str) -> str:
    """What runs at a measured point; at the ceiling, the loop's own stages too where it
    has some (they run at every point: text.loop_row)."""
    if point == "device" and text_mod.loop_row(r) is not None:
        return "batches cached on the device: step and your loop's stages (the ceiling)"
    return POINT_MEANING.get(point, "")


# --------------------------------------------------------------------------------------
# Inside the stage: the parts of a stage measured alone (isolate.py, breakdown.py)
# --------------------------------------------------------------------------------------

PART_BAR_W = 220  # the longest bar of a block, in pixels
PART_BAR_H = 12
PART_STAGES = ("load", "augment", "collate")  # the stages whose parts are measured, in pipeline order
WHOLE_COLOR = "#8a94a6"  # the sum of the parts and the stage replayed whole
SAVED_COLOR = "#2e9e5b"  # a reorder's cheaper order


@dataclasses.dataclass(frozen=True)
class _Bar:
    """One part of a block: `ms` None when it was not measured (`detail` says why)."""

    label: str
    ms: Optional[float]
    detail: str = ""
    where: str = ""
    share: Optional[float] = None
    kind: str = "part"  # part, top (the costliest), whole (a sum or the stage replayed whole), not-run
    color: str = plot_mod.BAR_COLOR


@dataclasses.dataclass(frozen=True)
class _Block:
    """A table of bars on one scale (one unit), with sentences under it."""

    stage: str
    title: str
    unit: str  # "ms per sample" or "ms per batch"
    bars: tuple
    notes: tuple = ()
    detail: str = "note"  # the last column's head


def parts_section(r: "Diagnosis", *, breakdown: str = "bottleneck") -> str:
    """The section "Inside the stage": the parts of the stages in question (the
    bottleneck, or the two an inconclusive verdict could not tell apart; every stage's
    with `breakdown` "all"), one bar per part on one scale per block; "" when there are none."""
    iso = r.isolated
    if iso is None or not iso.ok:
        return ""
    questioned = in_question(r.verdict)
    shown = [s for s in PART_STAGES if breakdown == "all" or s in questioned]
    blocks = [b for s in shown for b in _PARTS[s](iso, s == r.bottleneck)]
    if not blocks:
        return ""
    return "<h3>Inside the stage</h3>" + "".join(_block_html(b) for b in blocks)


def _top_color(bottleneck: bool) -> str:
    return plot_mod.BOTTLENECK_COLOR if bottleneck else plot_mod.CEILING_COLOR


def _augment_blocks(iso: Any, bottleneck: bool) -> list:
    """The augment stage transform by transform, then its reorders and the costliest
    transform measured in the pipeline, when present."""
    aug = iso.part("augment")
    b = aug.breakdown if aug is not None else None
    if b is None or not b.ok or not b.rows:
        return []
    ok = [row for row in b.rows if row.ok and row.ms_per_sample is not None]
    top = max(ok, key=lambda row: row.ms_per_sample) if ok else None
    bars = []
    for row in b.rows:
        if row not in ok:
            why = f"{row.status}: {row.reason}" if row.reason else row.status
            bars.append(_Bar(row.name, None, why, row.where, kind="not-run"))
            continue
        ran = f"{row.input} \u2192 {row.output}" if row.input is not None else ""
        n_ran = getattr(row, "ran", None)  # samples it ran on, under RandomApply and the like
        if n_ran is not None and row.samples is not None and n_ran < row.samples:
            ran += f"; ran on {n_ran} of {row.samples} samples"
        if row.note:
            ran += f"; {row.note}"
        is_top = row is top and len(ok) > 1
        bars.append(_Bar(row.name, row.ms_per_sample, ran.lstrip("; "), row.where, row.share,
                         "top" if is_top else "part", _top_color(bottleneck) if is_top else plot_mod.BAR_COLOR))
    if b.sum_ms_per_sample is not None:
        bars.append(_Bar("sum of the parts", b.sum_ms_per_sample, kind="whole", color=WHOLE_COLOR))
    if b.augment_ms_per_sample is not None:
        bars.append(_Bar("the stage replayed whole", b.augment_ms_per_sample, "on the same samples", kind="whole",
                         color=WHOLE_COLOR))
    out = [_Block("augment", "augment, transform by transform (isolated, ms per sample)", "ms per sample",
                  tuple(bars), tuple(x for x in (text_mod._breakdown_sum(b), text_mod._in_place(aug)) if x),
                  "ran on \u2192 returned")]
    out += [_reorder_block(x) for x in b.reorders or ()]
    if b.confirmed is not None:
        out.append(_confirmation_block(b.confirmed))
    return out


def _reorder_block(x: Any) -> _Block:
    """A photometric transform moved after the crop that follows it (reorder.py): the
    transforms as they are against the reordered ones, on the same inputs."""
    order = " \u2192 ".join(x.order) if x.order else f"{x.after}, {x.transform}"
    pixels = (f"; {x.transform} ran on {x.pixels_before:,} pixels, {x.after} keeps {x.pixels_after:,}"
              if x.pixels_before and x.pixels_after else "")
    bars = (_Bar("as they are", x.ms_per_sample),
            _Bar(f"{x.transform} after {x.after}", x.reordered_ms_per_sample, order,
                 color=SAVED_COLOR if x.real else plot_mod.DROP_COLOR))
    notes = []
    if x.saving_ms_per_sample is not None:
        on = f" over {x.samples} samples" if x.samples else ""
        saving = x.saving_ms_per_sample
        what = f"saves {saving:.2f}" if saving >= 0 else f"costs {-saving:.2f} more"
        notes.append(f"Moving {x.transform} after {x.after} {what} ms per sample{on}"
                     f"{_against_noise(x.real, x.tolerance_ms)}{pixels}.")
    return _Block("augment", f"reordered: {x.transform} after {x.after} (isolated, ms per sample)", "ms per sample",
                  bars, tuple(notes), "new order")


def _against_noise(real: Optional[bool], tolerance_ms: Optional[float]) -> str:
    """': beyond the noise (±0.60)', or within it; nothing when it was not decided."""
    if real is None:
        return ""
    noise = "" if tolerance_ms is None else f" (\u00b1{tolerance_ms:.2f})"
    return (": beyond the noise" if real else ": within the noise") + noise


def _confirmation_block(c: Any) -> _Block:
    """The costliest transform as the loop sees it (the pipeline with and without it)
    against what its isolated cost predicts."""
    where = f" ({c.where})" if c.where else ""
    title = f"{c.transform}{where} in the pipeline, as the loop sees it (ms per batch)"
    if not c.ok:
        return _Block("augment", title, "ms per batch", (),
                      (f"Not measured in the pipeline: {c.status}" + (f": {c.reason}" if c.reason else "") + ".",))
    bars = (_Bar("predicted from its isolated cost", c.predicted_ms_per_batch, "ms per sample \u00d7 samples per "
                 "batch / workers", color=plot_mod.DROP_COLOR),
            _Bar("measured: with it \u2212 without it", c.measured_ms_per_batch,
                 "" if c.with_ms_per_batch is None or c.without_ms_per_batch is None else
                 f"{c.with_ms_per_batch:.2f} \u2212 {c.without_ms_per_batch:.2f}"))
    notes = []
    if c.measured_ms_per_batch is not None:
        over = f" over {c.windows} windows" if c.windows else ""
        notes.append(f"As the loop sees it, {c.transform} costs {c.measured_ms_per_batch:.2f} ms per batch{over}"
                     f"{_against_noise(c.real, c.tolerance_ms)}.")
    return _Block("augment", title, "ms per batch", bars, tuple(notes))


def _load_blocks(iso: Any, bottleneck: bool) -> list:
    """load split into reading from storage and the rest (reads.py)."""
    load = iso.part("load")
    sp = load.split if load is not None else None
    if sp is None:
        return []
    title = "load: reading and decoding (isolated, ms per sample)"
    if not sp.ok:
        return [_Block("load", title, "ms per sample", (),
                       (f"Not split: {sp.status}" + (f": {sp.reason}" if sp.reason else "") + ".",))]
    read, decode = sp.read_ms_per_sample, sp.decode_ms_per_sample
    total = (read or 0.0) + (decode or 0.0)
    share = (lambda x: x / total if x is not None and total > 0 else None)
    got = []
    if sp.read_mb_per_s is not None:
        got.append(f"{sp.read_mb_per_s:,.1f} MB/s")
    if sp.bytes_per_sample is not None:
        got.append(f"{sp.bytes_per_sample / 1024:,.0f} KiB per sample")
    if sp.files_per_sample is not None:
        got.append(f"{sp.files_per_sample:g} file(s) per sample")
    if sp.how:
        got.append(sp.how)
    colors = {k: _top_color(bottleneck) if sp.bound == k else plot_mod.BAR_COLOR for k in ("read", "decode")}
    bars = (_Bar("read from storage", read, ", ".join(got), share=share(read),
                 kind="top" if sp.bound == "read" else "part", color=colors["read"]),
            _Bar("decode and the rest", decode, "loading minus reading: decoding and the dataset's own work",
                 share=share(decode), kind="top" if sp.bound == "decode" else "part", color=colors["decode"]))
    notes = []
    if sp.bound in ("read", "decode"):
        on = f" (over {sp.samples} samples)" if sp.samples else ""
        notes.append(("Reading the bytes" if sp.bound == "read" else "Decoding and the dataset's own work")
                     + f" is the larger part{on}.")
    return [_Block("load", title, "ms per sample", bars, tuple(notes))]


def _collate_blocks(iso: Any, bottleneck: bool) -> list:
    """A custom collate_fn against default_collate on the same samples: the stacking any
    collate does, and the function's own work."""
    col = iso.part("collate")
    if col is None or col.ms_per_batch is None or col.default_collate_ms_per_batch is None:
        return []
    name = col.collate_fn or "your collate_fn"
    mine, dflt = col.ms_per_batch, col.default_collate_ms_per_batch
    title = "collate: stacking and your collate_fn's own work (isolated, ms per batch)"
    if mine < dflt:
        bars = (_Bar(name, mine), _Bar("default_collate", dflt, "on the same samples", kind="whole", color=WHOLE_COLOR))
        return [_Block("collate", title, "ms per batch", bars,
                       (f"{name} costs no more than torch's default_collate on the same samples.",))]
    own = mine - dflt
    top = own >= dflt
    bars = (_Bar("stacking", dflt, "torch's default_collate on the same samples", share=dflt / mine if mine else None,
                 kind="part" if top else "top", color=plot_mod.BAR_COLOR if top else _top_color(bottleneck)),
            _Bar(f"{name}'s own work", own, "the rest of its time", share=own / mine if mine else None,
                 kind="top" if top else "part", color=_top_color(bottleneck) if top else plot_mod.BAR_COLOR),
            _Bar(name, mine, "timed whole" + (f", over {col.batches} batches" if col.batches else ""), kind="whole",
                 color=WHOLE_COLOR))
    return [_Block("collate", title, "ms per batch", bars)]


_PARTS = {"load": _load_blocks, "augment": _augment_blocks, "collate": _collate_blocks}


def _block_html(b: _Block) -> str:
    out = [f'<h4 class="parts" data-stage="{_e(b.stage)}">{_e(b.title)}</h4>']
    if b.bars:
        scale = max([x.ms for x in b.bars if x.ms is not None and x.ms > 0] or [1.0])
        rows = "".join(_bar_row(x, scale, b.unit) for x in b.bars)
        out.append('<div class="wrap"><table class="parts"><colgroup><col class="name"/><col class="ms"/>'
                   '<col class="share"/><col class="bar"/><col/></colgroup><thead><tr><th>part</th>'
                   f'<th class="num">{_e(b.unit)}</th><th class="num">share</th><th></th><th>{_e(b.detail)}</th>'
                   "</tr></thead><tbody>" + rows + "</tbody></table></div>")
    out.extend(f'<p class="parts-note">{_e(n)}</p>' for n in b.notes)
    return "".join(out)


def _bar_row(x: _Bar, scale: float, unit: str) -> str:
    where = f'<span class="where">{_e(x.where)}</span>' if x.where else ""
    value = "-" if x.ms is None else f"{x.ms:.2f}"
    share = "-" if x.share is None else f"{x.share * 100:.0f}%"
    if x.ms is None:
        bar = ""
    else:
        w = max(x.ms, 0.0) / scale * PART_BAR_W
        tip = f"{x.label}: {value} {unit}" + ("" if x.share is None else f" ({share})")
        bar = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{PART_BAR_W}" height="{PART_BAR_H}" '
               f'viewBox="0 0 {PART_BAR_W} {PART_BAR_H}" role="img" aria-label="{_e(tip)}">'
               f'<rect class="part-bar {_e(x.kind)}" data-part="{_e(x.label)}" x="0" y="0" width="{w:.1f}" '
               f'height="{PART_BAR_H}" fill="{x.color}" rx="2"><title>{_e(tip)}</title></rect></svg>')
    cls = "" if x.kind in ("part", "top") else f' class="{_e(x.kind)}"'
    return (f"<tr{cls}><td>{_e(x.label)}{where}</td><td class=\"num\">{value}</td><td class=\"num\">{share}</td>"
            f'<td class="part-bar">{bar}</td><td class="text">{_e(x.detail)}</td></tr>')


def _context(r: "Diagnosis") -> str:
    items = [("device", r.device), ("batch size", batch_size_text(r.batch_size, r.batch_size_source))]
    if r.loader:
        items.append(("loader", ", ".join(f"{k}={v}" for k, v in r.loader.items() if v is not None)))
    spread = [f"{p.point} ±{p.throughput.rel_iqr * 100:.1f}%" for p in r.points
              if p.status == "ok" and p.throughput is not None]
    if spread:
        items.append(("spread (IQR/median)", ", ".join(spread)))
    c = r.cache
    if c.batches is not None:
        cache = f"{c.batches} batch(es), {c.samples} samples"
        if c.fill_seconds is not None:
            cache += f", filled in {c.fill_seconds:.2f} s"
        items.append(("cache", cache))  # what limited it, if anything: the warnings say it
    run = r.run
    versions = ", ".join(f"{k} {getattr(run, k)}" for k in ("torch", "torchvision", "python") if getattr(run, k))
    if versions:
        items.append(("versions", versions))
    if run.platform:
        items.append(("platform", f"{run.platform}, {run.cpu_count} CPU cores"))
    if run.elapsed_s is not None:
        items.append(("run time", f"{run.elapsed_s:.1f} s of at most {run.max_seconds} s"))
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items) + "</dl>"


def to_html(r: "Diagnosis", *, style: bool = True, breakdown: str = "bottleneck") -> str:
    """The report as an HTML fragment (a `div.bisect-pipeline`), its CSS inline unless
    `style=False`, the answer first: the box holds the whole summary (summary.py), then
    the warnings, what to do (each item's action and figure, its reasoning folded), the
    search of --tune; then the evidence: why this verdict, the chart, the stage table, the
    parts inside the stages in question (every stage measured by parts with `breakdown`
    "all"), the points; last, the run."""
    s = summary_mod.summarize(r)
    parts = ['<div class="bisect-pipeline">']
    if style:
        parts.append(f"<style>{CSS}</style>")
    parts.append('<p class="title">bisect-pipeline</p>')
    parts.append(summary_box(r, s))
    ended = ended_parts(r.measurements.source, r.bottleneck)
    if ended:  # what happened first: the script ended before the measurement did
        parts.append(f'<p class="incomplete ended">{_e(ended[0])}</p>')
    warned = summary_mod.warnings(r)
    if warned:
        parts.append('<h3>Warnings</h3><ul class="warnings">' + "".join(_warning(w) for w in warned) + "</ul>")
    if r.advice:
        parts.append('<h3>What to do, first to last</h3><ol class="advice">'
                     + "".join(_advice_item(a, a is s.first_item) for a in r.advice) + "</ol>")
    if r.tune is not None:
        parts.append(tune_section(r, s))
    parts.append("<h3>Throughput at each point</h3>")
    why = text_mod.why_text(r)
    if why:
        parts.append(f'<p class="why">{_e(why)}</p>')
    parts.append(chart_svg(r))
    marks = Footnotes()  # a row not measured: its reason once, below the first table that marks it
    parts.append("<h3>Stages</h3>")
    parts.append(stage_table(r, marks))
    parts.append(parts_section(r, breakdown=breakdown))
    parts.append("<h3>Points</h3>")
    parts.append(point_table(r, marks))
    parts.append("<h3>Run</h3>")
    parts.append(_context(r))
    parts.append("</div>")
    return "".join(parts)


def summary_box(r: "Diagnosis", s: "summary_mod.Summary") -> str:
    """The box at the top: the verdict and how firm it is, the first change with its
    figure, what to measure next (the same sentences as the text report's summary)."""
    cls = _verdict_class(r.bottleneck)
    # r.summary, not summary(r): a DistributedReport's names the rank that sets the pace.
    head = s.paragraphs()[0]  # the verdict, incomplete or not, how firm
    out = [f'<div class="summary {cls}"><p class="verdict {cls}">{_e(head)}</p>']
    out += [f'<p class="{k}">{_e(v)}</p>' for k, v in (("first", s.first), ("next", s.next)) if v]
    return "".join(out) + "</div>"


def _warning(n: Any) -> str:
    """One warning: its line, its detail (why) folded beneath."""
    d = n.detail or ""
    d = d[:1].upper() + d[1:] + ("" if d.endswith(".") else ".")
    why = f"<details><summary>why</summary><p>{_e(d)}</p></details>" if n.detail else ""
    return f"<li>{_e(n.message)}{why}</li>"


def _advice_item(a: Any, first: bool) -> str:
    """One advice item: its action and figure, its reasoning folded beneath."""
    head = text_mod.FIRST_ABOVE + "." if first else wording.headline(a)
    body = wording.reasoning(a)
    why = f"<details><summary>why</summary><p>{_e(body)}</p></details>" if body else ""
    return f'<li><p class="action">{_e(head)}</p>{why}</li>'


def tune_section(r: "Diagnosis", s: Optional["summary_mod.Summary"] = None) -> str:
    """The search of --tune: its summary, the settings tried as a table, the change (the
    diff coloured, the flags, the environment) and the change checked."""
    t, f = r.measurements.tune, r.tune
    out = ['<h3>Tuned</h3>', f'<p class="parts-note">{_e(t.why or "")}</p>' if t.why else ""]
    rows, classes = [], []
    for x in f.tried:
        o = x.outcome
        rows.append(["-" if o.speedup is None else f"{o.speedup:.2f}\u00d7",
                     tune.interval(o) or "-",
                     "-" if not o.ms_per_batch else f"{o.ms_per_batch[0]:.1f} \u2192 {o.ms_per_batch[1]:.1f}",
                     "best" if x is f.best else (o.status if o.status != "failed" else f"failed: {o.reason}"),
                     text_mod.outcome_text(r, x.settings)])
        classes.append("bottleneck" if x is f.best else None)
    if rows:
        out.append(_table(["vs yours", "interval", "ms per batch (yours \u2192 these)", "result", "settings"], rows,
                          {0, 1, 2}, classes))
    out.append(f'<p class="parts-note">{_e(text_mod.tune_summary(r, s))}</p>')
    p = t.patch or {}
    head, items = text_mod.change_items(p)
    if head is not None:
        out.append(f'<p class="parts-note">{_e(head)}</p>')
    if items:
        out.append('<ul>' + "".join(f"<li>{_e(x)}</li>" for x in items) + "</ul>")
    if p.get("diff"):
        out.append('<pre class="diff">' + "".join(_diff_line(ln) for ln in p["diff"].splitlines()) + "</pre>")
    if f.applied is not None or t.applied_reason:
        alternating = bool(t.applied and t.applied.user_windows)
        out.append(f'<p class="parts-note">{_e(text_mod.applied_text(f, t.applied_reason, alternating))}</p>')
    return "".join(out)


def _diff_line(line: str) -> str:
    cls = ("hunk" if line.startswith(("@@", "---", "+++")) else "add" if line.startswith("+")
           else "del" if line.startswith("-") else None)
    return (f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line)) + "\n"


def to_document(r: "Diagnosis", *, breakdown: str = "bottleneck") -> str:
    """A complete standalone HTML document: one self-contained file."""
    title = f"bisect-pipeline: bottleneck {r.bottleneck}" if r.bottleneck else "bisect-pipeline: no verdict"
    return ("<!DOCTYPE html>\n"
            '<html lang="en">\n<head>\n<meta charset="utf-8"/>\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>\n'
            f"<title>{_e(title)}</title>\n<style>\n{CSS}\n{DOCUMENT_CSS}\n</style>\n</head>\n<body>\n"
            + to_html(r, style=False, breakdown=breakdown) + "\n</body>\n</html>\n")

