"""Inside the stage (issue 20): the torchvision classification reference preset over JPEG
files, transform by transform, its costliest transform measured in the pipeline against
a hand-measured counterfactual; and MixUp in a collate_fn seen as the collate part it is.

    python scripts/bench_inside_stage.py                  # both cases, ~3 min on 2 cores
    python scripts/bench_inside_stage.py --cases preset --max-seconds 90 --json out.json --show

preset: an ImageFolder of 500x375 JPEG files written here, the reference recipe's train
        transforms (references/classification/presets.py, ClassificationPresetTrain:
        RandomResizedCrop(224), RandomHorizontalFlip, AutoAugment(imagenet), PILToTensor,
        ConvertImageDtype(float), Normalize, RandomErasing), batches of 16, one worker,
        a small CNN. Printed: the tool's rows, their sum against the stage timed whole,
        its costliest transform measured in the pipeline (and predicted), then the hand
        counterfactual: the same loader and step by hand, every sample decoded from its
        JPEG file on both sides, with the transform run (with) or its output for that
        sample looked up from a cache made beforehand (without), alternating 5 x 2 runs of 60 batches; the
        cost is the median of the 5 paired differences (a run beside its partner sees the
        same moment of the machine; the difference of the two medians pairs nothing).
mixup:  in-memory 3x64x64 images, default_collate then v2.MixUp on the batch in the
        collate_fn, no workers: the tool's collate line says stacking vs your collate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate
from torchvision import datasets
from torchvision import transforms as T
from torchvision.transforms import v2

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bisect_pipeline import bisect  # noqa: E402

N_IMAGES, BATCH, WORKERS = 192, 16, 1
HAND_BATCHES, HAND_WARMUP, HAND_PAIRS = 60, 6, 5
SHOW = False  # --show: the tool's text report of each case


def write_jpegs(root: str, n: int = N_IMAGES) -> None:
    """500x375 JPEGs (quality 90) of smooth gradients with noise, in two class folders."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    for i in range(n):
        base = np.stack([(x * 0.5 + 7 * i) % 256, (y * 0.6 + 3 * i) % 256, ((x + y) * 0.3) % 256], -1)
        arr = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        folder = os.path.join(root, f"class{i % 2}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(arr).save(os.path.join(folder, f"{i}.jpg"), quality=90)


def preset() -> T.Compose:
    """ClassificationPresetTrain(crop_size=224, auto_augment_policy="imagenet", random_erase_prob=0.25)."""
    return T.Compose([
        T.RandomResizedCrop(224, interpolation=T.InterpolationMode.BILINEAR, antialias=True),
        T.RandomHorizontalFlip(0.5),
        T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=T.InterpolationMode.BILINEAR),
        T.PILToTensor(),
        T.ConvertImageDtype(torch.float),
        T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
        T.RandomErasing(p=0.25),
    ])


def small_cnn(classes: int = 2) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 5, stride=4, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(32 * 16, classes))


# -- the hand counterfactual ----------------------------------------------------------


class Hand(Dataset):
    """The ImageFolder's samples decoded from their files as the folder does, then the
    preset from step k on (with), or the preset after step k on step k's output for that
    sample, made beforehand (without)."""

    def __init__(self, folder: datasets.ImageFolder, steps: list, k: int, cached: list = None) -> None:
        self.folder, self.steps, self.k, self.cached = folder, steps, k, cached

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int):
        path, target = self.folder.samples[i]
        x = self.folder.loader(path)  # read and decode, on both sides
        if self.cached is None:
            for t in self.steps[: self.k + 1]:
                x = t(x)
        else:
            x = self.cached[i]
        for t in self.steps[self.k + 1:]:
            x = t(x)
        return x, target


def hand_loop(dataset: Dataset, model: nn.Module) -> float:
    """ms per batch of the loader with WORKERS workers feeding the SGD step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, drop_last=True,
                        persistent_workers=True)
    n, t0 = 0, None
    while n < HAND_WARMUP + HAND_BATCHES:
        for x, y in loader:
            if n == HAND_WARMUP:
                t0 = time.perf_counter()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            n += 1
            if n == HAND_WARMUP + HAND_BATCHES:
                break
    return (time.perf_counter() - t0) / HAND_BATCHES * 1e3


def counterfactual(folder: datasets.ImageFolder, k: int, model: nn.Module) -> dict:
    """The costliest step's cost as a hand loop sees it: with - without, alternating."""
    steps = list(folder.transform.transforms)
    prefix = T.Compose(steps[: k + 1])
    torch.manual_seed(0)
    cached = [prefix(folder.loader(p)) for p, _ in folder.samples]
    with_, without = [], []
    for _ in range(HAND_PAIRS):
        with_.append(hand_loop(Hand(folder, steps, k), model))
        without.append(hand_loop(Hand(folder, steps, k, cached), model))
    w, wo = statistics.median(with_), statistics.median(without)
    diffs = [a - b for a, b in zip(with_, without)]
    return {"with_ms_per_batch": round(w, 2), "without_ms_per_batch": round(wo, 2),
            "cost_ms_per_batch": round(statistics.median(diffs), 2),
            "paired_differences": [round(d, 2) for d in diffs],
            "runs": {"with": [round(v, 2) for v in with_], "without": [round(v, 2) for v in without]}}


# -- the cases ------------------------------------------------------------------------


def case_preset(max_seconds: float) -> dict:
    torch.manual_seed(0)
    root = tempfile.mkdtemp(prefix="bench_inside_")
    write_jpegs(root)
    folder = datasets.ImageFolder(root, transform=preset())
    loader = DataLoader(folder, batch_size=BATCH, shuffle=True, num_workers=WORKERS, drop_last=True)
    model = small_cnn()
    r = bisect(model, loader, device="cpu", max_seconds=max_seconds)
    if SHOW:
        print(r.text())
    aug = r.isolated.augment if r.isolated is not None else None
    b = aug.breakdown if aug is not None else None
    out = {"bottleneck": r.bottleneck, "augment_stage_ms_per_batch": _stage(r, "augment"),
           "isolated_augment_ms_per_sample": aug.ms_per_sample if aug is not None else None}
    print(f"preset: verdict {r.bottleneck}; augment stage {out['augment_stage_ms_per_batch']} ms/batch")
    if b is None or not b.ok:
        print("  no breakdown:", b)
        return out
    for row in b.rows:
        print(f"  {row.name:<20} {row.ms_per_sample if row.ms_per_sample is not None else '-':>8} ms/sample "
              f"{row.input} -> {row.output}")
    print(f"  sum {b.sum_ms_per_sample} over {b.samples} samples vs whole {b.augment_ms_per_sample} "
          f"(±{b.tolerance_ms}): {'agree' if b.agrees else 'DISAGREE'}")
    out["rows"] = [[row.name, row.ms_per_sample] for row in b.rows]
    out.update(sum_ms_per_sample=b.sum_ms_per_sample, whole_ms_per_sample=b.augment_ms_per_sample,
               tolerance_ms=b.tolerance_ms, agrees=b.agrees)
    c = b.confirmed
    out["confirmed"] = {k: v for k, v in c.to_dict().items() if k != "trial"} if c is not None else None
    if c is None or not c.ok:
        print("  not confirmed in the pipeline:", c and c.reason)
        return out
    print(f"  in the pipeline: {c.transform} ({c.where}) {c.measured_ms_per_batch} ± {c.tolerance_ms} ms/batch "
          f"(with {c.with_ms_per_batch}, without {c.without_ms_per_batch}); predicted {c.predicted_ms_per_batch}")
    k = int(c.where.rsplit("[", 1)[1].rstrip("]"))  # the preset is one flat Compose: where ends in its index
    hand = counterfactual(folder, k, small_cnn())
    out["hand"] = hand
    ratio = c.measured_ms_per_batch / hand["cost_ms_per_batch"] if hand["cost_ms_per_batch"] else float("nan")
    out["tool_over_hand"] = round(ratio, 3)
    print(f"  by hand: with {hand['with_ms_per_batch']}, without {hand['without_ms_per_batch']} (medians); paired "
          f"differences {hand['paired_differences']} -> {hand['cost_ms_per_batch']} ms/batch (their median); the tool's / the hand's = {ratio:.2f} "
          f"({'within' if abs(ratio - 1) <= 0.2 else 'OUTSIDE'} 20%)")
    return out


class MixUpCollate:
    """default_collate, then v2.MixUp on the batch (the torchvision reference's
    --mixup-alpha collate_fn)."""

    def __init__(self, classes: int) -> None:
        self.mixup = v2.MixUp(alpha=0.2, num_classes=classes)

    def __call__(self, samples: list):
        return self.mixup(*default_collate(samples))


class Images(Dataset):
    def __init__(self, n: int = 256, size: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 3, size, size, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class SoftTargetCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                                 nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


def case_mixup(max_seconds: float) -> dict:
    torch.manual_seed(0)
    loader = DataLoader(Images(), batch_size=64, shuffle=True, collate_fn=MixUpCollate(10))
    r = bisect(SoftTargetCNN(), loader, device="cpu", max_seconds=max_seconds, verify_seconds=0)
    if SHOW:
        print(r.text())
    col = r.isolated.collate if r.isolated is not None else None
    out = {"bottleneck": r.bottleneck, "collate_stage_ms_per_batch": _stage(r, "collate"),
           "collate_ms_per_batch": col.ms_per_batch if col is not None else None,
           "stacking_ms_per_batch": col.default_collate_ms_per_batch if col is not None else None,
           "collate_fn": col.collate_fn if col is not None else None}
    print(f"mixup: verdict {r.bottleneck}; collate stage {out['collate_stage_ms_per_batch']} ms/batch; isolated "
          f"{out['collate_fn']} {out['collate_ms_per_batch']} ms/batch, of which stacking (default_collate) "
          f"{out['stacking_ms_per_batch']}")
    lines = [ln for ln in r.text().splitlines() if "stacking" in ln or "collate" in ln.lower()]
    print("  " + "\n  ".join(lines[:6]))
    return out


def _stage(r, name: str):
    s = next((s for s in r.verdict.stages if s.stage == name), None)
    return None if s is None or s.sec_per_batch is None else round(s.sec_per_batch * 1e3, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="preset,mixup")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--json")
    ap.add_argument("--show", action="store_true", help="print the tool's text report of each case")
    a = ap.parse_args()
    global SHOW
    SHOW = a.show
    torch.set_num_threads(1)  # the step on one core, the worker on the other
    results = {}
    for case in a.cases.split(","):
        results[case] = {"preset": case_preset, "mixup": case_mixup}[case](a.max_seconds if case == "preset" else 20)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
