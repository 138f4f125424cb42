"""Each stage's cost on MNIST-sized samples against a hand-measured counterfactual.

torchvision's MNIST (its idx files generated: 6,000 random 28x28 digits), ToTensor +
Normalize, batch 128, num_workers 0, a small step (the pytorch/examples VAE's
784-400-20-400-784 network and its loss, Adam). Issue 30: on such samples the `raw`
point's replay (recorded inputs copied, proxied transforms: 10-35 us a sample) landed
in augment and came off load (a VAE example: augment 7.3 ms per batch in the pipeline
against 3.8 timed alone, load 0.3 against 1.3).

The hand counterfactual: the same DataLoader settings and step, four variants, each
timed over `--batches` batches, in alternating order over `--pairs` rounds:

- full: the dataset as it is (MNIST.__getitem__: Image.fromarray, then the transform);
- no load: the PIL images built once, the transform in __getitem__;
- no augment: the transformed samples built once;
- no collate: the collated batches built once (the step and the loop alone).

A stage's hand cost is the mean over rounds of (its variant with it - without it): what
a training run pays per batch, as the tool's figure is (its points' total time over
their batches); the median is printed beside it in the summary. The rounds' differences
lean right (a slow round: a collection of Python garbage, the scheduler), so their
median reads below what a run pays: in one 20-round run on MNIST, augment's per-round
differences had a median of 9.1 ms and a mean of 10.2. The interquartile range of those
differences is printed beside each run's figure (how much the hand's own counterfactual
moves between rounds).
The tool's is `bisect()`'s stage cost (the advice's check off), measured over at least
`--rounds` rounds (Plan.min_rounds; 0: the tool's own stop, settled or `--max-seconds`).
Target: each within 15% or 0.3 ms per batch of the hand's.

Both sides are noisy on a 2-core machine whose speed moves between minutes (the step
alone read 10.0 and 13.1 ms a batch in adjacent runs): at 7 pairs the hand's load moved
by an IQR of 17 ms between rounds, and a run that settles after 3-4 rounds states its
own cost to +-2-5 ms. So each run measures both sides over many rounds, hand then tool
(tool then hand in every other run, so that a drift over the runs weighs on both), and
the summary compares the means over `--runs` runs: the mean difference (tool - hand)
with its standard error from the runs' differences, against the target.

Expectation, written before running (hand estimate from the per-sample costs: load
~30 us a sample, ToTensor + Normalize ~60-170 us on this machine): load ~4 ms per
batch, augment ~10-20 ms, collate ~1 ms.

    flock /tmp/cpu.lock python scripts/bench_mnist_costs.py [--runs 8] [--pairs 25] [--rounds 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from torch import nn
from torch.nn import functional as F

from bench_public_scripts import write_mnist
from bisect_pipeline import Workload, bisect

BATCH = 128


class VAE(nn.Module):
    """pytorch/examples vae/main.py's network."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, 20), nn.Linear(400, 20)
        self.fc3, self.fc4 = nn.Linear(20, 400), nn.Linear(400, 784)

    def forward(self, x):
        h = F.relu(self.fc1(x.view(-1, 784)))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(logvar) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def make_step(model, optimizer):
    def step(batch):
        x, _ = batch
        optimizer.zero_grad(set_to_none=True)
        recon, mu, logvar = model(x)
        bce = F.binary_cross_entropy(recon, x.view(-1, 784).clamp(0, 1), reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        (bce + kld).backward()
        optimizer.step()
    return step


class Listed(torch.utils.data.Dataset):
    def __init__(self, items, transform=None):
        self.items, self.transform = items, transform

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        x, y = self.items[i]
        return (self.transform(x) if self.transform else x), y


def variants(dataset):
    """The four loaders (or batch lists) of the counterfactual."""
    from PIL import Image

    n = 8 * BATCH  # as many samples as the tool caches
    pil = [(Image.fromarray(dataset.data[i].numpy(), mode="L"), int(dataset.targets[i])) for i in range(n)]
    done = [(dataset.transform(x), y) for x, y in pil]
    batches = list(torch.utils.data.DataLoader(Listed(done), batch_size=BATCH))
    loader = lambda ds: torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True)  # noqa: E731
    return {"full": loader(dataset), "no load": loader(Listed(pil, dataset.transform)), "no augment": loader(Listed(done)),
            "no collate": batches}


def time_variant(source, step, batches: int, warmup: int = 2) -> float:
    """ms per batch of `step` over `source`, after `warmup` untimed steps on a fresh
    iterator (an epoch's end inside the timed batches starts the next one)."""
    it = iter(source)
    for _ in range(warmup):
        step(next(it))
    t0 = time.perf_counter()
    for _ in range(batches):
        try:
            b = next(it)
        except StopIteration:
            it = iter(source)
            b = next(it)
        step(b)
    return (time.perf_counter() - t0) / batches * 1e3


def hand(dataset, step, pairs: int, batches: int) -> dict:
    v = variants(dataset)
    names = list(v)
    diffs: dict = {"load": [], "augment": [], "collate": []}
    for k in range(pairs):
        order = names if k % 2 == 0 else names[::-1]
        t = {name: time_variant(v[name], step, batches) for name in order}
        diffs["load"].append(t["full"] - t["no load"])
        diffs["augment"].append(t["no load"] - t["no augment"])
        diffs["collate"].append(t["no augment"] - t["no collate"])
    return ({s: statistics.mean(d) for s, d in diffs.items()}, {s: statistics.median(d) for s, d in diffs.items()},
            {s: _iqr(d) for s, d in diffs.items()})


def _iqr(values: list) -> float:
    """The interquartile range of the hand's per-round differences: how much the
    counterfactual itself moves between rounds on this machine."""
    if len(values) < 4:
        return float("nan")
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=25)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=12, help="the least rounds of each tool run (0: its own stop)")
    ap.add_argument("--max-seconds", type=float, default=120.0)
    args = ap.parse_args()
    from torchvision import datasets, transforms

    from bisect_pipeline.measure.plan import Plan

    root = tempfile.mkdtemp(prefix="mnist-")
    write_mnist(root)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    dataset = datasets.MNIST(root, train=True, download=False, transform=transform)
    torch.manual_seed(0)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = make_step(model, optimizer)
    plan = Plan(min_rounds=args.rounds) if args.rounds else None
    stages = ("load", "augment", "collate")
    seen: dict = {s: [] for s in stages}  # (hand, tool) per run
    print(f"{'run':>3}  {'stage':8} {'hand':>7} {'hand IQR':>8} {'tool':>7} {'tool noise':>10}  within", flush=True)
    for run in range(args.runs):
        def tool():
            loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True)
            return bisect(workload=Workload(model=model, loader=loader, optimizer=optimizer, step=step),
                          max_seconds=args.max_seconds, verify_seconds=0, plan=plan)
        if run % 2 == 0:
            by_hand, hand_median, hand_iqr = hand(dataset, step, args.pairs, args.batches)
            r = tool()
        else:
            r = tool()
            by_hand, hand_median, hand_iqr = hand(dataset, step, args.pairs, args.batches)
        for s in stages:
            c = r.stage(s)
            got = None if c.sec_per_batch is None else c.sec_per_batch * 1e3
            if got is not None:
                seen[s].append((by_hand[s], got, hand_median[s]))
            noise = "-" if c.sigma is None else f"±{c.sigma * 1e3:.2f}"
            print(f"{run + 1:>3}  {s:8} {by_hand[s]:7.2f} {hand_iqr[s]:8.2f} {got if got is not None else float('nan'):7.2f} "
                  f"{noise:>10}  {'yes' if within(got, by_hand[s]) else 'NO'}", flush=True)
        print(f"     verdict {r.bottleneck} ({r.run.rounds} rounds, settled {r.run.settled}, "
              f"{'hand first' if run % 2 == 0 else 'tool first'})", flush=True)
    print(f"\nover {args.runs} runs (mean, and the mean difference tool - hand with its standard error):")
    for s in stages:
        pairs = seen[s]
        if len(pairs) < 2:
            print(f"  {s:8} too few runs")
            continue
        h = statistics.mean(p[0] for p in pairs)
        t = statistics.mean(p[1] for p in pairs)
        d = [p[1] - p[0] for p in pairs]
        se = statistics.stdev(d) / len(d) ** 0.5
        m = statistics.mean(p[2] for p in pairs)
        print(f"  {s:8} hand {h:6.2f} (median {m:6.2f})  tool {t:6.2f}  difference {t - h:+6.2f} ± {se:.2f} ms per batch "
              f"({(t - h) / h * 100 if h else float('nan'):+.0f}%)  within target: {'yes' if within(t, h) else 'NO'}")


def within(tool: float | None, hand: float) -> bool:
    """The target: within 15% or 0.3 ms per batch of the hand's."""
    return tool is not None and (abs(tool - hand) <= 0.3 or abs(tool - hand) <= 0.15 * abs(hand))


if __name__ == "__main__":
    main()
