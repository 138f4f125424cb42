"""Every phase of one experiment as visits (phases.py): the options, the small visits of
a user's loop (the probe, the sync count), and what an interrupted run says."""

import time

import torch

from bisect_pipeline.measure import cache
from bisect_pipeline import phases
from bisect_pipeline.measure.experiment import Experiment
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.measure.plan import Plan
from bisect_pipeline.pipeline.step import to_device
from conftest import PlantedDataset, make_loader

CPU = torch.device("cpu")


def experiment() -> Experiment:
    spec = describe(make_loader(PlantedDataset(n=32), batch_size=8))
    exp = Experiment(spec, CPU, Plan(), time.perf_counter, lambda e: None, None, start=0.0, end=1e9, deadline=1e9,
                     loop=True)
    exp.caches = cache.fill(spec, cache_mb=64, max_batches=2)
    exp.move = lambda b: to_device(b, CPU)
    return exp


def consume(visit, step) -> int:
    n = 0
    with visit as batches:
        for batch in batches:
            step(batch)
            n += 1
    return n


def test_the_probe_finds_a_loop_that_changes_its_batch():
    exp = experiment()
    assert consume(phases.Probe(exp), lambda b: b[0].add_(1)) == 1
    assert exp.fresh and any("changes its input batch" in n.message for n in exp.notes)
    calm = experiment()
    consume(phases.Probe(calm), lambda b: b[0].sum())
    assert not calm.fresh and exp.caches.batches[0][0].abs().sum() > 0  # the cache itself was never handed out


def test_syncs_are_counted_on_cuda_only_and_say_why_not_here():
    counted = phases.SyncCount(experiment())
    assert consume(counted, lambda b: None) == 0  # nothing to hand out on the CPU
    assert counted.syncs.status == "skipped" and "CUDA" in counted.syncs.reason


def test_an_interrupted_run_says_the_stages_were_not_timed_alone():
    iso, syncs = phases.not_isolated()
    assert iso.status == syncs.status == "skipped" and "interrupted" in iso.reason
