"""Right verdicts, accurate stage costs, time to verdict, reports that agree with themselves.

For each planted workload (load-, augment-, collate-, model-bound; bisect_pipeline.testing.benchmark)
and num_workers in {0, 2}, runs `bisect()` with the default settings `--runs` times and
prints: how many verdicts were right, `inconclusive` or wrong (target: the expected one
every time, never a wrong one), the reported cost of the planted stage against the
planted 48 ms per batch (target: within 20%; with workers the pipelined cost is compared
with planted / workers - step, see expected_cost_ms), the wall time of each bisect()
call (target: median <= 15 s, max <= 30 s), and whether every report passes its own
rules (../shared/tools/check-report when it is there, else verdict.self_check).

    python scripts/bench_verdicts.py                 # 8 workloads x 5 runs (~8 min)
    python scripts/bench_verdicts.py --kinds augment --workers 0 --runs 3
    python scripts/bench_verdicts.py --json /tmp/verdicts.json --out /tmp/reports
    python scripts/bench_verdicts.py --threads 1      # the step on one intra-op thread
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bisect_pipeline import bisect, testing

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK_REPORT = os.path.join(HERE, "..", "..", "shared", "tools", "check-report")


def calibrate(n: int = 100) -> float:
    """What one planted 3 ms sleep really costs here (sleep overshoots by 0.05-0.5 ms,
    more on a busy machine): the planted cost the reported one is compared with."""
    s = testing.Sleep(testing.BENCH_PER_SAMPLE_MS)
    t0 = time.perf_counter()
    for _ in range(n):
        s(None)
    return (time.perf_counter() - t0) / n * 1e3


def expected_cost_ms(kind: str, workers: int, per_sample_ms: float = testing.BENCH_PER_SAMPLE_MS) -> float:
    """What the planted stage should add per batch to the time of the full pipeline.

    Without workers every stage runs in the loop, so it adds its whole cost (48 ms).
    With W workers the planted work is spread over them while the step runs: the
    pipeline's time per batch becomes max(step, 48 / W) and the point above it runs at
    about the step's pace, so the stage adds 48 / W - step."""
    per_batch = per_sample_ms * testing.BENCH_BATCH
    if kind == "model":
        return 0.0
    if workers == 0:
        return per_batch
    return max(0.0, per_batch / workers - testing.BENCH_STEP_MS)


def check(path: str) -> str:
    """'consistent', or the problems check-report (or the report itself) finds."""
    if os.path.exists(CHECK_REPORT):
        out = subprocess.run([sys.executable, CHECK_REPORT, path], capture_output=True, text=True).stdout
        return out.split(": ", 1)[-1].strip()
    doc = json.load(open(path))
    broken = [n["message"] for n in doc.get("notes", []) if n.get("kind") == "rules"]
    return "; ".join(broken) or "consistent"


def grade(verdict, expected: str, tied: tuple = ()) -> str:
    """right; tie (a tie led by the expected stage: an answer that has not told it apart
    from a runner-up yet); inconclusive; or wrong. `expected` may name alternatives,
    '/'-separated (a hand counterfactual at the 5% floor: none/handoff)."""
    alternatives = expected.split("/")
    if verdict in alternatives:
        return "right"
    if verdict == "tie" and tied and tied[0] in alternatives:
        return "tie"
    return "inconclusive" if verdict == "inconclusive" else "wrong"


def run_workload(name: str, make, expected: str, runs: int, max_seconds: float, out_dir: str,
                 stage: str = None) -> dict:
    """`runs` bisections of `make()`'s workload: verdicts, grades, cost of `stage`, walls, checks."""
    verdicts, grades, costs, walls, checks = [], [], [], [], []
    for i in range(runs):
        model, loader, kw = make()
        t0 = time.perf_counter()
        report = bisect(model, loader, device="cpu", **({"max_seconds": max_seconds} if max_seconds else {}), **kw)
        walls.append(time.perf_counter() - t0)
        path = os.path.join(out_dir, f"{name}-{i + 1}.json")
        report.save_json(path)
        verdicts.append(report.bottleneck)
        grades.append(grade(report.bottleneck, expected, report.verdict.tied))
        checks.append(check(path))
        s = report.stage(stage) if stage else None
        costs.append(None if s is None or s.sec_per_batch is None else s.sec_per_batch * 1e3)
        cost = "" if costs[-1] is None else f" {stage} {costs[-1]:.1f} ms"
        print(f"  {name:12s} run {i + 1}: {report.bottleneck!s:12s} ({grades[-1]}){cost}  wall {walls[-1]:.1f} s  "
              f"rounds {report.run.rounds}  {checks[-1]}", flush=True)
    return {"workload": name, "expected": expected, "verdicts": verdicts, "grades": grades, "costs_ms": costs,
            "walls_s": walls, "checks": checks}


def planted_maker(kind: str, workers: int):
    def make():
        model, loader = testing.benchmark(kind, workers)
        return model, loader, {}
    return make


def summary_table(rows: list) -> None:
    print()
    print(f"{'workload':14s} {'expected':9s} {'right':>5s} {'tie':>4s} {'inconcl.':>8s} {'wrong':>5s}  {'cost ms (planted)':>18s} "
          f"{'wall s med/max':>15s}  reports")
    for r in rows:
        g = r["grades"]
        costs = [c for c in r["costs_ms"] if c is not None]
        cost = "-" if not costs or r.get("planted_ms") is None else (
            f"{statistics.median(costs):.1f} ({r['planted_ms']:.1f})")
        bad = sum(c != "consistent" for c in r["checks"])
        print(f"{r['workload']:14s} {r['expected']:9s} {g.count('right'):>5d} {g.count('tie'):>4d} {g.count('inconclusive'):>8d} "
              f"{g.count('wrong'):>5d}  {cost:>18s} {statistics.median(r['walls_s']):>7.1f}/{max(r['walls_s']):<7.1f}  "
              f"{len(g) - bad}/{len(g)} consistent")
    grades = [x for r in rows for x in r["grades"]]
    walls = [x for r in rows for x in r["walls_s"]]
    print(f"all: {grades.count('right')} right, {grades.count('tie')} tie led by it, {grades.count('inconclusive')} "
          f"inconclusive, {grades.count('wrong')} "
          f"wrong of {len(grades)}; wall median {statistics.median(walls):.1f} s, max {max(walls):.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default=",".join(testing.KINDS))
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=None, help="bisect's default when not given")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--out", default=None, help="keep every report's JSON in this folder")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads for the step (default: torch's own)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out_dir = args.out or tempfile.mkdtemp(prefix="bench-verdicts-")
    os.makedirs(out_dir, exist_ok=True)
    per_sample = calibrate()
    print(f"a planted {testing.BENCH_PER_SAMPLE_MS:g} ms sleep costs {per_sample:.3f} ms here; reports in {out_dir}")
    rows = []
    for kind in args.kinds.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            stage = "load" if kind == "model" else kind
            row = run_workload(f"{kind}-w{workers}", planted_maker(kind, workers), testing.EXPECTED[kind], args.runs,
                               args.max_seconds, out_dir, stage=stage)
            row["planted_ms"] = None if kind == "model" else expected_cost_ms(kind, workers, calibrate(50))
            rows.append(row)
    summary_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
