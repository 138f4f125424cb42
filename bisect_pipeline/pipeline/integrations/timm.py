"""timm: `create_loader(use_prefetcher=True)` returns a PrefetchLoader around the real
DataLoader (fast_collate: uint8 batches). It copies each batch to its device on a side
stream and normalizes it there (random-erasing too, when re_prob > 0), overlapping the
training step on the current batch.

The bisection runs on the inner DataLoader, and every point's batches go through a copy
of the user's own PrefetchLoader (`through`), so the copy and the normalization overlap
the step at every point as they do in the user's loop; the `device` point caches the
prefetcher's outputs. Where one batch must be moved alone (a probe, the isolated
transfer), `Prefetched` applies the prefetcher to that batch.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator

import torch

from ...core import tree
from ...core.errors import BisectError
from ._common import by_name


def is_prefetcher(obj: Any) -> bool:
    return by_name(obj, ("timm",), ("PrefetchLoader",))


def adapt(wl: Any, where: str) -> None:
    """The inner DataLoader becomes the workload's loader; the prefetcher is kept as the
    wrapper every point's batches go through, and moves a batch alone when asked."""
    prefetcher = wl.loader
    inner = getattr(prefetcher, "loader", None)
    if not isinstance(inner, torch.utils.data.DataLoader):
        raise BisectError(f"{where}: the timm PrefetchLoader wraps a {type(inner).__name__}, not a DataLoader.")
    wl.loader = inner
    wl.wrapper = prefetcher
    if wl.to_device is None:
        wl.to_device = Prefetched(prefetcher)


class Prefetched:
    """`to_device(batch, device)`: the prefetcher's own work on one batch (copy, dtype,
    normalization, random erasing), as its iterator would do it."""

    def __init__(self, prefetcher: Any) -> None:
        self.prefetcher = prefetcher

    def __call__(self, batch: Any, device: torch.device) -> Any:
        return next(iter(_copy(self.prefetcher, [_safe(self.prefetcher, batch)])))


@contextlib.contextmanager
def through(prefetcher: Any, source: Any) -> Iterator[Callable[[], Any]]:
    """A point's batch source (a context manager yielding next_batch) seen through a copy
    of the user's PrefetchLoader: what the timed loop draws is the prefetcher's output."""
    with source as next_batch:
        def batches():
            while True:
                yield _safe(prefetcher, next_batch())
        yield iter(_copy(prefetcher, batches())).__next__


def _copy(prefetcher: Any, loader: Any) -> Any:
    """The user's prefetcher over another iterable of batches, with a stream of its own."""
    out = copy.copy(prefetcher)
    out.loader = loader
    out.stream = None
    return out


def _safe(prefetcher: Any, batch: Any) -> Any:
    """The prefetcher normalizes in place after `.to(device)` and `.to(dtype)`, which copy
    only when they change something: a cached batch already on its device and of its
    dtype would be changed for good, so it is handed over as a copy."""
    inputs = batch[0]
    if inputs.device.type == torch.device(prefetcher.device).type and inputs.dtype == prefetcher.img_dtype:
        return tree.clone(batch)
    return batch
