"""Split a dataset into loading and transforms: copy its chain (Subset, ConcatDataset, the
leaf dataset) and put a recording proxy where each transform is kept. The user's dataset
is never changed: proxies live on shallow copies.

Two kinds of proxies: on the attributes where torchvision conventions (and the libraries
in integrations/) keep transforms, declared transforms; on every other callable attribute
of the leaf dataset (`self._transforms`, `self.aug`, also `self.loader`), tentative ones.
A tentative proxy is replayed only where the fill sees it act as a transform (called
with data, its output in the sample: recording.record_sample) and is taken off the copy
after the fill otherwise (Instrumented.settle), so a loader stays on the loading side."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler, Subset

from . import integrations
from .recording import Recorder, RecordingTransform

# Where torchvision conventions keep per-sample transforms on a dataset.
TRANSFORM_ATTRS = ("transforms", "transform", "target_transform")


@dataclasses.dataclass
class Instrumented:
    dataset: Any  # a shallow copy of the user's dataset chain with recording proxies
    labels: dict  # name -> label of every proxy, e.g. "dataset.transform" -> "dataset.transform (Compose)"
    recorder: Recorder
    # name -> (copy, attribute, original, proxy) of each tentative proxy
    tentative: dict = dataclasses.field(default_factory=dict)
    dropped: dict = dataclasses.field(default_factory=dict)  # name -> why a tentative proxy's calls stay with loading

    def found(self, replayed: set) -> list:
        """The labels of the proxies whose calls are replayed, in the order they were found."""
        return [label for name, label in self.labels.items() if name in replayed]

    def settle(self, replayed: set) -> None:
        """After the fill: a tentative proxy whose calls are replayed names augment from
        now on (faults); every other one is taken off the copy, which runs `full`."""
        for name, (owner, attr, original, proxy) in self.tentative.items():
            if name in replayed:
                proxy.stage = "augment"
            else:
                setattr(owner, attr, original)


def instrument(dataset: Any) -> Instrumented:
    """Copy the dataset chain and proxy every transform, and every callable attribute that
    may be one, found on it."""
    inst = Instrumented(None, {}, Recorder())
    inst.dataset = _instrument(dataset, "dataset", inst)
    return inst


def _instrument(ds: Any, where: str, inst: Instrumented) -> Any:
    ds2 = copy.copy(ds)
    if isinstance(ds, Subset):
        ds2.dataset = _instrument(ds.dataset, where + ".dataset", inst)
        return ds2
    if isinstance(ds, ConcatDataset):
        ds2.datasets = [_instrument(d, f"{where}.datasets[{i}]", inst) for i, d in enumerate(ds.datasets)]
        return ds2
    if integrations.instrument_leaf(ds, ds2, where, inst.recorder, inst.labels):
        return ds2
    for attr in TRANSFORM_ATTRS:
        fn = getattr(ds, attr, None)
        if fn is not None and callable(fn) and not isinstance(fn, type):
            _proxy(ds2, attr, fn, f"{where}.{attr}", inst)
    for attr, fn in list(getattr(ds, "__dict__", {}).items()):
        if attr not in TRANSFORM_ATTRS and may_transform(fn) and not integrations.internal(fn):
            _proxy(ds2, attr, fn, f"{where}.{attr}", inst, tentative=True)
    return ds2


def _proxy(ds2: Any, attr: str, fn: Any, name: str, inst: Instrumented, *, tentative: bool = False) -> None:
    proxy = RecordingTransform(fn, name, inst.recorder, tentative=tentative)
    try:
        setattr(ds2, attr, proxy)
    except (AttributeError, TypeError):  # a read-only property
        return
    inst.labels[name] = f"{name} ({type(fn).__name__})"
    if tentative:
        inst.tentative[name] = (ds2, attr, fn, proxy)


def may_transform(obj: Any) -> bool:
    """Whether a dataset's attribute may be a per-sample transform: a callable object or
    function, not a method, a class, a builtin, or another data object (a dataset, a
    loader, a sampler)."""
    return (callable(obj) and not isinstance(obj, type) and not inspect.ismethod(obj) and not inspect.isbuiltin(obj)
            and not isinstance(obj, (Dataset, DataLoader, Sampler)))


def replaced(dataset: Any, name: str, fn: Any) -> Any:
    """A copy of the dataset chain with the transform at `name` (a proxy's name as
    `instrument` gives it: "dataset.transform", "dataset.dataset.transform",
    "dataset.datasets[1].transform") replaced by `fn`: a recording proxy there keeps
    proxying (its failures name augment), `fn` in it. The chain given is not changed:
    every object on the way is a shallow copy. A fix of the pipeline (measure/tail.py)
    runs the full pipeline over it."""
    return _replaced(dataset, name.split(".", 1)[1], fn)


def _replaced(ds: Any, rest: str, fn: Any) -> Any:
    ds2 = copy.copy(ds)
    head, _, tail = rest.partition(".")
    if not tail:
        current = getattr(ds, head)
        if isinstance(current, RecordingTransform):
            proxy = copy.copy(current)
            proxy.fn = fn
            fn = proxy
        setattr(ds2, head, fn)
        return ds2
    attr, _, index = head.partition("[")
    child = getattr(ds, attr)
    if not index:
        setattr(ds2, attr, _replaced(child, tail, fn))
        return ds2
    items = list(child)
    items[int(index.rstrip("]"))] = _replaced(items[int(index.rstrip("]"))], tail, fn)
    setattr(ds2, attr, items)
    return ds2
