"""A step that synchronizes every step (`loss.item()`) fed by workers whose work overlaps
it (issue 44, item 3): the tool's `full` point, and the pipeline with each epoch's start
(the report's run.epoch_start), against a hand loop over the same loader's epochs, in
alternation (hand, tool, hand, ... : --runs tool runs, the hand before and after each).

On the CPU the step is a sleep of --step-ms (a GPU's work waited for: no CPU used) and
each sample sleeps --sample-ms in the workers; on CUDA (--device cuda) it is a resnet18
step on batches of uint8 images (pinned, 4 workers by default) with loss.item() each step.

    python scripts/bench_syncing_step.py                         # CPU: 2 workers, 16-batch epochs
    python scripts/bench_syncing_step.py --epoch-batches 64 --persistent
    python scripts/bench_syncing_step.py --device cuda --workers 4 --batch-size 128 --epoch-batches 64

Targets: with_epochs within 5% of the hand loop; `full` alone within 5% where the
workers are persistent (its epoch start is then the prefetch refilled, a batch or so).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bisect_pipeline import bisect, testing


class Images(Dataset):
    """uint8 images made in memory, converted to float in the workers."""

    def __init__(self, n: int, side: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i].float().div_(255), self.y[i]


def build(args):
    n = args.epoch_batches * args.batch_size
    kw = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
              persistent_workers=args.persistent, pin_memory=args.device == "cuda")
    if args.device == "cuda":
        import torchvision

        model = torchvision.models.resnet18(num_classes=10).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = nn.CrossEntropyLoss()

        def step(batch):
            x, y = batch
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            loss.item()  # the sync
        return model, DataLoader(Images(n, args.side), **kw), step
    model = testing.tiny_model(0)

    def step(batch):
        time.sleep(args.step_ms / 1e3)
    ds = testing.PlantedDataset(n=n, transform=testing.Sleep(args.sample_ms))
    return model, DataLoader(ds, multiprocessing_context="fork", **kw), step


def hand(loader, step, device: str, epochs: int) -> float:
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    n = 0
    sync()
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            step((x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)))
            n += 1
    sync()
    return n * loader.batch_size / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--epoch-batches", type=int, default=16)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--step-ms", type=float, default=10.0, help="CPU: the step's wait")
    ap.add_argument("--sample-ms", type=float, default=1.4, help="CPU: each sample's cost in a worker")
    ap.add_argument("--side", type=int, default=112, help="CUDA: image side")
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--hand-epochs", type=int, default=0,
                    help="epochs a hand block (default: about 128 batches, at least 2 epochs)")
    args = ap.parse_args()
    model, loader, step = build(args)
    # The hand's two blocks together time about as many epochs as the tool's epochs visit or
    # more (on 2 cores: 9-10 epochs of 16 batches): on a busy machine one block of 4 epochs
    # read 7-13% from the next, a reference noisier than what it checks.
    epochs = args.hand_epochs or max(2, 128 // args.epoch_batches)
    hand(loader, step, args.device, 1)  # warm
    ratios_full, ratios_epochs = [], []
    for r in range(args.runs):
        before = hand(loader, step, args.device, epochs)
        rep = bisect(model, loader, step=step, device=args.device, points=("device", "host", "full"),
                     max_seconds=args.max_seconds, verify_seconds=0)
        after = hand(loader, step, args.device, epochs)
        h = (before + after) / 2
        e = rep.measurements.run.epoch_start or {}
        full = rep.rate("full")
        with_epochs = e.get("samples_per_sec_with_epochs")
        ratios_full.append(full / h)
        if with_epochs:
            ratios_epochs.append(with_epochs / h)
        print(f"run {r + 1}: hand {before:.1f} / {after:.1f}; full {full:.1f} ({full / h:.3f}); with each epoch's "
              f"start {with_epochs} ({(with_epochs or 0) / h:.3f}; {e.get('ms_per_epoch')} ms an epoch "
              f"+- {e.get('ms_per_epoch_se')}, {e.get('how')}, {e.get('epochs_timed')} epochs); "
              f"verdict {rep.bottleneck}", flush=True)
    print(f"median: full / hand {statistics.median(ratios_full):.3f}; with epochs / hand "
          f"{statistics.median(ratios_epochs) if ratios_epochs else float('nan'):.3f}")


if __name__ == "__main__":
    main()
