"""Splitting loading from transforms (split, recording) and reading the loader (loader)."""

import collections
import dataclasses

import pytest
import torch
from torch.utils.data import ConcatDataset, Dataset, RandomSampler, Subset

from bisect_pipeline import loader as loader_mod, recording, split, tree
from conftest import PlantedDataset, make_loader


class Double:
    def __call__(self, x):
        return x * 2


class PostProcessed(Dataset):
    """Changes the transform's output after it: the split must be refused."""

    def __init__(self):
        self.transform = Double()

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.transform(torch.ones(3)) + 1, i


class Joint(Dataset):
    """torchvision-style joint transform on (image, target)."""

    def __init__(self):
        self.transforms = lambda img, tgt: (img * 3, {"boxes": tgt["boxes"] + 1})

    def __len__(self):
        return 4

    def __getitem__(self, i):
        img, tgt = self.transforms(torch.full((2, 2), float(i)), {"boxes": torch.zeros(4)})
        return img, tgt


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


def test_record_and_replay_rebuild_the_sample_and_leave_the_dataset_alone():
    ds = PlantedDataset(transform=Double())
    original_transform = ds.transform
    inst = split.instrument(ds)
    assert inst.found == ["dataset.transform (Double)"]
    assert ds.transform is original_transform  # the user's dataset is not touched
    sample, calls = recording.record_sample(inst, 3)
    assert len(calls) == 1 and calls[0].placements == [(None, (0,))]
    assert torch.equal(calls[0].args[0], ds.data[3])  # the transform's input is cached
    replayed = recording.replay_sample(sample, calls)
    assert torch.equal(replayed[0], ds.data[3] * 2) and replayed[1] == sample[1]
    assert tree.same_structure(replayed, sample) is None


def test_transform_found_through_subset_and_concat():
    inner = PlantedDataset(transform=Double())
    chain = Subset(ConcatDataset([PlantedDataset(), inner]), [70])
    inst = split.instrument(chain)
    assert inst.found == ["dataset.dataset.datasets[1].transform (Double)"]
    sample, calls = recording.record_sample(inst, 0)
    assert torch.equal(sample[0], inner.data[70 - 64] * 2)
    assert len(calls) == 1


def test_joint_transform_outputs_are_placed_element_by_element():
    inst = split.instrument(Joint())
    sample, calls = recording.record_sample(inst, 2)
    assert calls[0].placements == [(0, (0,)), (1, (1,))]
    again = recording.replay_sample(sample, calls)
    assert torch.equal(again[0], torch.full((2, 2), 6.0)) and torch.equal(again[1]["boxes"], torch.ones(4))


def test_output_changed_after_the_transform_refuses_the_split():
    inst = split.instrument(PostProcessed())
    with pytest.raises(recording.SplitError, match="changed inside __getitem__"):
        recording.record_sample(inst, 0)


def test_same_structure_names_the_difference():
    assert tree.same_structure((torch.zeros(2), 1), (torch.zeros(3), 2)) is None  # shapes may vary
    assert "float32" in tree.same_structure((torch.zeros(2),), (torch.zeros(2, dtype=torch.int64),))
    assert tree.same_structure({"a": 1}, {"b": 1}) is not None


def test_set_path_rebuilds_containers():
    Pair = collections.namedtuple("Pair", "x y")

    @dataclasses.dataclass
    class Box:
        v: object

    obj = [Pair(1, {"k": Box(5)})]
    new = tree.replace(obj, (0, 1, "k", "v"), 9)
    assert new[0].y["k"].v == 9 and obj[0].y["k"].v == 5
    assert isinstance(new[0], Pair)


def test_clone_data_shares_no_storage():
    t = torch.ones(3)
    c = tree.clone({"a": [t, (t, 1)]})
    c["a"][0].add_(1)
    assert torch.equal(t, torch.ones(3))


def test_index_order_cycles_a_copy_of_the_sampler():
    g = torch.Generator().manual_seed(0)
    loader = make_loader(PlantedDataset(n=4), batch_size=2, generator=g)
    state = g.get_state()
    spec = loader_mod.describe(loader)
    order = loader_mod.index_order(spec)
    first = [next(order) for _ in range(10)]
    assert sorted(first[:4]) == [0, 1, 2, 3] and sorted(first[4:8]) == [0, 1, 2, 3]
    assert torch.equal(g.get_state(), state)  # the user's generator did not move


def test_nbytes_and_leading_dim():
    batch = {"x": torch.zeros(8, 4), "y": torch.zeros(8, dtype=torch.int64)}
    assert tree.nbytes(batch) == 8 * 4 * 4 + 8 * 8
    assert tree.leading_dim(batch) == 8
