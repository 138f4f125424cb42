"""Advice rule for a load bottleneck: the storage, file format, decoding or caching to change
(reading or decoding named when load was split: reads.py). Separate from the other stages'
rules: its remedies are the dataset's files and how they are read."""

from __future__ import annotations

from typing import Optional

from .context import Context, headroom, rounded
from .wording import finding, size_text


def storage(c: Context):
    """A load bottleneck -> storage, file format, decoding, caching, with its numbers;
    reading or decoding named when load was split (reads.py)."""
    if c.b != "load" or not c.significant("load"):
        return None
    ms = c.cost_ms("load")
    load = c.part("load")
    per_sample = load.ms_per_sample if load is not None else None
    bs = c.r.batch_size
    numbers = {"load_ms_per_batch": rounded(ms), "isolated_ms_per_sample": per_sample, "batch_size": bs,
               "dataset": c.lo.get("dataset"), "num_workers": c.workers, "cache": c.r.cache.to_dict() if c.r.cache.batches is not None else None}
    cap = None
    if per_sample:
        items = c.r.isolated.items_per_batch if c.r.isolated is not None else None
        several = bs / items if items else 1.0  # the samples the step gets of each item loaded
        rate = max(1, c.workers) * 1e3 / per_sample * several
        numbers["load_cap_samples_per_sec"] = rounded(rate, 1)
        each = f" (each becomes {several:g} samples)" if abs(several - 1) > 1e-9 else ""
        cap = (f"alone a sample takes {per_sample:.2f} ms to load{each}, so {max(1, c.workers)} process(es) cap "
               f"input at {rate:,.0f} samples/s")
    numbers["headroom"] = headroom(c, "load")
    # the transforms not split from loading: timed alone together, or no raw point to cache at
    raw = next((p for p in c.r.points if p.point == "raw"), None)
    together = "augment" in (load.includes or ()) if load is not None else raw is not None and raw.status == "unavailable"
    merged = "Measured together with augment: the transforms could not be split." if together else ""
    split = load.split if load is not None and load.split is not None and load.split.ok else None
    if split is not None:
        numbers["split"] = split.to_dict()
    what = _split_advice(split, per_sample, c.cuda) if split is not None else (
        " Read fewer, larger files (sharded tar/record formats) from local or faster storage, store pre-resized or "
        "cheaper-to-decode data, or cache decoded samples in memory when they fit.")
    # load's cost and headroom are the verdict's own figures (load is the bottleneck): said once, above
    which = {"read": "reading {}'s files", "decode": "decoding {}'s samples",
             "iterator": "getting {}'s samples through its iterator"}.get(
        split.bound if split is not None else "", "loading {}'s samples").format(c.lo.get("dataset") or "the dataset")
    return finding("storage", "load", f"Make {which} cheaper", merged + what, numbers, figure=cap)


def _split_advice(s, per_sample: Optional[float], cuda: bool) -> str:
    """What to attack, reading or decoding, from load's split with its figures."""
    rate = f" at {s.read_mb_per_s:,.1f} MB/s" if s.read_mb_per_s is not None else ""
    size = f"{size_text(s.bytes_per_sample)} in {s.files_per_sample:g} file(s) per sample"
    read = f"reading its files takes {s.read_ms_per_sample:.2f} ms ({size}{rate})"
    decode = f"decoding and the dataset's other work {s.decode_ms_per_sample:.2f} ms"
    of = f" Of a sample's {per_sample:.2f} ms alone," if per_sample else " Of a sample's loading,"
    if s.iterator_ms_per_sample is not None:
        through = (f"getting the samples through its iterator adds {s.iterator_ms_per_sample:.2f} ms (its partition, "
                   "shard bookkeeping and threads, timed in a worker as the loader gets them)")
        if s.bound == "iterator":
            return (f"{of} {through}, beyond {decode} and {read} by index: the iteration is the larger part. Look at "
                    "the streaming dataset's own settings (shard size, its download and prefetch threads, where its "
                    "local cache lives) before the samples' decoding.")
        read = f"{read}, and {through}"
    if s.bound == "read":
        return (f"{of} {read} and {decode}: storage is the larger part. Group small files into shards "
                "(tar/record formats) so that each read is large, read from local or faster storage, store fewer "
                "bytes (pre-resized images), or cache the samples in memory when they fit.")
    gpu = ", on the GPU in the step with device='cuda'" if cuda else ""
    return (f"{of} {decode} and {read}: decoding is the larger part. Decode once at preparation time (store "
            "pre-resized images or decoded uint8 arrays), decode JPEGs at reduced size (PIL Image.draft), or use "
            f"torchvision.io.decode_jpeg{gpu}.")
