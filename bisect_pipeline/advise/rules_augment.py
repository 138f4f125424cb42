"""Advice rules for an augment bottleneck: the costliest transforms with what makes each kind
cheaper (breakdown.py), and the moves after a crop that were timed (reorder.py). Separate
from the other stages' rules: its remedies are per transform, from the stage's breakdown."""

from __future__ import annotations

from typing import Optional

from .context import Context, headroom, rounded
from .wording import finding


# The augment finding names the costliest transforms (isolated.augment.breakdown): the
# fewest that make up this share of the parts' sum, at most PARTS_NAMED of them.
PARTS_NAMED_SHARE = 0.5
PARTS_NAMED = 3
# A resize or crop that keeps at most 1 / this of its input's pixels works on images
# larger than the step needs: storing them smaller (or decoding them smaller) saves it.
SHRINK_RATIO = 2.0


def augment(c: Context):
    """An augment bottleneck -> the transforms found, with their isolated cost, and the
    costliest of them by name (isolated.augment.breakdown) with a remedy where one is
    known for its kind."""
    if c.b != "augment" or not c.significant("augment"):
        return None
    ms = c.cost_ms("augment")
    aug = c.part("augment")
    per_sample = aug.ms_per_sample if aug is not None else None
    found = list(c.r.cache.raw_transforms or ())
    numbers = {"augment_ms_per_batch": rounded(ms), "isolated_ms_per_sample": per_sample,
               "transforms": found, "num_workers": c.workers}
    which = ", ".join(found) or ("the graph's Mapper functions" if c.nodes else "the dataset's transforms")
    parts, named = _costliest_parts(aug.breakdown if aug is not None else None)
    if parts:
        numbers["parts"] = parts
    generic = ("" if any(p["remedy"] for p in parts) else
               " Move work that is the same every epoch (decode, resize) to data preparation, crop before expensive "
               "ops, and run tensor transforms batched on the device inside the step.")
    confirmed = _confirmed(aug.breakdown if aug is not None else None)
    if confirmed:
        numbers["confirmed"] = confirmed
    numbers["headroom"] = headroom(c, "augment")
    # augment's cost and headroom are the verdict's own figures, and the costliest transform
    # measured in the pipeline is the breakdown's (confirmed): each said once, elsewhere
    if parts:
        names = [p["name"] for p in parts]
        total = parts[0]["ms_per_sample"] / parts[0]["share"] if parts[0]["share"] else None
        action = f"Make {names[0] if len(names) == 1 else ', '.join(names[:-1]) + ' and ' + names[-1]} cheaper"
        figure = (f"{'it takes' if len(names) == 1 else 'they take'} {sum(p['ms_per_sample'] for p in parts):.2f} of "
                  f"the {total:.2f} ms per sample the transforms take timed one by one") if total else None
    else:
        action = f"Make {which} cheaper"
        figure = f"{per_sample:.2f} ms per sample alone" if per_sample is not None else None
    return finding("augment", "augment", action, named + generic, numbers, figure=figure)


def _confirmed(b) -> Optional[dict]:
    """The numbers of the costliest transform measured in the pipeline (confirm.py), where
    it was and its cost is real; else None."""
    cf = b.confirmed if b is not None and b.ok else None
    if cf is None or not cf.ok or not cf.real:
        return None
    return {"transform": cf.transform, "where": cf.where, "measured_ms_per_batch": cf.measured_ms_per_batch,
            "tolerance_ms": cf.tolerance_ms, "predicted_ms_per_batch": cf.predicted_ms_per_batch}


def _costliest_parts(b) -> tuple[list, str]:
    """The costliest transforms of the breakdown (the fewest making up PARTS_NAMED_SHARE
    of the timed sum, at most PARTS_NAMED), as numbers and as sentences naming each with
    its cost, share and remedy; nothing with fewer than two transforms timed."""
    timed = [row for row in (b.rows or ()) if row.ok and row.ms_per_sample is not None] if b is not None and b.ok else []
    total = sum(row.ms_per_sample for row in timed)
    if len(timed) < 2 or total <= 0:
        return [], ""
    chosen, share = [], 0.0
    for row in sorted(timed, key=lambda x: -x.ms_per_sample)[:PARTS_NAMED]:
        chosen.append(row)
        share += row.ms_per_sample / total
        if share >= PARTS_NAMED_SHARE:
            break
    of = f"{total:.2f} ms/sample" + ("" if len(timed) == len(b.rows) else " timed (not every transform was)")
    parts, text = [], []
    for row in chosen:
        remedy = _part_remedy(row, b.reorders)
        parts.append({"name": row.name, "where": row.where, "ms_per_sample": row.ms_per_sample,
                      "share": rounded(row.ms_per_sample / total, 4), "input": row.input, "output": row.output,
                      "remedy": remedy})
        text.append(f" {row.name} ({row.where}) costs {row.ms_per_sample:.2f} of {of} "
                    f"({row.ms_per_sample / total * 100:.0f}%)" + (f": {remedy}." if remedy else "."))
    return parts, "".join(text)


# What makes a transform of each kind cheaper, by class name (torchvision v1 and v2).
RESIZES = frozenset({"Resize", "RandomResizedCrop", "RandomResize", "RandomShortestSize", "ScaleJitter"})
AUTO_AUGMENTS = frozenset({"AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix"})
# per pixel (or a small neighbourhood): the same after a crop, on fewer pixels
PIXELWISE = frozenset({"ColorJitter", "RandomPhotometricDistort", "RandomAdjustSharpness", "RandomAutocontrast",
                       "RandomEqualize", "RandomPosterize", "RandomSolarize", "RandomGrayscale", "Grayscale",
                       "RandomInvert", "GaussianBlur", "GaussianNoise"})
# warps: after a crop they would bring the borders in, so only batched on the device
WARPS = frozenset({"RandomRotation", "RandomAffine", "RandomPerspective", "ElasticTransform"})
TO_FLOAT = frozenset({"Normalize", "ToDtype", "ConvertImageDtype"})
ON_DEVICE = ("run it batched on the device inside the step (torchvision v2 transforms take batched tensors; "
             "one random draw per batch)")


def _part_remedy(row, reorders: Optional[tuple] = None) -> Optional[str]:
    """What makes this transform cheaper, by its class name, or None when nothing
    specific is known (the finding then says what to do in general); a move after a crop
    that was timed (`reorders`, reorder.py) is said with what it saved; an untimed one is
    never offered (reorder.py's table decides what may move: a warp or an albumentations
    transform between the op and the crop would change what the model sees)."""
    name = row.name
    if name in RESIZES:
        before, after = _pixels(row.input), _pixels(row.output)
        if before and after and before >= SHRINK_RATIO * after:
            return (f"it shrinks {row.input} to {row.output}, so store the images pre-resized near that size, or "
                    "decode them at a reduced size (PIL's Image.draft for JPEG)")
        return None
    if name in AUTO_AUGMENTS:
        return "use fewer ops or a lower magnitude (num_ops, magnitude), or " + ON_DEVICE
    if name in WARPS:
        return ON_DEVICE
    if name in PIXELWISE:
        blur = "use a smaller kernel_size, " if name == "GaussianBlur" else ""
        timed = next((x for x in reorders or () if name in (x.transform or "").split(", ")
                      and row.where in (x.where or "")), None)
        if timed is not None and timed.real is not None and timed.saving_ms_per_sample is not None:
            if timed.real:  # the move was timed (reorder.py): its saving, not a guess
                return (f"{blur}move it after {timed.after} ({timed.after_where}): on the same inputs that saved "
                        f"{timed.saving_ms_per_sample:.2f} ms per sample; or " + ON_DEVICE)
            return f"{blur}{ON_DEVICE}; moved after {timed.after} it saved nothing beyond the noise"
        return f"{blur}{ON_DEVICE}"
    if name in TO_FLOAT:
        return ("do it on the device inside the step: keep the batch uint8 through the loader (less to copy), then "
                "convert and normalize it there")
    if name == "ToTensor":
        return ("use PILToTensor (uint8) instead, and convert to float and normalize on the device inside the "
                "step")
    return None


def _pixels(described: Optional[str]) -> Optional[int]:
    """Pixels of an image as breakdown.describe wrote it: "500x375 RGB" (a PIL image, W x
    H) or "3x224x224 uint8" (a tensor, the last two dimensions); None when not an image."""
    head = (described or "").split(",")[0].split(" ")[0]
    try:
        dims = [int(d) for d in head.split("x")]
    except ValueError:
        return None
    return dims[-1] * dims[-2] if len(dims) >= 2 else None


# Transforms whose result depends on a statistic of the whole image (reorder.MOVABLE's
# "statistics"): moved after a crop, the statistic is the crop's.
_IMAGE_STATISTICS = {"ColorJitter": "ColorJitter's contrast (when set) blends with the image's mean",
                     "RandomAutocontrast": "RandomAutocontrast stretches the image's range",
                     "RandomEqualize": "RandomEqualize flattens the image's histogram",
                     "RandomPhotometricDistort": "RandomPhotometricDistort's contrast blends with the image's mean"}


def reorder(c: Context):
    """An augment bottleneck whose photometric transforms run on more pixels than a later
    crop keeps, found faster moved after it on the same inputs (reorder.py) -> the move,
    with both timings. Measured transform by transform in this process: the tool cannot
    reorder the user's transforms, so the full pipeline's gain is not checked (no
    `recommended`: verified stays empty, as for the augment item)."""
    if c.b != "augment" or not c.significant("augment"):
        return None
    aug = c.part("augment")
    b = aug.breakdown if aug is not None else None
    items = c.r.isolated.items_per_batch if c.r.isolated is not None else None
    out = []
    for r in (b.reorders or () if b is not None and b.ok else ()):
        if not r.real:
            continue
        per_batch = r.saving_ms_per_sample * items if items else None
        batch = f", {per_batch:.1f} ms per batch of {items:g}" if per_batch is not None else ""
        fewer = (f"; it then runs on {r.pixels_after:,} pixels instead of {r.pixels_before:,}"
                 if r.pixels_before and r.pixels_after else "")
        tol = f"\u00b1 {r.tolerance_ms:.2f}" if r.tolerance_ms is not None else "(noise unknown)"
        order = f" New order: {', '.join(r.order)}." if r.order else ""
        stats = [_IMAGE_STATISTICS[n] for n in r.transform.split(", ") if n in _IMAGE_STATISTICS]
        caveat = (" " + "; ".join(stats) + ": after the move, the crop's (the usual recipes' order)." if stats else "")
        out.append(finding("reorder", "augment", f"Move {r.transform} ({r.where}) after {r.after} ({r.after_where})", (
            f"{r.ms_per_sample:.2f} \u2192 {r.reordered_ms_per_sample:.2f} ms per sample on the same inputs{fewer}."
            f"{order}{caveat} Timed alone in this process, alternating both orders; the tool cannot reorder your "
            "transforms, so the full pipeline's gain is not checked: check it with compare (a run before and after)."),
            {"transform": r.transform, "where": r.where, "after": r.after, "after_where": r.after_where,
             "order": list(r.order or ()), "ms_per_sample": r.ms_per_sample,
             "reordered_ms_per_sample": r.reordered_ms_per_sample, "saving_ms_per_sample": r.saving_ms_per_sample,
             "tolerance_ms": r.tolerance_ms, "samples": r.samples, "items_per_batch": items,
             "saving_ms_per_batch": rounded(per_batch), "pixels_before": r.pixels_before, "pixels_after": r.pixels_after},
            figure=f"saves {r.saving_ms_per_sample:.2f} {tol} ms per sample{batch}"))
    return out
