"""Planted bottlenecks: tiny pipelines whose stages cost a known time, to check the tool
on a machine (the tests and the benchmark scripts use them).

Costs are planted with time.sleep: a sleeping stage needs no CPU, so the planted
bottleneck stays the bottleneck on a busy 2-core machine, and workers overlap it the way
they overlap real I/O. `planted(kind)` plants one bottleneck, several times every other
stage:

    from bisect_pipeline import bisect
    from bisect_pipeline.testing import planted

    model, loader = planted("augment", num_workers=2)
    assert bisect(model, loader).bottleneck == "augment"

Two presets: the tests' (`planted`: batch 8, 5 ms per sample, a 2 ms step) and the
benchmarks' (`benchmark`: batch 16, 3 ms per sample, a 5 ms step, the scripts' numbers).
"""

from __future__ import annotations

import builtins
import os
import time
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

FEATURES = 16
CLASSES = 4
KINDS = ("load", "augment", "collate", "model")
# What the bisection should name for each planted kind (a model-bound step: the pipeline keeps up).
EXPECTED = {"load": "load", "augment": "augment", "collate": "collate", "model": "none"}


class Sleep:
    """A picklable transform that costs `ms` and returns its input."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        if self.ms:
            time.sleep(self.ms / 1e3)
        return x


class Spin:
    """A picklable transform that costs `ms` of this thread's CPU time (not wall time):
    on a core shared with other work it takes longer, as real compute does."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        end = time.thread_time() + self.ms / 1e3
        while time.thread_time() < end:
            pass
        return x


class SleepLayer(nn.Module):
    """A layer whose forward costs `ms`."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ms:
            time.sleep(self.ms / 1e3)
        return x


class SlowCollate:
    """default_collate that first costs `ms` per batch."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, samples: list) -> Any:
        time.sleep(self.ms / 1e3)
        return default_collate(samples)


class PlantedDataset(Dataset):
    """Map-style: loading costs `load_ms` per sample, `self.transform` what it costs."""

    def __init__(self, n: int = 64, load_ms: float = 0.0, transform: Any = None, dict_samples: bool = False,
                 features: int = FEATURES) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randn(n, features, generator=g)
        self.targets = torch.arange(n) % CLASSES
        self.load_ms = load_ms
        self.transform = transform
        self.dict_samples = dict_samples
        self.getitem_calls = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        self.getitem_calls += 1
        if self.load_ms:
            time.sleep(self.load_ms / 1e3)
        x = self.data[i].clone()
        if self.transform is not None:
            x = self.transform(x)
        y = int(self.targets[i])
        if self.dict_samples:
            return {"inputs": x, "targets": y}
        return x, y


class Crops:
    """A picklable transform that makes `k` samples of one, as MONAI's
    RandCropByPosNegLabeld(num_samples=k) does: a list of k {"image", "label"} dicts.
    Costs `ms` per item."""

    def __init__(self, k: int, ms: float = 0.0) -> None:
        self.k = k
        self.ms = ms

    def __call__(self, sample: dict) -> list:
        if self.ms:
            time.sleep(self.ms / 1e3)
        return [{"image": sample["image"] + i, "label": sample["label"]} for i in range(self.k)]


class SeveralPerItem(Dataset):
    """Map-style: each item is {"image", "label"} through `self.transform`, a Crops(k)
    that makes k samples of it (a list); flatten_collate batches them all."""

    def __init__(self, n: int = 64, k: int = 4, ms: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randn(n, FEATURES, generator=g)
        self.transform = Crops(k, ms)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> list:
        return self.transform({"image": self.data[i].clone(), "label": i % CLASSES})


def flatten_collate(items: list) -> Any:
    """default_collate of the samples of every item, each item a list of samples: the
    step gets them all, as MONAI's list_data_collate gives them."""
    return default_collate([s for item in items for s in item])


class PlantedIterable(IterableDataset):
    """An IterableDataset that shards by worker; loading costs `load_ms` per sample."""

    def __init__(self, n: int = 64, load_ms: float = 0.0) -> None:
        self.n = n
        self.load_ms = load_ms

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if self.load_ms:
                time.sleep(self.load_ms / 1e3)
            yield torch.full((FEATURES,), float(i)), i % CLASSES


def tiny_model(step_ms: float = 0.0, features: int = FEATURES) -> nn.Module:
    """A linear classifier whose forward first costs `step_ms`."""
    torch.manual_seed(0)
    return nn.Sequential(SleepLayer(step_ms), nn.Linear(features, CLASSES))


def make_loader(dataset: Dataset, batch_size: int = 8, num_workers: int = 0, **kw: Any) -> DataLoader:
    """A shuffling DataLoader; workers are forked (fast to start, as on Linux by default)."""
    if num_workers:
        kw.setdefault("multiprocessing_context", "fork")
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=True, **kw)


def planted(kind: str, num_workers: int = 0, *, batch_size: int = 8, per_sample_ms: float = 5.0,
            step_ms: float = 2.0, model_step_ms: float = 80.0, n: int = 64,
            collate_ms: Optional[float] = None, dict_samples: bool = False) -> tuple[nn.Module, DataLoader]:
    """(model, loader) with one planted bottleneck: load, augment, collate or model.

    Defaults (the tests'): per batch of 8 the bottleneck costs >= 40 ms (20 ms per batch
    even spread over two workers; the model-bound step 80 ms: two workers' IPC and their
    CPU use cost the loop ~2 ms per batch on a 2-core machine, which must stay well under
    the 5% floor of a real drop); every other stage about 2 ms or less. A collate
    bottleneck costs the batch's per-sample cost, doubled with workers (`collate_ms`).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    load_ms = per_sample_ms if kind == "load" else 0.0
    aug_ms = per_sample_ms if kind == "augment" else 0.0
    if collate_ms is None:
        collate_ms = per_sample_ms * batch_size * (2 if num_workers else 1)
    collate = SlowCollate(collate_ms) if kind == "collate" else None
    ds = PlantedDataset(n=n, load_ms=load_ms, transform=Sleep(aug_ms), dict_samples=dict_samples)
    loader = make_loader(ds, batch_size=batch_size, num_workers=num_workers, collate_fn=collate)
    return tiny_model(model_step_ms if kind == "model" else step_ms), loader


# The benchmarks' preset (scripts/). The model-bound step is 80 ms: with two workers on a
# 2-core VM, the workers' hand-off and wake-ups cost the loop 2-4 ms per batch, which
# against a 48 ms step is a real 6% handoff drop, not a model-bound pipeline.
BENCH_BATCH = 16
BENCH_PER_SAMPLE_MS = 3.0
BENCH_STEP_MS = 5.0
BENCH_MODEL_STEP_MS = 80.0


def benchmark(kind: str, num_workers: int = 0) -> tuple[nn.Module, DataLoader]:
    """The benchmark scripts' planted workload (bench_verdicts, bench_under_load)."""
    return planted(kind, num_workers, batch_size=BENCH_BATCH, per_sample_ms=BENCH_PER_SAMPLE_MS,
                   step_ms=BENCH_STEP_MS, model_step_ms=BENCH_MODEL_STEP_MS, n=512,
                   collate_ms=BENCH_PER_SAMPLE_MS * BENCH_BATCH)


class SlowFiles:
    """A planted slow file system: while open, files under `root` opened for reading in
    binary mode through builtins.open cost `ms_per_file` on their first read and
    `ms_per_mb` per 10^6 bytes read (slept, like a network file system's round trips and
    bandwidth). Wraps whatever builtins.open is at the time and restores it on exit; in
    this process only (workers forked inside inherit it)."""

    def __init__(self, root: Any, ms_per_file: float = 0.0, ms_per_mb: float = 0.0) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.ms_per_file = ms_per_file
        self.ms_per_mb = ms_per_mb
        self._open: Any = None

    def _under_root(self, file: Any) -> bool:
        if isinstance(file, int):
            return False
        path = os.path.realpath(os.fsdecode(os.fspath(file)))
        return path == self.root or path.startswith(self.root + os.sep)

    def __enter__(self) -> "SlowFiles":
        original = self._open = builtins.open

        def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            f = original(file, mode, *args, **kwargs)
            if "b" in mode and "r" in mode and "+" not in mode and self._under_root(file):
                return _SlowFile(f, self)
            return f
        builtins.open = open
        return self

    def __exit__(self, *exc: Any) -> None:
        builtins.open = self._open


class _SlowFile:
    """A file of a SlowFiles: its reads sleep first."""

    def __init__(self, f: Any, slow: SlowFiles) -> None:
        self._f, self._slow, self._first = f, slow, True

    def _cost(self, nbytes: int) -> None:
        ms = self._slow.ms_per_mb * nbytes / 1e6 + (self._slow.ms_per_file if self._first else 0.0)
        self._first = False
        if ms > 0:
            time.sleep(ms / 1e3)

    def read(self, *args: Any) -> bytes:
        data = self._f.read(*args)
        self._cost(len(data or b""))
        return data

    def readinto(self, b: Any) -> Optional[int]:
        n = self._f.readinto(b)
        self._cost(n or 0)
        return n

    def __enter__(self) -> "_SlowFile":
        self._f.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._f.__exit__(*exc)

    def __iter__(self):
        return iter(self.readline, b"")

    def __getattr__(self, name: str) -> Any:
        if name in ("_f", "_slow", "_first"):
            raise AttributeError(name)
        return getattr(self._f, name)


def planted_nodes(kind: str, num_workers: int = 2, *, batch_size: int = 8, per_sample_ms: float = 5.0,
                  step_ms: float = 2.0, model_step_ms: float = 80.0, n: int = 64, method: str = "thread",
                  prefetch_factor: Optional[int] = 2, loader: bool = True) -> tuple[nn.Module, Any]:
    """(model, a torchdata.nodes Loader) with one planted bottleneck, as `planted`:

        IterableWrapper(PlantedIterable: load) -> ParallelMapper(Sleep: augment, num_workers)
        -> Batcher(batch_size) -> Mapper(SlowCollate or default_collate: collate) -> Prefetcher

    The source is read in one thread (its cost per batch is the batch's per-sample cost),
    the augment spread over the mapper's workers, the collate in the Prefetcher's thread.
    `loader=False`: the root node itself; `prefetch_factor=None`: no Prefetcher."""
    import torchdata.nodes as tn

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    source = tn.IterableWrapper(PlantedIterable(n=n, load_ms=per_sample_ms if kind == "load" else 0.0))
    node = tn.ParallelMapper(source, Sleep(per_sample_ms if kind == "augment" else 0.0), num_workers=num_workers,
                             method=method)
    node = tn.Batcher(node, batch_size=batch_size)
    node = tn.Mapper(node, SlowCollate(per_sample_ms * batch_size) if kind == "collate" else default_collate)
    if prefetch_factor:
        node = tn.Prefetcher(node, prefetch_factor=prefetch_factor)
    return tiny_model(model_step_ms if kind == "model" else step_ms), (tn.Loader(node) if loader else node)
