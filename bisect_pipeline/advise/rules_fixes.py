"""Advice rules for the pipeline's own fixes: the device tail, decode by torchvision, and
random transforms batched on the device. Each item is a modified copy of the user's
pipeline and step that the advice's check built and compared with the user's batches
before timing it (fixes.py: measure/tail.py, measure/decode.py), then times as loader
settings are timed (verify.py, the settings {"fix": kind}). Separate from the stages'
rules (rules_*.py), which change loader settings or say what to do by hand: these say
what a fix moved, how it was checked, and, where its check refused it, why.

When each speaks (the verdict's stages in question, derive.verdict.in_question):
- `device_tail`: any stage the workers or the batch's bytes pay for (load, augment,
  collate, handoff, transfer): the tail's work leaves the workers and its bytes shrink;
- `decode`: load;
- `device_augment`: augment. It changes the augmentation (one random draw per batch): it
  is said so, and never the first change on its own (report/summary.first_item).
"""

from __future__ import annotations

from typing import Optional

from ..core.fixes import DECODE, DEVICE_AUGMENT, DEVICE_TAIL, Fix
from ..derive.verdict import in_question
from .context import Context, headroom
from .outcome import outcome
from .wording import finding, size_text

# The stages each fix can make cheaper.
TAIL_STAGES = ("load", "augment", "collate", "handoff", "transfer")
CHECK_BY_HAND = "Check it with compare: a run before the change and one after."


def fixes_of(c: Context) -> dict:
    """The fixes the check built, by kind (verification.fixes)."""
    v = c.r.verification
    return {f.kind: f for f in (getattr(v, "fixes", None) or ())}


def measured(c: Context, kind: str) -> bool:
    """Whether the check measured the fix (a trial that is not `not measured`): its
    figure then heads the item, not the fix's own (the payload it saves)."""
    v = c.r.verification
    return any(t.item == kind and outcome(t, c.r.batch_size).status != "not measured" for t in getattr(v, "trials", ()))


def _stage(c: Context, stages: tuple) -> Optional[str]:
    return next((s for s in in_question(c.r.verdict) if s in stages), None)


def names(items: tuple) -> str:
    """'A', 'A and B', 'A, B and C'."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def code_text(fix: Fix) -> str:
    """The change as code, on one line (the report's paragraph)."""
    lines = [line.split("  #")[0].strip() for line in (fix.code or "").splitlines()]
    return "; ".join(line for line in lines if line)


def syncs_text(fix: Fix) -> str:
    """The host-device syncs the tail (or decode on the device) adds per batch on CUDA,
    where it adds any (counted on a batch on the device, as the step's are)."""
    syncs = fix.syncs or {}
    if not syncs.get("per_step"):
        return ""
    sites = ", ".join(f"{x['where']} ({x['count']}x)" for x in (syncs.get("sites") or ())[:3])
    moved = "the decode and the moved transforms" if fix.device is not None else "the moved transforms"
    return (f" On the device {moved} synchronize host and device {syncs['per_step']:g} time(s) per batch"
            + (f" (at {sites})" if sites else "") + ", in the step's timed window as the step's own syncs are.")


def device_tail(c: Context):
    """A usable device tail where a stage it can make cheaper is in question -> the move,
    with what its check compared and the payload it saves; a tail whose check refused it
    -> why it is not offered."""
    fix, stage = fixes_of(c).get(DEVICE_TAIL), _stage(c, TAIL_STAGES)
    if fix is None or stage is None or fix.status == "unavailable":
        return None
    moved = names(fix.moved)
    if not fix.usable:
        return refused(fix, stage, f"Moving {moved} to the device")
    before, after = fix.before or {}, fix.after or {}
    figure, payload = None, ""
    if before.get("bytes") and after.get("bytes") and after["bytes"] < before["bytes"]:
        ratio = before["bytes"] / after["bytes"]
        if not measured(c, DEVICE_TAIL):
            figure = f"{ratio:.3g}x less payload ({size_text(before['bytes'] - after['bytes'])} less per batch)"
        payload = (f" The workers then hand over {after['dtype']} {after.get('shape')} ({size_text(after['bytes'])}) "
                   f"instead of {before['dtype']} ({size_text(before['bytes'])})"
                   + (", and the transfer carries that." if c.cuda else "."))
    why = (f"{moved} end {fix.where} and give the same result on a batch: built both ways on {fix.samples} cached samples "
           f"before timing, the largest difference {fix.max_difference:.3g} (tolerance {fix.tolerance:.2g})."
           f"{payload}{syncs_text(fix)} In code: {code_text(fix)}.")
    return finding(DEVICE_TAIL, stage, f"Run {moved} batched on the device inside the step, not in the workers", why,
                   _numbers(c, fix, stage), figure=figure, check=CHECK_BY_HAND)


def decode(c: Context):
    """A usable decode by torchvision where load is in question -> the swap, with what its
    check compared; one its check refused -> why it is not offered."""
    fix, stage = fixes_of(c).get(DECODE), _stage(c, ("load",))
    if fix is None or stage is None or fix.status == "unavailable":
        return None
    if not fix.usable:
        return refused(fix, stage, "Decoding the images with torchvision instead of PIL")
    level = fix.level or 1.0
    compared = (f"built both ways on {fix.samples} samples before timing, the shapes equal and the values within "
                f"{fix.mean_difference / level:.2f} grey levels on average (the largest difference "
                f"{fix.max_difference / level:.1f}: a resize interpolates a tensor slightly differently from a PIL "
                "image")
    if fix.device is not None:  # measure/decode_device.py
        moved = tuple(m for m in fix.moved if m != "PIL decode")
        why = (f"{fix.where} decodes with PIL in the workers. Here the workers only read the files; each batch's JPEGs "
               f"are decoded together on {fix.device} by torchvision.io.decode_jpeg (nvJPEG on CUDA), and your "
               f"transforms ({names(moved)}) run there on each image, drawing as the workers do: {compared}, and "
               f"nvJPEG may round differently from libjpeg-turbo).{syncs_text(fix)} In code: {code_text(fix)}.")
        return finding(DECODE, stage, "Decode the JPEGs batched on the device with torchvision.io.decode_jpeg and run "
                       "your transforms there, not PIL in the workers", why, _numbers(c, fix, stage),
                       check=CHECK_BY_HAND)
    why = (f"{fix.where} decodes with PIL. torchvision's decoder gives the same images to your transforms, as uint8 "
           f"tensors: {compared}). Your transforms become {names(fix.kept)}. In code: {code_text(fix)}.")
    return finding(DECODE, stage, "Decode the images with torchvision.io.decode_jpeg instead of PIL, in the workers",
                   why, _numbers(c, fix, stage), check=CHECK_BY_HAND)


def device_augment(c: Context):
    """A usable random candidate where augment is in question -> the move, said for what it
    is: a change in the augmentation, one random draw per batch."""
    fix, stage = fixes_of(c).get(DEVICE_AUGMENT), _stage(c, ("augment",))
    if fix is None or stage is None or not fix.usable:
        return None
    others = [m for m in fix.moved if m not in fix.random]
    also = f", with {names(tuple(others))} after them" if others else ""
    why = (f"This changes your augmentation: every image of a batch gets the same draw of {names(fix.random)} (the "
           "same crop, flip or colour change), where your workers draw for each image. The choice is yours; it is "
           f"measured so that you know what it buys, and it is never the first change on its own. Checked on "
           f"{fix.samples} cached samples before timing: the batches' shapes and dtypes are yours. In code: "
           f"{code_text(fix)}.")
    numbers = dict(_numbers(c, fix, stage), changes_augmentation=True)
    return finding(DEVICE_AUGMENT, stage, f"Run {names(fix.random)} batched on the device inside the step{also}, "
                   "one random draw per batch instead of per sample", why, numbers, check=CHECK_BY_HAND)


def _numbers(c: Context, fix: Fix, stage: str) -> dict:
    return {"fix": fix.to_dict(), "recommended": {"fix": fix.kind}, "headroom": headroom(c, stage)}


def refused(fix: Fix, stage: str, what: str):
    """A fix its check refused (the batches differ) or could not build (it raised): not
    offered, and why; never the first change (numbers: refused)."""
    if fix.ok:
        seen = (f"built both ways on {fix.samples} cached samples, the batches differ: {fix.mismatch}")
    else:
        seen = fix.reason or "it could not be built"
    return finding(fix.kind, stage, f"{what} was checked and is not offered", f"Before any timing, {seen}.",
                   {"fix": fix.to_dict(), "refused": True})
