"""The pause at each epoch's start (phases.epoch_start, issue 44 item 3): a step that waits
(as `loss.item()` waits on a GPU: no CPU used) fed by workers whose work overlaps it. The
points' loaders never end an epoch; the user's loop does, and pays its workers' start
again each time. The report says what that costs, and with it matches a hand loop over
the same epochs. Real clock, planted sleeps, generous bounds (scripts/bench_syncing_step.py
holds the 5% target)."""

from __future__ import annotations

import time

import pytest

from bisect_pipeline import bisect
from conftest import FAST_PLAN, PlantedDataset, Sleep, make_loader, tiny_model

STEP_S = 0.010


def step(batch):
    time.sleep(STEP_S)  # a GPU's work, waited for


def hand_rate(loader, epochs: int) -> float:
    for _ in loader:  # one epoch to warm up
        step(_)
    n, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for b in loader:
            step(b)
            n += 1
    return n * loader.batch_size / (time.perf_counter() - t0)


@pytest.mark.e2e
@pytest.mark.parametrize("persistent", [False, True])
def test_a_syncing_step_s_full_pipeline_with_its_epoch_starts_matches_a_hand_loop(persistent, no_leftover_workers):
    # 16 samples of 1.4 ms each a batch per worker, 2 workers: about the step's 10 ms; 16-batch epochs
    loader = make_loader(PlantedDataset(n=256, transform=Sleep(1.4)), batch_size=16, num_workers=2,
                         persistent_workers=persistent)
    before = hand_rate(loader, 4)
    r = bisect(tiny_model(0), loader, step=step, points=("device", "full"), max_seconds=20, verify_seconds=0,
               plan=FAST_PLAN)
    after = hand_rate(loader, 4)
    hand = (before + after) / 2
    e = r.measurements.run.epoch_start
    assert e["epoch_batches"] == 16 and e["persistent_workers"] is persistent and e["ms_per_epoch"] > 0
    assert e["samples_per_sec_with_epochs"] == pytest.approx(hand, rel=0.12), (e, before, after)
    assert "Each epoch starts with a pause of" in r.text()
    if not persistent:  # the workers' start each epoch: the steady full point alone reads well above the hand
        assert r.rate("full") > 1.15 * hand
