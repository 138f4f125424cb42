"""report.plot(): a matplotlib Figure of samples/s per point with the bottleneck's drop
highlighted, on a report built from planted numbers; a clear install hint without
matplotlib."""

from __future__ import annotations

import io
import sys

import pytest

from bisect_pipeline.report import plot as plot_mod
from test_html import AUGMENT, planted_report

matplotlib = pytest.importorskip("matplotlib")


def patches_by_gid(fig) -> dict:
    (ax,) = fig.axes
    return {p.get_gid(): p for p in ax.patches if p.get_gid()}


def test_plot_returns_a_figure_with_a_bar_per_point_and_the_bottleneck_highlighted():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure

    r = planted_report(AUGMENT)
    fig = r.plot()
    assert isinstance(fig, Figure)
    bars = patches_by_gid(fig)
    assert {g for g in bars if g.startswith("bar-")} == {f"bar-{p}" for p in AUGMENT}
    for point, rate in AUGMENT.items():
        assert bars[f"bar-{point}"].get_width() == pytest.approx(rate, rel=0.01)
    # the ceiling on top, the full pipeline at the bottom
    ys = {p: bars[f"bar-{p}"].get_y() for p in AUGMENT}
    assert ys["device"] > ys["collated"] > ys["augmented"] > ys["raw"] > ys["full"]
    (ax,) = fig.axes
    ticks = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())))
    assert ticks[-1][1] == "device" and ticks[0][1] == "full"  # labels: the ceiling highest
    # augment's loss: on raw's row, from raw's rate up to augmented's, in the bottleneck colour
    drop = bars["bottleneck-augment"]
    assert drop.get_x() == pytest.approx(330.0, rel=0.01)
    assert drop.get_x() + drop.get_width() == pytest.approx(920.0, rel=0.01)
    assert drop.get_y() == pytest.approx(ys["raw"])
    assert to_hex(drop.get_facecolor()) == plot_mod.BOTTLENECK_COLOR
    assert [g for g in bars if g.startswith("bottleneck-")] == ["bottleneck-augment"]
    assert "bottleneck augment" in ax.get_title(loc="left")
    # each value is written right of everything on its row, not over the highlighted loss
    (raw_value,) = [t for t in ax.texts if t.get_text().strip() == "330"]
    assert raw_value.get_position()[0] == pytest.approx(920.0, rel=0.01)
    # it renders with Agg, no display needed
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_draws_into_a_given_axes_and_marks_unmeasured_points():
    from matplotlib.figure import Figure

    r = planted_report({"device": 950.0, "full": 320.0}, status={"raw": ("failed", "boom")})
    fig = Figure()
    ax = fig.add_subplot()
    assert r.plot(ax=ax) is fig
    gids = set(patches_by_gid(fig))
    assert {"bar-device", "bar-full"} <= gids and "bar-raw" not in gids
    texts = [t.get_text().strip() for t in ax.texts]
    assert "failed" in texts and "skipped" in texts  # raw failed; host skipped on CPU


def test_no_highlight_when_the_pipeline_keeps_up():
    r = planted_report({"device": 950.0, "collated": 948.0, "augmented": 945.0, "raw": 944.0, "full": 940.0})
    assert r.bottleneck == "none"
    assert not [g for g in patches_by_gid(r.plot()) if g.startswith("bottleneck-")]


def test_without_matplotlib_a_clear_install_hint(monkeypatch):
    r = planted_report(AUGMENT)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ImportError) as info:
        r.plot()
    assert "pip install bisect-pipeline[plot]" in str(info.value)
    assert "matplotlib" in str(info.value)
    # the rest of the report does not need it
    assert "Bottleneck: augment" in str(r) and "<svg" in r._repr_html_()
