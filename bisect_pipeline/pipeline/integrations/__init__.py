"""Pipelines people actually have: one module per library (torchvision, hf, timm,
lightning, webdataset, streaming, torchdata's nodes) and the IterableDataset sharding probe (iterable).

Every integration recognises a library's objects by the names of their classes (their
MRO), so no optional library is imported unless the user's own objects come from it; a
library the user's objects need but which is missing gives an install hint.

The generic code calls three hooks: `adapt_workload` (workload.validate: a timm
PrefetchLoader, a LightningModule / LightningDataModule into the Workload contract),
`instrument_leaf` (split.instrument: a transform kept where a library keeps it) and
`no_transform_reason` (cache: why `raw` is unavailable, in the library's terms).
"""

from __future__ import annotations

from typing import Any, Optional

from . import hf, iterable, lightning, nodes, streaming, timm, torchvision, webdataset
from ._common import EXTRAS, by_name, install_hint, require

__all__ = sorted(["EXTRAS", "adapt_workload", "by_name", "hf", "install_hint", "instrument_leaf", "internal",
                  "iterable", "lightning", "no_transform_reason", "nodes", "require", "streaming", "timm",
                  "torchvision", "webdataset"])


def adapt_workload(wl: Any, where: str) -> None:
    """Turn library wrappers into the Workload contract, in place: the loader becomes a
    torch DataLoader, and what the wrapper did on the device moves into the step."""
    if lightning.is_module(wl.model) or lightning.is_datamodule(wl.loader):
        lightning.adapt(wl, where)
    if timm.is_prefetcher(wl.loader):
        timm.adapt(wl, where)
    if webdataset.is_webloader(wl.loader):
        webdataset.adapt(wl, where)


def instrument_leaf(ds: Any, ds2: Any, where: str, recorder: Any, found: dict) -> bool:
    """Proxy the transform of a library dataset on `ds2` (a shallow copy of `ds`), adding
    its name and label to `found`. True when handled here (the generic attribute scan is
    then skipped)."""
    if hf.is_dataset(ds):
        hf.instrument(ds, ds2, where, recorder, found)
        return True
    if torchvision.is_v2_wrapper(ds):
        torchvision.instrument(ds, ds2, where, recorder, found)
        return True
    if streaming.is_litdata(ds):
        streaming.instrument(ds, ds2, where, recorder, found)
        return True
    return False


def internal(obj: Any) -> bool:
    """An attribute value that is a library's own machinery (a streaming dataset's shared
    barrier or lock), never a per-sample transform: the attribute scan leaves it alone."""
    return streaming.internal(obj)


def no_transform_reason(ds: Any) -> Optional[str]:
    return hf.no_transform_reason(ds)
