"""One experiment (experiment.py): which points apply, a visit's result, the stage that
raised, the measurements it assembles, and its sources in a user's loop."""

import time

import pytest
import torch

from bisect_pipeline.measure import allocator, cache
from bisect_pipeline.core import faults
from bisect_pipeline.measure import experiment as experiment_mod
from bisect_pipeline.measure.experiment import Experiment, probe_step
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.measure.plan import Plan
from bisect_pipeline.core.results import AllocatorHold, AllocatorTiming, Measured, PointResult
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.pipeline.step import make_step, to_device
from conftest import FakeClock, PlantedDataset, Sleep, make_loader, tiny_model

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


def test_a_step_that_changes_its_batch_is_found_before_anything_is_timed():
    exp = experiment()
    exp.step = lambda batch: batch[0].mul_(2)
    probe_step(exp, None)
    assert exp.fresh and any(n.kind == "step" for n in exp.notes)
    calm = experiment()
    calm.step = lambda batch: None
    probe_step(calm, None)
    assert not calm.fresh


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



def test_a_long_step_is_not_timed_alone_for_the_allocator_but_its_time_is_kept():
    # the allocator's timing takes allocator.LEAST_STEPS steps at least: 28 s of a 2 s
    # step; past a tenth of --max-seconds it is skipped, said, and the one step timed
    clock = FakeClock()
    exp = experiment(clock=clock)
    exp.step = lambda batch: setattr(clock, "t", clock.t + 2.0)
    held = allocator.Held(True)
    try:
        timing = experiment_mod.hold_allocator(exp, held, None, max_seconds=60.0)
    finally:
        held.release()
    assert timing.status == "skipped" and "one step takes 2 s" in timing.reason and "28 s" in timing.reason
    assert exp.step_alone == pytest.approx(2.0) and clock.t == pytest.approx(2.0)  # one step, no more
    assert exp.visit_plan("device")[0] == exp.plan.for_step(2.0)  # and the visits are fitted to it


def test_behind_a_long_step_cached_points_get_one_step_windows_and_workers_points_one_batch_each():
    loader = make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2)
    exp = experiment(loader, step_alone=2.0)
    device, full = exp.visit_plan("device"), exp.visit_plan("full")
    assert device[0].min_window_steps == 1 and device[1] == 0
    assert full[0].min_window_steps == 2 and full[1] == 2  # the two workers' first batches, not the whole prefetch
    assert exp.least_visit_seconds("device") == pytest.approx(2 * 2.0)  # first batch + one one-step window


class Pids(torch.utils.data.Dataset):
    """Each sample: the pid of the process that made it."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import os

        return torch.tensor([float(os.getpid())]), 0


def test_a_worker_points_loader_is_started_once_and_parked_between_its_visits(no_leftover_workers):
    # Workers that your loop starts every epoch were started at every visit of the
    # rounds: the step after a fork pays for copy-on-write, about a step more on a
    # MobileNet, in every visit of every worker point. They are now started once and
    # parked between visits (idle: sources.LoaderSource.park).
    exp = experiment(torch.utils.data.DataLoader(Pids(), batch_size=4, num_workers=2,
                                                 multiprocessing_context="fork"))
    assert all(exp.parks(n) and exp.keeps(n) for n in ("full", "raw", "augmented", "collated"))
    assert not exp.keeps("device")
    pids = []
    for _ in range(2):
        with exp.open("full", keep=True) as (next_batch, move):
            pids.append({int(p) for _ in range(4) for p in next_batch()[0].flatten()})
        assert exp.kept["full"][3].gate is not None
    assert len(pids[0]) == 2 and pids[0] == pids[1]
    exp.close_kept()
    assert exp.kept == {}


def test_a_loader_that_cannot_be_parked_is_kept_only_where_its_workers_are_persistent(monkeypatch):
    monkeypatch.setattr(experiment_mod, "room_for_a_pool", lambda: True)
    # behind a loader wrapper (timm's) the replay loader is not ours to end: kept open as
    # your persistent workers are, or started at every visit as yours are every epoch
    for persistent in (False, True):
        exp = experiment(make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2,
                                     persistent_workers=persistent))
        exp.wrapper = object()
        assert not exp.parks("full") and exp.keeps("full") == persistent
    no_workers = experiment(make_loader(PlantedDataset(n=32), batch_size=8))
    assert not no_workers.keeps("full") and not no_workers.parks("collated")


def test_a_pool_is_kept_only_while_the_machine_has_the_memory_for_it(monkeypatch):
    # each kept pool comes to hold the old copy of every page the step writes after its
    # fork (copy-on-write): without the room, a point's workers start at every visit
    exp = experiment(make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2))
    assert isinstance(experiment_mod.room_for_a_pool(), bool)
    monkeypatch.setattr(experiment_mod, "room_for_a_pool", lambda: False)
    assert exp.parks("full") and not exp.keeps("full")
    exp.kept["raw"] = ("already open",)
    assert exp.keeps("raw")  # a pool already kept stays so
    exp.kept.clear()


def test_a_resumed_pool_warms_up_without_the_prefetch(no_leftover_workers):
    # At a start the workers may fill the whole prefetch while the first steps run slow
    # (the fork's copy-on-write): the warm-up steps through it. A parked pool's queue was
    # emptied at the park and its workers sat idle: resumed, no batch is ready ahead of
    # the step (Experiment.resumes), and the plan's own warm-up steps are enough.
    loader = torch.utils.data.DataLoader(Pids(), batch_size=4, num_workers=2, prefetch_factor=3,
                                         multiprocessing_context="fork")
    exp = experiment(loader)
    warm = []
    for _ in range(2):
        visit = exp.visit("full", 1e9, keep=1, keep_open=exp.keeps("full"))
        assert visit.prefetch_depth == 6  # a pause inside a visit still warms up through all of it
        warm.append(visit.first_prefetch)
        with visit as batches:
            for _, batch in zip(range(12), batches):
                pass
    assert warm == [6, 0] and exp.resumes("full")
    exp.close_kept()
    assert not exp.resumes("full")


def test_a_first_step_slowed_by_its_lazy_start_is_timed_again_before_the_step_is_called_long():
    # a 3-ms step whose first call took 0.3 s (its lazy initialisation): 14 steps of that
    # would pass a tenth of 30 s, but it cost no more than the timing's own 2%: the second
    # call says the step is short, and the allocator is timed
    clock = FakeClock()
    exp = experiment(clock=clock)
    calls = []

    def step(batch):
        clock.t += 0.3 if not calls else 0.003
        calls.append(1)
    exp.step = step
    held = allocator.Held(True)
    try:
        timing = experiment_mod.hold_allocator(exp, held, None, max_seconds=30.0)
    finally:
        held.release()
    assert timing.status == "ok" and len(calls) > 2
    assert exp.step_alone == pytest.approx(0.003)
