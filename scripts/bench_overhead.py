"""The tool's own overhead: its `device` and `full` rates against hand-written loops.

Targets: the `device` rate bisect() reports within 2% of a hand loop stepping on one
cached batch, the `full` rate within 5% of a hand loop over a fresh DataLoader with the
user's settings; and the harness's per-step cost (visit.time_steps over a no-op step) in
microseconds next to a bare Python loop.

This VM's speed drifts by ~10% over seconds, so a hand loop run before or after the tool
measures another machine. The hand loops are therefore run *paired in time* with the
tool: from the progress callback, just before each visit of `device` and of `full`, a
hand-loop block of the same kind runs for HAND_BLOCK_SECONDS (the tool's clock keeps
running, so its time shares shrink a little; its measurement does not change). Both sides
state throughput the same way: the median over windows of whole steps. Both run in the
same process conditions: the tool holds glibc's allocator still (allocator.py) and the
hand blocks run while it does; with `--allocator as-is` neither does (nothing is set in
the environment either way).

    python scripts/bench_overhead.py                  # 5 runs, num_workers 0 and 2
    python scripts/bench_overhead.py --runs 3 --workers 0
    python scripts/bench_overhead.py --step sleep     # a fixed-length step: the harness alone
    python scripts/bench_overhead.py --device cuda --runs 3   # on a GPU: pinned loader, non_blocking copies

On CUDA both sides move batches the same way (the loader pins them, the copy is
`non_blocking`: what the tool's `full` does and what a user's loop should) and both
synchronize only at window edges, so a window's time is the GPU's work, not its queue.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

from bisect_pipeline import Plan, bisect, testing
from bisect_pipeline.pipeline.step import make_step, to_device
from bisect_pipeline.measure.visit import time_steps

HAND_BLOCK_SECONDS = 1.0
HAND_WINDOW_SECONDS = 0.25  # the tool's window length (Plan.window_seconds)


def make_sleep(workers: int, **kw):
    """A step of fixed length (a 5 ms sleep plus a tiny linear layer) and a loader whose
    samples cost 0.2 ms each: immune to the VM's CPU-speed swings, so what differs
    between the tool and the hand loop is the harness."""
    ds = testing.PlantedDataset(n=512, transform=testing.Sleep(0.2))
    return testing.tiny_model(testing.BENCH_STEP_MS), testing.make_loader(ds, batch_size=16, num_workers=workers, **kw)


def make(workers: int, **kw):
    """A real compute step (no sleep): an MLP on 16 x 1024 inputs, ~3-5 ms on this CPU,
    and a loader with a mild, real augmentation (noise added per sample)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 4))
    ds = testing.PlantedDataset(n=512, features=1024, transform=Noise())
    return model, testing.make_loader(ds, batch_size=16, num_workers=workers, **kw)


def make_cnn(workers: int, **kw):
    """A compute-bound CNN step (two 3x3 convolutions of 32 and 64 channels on 16 images of
    3x32x32, ~10-20 ms on this CPU) behind the same mild augmentation: the issue-44 case,
    where the harness showed 3-4% against a hand loop."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64 * 16, 4))
    return model, testing.make_loader(Images(512, Noise()), batch_size=16, num_workers=workers, **kw)


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int, transform) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.transform = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 4, (n,), generator=g), transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.transform(self.x[i]), self.y[i]


class Noise:
    def __call__(self, x):
        return x + 0.01 * torch.randn_like(x)


def block_rate(one, batch_size: int, sync=lambda: None) -> float:
    """A hand-loop block's samples/s as the tool states it: the median over windows of
    whole steps, synchronized at the window's edges only."""
    rates, end = [], time.perf_counter() + HAND_BLOCK_SECONDS
    while time.perf_counter() < end:
        n = 0
        sync()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < HAND_WINDOW_SECONDS:
            one()
            n += 1
        sync()
        rates.append(n * batch_size / (time.perf_counter() - t0))
    return statistics.median(rates)


class HandLoops:
    """Hand-loop blocks run from bisect()'s progress callback, before each visit of
    `device` (the step on one cached batch) and `full` (a fresh DataLoader, persistent
    workers, iterated endlessly)."""

    def __init__(self, model, loader, step, device: torch.device) -> None:
        self.step, self.bs = step, loader.batch_size
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.batch = to_device(next(iter(DataLoader(loader.dataset, batch_size=loader.batch_size))), device)
        kw = {"multiprocessing_context": "fork", "persistent_workers": True} if loader.num_workers else {}
        fresh = DataLoader(loader.dataset, batch_size=loader.batch_size, shuffle=True,
                           num_workers=loader.num_workers, pin_memory=loader.pin_memory, **kw)
        self.batches = (to_device(b, device) for _ in itertools.count() for b in fresh)
        self.warm = False
        self.rates: dict = {"device": [], "full": []}

    def __call__(self, event: dict) -> None:
        if event.get("event") != "point" or event["point"] not in self.rates:
            return
        if not self.warm:  # first calls, worker start-up and their prefetched batches
            for _ in range(20):
                self.step(self.batch)
                self.step(next(self.batches))
            self.warm = True
        if event["point"] == "device":
            self.rates["device"].append(block_rate(lambda: self.step(self.batch), self.bs, self.sync))
        else:
            self.rates["full"].append(block_rate(lambda: self.step(next(self.batches)), self.bs, self.sync))


def one_run(build, workers: int, hold: bool, device: str = "cpu", max_seconds: float = 60) -> tuple:
    dev = torch.device(device)
    model, loader = build(workers, pin_memory=dev.type == "cuda")
    model.to(dev)
    step = make_step(model)
    hand = HandLoops(model, loader, step, dev)
    r = bisect(model, loader, step=step, device=device, points=("device", "full"), max_seconds=max_seconds,
               hold_allocator=hold, progress=hand)
    return (r.rate("device"), statistics.median(hand.rates["device"]), r.rate("full"),
            statistics.median(hand.rates["full"]))


def harness_us(seconds: float = 2.0) -> tuple:
    batch = (torch.zeros(1), torch.zeros(1))
    noop = lambda b: None  # noqa: E731
    nb = lambda: batch  # noqa: E731
    m = time_steps(nb, noop, plan=Plan(windows_per_visit=12, max_warmup_windows=0),
                   deadline=time.perf_counter() + seconds, clock=time.perf_counter)
    per_step_tool = sum(w.seconds for w in m.windows) / sum(w.steps for w in m.windows) * 1e6
    n, t0 = 1_000_000, time.perf_counter()
    for _ in range(n):
        noop(nb())
    return per_step_tool, (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--step", choices=("compute", "cnn", "sleep"), default="compute",
                    help="compute: a CPU-bound MLP step; cnn: a CPU-bound CNN step; sleep: a fixed 5 ms step, so "
                         "the comparison isolates the harness")
    ap.add_argument("--allocator", choices=("held", "as-is"), default="held",
                    help="held: the tool holds glibc's allocator still and the hand blocks run while it does; "
                         "as-is: neither")
    ap.add_argument("--device", default="cpu", help="where the step runs: cpu (default) or cuda")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="each bisect() run's budget")
    args = ap.parse_args()
    build = {"sleep": make_sleep, "cnn": make_cnn}.get(args.step, make)
    torch.set_num_threads(1)  # the same intra-op threads for the tool and the hand loops

    tool_us, bare_us = harness_us()
    print(f"harness per step (no-op step, cached batch): {tool_us:.2f} us; bare Python loop: {bare_us:.2f} us")
    print(f"device {args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""))
    for workers in (int(w) for w in args.workers.split(",")):
        dev, full = [], []
        for r in range(args.runs):
            td, hd, tf, hf = one_run(build, workers, args.allocator == "held", args.device, args.max_seconds)
            dev.append(td / hd)
            full.append(tf / hf)
            print(f"  workers={workers} run {r + 1}: device tool {td:.1f} / hand {hd:.1f} = {dev[-1]:.3f};  "
                  f"full tool {tf:.1f} / hand {hf:.1f} = {full[-1]:.3f}", flush=True)
        print(f"workers={workers}: device ratio median {statistics.median(dev):.3f} "
              f"(range {min(dev):.3f}-{max(dev):.3f}); full ratio median {statistics.median(full):.3f} "
              f"(range {min(full):.3f}-{max(full):.3f})")


if __name__ == "__main__":
    main()
