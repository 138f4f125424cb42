"""The user's loop as the step (`run`, `watching()`) against the tool's own step (`--entry`,
`bisect()`) on the same planted pipelines: do they name the same stage, and cost it the
same within noise?

For each planted workload (testing.benchmark: load, augment, collate or model-bound, at
num_workers 0 and 2), `--runs` pairs of runs in one process, alternating: bisect() with
the default step, then watching() around a hand loop doing exactly that step (zero_grad,
cross-entropy, backward, optimizer step) for as many epochs as it takes. Per pipeline:
the verdicts of each side, and each stage's median cost on each side with the combined
noise (3 standard errors of the difference, at least 5% of t(full), the tool's rule).

    python scripts/bench_run_vs_entry.py                  # 3 pairs per pipeline, ~10 min
    python scripts/bench_run_vs_entry.py --runs 1 --kinds augment --workers 0
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics

import torch

from bisect_pipeline import bisect, testing, watching
from bisect_pipeline.core.stats import MIN_REL_DROP, Z_NOISE

STAGES = ("load", "augment", "collate", "handoff")


def entry_run(kind: str, workers: int, max_seconds: float):
    model, loader = testing.benchmark(kind, workers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return bisect(model, loader, optimizer=opt, device="cpu", max_seconds=max_seconds, verify_seconds=0)


def loop_run(kind: str, workers: int, max_seconds: float):
    model, loader = testing.benchmark(kind, workers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    with watching(device="cpu", max_seconds=max_seconds, verify_seconds=0) as session:
        for _ in range(100_000):
            for x, y in loader:
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
    return session.report


def costs(report) -> dict:
    out = {}
    for s in report.verdict.stages:
        if s.status == "ok":
            out[s.stage] = (s.sec_per_batch * 1e3, (s.sigma or 0.0) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kinds", default="load,augment,collate,model")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--max-seconds", type=float, default=30.0)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same intra-op threads for both sides
    for kind in args.kinds.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            verdicts: dict = collections.defaultdict(list)
            stage_ms: dict = collections.defaultdict(lambda: collections.defaultdict(list))
            t_full: list = []
            for r in range(args.runs):
                for side, run in (("entry", entry_run), ("loop", loop_run)) if r % 2 == 0 else \
                        (("loop", loop_run), ("entry", entry_run)):
                    report = run(kind, workers, args.max_seconds)
                    verdicts[side].append(report.bottleneck)
                    if report.rate("full"):
                        t_full.append(report.batch_size / report.rate("full") * 1e3)
                    for stage, (ms, sigma) in costs(report).items():
                        stage_ms[stage][side].append((ms, sigma))
            print(f"{kind} w{workers}: entry {verdicts['entry']}  loop {verdicts['loop']}", flush=True)
            floor = MIN_REL_DROP * statistics.median(t_full) if t_full else 0.0
            for stage in STAGES:
                sides = stage_ms.get(stage)
                if not sides or not sides.get("entry") or not sides.get("loop"):
                    continue
                e = statistics.median(m for m, _ in sides["entry"])
                lp = statistics.median(m for m, _ in sides["loop"])
                noise = max(Z_NOISE * math.hypot(statistics.median(s for _, s in sides["entry"]),
                                                 statistics.median(s for _, s in sides["loop"])), floor)
                agree = "agree" if abs(e - lp) <= noise else "DIFFER"
                print(f"    {stage:8s} entry {e:7.2f} ms  loop {lp:7.2f} ms  |diff| {abs(e - lp):6.2f} "
                      f"<= {noise:5.2f}? {agree}", flush=True)


if __name__ == "__main__":
    main()
