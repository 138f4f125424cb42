"""Lightning: a LightningModule's training step (and its batch transfer hooks) run without
a Trainer; a LightningDataModule (or the module itself) gives the train DataLoader."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Optional

import torch

from ...core.errors import BisectError
from ._common import by_name

_LIGHTNING = ("lightning.pytorch", "pytorch_lightning")


def is_module(obj: Any) -> bool:
    return by_name(obj, _LIGHTNING, ("LightningModule",))


def is_datamodule(obj: Any) -> bool:
    return by_name(obj, _LIGHTNING, ("LightningDataModule",))


class LightningStep:
    """A LightningModule's training step without a Trainer: on_after_batch_transfer,
    zero_grad(set_to_none=True), training_step(batch, batch_idx), loss.backward(),
    optimizer.step(). Schedulers, gradient clipping and accumulation, precision plugins,
    optimizer hooks and self.log are not run (self.log is a no-op without a Trainer)."""

    def __init__(self, module: Any, optimizer: torch.optim.Optimizer) -> None:
        self.module, self.optimizer = module, optimizer
        self.batch_idx = 0
        self._started = False

    def __call__(self, batch: Any) -> Any:
        module = self.module
        if not self._started:  # inside the run: the train flag is restored afterwards
            module.train()
            self._started = True
        batch = module.on_after_batch_transfer(batch, 0)
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*self\.log\(\).*")
            out = module.training_step(batch, self.batch_idx)
        self.batch_idx += 1
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if loss is None:  # Lightning skips the optimization for this batch
            return None
        loss.backward()
        self.optimizer.step()
        return None


class LightningTransfer:
    """The module's own batch transfer: on_before_batch_transfer, then
    transfer_batch_to_device (on_after_batch_transfer runs in the step)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __call__(self, batch: Any, device: torch.device) -> Any:
        batch = self.module.on_before_batch_transfer(batch, 0)
        return self.module.transfer_batch_to_device(batch, device, 0)


def _first_optimizer(conf: Any, where: str) -> Optional[torch.optim.Optimizer]:
    """The optimizer of configure_optimizers' output (its documented forms)."""
    if isinstance(conf, torch.optim.Optimizer):
        return conf
    if isinstance(conf, Mapping):
        return _first_optimizer(conf.get("optimizer"), where)
    if isinstance(conf, (list, tuple)) and conf:
        if len(conf) == 2 and isinstance(conf[0], (list, tuple)):  # ([optimizers], [schedulers])
            conf = conf[0]
        opts = [_first_optimizer(c, where) for c in conf]
        opts = [o for o in opts if o is not None]
        if len(opts) > 1:
            raise BisectError(f"{where}: configure_optimizers returns {len(opts)} optimizers; several optimizers "
                              "need manual optimization, which needs a Trainer. Give your own step(batch).")
        return opts[0] if opts else None
    return None


def adapt(wl: Any, where: str) -> None:
    module = wl.model if is_module(wl.model) else None
    if is_datamodule(wl.loader):
        dm = wl.loader
        try:
            dm.prepare_data()
            dm.setup("fit")
            wl.loader = dm.train_dataloader()
        except Exception as exc:
            raise BisectError(f"{where}: the LightningDataModule's prepare_data/setup('fit')/train_dataloader() "
                              f"raised {type(exc).__name__}: {exc}. Return its train DataLoader instead.") from exc
    elif wl.loader is None and module is not None:
        try:
            wl.loader = module.train_dataloader()
        except Exception as exc:
            raise BisectError(f"{where}: no loader given, and the LightningModule's train_dataloader() raised "
                              f"{type(exc).__name__}: {exc}. Return (module, datamodule or DataLoader).") from exc
    if isinstance(wl.loader, (list, tuple)) and len(wl.loader) == 1:
        wl.loader = wl.loader[0]
    if not isinstance(wl.loader, torch.utils.data.DataLoader):
        raise BisectError(f"{where}: the Lightning train dataloader is a {type(wl.loader).__name__}; bisect-pipeline "
                          "measures one torch DataLoader. Return that DataLoader as the loader.")
    if module is None or wl.step is not None:
        return
    if not getattr(module, "automatic_optimization", True):
        raise BisectError(f"{where}: the LightningModule uses manual optimization (automatic_optimization=False); "
                          "its training_step calls self.optimizers()/manual_backward, which need a Trainer. "
                          "Give your own step(batch) in the Workload.")
    optimizer = wl.optimizer
    if optimizer is None:
        try:
            optimizer = _first_optimizer(module.configure_optimizers(), where)
        except BisectError:
            raise
        except Exception as exc:
            raise BisectError(f"{where}: configure_optimizers() raised {type(exc).__name__}: {exc} (it runs without "
                              "a Trainer here). Give the optimizer in the Workload.") from exc
        if optimizer is None:
            raise BisectError(f"{where}: configure_optimizers() returned no optimizer; give the optimizer "
                              "(or your own step) in the Workload.")
    wl.optimizer = optimizer
    wl.step = LightningStep(module, optimizer)
    if wl.to_device is None:
        wl.to_device = LightningTransfer(module)
