"""Step times after a parked worker pool resumes: is a batch ready ahead of the step?

Experiment.resumes warms a resumed pool up without the prefetch: its queue was emptied at
the park (sources.LoaderSource.park) and its workers sat idle, so at the resume no batch
should be ready ahead of the step, and the steps right after it should be no faster than
the steady ones. This times it on a public pipeline of bench_public_pipelines.py: the
pipeline's `full` source built by the tool (sources.full_loader, park=True), `--visits`
times resumed, each time `--steps` steps (the wait for the batch and the step, each timed),
parked, then 2 s idle (other points measured meanwhile). Prints each visit's steps and
their median by position over the visits after the first (the first starts the workers).

Measured (2026-11-26, this 2-core machine; ms): dcgan 1193 (the first batch), 677, 614,
572, 580, 568, 585 ... (two slow steps, none faster); imagenet 1699, 1086, 1108, 1096,
1135, 1160 ... (none off the steady state).

    flock /tmp/cpu.lock python scripts/bench_resume_steps.py dcgan [--steps 13] [--visits 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", help="a case of bench_public_pipelines.py with workers (dcgan, imagenet, timm, ...)")
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--visits", type=int, default=7)
    args = ap.parse_args()
    os.environ.setdefault("EXAMPLES", "/tmp/examples")
    import bench_public_pipelines as b

    from bisect_pipeline.pipeline.loader import describe
    from bisect_pipeline.measure.sources import full_loader
    from bisect_pipeline.pipeline.step import make_step

    wl, _, _ = b.CASES[args.case]()
    step = make_step(wl.model, wl.optimizer or torch.optim.SGD(wl.model.parameters(), lr=0.01), wl.loss_fn, wl.step)
    source = full_loader(describe(wl.loader), park=True)
    rows = []
    with source as next_batch:
        for _ in range(args.visits):
            source.resume()
            times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step(next_batch())
                times.append(time.perf_counter() - t)
            source.park()
            rows.append(times)
            print(" ".join(f"{t * 1e3:5.0f}" for t in times), flush=True)
            time.sleep(2)
    later = rows[1:] or rows
    print("median by step after the resume (visits 2..):")
    print(" ".join(f"{statistics.median(r[j] for r in later) * 1e3:5.0f}" for j in range(args.steps)))


if __name__ == "__main__":
    main()
