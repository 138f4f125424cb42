"""Verdicts with a busy neighbour: how often right, `inconclusive`, or wrong (wrong: 0).

Runs the planted workloads (load-, augment-, collate-, model-bound at num_workers 0 and
2; bisect_pipeline.testing.benchmark) and the built-in demo (augment-bound), `--runs` times each,
with a neighbour process spinning on one core for the whole time (`--quiet-too` also
runs them without it first). A verdict is right when it names the planted stage (none
for the model-bound step), `inconclusive` is allowed on a busy machine, anything else
is wrong. Every report is also checked against its own rules (check-report).

    python scripts/bench_under_load.py                      # busy neighbour, 3 runs each (~10 min)
    python scripts/bench_under_load.py --quiet-too --runs 5
    python scripts/bench_under_load.py --only demo --runs 10 --quiet-too
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import tempfile

from bench_verdicts import planted_maker, run_workload, summary_table
from bisect_pipeline import testing


def spin(core: int) -> None:
    """A busy neighbour: one process spinning on one core."""
    try:
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError):
        pass
    while True:
        pass


@contextlib.contextmanager
def neighbour(on: bool):
    if not on:
        yield
        return
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    p = multiprocessing.get_context("fork").Process(target=spin, args=(cores[-1],), daemon=True)
    p.start()
    try:
        yield
    finally:
        p.terminate()
        p.join()


def demo_maker():
    from bisect_pipeline.demo import make

    def build():
        w = make()
        return w.model, w.loader, {"optimizer": w.optimizer}
    return build


def workloads(only: str) -> list:
    out = []
    for kind in testing.KINDS:
        for workers in (0, 2):
            name = f"{kind}-w{workers}"
            out.append((name, planted_maker(kind, workers), testing.EXPECTED[kind], "load" if kind == "model" else kind))
    out.append(("demo", demo_maker(), "augment", "augment"))
    if only:
        keep = set(only.split(","))
        out = [w for w in out if w[0] in keep or w[0].split("-")[0] in keep]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated workloads (augment-w2, demo, model, ...)")
    ap.add_argument("--quiet-too", action="store_true", help="also run every workload without the neighbour")
    ap.add_argument("--max-seconds", type=float, default=None, help="bisect's default when not given")
    ap.add_argument("--out", default=None, help="keep every report's JSON in this folder")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="bench-under-load-")
    os.makedirs(out_dir, exist_ok=True)
    print(f"reports in {out_dir}")
    results = {}
    for busy in ([False, True] if args.quiet_too else [True]):
        label = "with a busy neighbour on one core" if busy else "quiet"
        print(f"\n== {label}")
        rows = []
        with neighbour(busy):
            for name, make, expected, stage in workloads(args.only):
                tag = f"{name}{'-busy' if busy else ''}"
                rows.append(run_workload(tag, make, expected, args.runs, args.max_seconds, out_dir, stage=stage))
        print(f"\n== {label}")
        summary_table(rows)
        results[label] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
