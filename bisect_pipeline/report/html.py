"""The report as HTML (pure functions of it): `to_html` is the fragment a notebook shows
(`Report._repr_html_`), `to_document` the standalone file `--html` writes; the page, its
stylesheet and its sections in order (text.py is its sibling), the chart and "Inside the
stage" apart (html_chart.py, html_parts.py).

Inline SVG and inline CSS only: no JavaScript, nothing fetched, so it renders the same
offline and in exported notebooks. Every string that comes from the user's code or the
run (class names, reasons, loader settings, advice) is escaped. The markup is also
well-formed XML, which is how the tests check it strictly.
"""

from __future__ import annotations

from typing import Any, Optional

from ..advise import tune, wording
from ..derive.findings import Diagnosis
from ..derive.drops import STAGES
from ..derive.verdict import alone_drop, in_question
from . import plot as plot_mod, summary as summary_mod, text as text_mod
from .figures import POINT_MEANING, Footnotes, batch_size_text, ended_parts, esc, num, step_alone_text
from .html_chart import chart_svg
from .html_parts import parts_section
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


def _verdict_class(bottleneck: Optional[str]) -> str:
    if bottleneck in STAGES or bottleneck == "tie":
        return "named"
    if bottleneck in ("none", "inconclusive"):
        return bottleneck
    return "failed"


def _table(headers: list, rows: list, numeric: set, row_classes: Optional[list] = None) -> str:
    head = "".join(f'<th class="num">{esc(h)}</th>' if i in numeric else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for k, row in enumerate(rows):
        cls = row_classes[k] if row_classes and row_classes[k] else None
        cells = "".join(f'<td class="num">{esc(v)}</td>' if i in numeric else
                        f'<td class="text">{esc(v)}</td>' if i == len(row) - 1 else f"<td>{esc(v)}</td>"
                        for i, v in enumerate(row))
        body.append((f'<tr class="{cls}">' if cls else "<tr>") + cells + "</tr>")
    return ('<div class="wrap"><table><thead><tr>' + head + "</tr></thead><tbody>" + "".join(body)
            + "</tbody></table></div>")


def stage_table(r: "Diagnosis", marks: Optional[Footnotes] = None) -> str:
    marks = marks if marks is not None else Footnotes()
    rows, classes = [], []
    for s in r.verdict.stages:
        drop = alone_drop(r.verdict, s)  # the second witness: the stage's drop from its cost alone
        alone = "-" if drop is None else f"{drop[0] * 1e3:.2f}"
        if s.status == "ok":
            note = []
            if len(s.includes) > 1:
                note.append("includes " + ", ".join(s.includes))
            if not s.significant:
                note.append("within the measurement noise" + noise_text(s.sigma, " ms"))
            if s.stage in r.verdict.disagree:
                note.append("disagrees with its cost alone")
            rows.append([s.stage, f"{s.sec_per_batch * 1e3:.2f}", alone,
                         "-" if s.share_of_gap is None else f"{s.share_of_gap * 100:.0f}%",
                         num(s.samples_per_sec_if_free),
                         "; ".join(note)])
        else:
            rows.append([s.stage, "-", alone, "-", "-",
                         marks.mark(s.status, s.reason)])
        classes.append("bottleneck" if s.stage in in_question(r.verdict) else None)
    loop = text_mod.loop_row(r)  # the stages in the loop's own process: at every point, in no stage
    if loop is not None:
        rows.append(loop[:5] + loop[6:])
        classes.append("loop")
    return _table(["stage", "ms per batch added", "alone", "share of gap", "samples/s if free", "note"], rows,
                  {1, 2, 3, 4}, classes) + footnotes(marks)


def footnotes(marks: Footnotes) -> str:
    """The reasons first marked in the table above, one note each."""
    return "".join(f'<p class="footnote">[{i}] {esc(reason)}</p>' for i, reason in marks.new())


def point_table(r: "Diagnosis", marks: Optional[Footnotes] = None) -> str:
    marks = marks if marks is not None else Footnotes()
    rows = []
    for b in plot_mod.chart(r).bars:
        p = r.point(b.point)
        tp = p.throughput if p.status == "ok" else None
        rate = r.rate(p.point) if tp else None
        rows.append([
            p.point, p.status,
            num(rate) if rate else "-",
            f"±{tp.rel_iqr * 100:.1f}%" if tp else "-",
            f"{r.batch_size / rate * 1e3:.2f}" if rate else "-",
            "-" if p.first_batch_seconds is None else f"{p.first_batch_seconds * 1e3:.0f}",
            (_meaning(r, p.point) + step_alone_text(p) if p.status == "ok"
             else marks.mark("", p.reason).strip() or "-"),
        ])
    return _table(["point", "status", "samples/s", "spread", "ms per batch", "first batch, ms", "what runs / why not"],
                  rows, {2, 3, 4, 5}) + footnotes(marks)


def _meaning(r: "Diagnosis", point: str) -> str:
    """What runs at a measured point; at the ceiling, the loop's own stages too where it
    has some (they run at every point: text.loop_row)."""
    if point == "device" and text_mod.loop_row(r) is not None:
        return "batches cached on the device: step and your loop's stages (the ceiling)"
    return POINT_MEANING.get(point, "")


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
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items) + "</dl>"


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
        parts.append(f'<p class="incomplete ended">{esc(ended[0])}</p>')
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
        parts.append(f'<p class="why">{esc(why)}</p>')
    parts.append(chart_svg(r))
    marks = Footnotes()  # a row not measured: its reason once, below the first table that marks it
    parts += ["<h3>Stages</h3>", stage_table(r, marks), parts_section(r, breakdown=breakdown),
              "<h3>Points</h3>", point_table(r, marks), "<h3>Run</h3>", _context(r), "</div>"]
    return "".join(parts)


def summary_box(r: "Diagnosis", s: "summary_mod.Summary") -> str:
    """The box at the top: the verdict and how firm it is, the first change with its
    figure, what to measure next (the same sentences as the text report's summary)."""
    cls = _verdict_class(r.bottleneck)
    head = s.paragraphs()[0]  # the verdict, incomplete or not, how firm
    out = [f'<div class="summary {cls}"><p class="verdict {cls}">{esc(head)}</p>']
    out += [f'<p class="{k}">{esc(v)}</p>' for k, v in (("first", s.first), ("next", s.next)) if v]
    return "".join(out) + "</div>"


def _warning(n: Any) -> str:
    """One warning: its line, its detail (why) folded beneath."""
    d = n.detail or ""
    d = d[:1].upper() + d[1:] + ("" if d.endswith(".") else ".")
    why = f"<details><summary>why</summary><p>{esc(d)}</p></details>" if n.detail else ""
    return f"<li>{esc(n.message)}{why}</li>"


def _advice_item(a: Any, first: bool) -> str:
    """One advice item: its action and figure, its reasoning folded beneath."""
    head = text_mod.FIRST_ABOVE + "." if first else wording.headline(a)
    body = wording.reasoning(a)
    why = f"<details><summary>why</summary><p>{esc(body)}</p></details>" if body else ""
    return f'<li><p class="action">{esc(head)}</p>{why}</li>'


def tune_section(r: "Diagnosis", s: Optional["summary_mod.Summary"] = None) -> str:
    """The search of --tune: its summary, the settings tried as a table, the change (the
    diff coloured, the flags, the environment) and the change checked."""
    t, f = r.measurements.tune, r.tune
    out = ['<h3>Tuned</h3>', f'<p class="parts-note">{esc(t.why or "")}</p>' if t.why else ""]
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
    out.append(f'<p class="parts-note">{esc(text_mod.tune_summary(r, s))}</p>')
    p = t.patch or {}
    head, items = text_mod.change_items(p)
    if head is not None:
        out.append(f'<p class="parts-note">{esc(head)}</p>')
    if items:
        out.append('<ul>' + "".join(f"<li>{esc(x)}</li>" for x in items) + "</ul>")
    if p.get("diff"):
        out.append('<pre class="diff">' + "".join(_diff_line(ln) for ln in p["diff"].splitlines()) + "</pre>")
    if f.applied is not None or t.applied_reason:
        alternating = bool(t.applied and t.applied.user_windows)
        out.append(f'<p class="parts-note">{esc(text_mod.applied_text(f, t.applied_reason, alternating))}</p>')
    return "".join(out)


def _diff_line(line: str) -> str:
    cls = ("hunk" if line.startswith(("@@", "---", "+++")) else "add" if line.startswith("+")
           else "del" if line.startswith("-") else None)
    return (f'<span class="{cls}">{esc(line)}</span>' if cls else esc(line)) + "\n"


def to_document(r: "Diagnosis", *, breakdown: str = "bottleneck") -> str:
    """A complete standalone HTML document: one self-contained file."""
    title = f"bisect-pipeline: bottleneck {r.bottleneck}" if r.bottleneck else "bisect-pipeline: no verdict"
    return ("<!DOCTYPE html>\n"
            '<html lang="en">\n<head>\n<meta charset="utf-8"/>\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>\n'
            f"<title>{esc(title)}</title>\n<style>\n{CSS}\n{DOCUMENT_CSS}\n</style>\n</head>\n<body>\n"
            + to_html(r, style=False, breakdown=breakdown) + "\n</body>\n</html>\n")

