"""A heavy training step behind a light pipeline, for runs with long steps: 8 samples per
batch, each loaded in HEAVY_LOAD_MS (2 ms by default) and augmented in HEAVY_AUGMENT_MS (0 by
default), behind a step of HEAVY_STEP_S seconds (1.5 by default). Every cost is a
time.sleep, the same on any machine. The right verdict is `none`, or `augment` with
HEAVY_AUGMENT_MS large enough (125 ms a sample: 1 s a batch).

    bisect-pipeline --entry scripts/heavy_step.py:make --max-seconds 30 --device cpu --json heavy.json
        # warns "a verdict needs at least about N s"; run.elapsed_s <= 30
    HEAVY_STEP_S=2 HEAVY_AUGMENT_MS=125 bisect-pipeline --entry scripts/heavy_step.py:make --max-seconds 60 --device cpu
        # a 2 s step and a 1 s augment: `augment` in 60 s (scripts/bench_heavy_step.py)
    HEAVY_STEP_S=1.7 HEAVY_JITTER=0.3 HEAVY_LOAD_MS=1.5 bisect-pipeline --entry scripts/heavy_step.py:make --max-seconds 60
        # a bursty 1.7-s step (+-30%) behind 12 ms of input a batch: `none`, on the isolated costs
    HEAVY_STEP_S=2 HEAVY_SAMPLER_MS=400 bisect-pipeline --entry scripts/heavy_step.py:make --device cpu
        # 400 ms a batch in the batch sampler, which the stages timed alone do not see: never `none`
"""

from __future__ import annotations

import os
import random
import time

import torch
from torch.utils.data import DataLoader, Dataset

from bisect_pipeline import Workload
from bisect_pipeline.testing import Sleep


class Samples(Dataset):
    def __init__(self, load_ms: float, augment_ms: float) -> None:
        self.load_ms = load_ms
        self.transform = Sleep(augment_ms)

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        time.sleep(self.load_ms / 1e3)
        return self.transform(torch.randn(16)), i % 2


def make() -> Workload:
    model = torch.nn.Linear(16, 2)
    seconds = float(os.environ.get("HEAVY_STEP_S", "1.5"))
    jitter = float(os.environ.get("HEAVY_JITTER", "0"))
    data = Samples(float(os.environ.get("HEAVY_LOAD_MS", "2")), float(os.environ.get("HEAVY_AUGMENT_MS", "0")))
    rng = random.Random(0)

    def step(batch):
        # HEAVY_JITTER: a bursty step, each one its time times 1 +- up to that (uniform):
        # the rounds of a 60-s run cannot bound a small loss under it
        time.sleep(seconds * (1 + jitter * (2 * rng.random() - 1)))
        model(batch[0]).sum().backward()

    workers = int(os.environ.get("HEAVY_WORKERS", "0"))
    sampler_ms = float(os.environ.get("HEAVY_SAMPLER_MS", "0"))
    if sampler_ms:  # input work the stages timed alone do not see: the loop's batch sampler
        batches = SlowBatches(torch.utils.data.BatchSampler(range(len(data)), 8, drop_last=True), sampler_ms)
        return Workload(model=model, loader=DataLoader(data, batch_sampler=batches, num_workers=workers), step=step)
    return Workload(model=model, loader=DataLoader(data, batch_size=8, num_workers=workers), step=step)


class SlowBatches:
    """A batch sampler that takes `ms` to give each batch (HEAVY_SAMPLER_MS): input work in
    the loop at `full` that the stages' costs alone do not time (they fetch the samples
    of batches taken before), so a run that trusts them alone would miss it."""

    def __init__(self, inner, ms: float) -> None:
        self.inner, self.ms = inner, ms

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        for b in self.inner:
            time.sleep(self.ms / 1e3)
            yield b
