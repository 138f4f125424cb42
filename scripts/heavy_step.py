"""A heavy training step behind a light pipeline, for the bounds of a run with long steps:
8 samples of 2 ms per batch (load), a step of HEAVY_STEP_S seconds (1.5 by default,
time.sleep: the same on any machine). The right verdict is `none`.

    bisect-pipeline --entry scripts/heavy_step.py:make --max-seconds 30 --device cpu --json heavy.json
        # warns "a verdict needs at least about N s"; run.elapsed_s <= 30
    bisect-pipeline --entry scripts/heavy_step.py:make --max-seconds N --device cpu
        # with the budget it named: a verdict
"""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

from bisect_pipeline import Workload


class Samples(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        time.sleep(0.002)
        return torch.randn(16), i % 2


def make() -> Workload:
    model = torch.nn.Linear(16, 2)
    seconds = float(os.environ.get("HEAVY_STEP_S", "1.5"))

    def step(batch):
        time.sleep(seconds)
        model(batch[0]).sum().backward()

    return Workload(model=model, loader=DataLoader(Samples(), batch_size=8), step=step)
