"""The user's loader, read once (loader.py): its settings and its sampler's order,
never iterated."""

import pytest
import torch
from torch.utils.data import RandomSampler

from bisect_pipeline.pipeline import loader as loader_mod
from conftest import PlantedDataset, make_loader


def test_describe_reads_settings_without_iterating():
    loader = make_loader(PlantedDataset(), batch_size=4, num_workers=2, pin_memory=True, drop_last=True)
    spec = loader_mod.describe(loader)
    assert (spec.batch_size, spec.num_workers, spec.pin_memory, spec.drop_last) == (4, 2, True, True)
    assert spec.prefetch_depth == 4
    assert isinstance(spec.sampler, RandomSampler)
    assert spec.settings()["shuffle"] is True
    kw = spec.worker_kwargs()
    assert kw["num_workers"] == 2 and kw["prefetch_factor"] == 2 and kw["pin_memory"] is True
    assert loader._iterator is None


def test_index_order_cycles_a_copy_of_the_sampler():
    g = torch.Generator().manual_seed(0)
    loader = make_loader(PlantedDataset(n=4), batch_size=2, generator=g)
    state = g.get_state()
    spec = loader_mod.describe(loader)
    order = loader_mod.index_order(spec)
    first = [next(order) for _ in range(10)]
    assert sorted(first[:4]) == [0, 1, 2, 3] and sorted(first[4:8]) == [0, 1, 2, 3]
    assert torch.equal(g.get_state(), state)  # the user's generator did not move


def test_other_settings_drop_what_a_loader_without_workers_refuses():
    spec = loader_mod.describe(make_loader(PlantedDataset(), batch_size=4, num_workers=2, persistent_workers=True,
                                           prefetch_factor=3, timeout=5.0))
    w0 = spec.with_settings({"num_workers": 0, "torch_num_threads": 1})  # not a loader setting: ignored
    assert (w0.num_workers, w0.persistent_workers, w0.prefetch_factor, w0.timeout) == (0, False, None, 0.0)
    assert "prefetch_factor" not in w0.worker_kwargs() and "persistent_workers" not in w0.worker_kwargs()
    assert spec.with_settings({"pin_memory": True}).pin_memory and not spec.pin_memory  # the user's spec untouched
    assert spec.prefetch_depth == 6 and w0.prefetch_depth == 0


def test_a_sampler_that_yields_nothing_is_an_error_not_a_hang():
    spec = loader_mod.describe(torch.utils.data.DataLoader(PlantedDataset(n=0)))
    with pytest.raises(RuntimeError, match="yields nothing"):
        next(loader_mod.index_order(spec))


def test_batches_per_epoch_is_the_loaders_length_where_it_has_one():
    from torch.utils.data import DataLoader

    from conftest import PlantedIterable

    for kw in ({"batch_size": 8}, {"batch_size": 5}, {"batch_size": 5, "drop_last": True}, {"batch_size": None},
               {"batch_sampler": [[0, 1, 2], [3]]}):
        loader = DataLoader(PlantedDataset(n=22), **kw)
        assert loader_mod.describe(loader).batches_per_epoch == len(loader), kw
    assert loader_mod.describe(make_loader(PlantedDataset(n=22), batch_size=5)).settings()["batches_per_epoch"] == 5
    assert loader_mod.describe(DataLoader(PlantedIterable(n=8), batch_size=2)).batches_per_epoch is None
