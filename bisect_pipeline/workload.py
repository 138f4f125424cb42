"""What the user hands us: model, loader, and how to step and move a batch."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Mapping, Optional

import torch

from .errors import BisectError

# Keys the default step looks for in a dict batch, in order of preference.
_INPUT_KEYS = ("inputs", "input", "images", "image", "x", "data", "pixel_values")
_TARGET_KEYS = ("targets", "target", "labels", "label", "y")


@dataclasses.dataclass
class Workload:
    """The contract of an entry function (see README "Entry functions").

    model: the torch.nn.Module trained by the step (its state is restored after the run).
    loader: the user's torch.utils.data.DataLoader; it is described, never iterated.
    optimizer, loss_fn: used by the default step; SGD and cross-entropy when None.
    step: `step(batch)` runs one training step on a batch already on the device.
    to_device: `to_device(batch, device)` moves a batch; the default moves every tensor.
    """

    model: Optional[torch.nn.Module]
    loader: Any
    optimizer: Optional[torch.optim.Optimizer] = None
    loss_fn: Optional[Callable] = None
    step: Optional[Callable[[Any], Any]] = None
    to_device: Optional[Callable[[Any, torch.device], Any]] = None


def as_workload(obj: Any, where: str = "the entry function") -> Workload:
    """Accept a Workload, a dict with its keys, or a (model, loader) tuple (a
    LightningModule with a LightningDataModule or DataLoader is such a tuple; a
    LightningModule alone brings its train_dataloader())."""
    from . import integrations

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
    elif integrations.is_lightning_module(obj):  # its own train_dataloader() is the loader
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
    from torch.utils.data import DataLoader

    from . import integrations

    integrations.adapt_workload(wl, where)
    if not isinstance(wl.loader, DataLoader):
        raise BisectError(
            f"{where}: the loader is a {type(wl.loader).__name__}, not a torch.utils.data.DataLoader. "
            "Pass the DataLoader you train with (unwrap any wrapper around it; a timm PrefetchLoader and a "
            "LightningDataModule are unwrapped for you)."
        )
    if wl.model is None and wl.step is None:
        raise BisectError(f"{where}: no model and no step; give the model (default step) or your own step(batch).")
    if wl.model is not None and not isinstance(wl.model, torch.nn.Module):
        raise BisectError(f"{where}: the model is a {type(wl.model).__name__}, not a torch.nn.Module.")
    for name in ("loss_fn", "step", "to_device"):
        fn = getattr(wl, name)
        if fn is not None and not callable(fn):
            raise BisectError(f"{where}: {name} must be callable, got {type(fn).__name__}.")


def split_batch(batch: Any) -> tuple[Any, Any]:
    """(inputs, targets) for the default step."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping):
        x = next((batch[k] for k in _INPUT_KEYS if k in batch), None)
        y = next((batch[k] for k in _TARGET_KEYS if k in batch), None)
        if x is not None and y is not None:
            return x, y
    raise BisectError(
        f"the default training step expects batches of (inputs, targets) or a dict with an input key "
        f"{list(_INPUT_KEYS)} and a target key {list(_TARGET_KEYS)}; got {_describe(batch)}. "
        "Give your own step(batch) in the Workload."
    )


def _describe(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return f"a dict with keys {sorted(map(str, batch))}"
    if isinstance(batch, (tuple, list)):
        return f"a {type(batch).__name__} of {len(batch)}"
    return f"a {type(batch).__name__}"


def default_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable) -> Callable[[Any], Any]:
    """The classic step: zero_grad(set_to_none), loss(model(x), y).backward(), optimizer.step()."""

    def step(batch: Any) -> None:
        inputs, targets = split_batch(batch)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), targets).backward()
        optimizer.step()

    return step


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a nested batch; `non_blocking` when the source is pinned.

    Tuples, lists, dicts, namedtuples and dataclasses are rebuilt; objects with a
    `.to()` method (custom batch classes) are asked to move themselves; anything else
    is returned as is.
    """
    if isinstance(batch, torch.Tensor):
        if batch.device == device:
            return batch
        return batch.to(device, non_blocking=batch.is_pinned())
    if isinstance(batch, Mapping):
        moved = {k: to_device(v, device) for k, v in batch.items()}
        if type(batch) is dict:
            return moved
        try:
            return type(batch)(moved)
        except TypeError:  # a mapping type that cannot be built from a dict
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: to_device(getattr(batch, f.name), device) for f in dataclasses.fields(batch) if f.init})
    to = getattr(batch, "to", None)
    if callable(to):
        return to(device)
    if hasattr(batch, "__dict__") and not isinstance(batch, type) and _has_tensor(vars(batch)):
        moved = copy.copy(batch)  # a custom batch class without .to(): move its tensor attributes
        for k, v in vars(batch).items():
            setattr(moved, k, to_device(v, device))
        return moved
    return batch


def _has_tensor(obj: Any, depth: int = 0) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if depth > 4:
        return False
    if isinstance(obj, Mapping):
        return any(_has_tensor(v, depth + 1) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return any(_has_tensor(v, depth + 1) for v in obj)
    return False
