"""The HTML report, on reports built from planted numbers (no run): valid markup,
everything from user code escaped, one bar per measured point, the bottleneck shown."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from bisect_pipeline import advice as advice_mod
from bisect_pipeline.advice import Finding
from bisect_pipeline.report.html import to_document, to_html
from bisect_pipeline.report import PointResult, Report, build
from bisect_pipeline.stats import Throughput, Window

BATCH = 32
CPU_SKIP = {"host": "no accelerator: host and device coincide"}


def planted_report(rates: dict, *, skipped: dict = CPU_SKIP, status: dict = {}, loader: dict = None,
                   windows: int = 5, jitter: float = 0.01, **kw) -> Report:
    """A Report whose points run at `rates` (samples/s), each from `windows` windows of
    10 steps that disagree by +-`jitter`: exact numbers, no clock, no torch."""
    measured = {}
    points = []
    for name in ("full", "raw", "augmented", "collated", "host", "device"):
        if name in rates:
            secs = 10 * BATCH / rates[name]
            tp = Throughput(tuple(Window(10, secs * (1 + jitter * ((i % 3) - 1))) for i in range(windows)), BATCH)
            measured[name] = tp
            points.append(PointResult(name, "ok", tp, first_batch_seconds=0.05))
        elif name in skipped:
            points.append(PointResult(name, "skipped", reason=skipped[name]))
        else:
            st, reason = status.get(name, ("not run", "out of time"))
            points.append(PointResult(name, st, reason=reason))
    if loader is None:
        loader = {"dataset": "SyntheticImages", "num_workers": 0, "pin_memory": False, "collate_fn": "default_collate"}
    kw.setdefault("run", {"torch": "2.4.0", "torchvision": "0.19.0", "python": "3.11.2", "max_seconds": 20.0,
                          "elapsed_s": 17.3})
    return build(points, BATCH, "cpu", loader=loader, **kw)


# augment (raw -> augmented) is the bottleneck: 330 samples/s with it, 920 without.
AUGMENT = {"device": 950.0, "collated": 930.0, "augmented": 920.0, "raw": 330.0, "full": 320.0}


class StrictHTML(HTMLParser):
    """Fails on any end tag that does not close the innermost open element; records
    elements and text so tests can look at what a browser would see."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "embed", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list = []
        self.elements: list = []  # (tag, attrs dict)
        self.text: list = []
        self.errors: list = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(markup: str) -> StrictHTML:
    p = StrictHTML()
    p.feed(markup)
    p.close()
    assert p.errors == []
    assert p.stack == [], f"unclosed: {p.stack}"
    return p


def find(p: StrictHTML, tag: str, cls: str = None) -> list:
    return [a for t, a in p.elements if t == tag and (cls is None or cls in (a.get("class") or "").split())]


def test_fragment_and_document_are_valid_html_and_well_formed_xml():
    r = planted_report(AUGMENT)
    fragment = to_html(r)
    parse(fragment)
    root = ET.fromstring(fragment)  # strict: balanced, quoted, escaped
    assert root.tag == "div" and root.get("class") == "bisect-pipeline"

    doc = to_document(r)
    assert doc.startswith("<!DOCTYPE html>")
    p = parse(doc)
    assert [t for t, _ in p.elements][:2] == ["html", "head"]
    assert ET.fromstring(doc.split("\n", 1)[1]).tag == "html"
    assert doc.count("<style>") == 1 and "<body>" in doc and doc.rstrip().endswith("</html>")


def test_report_repr_html_is_the_rendered_fragment():
    r = planted_report(AUGMENT)
    assert r._repr_html_() == to_html(r)


def test_no_script_and_nothing_fetched():
    r = planted_report(AUGMENT)
    for markup in (to_html(r), to_document(r)):
        p = parse(markup)
        tags = {t for t, _ in p.elements}
        assert not tags & {"script", "iframe", "img", "link", "object", "embed"}
        for _, attrs in p.elements:
            assert not [k for k in attrs if k.startswith("on") or k in ("src", "href")]
        assert "url(" not in markup and "@import" not in markup


def test_user_strings_are_escaped(monkeypatch):
    evil = "<script>alert(1)</script>"
    img = '<img src=x onerror="alert(2)">'
    # Advice quotes user code (e.g. the collate_fn's name): plant one that does (advice is
    # computed once, when the report is built).
    monkeypatch.setattr(advice_mod, "findings", lambda report: [Finding("x", "load", f"fix {img}")])
    r = planted_report(
        {"device": 950.0, "collated": 930.0, "full": 320.0},
        status={"augmented": ("failed", f"RuntimeError: {evil} & more"), "raw": ("unavailable", img)},
        loader={"dataset": evil, "num_workers": 0, "collate_fn": img, "pin_memory": False},
        warnings=(f"warning about {evil}",),
    )
    for markup in (to_html(r), to_document(r)):
        p = parse(markup)
        assert find(p, "script") == [] and find(p, "img") == []
        text = "".join(p.text)
        assert f"RuntimeError: {evil} & more" in text  # the failed point's reason, as text
        assert f"fix {img}" in text and f"dataset={evil}" in text and f"warning about {evil}" in text
        assert "&lt;script&gt;" in markup and "<script" not in markup and "<img" not in markup


def test_one_bar_per_measured_point_ceiling_on_top_full_at_bottom():
    r = planted_report(AUGMENT)
    p = parse(to_html(r))
    bars = find(p, "rect", "bar")
    assert [b["data-point"] for b in bars] == ["device", "collated", "augmented", "raw", "full"]
    ys = [float(b["y"]) for b in bars]
    assert ys == sorted(ys)  # device at the top, full at the bottom
    widths = {b["data-point"]: float(b["width"]) for b in bars}
    assert widths["device"] > widths["augmented"] > widths["raw"] > widths["full"]
    assert widths["full"] == pytest.approx(widths["device"] * 320 / 950, rel=0.01)
    # the skipped host point has a row, with its reason, but no bar
    assert "skipped: no accelerator" in "".join(p.text)


def test_only_measured_points_get_bars():
    r = planted_report({"device": 950.0, "full": 320.0}, status={"raw": ("failed", "boom")})
    p = parse(to_html(r))
    bars = find(p, "rect", "bar")
    assert [b["data-point"] for b in bars] == ["device", "full"]
    # rows without a bar say why, over a halo that keeps grid and ceiling lines off the words
    missing = find(p, "text", "missing")
    assert len(missing) == 4  # host skipped, collated and augmented not run, raw failed
    assert all(m.get("paint-order") == "stroke" and m.get("stroke") == "#fff" for m in missing)


def test_the_bottleneck_drop_is_highlighted_and_spans_its_loss():
    r = planted_report(AUGMENT)
    assert r.bottleneck == "augment"
    markup = to_html(r)
    p = parse(markup)
    drops = find(p, "rect", "bottleneck")
    assert len(drops) == 1
    (d,) = drops
    assert d["data-stage"] == "augment" and d["data-point"] == "raw"  # drawn on the upstream point's row
    bars = {b["data-point"]: b for b in find(p, "rect", "bar")}
    raw, augmented = bars["raw"], bars["augmented"]
    x0 = float(raw["x"])
    assert float(d["x"]) == pytest.approx(x0 + float(raw["width"]), abs=0.2)
    assert float(d["x"]) + float(d["width"]) == pytest.approx(x0 + float(augmented["width"]), abs=0.2)
    assert d["y"] == raw["y"]
    # the stage table marks the same stage
    rows = re.findall(r'<tr class="bottleneck"><td>([^<]*)</td>', markup)
    assert rows == ["augment"]


def test_nothing_is_highlighted_when_the_pipeline_keeps_up():
    r = planted_report({"device": 950.0, "collated": 948.0, "augmented": 945.0, "raw": 944.0, "full": 940.0})
    assert r.bottleneck == "none"
    markup = to_html(r)
    p = parse(markup)
    assert find(p, "rect", "bottleneck") == []
    assert 'class="bottleneck"' not in markup
    assert find(p, "p", "none")  # the verdict box says so


def test_verdict_first_then_chart_stages_advice_and_context():
    r = planted_report(AUGMENT)
    markup = to_html(r)
    text = "".join(parse(markup).text)
    summary = r.summary
    assert summary.startswith("Bottleneck: augment")
    order = [markup.index(s) for s in (summary, "<svg", "ms per batch added", r.advice[0].message[:30], "torch 2.4.0")]
    assert order == sorted(order)
    for s in ("share of gap", "samples/s if free", "num_workers=0", "SyntheticImages", "full ±", "batch size"):
        assert s in text


def test_incomplete_run_is_said():
    r = planted_report({"device": 950.0, "full": 320.0}, complete=False)
    assert "Incomplete run (stopped by --max-seconds)" in "".join(parse(to_html(r)).text)


def test_no_verdict_still_renders():
    r = planted_report({"device": 950.0}, status={"full": ("failed", "ValueError: bad sample")})
    assert r.bottleneck is None
    p = parse(to_html(r))
    assert find(p, "p", "failed")
    assert "ValueError: bad sample" in "".join(p.text)


EVIL_ENTRY = '''
import sys
sys.path.insert(0, {tests!r})
from conftest import PlantedDataset, Sleep, make_loader, tiny_model
from torch.utils.data import default_collate

# A user's classes and functions may be named anything: these would inject if unescaped.
Evil = type("<script>alert(1)</script>", (PlantedDataset,), {{}})


def collate(samples):
    return default_collate(samples)


collate.__qualname__ = '<img src=x onerror="alert(2)">'


def make():
    return tiny_model(2.0), make_loader(Evil(transform=Sleep(5.0)), collate_fn=collate)
'''


def test_cli_html_file_from_a_real_run_escapes_class_names(tmp_path):
    """`--html` end to end: a real run of a pipeline whose dataset class is named
    `<script>...`; the file is one valid, self-contained document with the name as text.
    stderr is a pipe here, so no progress bar is drawn into it."""
    import os
    import subprocess
    import sys

    entry = tmp_path / "evil_entry.py"
    entry.write_text(EVIL_ENTRY.format(tests=os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "report.html"
    from conftest import cli_in_process

    r = cli_in_process("--entry", f"{entry}:make", "--html", str(out), "--max-seconds", "20", "--verify-seconds", "0",
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # a verdict: full was measured
    assert "\x1b" not in r.stderr and "\r" not in r.stderr  # not a terminal: no progress
    doc = out.read_text()
    p = parse(doc)
    assert find(p, "script") == [] and find(p, "img") == []
    assert "<script" not in doc and "<img" not in doc
    text = "".join(p.text)
    assert "dataset=<script>alert(1)</script>" in text
    assert 'collate_fn=<img src=x onerror="alert(2)">' in text
    assert find(p, "svg") and find(p, "rect")  # the chart and its bars
    rows = re.findall(r'<tr><td>(\w+)</td><td>(ok|skipped|failed|not run|unavailable)</td>', doc)
    assert [name for name, _ in rows] == ["device", "host", "collated", "augmented", "raw", "full"]
    assert find(p, "p", "verdict")
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []  # written atomically


def test_losses_are_labelled_with_their_cost_and_the_ceiling_line_is_behind_the_bars():
    r = planted_report(AUGMENT)
    markup = to_html(r)
    labels = re.findall(r'<text class="drop-label"[^>]*>([^<]*)</text>', markup)
    assert labels == [f"augment +{(32 / 330 - 32 / 920) * 1e3:.1f} ms"]  # 62.2 ms per batch, as the table says
    svg = markup[markup.index("<svg"):markup.index("</svg>")]
    assert svg.index('class="ceiling"') < svg.index('class="bar"')  # drawn first: never over a label
    assert "within the measurement noise (±" in markup and "(noise) within" not in markup
