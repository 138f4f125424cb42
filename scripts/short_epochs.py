"""A MONAI-like pipeline with short epochs (issue 22): 4 workers that are not persistent,
10 batches an epoch, each item cropped into 4 samples that the collate flattens (MONAI's
RandCropByPosNegLabeld(num_samples=4) with list_data_collate), a 0.4 MB float batch, a
100 ms step. Each worker takes START_S (0.15 s) to start, as a worker that sets up its
transforms and files does; started again every epoch, that is about 15 ms a batch.

    python scripts/short_epochs.py                   # a hand loop both ways, then bisect()
    bisect-pipeline --entry scripts/short_epochs.py:make --max-seconds 40 --verify-seconds 60 --device cpu

What to look for: the hand loop's ms/batch with persistent_workers False and True; the
report's batch size ("8 (counted in the collated batch: loader batch_size 2 x 4 per
sample)") and its persistent_workers item, with the check's "128 -> 110 ms/batch".
All costs are time.sleep: the same on any machine, whatever else runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bisect_pipeline import Workload, bisect  # noqa: E402
from bisect_pipeline.testing import SleepLayer, flatten_collate  # noqa: E402

START_S = 0.15  # a worker's start
ITEMS, BATCH, CROPS, WORKERS = 20, 2, 4, 4  # 10 batches an epoch, 8 crops a step
CROP_MS = 10.0  # per item
STEP_MS = 100.0


class Volumes(Dataset):
    """Items of one 48^3 float32 volume, cropped by `transform` into CROPS 24^3 samples."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.volumes = [torch.randn(1, 48, 48, 48, generator=g) for _ in range(ITEMS)]
        self.transform = Crop()

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> list:
        return self.transform({"image": self.volumes[i].clone(), "label": i % 2})


class Crop:
    """CROPS crops of 24^3, a list of {"image", "label"} samples (RandCropByPosNegLabeld)."""

    def __call__(self, item: dict) -> list:
        time.sleep(CROP_MS / 1e3)
        return [{"image": item["image"][:, k * 8:k * 8 + 24, 0:24, 0:24].clone(), "label": item["label"]}
                for k in range(CROPS)]


def slow_start(worker_id: int) -> None:
    time.sleep(START_S)


def loader(persistent: bool = False) -> DataLoader:
    return DataLoader(Volumes(), batch_size=BATCH, shuffle=True, num_workers=WORKERS, collate_fn=flatten_collate,
                      worker_init_fn=slow_start, persistent_workers=persistent, multiprocessing_context="fork")


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(SleepLayer(STEP_MS), torch.nn.Flatten(), torch.nn.Linear(24 ** 3, 2))


def make() -> Workload:
    return Workload(model=model(), loader=loader())


def hand_loop(persistent: bool, epochs: int) -> float:
    """ms per batch of a plain training loop over `epochs` epochs (after one to warm up)."""
    net, dl = model(), loader(persistent)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    batches, start = 0, None
    for epoch in range(epochs + 1):
        for batch in dl:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(batch["image"]), batch["label"]).backward()
            opt.step()
            if start is not None:
                batches += 1
        if start is None:
            start = time.perf_counter()
    return (time.perf_counter() - start) / batches * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=40.0)
    ap.add_argument("--verify-seconds", type=float, default=60.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for persistent in (False, True):
        print(f"hand loop, persistent_workers={persistent}: {hand_loop(persistent, args.epochs):.1f} ms/batch "
              f"({args.epochs} epochs of {ITEMS // BATCH} batches)", flush=True)
    r = bisect(model(), loader(), device="cpu", max_seconds=args.max_seconds, verify_seconds=args.verify_seconds)
    print(" ".join(str(r).split("\n\n")[0].split()))  # the head line, unwrapped
    print(f"verdict: {r.bottleneck}; advice: {[a.kind for a in r.advice]}")
    for a in r.advice:
        if a.kind == "persistent_workers":
            print(a.message)
    v = r.to_dict()["verification"]
    print(f"check: {v.get('status')}, {v.get('elapsed_s')} s of {v.get('budget_s')} s")


if __name__ == "__main__":
    main()
