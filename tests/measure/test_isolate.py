"""Isolated stage costs (isolate.py): planted costs come back roughly right, the
workers-needed arithmetic is exact, and syncs are counted on CUDA only."""

import dataclasses
import threading
import time

import pytest
import torch

from bisect_pipeline.measure import cache, device_alone, isolate, worker_stages
from bisect_pipeline.measure.plan import Plan
from bisect_pipeline.core import faults
from bisect_pipeline.pipeline import loader as loader_mod
from bisect_pipeline.measure.experiment import Experiment
from bisect_pipeline.core.results import Isolated
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.pipeline.step import make_step
from bisect_pipeline.report import PointResult
from bisect_pipeline.pipeline.step import to_device
from conftest import FakeClock, PlantedDataset, Sleep, SlowCollate, make_loader, tiny_model

CPU = torch.device("cpu")


def isolated(model, loader, budget_s=1.0):
    """isolate.time_stages on a real cache fill, as bisect() calls it (no step time given:
    the step is timed alone too)."""
    spec = loader_mod.describe(loader)
    caches = cache.fill(spec, cache_mb=64, max_batches=4, time_budget=10)
    step = make_step(model)
    iso, syncs = isolate.time_stages(spec, caches, CPU, lambda b: to_device(b, CPU), step, step_sec_per_batch=None,
                                      budget_s=budget_s)
    return iso.to_dict(), syncs.to_dict()  # the document's form


def within(value, planted, lo=0.5, hi=2.0):
    return lo * planted <= value <= hi * planted


@pytest.mark.e2e
def test_planted_costs_come_back_within_a_factor_of_two():
    # per sample: load 4 ms, augment 3 ms; per batch: collate 20 ms, step 10 ms
    ds = PlantedDataset(n=48, load_ms=4.0, transform=Sleep(3.0))
    loader = make_loader(ds, batch_size=8, collate_fn=SlowCollate(20.0))
    model = tiny_model(10.0)
    iso, syncs = isolated(model, loader)
    again, _ = isolated(model, loader)
    # Other work on a shared machine only ever adds time (a sleeping stage waits for a
    # core when it wakes): the smaller of two measurements is the stage's own cost.
    def best(part, key):
        return min(iso[part][key], again[part][key])
    assert iso["status"] == "ok"
    assert within(best("augment", "ms_per_sample"), 3.0), (iso["augment"], again["augment"])
    assert within(best("load", "ms_per_sample"), 4.0), (iso["load"], again["load"])
    assert iso["load"]["includes"] == ["load"]  # the transforms were split off
    assert within(best("collate", "ms_per_batch"), 20.0), (iso["collate"], again["collate"])
    assert iso["collate"]["collate_fn"] == "SlowCollate"
    assert iso["collate"]["default_collate_ms_per_batch"] < 5.0  # the same samples, torch's collate
    # The step: against the same step timed directly here, now (median of 5 after a
    # warm-up): a busy machine can stretch a 10 ms sleep, for both alike.
    step = make_step(model)
    batch = next(iter(make_loader(PlantedDataset(n=16), batch_size=8)))
    direct = []
    for i in range(8):
        t0 = time.perf_counter()
        step(batch)
        direct.append(time.perf_counter() - t0)
    direct_ms = sorted(direct[3:])[2] * 1e3
    assert direct_ms >= 9.0  # the planted 10 ms sleep is in the step
    assert within(best("step", "ms_per_batch"), direct_ms), (iso["step"], again["step"], direct_ms)
    # (4 + 3) ms x 8 + 20 ms = 76 ms of worker work against a ~10 ms step: about 8 workers
    w = iso["workers"]
    assert w["status"] == "ok" and 4 <= w["needed"] <= 15, w
    assert w["cores"] == isolate.cores() and w["available"] == w["cores"] - 1
    assert w["step_threads"] == torch.get_num_threads()  # a CPU step runs on the intra-op threads
    # on CPU: no transfer to time, syncs skipped with their reason
    assert iso["transfer"]["status"] == "skipped" and iso["transfer"]["bytes_per_batch"] == 8 * (16 * 4 + 8)
    assert syncs["status"] == "skipped" and "CUDA" in syncs["reason"]
    assert iso["elapsed_s"] < 5.0  # bounded by the budget (plus one call per part)


@pytest.mark.e2e
def test_an_augment_only_pipeline_reports_no_load_cost():
    ds = PlantedDataset(n=48, transform=Sleep(5.0))
    loader = make_loader(ds, batch_size=8)
    runs = [isolated(tiny_model(0.0), loader)[0] for _ in range(2)]
    assert within(min(r["augment"]["ms_per_sample"] for r in runs), 5.0), runs
    assert min(r["load"]["ms_per_sample"] for r in runs) < 1.5  # the getitem is all transform


def workers_needed(iso: dict, *args, **kw) -> dict:
    """isolate.workers_needed on the document's form of the isolated parts."""
    return isolate.workers_needed(Isolated.from_dict({"status": "ok", **iso}), *args, **kw).to_dict()


def test_workers_needed_arithmetic():
    iso = {"load": {"status": "ok", "ms_per_sample": 2.0, "includes": ["load"]},
           "augment": {"status": "ok", "ms_per_sample": 3.0},
           "collate": {"status": "ok", "ms_per_batch": 4.0},
           "step": {"status": "ok", "ms_per_batch": 10.0}}
    w = workers_needed(iso, items_per_batch=8, n_cores=4)
    # (2 + 3) x 8 + 4 = 44 ms per batch / 10 ms step -> ceil(4.4) = 5 workers; 3 cores for workers
    assert w == {"status": "ok", "worker_ms_per_batch": 44.0, "step_ms_per_batch": 10.0, "needed": 5, "cores": 4,
                 "available": 3, "step_threads": 0, "fits": False}
    assert workers_needed(iso, items_per_batch=8, n_cores=4, step_threads=4)["step_threads"] == 4
    assert workers_needed(iso, items_per_batch=8, n_cores=8)["fits"] is True
    # exactly one step's worth of work: one worker
    iso["step"]["ms_per_batch"] = 44.0
    assert workers_needed(iso, 8, 2)["needed"] == 1
    # a step that outruns the workers by far still needs at least one
    iso["step"]["ms_per_batch"] = 1000.0
    assert workers_needed(iso, 8, 2)["needed"] == 1


def test_workers_needed_does_not_count_augment_twice_when_merged_into_load():
    iso = {"load": {"status": "ok", "ms_per_sample": 5.0, "includes": ["load", "augment"]},
           "augment": {"status": "ok", "ms_per_sample": 3.0},
           "collate": {"status": "ok", "ms_per_batch": 0.0},
           "step": {"status": "ok", "ms_per_batch": 10.0}}
    assert workers_needed(iso, 4, 4)["worker_ms_per_batch"] == 20.0


@pytest.mark.parametrize("missing", ["step", "load", "collate"])
def test_workers_needed_unavailable_without_its_inputs(missing):
    iso = {"load": {"status": "ok", "ms_per_sample": 2.0}, "augment": {"status": "unavailable"},
           "collate": {"status": "ok", "ms_per_batch": 4.0}, "step": {"status": "ok", "ms_per_batch": 10.0}}
    iso[missing] = {"status": "failed", "reason": "boom"}
    w = workers_needed(iso, 8, 4)
    assert w["status"] == "unavailable" and "not measured" in w["reason"]
    # without augment (unavailable) the rest still counts: 2 x 8 + 4 = 20 ms
    iso[missing] = {"status": "ok", "ms_per_sample": 2.0, "ms_per_batch": 10.0 if missing == "step" else 4.0}
    assert workers_needed(iso, 8, 4)["worker_ms_per_batch"] == 20.0


def test_unfilled_caches_skip_isolation():
    iso, syncs = isolate.time_stages(None, None, CPU, None, None, step_sec_per_batch=None, budget_s=1.0)
    assert iso.status == syncs.status == "unavailable"


def heavy_stages(step_s: float, end_in: float, estimate):
    """time_stages on a real cache, on a fake clock where each training step takes step_s."""
    spec = loader_mod.describe(make_loader(PlantedDataset(n=16), batch_size=4))
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)
    clock, steps = FakeClock(100.0), []

    def step(batch):
        steps.append(1)
        clock.t += step_s

    iso, syncs = isolate.time_stages(spec, caches, CPU, lambda b: to_device(b, CPU), step, step_sec_per_batch=None,
                                      budget_s=2.0, clock=clock, end=clock.t + end_in, step_estimate_s=estimate)
    return iso, syncs, steps


def test_the_step_alone_is_skipped_where_it_would_run_past_the_end():
    # a 2 s step and 5 s left: warm-up and one timed step (8 s) would pass --max-seconds
    iso, _, steps = heavy_stages(2.0, end_in=5.0, estimate=2.0)
    assert iso.step.status == "skipped" and "out of time" in iso.step.reason and "2 s" in iso.step.reason
    assert steps == []
    assert iso.collate.ok and iso.load.ok  # the rest is still timed
    iso, _, steps = heavy_stages(2.0, end_in=60.0, estimate=2.0)  # with room it runs
    assert iso.step.ok and iso.step.ms_per_batch == pytest.approx(2000.0) == iso.step.alone_ms_per_batch
    assert len(steps) == device_alone.STEP_WARMUP + 1  # at least one timed step, past the 0.4 s share


def test_a_long_step_timed_here_in_a_settled_pair_is_a_window_of_the_device_point_s_work():
    # no step timed for the allocator (an accelerator's step): the isolated timing's
    # settled warm-up pair, whole steps, is the window; the median of more is not one
    clock = FakeClock(100.0)
    ticks = iter([2.4, 2.0, 2.0] + [0.5] * 100)
    exp = experiment_at(clock, end=clock.t + 60.0, step=lambda b: setattr(clock, "t", clock.t + next(ticks)))
    iso, _ = isolate.before_points(exp, max_seconds=60)
    assert iso.step.steps == 2 and (exp.step_window.steps, exp.step_window.seconds) == (2, pytest.approx(4.0))
    many = experiment_at(FakeClock(100.0), end=160.0, step=lambda b: None)
    isolate.before_points(many, max_seconds=60)
    assert many.step_window is None
    alone = experiment_at(FakeClock(100.0), end=160.0, step=lambda b: None)
    alone.step_alone = 2.0  # the allocator's timing gave it: its window is set there, not here
    isolate.before_points(alone, max_seconds=60)
    assert alone.step_window is None


def experiment_at(clock, end, results=None, step=None):
    spec = loader_mod.describe(make_loader(PlantedDataset(n=16), batch_size=4))
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)
    return Experiment(spec, CPU, Plan(), clock, lambda e: None, None, start=0.0, end=end, deadline=end,
                      step=step, move=lambda b: to_device(b, CPU), caches=caches, results=results or {})


def test_isolation_after_the_end_is_skipped_and_syncs_say_why_on_cpu():
    clock = FakeClock(100.0)
    iso, syncs = isolate.before_points(experiment_at(clock, end=clock.t - 1.0), max_seconds=60)
    assert iso.status == "skipped" and "out of time" in iso.reason
    assert syncs.status == "skipped" and "no CUDA device" in syncs.reason


def test_the_step_comes_from_the_device_point_once_measured():
    clock = FakeClock(100.0)
    exp = experiment_at(clock, end=clock.t + 60.0, step=lambda b: None)
    exp.step_alone = 0.5
    iso, _ = isolate.before_points(exp, max_seconds=60)
    assert iso.step.ms_per_batch == 500.0 and iso.step.source == isolate.STEP_ALONE
    assert iso.workers.step_ms_per_batch == 500.0
    device = PointResult("device", "ok", Throughput((Window(10, 0.2), Window(10, 0.2)), 4))
    iso = isolate.with_ceiling(iso, {"device": device})
    assert iso.step.ms_per_batch == 20.0 and iso.step.source == isolate.STEP_CEILING
    assert iso.step.alone_ms_per_batch == 500.0  # the step the costs alone were compared with, kept beside it
    assert iso.workers.step_ms_per_batch == 20.0  # the workers that feed it, from the ceiling's step
    assert isolate.with_ceiling(iso, {}) is iso


def test_a_user_loop_s_costs_alone_read_the_same_model_before_and_after_its_step_is_known():
    # a user's loop: no step timed alone before the points, so the workers that would
    # feed it are not known yet, but the cores and the step's threads are; the second
    # witness's model must not change when the device point gives the step (a fast-step
    # script settled on a verdict of 'shared' on 1 core, then was judged 'parallel' on 2)
    import torch
    from bisect_pipeline.derive import witness
    clock = FakeClock(100.0)
    exp = experiment_at(clock, end=clock.t + 60.0, step=None)
    exp.spec = dataclasses.replace(exp.spec, num_workers=1)
    iso, _ = isolate.before_points(exp, max_seconds=60)
    assert iso.workers.status == "unavailable" and iso.workers.cores == isolate.cores()
    assert iso.workers.step_threads == torch.get_num_threads()
    before = witness.alone(iso, {"num_workers": 1}, "cpu")
    device = PointResult("device", "ok", Throughput((Window(10, 0.02), Window(10, 0.02)), 4))
    after = witness.alone(isolate.with_ceiling(iso, {"device": device}), {"num_workers": 1}, "cpu")
    assert (before.mode, before.cores) == (after.mode, after.cores)


def test_isolation_cut_by_the_watchdog_still_says_syncs_are_not_counted_on_cpu():
    def step(batch):
        raise faults.StepTimeout("the run's end passed")  # as the watchdog raises it in the main thread

    iso, syncs = isolate.before_points(experiment_at(time.perf_counter, end=time.perf_counter() + 60, step=step),
                                      max_seconds=60)
    assert iso.status == "failed" and "StepTimeout" in iso.reason
    assert syncs.status == "skipped" and "no CUDA device" in syncs.reason  # not "failed (StepTimeout)"


def test_budget_is_a_small_bounded_share_of_the_run():
    assert isolate.budget(10) == pytest.approx(0.5)
    assert isolate.budget(600) == isolate.ISOLATE_MAX_SECONDS


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counting host-device syncs needs CUDA")
def test_a_step_without_syncs_reads_none_end_to_end_on_cuda():
    # the tool's own syncs (window edges, batches moved) must not be counted as the step's
    from bisect_pipeline import bisect
    from conftest import planted
    model, loader = planted("augment", 0)
    r = bisect(model, loader, device="cuda", max_seconds=8)
    assert r.syncs.status == "ok" and r.syncs.per_step == 0, r.syncs


class _ColdAfterStep(torch.utils.data.Dataset):
    """Each item costs 1 ms on a fake clock, and the first item after a training step 2 ms
    more (the caches the step evicted); `after_step` records the indices fetched first
    after a step."""

    def __init__(self, tick, state, n=400):
        self.tick, self.state, self.n, self.after_step = tick, state, n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.tick(1e-3)
        if self.state["stepped"]:
            self.tick(2e-3)
            self.state["stepped"] = False
            self.after_step.append(i)
        return torch.zeros(4), 0


class _CostlyBatches(torch.utils.data.Sampler):
    """In-order batches of 4, each costing the sampler 0.5 ms on a fake clock."""

    def __init__(self, n, tick):
        self.n, self.tick = n, tick

    def __iter__(self):
        for k in range(0, self.n, 4):
            self.tick(0.5e-3)
            yield list(range(k, min(k + 4, self.n)))

    def __len__(self):
        return self.n // 4


def in_loop_stages(workers=0, step_s=3e-3, estimate=None):
    """time_stages on a fake clock: items cold after a step (_ColdAfterStep), a batch
    sampler and a collate that cost, a step of step_s."""
    clock, state = FakeClock(100.0), {"stepped": False}

    def tick(dt):  # a function: the sampler's deep copy still moves this clock
        clock.t += dt
    ds = _ColdAfterStep(tick, state)

    def collate(items):
        tick(0.25e-3)
        return torch.utils.data.default_collate(items)

    loader = torch.utils.data.DataLoader(ds, batch_sampler=_CostlyBatches(len(ds), tick), collate_fn=collate,
                                         num_workers=workers)
    spec = loader_mod.describe(loader)
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)
    steps = []

    def step(batch):
        steps.append(1)
        tick(step_s)
        state["stepped"] = True
    ds.after_step.clear()
    iso, _ = isolate.time_stages(spec, caches, CPU, lambda b: to_device(b, CPU), step, step_sec_per_batch=estimate,
                                 budget_s=1.0, clock=clock, end=clock.t + 60)
    return iso, ds, steps


def test_the_input_work_is_timed_between_steps_as_the_loop_pays_it():
    iso, ds, steps = in_loop_stages()
    # alone, one item after another with nothing between: 1 ms an item
    assert iso.load.ms_per_sample == pytest.approx(1.0)
    il = iso.in_loop
    assert il.ok and il.batches >= isolate.IN_LOOP_MIN_BATCHES
    # between steps, as the loop runs it: the sampler's batch (0.5), 4 items (4 x 1) and
    # the first one's cold caches (2)
    assert il.fetch_ms_per_batch == pytest.approx(6.5) and il.fetch_se_ms == pytest.approx(0.0, abs=1e-6)
    assert il.collate_ms_per_batch == pytest.approx(0.25)
    # within what the other parts left of the budget (1 s), a fifth at most, one warm-up
    # batch besides
    per_batch = 3.0 + 6.5 + 0.25
    assert il.batches * per_batch * 1e-3 <= 1.0 / 5 + 2 * per_batch * 1e-3
    assert iso.elapsed_s <= 1.0 + 2 * per_batch * 1e-3
    # beyond the cached batches (indices 0-7): data the fill has not just touched
    assert ds.after_step and min(ds.after_step) >= 8
    assert len(steps) >= il.batches + 1


def test_the_input_work_is_not_timed_between_steps_with_workers_or_long_steps():
    iso, _, steps = in_loop_stages(workers=2)
    assert iso.in_loop is None  # the workers do that work in processes of their own
    iso, _, steps = in_loop_stages(step_s=0.2, estimate=0.2)  # 9 batches of 0.2 s: past its 0.2 s share
    assert iso.in_loop.status == "skipped" and "about 204 ms" in iso.in_loop.reason  # 200 + 4 items of 1 ms
    assert steps == []


def test_the_input_work_between_steps_is_sized_without_the_stages_alone_where_they_failed():
    # load and collate not measured alone (failed): the step's time alone sizes it
    spec = loader_mod.describe(make_loader(PlantedDataset(n=16), batch_size=4))
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)
    parts = {"load": isolate.PerSample.missing("failed", "x"), "collate": None}
    out = isolate._in_loop_part(spec, caches, lambda b: None, torch.zeros(1), CPU, parts=parts, step_s=0.1, share=0.2,
                                clock=FakeClock(), fits=lambda n: True)
    assert out.status == "skipped" and "about 100 ms" in out.reason
    # nothing to step on: not timed
    assert isolate._in_loop_part(spec, caches, lambda b: None, None, CPU, parts=parts, step_s=0.1, share=0.2,
                                 clock=FakeClock(), fits=lambda n: True) is None


def test_the_stages_alone_run_on_the_workers_thread_and_the_callers_threads_come_back():
    """With workers (each runs one intra-op thread, as DataLoader sets it), load, augment
    and collate are timed on one thread; the step's threads are the caller's, restored."""
    seen = []

    def threads(x):
        seen.append(torch.get_num_threads())
        return x

    def collate(samples):
        seen.append(torch.get_num_threads())
        return torch.utils.data.default_collate(samples)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        loader = make_loader(PlantedDataset(n=32, transform=threads), batch_size=4, num_workers=2, collate_fn=collate)
        spec = loader_mod.describe(loader)
        caches = cache.fill(spec, cache_mb=16, max_batches=2, time_budget=10)
        seen.clear()
        iso, _ = isolate.time_stages(spec, caches, CPU, lambda b: b, None, step_sec_per_batch=0.01, budget_s=0.2)
        assert iso.load.ok and iso.augment.ok and iso.collate.ok
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


class _WarmAfterLoad(torch.utils.data.Dataset):
    """3 ms to load a sample (on a fake clock), then its transform: 2 ms on the image its
    own __getitem__ has just decoded, 5 ms on one that was not (a replay on the cached
    inputs runs colder than the dataset's own call, or warmer: MosaicML's ToTensor took 49
    us after the sample's decoding and 56-60 replayed alone)."""

    def __init__(self, tick, n=64):
        self.tick, self.n, self.fresh = tick, n, {"image": None}  # (shared by the tool's shallow copies)

        def warm_or_cold(image):
            tick(2e-3 if self.fresh["image"] is image else 5e-3)
            return image * 2
        self.transform = warm_or_cold

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.tick(3e-3)
        image = torch.full((4,), float(i))
        self.fresh["image"] = image
        self.fresh["sample"] = (self.transform(image), i % 2)
        return self.fresh["sample"]


def test_augment_is_timed_where_the_dataset_calls_its_transforms_and_load_is_the_rest():
    """load is each __getitem__ less its own transforms, timed on the same calls; augment is
    the transforms as the dataset runs them (2 ms), the replay alone kept beside (5 ms, what
    the breakdown's rows add up to). Before, load was __getitem__ less the replay: 5 - 5 = 0
    ms here, all of it given to augment."""
    clock = FakeClock(100.0)

    def tick(dt):
        clock.t += dt
    loader = torch.utils.data.DataLoader(_WarmAfterLoad(tick), batch_size=4)
    spec = loader_mod.describe(loader)
    caches = cache.fill(spec, cache_mb=64, max_batches=4, time_budget=10)
    assert caches.raw_calls is not None and caches.recorder is not None
    iso, _ = isolate.time_stages(spec, caches, CPU, lambda b: to_device(b, CPU), None, step_sec_per_batch=0.01,
                                 budget_s=5.0, clock=clock, end=clock.t + 60)
    load, aug = iso.load, iso.augment
    assert aug.ms_per_sample == pytest.approx(2.0) and aug.alone_ms_per_sample == pytest.approx(5.0)
    assert load.ms_per_sample == pytest.approx(3.0) and load.getitem_ms_per_sample == pytest.approx(5.0)
    assert load.se_ms_per_sample == pytest.approx(0.0, abs=1e-6)  # the paired differences: 3 ms each
    assert aug.breakdown is not None and aug.breakdown.augment_ms_per_sample == pytest.approx(5.0)
    assert iso.workers.worker_ms_per_batch == pytest.approx(4 * 5.0, rel=0.01)  # load + augment: the __getitem__


def test_the_recorders_timing_counts_a_nested_transform_once_and_only_in_its_thread():
    from bisect_pipeline.pipeline.recording import Recorder, RecordingTransform
    clock, rec = FakeClock(), Recorder()

    def inner_fn(x):
        clock.t += 1.0
        return x
    inner = RecordingTransform(inner_fn, "inner", rec)

    def outer_fn(x):
        clock.t += 2.0
        return inner(x)
    outer = RecordingTransform(outer_fn, "outer", rec)
    outer(1)  # not timing: nothing counted
    with rec.timing(clock):
        outer(1)
        worker = threading.Thread(target=outer, args=(1,))
        worker.start()
        worker.join()
        assert rec.seconds == pytest.approx(3.0)  # outer's 2 and inner's 1, once; the other thread's not
    outer(1)
    assert rec.seconds == pytest.approx(3.0) and rec.clock is None


def test_each_batch_is_collated_right_after_its_samples_were_built_as_a_worker_does():
    """The collate is timed on each batch as the load's timing builds it, in the loader's
    groups: on a fake clock a collate takes 3 ms on samples built just before it, 1 ms on
    older ones (over the cached batches, warm). The collate reads 3 ms, torch's
    default_collate beside it on the same batches 0.5, and load keeps its own 3 ms a sample
    (the collates taken out of its time)."""
    clock = FakeClock(100.0)

    def tick(dt):
        clock.t += dt
    ds = _WarmAfterLoad(tick)

    def collate(samples):
        tick(3e-3 if ds.fresh.get("sample") is samples[-1] else 1e-3)
        return torch.utils.data.default_collate(samples)

    def stacking(samples):  # default_collate, as worker_stages calls it beside: 0.5 ms
        tick(0.5e-3)
        return torch.utils.data.default_collate(samples)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate)
    spec = loader_mod.describe(loader)
    caches = cache.fill(spec, cache_mb=64, max_batches=4, time_budget=10)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worker_stages, "default_collate", stacking)
        iso, _ = isolate.time_stages(spec, caches, CPU, lambda b: to_device(b, CPU), None, step_sec_per_batch=0.01,
                                     budget_s=5.0, clock=clock, end=clock.t + 60)
    col = iso.collate
    assert col.in_place and col.batches >= worker_stages.COLLATE_IN_PLACE
    assert col.ms_per_batch == pytest.approx(3.0) and col.default_collate_ms_per_batch == pytest.approx(0.5)
    assert iso.load.ms_per_sample == pytest.approx(3.0) and iso.load.getitem_ms_per_sample == pytest.approx(5.0)
    # over the cached batches alone (no load timed before it), the same collate reads warm
    warm = worker_stages.time_collate(spec, caches, 1.0, clock)
    assert not warm.in_place and warm.ms_per_batch == pytest.approx(1.0)
