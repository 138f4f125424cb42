"""Filling the caches once, from the first batches in the user's order (cache.py): what
each point replays, where the fill stops, and what a failing pipeline leaves."""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from bisect_pipeline.measure import cache, sources
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.testing import SeveralPerItem, flatten_collate
from conftest import (FEATURES, DetectionRef, DictFlip, DictSamples, JointFlip, KeywordFlip, PlantedDataset, Segmentation,
                      Sleep, detection_collate, make_loader)
from test_recording import Double, same
from test_split import FolderLike


class RaisesFrom(Dataset):
    def __init__(self, at: int):
        self.at = at
        self.data = torch.zeros(64, 4)
        self.transform = Sleep(0.0)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= self.at:
            raise OSError(f"sample {i} is unreadable")
        return self.transform(self.data[i]), 0


def fill(loader, **kw):
    kw.setdefault("cache_mb", 64)
    return cache.fill(describe(loader), **kw)


def test_every_point_gets_its_cache_in_the_users_groups():
    loader = DataLoader(PlantedDataset(n=64, transform=Sleep(0.0)), batch_size=8)
    c = fill(loader, max_batches=3)
    assert c.n_batches == 3 and len(c.samples) == 24 and len(c.raw_calls) == 24
    assert c.groups == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]
    assert c.batch_size == 8 and c.batch_size_source == "DataLoader.batch_size"
    assert c.raw_found == ["dataset.transform (Sleep)"] and c.limited_by is None
    assert torch.equal(c.batches[1][0], torch.stack([s[0] for s in c.samples[8:16]]))


def test_the_fill_stops_at_the_memory_budget_or_the_time_budget_and_says_so():
    loader = make_loader(PlantedDataset(n=64, features=64 * 1024), batch_size=8)  # 2 MiB a batch
    assert fill(loader, cache_mb=16, max_batches=8).limited_by == "memory budget"
    t = [0.0]

    def clock():
        t[0] += 1.0
        return t[0]

    c = fill(make_loader(PlantedDataset(n=64), batch_size=8), max_batches=8, time_budget=2.5, clock=clock)
    assert c.limited_by == "time" and 1 <= c.n_batches < 8


class Reshape:
    """A transform whose output is `ratio` times its input's size (a crop: ratio < 1)."""

    def __init__(self, features: int) -> None:
        self.features = features

    def __call__(self, x):
        return x[:self.features].clone() if len(x) >= self.features else x.repeat(self.features // len(x))


class Reshaped(Dataset):
    """Samples of `features` float32 made by the transform from inputs of `raw` float32."""

    def __init__(self, raw: int, features: int, n: int = 96):
        self.data = torch.zeros(n, raw)
        self.transform = Reshape(features)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(self.data[i].clone()), 0


def held_bytes(c) -> int:
    """What the caches hold at once, counted here apart from cache.py: the transforms'
    recorded inputs, the samples, the collated batches and one copy of them (the host or
    device point's, while it is visited)."""
    from bisect_pipeline.core import tree

    raw = sum(tree.nbytes((call.args, call.kwargs)) for calls in c.raw_calls for call in calls)
    return raw + tree.nbytes(c.samples) + 2 * tree.nbytes(c.batches)


@pytest.mark.parametrize("raw_quarters, kept", [(16, 2), (1, 6)])
def test_the_memory_budget_counts_what_the_caches_hold_at_once_each_part_by_its_size(raw_quarters, kept):
    # samples of 64 Ki float32 (256 KiB), batches of 8 (2 MiB); the transforms' inputs 4x
    # the samples (a crop: 8 MiB a batch, 14 MiB held in all) or a quarter of them (0.5 MiB
    # a batch, 6.5 MiB held). A budget of 40 MiB holds 2 batches of the first (a third
    # makes 42), 6 of the second (a seventh makes 45.5). Counted as five copies of the
    # batch, 10 MiB each, both kept 4: 56 MiB held for the crops, over the budget.
    features = 64 * 1024
    loader = DataLoader(Reshaped(features * raw_quarters // 4, features), batch_size=8)
    c = fill(loader, cache_mb=40, max_batches=8)
    assert c.limited_by == "memory budget" and c.n_batches == kept
    assert held_bytes(c) <= 40 * 2**20 < held_bytes(c) * (kept + 1) / kept
    assert sum(c.held.values()) == held_bytes(c) and c.budget_bytes == 40 * 2**20
    assert c.held["collated"] == c.held["point_copy"] == pytest.approx(kept * 2 * 2**20, rel=1e-3)  # and labels


def test_a_batch_sampler_of_uneven_groups_gives_their_mean_size():
    groups = [[0, 1, 2], [3], [4, 5]]
    loader = DataLoader(PlantedDataset(n=8), batch_sampler=groups)
    c = fill(loader, max_batches=3)
    assert c.groups == [[0, 1, 2], [3], [4, 5]] and c.batch_size == 2
    assert c.batch_size_source.startswith("the batch sampler's batches")
    assert fill(loader, max_batches=3, batch_size=lambda b: len(b[1])).batch_size == 2  # the workload says so


def test_an_item_that_becomes_several_samples_is_counted_in_the_collated_batch():
    # each item a list of 4 {"image", "label"} samples (MONAI's RandCropByPosNegLabeld(num_samples=4)),
    # flattened by the collate (MONAI's list_data_collate): the step trains on 8 per batch of 2 items
    loader = DataLoader(SeveralPerItem(n=16, k=4), batch_size=2, collate_fn=flatten_collate)
    c = fill(loader, max_batches=3)
    assert c.batch_size == 8 and c.items_per_batch == 2
    assert c.batch_size_source == "counted in the collated batch: loader batch_size 2 \u00d7 4 per sample"
    assert c.batches[0]["image"].shape == (8, FEATURES)
    sampled = DataLoader(SeveralPerItem(n=16, k=3), batch_sampler=[[0, 1, 2], [3, 4, 5]], collate_fn=flatten_collate)
    c = fill(sampled, max_batches=2)
    assert c.batch_size == 9 and c.batch_size_source.endswith("the batch sampler's batches of 3 \u00d7 3 per sample")
    # the workload's own count still comes first
    assert fill(loader, max_batches=1, batch_size=2).batch_size == 2


def test_the_loaders_count_stands_unless_every_tensor_of_the_batch_says_otherwise():
    # the lists collated as they are (default_collate: a list of 4 dicts of 2 each): 2 per batch
    c = fill(DataLoader(SeveralPerItem(n=16, k=4), batch_size=2), max_batches=2)
    assert c.batch_size == 2 and c.batch_size_source == "DataLoader.batch_size"
    # items that are lists of tensors (not of samples), or samples of another structure
    groups, batches = [[0, 1]], [{"x": torch.zeros(4, 3), "y": torch.zeros(4)}]
    assert cache.several_per_item(groups, batches, [[torch.zeros(3)] * 2] * 2) is None
    pairs = [[{"x": torch.zeros(3)}, {"x": torch.zeros(3), "y": 1}]] * 2
    assert cache.several_per_item(groups, batches, pairs) is None
    alike = [[{"x": torch.zeros(3)}, {"x": torch.zeros(3)}]] * 2
    assert cache.several_per_item(groups, batches, alike) == 2
    # tensors that disagree on their first dimension (a sequence-first input beside its labels)
    assert cache.several_per_item(groups, [{"x": torch.zeros(5, 4), "y": torch.zeros(4)}], alike) is None


def test_an_error_after_the_first_batch_keeps_what_was_built_and_before_it_names_the_stage():
    c = fill(DataLoader(RaisesFrom(20), batch_size=8), max_batches=8)
    assert c.n_batches == 2 and "sample 20 is unreadable" in c.stopped_by
    with pytest.raises(cache.FillError) as err:
        fill(DataLoader(RaisesFrom(3), batch_size=8))
    assert err.value.stage == "load" and "OSError" in err.value.reason


def test_without_a_transform_to_proxy_raw_is_unavailable_with_what_to_do():
    c = fill(DataLoader(PlantedDataset(n=16, transform=None), batch_size=8), max_batches=1)
    assert c.raw_calls is None and "self.transform" in c.raw_reason


SHAPES = {  # issue 22: the shapes of public detection and segmentation datasets
    "joint transforms in self._transforms, in a Subset": (
        lambda: Subset(DetectionRef(JointFlip()), list(range(64))), detection_collate,
        ["dataset.dataset._transforms (JointFlip)"]),
    "keywords in, a dict out that __getitem__ unpacks": (
        lambda: Segmentation(KeywordFlip()), None, ["dataset.transform (KeywordFlip)"]),
    "a dict in, a dict out": (lambda: DictSamples(DictFlip()), None, ["dataset.transform (DictFlip)"]),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_raw_replays_the_same_samples_as_the_dataset_in_each_shape(shape):
    make, collate, found = SHAPES[shape]
    ds = make()
    c = fill(DataLoader(ds, batch_size=8, collate_fn=collate), max_batches=2)
    assert c.raw_reason is None and c.raw_found == found
    replay = sources.RawReplay(c.samples, c.raw_calls)
    for i in range(len(c.samples)):  # unshuffled: sample i is the dataset's sample i
        assert same(replay[i], ds[i]), i


def test_a_loader_alone_is_no_transform_and_is_taken_off_the_copy_that_runs_full():
    ds = FolderLike()
    ds._aug = None
    c = fill(DataLoader(ds, batch_size=2), max_batches=1)
    assert c.raw_calls is None and c.raw_found == []
    assert c.raw_reason.startswith("no per-sample transform could be separated on FolderLike")
    assert "dataset.loader is called with names only" in c.raw_reason and "self.transform" in c.raw_reason
    assert c.dataset.loader is ds.loader


def test_a_changed_output_says_which_part_and_what_to_move_and_a_declared_transform_never_called_is_not_found():
    c = fill(DataLoader(Segmentation(KeywordFlip(), long_mask=True), batch_size=8), max_batches=1)
    assert c.raw_calls is None and c.raw_reason.startswith("dataset.transform(...)['mask'] is changed inside")
    ds = PlantedDataset(n=16, transform=Sleep(0.0))
    ds.transforms = Double()  # as a VisionDataset's StandardTransform that __getitem__ does not call
    c = fill(DataLoader(ds, batch_size=8), max_batches=1)
    assert c.raw_found == ["dataset.transform (Sleep)"]
