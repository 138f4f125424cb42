"""Advice rules for the batch: how it is built (collate: the samples' structure, the function's
own work), handed over by the workers (handoff) and copied to the device (pin_memory, a uint8
payload). Separate from the per-sample stages' rules (load, augment) and the workers' settings."""

from __future__ import annotations

from typing import Optional

from ..core.results import BatchShape, Collate, SampleStructure
from .context import MIN_ACTIONABLE_SHARE, Context, headroom, headroom_text, rounded
from .wording import finding


# A custom collate_fn costing this many times default_collate on the same samples does
# work of its own beyond the batch structure.
OWN_COLLATE_WORK_RATIO = 2.0
# Per-sample structure that makes default_collate slow: Python numbers and lists become
# one tensor per position, numpy arrays are converted one by one, many small tensors are
# stacked one by one.
MANY_NUMBERS = 8
MANY_TENSORS = 8
# Bytes per element saved by sending uint8 instead of a floating dtype.
_FLOAT_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


def collate(c: Context):
    """A collate bottleneck -> what in the batch structure (or the function) makes it slow."""
    if c.b != "collate" or not c.significant("collate"):
        return None
    ms = c.cost_ms("collate")
    col = c.part("collate") or Collate()
    st = c.part("sample_structure")
    batch = c.part("batch") or BatchShape()
    name = c.lo.get("collate_fn") or col.collate_fn or "collate_fn"
    numbers = {"collate_ms_per_batch": rounded(ms), "collate_fn": name,
               "isolated_ms_per_batch": col.ms_per_batch,
               "default_collate_ms_per_batch": col.default_collate_ms_per_batch,
               "sample_structure": {k: v for k, v in st.to_dict().items() if k != "status"} if st else None,
               "batch_tensors": batch.n_tensors, "batch_bytes": batch.bytes}
    causes = []
    own, dflt = col.ms_per_batch, col.default_collate_ms_per_batch
    if own is not None and dflt is not None and own >= OWN_COLLATE_WORK_RATIO * max(dflt, 1e-3):
        numbers["own_work_ms_per_batch"], numbers["stacking_ms_per_batch"] = rounded(own - dflt), dflt
        head = (f"{name}'s own work is {own - dflt:.1f} of the {own:.1f} ms per batch it costs alone; stacking "
                f"(torch's default_collate on the same samples) {dflt:.2f}: ")
        if col.mixes:
            numbers["mixes"] = list(col.mixes)
            causes.append(head + f"it mixes the batch ({', '.join(col.mixes)}), work on the whole batch that no "
                          "per-sample transform can take over: run it on the device inside the step (torchvision's "
                          "v2 MixUp and CutMix take a batch of tensors there), or keep it in the collate_fn and let "
                          "workers run it (num_workers > 0)")
        else:
            causes.append(head + "the cost is the function's own work (per-sample Python, padding, copies), not the "
                          "batch structure; vectorize it or move it into the dataset's transforms (in the workers)")
    causes.extend(_structure_causes(st or SampleStructure()))
    if not causes and batch.bytes:
        causes.append(f"the batch is {batch.n_tensors} tensor(s), {batch.bytes / 2**20:.1f} MB: collate "
                      "copies every byte once; shrink the payload (uint8, smaller crops) or build the batch in one "
                      "preallocated tensor")
    if not causes:
        return None
    head = numbers["headroom"] = headroom(c, "collate")
    # its cost and its headroom are the verdict's own figures (collate is the bottleneck): said once, above
    alone = f"{own:.1f} ms per batch alone" if own is not None else None
    return finding("collate", "collate", f"Make {name} cheaper", "; ".join(causes) + ".", numbers, figure=alone)


def _structure_causes(st: SampleStructure) -> list:
    """What in one sample makes default_collate slow (worker_stages.sample_structure)."""
    causes = []
    if st.numbers >= MANY_NUMBERS or st.longest_list >= MANY_NUMBERS:
        causes.append(f"each sample carries {st.numbers} Python numbers (longest list {st.longest_list}): "
                      "default_collate builds one tensor per position; return one tensor per field from __getitem__")
    if st.ndarrays:
        causes.append(f"each sample carries {st.ndarrays} numpy array(s), converted one by one: return torch "
                      "tensors (torch.from_numpy) from __getitem__")
    if st.tensors >= MANY_TENSORS:
        causes.append(f"each sample carries {st.tensors} separate tensors, stacked one by one: concatenate them "
                      "into fewer, larger tensors")
    if st.images:
        causes.append(f"{st.images} PIL image(s) per sample reach collate_fn: convert to tensors in the transform")
    if st.strings:
        causes.append(f"{st.strings} string(s) per sample are gathered into Python lists: map them to ids in "
                      "the dataset")
    return causes


def _transfer_ms(c: Context) -> tuple[Optional[float], str]:
    """The transfer cost worth acting on: the bisection's when significant, else the
    isolated one when it is at least MIN_ACTIONABLE_SHARE of t(full)."""
    if c.significant("transfer"):
        return c.stage_ms("transfer"), "bisection (host -> device points)"
    t = c.part("transfer")
    if t is not None and t.ms_per_batch is not None and c.t_full and t.ms_per_batch / 1e3 >= MIN_ACTIONABLE_SHARE * c.t_full:
        return t.ms_per_batch, "isolated copy"
    return None, ""


def pin_memory(c: Context):
    """pin_memory=False with a measured transfer cost -> pin and copy non_blocking."""
    if not c.cuda or c.lo.get("pin_memory"):
        return None
    ms, source = _transfer_ms(c)
    if ms is None:
        return None
    t = c.part("transfer")
    gbs = t.gb_per_s if t is not None else None
    nbytes = t.bytes_per_batch if t is not None else None
    bw = f" at {gbs:.1f} GB/s" if gbs else ""
    size = f" ({nbytes / 2**20:.1f} MB)" if nbytes else ""
    head = headroom(c, "transfer")
    free = "" if c.b == "transfer" else headroom_text(head, "transfer")  # the verdict's own figure: said once
    pin = "Add a PinMemory node after the Batcher" if c.nodes else "Set pin_memory=True"
    return finding("pin_memory", "transfer", pin + " and move batches with .to(device, non_blocking=True)", (
        f"The host-to-device copy of each batch{size} costs {ms:.1f} ms{bw} with pin_memory=False: pageable memory "
        "is copied through a staging buffer and the copy blocks the step; pinned, it overlaps compute." + free),
        {"transfer_ms_per_batch": rounded(ms), "source": source, "gb_per_s": gbs,
         "bytes_per_batch": nbytes, "pin_memory": False, "headroom": head,
         "recommended": {"pin_memory": True, "non_blocking": True}})


def uint8_payload(c: Context):
    """Floating-point images crossing the bus (or the worker handoff) with a measured
    cost there -> send uint8 and convert/normalize on the device."""
    batch = c.part("batch")
    images = [t for t in (batch.tensors or () if batch is not None else ()) if t.image and t.dtype in _FLOAT_BYTES
              and _FLOAT_BYTES[t.dtype] > 1]
    if not images:
        return None
    ms, source = _transfer_ms(c) if c.cuda else (None, "")
    stage = "transfer"
    if ms is None and c.significant("handoff"):
        ms, source, stage = c.stage_ms("handoff"), "bisection (collated -> host points)", "handoff"
    if ms is None:
        return None
    head = headroom(c, stage)  # the most a smaller payload can give: the stage free
    img = max(images, key=lambda t: t.bytes)
    factor = _FLOAT_BYTES[img.dtype]
    saved = img.bytes - img.bytes // factor
    shape = list(img.shape)
    where = "the host-to-device copy" if stage == "transfer" else "the hand-off from workers to the loop"
    return finding("uint8_payload", stage, "Keep images uint8 through the loader; convert and normalize them on the "
                   "device inside the step", (
                       f"{img.path} is a {img.dtype} image batch {shape} ({img.bytes / 2**20:.1f} MB) and {where} "
                       f"costs {ms:.1f} ms per batch. Drop ToTensor/Normalize from the transforms (PILToTensor "
                       "instead)."),
        {"tensor": img.path, "dtype": img.dtype, "shape": shape, "bytes": img.bytes,
         "bytes_saved": saved, "stage_ms_per_batch": rounded(ms), "source": source, "headroom": head},
                   figure=f"{factor}x less payload ({saved / 2**20:.1f} MB less per batch)")


def handoff(c: Context):
    """A handoff bottleneck -> the payload the workers send, with its size."""
    if c.b != "handoff" or not c.significant("handoff"):
        return None
    ms = c.stage_ms("handoff")
    batch = c.part("batch") or BatchShape()
    numbers = {"handoff_ms_per_batch": rounded(ms), "batch_bytes": batch.bytes, "n_tensors": batch.n_tensors,
               "num_workers": c.workers, "pin_memory": c.lo.get("pin_memory")}
    size = (f"Each batch the workers hand over is {batch.n_tensors} tensor(s), {batch.bytes / 2**20:.1f} MB, with "
            f"num_workers={c.workers}: the handoff's cost grows with its bytes." if batch.bytes else
            f"The handoff's cost, with num_workers={c.workers}, grows with the bytes each batch carries.")
    numbers["headroom"] = headroom(c, "handoff")
    pin = (" pin_memory=True pins each batch in the loop's pinning thread: check it against pin_memory=False with "
           "--sweep pin_memory=0,1." if c.lo.get("pin_memory") else "")
    # handoff's cost and headroom are the verdict's own figures (it is the bottleneck): said once, above
    return finding("handoff", "handoff", "Send fewer, more compact tensors from the workers (uint8 instead of "
                   "float, no unused fields)", size + pin, numbers,
                   figure=f"{batch.bytes / 2**20:.1f} MB a batch" if batch.bytes else None)
