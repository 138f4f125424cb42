"""The demo's wall time and verdict over several runs (issue 30: "the demo median wall time
over 5 runs before and after").

Expectation, written before running: the demo (augment-bound, 36 ms of a 60 ms batch) is a
clear case; with the paired-round noise it should still settle on `augment` every time,
in well under its 30-s budget (the README says "under 30 s").

Each run is `python -m bisect_pipeline demo --json FILE` in a fresh process, timed from
start to exit (cache fill, rounds, isolated timings and the advice's check included); the
verdict, rounds and `run.verdict_s` are read from its JSON.

    flock /tmp/cpu.lock python scripts/bench_demo_time.py [--runs 5] [--code DIR]

`--code DIR`: the checkout whose bisect_pipeline is run (PYTHONPATH), to time an older
commit the same way (e.g. one extracted with `git archive`).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--code", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.abspath(args.code))
    walls, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            path = os.path.join(tmp, f"demo-{i}.json")
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "bisect_pipeline", "demo", "--quiet", "--json", path], env=env,
                           check=False, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            doc = json.load(open(path))
            run = doc.get("run", {})
            walls.append(wall)
            rows.append((i + 1, doc["bottleneck"], run.get("rounds"), run.get("settled"), run.get("verdict_s"), wall))
            print(f"run {i + 1}: {doc['bottleneck']}, {run.get('rounds')} rounds, settled {run.get('settled')}, "
                  f"verdict after {run.get('verdict_s')} s, wall {wall:.1f} s", flush=True)
    print(f"median wall time over {args.runs} runs: {statistics.median(walls):.1f} s "
          f"(min {min(walls):.1f}, max {max(walls):.1f}); verdicts: "
          + ", ".join(sorted({r[1] for r in rows})))


if __name__ == "__main__":
    main()
