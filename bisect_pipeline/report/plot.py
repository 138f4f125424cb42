"""The report as a bar chart: the data of the chart (pure, shared with the HTML report)
and `plot()`, a matplotlib figure. matplotlib is an optional extra, imported only here
and only when `plot()` is called."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..derive.findings import Diagnosis
from ..derive.drops import POINTS
from ..derive.verdict import in_question


INSTALL_HINT = "report.plot() needs matplotlib, an optional extra: pip install bisect-pipeline[plot]"

# Colours shared by the HTML chart and the matplotlib figure.
BAR_COLOR = "#4c78a8"
CEILING_COLOR = "#2f5d8a"
DROP_COLOR = "#c9ced6"
BOTTLENECK_COLOR = "#e4572e"


@dataclasses.dataclass(frozen=True)
class Bar:
    point: str
    status: str
    samples_per_sec: Optional[float]  # None unless status is ok
    reason: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Drop:
    """Throughput lost to one stage: drawn on the row of its upstream (`lower`) point,
    from that point's samples/s up to the samples/s of the point downstream of it."""

    stage: str  # the stage, or "load+augment" when points between were not measured
    lower: str
    upper: str
    from_rate: float
    to_rate: float
    bottleneck: bool


@dataclasses.dataclass(frozen=True)
class Chart:
    bars: tuple[Bar, ...]  # top to bottom: the ceiling (device) first, full last
    drops: tuple[Drop, ...]
    max_rate: float  # the longest bar, at least 1

    @property
    def measured(self) -> tuple[Bar, ...]:
        return tuple(b for b in self.bars if b.samples_per_sec is not None)


def chart(report: "Diagnosis") -> Chart:
    """What to draw, from the report alone."""
    bars = []
    for name in reversed(POINTS):
        p = next((p for p in report.points if p.point == name), None)
        if p is None:
            continue
        rate = report.rate(name) if p.status == "ok" else None
        bars.append(Bar(name, p.status, rate, p.reason))
    rates = {b.point: b.samples_per_sec for b in bars if b.samples_per_sec is not None}
    drops = []
    for s in report.verdict.stages:
        if s.status != "ok" or s.lower not in rates or s.upper not in rates:
            continue
        lo, up = rates[s.lower], rates[s.upper]
        if up <= lo:  # the upstream point is as fast or faster: nothing lost here
            continue
        drops.append(Drop("+".join(s.includes) or s.stage, s.lower, s.upper, lo, up,
                          s.stage in in_question(report.verdict)))
    return Chart(tuple(bars), tuple(drops), max(list(rates.values()) + [1.0]))


def plot(report: "Diagnosis", ax: Any = None) -> Any:
    """A horizontal bar chart of samples/s per point (the ceiling on top, the full
    pipeline at the bottom), the bottleneck stage's drop highlighted. Returns the
    matplotlib Figure (drawn into `ax` when given)."""
    try:
        import matplotlib  # noqa: F401  (first: a missing package fails here, even if a submodule is cached)
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc

    c = chart(report)
    if ax is None:
        fig = Figure(figsize=(7.5, 0.45 * len(c.bars) + 1.4), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    ys = list(range(len(c.bars)))[::-1]  # the first bar (the ceiling) on top
    y_of = {b.point: y for b, y in zip(c.bars, ys)}
    for b, y in zip(c.bars, ys):
        if b.samples_per_sec is None:
            ax.text(0, y, f"  {b.status}", va="center", ha="left", color="#6b7280", style="italic", fontsize=9)
            continue
        color = CEILING_COLOR if b is c.measured[0] else BAR_COLOR
        ax.barh(y, b.samples_per_sec, height=0.6, color=color, gid=f"bar-{b.point}")
        # the value right of everything on the row (the bar and the loss drawn after it)
        end = max([b.samples_per_sec] + [d.to_rate for d in c.drops if d.lower == b.point])
        ax.text(end, y, f" {b.samples_per_sec:,.0f}", va="center", ha="left", fontsize=9)
    for d in c.drops:
        ax.barh(y_of[d.lower], d.to_rate - d.from_rate, left=d.from_rate, height=0.6,
                color=BOTTLENECK_COLOR if d.bottleneck else DROP_COLOR,
                hatch=None if d.bottleneck else "//", edgecolor="white", linewidth=0,
                gid=("bottleneck-" if d.bottleneck else "drop-") + d.stage)
    ax.set_yticks(ys, [b.point for b in c.bars])
    ax.set_xlim(0, c.max_rate * 1.18)
    ax.set_xlabel(f"samples/s (batch size {report.batch_size}, device {report.device})")
    ax.spines[["top", "right"]].set_visible(False)
    handles = [Patch(color=BAR_COLOR, label="samples/s at this point")]
    if any(d.bottleneck for d in c.drops):
        handles.append(Patch(color=BOTTLENECK_COLOR, label=f"lost to {bottleneck_label(c)}"))
    if any(not d.bottleneck for d in c.drops):
        handles.append(Patch(facecolor=DROP_COLOR, hatch="//", edgecolor="white", label="lost to other stages"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.16), ncols=len(handles), fontsize=8,
              frameon=False)
    tied = f" ({' and '.join(report.verdict.tied)})" if report.verdict.tied else ""
    ax.set_title(f"bisect-pipeline: bottleneck {report.bottleneck or 'unknown'}{tied}", loc="left", fontsize=11)
    return fig


def bottleneck_label(c: Chart) -> str:
    """What the bottleneck's colour stands for: 'augment (the bottleneck)', or the stages
    of a tie, 'load and augment (tied)'."""
    names = [d.stage for d in c.drops if d.bottleneck]
    if len(names) == 1:
        return f"{names[0]} (the bottleneck)"
    return ", ".join(names[:-1]) + " and " + names[-1] + " (tied)"
