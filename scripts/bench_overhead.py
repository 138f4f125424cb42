"""The tool's own overhead (issue 3, target 1).

Side by side in one process, alternating which goes first, `--rounds` rounds:

Both sides state throughput the same way: the median over windows of whole steps.

- device: the throughput bisect() reports at `device` vs a hand-written loop running
  the same step on one cached batch (target: ratio within 2%);
- full: the throughput bisect() reports at `full` vs a hand-written loop over a fresh
  DataLoader with the user's settings (target: within 5%);
- the harness's per-step cost: timing.measure over a no-op step on a cached batch, in
  microseconds, next to a bare Python loop doing the same calls.

Both sides run in the same process conditions: the tool holds glibc's allocator still
(allocator.py), so the hand loops do too (`--allocator held`, the default); with
`--allocator as-is` neither does (bisect(hold_allocator=False)), and nothing in the
environment is set either way.

    python scripts/bench_overhead.py                  # 5 rounds, num_workers 0 and 2
    python scripts/bench_overhead.py --rounds 3 --workers 0
    python scripts/bench_overhead.py --step sleep     # fixed-length step: the harness alone
    python scripts/bench_overhead.py --allocator as-is
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

import _planted as planted
from bisect_pipeline import Plan, allocator, bisect
from bisect_pipeline.report import shown_rate
from bisect_pipeline.timing import measure

HAND_SECONDS = 3.0


def make_sleep(workers: int):
    """A step of fixed length (a 5 ms sleep plus a tiny MLP) and a loader whose samples
    cost 0.2 ms each: immune to the CPU-speed swings of a shared VM, so what differs
    between the tool and the hand loop is the harness."""
    model = planted.model(planted.STEP_MS)
    ds = planted.Data(n=512, transform=planted.Sleep(0.2))
    kw = {"multiprocessing_context": "fork"} if workers else {}
    return model, DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers, **kw)


def make(workers: int):
    """A real compute step (no sleep): an MLP on 16 x 1024 inputs, ~3-5 ms on this CPU,
    and a loader with a mild, real augmentation (noise added per sample)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 4))
    ds = planted.Data(n=512)
    ds.data = torch.randn(512, 1024)
    ds.transform = lambda x: x + 0.01 * torch.randn_like(x)
    kw = {"multiprocessing_context": "fork"} if workers else {}
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers, **kw)
    return model, loader


def train_step(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def step(batch):
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def windows_rate(one, batch_size: int, window: float = 0.5) -> float:
    """The hand loop's samples/s as the tool states it: the median over windows of
    whole steps (HAND_SECONDS in all), so that both sides use the same statistic."""
    rates, end = [], time.perf_counter() + HAND_SECONDS
    while time.perf_counter() < end:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < window:
            one()
            n += 1
        rates.append(n * batch_size / (time.perf_counter() - t0))
    return statistics.median(rates)


def hand_device(model, loader) -> float:
    step = train_step(model)
    batch = next(iter(DataLoader(loader.dataset, batch_size=loader.batch_size)))
    for _ in range(20):
        step(batch)
    return windows_rate(lambda: step(batch), loader.batch_size)


def hand_full(model, loader) -> float:
    step = train_step(model)
    kw = {"multiprocessing_context": "fork"} if loader.num_workers else {}
    fresh = DataLoader(loader.dataset, batch_size=loader.batch_size, shuffle=True, num_workers=loader.num_workers,
                       persistent_workers=bool(loader.num_workers), **kw)
    batches = (b for _ in itertools.count() for b in fresh)
    for _ in range(10 + 2 * loader.num_workers):  # worker start-up and their prefetched batches
        step(next(batches))
    rate = windows_rate(lambda: step(next(batches)), loader.batch_size)
    return rate


HOLD = [True]  # --allocator


def conditions() -> None:
    """Before a hand loop: the allocator as the tool runs with it."""
    if HOLD[0]:
        glibc, _ = allocator.find()
        if glibc is not None:
            glibc.apply(allocator.HELD)


def tool(model, loader) -> tuple:
    step = train_step(model)
    r = bisect(model, loader, step=step, device="cpu", points=("device", "full"), max_seconds=30,
               hold_allocator=HOLD[0])
    return shown_rate(r, "device"), shown_rate(r, "full")


def harness_us(seconds: float = 2.0) -> tuple:
    batch = (torch.zeros(1), torch.zeros(1))
    noop = lambda b: None  # noqa: E731
    nb = lambda: batch  # noqa: E731
    m = measure(nb, None, noop, batch_size=1, plan=Plan(windows_per_visit=12, max_warmup_windows=0),
                deadline=time.perf_counter() + seconds, clock=time.perf_counter)
    per_step_tool = m.throughput.sec_per_batch * 1e6
    n, t0 = 1_000_000, time.perf_counter()
    for _ in range(n):
        noop(nb())
    return per_step_tool, (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--step", choices=("compute", "sleep"), default="compute",
                    help="compute: a CPU-bound MLP step (real, but swings with the VM's CPU speed); "
                         "sleep: a fixed 5 ms step, so the comparison isolates the harness")
    ap.add_argument("--allocator", choices=("held", "as-is"), default="held",
                    help="held: the tool and the hand loops both hold glibc's allocator still; as-is: neither does")
    args = ap.parse_args()
    HOLD[0] = args.allocator == "held"
    build = make_sleep if args.step == "sleep" else make
    torch.set_num_threads(1)  # the same intra-op threads for the tool and the hand loops

    tool_us, bare_us = harness_us()
    print(f"harness per step (no-op step, cached batch): {tool_us:.2f} us; bare Python loop: {bare_us:.2f} us")
    for workers in (int(w) for w in args.workers.split(",")):
        dev_ratios, full_ratios = [], []
        for r in range(args.rounds):
            model, loader = build(workers)
            if r % 2 == 0:
                td, tf = tool(model, loader)
                conditions()
                hd, hf = hand_device(model, loader), hand_full(model, loader)
            else:
                conditions()
                hd, hf = hand_device(model, loader), hand_full(model, loader)
                td, tf = tool(model, loader)
            dev_ratios.append(td / hd)
            full_ratios.append(tf / hf)
            print(f"  workers={workers} round {r + 1}: device tool {td:.1f} / hand {hd:.1f} = {td / hd:.3f};  "
                  f"full tool {tf:.1f} / hand {hf:.1f} = {tf / hf:.3f}", flush=True)
        print(f"workers={workers}: device ratio median {statistics.median(dev_ratios):.3f} "
              f"(range {min(dev_ratios):.3f}-{max(dev_ratios):.3f}); full ratio median "
              f"{statistics.median(full_ratios):.3f} (range {min(full_ratios):.3f}-{max(full_ratios):.3f})")


if __name__ == "__main__":
    main()
