"""Tiny fakes with planted stage costs, shared by the tests.

Costs are planted with time.sleep: a sleeping stage needs no CPU, so the planted
bottleneck stays the bottleneck on a busy 2-core CI machine, and workers overlap it
the way they overlap real I/O. Margins are wide: the bottleneck costs several times
every other stage.
"""

from __future__ import annotations

import gc
import multiprocessing
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from bisect_pipeline import Plan

FEATURES = 16
CLASSES = 4

# Short windows keep each end-to-end run to a few seconds; the verdict margins below
# do not need more.
FAST_PLAN = Plan(window_seconds=0.15)


class Sleep:
    """A picklable transform that costs `ms` and returns its input."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x):
        if self.ms:
            time.sleep(self.ms / 1e3)
        return x


class ToFloat:
    def __call__(self, x):
        return x.float() * 2.0


class PlantedDataset(Dataset):
    """Map-style: loading costs `load_ms` per sample, `self.transform` what it costs."""

    def __init__(self, n: int = 64, load_ms: float = 0.0, transform=None, dict_samples: bool = False) -> None:
        self.data = torch.randn(n, FEATURES)
        self.targets = torch.arange(n) % CLASSES
        self.load_ms = load_ms
        self.transform = transform
        self.dict_samples = dict_samples
        self.getitem_calls = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
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


class PlantedIterable(IterableDataset):
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


class SlowCollate:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, samples):
        time.sleep(self.ms / 1e3)
        return default_collate(samples)


class SleepLayer(nn.Module):
    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms

    def forward(self, x):
        if self.ms:
            time.sleep(self.ms / 1e3)
        return x


def tiny_model(step_ms: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(SleepLayer(step_ms), nn.Linear(FEATURES, CLASSES))


def make_loader(dataset, batch_size: int = 8, num_workers: int = 0, **kw) -> DataLoader:
    if num_workers:
        kw.setdefault("multiprocessing_context", "fork")
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=True, **kw)


def planted(kind: str, num_workers: int = 0, **kw):
    """(model, loader) with one planted bottleneck: load, augment, collate or model.

    Per batch of 8: the bottleneck costs >= 40 ms (20 ms per batch even spread over
    two workers; the model-bound step 80 ms); every other stage costs about 2 ms or less.
    """
    load_ms = 5.0 if kind == "load" else 0.0
    aug_ms = 5.0 if kind == "augment" else 0.0
    collate = SlowCollate(40.0 if num_workers == 0 else 80.0) if kind == "collate" else None
    # 80 ms: two workers' IPC and their CPU use cost the loop ~2 ms per batch on a
    # 2-core machine, which must stay well under the 5% floor of a real drop.
    step_ms = 80.0 if kind == "model" else 2.0
    ds = PlantedDataset(load_ms=load_ms, transform=Sleep(aug_ms), **kw)
    loader = make_loader(ds, num_workers=num_workers, collate_fn=collate)
    return tiny_model(step_ms), loader


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Steps use one thread: on a 2-core CI machine torch's intra-op threads and the
    loader's workers would otherwise fight for the cores and spike step times 10x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_leftover_workers():
    """Fails the test if a worker process outlives it."""
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []
