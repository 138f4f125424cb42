"""Streaming datasets that partition their samples by worker and rank themselves:
MosaicML `streaming.StreamingDataset` and Lightning `litdata.StreamingDataset`.

Both are IterableDatasets whose `__iter__` picks this worker's (and rank's) samples and
builds each through the per-sample access (`self[i]`: MosaicML's `get_item`, then a
subclass's `self.transforms`; litdata's `__getitem__`, then each of `self.transform`).
So the split is the map-style one (split.py): the transforms are proxied on a shallow
copy of the dataset, and the fill records their calls while the copy's own iterator
builds each sample (cache.py), in this process, as worker 0 of 1. `raw` replays the
transforms on the recorded inputs, `augmented` the samples, in the user's loader
settings; `full` iterates the copy in the user's workers, each worker its own
partition, as in the user's loop.

A copy shares the dataset's state: MosaicML keeps its epoch counter and shard states in
shared memory, so each iteration by the tool (the fill, `full`, the isolated load) counts
as an epoch of the user's dataset; litdata keeps its cache per iterator.
"""

from __future__ import annotations

from typing import Any

from ..recording import RecordingTransform
from ._common import by_name


def is_mosaicml(obj: Any) -> bool:
    return by_name(obj, ("streaming",), ("StreamingDataset",))


def is_litdata(obj: Any) -> bool:
    return by_name(obj, ("litdata",), ("StreamingDataset",))


def is_streaming(obj: Any) -> bool:
    """A dataset that partitions its samples by worker and rank itself, built one by one
    through its per-sample access."""
    return is_mosaicml(obj) or is_litdata(obj)


def iterates_here(obj: Any) -> bool:
    """Whether the dataset can be iterated in this process as a worker iterates it,
    leaving the user's workers alone: litdata keeps its state per iterator; MosaicML
    keeps its epoch and partitions in shared memory, so that an iteration here hangs the
    user's workers (measure.cache.by_index)."""
    return is_litdata(obj)


def instrument(ds: Any, ds2: Any, where: str, recorder: Any, found: dict) -> None:
    """litdata keeps its transforms as a list in `self.transform`, applied in turn in
    `__getitem__`: each one is proxied in a list of the copy's own."""
    transforms = getattr(ds, "transform", None)
    if transforms is None:
        return
    one = not isinstance(transforms, list)
    proxies = []
    for i, fn in enumerate([transforms] if one else transforms):
        name = f"{where}.transform" if one else f"{where}.transform[{i}]"
        proxies.append(RecordingTransform(fn, name, recorder))
        found[name] = f"{name} ({type(fn).__name__})"
    ds2.transform = proxies[0] if one else proxies


# Where the streaming libraries' own machinery comes from: their packages, and the
# threading, file-lock and shared-memory objects they keep as attributes.
_INTERNAL = ("streaming", "litdata", "threading", "filelock", "multiprocessing", "concurrent", "numpy")


def internal(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return any(module == m or module.startswith(m + ".") for m in _INTERNAL)
