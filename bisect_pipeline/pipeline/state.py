"""Snapshot and restore everything of the user's that a run could change."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
import sys
from typing import Any, Iterator, Optional

import torch


@dataclasses.dataclass
class Snapshot:
    rng_torch: torch.Tensor
    rng_cuda: Optional[list]
    rng_numpy: Any
    rng_python: Any
    num_threads: int
    params: dict  # name -> (device, cpu copy, grad cpu copy or None)
    buffers: dict  # name -> cpu copy
    training: list
    optimizer_state: Optional[dict]


def capture(model: Optional[torch.nn.Module], optimizer: Optional[torch.optim.Optimizer],
            device: Optional[torch.device] = None) -> Snapshot:
    """Everything of the user's that a run can change. The CUDA RNG states are taken
    whenever the run will use CUDA (`device`), even before CUDA is initialised: the run
    initialises it, which would otherwise leave states the user never had."""
    np = sys.modules.get("numpy")
    params, buffers, training = {}, {}, []
    if model is not None:
        for name, p in model.named_parameters(remove_duplicate=False):
            grad = None if p.grad is None else p.grad.detach().to("cpu", copy=True)
            params[name] = (p.device, p.detach().to("cpu", copy=True), grad)
        for name, b in model.named_buffers(remove_duplicate=False):
            buffers[name] = b.detach().to("cpu", copy=True)
        training = [m.training for m in model.modules()]
    return Snapshot(
        rng_torch=torch.get_rng_state(),
        rng_cuda=(torch.cuda.get_rng_state_all() if torch.cuda.is_available()
                  and (torch.cuda.is_initialized() or (device is not None and device.type == "cuda")) else None),
        rng_numpy=np.random.get_state() if np is not None else None,
        rng_python=random.getstate(),
        num_threads=torch.get_num_threads(),
        params=params,
        buffers=buffers,
        training=training,
        optimizer_state=copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None,
    )


def restore(snap: Snapshot, model: Optional[torch.nn.Module], optimizer: Optional[torch.optim.Optimizer]) -> None:
    """Put back parameters (values, device, grads), buffers, train/eval flags, optimizer
    state, RNG states and the thread count, bit for bit."""
    if model is not None:
        with torch.no_grad():
            named = dict(model.named_parameters(remove_duplicate=False))
            for name, (device, value, grad) in snap.params.items():
                p = named[name]
                if p.device != device:
                    p.data = p.data.to(device)
                p.copy_(value)
                p.grad = None if grad is None else grad.to(device)
            named_b = dict(model.named_buffers(remove_duplicate=False))
            for name, value in snap.buffers.items():
                named_b[name].copy_(value)
        for m, flag in zip(model.modules(), snap.training):
            m.training = flag
    if optimizer is not None and snap.optimizer_state is not None:
        optimizer.load_state_dict(snap.optimizer_state)
    torch.set_rng_state(snap.rng_torch)
    if snap.rng_cuda is not None:
        torch.cuda.set_rng_state_all(snap.rng_cuda)
    np = sys.modules.get("numpy")
    if np is not None and snap.rng_numpy is not None:
        np.random.set_state(snap.rng_numpy)
    random.setstate(snap.rng_python)
    if torch.get_num_threads() != snap.num_threads:
        torch.set_num_threads(snap.num_threads)


@contextlib.contextmanager
def preserved(model: Optional[torch.nn.Module], optimizer: Optional[torch.optim.Optimizer],
              device: Optional[torch.device] = None) -> Iterator[None]:
    """The user's state as it was after the block, whatever happens in it: a snapshot
    first, the model moved to `device` for the block (when all of it is on one other
    device), then moved back and everything restored (see `restore`)."""
    snap = capture(model, optimizer, device)
    moved_from = _move(model, device)
    if moved_from is not None:
        _move_optimizer_state(optimizer)
    try:
        yield
    finally:
        if moved_from is not None:
            model.to(moved_from)
        restore(snap, model, optimizer)


def _move_optimizer_state(optimizer: Optional[torch.optim.Optimizer]) -> None:
    """The optimizer's state tensors (momentum, Adam's moments) to their parameter's
    device, as Optimizer.load_state_dict places them; 0-d counters (`step`) stay where
    they are, which non-capturable optimizers need. The snapshot puts them back."""
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            for k, v in list((state or {}).items()):
                if isinstance(v, torch.Tensor) and v.dim() > 0 and v.device != p.device:
                    state[k] = v.to(p.device)


def _move(model: Optional[torch.nn.Module], device: Optional[torch.device]) -> Optional[torch.device]:
    if model is None or device is None:
        return None
    devices = {t.device for t in model.parameters()} | {t.device for t in model.buffers()}
    if len(devices) == 1:
        (current,) = devices
        if current != device:
            model.to(device)
            return current
    return None
