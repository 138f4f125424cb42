"""Pipelines people actually have: torchvision, Hugging Face datasets, timm, Lightning,
streaming IterableDatasets, batches of any structure.

Every integration is detected by the names of an object's classes (its MRO), so no
optional library is imported unless the user's own objects come from it; a library the
user's objects need but which is missing gives an install hint (`require`).

Hooks (small, called from the generic code):
- `stages._instrument` -> `instrument_leaf`: proxy a transform kept where a library keeps
  it (the Hugging Face format transform, the torchvision v2 wrapper's `transforms`).
- `workload.validate` -> `adapt_workload`: unwrap timm's PrefetchLoader, turn a
  LightningModule / LightningDataModule into a step, a transfer and a DataLoader.
- `iterable_duplicates`: a cheap check that an IterableDataset shards across workers.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import itertools
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

from .errors import BisectError

# extra of setup.cfg that installs each optional library
EXTRAS = {"datasets": "hf", "timm": "timm", "lightning": "lightning", "pytorch_lightning": "lightning",
          "webdataset": "webdataset"}


class PipelineWarning(UserWarning):
    """A problem of the user's pipeline found while measuring it (also in report.warnings)."""


def require(module: str) -> Any:
    """Import an optional library, or raise a BisectError that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS.get(module.split(".")[0], module)
        raise BisectError(
            f"this pipeline needs the optional library {module!r}, which is not installed ({exc}). "
            f'Install it with: pip install "bisect-pipeline[{extra}]"'
        ) from exc


def install_hint(exc: BaseException) -> Optional[str]:
    """For an ImportError of an optional library an integration covers: how to install it."""
    name = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    extra = EXTRAS.get((name or "").split(".")[0])
    if extra is None:
        return None
    return f'the pipeline needs {name.split(".")[0]!r}: pip install "bisect-pipeline[{extra}]"'


def _is(obj: Any, modules: tuple, names: tuple) -> bool:
    """Whether a class in obj's MRO is named one of `names` and defined under one of
    `modules` (checked by name: nothing is imported)."""
    if obj is None:
        return False
    for cls in type(obj).__mro__:
        mod = cls.__module__ or ""
        if cls.__name__ in names and any(mod == m or mod.startswith(m + ".") for m in modules):
            return True
    return False


_LIGHTNING = ("lightning.pytorch", "pytorch_lightning")


def is_lightning_module(obj: Any) -> bool:
    return _is(obj, _LIGHTNING, ("LightningModule",))


def is_lightning_datamodule(obj: Any) -> bool:
    return _is(obj, _LIGHTNING, ("LightningDataModule",))


def is_timm_prefetcher(obj: Any) -> bool:
    return _is(obj, ("timm",), ("PrefetchLoader",))


def is_hf_dataset(obj: Any) -> bool:
    return _is(obj, ("datasets",), ("Dataset",)) and hasattr(obj, "_format_kwargs")


def is_tv_v2_wrapper(obj: Any) -> bool:
    return _is(obj, ("torchvision",), ("VisionDatasetTVTensorWrapper",))


# --------------------------------------------------------------------------------------
# The raw split: transforms kept where libraries keep them
# --------------------------------------------------------------------------------------


def instrument_leaf(ds: Any, ds2: Any, where: str, recorder: Any, found: list) -> bool:
    """Proxy the transform of a library dataset on `ds2` (a shallow copy of `ds`).
    True when handled here (the generic attribute scan is then skipped)."""
    if is_hf_dataset(ds):
        _instrument_hf(ds, ds2, where, recorder, found)
        return True
    if is_tv_v2_wrapper(ds):
        # wrap_dataset_for_transforms_v2 moves the dataset's transforms onto the wrapper
        # (the inner dataset's are None) and calls only the joint `transforms` on the
        # wrapped sample: that call is the augment stage; reading, decoding and the
        # tv_tensor wrapping of the target are loading.
        from . import stages

        fn = getattr(ds, "transforms", None)
        if fn is not None and callable(fn):
            ds2.transforms = stages._RecordingTransform(fn, f"{where}.transforms", recorder)
            found.append(f"{where}.transforms ({type(fn).__name__}, wrap_dataset_for_transforms_v2)")
        return True
    return False


def _instrument_hf(ds: Any, ds2: Any, where: str, recorder: Any, found: list) -> None:
    # A Hugging Face Dataset keeps `with_transform` / `set_transform` in its format:
    # _format_type "custom", _format_kwargs["transform"]. The formatter reads the Arrow
    # row and decodes its features (images, audio: loading), then calls the transform on
    # a batch of one row (augment), then takes row 0 of each column. The copy gets its own
    # format kwargs with a recording proxy; the user's dataset keeps its own.
    kwargs = getattr(ds, "_format_kwargs", None) or {}
    fn = kwargs.get("transform")
    if getattr(ds, "_format_type", None) != "custom" or fn is None or not callable(fn):
        return
    ds2._format_kwargs = dict(kwargs, transform=_HFRecordingTransform(fn, f"{where}.set_transform", recorder))
    found.append(f"{where} format transform ({getattr(fn, '__qualname__', type(fn).__name__)}, "
                 "with_transform/set_transform)")


def no_transform_reason(ds: Any) -> Optional[str]:
    """Why `raw` is unavailable, in the library's own terms, when the dataset (or the one
    under a Subset chain) is a library dataset without a transform we can separate."""
    while isinstance(ds, torch.utils.data.Subset):
        ds = ds.dataset
    if is_hf_dataset(ds):
        fmt = getattr(ds, "_format_type", None)
        return (f"the Hugging Face Dataset has no format transform (its format is {fmt!r}): its rows are read, "
                "decoded and formatted in one step, so nothing separates loading from augmentation. Apply the "
                "per-sample transforms with ds.with_transform(fn) or ds.set_transform(fn) (not .map(), which "
                "runs once ahead of time) to make the raw point available")
    return None


def fetches_batches(ds: Any) -> bool:
    """Whether a DataLoader fetches a whole batch from `ds` in one call that runs a
    Hugging Face format transform once for all its rows (Dataset.__getitems__, also
    through Subset, which forwards it; ConcatDataset does not)."""
    while isinstance(ds, torch.utils.data.Subset):
        ds = ds.dataset
    return is_hf_dataset(ds) and callable(getattr(ds, "__getitems__", None))


def mark_batched(calls: list) -> None:
    """Mark the recorded format-transform calls of a sample as fetched in batches."""
    for call in calls:
        if isinstance(call.fn, HFRow):
            call.fn.batched = True


def replay_batched(templates: list, calls: list) -> Optional[list]:
    """Replay the samples of one batch with a single call of their format transform, as
    Dataset.__getitems__ does; None when these samples were not fetched that way (each
    is then replayed alone)."""
    if not templates or any(len(c) != 1 or not isinstance(c[0].fn, HFRow) or not c[0].fn.batched for c in calls):
        return None
    transform = calls[0][0].fn.transform
    if any(c[0].fn.transform is not transform for c in calls):
        return None
    from .stages import clone_data, set_path

    rows = [clone_data(c[0].args[0]) for c in calls]
    if not all(isinstance(r, Mapping) and not c[0].kwargs for r, c in zip(rows, calls)):
        return None
    batch = {k: [v for r in rows for v in r[k]] for k in rows[0]}
    out = transform(batch)
    samples = []
    for i, (template, c) in enumerate(zip(templates, calls)):
        row = {k: v[i] for k, v in out.items()}
        sample = template
        for elem, path in c[0].placements:
            sample = set_path(sample, path, row if elem is None else row[elem])
        samples.append(sample)
    return samples


def _recording_base():
    from . import stages

    return stages._RecordingTransform


class HFRow:
    """Replays a Hugging Face format transform on one recorded row batch and returns the
    row, as the formatter does (`{column: values[0]}`)."""

    def __init__(self, transform: Callable) -> None:
        self.transform = transform
        self.batched = False  # the loader fetches whole batches: replay_batched runs it once per batch

    def __call__(self, batch: Any) -> Any:
        out = self.transform(batch)
        return {k: v[0] for k, v in out.items()}


class HFLocate:
    """Where a replayed row goes in the sample: each column the transform returns."""

    def __init__(self, keys: list) -> None:
        self.keys = keys

    def __call__(self, sample: Any) -> Optional[list]:
        if not isinstance(sample, Mapping) or not self.keys:
            return None
        return [(k, (k,)) for k in self.keys if k in sample] or None


class _HFRecordingTransform:
    """Stands in for the format transform on the dataset copy (picklable for workers)."""

    stage = "augment"

    def __init__(self, fn: Callable, name: str, recorder: Any) -> None:
        self.inner = _recording_base()(fn, name, recorder)

    def __call__(self, batch: Any) -> Any:
        calls = self.inner.recorder.calls
        mark = len(calls) if calls is not None else None
        out = self.inner(batch)
        if mark is not None and len(calls) > mark:
            call = calls[-1]
            call.fn = HFRow(call.fn)
            call.output = None
            if isinstance(out, Mapping):
                call.locate = HFLocate(list(out.keys()))
        return out


# --------------------------------------------------------------------------------------
# Workload wrappers: timm PrefetchLoader, Lightning
# --------------------------------------------------------------------------------------


def adapt_workload(wl: Any, where: str) -> None:
    """Turn library wrappers into the Workload contract, in place: the loader becomes a
    torch DataLoader, and what the wrapper did on the device moves into the step."""
    if is_lightning_module(wl.model) or is_lightning_datamodule(wl.loader):
        _adapt_lightning(wl, where)
    if is_timm_prefetcher(wl.loader):
        _adapt_timm(wl, where)


class _LazyDefaultStep:
    """The default step, built on its first call (inside the run, so that model.train()
    is undone with the rest of the user's state)."""

    def __init__(self, model: Any, optimizer: Any, loss_fn: Any) -> None:
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self._step = None

    def __call__(self, batch: Any) -> Any:
        if self._step is None:
            from .workload import default_step

            params = [p for p in self.model.parameters() if p.requires_grad]
            if not params:
                raise BisectError("the model has no trainable parameter, so the default step has nothing to train; "
                                  "give your own step(batch).")
            self.model.train()
            self._step = default_step(self.model, self.optimizer or torch.optim.SGD(params, lr=0.01),
                                      self.loss_fn or torch.nn.CrossEntropyLoss())
        return self._step(batch)


class TimmDeviceWork:
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


def _adapt_timm(wl: Any, where: str) -> None:
    # timm.data.create_loader(use_prefetcher=True) returns a PrefetchLoader around the
    # real DataLoader (fast_collate: uint8 batches). It copies each batch to its device
    # and normalizes there. The bisection runs on the inner DataLoader; the device-side
    # work runs at the start of every step, at every point, so its cost is part of the
    # step (the ceiling), never lost and never counted as a pipeline stage.
    prefetcher = wl.loader
    inner = getattr(prefetcher, "loader", None)
    if not isinstance(inner, torch.utils.data.DataLoader):
        raise BisectError(f"{where}: the timm PrefetchLoader wraps a {type(inner).__name__}, not a DataLoader.")
    step = wl.step if wl.step is not None else _LazyDefaultStep(wl.model, wl.optimizer, wl.loss_fn)
    wl.loader = inner
    wl.step = ThenStep(TimmDeviceWork(prefetcher), step)


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


def _adapt_lightning(wl: Any, where: str) -> None:
    module = wl.model if is_lightning_module(wl.model) else None
    if is_lightning_datamodule(wl.loader):
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


# --------------------------------------------------------------------------------------
# IterableDataset: does it shard across workers?
# --------------------------------------------------------------------------------------

PROBE_SAMPLES = 2


def iterable_duplicates(dataset: Any, num_workers: int, worker_init_fn: Optional[Callable] = None) -> Optional[str]:
    """A warning when an IterableDataset yields the same first samples in two workers.

    The check runs in this process: for worker 0 and worker 1 it takes a fresh copy of
    the dataset, makes `torch.utils.data.get_worker_info()` return what a real worker
    would see (id, num_workers, that copy), calls the loader's worker_init_fn (where the
    torch docs shard), and takes the first samples. Equal fingerprints mean the workers
    would both yield them. This follows whatever sharding the dataset does (get_worker_info
    in __iter__, webdataset's split_by_worker, worker_init_fn) without starting a process
    or reading the dataset's code, and costs a few samples. RNG states and the thread count
    are restored after it.
    """
    if num_workers < 2 or not isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    from torch.utils.data._utils import worker as worker_mod

    from . import state as state_mod

    snap = state_mod.capture(None, None)
    prints = []
    try:
        for wid in (0, 1):
            ds = _probe_copy(dataset)
            saved = worker_mod._worker_info
            worker_mod._worker_info = worker_mod.WorkerInfo(id=wid, num_workers=num_workers, seed=wid, dataset=ds)
            it = None
            try:
                if worker_init_fn is not None:
                    worker_init_fn(wid)
                it = iter(ds)
                items = list(itertools.islice(it, PROBE_SAMPLES))
            finally:
                worker_mod._worker_info = saved
                close = getattr(it, "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception:
                        pass
            prints.append(_fingerprint(items))
    except Exception:
        return None  # the check is best effort; the measurement itself will show failures
    finally:
        state_mod.restore(snap, None, None)
    if not prints[0] or prints[0] != prints[1]:
        return None
    return (f"{type(dataset).__name__} is an IterableDataset that does not shard across workers: workers 0 and 1 of "
            f"{num_workers} yield the same first samples, so every sample comes {num_workers} times per epoch. "
            "Split the data by worker in __iter__ (torch.utils.data.get_worker_info()), or use a sharded source "
            "(e.g. webdataset's split_by_worker).")


# A dataset holding more than this in memory is probed on a shallow copy (a deep copy
# would cost time and memory); smaller ones on a deep copy, so that state their
# iterators keep (shard-shuffle epochs, counters) stays the user's own.
_DEEPCOPY_MAX_BYTES = 64 * 2**20


def _probe_copy(dataset: Any) -> Any:
    from .stages import nbytes

    try:
        if nbytes(vars(dataset)) <= _DEEPCOPY_MAX_BYTES:
            return copy.deepcopy(dataset)
    except Exception:  # not deep-copyable (open files, locks): a shallow copy
        pass
    return copy.copy(dataset)


def _fingerprint(obj: Any, depth: int = 0) -> Optional[str]:
    h = hashlib.sha1()
    if not _feed(h, obj, depth):
        return None
    return h.hexdigest()


def _feed(h: Any, obj: Any, depth: int) -> bool:
    if depth > 8:
        return True
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return True
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        h.update(repr(obj).encode())
        return True
    if isinstance(obj, Mapping):
        h.update(b"{")
        return all(_feed(h, k, depth + 1) and _feed(h, v, depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        h.update(b"[")
        return all(_feed(h, v, depth + 1) for v in obj)
    tobytes = getattr(obj, "tobytes", None)  # numpy arrays, PIL images
    if callable(tobytes):
        h.update(type(obj).__name__.encode())
        h.update(tobytes())
        return True
    if hasattr(obj, "__dict__"):
        h.update(type(obj).__name__.encode())
        return _feed(h, vars(obj), depth + 1)
    return False  # something we cannot compare: no verdict
