"""The pause at each epoch's start (phases.epoch_start, issue 44 item 3): a step that waits
(as `loss.item()` waits on a GPU: no CPU used) fed by workers whose work overlaps it. The
points' loaders never end an epoch; the user's loop does, and pays its workers' start
again each time. The report says what that costs, and with it matches a hand loop over
the same epochs: within 5% on a fake clock (exactly, with one slow epoch start in three,
which the steady pair of windows would leave out), and on the real clock within a generous
bound: on a busy 2-core machine two hand blocks of the same 6 epochs a few seconds apart
read 7-13% apart (issue 44's measurements), more than the 5% itself
(scripts/bench_syncing_step.py holds it on the real clock, alternating runs)."""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

from bisect_pipeline import Plan, bisect, phases
from bisect_pipeline.measure.experiment import Experiment
from bisect_pipeline.core.results import PointResult
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.measure.visit import drive
from conftest import FAST_PLAN, FakeClock, PlantedDataset, Sleep, make_loader, tiny_model

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
@pytest.mark.alone  # two real-clock rates compared at 12%: under pytest -n another test's processes read 0.5x here
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
    assert e["epochs_timed"] >= 4 and e["ms_per_epoch_se"] > 0
    assert e["samples_per_sec_with_epochs"] == pytest.approx(hand, rel=0.12), (e, before, after)
    assert "Each epoch starts with a pause of" in r.text()
    if not persistent:  # the workers' start each epoch: the steady full point alone reads well above the hand
        assert r.rate("full") > 1.15 * hand


# --------------------------------------------------------------------------------------
# The rule on a fake clock: every epoch the visit times counts
# --------------------------------------------------------------------------------------

BATCH_S = 0.020  # a step's wait and a batch's, each batch of the planted pipeline
PAUSES_S = (0.200, 0.040, 0.040)  # at each epoch's start, in turn: one slow epoch in three
EPOCH = 16


def planted_epochs(monkeypatch, max_seconds: float = 30.0):
    """phases.epoch_start on a fake clock: a full point measured at BATCH_S a batch, and a
    loader whose epochs of EPOCH batches each start with the next of PAUSES_S; returns
    (what it reported, the planted seconds of every batch handed out, the visit)."""
    clock = FakeClock()
    spec = type("Spec", (), {"batch_size": 16, "num_workers": 2, "pin_memory": False, "prefetch_depth": 4,
                             "persistent_workers": False, "loader_cls": None, "iterable": False,
                             "batches_per_epoch": EPOCH})()
    exp = Experiment(spec, torch.device("cpu"), Plan().for_workers(2), clock, lambda e: None, None, start=0.0,
                     end=max_seconds, deadline=max_seconds)
    windows = tuple(Window(EPOCH, EPOCH * BATCH_S) for _ in range(6))
    exp.results["full"] = PointResult("full", "ok", Throughput(windows, 16), first_batch_seconds=3 * BATCH_S)
    handed: list = []

    @contextlib.contextmanager
    def source(name, spec=None, epochs=False, threads=None, calls=None, keep=False, variant=None):
        assert name == "full" and epochs

        def next_batch():
            i = len(handed)
            cost = BATCH_S + (PAUSES_S[(i // EPOCH) % len(PAUSES_S)] if i % EPOCH == 0 else 0.0)
            clock.t += cost
            handed.append(cost)
            return i
        yield next_batch, None

    monkeypatch.setattr(exp, "open", source)
    visits, out = [], {}

    def phase():
        out["e"] = yield from phases.epoch_start(exp)

    for v in phase():
        visits.append(v)
        drive(v, lambda batch: None)
    return out["e"], handed, visits


def test_every_epoch_the_visit_times_counts_the_slow_ones_too(monkeypatch):
    # One epoch in three starts slow (a fork descheduled on a busy machine). The first two
    # windows, one epoch each, hold fast starts and agree: kept as a steady pair they
    # read 1.15x a loop over the same batches. Every window counts, to the visit's end.
    e, handed, visits = planted_epochs(monkeypatch)
    (v,) = visits
    m = v.measured
    hand = 16 * EPOCH / (EPOCH * BATCH_S + sum(PAUSES_S) / len(PAUSES_S))  # a loop over the planted epochs
    assert e["samples_per_sec_with_epochs"] == pytest.approx(hand, rel=0.05)
    timed = handed[1 + m.warmup_steps:]  # the batches after the first and the warm-up: the windows'
    same = 16 * len(timed) / sum(timed)  # a loop over the very batches timed: exactly
    assert e["samples_per_sec_with_epochs"] == pytest.approx(same, rel=1e-3)
    assert len(timed) == sum(w.steps for w in m.windows) and len(m.windows) >= 6  # none cut, none dropped
    assert e["how"] == "timed in whole epochs" and e["epochs_timed"] == len(timed) // EPOCH
    pauses = [s - BATCH_S for s in timed if s > BATCH_S]
    assert e["ms_per_epoch"] == pytest.approx(1e3 * sum(pauses) / len(pauses), rel=1e-3)
    assert e["samples_per_sec"] == pytest.approx(16 / BATCH_S) and e["ms_per_epoch_se"] > 0
    steady_pair = 16 * 2 * EPOCH / sum(w.seconds for w in m.windows[:2])
    assert steady_pair > 1.1 * hand  # what the first agreeing pair alone said (its visit ended there)
