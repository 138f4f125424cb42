"""Split a dataset into loading and transforms: copy its chain (Subset, ConcatDataset, the
leaf dataset) and put a recording proxy where each transform is kept. The user's dataset
is never changed: proxies live on shallow copies."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from torch.utils.data import ConcatDataset, Subset

from . import integrations
from .recording import Recorder, RecordingTransform

# Where torchvision conventions keep per-sample transforms on a dataset.
TRANSFORM_ATTRS = ("transforms", "transform", "target_transform")


@dataclasses.dataclass
class Instrumented:
    dataset: Any  # a shallow copy of the user's dataset chain with recording proxies
    found: list  # names of the transforms proxied, e.g. "dataset.transform (Compose)"
    recorder: Recorder


def instrument(dataset: Any) -> Instrumented:
    """Copy the dataset chain and proxy every transform found on it."""
    recorder = Recorder()
    found: list = []
    copied = _instrument(dataset, "dataset", recorder, found)
    return Instrumented(copied, found, recorder)


def _instrument(ds: Any, where: str, recorder: Recorder, found: list) -> Any:
    ds2 = copy.copy(ds)
    if isinstance(ds, Subset):
        ds2.dataset = _instrument(ds.dataset, where + ".dataset", recorder, found)
        return ds2
    if isinstance(ds, ConcatDataset):
        ds2.datasets = [_instrument(d, f"{where}.datasets[{i}]", recorder, found) for i, d in enumerate(ds.datasets)]
        return ds2
    if integrations.instrument_leaf(ds, ds2, where, recorder, found):
        return ds2
    for attr in TRANSFORM_ATTRS:
        fn = getattr(ds, attr, None)
        if fn is None or not callable(fn) or isinstance(fn, type):
            continue
        name = f"{where}.{attr}"
        try:
            setattr(ds2, attr, RecordingTransform(fn, name, recorder))
        except (AttributeError, TypeError):  # a read-only property
            continue
        found.append(f"{name} ({type(fn).__name__})")
    return ds2


