"""The advice's check against a hand loop, one visit each, interleaved in one process.

Every visit the verification makes (verify.visit: your settings or a candidate's) is
followed by a visit of a plain training loop with the same settings, as a user would
write it: a new DataLoader over your dataset (shuffle, your batch size and collate
function, the candidate's num_workers, persistent_workers and torch threads), epochs
ended and restarted, the same step, timed by the same `timing.measure`. Both see the
same process and the same second of the machine, so a difference between them is the
tool's, not the machine's.

    python scripts/bench_verify_vs_hand.py                                 # the demo
    python scripts/bench_verify_vs_hand.py scripts/seed_pipeline.py:make_w0
    python scripts/bench_verify_vs_hand.py scripts/verify_evidence.py:mnist --verify-seconds 40

Prints each visit as (side, tool samples/s, hand samples/s) and the medians per side.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader

from bisect_pipeline import bisect
from bisect_pipeline.pipeline import entry
from bisect_pipeline.advise import outcome, verify
from bisect_pipeline.measure.plan import Plan
from bisect_pipeline.measure.visit import time_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("entry", nargs="?", default="bisect_pipeline.demo:make")
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--verify-seconds", type=float, default=40.0)
    args = ap.parse_args()
    wl = entry.load(args.entry)
    model, opt, ld = wl.model, wl.optimizer, wl.loader
    loss_fn = wl.loss_fn or torch.nn.functional.cross_entropy

    def step(batch) -> None:
        x, y = batch
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    def hand(settings: dict, seconds: float) -> float:
        workers = settings.get("num_workers", ld.num_workers)
        threads = settings.get("torch_num_threads")
        persistent = bool(workers and settings.get("persistent_workers", ld.persistent_workers))
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            loader = DataLoader(ld.dataset, batch_size=ld.batch_size, shuffle=True, num_workers=workers,
                                collate_fn=ld.collate_fn, persistent_workers=persistent)

            def epochs():
                while True:
                    yield from loader
            it = epochs()
            m = time_steps(lambda: next(it), step, plan=Plan().for_workers(workers),
                           deadline=time.perf_counter() + seconds, clock=time.perf_counter, prefetch_depth=2 * workers)
            ws = m.windows
            return ld.batch_size * sum(w.steps for w in ws) / max(sum(w.seconds for w in ws), 1e-9)
        finally:
            torch.set_num_threads(before)

    tool_visit, log = verify._visit, []

    class Paired:
        """The tool's visit, then a hand loop for as long, the same settings."""

        def __init__(self, exp, settings, deadline, end):
            self.visit, self.exp, self.settings = tool_visit(exp, settings, deadline, end), exp, settings

        @property
        def measured(self):
            return self.visit.measured

        def __enter__(self):
            self.t0 = time.perf_counter()
            return self.visit.__enter__()

        def __exit__(self, *exc):
            swallowed = self.visit.__exit__(*exc)
            took = time.perf_counter() - self.t0
            ws = self.visit.measured.windows
            steps, seconds = sum(w.steps for w in ws), sum(w.seconds for w in ws)
            tool = self.exp.batch_size * steps / seconds if seconds else 0.0
            log.append(("candidate" if self.settings else "yours", self.settings, round(tool),
                        round(hand(self.settings, took))))
            return swallowed

    verify._visit = Paired
    try:
        report = bisect(workload=wl, max_seconds=args.max_seconds, verify_seconds=args.verify_seconds)
    finally:
        verify._visit = tool_visit
    print(f"{args.entry}: {report.bottleneck}")
    for side, settings, tool, by_hand in log:
        print(f"  {side:9s} {outcome.settings_text(settings) or '(your settings)':60s} tool {tool:7d}  hand {by_hand:7d}")
    for side in ("yours", "candidate"):
        rows = [r for r in log if r[0] == side]
        if rows:
            print(f"{side}: tool median {statistics.median(r[2] for r in rows):.0f}, "
                  f"hand median {statistics.median(r[3] for r in rows):.0f} samples/s ({len(rows)} visits)")


if __name__ == "__main__":
    main()
