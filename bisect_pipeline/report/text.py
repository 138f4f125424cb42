"""The report for a terminal: fits 80 columns, the answer first (summary.py), one time unit
per table (a pure function of the Report).

One renderer, section by section in the order the report prints them (html.py is its
sibling); the sections inside a stage are text_inside.py's, the layout text_layout.py's.
"""

from __future__ import annotations

import math
from typing import Optional

from ..advise import context, outcome, tune, wording
from ..derive.findings import Diagnosis
from ..derive.drops import POINTS
from ..derive.verdict import alone_drop
from . import summary as summary_mod
from .figures import Footnotes, batch_size_text, ended_parts, gain_if_free, num, step_alone_text
from .text_inside import breakdown_lines, split_lines
from .text_layout import table as _table, wrap as _wrap


# What runs at each point, as the text table says it (narrow: the row above plus one stage).
_POINT_SHORT = {
    "device": "step only (the ceiling)",
    "host": "+ transfer",
    "collated": "+ handoff",
    "augmented": "+ collate",
    "raw": "+ augment",
    "full": "+ load (your pipeline)",
}


def to_text(r: "Diagnosis", *, breakdown: str = "bottleneck") -> str:
    """The report for a terminal, the answer first: the summary (summary.py: at most
    SUMMARY_LINES lines), the warnings, what to do (each item its action and figure, the
    reasoning indented beneath), the search of --tune; then the evidence: why this
    verdict, the stage and point tables (times in ms; a row not measured is one line, its
    reason once below the table), the augment stage transform by transform and load split
    into read and decode (when the stage is in question, or always with `breakdown`
    "all"), the isolated costs; last, the run. Wrapped at WIDTH columns."""
    s = summary_mod.summarize(r)
    lines = brief_lines(s)
    ended = ended_parts(r.measurements.source, r.bottleneck)
    if ended:  # what happened first: the script ended before the measurement did
        lines += ["", *_wrap(ended[0])]
    warned = summary_mod.warnings(r)
    if warned:
        lines += ["", "Warnings:"]
        for w in warned:  # the line alone: its detail is the HTML's and the JSON's
            lines += _wrap(w.message, first="  - ", rest="    ")
    lines += _advice_lines(r, s)
    if r.tune is not None:
        lines += ["", *tune_lines(r, s)]
    why = why_text(r)
    if why:
        lines += ["", *_wrap(why)]
    marks = Footnotes()  # a row not measured: one line, its reason once below its table
    lines += ["", *_table("What each stage costs (times in ms per batch)",
                          ["stage", "added", "alone", "of gap", "samples/s if free", "gain", "note"],
                          _stage_rows(r, marks), "lrrrrrl"), *_notes(marks)]
    lines += ["", *_table("Throughput at each point, the ceiling first (times in ms)",
                          ["point", "samples/s", "spread", "per batch", "first batch", "what runs / why not"],
                          _point_rows(r, marks), "lrrrrl"), *_notes(marks)]
    for parts in (breakdown_lines(r, every=breakdown == "all"), split_lines(r, every=breakdown == "all")):
        if parts:
            lines += ["", *parts]
    extra = _isolated_lines(r) + epoch_start_lines(r.run)
    if extra:
        lines.append("")
    for line in extra:
        lines.extend(_wrap(line, rest="  "))
    lines += ["", *_run_lines(r)]
    return "\n".join(lines)


def brief(r: "Diagnosis") -> str:
    """The summary alone (`--brief`, `Report.brief()`): for logs and CI."""
    return "\n".join(brief_lines(summary_mod.summarize(r)))


def brief_lines(s: "summary_mod.Summary") -> list:
    """The summary's paragraphs, each wrapped at WIDTH; without how firm the verdict is
    where they would take more than SUMMARY_LINES lines."""
    lines = [line for p in s.paragraphs() for line in _wrap(p)]
    if len(lines) > summary_mod.SUMMARY_LINES:
        lines = [line for p in s.paragraphs(firm=False) for line in _wrap(p)]
    return lines


def _advice_lines(r: "Diagnosis", s: "summary_mod.Summary") -> list:
    """What to do, first to last: each item's action and figure (wording.headline), its
    reasoning indented beneath; the summary's first change is not said again."""
    if not r.advice:
        return []
    lines = ["", "What to do, first to last:"]
    for i, a in enumerate(r.advice, 1):
        body = wording.reasoning(a)
        head = (FIRST_ABOVE + ("; why:" if body else ".")) if a is s.first_item else wording.headline(a)
        lines += _wrap(head, first=f"  {i}. ", rest="     ")
        if body:
            lines += _wrap(body, first="       ", rest="       ")
    return lines


# What the advice list says of the item the summary names as the first change.
FIRST_ABOVE = "The first change, above"


def why_text(r: "Diagnosis") -> str:
    """Why this verdict (the verdict's reason), where the summary's sentence does not
    already say it."""
    v = r.verdict
    if v.bottleneck is None or not v.reason or v.reason in r.summary:
        return ""
    label = {"tie": "a tie", "none": "none"}.get(v.bottleneck, v.bottleneck)
    return f"Why {label}: {v.reason}."


def _notes(marks: "Footnotes") -> list:
    """The reasons first marked in the table above, one note each."""
    out: list = []
    for i, reason in marks.new():
        out.extend(_wrap(reason, first=f"[{i}] ", rest="    "))
    return out


def tune_lines(r: "Diagnosis", s: Optional["summary_mod.Summary"] = None) -> list:
    """The search of --tune: what it searched, a table of the settings tried (each against
    yours in its own alternating visits), the best (where the summary names it as the
    first change, only where it stands against the ceiling), the change, and the change
    checked."""
    t, f = r.measurements.tune, r.tune
    head = f"Tuned (--tune): {t.why or 'the loader settings'}; {len(f.tried)} setting(s) in {t.elapsed_s or 0:.1f} s"
    lines = _wrap(head + (f"; stopped: {t.stopped}." if t.stopped and f.tried else "."), rest="  ")
    if f.tried:
        rows = []
        for x in f.tried:
            o = x.outcome
            fig = "-" if o.speedup is None else (f"{o.speedup:.2f}\u00d7"
                                                 + (f" ({tune.interval(o)})" if tune.interval(o) else ""))
            ms = "-" if not o.ms_per_batch else f"{o.ms_per_batch[0]:.1f} \u2192 {o.ms_per_batch[1]:.1f}"
            note = "best" if x is f.best else o.status if o.status != "failed" else f"failed: {o.reason}"
            rows.append([fig, ms, note, outcome_text(r, x.settings)])
        lines += ["", *_table("Settings tried, each against yours (ms per batch: yours \u2192 these)",
                              ["vs yours", "ms per batch", "result", "settings (what differs from yours)"], rows,
                              "rrll")]
    lines += [""] + _wrap(tune_summary(r, s))
    lines += _change_lines(t.patch)
    if f.applied is not None or t.applied_reason:
        lines += [""] + _wrap(applied_text(f, t.applied_reason, alternating=bool(t.applied and t.applied.user_windows)))
    return lines


def tune_summary(r: "Diagnosis", s: Optional["summary_mod.Summary"] = None) -> str:
    """The search's summary sentence (tune.Found.summary); where the report's summary
    already names its best as the first change, only where the best stands against the
    ceiling, and the fix the change holds with it."""
    f = r.tune
    if s is None or f.best is None or s.first_item is not None or not s.first:
        return f.summary
    if f.at_ceiling:
        return " ".join(x for x in ("The best is within the noise of the ceiling.", f.fix) if x)
    ceiling = f"The ceiling is {f.ceiling_speedup:.2f}\u00d7 your speed." if f.ceiling_speedup else \
        "The ceiling is not known."
    return " ".join(x for x in (ceiling, f.fix) if x)


def outcome_text(r: "Diagnosis", settings: dict) -> str:
    """A setting tried, as the search's table names it (outcome.settings_text; a node
    graph's on its nodes)."""
    return outcome.settings_text(settings, context.is_graph(r.loader)) or "(yours)"


def change_items(p: Optional[dict]) -> tuple:
    """(the heading, the items) of the change written against the script (the patch's
    JSON form): each setting and how it is applied, the command to rerun with, where the
    diff was written; or why there is none."""
    if not p:
        return None, []
    if p.get("reason") and not (p.get("diff") or p.get("flags") or p.get("env")):
        return f"No patch: {p['reason']}.", []
    head = f"The change, against {p.get('path')}" + (f" (the loader created at line {p['line']})"
                                                      if p.get("line") else "") + ":"
    items = [f"{c.get('text')}" + (f" ({c['where']})" if c.get("where") and c.get("how") != "flag" else "")
             for c in p.get("changes") or () if c.get("how") != "unchanged"]
    if p.get("command") and (p.get("flags") or p.get("env")):
        items.append(f"run: {p['command']}")
    if p.get("written"):
        where = f" in {p['apply_in']}" if p.get("apply_in") else ""
        items.append(f"the diff is in {p['written']}: apply it{where} with git apply {p['written']} (or patch -p1 < "
                     f"{p['written']})")
    return head, items


def _change_lines(p: Optional[dict]) -> list:
    """The change as text lines: change_items, then the diff."""
    head, items = change_items(p)
    if head is None:
        return []
    lines = [""] + _wrap(head)
    for item in items:
        lines += _wrap(item, first="  - ", rest="    ")
    if p.get("diff") and not p.get("reason"):
        lines += ["  " + ln for ln in p["diff"].rstrip("\n").splitlines()]
    return lines


def applied_text(f, reason: Optional[str], alternating: bool = False) -> str:
    """The patched script's own run (`f`: tune.Found) beside the figure of what the change
    holds (`f.compared`: the search's for the settings, the advice's check's for the device
    tail on top of them or alone; where only the settings' was measured, said so;
    `alternating`: an older document's, against the original in alternating runs)."""
    a = f.applied
    if a is None or a.speedup is None:
        return f"Not checked after the change: {reason or (a.reason if a is not None else 'not run')}."
    fig = f"{a.speedup:.2f}\u00d7" + (f" ({tune.interval(a)})" if tune.interval(a) else "")
    b = f.best
    if not alternating:
        verdict = ("" if f.agrees is None else ": they agree within the noise" if f.agrees and f.whole
                   else ": it is not slower beyond the noise" if f.agrees else ": they differ beyond the noise")
        ms = a.ms_per_batch or (None, None)
        compared = f.compared or (f"the search measured {b.outcome.ms_per_batch[1]:.1f} ms per batch with these "
                                  "settings" if b is not None and b.outcome.ms_per_batch else None)
        said = f"; {compared}{verdict}" if compared else ""
        return (f"Checked after the change: your script with it built its loader with the change and ran at "
                f"{ms[1]:.1f} ms per batch, {fig} your settings' {ms[0]:.1f} ms in the search{said}.")
    ms = f", {a.ms_per_batch[0]:.1f} \u2192 {a.ms_per_batch[1]:.1f} ms per batch" if a.ms_per_batch else ""
    said = (f"; the search said {b.speedup:.2f}\u00d7" + (f" ({tune.interval(b.outcome)})"
                                                          if tune.interval(b.outcome) else "") if b is not None else "")
    verdict = ("" if f.agrees is None else ": they agree within the noise" if f.agrees
               else ": they differ beyond the noise")
    return (f"Checked after the change: your script with the change ran at {fig} the original's speed, in "
            f"alternating runs{ms}{said}{verdict}.")


def _run_lines(r: "Diagnosis") -> list:
    """The run last: device, batch size and loader settings, the loop measured (under
    `run`), how --max-seconds was divided, and the input-bound classes the summary names."""
    # the run's line keeps the tool's name: the report's marker in a log, where `run` prints it after the script's
    head = f"bisect-pipeline: device {r.device}, batch size {batch_size_text(r.batch_size, r.batch_size_source)}"
    lw = r.loader.get("num_workers")
    if lw is not None:
        head += f", num_workers {lw}, pin_memory {r.loader.get('pin_memory')}"
    lines = _wrap(head + ".", rest="  ")
    if r.measurements.mode == "loop":
        lines.extend(_wrap("In this run, " + _loop_line(r) + ".", rest="  "))
    budget = budget_text(r.run)
    if budget:
        lines.extend(_wrap(budget, rest="  "))
    if context.input_bound_class(r) in ("moderately", "highly"):
        lines.extend(_wrap(f"Input-bound: of the ceiling's throughput lost to input, not < "
                           f"{context.INPUT_BOUND_MODERATE * 100:.0f}% <= moderately < "
                           f"{context.INPUT_BOUND_HIGH * 100:.0f}% <= highly.", rest="  "))
    return lines


def _loop_line(r: "Diagnosis") -> str:
    """Which loop was measured, in a loop run (loop.py)."""
    src = r.measurements.source or {}
    where = f", created at {src['created_at']}" if src.get("created_at") else ""
    size = src.get("batch_size") or batch_size_text(r.batch_size, r.batch_size_source)  # a batch sampler's: counted
    again = f"; built anew every epoch, {src['rebuilt']} times" if src.get("rebuilt") else ""
    return (f"your training loop was the step, on loader #{src.get('index', 1)} ({src.get('dataset', '?')}, batch "
            f"size {size}{where}{again})")


def _point_rows(r: "Diagnosis", marks: Optional[Footnotes] = None) -> list:
    marks = marks or Footnotes()
    rows = []
    for name in reversed(POINTS):
        p = next((p for p in r.points if p.point == name), None)
        if p is None:
            continue
        tp = p.throughput if p.status == "ok" else None
        rate = r.rate(name) if tp else None
        if p.status == "ok":
            short = _POINT_SHORT[name]
            if name == "device" and loop_row(r) is not None:  # the loop's own stages run at every point
                short = "step and your loop's stages (the ceiling)"
            note = short + _pooled_note(r, name, rate) + step_alone_text(p)
        else:
            note = marks.mark(p.status, p.reason)
        rows.append([name, num(rate), f"±{tp.rel_iqr * 100:.1f}%" if tp else "-",
                     f"{r.batch_size / rate * 1e3:.2f}" if rate else "-",
                     "-" if p.first_batch_seconds is None else f"{p.first_batch_seconds * 1e3:.0f}", note])
    return rows


def _stage_rows(r: "Diagnosis", marks: Optional[Footnotes] = None) -> list:
    marks = marks or Footnotes()
    rows = []
    full = r.rate("full")
    for s in r.verdict.stages:
        drop = alone_drop(r.verdict, s)  # the second witness: the stage's drop from its cost alone
        alone = "-" if drop is None else f"{drop[0] * 1e3:.2f}"
        if s.status != "ok":
            rows.append([s.stage, "-", alone, "-", "-", "-",
                         marks.mark(s.status, s.reason)])
            continue
        gain = gain_if_free(s, full)
        notes = []
        if not s.significant:
            notes.append("within noise" + noise_text(s.sigma))
        if len(s.includes) > 1:
            notes.append("includes " + ", ".join(s.includes))
        if s.stage in r.verdict.disagree:
            notes.append("disagrees with its cost alone")
        rows.append([s.stage, f"{s.sec_per_batch * 1e3:.2f}", alone,
                     "-" if s.share_of_gap is None else f"{s.share_of_gap * 100:.0f}%",
                     num(s.samples_per_sec_if_free), "-" if gain is None else f"{gain * 100:+.0f}%",
                     "; ".join(notes)])
    loop = loop_row(r)
    if loop is not None:
        rows.append(loop)
    return rows


def loop_row(r: "Diagnosis") -> Optional[list]:
    """The row of the stages the loop runs in its own process (a webdataset WebLoader's),
    timed alone: at every point alike, so in no stage's drop and not a stage; free of
    them, full would lose their time per batch."""
    iso = r.isolated
    loop = iso.part("loop") if iso is not None else None
    if loop is None or loop.ms_per_batch is None:
        return None
    full = r.rate("full")
    per = r.measurements.batch_size / full if full else None
    free = r.measurements.batch_size / (per - loop.ms_per_batch / 1e3) if per and per > loop.ms_per_batch / 1e3 else None
    return ["in your loop", "-", f"{loop.ms_per_batch:.2f}", "-", num(free),
            "-" if free is None else f"{(free / full - 1) * 100:+.0f}%",
            f"{loop.label}; at every point, in no stage"]


def noise_text(sigma: Optional[float], unit: str = "") -> str:
    """' (±0.76)' for a stage's noise; ' (noise unknown: too few rounds)' without one (its points
    measured together in fewer than 2 rounds; in a document of schema 1, 2 windows)."""
    if sigma is None:
        return ""
    return f" (±{sigma * 1e3:.2f}{unit})" if math.isfinite(sigma) else " (noise unknown: too few rounds)"


def _pooled_note(r: "Diagnosis", name: str, rate: Optional[float]) -> str:
    """When the shown rate is not the point's own median (verdict.decide pooled it with
    a neighbour that measured faster within the noise), say so and give the median."""
    own = r.measured_rate(name)
    if rate is None or own is None or abs(own - rate) <= 0.005 * rate:
        return ""
    t = r.verdict.fitted.get(name)
    with_ = [p for p, u in r.verdict.fitted.items() if p != name and abs(u - t) <= 1e-12 * t]
    return f"; measured {own:,.1f}, within noise of {', '.join(with_)}"


def epoch_start_lines(run) -> list:
    """The pause at each epoch's start (phases.epoch_start), which no point's window holds."""
    e = getattr(run, "epoch_start", None)
    if not e:
        return []
    why = "its prefetch refilled" if e.get("persistent_workers") else "your workers started again"
    rates = [e["samples_per_sec_with_epochs"], e["samples_per_sec"]]
    with_, without = ([f"{x:,.1f}" for x in rates] if f"{rates[0]:,.1f}" != f"{rates[1]:,.1f}" else
                      [f"{x:.3g}" for x in rates])  # a slow step's rates: both to 3 figures
    return [f"Each epoch starts with a pause of {e['ms_per_epoch']:.1f} ms ({e['epoch_batches']} batches an epoch; "
            f"{why}): {e['ms_per_batch']:.2f} ms a batch, in no point's window; with it your pipeline trains at "
            f"{with_} samples/s, not {without} ({e['how']})."]


def budget_text(run) -> Optional[str]:
    """How --max-seconds was divided before the run (plan.Budget), where the time went, and
    the start-up before it, not counted: 'Time: of 120 s, 48 bisecting, 24 checking the
    change; spent 20.1 bisecting, ...; ...'."""
    b = run.budget
    if not b:
        return None
    names = (("bisecting", "bisecting"), ("checking", "checking the advice"), ("searching", "searching"),
             ("patching", "checking the change"))
    parts = ", ".join(f"{b[k]:.0f} {what}" for k, what in names if b.get(k) is not None)
    text = f"Time: of {run.max_seconds:g} s, {parts}"
    spent = b.get("spent") or {}
    if spent:  # where it went (a phase that ended early left its time to the next)
        text += "; spent " + ", ".join(f"{spent[k]:.1f} {what}" for k, what in names if spent.get(k) is not None)
    if b.get("verify_seconds"):
        text += f" (and {b['verify_seconds']:g} checking the advice, --verify-seconds)"
    if run.startup_s is not None:
        text += f"; {run.startup_s:.1f} s of start-up before it (imports, your code up to its loader), not counted"
    if b.get("patch_reason"):
        text += f"; the change is not checked: {b['patch_reason']}"
    return text + "."


_ISOLATED = (("load", "ms/sample"), ("augment", "ms/sample"), ("collate", "ms/batch"), ("transfer", "ms/batch"),
             ("step", "ms/batch"))


def _stacking(d) -> str:
    """A custom collate_fn against torch's default_collate on the same samples: how much
    of it is the stacking any collate does, and how much is the function's own work."""
    dflt = getattr(d, "default_collate_ms_per_batch", None)
    if dflt is None:
        return ""
    if d.ms_per_batch >= dflt:
        return f" (stacking {dflt:.2f} + your collate {d.ms_per_batch - dflt:.2f})"
    return f" (default_collate on the same samples: {dflt:.2f})"


def _beside(d, val: float) -> str:
    """The figure kept beside a cost alone where it differs: the step timed alone beside the
    ceiling's, a streaming dataset's load by index beside its load through its iterator."""
    alone, index = getattr(d, "alone_ms_per_batch", None), getattr(d, "index_ms_per_sample", None)
    if alone and f"{alone:.2f}" != f"{val:.2f}":
        return f" ({alone:.2f} timed alone)"
    if index is not None:
        return f" (through its iterator in a worker; {index:.2f} by index)"
    return ""


def _isolated_lines(r: "Diagnosis") -> list:
    """One line of isolated costs (isolate.py) and one of the step's syncs, when measured."""
    iso, out = r.isolated, []
    if iso is not None and iso.ok:
        parts = []
        for key, unit in _ISOLATED:
            d = getattr(iso, key)
            val = None if d is None else d.ms_per_sample if unit == "ms/sample" else d.ms_per_batch
            if d is not None and d.ok and val is not None:
                gbs = getattr(d, "gb_per_s", None)
                parts.append(f"{key} {val:.2f} {unit}" + (f" at {gbs:.1f} GB/s" if gbs else "") + _stacking(d)
                             + _beside(d, val))
            elif d is not None:
                parts.append(f"{key} {d.status}")
        il = iso.part("in_loop")
        if il is not None:
            parts.append(f"between steps, as the loop runs it: fetch {il.fetch_ms_per_batch:.2f} ms/batch "
                         f"(sampler, load and augment), collate {il.collate_ms_per_batch:.2f} ms/batch")
        loop = iso.part("loop")
        if loop is not None and loop.ms_per_batch is not None:
            parts.append(f"your loop's own stages {loop.ms_per_batch:.2f} ms/batch (in the step's time)")
        w = iso.workers
        if w is not None and w.ok and w.needed:
            fit = "enough" if w.fits else "not enough"
            threads = w.step_threads or 0
            if threads and threads + w.needed > w.cores:
                fit += f"; the CPU step uses {threads} threads"
            parts.append(f"workers to feed the step: {w.needed} ({w.cores} cores: {fit})")
        s = r.syncs
        if _no_cuda_syncs(r):  # not applicable here: said as transfer's is
            parts.append("host-device syncs skipped (counted on CUDA only)")
        out.append("Isolated (this process, no workers): " + "; ".join(parts) + ".")
    s = r.syncs
    if s is not None and s.ok:
        out.append(f"Host-device syncs in the step: {s.per_step:g} per step (over {s.steps} steps).")
    elif s is not None and not (_no_cuda_syncs(r) and out):
        out.append(f"Host-device syncs in the step: {s.status} ({s.reason or ''}).")
    return out


def _no_cuda_syncs(r: "Diagnosis") -> bool:
    """The step's syncs were not counted because there is no CUDA device (device_alone.no_syncs_counted)."""
    s = r.syncs
    return s is not None and s.status == "skipped" and not str(r.device).startswith("cuda")
