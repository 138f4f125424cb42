"""A short script on a fast step gets its verdict before it ends (issue 44, item 2):
scripts/fast_step.py (the MNIST example's pipeline, one worker, 94 batches an epoch, its
default 14 epochs: 1,316 batches; a 2-ms step that does not use the CPU) under
`bisect-pipeline run`, --runs times, each holding /tmp/cpu.lock. Per run: the exit
status, the verdict, whether the script ended first (source.ended), the batches the
experiment used of those the script gives, the rounds and the wall time; with
`--expect STAGE`, whether the verdict names it, not merged with another stage (issue 59:
its costliest stage named, never merged with another for a point left out; stages merged
elsewhere are listed); `--out DIR` keeps each run's JSON.

    python scripts/bench_fast_step.py [--runs 3] [--max-seconds 30] [--epochs 14] [--expect augment] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--epochs", type=int, default=14)
    ap.add_argument("--lock", default="/tmp/cpu.lock")
    ap.add_argument("--expect", default=None, help="the stage the verdict should name alone")
    ap.add_argument("--out", default=None, help="keep each run's JSON here")
    args = ap.parse_args()
    ok = named = 0
    with tempfile.TemporaryDirectory() as tmp:
        if args.out:
            os.makedirs(args.out, exist_ok=True)
        for r in range(args.runs):
            js = os.path.join(args.out or tmp, f"r{r + 1}.json")
            cmd = ["flock", args.lock, sys.executable, "-m", "bisect_pipeline", "run", "--json", js, "--max-seconds",
                   f"{args.max_seconds:g}", "--quiet", os.path.join(HERE, "fast_step.py"), "--epochs", str(args.epochs)]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if not os.path.exists(js):
                print(f"run {r + 1}: exit {p.returncode}, no report: {p.stderr[-500:]}")
                continue
            d = json.load(open(js))
            src, run = d.get("source") or {}, d.get("run") or {}
            before = p.returncode == 0 and not src.get("ended") and d.get("bottleneck") is not None
            ok += before
            verdict = d.get("verdict") or {}
            stages = {s["stage"]: s for s in d.get("stages") or []}
            merged = [s for s in stages.values() if s.get("status") == "ok" and len(s.get("includes") or ()) > 1]
            named_alone = stages.get(args.expect, {}).get("includes") in ([args.expect], None)
            hit = args.expect is not None and d.get("bottleneck") == args.expect and named_alone
            named += hit
            left_out = [p["point"] for p in d.get("points") or [] if p.get("failed_stage") == "inconsistent"]
            print(f"run {r + 1}: exit {p.returncode}; verdict {d.get('bottleneck')}"
                  f"{' ' + str(tuple(verdict.get('tied') or ())) if d.get('bottleneck') == 'tie' else ''} "
                  f"(witness {verdict.get('witness')}){'; NAMED' if hit else ''}; merged "
                  f"{[s['stage'] + '+' + '+'.join(s['includes'][1:]) for s in merged] or 'none'}; left out "
                  f"{left_out or 'none'}; remeasured {run.get('remeasured')}; script ended first: "
                  f"{bool(src.get('ended'))}; batches {src.get('batches')} of {(src.get('expected') or {}).get('batches')}; "
                  f"rounds {run.get('rounds')} ({'settled' if run.get('settled') else 'not settled'}); check "
                  f"{(d.get('verification') or {}).get('status')}; wall {wall:.1f} s (lock wait included)", flush=True)
    print(f"{ok} of {args.runs} runs: a verdict before the script ended")
    if args.expect:
        print(f"{named} of {args.runs} runs: {args.expect} named, not merged with another stage")


if __name__ == "__main__":
    main()
