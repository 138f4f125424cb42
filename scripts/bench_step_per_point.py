"""Does the training step cost the same at every point? (SPEC.md: it must.)

Runs the demo (or --entry) with a step that times itself, `--runs` times, in this
process as it was started (no MALLOC_* variables); the tool's progress events say which
point (and which visit of it) each step belongs to. Two checks:

- within a run: each visit's median step; a point's step is the mean of its visits, with
  the noise of visits (the pooled spread of visit medians around their point's mean:
  a VM's speed drifts by ~10% over seconds, which step-to-step spread misses). Two
  points differ when stats.is_real says so (3 standard errors and 5%);
- across runs: each point's step relative to its run's median step. A process effect
  (the allocator, a point that does extra work) is the same in every run; drift is not.
  A point is off when its mean ratio differs from 1 beyond 3 standard errors and 5%.

    python scripts/bench_step_per_point.py              # the demo, 5 runs
    python scripts/bench_step_per_point.py --no-hold     # the allocator as the process has it
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time

from bisect_pipeline import bisect
from bisect_pipeline.pipeline import entry
from bisect_pipeline.pipeline.step import make_step
from bisect_pipeline.core.stats import is_real, median
from bisect_pipeline.derive.drops import POINTS


def one_run(entry_spec: str, hold: bool) -> dict:
    """{(point, visit): [step seconds]} and the verdict."""
    wl = entry.load(entry_spec)
    inner = make_step(wl.model, wl.optimizer, wl.loss_fn, wl.step)
    current = {"key": None}
    visits: dict = {}
    times: dict = {}

    def step(batch):
        t = time.perf_counter()
        inner(batch)
        if current["key"] is not None:
            times.setdefault(current["key"], []).append(time.perf_counter() - t)

    def progress(event):
        if event.get("event") == "point":
            p = event["point"]
            visits[p] = visits.get(p, 0) + 1
            current["key"] = (p, visits[p])

    report = bisect(wl.model, wl.loader, step=step, device="cpu", progress=progress, hold_allocator=hold)
    return {"times": times, "verdict": report.bottleneck, "settled": report.run.get("settled")}


def per_point(times: dict) -> tuple[dict, float]:
    """{point: (mean of visit medians, standard error)} and the visits' pooled sigma."""
    by_point: dict = {}
    for (p, _), t in times.items():
        by_point.setdefault(p, []).append(median(t))
    ss = sum((v - statistics.fmean(vs)) ** 2 for vs in by_point.values() for v in vs)
    df = sum(len(vs) - 1 for vs in by_point.values())
    sigma = math.sqrt(ss / df) if df else 0.0
    return {p: (statistics.fmean(vs), sigma / math.sqrt(len(vs))) for p, vs in by_point.items()}, sigma


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry", default="bisect_pipeline.demo:make")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-hold", action="store_true", help="do not hold the allocator still (hold_allocator=False)")
    args = ap.parse_args()
    ratios: dict = {}
    for r in range(args.runs):
        out = one_run(args.entry, hold=not args.no_hold)
        rows, sigma = per_point(out["times"])
        rows = {p: rows[p] for p in POINTS if p in rows}
        run_median = median([m for m, _ in rows.values()])
        for p, (m, _) in rows.items():
            ratios.setdefault(p, []).append(m / run_median)
        print(f"run {r + 1} (verdict {out['verdict']}, settled {out['settled']}; visits drift by "
              f"{sigma / run_median * 100:.1f}%): " + ", ".join(f"{p} {m * 1e3:.1f} ms (±{s * 1e3:.1f})"
                                                                for p, (m, s) in rows.items()))
        apart = [f"{a} vs {b}" for (a, (ma, sa)), (b, (mb, sb)) in itertools.combinations(rows.items(), 2)
                 if is_real(abs(ma - mb), math.hypot(sa, sb), min(ma, mb))]
        print("   equal within the noise at every point" if not apart else "   beyond the noise: " + "; ".join(apart))
    print(f"\nacross {args.runs} runs, each point's step relative to its run's median step:")
    off = []
    for p, rs in ratios.items():
        mean = statistics.fmean(rs)
        se = statistics.stdev(rs) / math.sqrt(len(rs)) if len(rs) > 1 else 0.0
        real = len(rs) > 1 and is_real(abs(mean - 1), se, 1.0)
        off += [p] if real else []
        print(f"  {p:10s} {mean:.3f} ± {se:.3f}  " + " ".join(f"{x:.3f}" for x in rs) + ("  OFF" if real else ""))
    print("no point's step is systematically off" if not off else f"systematically off: {', '.join(off)}")


if __name__ == "__main__":
    main()
