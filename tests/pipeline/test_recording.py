"""Recording what the transforms get and replaying them on it (recording.py): the raw
point's replay."""

import pytest
import torch
from torch.utils.data import Dataset

from bisect_pipeline.pipeline import recording, split
from bisect_pipeline.core import tree
from bisect_pipeline.core.faults import StageError
from conftest import DictFlip, DictSamples, KeywordFlip, PlantedDataset, Segmentation


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


def test_record_and_replay_rebuild_the_sample_and_leave_the_dataset_alone():
    ds = PlantedDataset(transform=Double())
    original_transform = ds.transform
    inst = split.instrument(ds)
    assert list(inst.labels.values()) == ["dataset.transform (Double)"]
    assert ds.transform is original_transform  # the user's dataset is not touched
    sample, calls = recording.record_sample(inst, 3)
    assert len(calls) == 1 and calls[0].placements == [((), (0,))]
    assert torch.equal(calls[0].args[0], ds.data[3])  # the transform's input is cached
    replayed = recording.replay_sample(sample, calls)
    assert torch.equal(replayed[0], ds.data[3] * 2) and replayed[1] == sample[1]
    assert tree.same_structure(replayed, sample) is None


class InPlace:
    def __call__(self, x):
        return x.mul_(2)


def test_a_prepared_replay_copies_the_inputs_before_it_is_run_and_leaves_the_cache_intact():
    inst = split.instrument(PlantedDataset(transform=InPlace()))
    sample, calls = recording.record_sample(inst, 3)
    cached = calls[0].args[0].clone()
    run = recording.prepared_sample(sample, calls)  # the copy is made here, not inside run()
    calls[0].args[0].add_(100)
    assert torch.equal(run()[0], cached * 2)
    calls[0].args[0].sub_(100)
    assert torch.allclose(calls[0].args[0], cached, atol=1e-4)  # the in-place transform changed its copy only


def test_joint_transform_outputs_are_placed_element_by_element():
    inst = split.instrument(Joint())
    sample, calls = recording.record_sample(inst, 2)
    assert calls[0].placements == [((0,), (0,)), ((1,), (1,))]
    again = recording.replay_sample(sample, calls)
    assert torch.equal(again[0], torch.full((2, 2), 6.0)) and torch.equal(again[1]["boxes"], torch.ones(4))


class Unpacked(Joint):
    """Returns the joint transform's target dict unpacked into the sample."""

    def __getitem__(self, i):
        img, tgt = super().__getitem__(i)
        return img, tgt["boxes"], i


def test_the_parts_of_a_nested_output_are_placed_where_getitem_unpacked_them():
    ds = Unpacked()
    sample, calls = recording.record_sample(split.instrument(ds), 1)
    assert calls[0].placements == [((0,), (0,)), ((1, "boxes"), (1,))]
    assert same(recording.replay_sample(sample, calls), ds[1])


def test_output_changed_after_the_transform_refuses_the_split():
    inst = split.instrument(PostProcessed())
    with pytest.raises(recording.SplitError, match="changed inside __getitem__"):
        recording.record_sample(inst, 0)


def same(a, b):
    """The same nesting and equal tensors (and other leaves)."""
    la, lb = list(tree.leaves(a)), list(tree.leaves(b))
    return [p for p, _ in la] == [p for p, _ in lb] and all(
        torch.equal(x, y) and x.dtype == y.dtype if isinstance(x, torch.Tensor) else x == y
        for (_, x), (_, y) in zip(la, lb))


def test_a_keyword_called_transform_returning_a_dict_that_getitem_unpacks_is_replayed():
    ds = Segmentation(KeywordFlip())
    inst = split.instrument(ds)
    sample, calls = recording.record_sample(inst, 3)
    assert calls[0].args == () and set(calls[0].kwargs) == {"image", "mask"}
    assert torch.equal(calls[0].kwargs["image"], ds.images[3])  # the transform's input is cached, by keyword
    assert calls[0].placements == [(("image",), (0,)), (("mask",), (1,))]
    assert same(recording.replay_sample(sample, calls), ds[3])


def test_a_dict_in_dict_out_transform_is_replayed_into_the_values_getitem_returns():
    ds = DictSamples(DictFlip())
    sample, calls = recording.record_sample(split.instrument(ds), 5)
    assert torch.equal(calls[0].args[0]["image"], ds.images[5])
    assert calls[0].placements == [(("image",), (0,)), (("label",), (1,))]
    assert same(recording.replay_sample(sample, calls), ds[5])


def test_a_part_of_the_output_changed_after_the_transform_refuses_saying_what_to_move():
    inst = split.instrument(Segmentation(KeywordFlip(), long_mask=True))
    with pytest.raises(recording.SplitError) as err:
        recording.record_sample(inst, 0)
    msg = str(err.value)
    assert msg.startswith("dataset.transform(...)['mask'] is changed inside __getitem__")
    assert "inside the transform" in msg and "image" not in msg.split("is changed")[0]


def test_a_tentative_proxy_blames_no_stage_until_it_is_settled_as_a_transform():
    def boom(x):
        raise ValueError("bad input")

    proxy = recording.RecordingTransform(boom, "dataset.aug", recording.Recorder(), tentative=True)
    with pytest.raises(ValueError):  # untouched: the fill reports it as loading
        proxy(torch.ones(1))
    proxy.stage = "augment"
    with pytest.raises(StageError, match="augment failed: ValueError: bad input"):
        proxy(torch.ones(1))


class Images(Dataset):
    """28x28 grey PIL images and an int label, then `transform` (MNIST's shape)."""

    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return 4

    def __getitem__(self, i):
        from PIL import Image

        return self.transform(Image.new("L", (28, 28), color=i * 10)), i


def _stamp(img):
    img.paste(255, (0, 0, 4, 4))  # changes its input in place
    return torch.zeros(1)


def _to_tensor(img):
    return torch.tensor(list(img.getdata()), dtype=torch.float32).view(1, 28, 28)


def test_an_image_input_replaying_leaves_alone_is_not_copied_and_one_it_changes_is():
    changes: set = set()
    inst = split.instrument(Images(_to_tensor))
    sample, calls = recording.record_sample(inst, 1)
    recording.settle_copies(sample, calls, changes)
    assert changes == set() and [c.copy_input for c in calls] == [False]
    assert recording.replay_sample(sample, calls)[0][0, 0, 0] == 10
    # a transform that pastes into its input: copied, and its recorded input kept as it was
    stamping = split.instrument(Images(_stamp))
    sample, calls = recording.record_sample(stamping, 2)
    recording.settle_copies(sample, calls, changes)
    assert changes == {"dataset.transform"} and calls[0].copy_input
    assert calls[0].args[0].getpixel((0, 0)) == 20  # restored after the trial replay
    recording.replay_sample(sample, calls)
    assert calls[0].args[0].getpixel((0, 0)) == 20  # copied from then on
    _, later = recording.record_sample(stamping, 3)
    recording.mark_copies(later, changes)
    assert later[0].copy_input


def test_a_tensor_input_is_always_copied():
    inst = split.instrument(PlantedDataset(n=4, transform=Double()))
    sample, calls = recording.record_sample(inst, 0)
    recording.settle_copies(sample, calls, set())
    assert calls and all(c.copy_input for c in calls)
