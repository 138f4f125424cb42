"""A CPU stand-in for a short script on a fast GPU (issue 44): the PyTorch MNIST example's
pipeline (28x28 images as PIL, ToTensor and Normalize, batch 64, one worker), 94 batches
an epoch and its default of 14 epochs (1,316 batches), and a training step of 2 ms that
does not use the CPU (a sleep, as a step waits on the GPU), with `loss.item()`-like
bookkeeping every step. Run it under the tool:

    bisect-pipeline run scripts/fast_step.py [--epochs 14] [--step-ms 2]

(scripts/bench_fast_step.py runs it three times and says whether each got a verdict
before the script ended.)
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class Digits(Dataset):
    """MNIST-sized grey images made in memory, as PIL images (what torchvision's MNIST returns)."""

    def __init__(self, n: int, transform) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        self.targets = rng.integers(0, 10, n).tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(Image.fromarray(self.images[i], mode="L")), self.targets[i]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=14)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--batches", type=int, default=94, help="batches an epoch")
    args = ap.parse_args()
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    loader = DataLoader(Digits(args.batches * args.batch_size, tf), batch_size=args.batch_size, shuffle=True,
                        num_workers=1, pin_memory=False)
    model = nn.Linear(28 * 28, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0, n = time.perf_counter(), 0
    for epoch in range(1, args.epochs + 1):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x.flatten(1)), y)
            loss.backward()
            opt.step()
            time.sleep(args.step_ms / 1e3)  # the GPU's work, waited for by loss.item()
            loss.item()
            n += 1
    print(f"trained {n} batches in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
