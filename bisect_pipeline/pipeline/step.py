"""The default training step and the default transfer of a batch to the device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch

from ..core import tree
from ..core.errors import BisectError

# Keys the default step looks for in a dict batch, in order of preference.
_INPUT_KEYS = ("inputs", "input", "images", "image", "x", "data", "pixel_values")
_TARGET_KEYS = ("targets", "target", "labels", "label", "y")


def make_step(model: Any, optimizer: Any = None, loss_fn: Any = None, step: Any = None) -> Callable[[Any], Any]:
    """`step` when given, else the default step over `model` (SGD and cross-entropy when
    `optimizer` / `loss_fn` are None). Puts the model in training mode: call it inside
    the run, whose state is restored afterwards."""
    if step is not None:
        return step
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise BisectError("the model has no trainable parameter, so the default step has nothing to train; "
                          "give your own step(batch).")
    model.train()
    return default_step(model, optimizer or torch.optim.SGD(params, lr=0.01), loss_fn or torch.nn.CrossEntropyLoss())


def default_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable) -> Callable[[Any], Any]:
    """The classic step: zero_grad(set_to_none), loss(model(x), y).backward(), optimizer.step()."""

    def step(batch: Any) -> None:
        inputs, targets = split_batch(batch)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), targets).backward()
        optimizer.step()

    return step


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


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a nested batch (tree.py's containers), `non_blocking` when the
    source is pinned; a custom batch class with its own `to()` is asked to move itself;
    anything else is returned as is."""
    return tree.map_leaves(lambda x: _move(x, device), batch, stop=_moves_itself)


def _moves_itself(node: Any) -> bool:
    return tree.is_batch_object(node) and callable(getattr(node, "to", None))


def _move(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x if x.device == device else x.to(device, non_blocking=x.is_pinned())
    if _moves_itself(x):
        # A host-to-device copy is safe non_blocking (from pageable memory it just does
        # not overlap); the torch docs' custom batch takes the argument.
        if device.type != "cpu":
            try:
                return x.to(device, non_blocking=True)
            except TypeError:  # a .to(device) without it
                pass
        return x.to(device)
    return x
