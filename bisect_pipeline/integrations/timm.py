"""timm: `create_loader(use_prefetcher=True)` returns a PrefetchLoader around the real
DataLoader (fast_collate: uint8 batches); it copies each batch to its device and
normalizes there (random-erasing too, when re_prob > 0)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from .. import step as step_mod
from ..errors import BisectError
from ._common import by_name


def is_prefetcher(obj: Any) -> bool:
    return by_name(obj, ("timm",), ("PrefetchLoader",))


class DeviceWork:
    """What timm's PrefetchLoader does on the device after the copy: convert the images to
    its dtype, normalize them, and random-erase when re_prob > 0. Out of place, so a
    batch cached on the device is never changed."""

    def __init__(self, prefetcher: Any) -> None:
        self.img_dtype = prefetcher.img_dtype
        self.mean = prefetcher.mean.detach().cpu()
        self.std = prefetcher.std.detach().cpu()
        self.random_erasing = prefetcher.random_erasing
        self._on: dict = {}

    def _for(self, device: torch.device) -> tuple:
        key = str(device)
        if key not in self._on:
            erasing = self.random_erasing
            if erasing is not None and str(getattr(erasing, "device", device)) != key:
                erasing = copy.copy(erasing)
                erasing.device = device
            self._on[key] = (self.mean.to(device), self.std.to(device), erasing)
        return self._on[key]

    def __call__(self, batch: Any) -> Any:
        inputs, targets = batch
        mean, std, erasing = self._for(inputs.device)
        inputs = (inputs.to(self.img_dtype) - mean.to(self.img_dtype)) / std.to(self.img_dtype)
        if erasing is not None:
            inputs = erasing(inputs)
        return inputs, targets


class ThenStep:
    """`step(before(batch))`: device-side work of a loader wrapper, then the step."""

    def __init__(self, before: Callable, step: Callable) -> None:
        self.before, self.step = before, step

    def __call__(self, batch: Any) -> Any:
        return self.step(self.before(batch))


def adapt(wl: Any, where: str) -> None:
    # timm.data.create_loader(use_prefetcher=True) returns a PrefetchLoader around the
    # real DataLoader (fast_collate: uint8 batches). It copies each batch to its device
    # and normalizes there. The bisection runs on the inner DataLoader; the device-side
    # work runs at the start of every step, at every point, so its cost is part of the
    # step (the ceiling), never lost and never counted as a pipeline stage.
    prefetcher = wl.loader
    inner = getattr(prefetcher, "loader", None)
    if not isinstance(inner, torch.utils.data.DataLoader):
        raise BisectError(f"{where}: the timm PrefetchLoader wraps a {type(inner).__name__}, not a DataLoader.")
    step = wl.step if wl.step is not None else step_mod.Lazy(wl.model, wl.optimizer, wl.loss_fn)
    wl.loader = inner
    wl.step = ThenStep(DeviceWork(prefetcher), step)
