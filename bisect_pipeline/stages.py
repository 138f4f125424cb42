"""Describe the user's loader and split its dataset into loading and transforms.

Nothing here iterates the user's loader or changes the user's dataset: transforms are
proxied on shallow copies of the dataset chain (Subset, ConcatDataset, leaf dataset).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any, Callable, Optional

import torch
from torch.utils.data import ConcatDataset, DataLoader, IterableDataset, RandomSampler, Subset

from .faults import StageError, StepTimeout, stage_error

# Where torchvision conventions keep per-sample transforms on a dataset.
TRANSFORM_ATTRS = ("transforms", "transform", "target_transform")
# How deep to look for a transform's output inside a sample.
_MAX_DEPTH = 6
_SCALARS = (int, float, complex, str, bytes, bool, type(None))

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
            "multiprocessing_context": None if ctx is None else getattr(ctx, "_name", None) or str(ctx),
            "timeout": self.timeout,
            "in_order": self.in_order,
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
    )


def index_order(spec: LoaderSpec):
    """Yield dataset indices (map-style) or index lists (own batch sampler) forever,
    in the order the user's sampler gives, from a copy of it (the user's is untouched)."""
    source = spec.batch_sampler if spec.batch_sampler is not None else spec.sampler
    try:
        source = copy.deepcopy(source)
    except Exception:  # an unpicklable sampler: iterate it, its RNG state is restored after the run
        pass
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


# --------------------------------------------------------------------------------------
# Splitting loading from transforms (the `raw` point)
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Call:
    """One call of a transform recorded while a sample was built."""

    fn: Callable
    name: str
    args: tuple
    kwargs: dict
    output: Any = None
    placements: list = dataclasses.field(default_factory=list)  # (element index or None, path)
    locate: Optional[Callable] = None  # sample -> placements, when identity cannot find them (integrations)


class _Recorder:
    def __init__(self) -> None:
        self.calls: Optional[list[Call]] = None


class _RecordingTransform:
    """Stands in for a transform on the dataset copy: records its input, then runs it."""

    stage = "augment"  # what faults.stage_in_traceback names when it hangs

    def __init__(self, fn: Callable, name: str, recorder: _Recorder) -> None:
        self.fn = fn
        self.name = name
        self.recorder = recorder

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        recording = self.recorder.calls is not None
        if recording:
            saved_args, saved_kwargs = clone_data(args), clone_data(kwargs)
        try:
            out = self.fn(*args, **kwargs)
        except (StageError, StepTimeout):
            raise
        except Exception as exc:  # name the stage; the message survives a worker
            raise stage_error("augment", exc) from exc
        if recording:
            self.recorder.calls.append(Call(self.fn, self.name, saved_args, saved_kwargs, out))
        return out


@dataclasses.dataclass
class Instrumented:
    dataset: Any  # a shallow copy of the user's dataset chain with recording proxies
    found: list  # names of the transforms proxied, e.g. "dataset.transform (Compose)"
    recorder: _Recorder


def instrument(dataset: Any) -> Instrumented:
    """Copy the dataset chain and proxy every transform found on it."""
    recorder = _Recorder()
    found: list = []
    copied = _instrument(dataset, "dataset", recorder, found)
    return Instrumented(copied, found, recorder)


def _instrument(ds: Any, where: str, recorder: _Recorder, found: list) -> Any:
    ds2 = copy.copy(ds)
    if isinstance(ds, Subset):
        ds2.dataset = _instrument(ds.dataset, where + ".dataset", recorder, found)
        return ds2
    if isinstance(ds, ConcatDataset):
        ds2.datasets = [_instrument(d, f"{where}.datasets[{i}]", recorder, found) for i, d in enumerate(ds.datasets)]
        return ds2
    from . import integrations  # transforms kept where a library keeps them (HF format, tv v2 wrapper)

    if integrations.instrument_leaf(ds, ds2, where, recorder, found):
        return ds2
    for attr in TRANSFORM_ATTRS:
        fn = getattr(ds, attr, None)
        if fn is None or not callable(fn) or isinstance(fn, type):
            continue
        name = f"{where}.{attr}"
        try:
            setattr(ds2, attr, _RecordingTransform(fn, name, recorder))
        except (AttributeError, TypeError):  # a read-only property
            continue
        found.append(f"{name} ({type(fn).__name__})")
    return ds2


class SplitError(Exception):
    """The dataset cannot be split into loading and transforms; the message says why."""


def record_sample(inst: Instrumented, index: Any) -> tuple[Any, list[Call]]:
    """Build sample `index` through the proxies; return it and the transform calls that
    produced parts of it, with where each output landed."""
    inst.recorder.calls = []
    try:
        sample = inst.dataset[index]
        calls = inst.recorder.calls
    finally:
        inst.recorder.calls = None
    placed = []
    for call in calls:
        call.placements = call.locate(sample) if call.locate is not None else _locate(call.output, sample)
        call.locate = None
        if call.placements is None:
            raise SplitError(
                f"the output of {call.name} is changed inside __getitem__ before it is returned, so replaying "
                "the transform alone would not rebuild the sample. Apply everything after loading inside the "
                "transform (e.g. append the extra step to the Compose) to make the raw point available."
            )
        if call.placements:
            placed.append(call)
        call.output = None  # not needed any more; do not keep it alive
    return sample, placed


def _locate(output: Any, sample: Any) -> Optional[list]:
    """Where `output` (or each element of a tuple output) sits in `sample`, by identity.

    [] means nothing to replay (a scalar output, e.g. an int label: too cheap to matter
    and ambiguous to find); None means a non-scalar output is nowhere in the sample.
    """
    if isinstance(output, _SCALARS):
        return []
    path = _find(sample, output, ())
    if path is not None:
        return [(None, path)]
    if isinstance(output, (tuple, list)):
        placements = []
        for i, elem in enumerate(output):
            if isinstance(elem, _SCALARS):
                continue
            p = _find(sample, elem, ())
            if p is None:
                return None
            placements.append((i, p))
        return placements
    return None


def _find(obj: Any, target: Any, path: tuple) -> Optional[tuple]:
    if obj is target:
        return path
    if len(path) >= _MAX_DEPTH:
        return None
    for key, child in _children(obj):
        p = _find(child, target, path + (key,))
        if p is not None:
            return p
    return None


def _children(obj: Any):
    if isinstance(obj, (tuple, list)):
        return list(enumerate(obj))
    if isinstance(obj, dict):
        return list(obj.items())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return []


def set_path(obj: Any, path: tuple, value: Any) -> Any:
    """A copy of `obj` with the element at `path` replaced (containers are rebuilt)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(obj, tuple):
        items = list(obj)
        items[key] = set_path(items[key], rest, value)
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        items = list(obj)
        items[key] = set_path(items[key], rest, value)
        return items
    if isinstance(obj, dict):
        new = copy.copy(obj)
        new[key] = set_path(obj[key], rest, value)
        return new
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{key: set_path(getattr(obj, key), rest, value)})
    raise TypeError(f"cannot replace an element of a {type(obj).__name__}")


def replay_sample(template: Any, calls: list[Call]) -> Any:
    """Rebuild a sample: run each recorded transform on its cached input and put the
    output where it landed in the original sample."""
    sample = template
    for call in calls:
        out = call.fn(*clone_data(call.args), **clone_data(call.kwargs))
        for elem, path in call.placements:
            sample = set_path(sample, path, out if elem is None else out[elem])
    return sample


def same_structure(a: Any, b: Any) -> Optional[str]:
    """None if `a` and `b` have the same nesting, types, tensor dtypes and ranks; else
    a short description of the first difference."""
    if type(a) is not type(b):
        return f"{type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.dim() != b.dim():
            return f"tensor {a.dtype}/{a.dim()}d vs {b.dtype}/{b.dim()}d"
        return None
    ca, cb = _children(a), _children(b)
    if len(ca) != len(cb):
        return f"{len(ca)} vs {len(cb)} elements"
    for (ka, va), (kb, vb) in zip(ca, cb):
        if ka != kb:
            return f"key {ka!r} vs {kb!r}"
        diff = same_structure(va, vb)
        if diff:
            return f"[{ka!r}] {diff}"
    return None


def same_values(a: Any, b: Any) -> bool:
    """Equal tensors (values, shapes, dtypes) and equal everything else, recursively."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    ca, cb = _children(a), _children(b)
    if ca or cb:
        return type(a) is type(b) and len(ca) == len(cb) and all(
            ka == kb and same_values(va, vb) for (ka, va), (kb, vb) in zip(ca, cb))
    try:
        return bool(a == b)
    except Exception:
        return a is b


def clone_data(obj: Any) -> Any:
    """A copy that shares no tensor, array or image storage with `obj` (cached data must
    neither keep worker shared memory alive nor be changed by the code that uses it)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, tuple):
        items = [clone_data(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        return [clone_data(v) for v in obj]
    if isinstance(obj, dict):
        new = copy.copy(obj)
        for k, v in obj.items():
            new[k] = clone_data(v)
        return new
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: clone_data(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init})
    module = type(obj).__module__ or ""
    if module.startswith("numpy") or module.startswith("PIL"):
        return obj.copy()
    if _batch_object(obj):  # a custom batch class: copy it, with its tensors cloned
        try:
            new = copy.copy(obj)
            for k, v in vars(obj).items():
                setattr(new, k, clone_data(v))
            return new
        except (AttributeError, TypeError, copy.Error):  # read-only attributes: keep it as it is
            return obj
    return obj


def _batch_object(obj: Any) -> bool:
    """A custom batch class (the torch docs' pattern): plain attributes and a
    `pin_memory()` or `to()` method."""
    return (hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module))
            and (callable(getattr(obj, "pin_memory", None)) or callable(getattr(obj, "to", None))))


def nbytes(obj: Any, _depth: int = 0) -> int:
    """Approximate memory held by tensors, arrays and images inside `obj`."""
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    if _depth > _MAX_DEPTH:
        return 0
    if isinstance(obj, (tuple, list)):
        return sum(nbytes(v, _depth + 1) for v in obj)
    if isinstance(obj, dict):
        return sum(nbytes(v, _depth + 1) for v in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(nbytes(getattr(obj, f.name), _depth + 1) for f in dataclasses.fields(obj))
    n = getattr(obj, "nbytes", None)
    if isinstance(n, int):
        return n
    size = getattr(obj, "size", None)
    if type(obj).__module__.startswith("PIL") and isinstance(size, tuple):
        return size[0] * size[1] * len(obj.getbands())
    return 0


def leading_dim(batch: Any) -> Optional[int]:
    """The batch size a batch carries: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    for _, child in _children(batch):
        n = leading_dim(child)
        if n is not None:
            return n
    return None

