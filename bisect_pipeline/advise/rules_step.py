"""Advice rules for the training step itself: a larger batch where GPU memory is unused, the
host-device syncs in the step, and the allocator settings that keep freed memory.
Separate from the input pipeline's rules: these speak for the step, not the loader."""

from __future__ import annotations

from .context import Context, input_bound_class, rounded
from .wording import finding


# Peak GPU memory below this share of the device's memory leaves room for a larger batch
# (half the memory is a safe margin for activations that grow with the batch).
MEMORY_UNUSED_FRACTION = 0.5


def batch_size(c: Context):
    """CUDA, step-bound (not input-bound) and most of the GPU memory unused -> a larger batch."""
    if not c.cuda:
        return None
    mem = c.part("memory")
    frac = mem.fraction if mem is not None else None
    if frac is None or frac >= MEMORY_UNUSED_FRACTION or input_bound_class(c.r) != "not":
        return None
    bs = c.r.batch_size
    room = int(bs * MEMORY_UNUSED_FRACTION / max(frac, 1e-6))
    return finding("batch_size", "step", f"Raise the batch size, up to about {room} from {bs}", (
        f"The step is the limit and peaks at {mem.peak_bytes / 2**30:.2f} GB of {mem.total_bytes / 2**30:.0f} GB "
        "GPU memory: a larger batch, keeping half the memory free, raises samples/s. It changes the optimization: "
        "retune the learning rate."),
        {"peak_bytes": mem.peak_bytes, "total_bytes": mem.total_bytes, "fraction": frac, "batch_size": bs,
         "batch_size_fits_about": room}, figure=f"the step peaks at {frac * 100:.0f}% of the GPU's memory")


def syncs(c: Context):
    """Host-device syncs counted in the step (CUDA) -> where they are and why they hurt."""
    s = c.r.syncs
    if s is None or not s.ok or not s.per_step:
        return None
    per = s.per_step
    sites = ", ".join(f"{x.where} ({x.count}x)" for x in (s.sites or ())[:3])
    cls = input_bound_class(c.r)
    tie = (f" The pipeline is {cls} input-bound: a syncing step also stalls while it waits, so the loader's "
           "prefetching overlaps less." if cls in ("moderately", "highly") else "")
    return finding("syncs", "step", "Remove .item(), .cpu(), print of tensors and data-dependent shapes from the "
                   "step, or accumulate metrics on the device", (
                       f"The training step synchronizes host and device {per:g} time(s) per step (at {sites}): each "
                       "sync stops the CPU from queueing work until the GPU catches up." + tie),
        {"per_step": per, "total": s.total, "steps": s.steps, "sites": [x.to_dict() for x in s.sites or ()],
         "input_bound_class": cls}, figure=f"{per:g} sync(s) per step")


def allocator(c: Context):
    """The step alone costs more with glibc's default malloc settings than with freed
    memory kept (allocator.Held.time_step) -> the variables that keep it."""
    a = c.part("allocator")
    if a is None or not a.real:
        return None
    d, h = a.default_ms_per_batch, a.held_ms_per_batch
    gain = d / h - 1 if h else None
    return finding("allocator", "step", "Start training with MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=-1", (
        f"The step alone takes {d:.1f} ms per batch with this process's malloc settings and {h:.1f} ms with freed "
        "memory kept for reuse: glibc gives the step's freed activation memory back to the OS and the next step "
        "page-faults it in again (in your loop, other allocations between steps can make it worse). The variables "
        "keep at most the process's peak; or preload jemalloc or tcmalloc (LD_PRELOAD=libjemalloc.so.2)."),
        {"default_ms_per_batch": d, "held_ms_per_batch": h, "cost_ms_per_batch": a.cost_ms_per_batch,
         "noise_ms": a.noise_ms, "gain_if_held": rounded(gain, 4) if gain is not None else None,
         "recommended": {"env": {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "-1"}}},
        figure=f"measured {gain * 100:+.0f}% for the step alone" if gain else None)
