"""The user's loader, read once: its settings (LoaderSpec), and its sampler's order.

Nothing here iterates the user's loader or changes its dataset or sampler.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any, Callable, Optional

from torch.utils.data import DataLoader, IterableDataset, RandomSampler

_DATALOADER_PARAMS = set(inspect.signature(DataLoader.__init__).parameters)


@dataclasses.dataclass(frozen=True)
class LoaderSpec:
    """The user's loader settings, read once; replay loaders are built from it."""

    dataset: Any
    batch_size: Optional[int]
    drop_last: bool
    sampler: Any
    batch_sampler: Any  # the user's own batch sampler, else None
    num_workers: int
    collate_fn: Callable
    pin_memory: bool
    timeout: float
    worker_init_fn: Optional[Callable]
    multiprocessing_context: Any
    prefetch_factor: Optional[int]
    persistent_workers: bool
    in_order: bool
    pin_memory_device: str
    # The user's loader class: replay loaders are built through it (a subclass that
    # overrides __iter__ keeps its behaviour at every point), or DataLoader when it
    # cannot take the DataLoader arguments (sources.loader_class).
    loader_cls: type = DataLoader

    @property
    def iterable(self) -> bool:
        return isinstance(self.dataset, IterableDataset)

    @property
    def auto_collation(self) -> bool:
        return self.batch_size is not None or self.batch_sampler is not None

    @property
    def prefetch_depth(self) -> int:
        """Batches the workers can have ready before the loop asks for one."""
        if self.num_workers == 0:
            return 0
        return self.num_workers * (self.prefetch_factor or 2)

    @property
    def batches_per_epoch(self) -> Optional[int]:
        """Batches in one epoch of the loader (len(loader)), or None when its sampler or
        dataset has no length (an IterableDataset's epochs end where its iterator does)."""
        try:
            if self.batch_sampler is not None:
                return len(self.batch_sampler)
            if self.iterable:
                return None
            n = len(self.sampler)
        except TypeError:
            return None
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def worker_kwargs(self, **overrides: Any) -> dict:
        """Everything downstream of the dataset and sampler, as the user set it."""
        kw = dict(
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            worker_init_fn=self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context,
            in_order=self.in_order,
            pin_memory_device=self.pin_memory_device,
        )
        if self.num_workers > 0:
            kw.update(prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers)
        kw.update(overrides)
        if not kw.get("pin_memory_device"):
            kw.pop("pin_memory_device", None)  # deprecated; passing '' still warns on some versions
        return {k: v for k, v in kw.items() if k in _DATALOADER_PARAMS}

    def with_settings(self, settings: dict) -> "LoaderSpec":
        """This spec with other loader settings (`settings` keys that are not LoaderSpec
        fields, e.g. the step's threads, are ignored). DataLoader refuses a timeout,
        a multiprocessing_context, persistent workers or a prefetch_factor without
        workers: a loader set to num_workers=0 drops them."""
        names = {f.name for f in dataclasses.fields(self)}
        spec = dataclasses.replace(self, **{k: v for k, v in settings.items() if k in names})
        if spec.num_workers == 0:
            spec = dataclasses.replace(spec, timeout=0.0, multiprocessing_context=None, persistent_workers=False,
                                       prefetch_factor=None)
        return spec

    def settings(self) -> dict:
        """A JSON-friendly summary for the report."""
        ctx = self.multiprocessing_context
        return {
            "dataset": type(self.dataset).__name__,
            "iterable": self.iterable,
            "batch_size": self.batch_size,
            "batch_sampler": type(self.batch_sampler).__name__ if self.batch_sampler is not None else None,
            "sampler": type(self.sampler).__name__ if self.sampler is not None else None,
            "shuffle": isinstance(self.sampler, RandomSampler),
            "num_workers": self.num_workers,
            "collate_fn": getattr(self.collate_fn, "__qualname__", type(self.collate_fn).__name__),
            "pin_memory": self.pin_memory,
            "drop_last": self.drop_last,
            "prefetch_factor": self.prefetch_factor if self.num_workers else None,
            "persistent_workers": self.persistent_workers,
            "batches_per_epoch": self.batches_per_epoch,
            "multiprocessing_context": None if ctx is None else getattr(ctx, "_name", None) or str(ctx),
            "timeout": self.timeout,
            "in_order": self.in_order,
            "loader_class": f"{self.loader_cls.__module__}.{self.loader_cls.__qualname__}",
        }


def describe(loader: DataLoader) -> LoaderSpec:
    """Read the settings of the user's loader without iterating it."""
    own_batch_sampler = None
    if loader.batch_size is None and loader.batch_sampler is not None:
        own_batch_sampler = loader.batch_sampler
    return LoaderSpec(
        dataset=loader.dataset,
        batch_size=loader.batch_size,
        drop_last=bool(loader.drop_last),
        sampler=loader.sampler,
        batch_sampler=own_batch_sampler,
        num_workers=int(loader.num_workers),
        collate_fn=loader.collate_fn,
        pin_memory=bool(loader.pin_memory),
        timeout=float(loader.timeout),
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=bool(loader.persistent_workers),
        in_order=bool(getattr(loader, "in_order", True)),
        pin_memory_device=getattr(loader, "pin_memory_device", "") or "",
        loader_cls=type(loader),
    )


def sampler_copy(spec: LoaderSpec) -> Any:
    """A copy of the user's batch sampler, or else sampler (the user's is untouched);
    the sampler itself when it cannot be copied (its RNG state is restored after the run)."""
    source = spec.batch_sampler if spec.batch_sampler is not None else spec.sampler
    try:
        return copy.deepcopy(source)
    except Exception:
        return source


def index_order(spec: LoaderSpec):
    """Yield dataset indices (map-style) or index lists (own batch sampler) forever,
    in the order the user's sampler gives, from a copy of it (the user's is untouched)."""
    source = sampler_copy(spec)
    empty_epochs = 0
    while True:
        produced = False
        for item in source:
            produced = True
            yield item
        if not produced:
            empty_epochs += 1
            if empty_epochs > 1:
                raise RuntimeError("the loader's sampler yields nothing: the dataset is empty")


def copy_or_same(dataset: Any) -> Any:
    """A shallow copy of the user's dataset (the replay loaders' own), or the dataset
    itself when it refuses to be copied."""
    try:
        return copy.copy(dataset)
    except Exception:
        return dataset
