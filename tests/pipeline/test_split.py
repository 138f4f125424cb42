"""Finding the dataset's transforms to proxy (split.py): the torchvision names, and any
other callable attribute tentatively; recording and replaying them: test_recording.py."""

import pytest
import torch
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from bisect_pipeline import bisect
from bisect_pipeline.pipeline import recording, split
from conftest import (FAST_PLAN, DetectionRef, DictFlip, DictSamples, JointFlip, KeywordFlip, PlantedDataset,
                      Segmentation, Sleep, all_measured, assert_names, detection_collate, tiny_model)
from test_recording import Double, same


def test_transform_found_through_subset_and_concat():
    inner = PlantedDataset(transform=Double())
    chain = Subset(ConcatDataset([PlantedDataset(), inner]), [70])
    inst = split.instrument(chain)
    assert list(inst.labels.values()) == ["dataset.dataset.datasets[1].transform (Double)"]
    sample, calls = recording.record_sample(inst, 0)
    assert torch.equal(sample[0], inner.data[70 - 64] * 2)
    assert len(calls) == 1


def test_joint_transforms_under_a_private_name_are_found_through_a_subset_and_replayed():
    ds = DetectionRef(JointFlip())
    inst = split.instrument(Subset(ds, [5, 9]))
    assert inst.labels == {"dataset.dataset._transforms": "dataset.dataset._transforms (JointFlip)"}
    sample, calls = recording.record_sample(inst, 1)
    assert [c.name for c in calls] == ["dataset.dataset._transforms"]
    assert torch.equal(calls[0].args[0], ds.images[9])  # cached: the loaded image and target
    assert calls[0].placements == [((0,), (0,)), ((1,), (1,))]
    assert same(recording.replay_sample(sample, calls), ds[9])
    inst.settle({"dataset.dataset._transforms"})
    assert inst.dataset.dataset._transforms.stage == "augment"  # errors in it now name augment
    assert inst.found({"dataset.dataset._transforms"}) == ["dataset.dataset._transforms (JointFlip)"]
    assert ds._transforms.__class__ is JointFlip  # the user's dataset is not touched


class ReadFrom:
    """A loader object, as ImageFolder's `loader=`: reads a sample by its path."""

    def __init__(self, store):
        self.store = store

    def __call__(self, path):
        return self.store[path].clone()


class Other:
    pass


class FolderLike(Dataset):
    """A loader called with a path, a transform under a private name, and callable
    attributes that are no transforms: a bound method, a class, a builtin, a dataset."""

    def __init__(self):
        self.paths = [f"img{i}.jpg" for i in range(4)]
        self.loader = ReadFrom({p: torch.full((3,), float(i)) for i, p in enumerate(self.paths)})
        self._aug = Double()
        self.fetch = self.read
        self.kind = Other
        self.clip = min
        self.base = PlantedDataset(n=4, transform=Sleep(0))

    def read(self, i):
        return self.loader(self.paths[i])

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        x = self.loader(self.paths[i])
        if self._aug is not None:
            x = self._aug(x)
        return x, i


def test_a_loader_called_with_a_path_stays_with_loading_and_other_callables_are_not_proxied():
    ds = FolderLike()
    inst = split.instrument(ds)
    assert list(inst.labels) == ["dataset.loader", "dataset._aug"]  # not the method, class, builtin, dataset
    sample, calls = recording.record_sample(inst, 2)
    assert [c.name for c in calls] == ["dataset._aug"] and torch.equal(calls[0].args[0], torch.full((3,), 2.0))
    assert "dataset.loader is called with names only" in inst.dropped["dataset.loader"]
    assert same(recording.replay_sample(sample, calls), ds[2])
    inst.settle({"dataset._aug"})
    assert inst.dataset.loader is ds.loader  # taken off the copy: `full` runs the user's loader itself
    assert inst.found({"dataset._aug"}) == ["dataset._aug (Double)"]


class Normalized(Dataset):
    """A callable attribute whose output __getitem__ changes (+ 1) before the declared
    transform: not replayable, it stays with loading; the transform is replayed."""

    def __init__(self):
        self._normalize = Double()
        self.transform = Sleep(0)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        x = self._normalize(torch.full((2,), float(i))) + 1
        return self.transform(x), i


def test_a_tentative_callable_whose_output_is_changed_stays_with_loading():
    inst = split.instrument(Normalized())
    sample, calls = recording.record_sample(inst, 3)
    assert [c.name for c in calls] == ["dataset.transform"]
    assert torch.equal(calls[0].args[0], torch.full((2,), 7.0))  # the transform's input: after _normalize
    assert inst.dropped["dataset._normalize"].startswith("the output of dataset._normalize is changed")
    inst.settle({"dataset.transform"})
    assert isinstance(inst.dataset._normalize, Double)


# End to end: `raw` is measured on each shape and the verdict names the planted stage. 5 ms
# a sample (40 ms a batch of 8) where it is planted, against a 2 ms step and nothing else.
MS = 5.0
PRIVATE = "dataset.dataset._transforms (JointFlip)"
E2E = {
    "augment in self._transforms, in a Subset": (
        lambda: Subset(DetectionRef(JointFlip(MS)), list(range(48))), detection_collate, PRIVATE, "augment"),
    "load before self._transforms, in a Subset": (
        lambda: Subset(DetectionRef(JointFlip(), load_ms=MS), list(range(48))), detection_collate, PRIVATE, "load"),
    "augment in a keyword-called transform whose dict is unpacked": (
        lambda: Segmentation(KeywordFlip(MS)), None, "dataset.transform (KeywordFlip)", "augment"),
    "load before a dict-in, dict-out transform": (
        lambda: DictSamples(DictFlip(), load_ms=MS), None, "dataset.transform (DictFlip)", "load"),
}


def segmentation_step(model, opt):
    """The step of a segmentation batch (images, uint8 masks): the tiny classifier learns
    each mask's first class."""
    def step(batch):
        images, masks = batch
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), masks[:, 0].long()).backward()
        opt.step()
    return step


@pytest.mark.e2e
@pytest.mark.parametrize("case", list(E2E))
def test_raw_is_measured_and_the_planted_stage_named_in_each_shape(case):
    make, collate, found, stage = E2E[case]
    ds = make()
    model = tiny_model(2.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = segmentation_step(model, opt) if isinstance(ds, Segmentation) else None
    loader = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate)
    report = bisect(model, loader, optimizer=opt, step=step, device="cpu", max_seconds=10, plan=FAST_PLAN,
                    verify_seconds=0)
    assert {p.point: p.status for p in report.points} == all_measured(report), str(report)
    assert list(report.cache.raw_transforms) == [found]
    assert_names(report, stage)
