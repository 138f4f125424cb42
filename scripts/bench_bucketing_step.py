"""A fast step over variable-length samples (issue 51, item 6): the input's only cost is
building each item's tensor from a Python list, and it decides.

The pipeline (`make`, an entry function for `bisect-pipeline --entry`):

- a map-style dataset of `--items` token sequences of 16-256 tokens, kept as Python
  lists of ints (as a tokenizer's output is); `__getitem__` builds the item's tensor
  with `torch.tensor(list)`: the per-item tensor building, the only input cost;
- a length-bucketing batch_sampler (the dataset sorted by length into batches of
  64, the batches shuffled each epoch), as text pipelines batch to cut padding;
- a padding collate_fn (`pad_sequence`);
- an embedding-bag model whose CPU step takes a few ms; num_workers=0 (`BENCH_WORKERS`
  in the environment, or `--workers`, for others); the step on torch's default intra-op
  threads (`BENCH_THREADS`, or `--threads`, for another count: on a shared 2-core
  machine a 2-thread step stalls on a descheduled thread, 3 ms becoming 20-70).

The hand counterfactual (`--hand`): the same loader settings and step, three variants,
each timed over `--batches` batches in alternation over `--pairs` rounds, every variant's
iterator kept from one round to the next (no epoch end inside a timing):

- full: the pipeline as it is;
- samples cached: the same sampler and collate_fn over the items' tensors built once;
- batches cached: the collated batches built once, cycled (the step and the loop alone).

load = full - samples cached; the rest (sampler, fetch, collate) = samples cached -
batches cached. Each per round, their median and spread printed.

The tool (`--runs N`): `bisect-pipeline --entry scripts/bench_bucketing_step.py:make`
at its default budget, N times, each under `flock /tmp/cpu.lock`; per run the verdict,
its witness, the stages' costs in the loop and alone, the rounds and the reason.

    flock /tmp/cpu.lock python scripts/bench_bucketing_step.py --hand [--pairs 20] [--batches 100] [--threads 1]
    python scripts/bench_bucketing_step.py --runs 3 [--max-seconds 30] [--workers 0] [--threads 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler

from bisect_pipeline.pipeline.step import make_step

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 64
VOCAB = 30000


class Tokens(Dataset):
    """Token sequences of 16-256 tokens as Python lists; each item built as a tensor."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.seqs = [[rng.randrange(VOCAB) for _ in range(rng.randint(16, 256))] for _ in range(n)]
        self.labels = [rng.randrange(10) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int):
        return torch.tensor(self.seqs[i], dtype=torch.long), self.labels[i]


class Bucketed(Sampler):
    """A length-bucketing batch sampler: the indices sorted by length, cut into batches
    of `batch_size`, the batches shuffled each epoch."""

    def __init__(self, lengths: list, batch_size: int, seed: int = 0) -> None:
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        self.batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        self.seed, self.epoch = seed, 0

    def __iter__(self):
        rng = random.Random(self.seed + self.epoch)
        self.epoch += 1
        batches = list(self.batches)
        rng.shuffle(batches)
        return iter(batches)

    def __len__(self) -> int:
        return len(self.batches)


def pad(batch: list):
    seqs, labels = zip(*batch)
    return pad_sequence(list(seqs), batch_first=True), torch.tensor(labels)


class Bag(nn.Module):
    """Embedding, mean over the tokens, two linear layers."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x):
        return self.head(self.emb(x).mean(1))


def loader_of(dataset, workers: int) -> DataLoader:
    lengths = [len(s) for s in dataset.seqs] if hasattr(dataset, "seqs") else [len(x) for x, _ in dataset.items]
    return DataLoader(dataset, batch_sampler=Bucketed(lengths, BATCH), collate_fn=pad, num_workers=workers)


def make(items: int = 8192, workers=None):
    """The entry function: (model, loader); SGD and cross-entropy by default."""
    torch.manual_seed(0)
    if os.environ.get("BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    workers = int(os.environ.get("BENCH_WORKERS", "0")) if workers is None else workers
    return Bag(), loader_of(Tokens(items), workers)


# --------------------------------------------------------------------------------------
# The hand counterfactual
# --------------------------------------------------------------------------------------


class Built(Dataset):
    """The items' tensors built once: the dataset with its per-item work done."""

    def __init__(self, ds: Tokens) -> None:
        self.items = [ds[i] for i in range(len(ds))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def endless(loader: DataLoader):
    """The loader's batches across its epochs (an epoch's end is rare in a timing: 128
    batches an epoch; the samples-cached variant pays it as full does)."""
    while True:
        yield from loader


def hand(pairs: int, batches: int, workers: int) -> dict:
    model, loader = make(workers=workers)
    step = make_step(model)  # the tool's default step, as --entry runs it
    built = Built(loader.dataset)
    cached = list(itertools.islice(iter(loader_of(built, 0)), 16))
    variants = {"full": endless(loader), "samples cached": endless(loader_of(built, workers)),
                "batches cached": itertools.cycle(cached)}
    rounds: dict = {k: [] for k in variants}
    for k in range(pairs):
        for name in (list(variants) if k % 2 == 0 else list(variants)[::-1]):
            it = variants[name]
            for _ in range(2 + 2 * workers):
                step(next(it))
            t0 = time.perf_counter()
            for _ in range(batches):
                step(next(it))
            rounds[name].append((time.perf_counter() - t0) / batches * 1e3)
    load = [a - b for a, b in zip(rounds["full"], rounds["samples cached"])]
    rest = [a - b for a, b in zip(rounds["samples cached"], rounds["batches cached"])]
    med = statistics.median
    full = med(rounds["full"])
    return {"full_ms": round(full, 3), "samples_cached_ms": round(med(rounds["samples cached"]), 3),
            "step_alone_ms": round(med(rounds["batches cached"]), 3), "load_ms": round(med(load), 3),
            "load_sd_ms": round(statistics.stdev(load), 3), "rest_ms": round(med(rest), 3),
            "rest_sd_ms": round(statistics.stdev(rest), 3), "load_share": round(med(load) / full, 3),
            "gap_share": round((full - med(rounds["batches cached"])) / full, 3), "pairs": pairs, "batches": batches,
            "workers": workers, "threads": torch.get_num_threads()}


# --------------------------------------------------------------------------------------
# The tool
# --------------------------------------------------------------------------------------


def run_tool(n: int, max_seconds: float, workers: int, threads: int, lock: str, json_dir: str) -> list:
    out = []
    for r in range(n):
        js = os.path.join(json_dir, f"bucketing_w{workers}_t{threads}_r{r}.json")
        cmd = ["flock", lock, sys.executable, "-m", "bisect_pipeline", "--entry",
               os.path.join(HERE, "bench_bucketing_step.py") + ":make", "--json", js, "--quiet"]
        if max_seconds:
            cmd += ["--max-seconds", f"{max_seconds:g}"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "BENCH_WORKERS": str(workers),
                                                                        **({"BENCH_THREADS": str(threads)} if threads else {})})
        wall = time.perf_counter() - t0
        if not os.path.exists(js):
            print(f"run {r + 1}: exit {p.returncode}, no report: {p.stderr[-800:]}", flush=True)
            continue
        d = json.load(open(js))
        v, run = d.get("verdict") or {}, d.get("run") or {}
        stages = {s["stage"]: s for s in d.get("stages") or []}
        costs = ", ".join(f"{k} {s['ms_per_batch']:.2f}" + (f" (alone {s['alone_ms_per_batch']:.2f})"
                                                           if s.get("alone_ms_per_batch") is not None else "")
                          for k, s in stages.items() if s.get("ms_per_batch") is not None)
        print(f"run {r + 1}: {d.get('bottleneck')} (witness {v.get('witness')}); {costs} ms/batch; rounds "
              f"{run.get('rounds')} ({'settled' if run.get('settled') else 'not settled'}); wall {wall:.1f} s\n"
              f"  reason: {v.get('reason') or d.get('reason')}", flush=True)
        out.append(d.get("bottleneck"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hand", action="store_true", help="the hand counterfactual")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--runs", type=int, default=0, help="runs of the tool")
    ap.add_argument("--max-seconds", type=float, default=0.0, help="0: the tool's default")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="the step's intra-op threads (0: torch's default)")
    ap.add_argument("--lock", default="/tmp/cpu.lock")
    ap.add_argument("--json-dir", default=None)
    args = ap.parse_args()
    if args.hand:
        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(hand(args.pairs, args.batches, args.workers)), flush=True)
    if args.runs:
        json_dir = args.json_dir or tempfile.mkdtemp(prefix="bucketing")
        os.makedirs(json_dir, exist_ok=True)
        verdicts = run_tool(args.runs, args.max_seconds, args.workers, args.threads, args.lock, json_dir)
        good = sum(v in ("load", "none") for v in verdicts)
        print(f"{good} of {args.runs} runs: load or none ({', '.join(map(str, verdicts))}); documents in {json_dir}")


if __name__ == "__main__":
    main()
