"""The HTML report's chart (html.py) as inline SVG: its layout in SVG user units, then its
markup. A module of its own: a drawing, the figure plot.py draws with matplotlib.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..derive.findings import Diagnosis
from . import plot as plot_mod
from .figures import esc, num

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


def _fit(text: str, width: float) -> str:
    n = max(4, int(width / CHAR_W))
    return text if len(text) <= n else text[: n - 1].rstrip() + "\u2026"


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
        ticks.append((x(tick), num(tick, 0 if step >= 1 else 2)))
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
                             plot_mod.CEILING_COLOR if b is ceiling else plot_mod.BAR_COLOR, num(b.samples_per_sec)))
    drops = []
    for d in c.drops:
        x0, x1, ms = x(d.from_rate), x(d.to_rate), _stage_ms(r, d.stage)
        tip = (f"{d.stage} ({d.lower} \u2192 {d.upper}): {num(d.to_rate - d.from_rate)} samples/s lost"
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
                   f'{esc(label)}</text>')
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
               f'font-weight="600">{esc(row.point)}</text>',
               f'<text x="{LABEL_W - 8}" y="{mid + 11:.1f}" text-anchor="end" fill="#6b7280" '
               f'font-size="10">{esc(row.sub)}</text>']
    else:
        out = [f'<text x="{LABEL_W - 8}" y="{mid + 4.5:.1f}" text-anchor="end" fill="#1f2328" '
               f'font-size="13">{esc(row.point)}</text>']
    if row.bar_width is None:
        # a white halo (stroke painted under the fill) keeps the gridlines and the
        # ceiling line from running through the words
        return out + [f'<text class="missing" x="{BAR_X0 + 6}" y="{mid + 4:.1f}" fill="#6b7280" font-style="italic" '
                      f'stroke="#fff" stroke-width="4" stroke-linejoin="round" paint-order="stroke">'
                      f'<title>{esc(row.tip or row.note)}</title>{esc(_fit(row.note, WIDTH - BAR_X0 - 12))}</text>']
    return out + [f'<rect class="bar" data-point="{esc(row.point)}" x="{BAR_X0}" y="{row.y:.1f}" '
                  f'width="{row.bar_width:.1f}" height="{BAR_H}" fill="{row.color}" rx="2">'
                  f'<title>{esc(row.point)}: {esc(row.value)} samples/s</title></rect>',
                  f'<text class="value" x="{WIDTH - 6}" y="{mid + 4:.1f}" text-anchor="end" fill="#1f2328" '
                  f'font-variant-numeric="tabular-nums">{esc(row.value)}</text>']


def _drop_svg(d: _DropBox) -> list:
    cls = "drop bottleneck" if d.bottleneck else "drop"
    fill = plot_mod.BOTTLENECK_COLOR if d.bottleneck else plot_mod.DROP_COLOR
    out = [f'<rect class="{cls}" data-stage="{esc(d.stage)}" data-point="{esc(d.point)}" x="{d.x0:.1f}" '
           f'y="{d.y:.1f}" width="{d.x1 - d.x0:.1f}" height="{BAR_H}" fill="{fill}" rx="2">'
           f'<title>{esc(d.tip)}</title></rect>']
    if d.label:
        color = "#fff" if d.bottleneck else "#374151"
        weight = ' font-weight="600"' if d.bottleneck else ""
        out.append(f'<text class="drop-label" x="{(d.x0 + d.x1) / 2:.1f}" y="{d.y + BAR_H / 2 + 4:.1f}" '
                   f'text-anchor="middle" fill="{color}"{weight}>{esc(d.label)}</text>')
    return out


def _legend(c: "plot_mod.Chart") -> str:
    legend = [f'<span><span class="swatch" style="background:{plot_mod.BAR_COLOR}"></span>samples/s at this point</span>']
    if any(d.bottleneck for d in c.drops):
        legend.append(f'<span><span class="swatch" style="background:{plot_mod.BOTTLENECK_COLOR}"></span>'
                      f'lost to {esc(plot_mod.bottleneck_label(c))}</span>')
    if any(not d.bottleneck for d in c.drops):
        legend.append(f'<span><span class="swatch" style="background:{plot_mod.DROP_COLOR}"></span>'
                      f'lost to another stage</span>')
    return '<p class="legend">' + "".join(legend) + "</p>"
