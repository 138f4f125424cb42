"""The HTML report, on reports built from planted numbers (no run): valid markup,
everything from user code escaped, one bar per measured point, the bottleneck shown."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from bisect_pipeline.advise import advice as advice_mod
from bisect_pipeline.derive.findings import Finding
from bisect_pipeline.report.html import to_document, to_html
from bisect_pipeline.report import PointResult, Report, build
from bisect_pipeline.core.stats import Throughput, Window

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


def test_the_box_holds_the_summary_then_warnings_advice_chart_stages_points_and_context():
    from bisect_pipeline.report import summary as summary_mod
    r = planted_report(AUGMENT, isolated=WORKERS, warnings=("device: something to know",))
    markup = to_html(r)
    p = parse(markup)
    text = "".join(p.text)
    s = summary_mod.summarize(r)
    assert s.verdict == r.summary and r.summary.startswith("Bottleneck: augment")
    assert s.first.startswith("First change: set num_workers=3, persistent_workers=True")
    # the box holds the whole summary: the verdict and the first change with its figure
    box = markup[markup.index('<div class="summary'):markup.index("</div>", markup.index('<div class="summary'))]
    assert html.escape(s.first, quote=True) in box and html.escape(r.summary, quote=True) in box
    order = [markup.index(x) for x in ('<div class="summary', "<h3>Warnings", "<h3>What to do", "<svg",
                                       "ms per batch added", "<h3>Points", "torch 2.4.0")]
    assert order == sorted(order)
    for x in ("share of gap", "samples/s if free", "num_workers=0", "SyntheticImages", "full ±", "batch size"):
        assert x in text


WORKERS = {"status": "ok", "workers": {"status": "ok", "needed": 3, "cores": 8, "available": 7, "step_threads": 1,
                                       "worker_ms_per_batch": 60.0, "step_ms_per_batch": 35.0}}


def test_advice_items_lead_with_the_action_their_reasoning_folded():
    from bisect_pipeline.advise.wording import headline, reasoning
    r = planted_report(AUGMENT, isolated=WORKERS)
    p = parse(to_html(r))
    items = [a for t, a in p.elements if t == "li"]
    actions = find(p, "p", "action")
    assert len(find(p, "details")) == len(actions) == len(r.advice) == 2 and items
    markup = to_html(r)
    advice = markup[markup.index('<ol class="advice">'):markup.index("</ol>")]
    # the first is the box's first change: said there, its reasoning folded here
    assert advice.index("The first change, above.") < advice.index("<details><summary>why</summary><p>With num_")
    second = r.advice[1]
    assert f'<p class="action">{html.escape(headline(second))}</p><details><summary>why</summary><p>' in advice
    assert html.escape(reasoning(second)) in advice


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


@pytest.mark.e2e  # a real run (8 s): not in the fast subset
def test_cli_html_file_from_a_real_run_escapes_class_names(tmp_path):
    """`--html` end to end: a real run of a pipeline whose dataset class is named
    `<script>...`; the file is one valid, self-contained document with the name as text.
    stderr is a pipe here, so no progress bar is drawn into it."""
    import os
    import subprocess
    import sys

    entry = tmp_path / "evil_entry.py"
    entry.write_text(EVIL_ENTRY.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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


# --------------------------------------------------------------------------------------
# Inside the stage: the parts of a stage, from hand-built records
# --------------------------------------------------------------------------------------

LOAD_BOUND = {"device": 950.0, "collated": 930.0, "augmented": 920.0, "raw": 910.0, "full": 320.0}
COLLATE_BOUND = {"device": 950.0, "collated": 930.0, "augmented": 330.0, "raw": 325.0, "full": 320.0}


def parts_report(rates: dict = AUGMENT, *, rows=None, cut: bool = False, reorders=None, confirmed=None, split=None,
                 collate=None) -> Report:
    """A report whose isolated costs hold the parts given (the augment rows by default)."""
    from bisect_pipeline.core.results import Breakdown, BreakdownRow, Isolated, PerSample
    if rows is None:
        rows = (BreakdownRow(name="RandomResizedCrop", where="dataset.transform[0]", ms_per_sample=5.0, share=0.2,
                             input="500x375 RGB", output="224x224 RGB", samples=4),
                BreakdownRow(name="ToTensor", where="dataset.transform[1]", ms_per_sample=20.0, share=0.8,
                             input="224x224 RGB", output="3x224x224 float32", samples=4))
    if cut:
        rows += (BreakdownRow(status="not run", reason="out of time: the budget ran out before it", name="Normalize",
                              where="dataset.transform[2]"),)
    total = None if cut else sum(r.ms_per_sample for r in rows if r.ok)
    b = Breakdown(rows=rows, samples=4, sum_ms_per_sample=total, augment_ms_per_sample=None if cut else 26.0,
                  tolerance_ms=5.2, tolerance="20%", agrees=None if cut else True, reorders=reorders,
                  confirmed=confirmed)
    iso = Isolated(augment=PerSample(ms_per_sample=26.0, samples=4, breakdown=b),
                   load=PerSample(ms_per_sample=4.0, samples=8, split=split), collate=collate)
    return planted_report(rates, isolated=iso.to_dict())


def part_bars(markup: str) -> dict:
    """The bars of the section, by the part they draw: {label: (width, fill, class)}."""
    return {a["data-part"]: (float(a["width"]), a["fill"], a["class"]) for a in find(parse(markup), "rect", "part-bar")}


def section(markup: str) -> str:
    at = markup.index("<h3>Inside the stage</h3>")
    return markup[at:markup.index("<h3>", at + 1)]


def test_inside_the_stage_draws_one_bar_per_part_proportional_to_its_cost():
    from bisect_pipeline.report import html_parts
    from bisect_pipeline.report import plot as plot_mod
    r = parts_report()
    markup = to_html(r)
    ET.fromstring(markup)  # still well-formed XML, the bars' SVGs included
    # under the stage table, after the advice (the answer first, the evidence beneath)
    assert markup.index("What to do") < markup.index("ms per batch added") < markup.index("Inside the stage")
    bars = part_bars(markup)
    assert list(bars) == ["RandomResizedCrop", "ToTensor", "sum of the parts", "the stage replayed whole"]
    widths = {k: v[0] for k, v in bars.items()}
    # one scale: the longest (the stage replayed whole, 26.0) spans PART_BAR_W
    assert widths["the stage replayed whole"] == pytest.approx(html_parts.PART_BAR_W)
    assert widths["ToTensor"] == pytest.approx(html_parts.PART_BAR_W * 20 / 26, abs=0.1)
    assert widths["RandomResizedCrop"] / widths["ToTensor"] == pytest.approx(5 / 20, rel=0.01)
    assert widths["sum of the parts"] == pytest.approx(html_parts.PART_BAR_W * 25 / 26, abs=0.1)
    # the costliest part of the bottleneck stage in the bottleneck's colour
    assert bars["ToTensor"][1] == plot_mod.BOTTLENECK_COLOR and "top" in bars["ToTensor"][2]
    assert bars["RandomResizedCrop"][1] == plot_mod.BAR_COLOR
    text = "".join(parse(section(markup)).text)
    for s in ("RandomResizedCrop", "dataset.transform[0]", "5.00", "20%", "500x375 RGB \u2192 224x224 RGB", "80%",
              "Sum 25.00 over 4 samples; the stage replayed whole 26.00: they agree (within \u00b15.20)."):
        assert s in text
    assert r._repr_html_() == r.html() == markup


def test_a_part_not_run_is_a_grey_row_with_its_reason_and_no_bar():
    markup = to_html(parts_report(cut=True))
    assert list(part_bars(markup)) == ["RandomResizedCrop", "ToTensor"]  # no sum, no whole: not every part ran
    rows = re.findall(r'<tr class="not-run"><td>([^<]*)<span class="where">([^<]*)</span></td>(.*?)</tr>', markup)
    assert [(name, where) for name, where, _ in rows] == [("Normalize", "dataset.transform[2]")]
    assert "<rect" not in rows[0][2] and "not run: out of time: the budget ran out before it" in rows[0][2]
    assert "the parts have no sum" in section(markup)


def test_part_names_and_shapes_from_user_code_are_escaped():
    from bisect_pipeline.core.results import BreakdownRow
    evil, img = "<script>alert(1)</script>", '<img src=x onerror="alert(2)">'
    rows = (BreakdownRow(name=evil, where=f"dataset.transform[{img}]", ms_per_sample=3.0, share=1.0, input=img,
                         output="x & y", note=evil),)
    markup = to_html(parts_report(rows=rows))
    p = parse(markup)
    ET.fromstring(markup)
    assert find(p, "script") == [] and find(p, "img") == [] and "<script" not in markup and "<img" not in markup
    text = "".join(p.text)
    assert evil in text and f"dataset.transform[{img}]" in text and f"{img} \u2192 x & y; {evil}" in text
    assert list(part_bars(markup))[0] == evil  # the attribute, unescaped by the parser, is the name


def test_no_section_without_parts_nor_for_a_stage_not_in_question_unless_all():
    plain = planted_report(AUGMENT)
    assert "Inside the stage" not in to_html(plain) and "Inside the stage" not in to_html(plain, breakdown="all")
    load_bound = parts_report(LOAD_BOUND)  # augment measured by parts, load not: nothing to show by default
    assert load_bound.bottleneck == "load"
    assert "Inside the stage" not in to_html(load_bound) and part_bars(to_html(load_bound)) == {}
    tied = parts_report({"device": 950.0, "collated": 930.0, "augmented": 920.0, "raw": 500.0, "full": 330.0})
    assert tied.bottleneck == "tie"  # load and augment tied for the lead: both in question
    assert list(part_bars(to_html(tied)))[:2] == ["RandomResizedCrop", "ToTensor"]
    every = load_bound.html(breakdown="all")
    assert list(part_bars(every))[:2] == ["RandomResizedCrop", "ToTensor"]
    assert "Inside the stage" in to_document(load_bound, breakdown="all")
    assert "Inside the stage" not in to_document(load_bound)
    # a report rebuilt from its JSON document renders the same
    again = Report.from_dict(json.loads(json.dumps(load_bound.to_dict())))
    assert again.html(breakdown="all") == every


def test_the_load_split_reading_and_decoding():
    from bisect_pipeline.report import plot as plot_mod
    from bisect_pipeline.core.results import LoadSplit
    split = LoadSplit(read_ms_per_sample=3.0, decode_ms_per_sample=1.0, bytes_per_sample=262144, read_mb_per_s=85.3,
                      files_per_sample=1.0, samples=12, bound="read", how="file reads through open()")
    r = parts_report(LOAD_BOUND, split=split)
    markup = to_html(r)
    bars = part_bars(markup)
    assert list(bars) == ["read from storage", "decode and the rest"]  # the bottleneck's only: not augment's
    assert bars["read from storage"][0] / bars["decode and the rest"][0] == pytest.approx(3.0, rel=0.01)
    assert bars["read from storage"][1] == plot_mod.BOTTLENECK_COLOR  # the larger part, `bound`
    text = "".join(parse(section(markup)).text)
    for s in ("3.00", "75%", "1.00", "25%", "85.3 MB/s", "256 KiB per sample", "file reads through open()",
              "Reading the bytes is the larger part (over 12 samples)."):
        assert s in text
    # a split that failed says why, without bars
    failed = to_html(parts_report(LOAD_BOUND, split=LoadSplit.missing("failed", "OSError: <no /proc>")))
    assert part_bars(failed) == {} and "Not split: failed: OSError: <no /proc>." in "".join(parse(failed).text)


def test_the_collate_split_stacking_against_your_collate_fn():
    from bisect_pipeline.core.results import Collate
    col = Collate(ms_per_batch=12.4, batches=6, collate_fn="pad_collate", default_collate_ms_per_batch=5.1)
    r = parts_report(COLLATE_BOUND, collate=col)
    assert r.bottleneck == "collate"
    markup = to_html(r)
    bars = part_bars(markup)
    assert list(bars) == ["stacking", "pad_collate's own work", "pad_collate"]
    assert bars["pad_collate's own work"][0] / bars["stacking"][0] == pytest.approx(7.3 / 5.1, rel=0.01)
    assert "top" in bars["pad_collate's own work"][2]
    text = "".join(parse(section(markup)).text)
    for s in ("5.10", "41%", "7.30", "59%", "12.40", "over 6 batches", "ms per batch"):
        assert s in text
    # with --breakdown all: every stage with parts, in the pipeline's order
    every = to_html(r, breakdown="all")
    stages = re.findall(r'<h4 class="parts" data-stage="(\w+)">', every)
    assert stages == ["augment", "collate"]
    # a collate_fn cheaper than default_collate: the two side by side, no negative part
    cheap = to_html(parts_report(COLLATE_BOUND, collate=Collate(ms_per_batch=3.0, collate_fn="fast",
                                                               default_collate_ms_per_batch=5.0)))
    assert list(part_bars(cheap)) == ["fast", "default_collate"]
    assert "fast costs no more than torch's default_collate" in "".join(parse(cheap).text)


def test_the_reorders_and_the_confirmation_in_the_pipeline():
    from bisect_pipeline.core.results import Confirmation, Reorder
    reorder = Reorder(transform="ColorJitter", where="dataset.transform[0]", after="RandomResizedCrop",
                      after_where="dataset.transform[1]", order=("RandomResizedCrop", "ColorJitter"),
                      pixels_before=187500, pixels_after=50176, ms_per_sample=8.0, reordered_ms_per_sample=3.0,
                      saving_ms_per_sample=5.0, tolerance_ms=0.6, samples=16, real=True)
    confirmed = Confirmation(transform="ToTensor", where="dataset.transform[1]", predicted_ms_per_batch=640.0,
                             measured_ms_per_batch=480.0, tolerance_ms=40.0, real=True, with_ms_per_batch=1100.0,
                             without_ms_per_batch=620.0, windows=8)
    markup = to_html(parts_report(reorders=(reorder,), confirmed=confirmed))
    titles = re.findall(r'<h4 class="parts" data-stage="augment">([^<]*)</h4>', markup)
    assert titles == ["augment, transform by transform (isolated, ms per sample)",
                      "reordered: ColorJitter after RandomResizedCrop (isolated, ms per sample)",
                      "ToTensor (dataset.transform[1]) in the pipeline, as the loop sees it (ms per batch)"]
    bars = part_bars(markup)
    assert bars["ColorJitter after RandomResizedCrop"][0] / bars["as they are"][0] == pytest.approx(3 / 8, rel=0.01)
    measured = bars["measured: with it \u2212 without it"][0]
    assert measured / bars["predicted from its isolated cost"][0] == pytest.approx(480 / 640, rel=0.01)
    text = " ".join("".join(parse(section(markup)).text).split())
    assert ("Moving ColorJitter after RandomResizedCrop saves 5.00 ms per sample over 16 samples: beyond the noise "
            "(\u00b10.60); ColorJitter ran on 187,500 pixels, RandomResizedCrop keeps 50,176.") in text
    assert "RandomResizedCrop \u2192 ColorJitter" in text and "1100.00 \u2212 620.00" in text
    assert "As the loop sees it, ToTensor costs 480.00 ms per batch over 8 windows: beyond the noise (\u00b140.00)." in text
    # a reorder that costs more, not decided against the noise: said as it is
    worse = dataclasses.replace(reorder, reordered_ms_per_sample=8.5, saving_ms_per_sample=-0.5, real=None)
    assert ("Moving ColorJitter after RandomResizedCrop costs 0.50 more ms per sample over 16 samples; ColorJitter"
            in " ".join("".join(parse(to_html(parts_report(reorders=(worse,)))).text).split()))
    # a confirmation that could not be made says why
    failed = to_html(parts_report(confirmed=Confirmation.missing("failed", "RuntimeError: <boom>")))
    assert "Not measured in the pipeline: failed: RuntimeError: &lt;boom&gt;." in failed


def test_cli_breakdown_all_reaches_the_html_file(tmp_path, monkeypatch):
    from conftest import cli_in_process

    from bisect_pipeline import api
    load_bound = parts_report(LOAD_BOUND)
    monkeypatch.setattr(api, "bisect", lambda **kw: load_bound)  # no run: the report as measured
    every, default = tmp_path / "every.html", tmp_path / "default.html"
    assert cli_in_process("demo", "--html", str(every), "--breakdown", "all", cwd=tmp_path).returncode == 0
    assert cli_in_process("demo", "--html", str(default), cwd=tmp_path).returncode == 0
    assert "Inside the stage" in every.read_text() and "Inside the stage" not in default.read_text()
