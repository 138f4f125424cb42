"""`bisect-pipeline compare before.json after.json`: what changed, with the noise.

Reads the two JSON documents only (json.load, never pickle), rebuilds them with
`Report.from_dict`, and compares per point (throughput), per stage (ms per batch) and per
part inside a stage, as each run measured it alone (the augment stage's transforms,
load's reading and decoding, collate's stacking and the collate_fn's own work).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Optional

from .advise import outcome
from .core.errors import BisectError
from .core.stats import MIN_REL_DROP, Throughput, difference, unpaired
from .core.stats import compare as stats_compare
from .derive.drops import POINTS, cost_noise
from .report import Report

# A change is decided by the tool's one comparison (stats.compare: 97.7% one-sided, Student's
# t at the degrees of freedom of the difference's noise) on the two runs' own values, not
# paired (stats.unpaired: the runs were not taken in alternation): a point's log speed-up
# from each run's per-round times (its windows' where a document has no rounds), a
# stage's cost from each run's noise. It must also exceed MIN_REL_CHANGE: drift between
# two runs is at least the drift between two points of one run, which the verdict bounds
# at 5% (of throughput for points, of the slower full pipeline's time per batch for stages).
MIN_REL_CHANGE = MIN_REL_DROP


def load(path: str) -> Report:
    """A bisection result from its JSON file: json.load only (never pickle, never code),
    then a schema check; anything else is a BisectError (exit 2) naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise BisectError(f"compare: no file {path!r}; give two JSON files written with --json.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise BisectError(f"compare: {path!r} is not a JSON document ({exc}); give files written with --json.") from None
    hint = "give files written by `bisect-pipeline --entry ... --json PATH`"
    if not isinstance(doc, dict):
        raise BisectError(f"compare: {path!r} holds a JSON {type(doc).__name__}, not a bisect-pipeline result; {hint}.")
    if doc.get("kind") in ("sweep", "compare"):
        raise BisectError(f"compare: {path!r} is the JSON of a {doc['kind']}, not of a bisection; {hint}.")
    if doc.get("tool", "bisect-pipeline") != "bisect-pipeline" or "schema_version" not in doc:
        raise BisectError(f"compare: {path!r} is not a bisect-pipeline result (no schema_version); {hint}.")
    try:
        report = Report.from_dict(doc)
        for p in report.points:  # every statistic compare uses must be computable
            if p.throughput is not None:
                if any(w.steps <= 0 or w.seconds <= 0 for w in p.throughput.windows):
                    raise ValueError(f"point {p.point} has a window without steps or time")
                p.throughput.rel_se  # noqa: B018
    except BisectError:
        raise
    except Exception as exc:  # a wrong-schema document: whatever from_dict tripped on
        raise BisectError(f"compare: {path!r} is not a bisect-pipeline result of schema_version "
                          f"{doc.get('schema_version')!r} "
                          f"({type(exc).__name__}: {exc}); {hint}.") from None
    return report


# The fewest windows a point needs in each run for its change to be judged.
MIN_WINDOWS = 3


def point_change(before: Optional[Throughput], after: Optional[Throughput]) -> dict:
    """ratio = after / before throughput (from each run's per-round times); `real` by the
    rule above."""
    if before is None or after is None:
        return {"ratio": None, "real": None, "label": "not measured in both runs"}
    c = unpaired(before.times(), after.times())
    ratio = math.exp(c.estimate)
    cmp = stats_compare(c, 1.0)  # relative: |log ratio| against 1
    threshold, real = cmp.threshold, cmp.real and math.isfinite(cmp.sigma)
    fewest = min(before.n, after.n)
    if fewest < MIN_WINDOWS:
        # a point of one or two windows in either run has no usable noise estimate (two:
        # Student's t at one degree of freedom is 78 z): "within noise" would claim a figure
        # no one measured
        real = None
        label = f"\u00d7{ratio:.2f}, noise unknown ({fewest} window{'s' if fewest != 1 else ''})"
    elif not real:
        label = "within noise"
    elif ratio > 1:
        label = f"{ratio:.2f}\u00d7 faster"
    else:
        label = f"{1 / ratio:.2f}\u00d7 slower"
    return {"ratio": round(ratio, 4), "real": real, "threshold_rel": _finite(threshold, 4),
            "label": label}


def stage_change(before, after, t_full: Optional[float]) -> dict:
    """diff = after - before ms per batch; `real` by the rule above."""
    if before is None or after is None or before.sec_per_batch is None or after.sec_per_batch is None:
        return {"diff_ms": None, "real": None, "label": "not measured in both runs"}
    d = difference(cost_noise(after), cost_noise(before))
    diff, sigma = d.estimate, d.se
    cmp = stats_compare(d, t_full or 0.0)
    threshold, real = cmp.threshold, cmp.real
    if not math.isfinite(sigma):
        return {"diff_ms": round(diff * 1e3, 3), "real": None, "threshold_ms": None,
                "label": f"{diff * 1e3:+.1f} ms per batch, noise unknown (one window)"}
    label = "within noise" if not real else (f"{-diff * 1e3:.1f} ms per batch cheaper" if diff < 0
                                             else f"{diff * 1e3:.1f} ms per batch costlier")
    return {"diff_ms": round(diff * 1e3, 3), "real": real, "threshold_ms": _finite(threshold * 1e3, 3),
            "label": label}


def _finite(x: float, nd: int) -> Optional[float]:
    """JSON has no infinity: a threshold from a point with one window is unknown (None)."""
    return round(x, nd) if math.isfinite(x) else None


def compare(before: Report, after: Report) -> dict:
    points = []
    for name in reversed(POINTS):
        b, a = before.throughput(name), after.throughput(name)
        points.append({"point": name,
                       "before_samples_per_sec": None if b is None else round(b.samples_per_sec, 1),
                       "after_samples_per_sec": None if a is None else round(a.samples_per_sec, 1),
                       **point_change(b, a)})
    fulls = [t.sec_per_batch for t in (before.throughput("full"), after.throughput("full")) if t is not None]
    t_full = max(fulls) if fulls else None
    stages = []
    for sb in before.verdict.stages:
        try:
            sa = after.stage(sb.stage)
        except KeyError:
            sa = None
        ok_b = sb if sb.status == "ok" else None
        ok_a = sa if sa is not None and sa.status == "ok" else None
        stages.append({"stage": sb.stage,
                       "before_ms_per_batch": None if ok_b is None else round(ok_b.sec_per_batch * 1e3, 3),
                       "after_ms_per_batch": None if ok_a is None else round(ok_a.sec_per_batch * 1e3, 3),
                       "before_significant": None if ok_b is None else ok_b.significant,
                       "after_significant": None if ok_a is None else ok_a.significant,
                       **stage_change(ok_b, ok_a, t_full)})
    settings = sorted(set(before.loader) | set(after.loader))
    changed = {k: [before.loader.get(k), after.loader.get(k)] for k in settings
               if before.loader.get(k) != after.loader.get(k)}
    full = next(p for p in points if p["point"] == "full")
    ceiling, share, warning = _ceiling(before, after)
    return {
        "kind": "compare",
        "schema_version": 1,
        "bottleneck": [before.bottleneck, after.bottleneck],
        "batch_size": [before.batch_size, after.batch_size],
        "device": [before.device, after.device],
        "loader_changes": changed,
        "full": full,
        "ceiling": ceiling,
        "share_of_ceiling": share,
        "warning": warning,
        "points": points,
        "stages": stages,
        "advice_checked": advice_checked(before, after, full),
        "parts": part_changes(before, after),
        "rule": ("a change is real when it exceeds Student's t at 97.7% one-sided times the standard error of the "
                 f"two runs' difference and {MIN_REL_CHANGE * 100:.0f}% (of throughput for points, of the full "
                 "pipeline's time per batch for stages)"),
    }


@dataclasses.dataclass(frozen=True)
class _Part:
    """A part inside a stage as one run measured it alone: `ms` None when it was not
    timed (a transform the budget did not reach)."""

    name: str
    ms: Optional[float]
    where: Optional[str] = None


PART_UNITS = {"load": "ms/sample", "augment": "ms/sample", "collate": "ms/batch"}


def _parts(r: Report, stage: str) -> list:
    """The parts of `stage` in the run's isolated costs (isolate.py), in their order."""
    iso = r.isolated
    part = iso.part(stage) if iso is not None else None
    if part is None:
        return []
    if stage == "augment":
        b = part.breakdown
        if b is None or not b.ok:
            return []
        return [_Part(row.name, row.ms_per_sample if row.ok else None, row.where) for row in b.rows or ()]
    if stage == "load":
        sp = part.split
        if sp is None or not sp.ok:
            return []
        return [_Part("read", sp.read_ms_per_sample), _Part("decode", sp.decode_ms_per_sample)] + (
            [] if sp.iterator_ms_per_sample is None else [_Part("iterator", sp.iterator_ms_per_sample)])
    dflt = part.default_collate_ms_per_batch
    if dflt is None or part.ms_per_batch is None:
        return []
    return [_Part("stacking", dflt), _Part("your collate's own work", max(0.0, part.ms_per_batch - dflt))]


def _pair(before: list, after: list) -> list:
    """(before, after) parts: matched by `where` and name, then by name alone (a
    transform that moved), in the first run's order; the second run's unmatched last.
    A part of one run only is paired with None."""
    left, match = list(range(len(after))), {}
    for same_place in (True, False):
        for i, p in enumerate(before):
            if i in match:
                continue
            j = next((j for j in left if after[j].name == p.name and (after[j].where == p.where or not same_place)),
                     None)
            if j is not None:
                match[i] = j
                left.remove(j)
    return [(p, after[match[i]] if i in match else None) for i, p in enumerate(before)] + [(None, after[j]) for j in left]


def part_changes(before: Report, after: Report) -> list:
    """Per part inside load, augment and collate, as each run timed it alone: before and
    after, the difference, or on which run's side only it is. Each part is timed once per
    run, in this process: there is no noise rule for these, only the figures."""
    out = []
    for stage, unit in PART_UNITS.items():
        for b, a in _pair(_parts(before, stage), _parts(after, stage)):
            out.append(_part_row(stage, unit, b, a))
    return out


def _part_row(stage: str, unit: str, b: Optional[_Part], a: Optional[_Part]) -> dict:
    row = {"stage": stage, "part": (b or a).name, "unit": unit,
           "before_ms": None if b is None else _r(b.ms), "after_ms": None if a is None else _r(a.ms)}
    if (b or a).where is not None:
        row["where"] = [None if b is None else b.where, None if a is None else a.where]
    row["in"] = "both" if b and a else "first run only" if b else "second run only"
    if b is None or a is None:
        row["label"] = f"only in the {'first' if b else 'second'} run"
        return row
    moved = f"; moved from {b.where} to {a.where}" if b.where != a.where else ""
    if b.ms is None or a.ms is None:
        row["label"] = "not timed in both runs" + moved
        return row
    diff = a.ms - b.ms
    row["diff_ms"] = _r(diff)
    rel = f" ({diff / b.ms * 100:+.0f}%)" if b.ms > 0 else ""
    row["label"] = f"{diff:+.2f} {unit}{rel}" + moved
    return row


def _r(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(float(x), 4)


def advice_checked(before: Report, after: Report, full: dict) -> list:
    """The first run's verified advice against this comparison: each measured item with
    its predicted and measured speed-up, and, when the second run has that item's loader
    settings, the full pipeline's change between the runs (the same figure, measured in
    two runs instead of alternating visits)."""
    out = []
    for a in before.advice:
        v = a.verified
        if v is None or not v.settings or v.speedup is None:
            continue
        loader_part = {k: x for k, x in v.settings.items() if k in outcome.LOADER_SETTINGS}
        applied = bool(loader_part) and all(after.loader.get(k) == x for k, x in loader_part.items())
        spread = full.get("threshold_rel")
        out.append({"item": a.kind, "settings": v.settings, "status": v.status, "predicted": v.predicted,
                    "measured": v.speedup, "measured_spread": v.spread, "measured_low": v.low,
                    "measured_high": v.high, "applied": applied,
                    "this_comparison": full["ratio"] if applied else None,
                    "this_comparison_spread": round(math.expm1(spread), 4) if applied and spread is not None else None})
    return out


def _ceiling(before: Report, after: Report) -> tuple:
    """The most downstream point measured in both runs (the step without the loader, which
    no loader setting changes) and the full pipeline as a share of it, before and after.
    When the ceiling itself changed beyond the noise with the same batch size, the machine
    (or the step) changed between the runs: the warning says so, and the share of the
    ceiling is the fairer comparison of the loader settings."""
    for name in ("device", "host", "collated"):
        b, a = before.throughput(name), after.throughput(name)
        if b is not None and a is not None:
            break
    else:
        return None, None, None
    change = {"point": name, **point_change(b, a)}
    fb, fa = before.throughput("full"), after.throughput("full")
    share = None
    if fb is not None and fa is not None:
        share = [round(fb.samples_per_sec / b.samples_per_sec, 4), round(fa.samples_per_sec / a.samples_per_sec, 4)]
    warning = None
    if change["real"] and before.batch_size == after.batch_size:
        warning = (f"the ceiling ({name}: the step alone, which no loader setting changes) is {change['label']} in "
                   "the second run: the machine's load or the step changed between the runs, so raw throughput "
                   "changes mix that in; compare the full pipeline's share of the ceiling")
    return change, share, warning


def to_text(c: dict) -> str:
    from tabulate import tabulate

    lines = []
    b0, b1 = c["bottleneck"]
    lines.append(f"bisect-pipeline compare: bottleneck {b0} -> {b1}"
                 + ("" if c["batch_size"][0] == c["batch_size"][1]
                    else f"; batch size {c['batch_size'][0]} -> {c['batch_size'][1]}")
                 + ("" if c["device"][0] == c["device"][1] else f"; device {c['device'][0]} -> {c['device'][1]}"))
    if c["loader_changes"]:
        lines.append("loader: " + ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in c["loader_changes"].items()))
    rows = [[p["point"], _f(p["before_samples_per_sec"]), _f(p["after_samples_per_sec"]), p["label"]] for p in c["points"]]
    lines += ["", tabulate(rows, headers=["point", "before samples/s", "after samples/s", "change"],
                           colalign=("left", "right", "right", "left"), disable_numparse=True)]
    srows = [[s["stage"], _f(s["before_ms_per_batch"], 2, s["before_significant"]),
              _f(s["after_ms_per_batch"], 2, s["after_significant"]), s["label"]] for s in c["stages"]]
    lines += ["", tabulate(srows, headers=["stage", "before ms/batch", "after ms/batch", "change"],
                           colalign=("left", "right", "right", "left"), disable_numparse=True)]
    lines += _parts_text(c.get("parts") or [])
    full = c["full"]
    lines.append("")
    if full["ratio"] is None:
        lines.append("The full pipeline was not measured in both runs.")
    elif full["real"]:
        lines.append(f"Full pipeline: {full['label']} ({full['before_samples_per_sec']:,.1f} -> "
                     f"{full['after_samples_per_sec']:,.1f} samples/s).")
    elif full["real"] is None:
        lines.append(f"Full pipeline: {full['before_samples_per_sec']:,.1f} -> {full['after_samples_per_sec']:,.1f} "
                     f"samples/s; no noise estimate (fewer than {MIN_WINDOWS} windows in a run): rerun with a larger "
                     "--max-seconds.")
    else:
        lines.append(f"Full pipeline: within noise ({full['before_samples_per_sec']:,.1f} -> "
                     f"{full['after_samples_per_sec']:,.1f} samples/s, \u00d7{full['ratio']:.2f}).")
    share = c.get("share_of_ceiling")
    if share:
        lines.append(f"Full pipeline as a share of the ceiling ({c['ceiling']['point']}): {share[0] * 100:.0f}% -> "
                     f"{share[1] * 100:.0f}%.")
    for a in c.get("advice_checked", []):
        pred = f", predicted up to {a['predicted']:.2f}\u00d7" if a.get("predicted") else ""
        around = outcome.interval(outcome.Outcome(low=a.get("measured_low"), high=a.get("measured_high")))
        spread = f" ({around})" if around else ""
        line = (f"Advice of the first run, {outcome.settings_text(a['settings'])}: measured {a['measured']:.2f}\u00d7"
                f"{spread} ({a['status']}){pred}")
        if a["applied"] and a.get("this_comparison") is not None:
            band = (f" (\u00b1{a['this_comparison_spread'] * 100:.0f}%)"
                    if a.get("this_comparison_spread") is not None else "")
            line += f"; this comparison: {a['this_comparison']:.2f}\u00d7{band}"
        lines.append(line + ".")
    if c.get("warning"):
        lines.append(f"Warning: {c['warning']}.")
    lines.append(f"Rule: {c['rule']}.")
    return "\n".join(lines)


def _parts_text(parts: list) -> list:
    """The parts inside the stages, before and after (none: no lines)."""
    from tabulate import tabulate

    if not parts:
        return []
    rows = [[p["stage"], p["part"], p["unit"], _f(p["before_ms"], 2), _f(p["after_ms"], 2), p["label"]] for p in parts]
    return ["", "Inside the stages (timed alone in each run; these changes have no noise estimate)",
            tabulate(rows, headers=["stage", "part", "unit", "before", "after", "change"],
                     colalign=("left", "left", "left", "right", "right", "left"), disable_numparse=True)]


def _f(x: Optional[float], nd: int = 1, significant: Optional[bool] = None) -> str:
    if x is None:
        return "-"
    return f"{x:,.{nd}f}" + (" (noise)" if significant is False else "")


def main(before_path: str, after_path: str, json_path: Optional[str] = None) -> int:
    import click

    from .report import write_atomic

    try:
        c = compare(load(before_path), load(after_path))
    except BisectError as exc:
        click.echo(f"bisect-pipeline: error: {exc}", err=True)
        return exc.exit_code
    if json_path:
        write_atomic(json_path, json.dumps(c, indent=2) + "\n")
    click.echo(to_text(c))
    return 0
