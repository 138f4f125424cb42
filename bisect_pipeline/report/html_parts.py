"""The HTML report's "Inside the stage" (html.py): one table of bars per block, one scale
each; apart from the page, each block reads its own kind of isolated measurement into bars.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..core.results import ITERATOR_PART
from ..derive.findings import Diagnosis
from ..derive.verdict import in_question
from . import plot as plot_mod, text_inside
from .figures import esc

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
                  tuple(bars), tuple(x for x in (text_inside.breakdown_sum(b), text_inside.in_place(aug)) if x),
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
    read, decode, through = sp.read_ms_per_sample, sp.decode_ms_per_sample, sp.iterator_ms_per_sample
    total = (read or 0.0) + (decode or 0.0) + (through or 0.0)
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
    colors = {k: _top_color(bottleneck) if sp.bound == k else plot_mod.BAR_COLOR for k in ("read", "decode", "iterator")}
    bars = (_Bar("read from storage", read, ", ".join(got), share=share(read),
                 kind="top" if sp.bound == "read" else "part", color=colors["read"]),
            _Bar("decode and the rest", decode, "loading minus reading: decoding and the dataset's own work",
                 share=share(decode), kind="top" if sp.bound == "decode" else "part", color=colors["decode"]))
    if through is not None:
        bars += (_Bar("through its iterator", through, ITERATOR_PART, share=share(through),
                      kind="top" if sp.bound == "iterator" else "part", color=colors["iterator"]),)
    notes = []
    if sp.bound in ("read", "decode", "iterator"):
        on = f" (over {sp.samples} samples)" if sp.samples else ""
        notes.append({"read": "Reading the bytes", "iterator": "Getting the samples through the iterator"}.get(
            sp.bound, "Decoding and the dataset's own work")
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
    out = [f'<h4 class="parts" data-stage="{esc(b.stage)}">{esc(b.title)}</h4>']
    if b.bars:
        scale = max([x.ms for x in b.bars if x.ms is not None and x.ms > 0] or [1.0])
        rows = "".join(_bar_row(x, scale, b.unit) for x in b.bars)
        out.append('<div class="wrap"><table class="parts"><colgroup><col class="name"/><col class="ms"/>'
                   '<col class="share"/><col class="bar"/><col/></colgroup><thead><tr><th>part</th>'
                   f'<th class="num">{esc(b.unit)}</th><th class="num">share</th><th></th><th>{esc(b.detail)}</th>'
                   "</tr></thead><tbody>" + rows + "</tbody></table></div>")
    out.extend(f'<p class="parts-note">{esc(n)}</p>' for n in b.notes)
    return "".join(out)


def _bar_row(x: _Bar, scale: float, unit: str) -> str:
    where = f'<span class="where">{esc(x.where)}</span>' if x.where else ""
    value = "-" if x.ms is None else f"{x.ms:.2f}"
    share = "-" if x.share is None else f"{x.share * 100:.0f}%"
    if x.ms is None:
        bar = ""
    else:
        w = max(x.ms, 0.0) / scale * PART_BAR_W
        tip = f"{x.label}: {value} {unit}" + ("" if x.share is None else f" ({share})")
        bar = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{PART_BAR_W}" height="{PART_BAR_H}" '
               f'viewBox="0 0 {PART_BAR_W} {PART_BAR_H}" role="img" aria-label="{esc(tip)}">'
               f'<rect class="part-bar {esc(x.kind)}" data-part="{esc(x.label)}" x="0" y="0" width="{w:.1f}" '
               f'height="{PART_BAR_H}" fill="{x.color}" rx="2"><title>{esc(tip)}</title></rect></svg>')
    cls = "" if x.kind in ("part", "top") else f' class="{esc(x.kind)}"'
    return (f"<tr{cls}><td>{esc(x.label)}{where}</td><td class=\"num\">{value}</td><td class=\"num\">{share}</td>"
            f'<td class="part-bar">{bar}</td><td class="text">{esc(x.detail)}</td></tr>')
