"""torchdata.nodes graphs read as a NodeSpec: the chain, its cuts in each order a graph
comes in, the settings the measuring layer and the advice read, and the rebuild (the
user's nodes never started). Real torchdata, no fakes; nothing timed."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import default_collate

tn = pytest.importorskip("torchdata.nodes")

from bisect_pipeline.core.errors import BisectError  # noqa: E402
from bisect_pipeline.pipeline.integrations import nodes  # noqa: E402
from bisect_pipeline.pipeline.workload import Workload, validate  # noqa: E402


def _double(x):
    return x * 2


def _stack(batch):
    return torch.stack(batch)


def samples(n=40):
    return [torch.full((2,), float(i)) for i in range(n)]


def the_usual(n=40, workers=2, prefetch=3):
    """IterableWrapper -> ParallelMapper -> Batcher -> Mapper(collate) -> Prefetcher."""
    node = tn.ParallelMapper(tn.IterableWrapper(samples(n)), _double, num_workers=workers, method="thread",
                             in_order=False, max_concurrent=2)
    node = tn.Mapper(tn.Batcher(node, batch_size=4), default_collate)
    return tn.Loader(tn.Prefetcher(node, prefetch_factor=prefetch))


def test_a_loader_is_read_into_its_chain_cuts_and_settings():
    spec = nodes.describe(the_usual())
    assert [n.kind for n in spec.chain] == ["iterable", "map", "batch", "map", "prefetch"]
    assert (spec.cuts.raw, spec.cuts.augmented, spec.cuts.collated, spec.cuts.augment) == (0, 1, 3, (1,))
    assert spec.cuts.why == {}
    assert (spec.num_workers, spec.method, spec.in_order, spec.prefetch_factor) == (2, "thread", False, 3)
    assert (spec.batch_size, spec.drop_last, spec.batches_per_epoch) == (4, True, 10)
    assert spec.prefetch_depth == 3 and not spec.pin_memory and not spec.persistent_workers
    settings = spec.settings()
    json.dumps(settings)  # the report's loader block
    assert settings["kind"] == "torchdata.nodes" and settings["max_concurrent"] == 2
    assert settings["graph"][1].startswith("ParallelMapper(_double, num_workers=2")
    assert settings["witnessed"] is False  # its stages run in threads of their own


def test_a_mapper_after_the_batcher_maps_whole_batches_so_augmented_cannot_be_cut():
    """The issue's graph: IterableWrapper -> Batcher -> ParallelMapper(4 threads) -> Prefetcher."""
    root = tn.Prefetcher(tn.ParallelMapper(tn.Batcher(tn.IterableWrapper(samples()), 4), _stack, num_workers=4), 2)
    spec = nodes.describe(root)
    assert (spec.cuts.raw, spec.cuts.augmented, spec.cuts.collated) == (0, None, 2)
    assert "maps whole batches" in spec.cuts.why["augmented"]
    assert spec.num_workers == 4
    assert spec.prefetch_depth == 2 + 2 * 4  # the Prefetcher's queue and the batch mapper's tasks in flight


def test_map_style_wrapper_s_map_of_keys_is_the_load():
    """MapStyleWrapper builds SamplerWrapper -> Mapper(dataset.__getitem__): the map is the load."""
    root = tn.Batcher(tn.MapStyleWrapper(samples(), range(40)), 5)
    spec = nodes.describe(root)
    assert [n.kind for n in spec.chain] == ["sampler", "map", "batch"]
    assert spec.cuts.raw is None and spec.cuts.augmented == 1
    assert "raw and augmented coincide" in spec.cuts.why["raw"]
    assert "collated and host coincide" in spec.cuts.why["collated"]  # nothing after the Batcher
    assert spec.stage_of(1) == "load" and spec.batches_per_epoch == 8


def test_a_source_of_names_makes_the_mapper_after_it_the_load():
    """IterableWrapper(range(n)) -> ParallelMapper(read) -> Mapper(augment): the source yields
    indices (recording.names_only, the map-style split's own test), so the Mapper that reads
    them is the load and `raw` falls after it; the source of data keeps `raw` at the source."""
    read = tn.ParallelMapper(tn.IterableWrapper(range(40)), _double, num_workers=2, method="thread")
    spec = nodes.describe(tn.Prefetcher(tn.Batcher(tn.Mapper(read, _double), 4), 2))
    assert (spec.cuts.raw, spec.cuts.augmented, spec.cuts.augment) == (1, 2, (2,))
    assert [spec.stage_of(i) for i in (1, 2)] == ["load", "augment"]
    data = nodes.describe(tn.Prefetcher(tn.Batcher(tn.Mapper(tn.IterableWrapper(samples()), _double), 4), 2))
    assert (data.cuts.raw, data.cuts.augmented) == (0, 1)
    # batched keys, then one Mapper that reads, transforms and stacks them: one stage
    batch = nodes.describe(tn.Prefetcher(tn.ParallelMapper(tn.Batcher(tn.IterableWrapper(range(40)), 4), _stack,
                                                           num_workers=4), 2))
    assert batch.cuts.raw is None and batch.cuts.augmented is None
    assert "loading, augment and collate run in one call" in batch.cuts.why["raw"]


def test_a_collate_mapper_after_the_batcher_is_the_collate_not_a_map_of_whole_batches():
    """MapStyleWrapper -> Batcher -> Mapper(default_collate) (torchdata's migration guide):
    the __getitem__ map is load (with the dataset's transforms), the Mapper after the
    Batcher the collate."""
    root = tn.Mapper(tn.Batcher(tn.MapStyleWrapper(samples(), range(40)), 5), default_collate)
    spec = nodes.describe(root)
    assert (spec.cuts.raw, spec.cuts.augmented, spec.cuts.collated) == (None, 1, 3)
    assert "augmented" not in spec.cuts.why and "raw and augmented coincide" in spec.cuts.why["raw"]


def test_a_prebatched_mapper_is_read_with_its_own_function_and_source():
    src = tn.IterableWrapper(samples())
    root = tn.Batcher(tn.ParallelMapper(src, _double, num_workers=2, prebatch=4), 4)
    spec = nodes.describe(root)
    assert [n.kind for n in spec.chain] == ["iterable", "map", "batch"]
    assert spec.chain[1].fn is _double and spec.chain[1].args["prebatch"] == 4


def test_the_rebuilt_graph_yields_the_users_data_and_never_starts_the_users_nodes():
    loader = the_usual(workers=2)
    spec = nodes.describe(loader)
    root = spec.full()
    try:
        got = [next(root) for _ in range(10)]
    finally:
        from bisect_pipeline.measure import graph
        graph.shutdown(root)
    assert all(b.shape == (4, 2) for b in got)
    assert sorted(torch.cat(got)[:, 0].tolist()) == [2.0 * i for i in range(40)]  # (in_order=False: any order)
    user_mapper = loader.root.source.source.source
    assert user_mapper._it._it is None and loader._it is None  # never reset, never iterated


def test_with_settings_rebuilds_the_main_mapper_and_the_prefetcher_with_the_new_settings():
    spec = nodes.describe(the_usual(workers=2, prefetch=3)).with_settings(
        {"num_workers": 1, "prefetch_factor": 5, "persistent_workers": True, "batch_size": 99})
    assert (spec.num_workers, spec.prefetch_factor, spec.batch_size) == (1, 5, 4)
    root = spec.full()
    from bisect_pipeline.measure import graph
    try:
        next(root)
        assert root.prefetch_factor == 5
        mapper = root.source.source.source
        assert mapper.num_workers == 1 and mapper.max_concurrent == 1  # (capped: ParallelMapper refuses more)
    finally:
        graph.shutdown(root)
    plain = nodes.describe(tn.Batcher(tn.IterableWrapper(samples()), 4)).with_settings({"prefetch_factor": 4})
    root = plain.full()
    assert type(root).__name__ == "Prefetcher" and root.prefetch_factor == 4  # added where the graph had none
    graph.shutdown(root)


def test_a_generator_source_is_refused_with_what_to_do_and_never_read():
    gen = (torch.zeros(2) for _ in range(10))
    spec = nodes.describe(tn.Batcher(tn.IterableWrapper(gen), 2))
    with pytest.raises(TypeError, match="can be iterated once"):
        spec.full()
    assert len(list(gen)) == 10


def test_a_workload_takes_a_loader_or_a_root_node_and_names_both_in_its_error():
    validate(Workload(model=torch.nn.Linear(2, 2), loader=the_usual()))
    validate(Workload(model=torch.nn.Linear(2, 2), loader=the_usual().root))
    with pytest.raises(BisectError, match="torchdata.nodes Loader"):
        validate(Workload(model=torch.nn.Linear(2, 2), loader=[1, 2]))


def test_the_install_hint_names_the_nodes_extra():
    from bisect_pipeline.pipeline.integrations import EXTRAS, install_hint

    assert EXTRAS["torchdata"] == "nodes"
    assert "bisect-pipeline[nodes]" in install_hint(ModuleNotFoundError("no torchdata", name="torchdata.nodes"))


def test_the_settings_tune_and_the_check_try_are_applied_on_the_graphs_nodes():
    """tune.Space.candidate's and verify's settings (DataLoader's keys) rebuild the graph
    with them: workers on its main Mapper, prefetch_factor on its Prefetcher;
    persistent_workers and pin_memory=False change nothing a graph has."""
    from bisect_pipeline.advise.tune import Space

    spec = nodes.describe(the_usual(workers=2, prefetch=3))
    user = {"num_workers": 2, "prefetch_factor": 3, "persistent_workers": False, "pin_memory": False,
            "torch_num_threads": 2}
    candidate = Space(user, (1, 2, 3), cores=4, on_cpu=True).candidate(3)
    tried = spec.with_settings(Space(user).delta(candidate))
    assert (tried.num_workers, tried.prefetch_factor, tried.pin_memory) == (3, 3, False)
    assert tried.settings()["main_mapper"].startswith("ParallelMapper(_double, num_workers=2")  # the user's, read
    assert spec.with_settings({}).overrides == {} and spec.num_workers == 2  # the user's spec untouched
