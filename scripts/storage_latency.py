"""A CPU stand-in for a loader that waits on storage (issue 51): a map-style dataset whose
every sample waits `--latency-ms` (4 by default) on "storage" (a sleep: a network file
system, an object store, a database read) before a small tensor comes back, loaded by a
DataLoader with `-j 1` worker, and a small training step (an MLP of a few ms on the CPU).
The workers wait more than they compute, so many overlap their waits even on 2 cores:
by hand `-j 8` is several times faster than `-j 1` (`--hand` measures it).

    bisect-pipeline run --tune --patch p.diff --max-seconds 60 scripts/storage_latency.py
    python scripts/storage_latency.py --hand            # the hand's -j 1 / -j 8 (and more)

Its training loader is built from `-j/--workers` (the flag a `--tune` change rewrites),
with `persistent_workers` and `prefetch_factor` left at DataLoader's defaults.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 256
CLASSES = 10


class Stored(Dataset):
    """`n` samples of FEATURES floats and a class, each read after `latency_ms` of waiting."""

    def __init__(self, n: int, latency_ms: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)
        self.latency = latency_ms / 1e3

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.latency)  # the storage's latency: a wait, not CPU work
        return self.x[i].clone(), self.y[i]


def model_and_step(hidden: int):
    model = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return model, step


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-j", "--workers", type=int, default=1, help="DataLoader num_workers (default 1)")
    ap.add_argument("-b", "--batch-size", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=1024, help="samples an epoch")
    ap.add_argument("--latency-ms", type=float, default=4.0, help="the wait of each sample on storage")
    ap.add_argument("--hidden", type=int, default=512, help="the MLP's width (the step's cost)")
    ap.add_argument("--hand", action="store_true", help="time a hand loop at -j 1 and at --hand-workers instead")
    ap.add_argument("--hand-workers", default="1,8", help="the worker counts --hand times, alternating")
    ap.add_argument("--hand-rounds", type=int, default=3)
    ap.add_argument("--hand-batches", type=int, default=60, help="batches timed in each round (after 10 untimed)")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.hand:
        return hand(args)
    data = Stored(args.samples, args.latency_ms)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    _, step = model_and_step(args.hidden)
    t0, n = time.perf_counter(), 0
    for epoch in range(args.epochs):
        for x, y in loader:
            step(x, y).item()
            n += 1
    print(f"trained {n} batches in {time.perf_counter() - t0:.1f} s")


def hand(args) -> None:
    """The training loop by hand at each worker count of --hand-workers (persistent
    workers, so that a round times the steady loop, not a pool's start), in alternating
    rounds: median ms a batch per count, and each count's speed over the first's."""
    counts = [int(c) for c in args.hand_workers.split(",")]
    data = Stored(args.samples, args.latency_ms)
    _, step = model_and_step(args.hidden)
    loaders = {c: DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=c,
                             persistent_workers=c > 0) for c in counts}
    its = {c: iter(loaders[c]) for c in counts}

    def batch(c):
        try:
            return next(its[c])
        except StopIteration:
            its[c] = iter(loaders[c])
            return next(its[c])
    ms: dict = {c: [] for c in counts}
    for r in range(args.hand_rounds):
        for c in (counts if r % 2 == 0 else counts[::-1]):
            for _ in range(10):
                step(*batch(c))
            t = time.perf_counter()
            for _ in range(args.hand_batches):
                step(*batch(c)).item()
            ms[c].append((time.perf_counter() - t) / args.hand_batches * 1e3)
    base = statistics.median(ms[counts[0]])
    for c in counts:
        m = statistics.median(ms[c])
        print(f"-j {c}: {m:.2f} ms a batch (rounds {', '.join(f'{x:.2f}' for x in ms[c])}); "
              f"{base / m:.2f}x of -j {counts[0]}")


if __name__ == "__main__":
    main()
