"""Load split into read and decode, against the plant: an ImageFolder over large JPEGs
(written to a temporary directory), run through `bisect()` twice:

- on a planted slow file system (`bisect_pipeline.testing.SlowFiles`: each file costs
  `--ms-per-file` on its first read and `--ms-per-mb` per 10^6 bytes, slept, as a
  network file system's round trip and bandwidth): reading should be the larger part;
- on plain disk (the files in the page cache): decoding should be.

For each it prints the verdict, load's cost per batch, the split (read ms per sample,
MB/s, decode ms per sample, the part named) and whether the part named matches the
plant, beside a hand measurement on the same files: `open(path, 'rb').read()` (under
the slow file system for the first run, in PIL's 64 KB blocks: the plant sleeps once per
read) against `Image.open(BytesIO(data)).convert('RGB')`.
The tool's decode also holds the rest of ImageFolder's __getitem__ (PIL's file parsing,
the class lookup), so it may be a little above the hand decode.

    python scripts/bench_read_decode.py                    # 2 runs of 40 s, under 2 min
    python scripts/bench_read_decode.py --max-seconds 60 --images 48
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time

import numpy as np
import torch
from PIL import Image, ImageFile
from torch import nn

from bisect_pipeline import bisect, testing


def write_jpegs(root: str, n: int, side: int) -> list:
    """n noise JPEGs of side x side pixels (quality 90: about 2 MB at 1500), two classes."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        d = os.path.join(root, f"c{i % 2}")
        os.makedirs(d, exist_ok=True)
        paths.append(os.path.join(d, f"{i}.jpg"))
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(paths[-1], quality=90)
    return paths


def hand(paths: list, slow: contextlib.AbstractContextManager) -> tuple:
    """(read ms, decode ms) per file, medians: the bytes read through open() (under
    `slow`), then decoded from memory."""
    reads, decodes = [], []
    with slow:
        for p in paths:
            t = time.perf_counter()
            with open(p, "rb") as f:  # in PIL's blocks (ImageFile.load): the plant sleeps once per read
                data = b"".join(iter(lambda: f.read(ImageFile.MAXBLOCK), b""))
            reads.append(time.perf_counter() - t)
            t = time.perf_counter()
            Image.open(io.BytesIO(data)).convert("RGB")
            decodes.append(time.perf_counter() - t)
    return statistics.median(reads) * 1e3, statistics.median(decodes) * 1e3


def run(root: str, args, slow: contextlib.AbstractContextManager) -> dict:
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    side = 64
    ds = ImageFolder(root, transform=T.Compose([T.Resize(side), T.CenterCrop(side), T.ToTensor()]))
    loader = testing.make_loader(ds, batch_size=args.batch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * side * side, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t = time.perf_counter()
    with slow:
        report = bisect(model, loader, optimizer=opt, device="cpu", max_seconds=args.max_seconds, verify_seconds=0)
    wall = time.perf_counter() - t
    load = report.isolated.load if report.isolated is not None else None
    stage = next((s for s in report.verdict.stages if s.stage == "load"), None)
    return {"verdict": report.bottleneck, "wall_s": wall, "load_ms_per_batch":
            None if stage is None or stage.sec_per_batch is None else stage.sec_per_batch * 1e3,
            "load_ms_per_sample": None if load is None else load.ms_per_sample,
            "split": None if load is None else load.split, "cache": report.measurements.cache}


def show(name: str, expected: str, out: dict, hand_ms: tuple) -> None:
    s = out["split"]
    cost = "-" if out["load_ms_per_batch"] is None else f"{out['load_ms_per_batch']:.1f}"
    print(f"{name}: verdict {out['verdict']}, load {cost} ms/batch, {out['load_ms_per_sample']} ms/sample alone "
          f"({out['wall_s']:.1f} s; cached {out['cache'].samples} samples"
          + (f", limited by {out['cache'].limited_by})" if out['cache'].limited_by else ")"))
    if s is None or not s.ok:
        print(f"  split: {None if s is None else s.status}: {None if s is None else s.reason}")
        print(f"  matches the plant ({expected}): no")
        return
    print(f"  split: read {s.read_ms_per_sample:.2f} ms/sample at {s.read_mb_per_s} MB/s "
          f"({s.bytes_per_sample / 1e6:.2f} MB, {s.files_per_sample:g} file(s)), decode {s.decode_ms_per_sample:.2f} "
          f"ms/sample, over {s.samples} samples: {s.bound}")
    print(f"  by hand on the same files: read {hand_ms[0]:.2f} ms, decode {hand_ms[1]:.2f} ms per file")
    print(f"  matches the plant ({expected}): {'yes' if s.bound == expected else 'NO'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--side", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-seconds", type=float, default=40.0)
    ap.add_argument("--ms-per-file", type=float, default=20.0)
    ap.add_argument("--ms-per-mb", type=float, default=40.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        paths = write_jpegs(root, args.images, args.side)
        mb = sum(os.path.getsize(p) for p in paths) / len(paths) / 1e6
        print(f"{len(paths)} JPEGs of {args.side}x{args.side}, {mb:.2f} MB each; planted file system: "
              f"{args.ms_per_file:g} ms per file + {args.ms_per_mb:g} ms per MB")
        for name, expected, make in (
                ("slow file system", "read", lambda: testing.SlowFiles(root, args.ms_per_file, args.ms_per_mb)),
                ("plain disk", "decode", contextlib.nullcontext)):
            out = run(root, args, make())
            show(name, expected, out, hand(paths, make()))


if __name__ == "__main__":
    main()
