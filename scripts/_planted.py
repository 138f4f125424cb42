"""Planted-bottleneck workloads shared by the benchmark scripts.

Each stage's cost is a `time.sleep` of a known length, so the expected cost per batch
is exact and the 2-core machine's CPU contention does not distort it. Batch size 16;
the bottleneck costs 3 ms per sample (48 ms per batch) where it is planted, every
other stage about 1 ms per batch or less, and the step 5 ms (48 ms when model-bound).
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

BATCH = 16
PER_SAMPLE_MS = 3.0
STEP_MS = 5.0
FEATURES, CLASSES = 32, 4
KINDS = ("load", "augment", "collate", "model")
EXPECTED = {"load": "load", "augment": "augment", "collate": "collate", "model": "none"}
PLANTED_MS_PER_BATCH = PER_SAMPLE_MS * BATCH  # 48 ms


class Sleep:
    """A transform that costs `ms` per call."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x):
        if self.ms:
            time.sleep(self.ms / 1e3)
        return x


class SleepLayer(nn.Module):
    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms

    def forward(self, x):
        time.sleep(self.ms / 1e3)
        return x


class Data(Dataset):
    def __init__(self, n: int = 512, load_ms: float = 0.0, transform=None) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randn(n, FEATURES, generator=g)
        self.targets = torch.arange(n) % CLASSES
        self.load_ms = load_ms
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        if self.load_ms:
            time.sleep(self.load_ms / 1e3)
        x = self.data[i].clone()
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.targets[i])


class SlowCollate:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, samples):
        time.sleep(self.ms / 1e3)
        return default_collate(samples)


def model(step_ms: float = STEP_MS) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(SleepLayer(step_ms), nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def workload(kind: str, num_workers: int = 0):
    """(model, loader) with the bottleneck `kind` planted."""
    ms = PER_SAMPLE_MS
    ds = Data(load_ms=ms if kind == "load" else 0.0, transform=Sleep(ms if kind == "augment" else 0.0))
    collate = SlowCollate(ms * BATCH) if kind == "collate" else None
    kw = {"multiprocessing_context": "fork"} if num_workers else {}
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=num_workers, collate_fn=collate, **kw)
    return model(ms * BATCH if kind == "model" else STEP_MS), loader
