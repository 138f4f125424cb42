"""The text report's sections inside a stage, shown when the stage is in question: the
augment stage transform by transform (breakdown.py, with the reorders and the costliest
transform measured in the pipeline) and load split into read and decode (reads.py)."""

from __future__ import annotations

from ..advise import wording
from ..core.results import ITERATOR_PART, MERGED_WITH_LOAD
from ..derive.findings import Diagnosis
from ..derive.verdict import in_question
from .text_layout import table as _table, wrap as _wrap


def breakdown_lines(r: "Diagnosis", every: bool = False) -> list:
    """When augment is in question (verdict.in_question: named, or tied for the lead; or
    `every` time): its transforms one by one (breakdown.py), as a table, and whether they
    add up to the stage replayed whole."""
    iso = r.isolated
    shown = every or "augment" in in_question(r.verdict)
    aug = iso.part("augment") if iso is not None and shown else None
    b = aug.breakdown if aug is not None else None
    if b is None or not b.ok or not b.rows:
        return []
    rows = []
    for row in b.rows:
        if not row.ok:
            rows.append([row.name, "-", "-", f"{row.status}: {row.reason}" if row.reason else row.status])
            continue
        ran = f"{row.input} -> {row.output}" if row.input is not None else "-"
        ran += f"; ran on {row.ran} of {row.samples} samples" if row.ran is not None and row.ran < row.samples else ""
        ran += f"; {row.note}" if row.note else ""
        rows.append([row.name, f"{row.ms_per_sample:.2f}", "-" if row.share is None else f"{row.share * 100:.0f}%",
                     ran])
    lines = _table("The augment stage transform by transform (isolated, times in ms per sample)",
                   ["transform", "ms", "share", "ran on -> returned"], rows, "lrrl")
    for line in (breakdown_sum(b), in_place(aug)):
        lines += _wrap(line, rest="  ") if line else []
    advised = {(f.numbers.get("transform"), f.numbers.get("where")) for f in r.advice if f.kind == "reorder"}
    for line in _reorder_lines(b, every, advised) + [_confirmed(r, b.confirmed)]:
        lines += _wrap(line, rest="  ") if line else []
    return lines


def _confirmed(r: "Diagnosis", c) -> str:
    """The costliest transform measured in the pipeline (confirm.py), beside its prediction."""
    if c is None:
        return ""
    workers = (r.loader or {}).get("num_workers")
    where = f" with num_workers={workers}" if workers is not None else ""
    if not c.ok:
        what = f"{c.transform} ({c.where})" if c.transform else "the costliest transform"
        return f"In the pipeline{where}: {what} not measured ({c.status}: {c.reason or ''})."
    pm = f" ± {c.tolerance_ms:.1f}" if c.tolerance_ms is not None else ""
    verdict = "" if c.real else " (within the noise: no real cost)"
    predicted = (f"; predicted from its isolated cost: {c.predicted_ms_per_batch:.1f}"
                 if c.predicted_ms_per_batch is not None else "")
    return (f"In the pipeline{where}: {c.transform} ({c.where}) costs the loop {c.measured_ms_per_batch:.1f}{pm} ms "
            f"per batch{verdict} ({c.with_ms_per_batch:.1f} with it, {c.without_ms_per_batch:.1f} from its cached "
            f"output, {c.windows} windows){predicted}.")


def _reorder_lines(b, every: bool, advised: set = frozenset()) -> list:
    """One line per reorder found faster (reorder.py) that no advice item already says
    (`advised`: (transform, where) of the reorder items); with `every`, the ones that
    were not faster beyond the noise too."""
    out = []
    for r in b.reorders or ():
        if r.real and (r.transform, r.where) in advised:
            continue
        head = f"Reorder: move {r.transform} after {r.after}: {r.ms_per_sample:.2f} \u2192 " \
               f"{r.reordered_ms_per_sample:.2f} ms/sample"
        tol = f" \u00b1 {r.tolerance_ms:.2f}" if r.tolerance_ms is not None else "; too few samples for the noise"
        if r.real:
            out.append(f"{head} (saves {r.saving_ms_per_sample:.2f}{tol}, on the same {r.samples} inputs).")
        elif every:
            out.append(f"{head}: not faster beyond the noise ({r.saving_ms_per_sample:+.2f}{tol}).")
    return out


def in_place(aug) -> str:
    """What augment's cost alone is where it was timed in the dataset's own calls, unlike
    the breakdown's rows and whole (replayed on the cached inputs)."""
    if aug.alone_ms_per_sample is None:
        return ""
    return (f"Where the dataset calls them, in its own __getitem__, the transforms took {aug.ms_per_sample:.2f} "
            "ms/sample: augment's cost alone. The rows are replayed on the cached inputs.")


def breakdown_sum(b) -> str:
    if b.sum_ms_per_sample is None:
        return "Not every transform was timed within the budget: the parts have no sum."
    head = f"Sum {b.sum_ms_per_sample:.2f} over {b.samples} sample{'s' if b.samples != 1 else ''}"
    if b.agrees is None:
        return head + "."
    whole = f"the stage replayed whole {b.augment_ms_per_sample:.2f}"
    if b.agrees:
        return f"{head}; {whole}: they agree (within ±{b.tolerance_ms:.2f})."
    return (f"{head}; {whole}: they disagree by more than the noise (±{b.tolerance_ms:.2f}): a transform's cost may "
            "depend on what ran with it, or the machine was busy.")


def split_lines(r: "Diagnosis", every: bool = False) -> list:
    """When load is in question (named, or tied for the lead; or `every` time): load
    split into reading files and decoding (reads.py), as a table, and which to attack;
    or one line saying why not."""
    iso = r.isolated
    load = iso.part("load") if iso is not None and (every or "load" in in_question(r.verdict)) else None
    s = load.split if load is not None else None
    if s is None:
        return []
    if not s.ok:
        return _wrap(f"Load could not be split into read and decode: {s.reason or s.status}.", rest="  ")
    total = s.read_ms_per_sample + s.decode_ms_per_sample + (s.iterator_ms_per_sample or 0.0)
    share = (lambda ms: "-" if total <= 0 else f"{ms / total * 100:.0f}%")
    rate = "-" if s.read_mb_per_s is None else f"{s.read_mb_per_s:,.1f} MB/s"
    rows = [["read", f"{s.read_ms_per_sample:.2f}", share(s.read_ms_per_sample),
             f"{rate}, {wording.size_text(s.bytes_per_sample)} per sample, {s.files_per_sample:g} file(s)"],
            ["decode", f"{s.decode_ms_per_sample:.2f}", share(s.decode_ms_per_sample),
             "decoding and the dataset's other work" + "".join(f", {MERGED_WITH_LOAD[x]} too" for x in (load.includes or ())
                                                              if x in MERGED_WITH_LOAD)]]
    if s.iterator_ms_per_sample is not None:
        rows.append(["iterator", f"{s.iterator_ms_per_sample:.2f}", share(s.iterator_ms_per_sample), ITERATOR_PART])
    lines = _table(f"Load split into read and decode (isolated, {s.samples} samples, times in ms per sample)",
                   ["part", "ms", "share", "what"], rows, "lrrl")
    attack = {"read": "storage: fewer, larger files, faster storage, fewer bytes",
              "iterator": "the streaming dataset's iteration: its shards and its own settings",
              }.get(s.bound, "decoding: decode once at preparation, reduced-size decoding, torchvision.io.decode_jpeg")
    lines += _wrap(f"{s.bound.capitalize()} is the larger part: attack {attack}. Files came from the page cache "
                   "(the tool had just read them): a cold first epoch reads slower.", rest="  ")
    return lines
