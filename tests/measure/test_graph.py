"""A node graph's caches and sources (measure/graph.py): the fill keeps every cut's items
and the Mappers' calls, each point's graph yields the root's batches from its cache,
the full point never ends an epoch inside a window (and ends them where asked), errors
name their stage, and leaving a source stops its threads. Real torchdata; nothing timed."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils.data import default_collate

tn = pytest.importorskip("torchdata.nodes")

from bisect_pipeline.core import faults, tree  # noqa: E402
from bisect_pipeline.measure import cache, graph  # noqa: E402
from bisect_pipeline.pipeline import recording  # noqa: E402
from bisect_pipeline.pipeline.integrations import node_chain, nodes  # noqa: E402


class AddOne:
    def __call__(self, x):
        return x + 1


class InPlace:
    def __call__(self, x):
        x.add_(1)
        return x


class Boom:
    def __call__(self, x):
        raise ValueError("bad sample")


def spec_of(fn=None, n=24, workers=2, prefetch=2):
    node = tn.IterableWrapper([torch.full((3,), float(i)) for i in range(n)])
    node = tn.ParallelMapper(node, fn or AddOne(), num_workers=workers)
    node = tn.Mapper(tn.Batcher(node, batch_size=4), default_collate)
    return nodes.describe(tn.Loader(tn.Prefetcher(node, prefetch_factor=prefetch)))


def test_the_fill_keeps_each_cut_the_mappers_calls_and_the_batches_in_the_users_order():
    spec = spec_of()
    c = graph.fill(spec, cache_mb=64, max_batches=3)
    assert c.n_batches == 3 and len(c.samples) == len(c.raw_items) == 12 and len(c.collated) == 3
    assert [float(x[0]) for x in c.raw_items] == list(range(12))
    assert [float(x[0]) for x in c.samples] == [i + 1.0 for i in range(12)]
    assert c.groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert (c.batch_size, c.batch_size_source) == (4, "Batcher.batch_size")
    assert tree.same_values(c.batches[0], default_collate(c.samples[:4]))
    # isolate.py replays each sample's calls alone
    assert tree.same_values(recording.replay_sample(c.samples[5], c.raw_calls[5]), c.samples[5])
    assert c.raw_found == [spec.chain[1].describe()] and not c.raw_copy


def test_a_mapper_that_changes_its_input_gets_copies_at_the_raw_point():
    spec = spec_of(InPlace(), workers=0)
    c = graph.fill(spec, cache_mb=64, max_batches=2)
    assert c.raw_copy and [float(x[0]) for x in c.raw_items[:2]] == [0.0, 1.0]
    with graph.source(spec, "raw", c) as next_batch:
        for _ in range(5):
            next_batch()
    assert [float(x[0]) for x in c.raw_items[:2]] == [0.0, 1.0]  # the cache is untouched


@pytest.mark.parametrize("point", ["full", "raw", "augmented", "collated"])
def test_every_point_yields_the_roots_batches_and_stops_its_threads(point):
    spec = spec_of()
    c = graph.fill(spec, cache_mb=64, max_batches=3)
    before = threading.active_count()
    with graph.source(spec, point, c) as next_batch:
        got = [next_batch() for _ in range(12)]  # past the cache and past an epoch (6 batches)
        assert threading.active_count() > before  # the mapper's and the prefetcher's threads
    assert all(b.shape == (4, 3) for b in got)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before


def test_the_full_point_ends_its_epochs_only_where_asked():
    spec = spec_of(n=8)  # 2 batches an epoch
    with graph.source(spec, "full", None) as next_batch:
        assert len([next_batch() for _ in range(7)]) == 7  # no StopIteration: the source starts again
    root = graph.root_of(spec, "full", None, epochs=True)
    try:
        assert len([next(root) for _ in range(2)]) == 2
        with pytest.raises(StopIteration):
            next(root)
    finally:
        graph.shutdown(root)
    with graph.source(spec, "full", None, epochs=True) as next_batch:
        assert len([next_batch() for _ in range(5)]) == 5  # reset at each epoch's end, as a Loader does


def test_the_raw_point_replays_the_given_calls_for_the_confirmation():
    spec = spec_of()
    c = graph.fill(spec, cache_mb=64, max_batches=2)
    with graph.source(spec, "raw", c, calls=c.raw_calls) as next_batch:
        b = next_batch()
    assert sorted(b[:, 0].tolist()) in ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0])


def test_a_failing_mapper_before_the_first_batch_names_augment():
    with pytest.raises(cache.FillError) as e:
        graph.fill(spec_of(Boom()), cache_mb=64, max_batches=2)
    assert e.value.stage == "augment" and "bad sample" in e.value.reason


def test_a_failing_mapper_at_a_point_names_augment_from_its_thread():
    spec = spec_of(Boom())
    with pytest.raises(Exception) as e:
        with graph.source(spec, "full", None) as next_batch:
            next_batch()
    assert faults.classify(e.value)[0] == "augment"


def test_the_memory_budget_stops_the_fill():
    c = graph.fill(spec_of(), cache_mb=1e-4, max_batches=8)
    assert c.n_batches == 1 and c.limited_by == "memory budget"


def test_a_graph_that_batches_its_keys_before_the_mapper_that_reads_them_is_costed_once_per_batch():
    """IterableWrapper(keys) -> Batcher -> Mapper(read, transform and stack the batch), as
    pytorch/data's nodes ImageNet example: each call of the Mapper builds a whole batch.
    Its cost alone is counted once a batch (the items the workers' per-batch work
    multiplies are batches, not keys): on a fake clock the Mapper takes 1 s a key, so
    4 s a batch of 4, and the workers' work a batch reads 4 s, not 4 x 4 + 4."""
    from bisect_pipeline.measure import isolate
    from conftest import FakeClock
    clock = FakeClock()

    def read_batch(keys):
        clock.t += 1.0 * len(keys)
        return torch.stack([torch.full((3,), float(k)) for k in keys])
    spec = nodes.describe(tn.Loader(tn.Mapper(tn.Batcher(tn.IterableWrapper(range(400)), batch_size=4), read_batch)))
    assert spec.cuts.raw is None and spec.cuts.augmented is None
    caches = graph.fill(spec, cache_mb=64, max_batches=3, clock=clock, time_budget=1e9)
    assert caches.items_per_batch == 1  # a batch of keys is one item of the Mapper
    iso, _ = isolate.time_stages(spec, caches, torch.device("cpu"), lambda b: b, None, step_sec_per_batch=0.001,
                                 budget_s=200.0, clock=clock)
    load, col = iso.part("load"), iso.part("collate")
    assert load.ok and col.ok
    assert load.ms_per_sample * iso.items_per_batch == pytest.approx(4000.0)
    assert col.ms_per_batch == pytest.approx(0.0)  # nothing is left to the Batcher's list: the Mapper built it
    assert iso.part("workers").worker_ms_per_batch == pytest.approx(4000.0)
    # and the load says what it holds: the Mapper's transforms and its stacking (a hand probe
    # of load alone, without them, is not what this figure measures)
    assert load.includes == ("load", "augment", "collate")
    assert "whole batch" in load.note


def test_a_graph_that_pins_keeps_its_pin_memory_and_is_filled_without_it(monkeypatch):
    """PinMemory -> host, as DataLoader's pin_memory: the graph's setting is read from its
    chain (`pin_memory`, and in the report's settings), the fill runs without it (the
    caches are the batches before pinning), and every point past `collated` is rebuilt
    with it, once, at the root's side (sources.host_batches pins the cached batches for the
    `host` point where CUDA is there). tn.PinMemory asks CUDA for its device when built, so
    without CUDA (here) only its construction is stood in for: nothing is pinned or run."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    node = tn.IterableWrapper([torch.full((3,), float(i)) for i in range(24)])
    node = tn.Batcher(tn.Mapper(node, AddOne()), batch_size=4)
    spec = nodes.describe(tn.Loader(tn.Prefetcher(tn.PinMemory(tn.Mapper(node, default_collate)), prefetch_factor=2)))
    assert spec.pin_memory and spec.settings()["pin_memory"]
    kinds = [n.kind for n in spec.chain]
    assert kinds.index("pin") > spec.cuts.collated  # the pinning is past the collated cut: handoff's side
    caches = graph.fill(spec, cache_mb=64, max_batches=3, time_budget=1e9)  # inline: no PinMemory run
    assert len(caches.batches) == 3 and caches.batches[0].shape == (4, 3)
    built = spec.build(spec.cuts.collated, node_chain.tagged_source(tn.IterableWrapper(caches.collated)))
    chain = []
    while built is not None:
        chain.append(type(built).__name__)
        built = getattr(built, "source", None)
    assert chain[:2] == ["Prefetcher", "PinMemory"] and chain.count("PinMemory") == 1
    off = spec.with_settings({"pin_memory": False})
    assert not off.pin_memory
