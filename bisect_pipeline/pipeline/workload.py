"""What the user hands us: model, loader, and how to step and move a batch."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Union

import torch
from torch.utils.data import DataLoader

from ..core.errors import BisectError
from . import integrations


@dataclasses.dataclass
class Workload:
    """The contract of an entry function (see README "Entry functions").

    model: the torch.nn.Module trained by the step (its state is restored after the run).
    loader: the user's torch.utils.data.DataLoader, or a torchdata.nodes Loader (or the root
    node of a node graph); it is described, never iterated.
    optimizer, loss_fn: used by the default step; SGD and cross-entropy when None.
    step: `step(batch)` runs one training step on a batch already on the device.
    to_device: `to_device(batch, device)` moves a batch; the default moves every tensor.
    batch_size: samples per batch, when the loader cannot say (a batch sampler of uneven
    batches, a dataset that returns whole batches): a number, or a function of a collated
    batch (e.g. `lambda b: b[0].shape[1]` for sequence-first tensors).
    """

    model: Optional[torch.nn.Module]
    loader: Any
    optimizer: Optional[torch.optim.Optimizer] = None
    loss_fn: Optional[Callable] = None
    step: Optional[Callable[[Any], Any]] = None
    to_device: Optional[Callable[[Any, torch.device], Any]] = None
    batch_size: Optional[Union[float, Callable[[Any], float]]] = None
    # A library's wrapper that moves the loader's batches to the device in the user's
    # loop (timm's PrefetchLoader): set by integrations.adapt_workload, never by hand.
    wrapper: Any = dataclasses.field(default=None, init=False, repr=False)
    # Stages the user's loop runs on the loader's batches in its own process (a webdataset
    # WebLoader's): set by integrations.adapt_workload, never by hand.
    loop_stages: Any = dataclasses.field(default=None, init=False, repr=False)


def as_workload(obj: Any, where: str = "the entry function") -> Workload:
    """Accept a Workload, a dict with its keys, or a (model, loader) tuple (a
    LightningModule with a LightningDataModule or DataLoader is such a tuple; a
    LightningModule alone brings its train_dataloader())."""
    if isinstance(obj, Workload):
        wl = obj
    elif isinstance(obj, Mapping):
        fields = {f.name for f in dataclasses.fields(Workload)}
        unknown = sorted(set(obj) - fields)
        if unknown:
            raise BisectError(
                f"{where} returned a dict with unknown key(s) {unknown}; the keys are "
                f"{sorted(fields)} (model and loader required)."
            )
        if "loader" not in obj:
            raise BisectError(f"{where} returned a dict without a 'loader' key; return dict(model=..., loader=...).")
        wl = Workload(**{"model": None, **obj})
    elif isinstance(obj, (tuple, list)) and len(obj) == 2:
        wl = Workload(model=obj[0], loader=obj[1])
    elif integrations.lightning.is_module(obj):  # its own train_dataloader() is the loader
        wl = Workload(model=obj, loader=None)
    else:
        raise BisectError(
            f"{where} returned {type(obj).__name__}; it must return a bisect_pipeline.Workload("
            "model=..., loader=...), a dict with those keys, or a (model, loader) tuple."
        )
    validate(wl, where)
    return wl


def validate(wl: Workload, where: str = "the workload") -> None:
    """Check the workload. Library wrappers are turned into the contract first, in place
    (see integrations.adapt_workload): a timm PrefetchLoader becomes its DataLoader with
    its device-side work in the step; a LightningModule gets its training_step as the step
    (without a Trainer) and a LightningDataModule its train DataLoader."""
    integrations.adapt_workload(wl, where)
    if not isinstance(wl.loader, DataLoader) and not integrations.nodes.is_graph(wl.loader):
        raise BisectError(
            f"{where}: the loader is a {type(wl.loader).__name__}, not a torch.utils.data.DataLoader or a "
            "torchdata.nodes Loader (or root node). Pass the loader you train with (unwrap any wrapper around it; "
            "a timm PrefetchLoader and a LightningDataModule are unwrapped for you)."
        )
    if wl.model is None and wl.step is None:
        raise BisectError(f"{where}: no model and no step; give the model (default step) or your own step(batch).")
    if wl.model is not None and not isinstance(wl.model, torch.nn.Module):
        raise BisectError(f"{where}: the model is a {type(wl.model).__name__}, not a torch.nn.Module.")
    if wl.model is not None and any(t.is_meta for t in [*wl.model.parameters(), *wl.model.buffers()]):
        raise BisectError(f"{where}: the model is on the meta device (its weights are not materialized), so no step "
                          "can run. Build it with real weights (e.g. model.to_empty(device='cpu') and load a state "
                          "dict) before handing it over.")
    for name in ("loss_fn", "step", "to_device"):
        fn = getattr(wl, name)
        if fn is not None and not callable(fn):
            raise BisectError(f"{where}: {name} must be callable, got {type(fn).__name__}.")
    bs = wl.batch_size
    if bs is not None and not callable(bs) and (isinstance(bs, bool) or not isinstance(bs, (int, float)) or bs <= 0):
        raise BisectError(f"{where}: batch_size must be a number > 0 or a function of a batch, got {bs!r}.")
