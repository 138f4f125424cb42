"""The reorder advice against a hand loop: an expensive photometric transform before a 4x crop.

The planted pipeline: 320x320 RGB images (in memory, so load is cheap) through
GaussianBlur(9) and ColorJitter(0.4, 0.4, 0.4), then RandomCrop(160) (a quarter of the
pixels), RandomHorizontalFlip and ToTensor, num_workers=0, batch 8, a step that costs
almost nothing: augment is the bottleneck. `bisect()` runs on it with the default settings (the
advice's check off: a reorder is not a setting it can apply) and the script prints the
`reorder` advice item and its figures.

Then the hand loop: the same Compose and the reordered one, written out by hand (the
order the tool proposes is asserted equal to it), each timed per image over the same
images in this process, alternating which goes first, `--pairs` pairs: ms/sample both
ways and the saving with its standard error. The tool times only the segment that changes
(blur, jitter, crop); the hand loop times the whole Compose, so its ms/sample are larger
by the flip and ToTensor, and its saving is the figure to hold the tool's against.

Last, a pipeline with only geometric transforms before the crop (RandomRotation,
RandomAffine): no reorder is proposed (none may move).

    python scripts/bench_reorder.py                      # ~1.5 min on a 2-core CPU
    python scripts/bench_reorder.py --pairs 600 --max-seconds 60

Torch runs on one intra-op thread (`--threads 1`), as in a DataLoader worker: v1
GaussianBlur on a PIL image is a conv2d, and with more threads than free cores (a shared
2-core machine) its time stops scaling with the pixels (measured here: 11.1 -> 2.7
ms/sample by hand on one thread, 42.0 -> 37.8 on two with the machine busy).

The isolated timings get what --max-seconds leaves after the points (at most 2 s), so a
heavy pipeline needs a budget that leaves some: 40 s by default here.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from bisect_pipeline import bisect

SIDE, CROP, IMAGES, BATCH = 320, 160, 64, 8


class InMemory(Dataset):
    def __init__(self, images: list, transform) -> None:
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), i % 10


def images(n: int = IMAGES) -> list:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)) for _ in range(n)]


def jitter():
    return T.ColorJitter(0.4, 0.4, 0.4)


def planted() -> T.Compose:
    return T.Compose([T.GaussianBlur(9), jitter(), T.RandomCrop(CROP), T.RandomHorizontalFlip(), T.ToTensor()])


def by_hand() -> T.Compose:
    """The reorder, written out: blur and jitter after the crop, in their order."""
    return T.Compose([T.RandomCrop(CROP), T.GaussianBlur(9), jitter(), T.RandomHorizontalFlip(), T.ToTensor()])


def geometric() -> T.Compose:
    return T.Compose([T.RandomRotation(10), T.RandomAffine(0, translate=(0.1, 0.1)), T.RandomCrop(CROP),
                      T.ToTensor()])


def run_tool(transform, pics: list, max_seconds: float):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(48, 10))
    loader = DataLoader(InMemory(pics, transform), batch_size=BATCH, shuffle=True, num_workers=0)
    t0 = time.perf_counter()
    report = bisect(model, loader, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                    loss_fn=torch.nn.CrossEntropyLoss(), device="cpu", max_seconds=max_seconds, verify_seconds=0)
    return report, time.perf_counter() - t0


def reorders_of(report) -> tuple:
    aug = report.isolated.part("augment") if report.isolated is not None else None
    b = aug.breakdown if aug is not None else None
    return (b.reorders or ()) if b is not None else ()


def hand_loop(pics: list, original, reordered, pairs: int) -> dict:
    a, b = [], []
    for i in range(pairs):
        img = pics[i % len(pics)]
        sides = ((original, a), (reordered, b)) if i % 2 == 0 else ((reordered, b), (original, a))
        for fn, out in sides:
            t = time.perf_counter()
            fn(img)
            out.append(time.perf_counter() - t)
    diffs = [(x - y) * 1e3 for x, y in zip(a, b)]
    return {"ms": statistics.fmean(a) * 1e3, "reordered_ms": statistics.fmean(b) * 1e3,
            "saving": statistics.fmean(diffs), "se": statistics.stdev(diffs) / math.sqrt(len(diffs))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=300, help="hand-loop pairs (original, reordered)")
    ap.add_argument("--max-seconds", type=float, default=40.0, help="bisect()'s budget for the planted pipeline")
    ap.add_argument("--geometric-seconds", type=float, default=15.0, help="bisect()'s budget for the geometric one")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (0: leave torch's default); DataLoader workers run on one")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    pics = images()
    print(f"planted: {IMAGES} images {SIDE}x{SIDE} -> GaussianBlur(9), ColorJitter, RandomCrop({CROP}), "
          "RandomHorizontalFlip, ToTensor; num_workers=0")
    report, wall = run_tool(planted(), pics, args.max_seconds)
    print(f"tool: bottleneck {report.bottleneck} ({wall:.1f} s)")
    iso = report.isolated
    aug = iso.part("augment") if iso is not None else None
    print(f"  isolated: budget {iso.budget_s if iso else None} s, augment "
          f"{aug.ms_per_sample if aug else None} ms/sample over {aug.samples if aug else 0} samples")
    found = reorders_of(report)
    if not found:
        print("  reorder: none timed (the augment share was spent before it, or nothing may move)")
    for r in found:
        print(f"  reorder: move {r.transform} after {r.after}: {r.ms_per_sample:.2f} -> "
              f"{r.reordered_ms_per_sample:.2f} ms/sample, saves {r.saving_ms_per_sample:.2f} +- {r.tolerance_ms} "
              f"over {r.samples} pairs, real {r.real}; new order {', '.join(r.order)}")
    items = [f for f in report.advice if f.kind == "reorder"]
    for f in items:
        print("  advice: " + " ".join(f.message.split()))
    if not items:
        print("  advice: no reorder item")
    hand = [type(t).__name__ for t in by_hand().transforms]
    if found:
        assert list(found[0].order) == hand, (found[0].order, hand)
    h = hand_loop(pics, planted(), by_hand(), args.pairs)
    print(f"hand loop ({args.pairs} pairs, whole Compose, alternating): {h['ms']:.2f} -> {h['reordered_ms']:.2f} "
          f"ms/sample, saves {h['saving']:.2f} +- {h['se']:.2f} (1 standard error)")
    if found:
        r = found[0]
        print(f"tool's saving {r.saving_ms_per_sample:.2f} against the hand loop's {h['saving']:.2f}: "
              f"{(r.saving_ms_per_sample - h['saving']) / h['saving'] * 100:+.0f}%")
    print("geometric only: RandomRotation(10), RandomAffine(translate 0.1), RandomCrop, ToTensor")
    report, wall = run_tool(geometric(), pics, args.geometric_seconds)
    kinds = [f.kind for f in report.advice]
    print(f"tool: bottleneck {report.bottleneck} ({wall:.1f} s); reorders {reorders_of(report) or 'none'}; "
          f"reorder item: {'yes' if 'reorder' in kinds else 'no'}")


if __name__ == "__main__":
    main()
