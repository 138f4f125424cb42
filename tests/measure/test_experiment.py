"""One experiment (experiment.py): which points apply, a visit's result, the stage that
raised, the measurements it assembles, and its sources in a user's loop (a pool kept
between visits: test_point_sources.py; the phases before the points: test_prepare.py)."""

import dataclasses
import time

import pytest
import torch

from bisect_pipeline.measure import cache
from bisect_pipeline.core import faults
from bisect_pipeline.measure.experiment import Experiment
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.measure.plan import Plan
from bisect_pipeline.core.results import AllocatorHold, Measured, PointResult
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.pipeline.step import make_step, to_device
from conftest import PlantedDataset, Sleep, make_loader, tiny_model

CPU = torch.device("cpu")


def experiment(loader=None, step_timeout=None, clock=time.perf_counter, **kw) -> Experiment:
    loader = loader or make_loader(PlantedDataset(n=32, transform=Sleep(0.0)), batch_size=8)
    spec = describe(loader)
    exp = Experiment(spec, CPU, Plan(), clock, lambda e: None, step_timeout, start=0.0, end=1e9,
                     deadline=1e9, **kw)
    exp.caches = cache.fill(spec, cache_mb=64, max_batches=2)
    exp.move = lambda b: to_device(b, CPU)
    return exp


class Visited:
    """What Experiment.result reads of a visit."""

    def __init__(self, measured: Measured, point: str = "full") -> None:
        self.measured, self.point = measured, point


def test_points_that_do_not_apply_here_say_why():
    exp = experiment()
    assert exp.not_applicable("host").status == "skipped"  # no accelerator
    assert "num_workers=0" in exp.not_applicable("collated").reason
    assert exp.not_applicable("raw") is None and exp.not_applicable("full") is None
    with_workers = experiment(make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2))
    assert with_workers.not_applicable("collated") is None


def test_a_visits_result_ok_out_of_time_failed_or_a_peers_failure():
    exp = experiment()
    ok = exp.result(Visited(Measured(windows=(Window(10, 0.1), Window(10, 0.1)), opened_seconds=0.5,
                                     first_batch_seconds=0.25, wait_seconds=0.02, pauses=1, paused_seconds=2.0)))
    assert ok.status == "ok" and ok.first_batch_seconds == 0.75 and ok.throughput.batch_size == 8
    assert (ok.wait_seconds, ok.pauses, ok.paused_seconds) == (0.02, 1, 2.0)
    late = exp.result(Visited(Measured(windows=())))
    assert late.status == "failed" and late.stopped_by_deadline and "out of time" in late.reason
    boom = exp.result(Visited(Measured(windows=(), error=faults.stage_error("collate", ValueError("bad")))))
    assert boom.failed_stage == "collate" and "ValueError: bad" in boom.reason
    peer = exp.result(Visited(Measured(windows=(), peer_failed=True)))
    assert peer.failed_stage == "peer"


def test_a_hang_and_an_untagged_error_name_their_stage():
    exp = experiment(step_timeout=5.0)
    hang = exp.failed("full", faults.StepTimeout("point full made no progress in 5 s", 5.0))
    assert hang.failed_stage == "hang" and "(--step-timeout)" in hang.reason and "terminated" in hang.reason
    model = tiny_model()
    exp.step = make_step(model)
    try:
        exp.step("not a batch")
    except Exception as exc:  # raised inside the step's code: the step
        assert exp.failed("device", exc).failed_stage == "step"


def test_the_measurements_mark_what_was_not_selected_or_not_run():
    exp = experiment()
    exp.results["full"] = PointResult("full", "ok", None)
    m = exp.measurements(("full", "device"), held=AllocatorHold(), interrupted=True)
    by = {p.point: p for p in m.points}
    assert by["raw"].status == "skipped" and "points option" in by["raw"].reason
    assert by["device"].status == "not run" and by["device"].reason == "interrupted"
    assert not m.complete and m.interrupted and m.mode == "entry"
    assert m.cache.batches == 2 and m.loader["batch_size"] == 8 and m.batch_size_source == "DataLoader.batch_size"


def test_in_a_users_loop_the_batches_are_handed_over_as_the_loader_yields_them():
    exp = experiment(loop=True)
    with exp.open("augmented") as (next_batch, move):
        batch = next_batch()
    assert move is None and batch[0].device.type == "cpu"  # the loop moves them itself
    entry = experiment()
    with entry.open("augmented") as (_, move):
        assert move is not None


def test_the_step_estimate_is_the_fastest_point_measured():
    fast = PointResult("device", "ok", throughput=Throughput((Window(10, 1.0),) * 3, batch_size=4))
    slow = PointResult("full", "ok", throughput=Throughput((Window(10, 3.0),) * 3, batch_size=4))
    assert experiment(results={"device": fast, "full": slow}).step_estimate() == pytest.approx(0.1)
    assert experiment().step_estimate() is None
    alone = experiment(step_alone=2.0)
    assert alone.step_estimate() == pytest.approx(2.0)  # before any point: the step timed alone


def test_a_visit_is_planned_for_the_loaders_workers_and_prefetch():
    loader = make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2)
    exp = experiment(loader)
    plan, prefetch = exp.visit_plan("full")
    assert plan == exp.plan.for_workers(2) and prefetch == exp.spec.prefetch_depth > 0
    assert exp.visit_plan("device") == (exp.plan.for_workers(0), 0)  # cached batches: no worker, nothing prefetched
    # a full pipeline that ends its epochs (the advice's check), where the user's workers
    # start again every epoch: windows of whole epochs, 4 batches each here, for the user's
    # settings and a candidate's alike; not in a user's loop, whose own epoch ends void its windows
    assert exp.visit_plan("full", epochs=True)[0] == plan.for_epochs(4)
    persistent = exp.spec.with_settings({"persistent_workers": True})
    assert exp.visit_plan("full", persistent, epochs=True)[0] == plan.for_epochs(4)
    exp.loop = True
    assert exp.visit_plan("full", epochs=True)[0] == plan
    # workers that persist, or none: an epoch's end costs little, windows as usual
    for kw in ({"num_workers": 2, "persistent_workers": True}, {"num_workers": 0}):
        kept = experiment(make_loader(PlantedDataset(n=32), batch_size=8, **kw))
        assert kept.visit_plan("full", epochs=True)[0] == kept.plan.for_workers(kw["num_workers"])


def test_behind_a_long_step_cached_points_get_one_step_windows_and_workers_points_one_batch_each():
    loader = make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2)
    exp = experiment(loader, step_alone=2.0)
    device, full = exp.visit_plan("device"), exp.visit_plan("full")
    assert device[0].min_window_steps == 1 and device[1] == 0
    assert full[0].min_window_steps == 2 and full[1] == 2  # the two workers' first batches, not the whole prefetch
    assert exp.least_visit_seconds("device") == pytest.approx(2 * 2.0)  # first batch + one one-step window


def test_behind_a_long_step_workers_the_costs_alone_show_far_ahead_get_no_prefetch_stepped_through_and_one_step_windows():
    # the detection reference with 2 workers: a 2.5-s step, 32 ms of work a batch alone;
    # the workers' first batches are what their steady state gives, and each batch waits
    # ready whichever worker made it, so the visit of full is its first batch and a window
    # of one step (5 steps, 12.5 s, with the prefetch stepped through and a batch per worker)
    from bisect_pipeline.derive import witness
    loader = make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2)
    exp = experiment(loader, step_alone=2.5)
    light = witness.Alone({"load": 0.01, "augment": 0.02, "collate": 0.002},
                          {"load": 0.001, "augment": 0.002, "collate": 0.0002}, "shared", 2, 2)
    exp.alone = lambda: light
    plan, prefetch = exp.visit_plan("full")
    assert prefetch == 0 and plan.min_window_steps == 1 and exp.least_visit_seconds("full") == pytest.approx(2 * 2.5)
    assert plan.at_step(2.5).min_window_steps == 1  # the visit fits its plan to the step again: still one step
    # work near the step's: the first batches come out at once, ahead of the steady state
    heavy = dataclasses.replace(light, work={"load": 1.0, "augment": 1.5, "collate": 0.01})
    exp.alone = lambda: heavy
    plan, prefetch = exp.visit_plan("full")
    assert prefetch == 2 and plan.min_window_steps == 2 and exp.least_visit_seconds("full") == pytest.approx(5 * 2.5)
