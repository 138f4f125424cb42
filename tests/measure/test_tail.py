"""The device tail: which transforms move, the moved pipeline built from the cache, and
the check that refuses a tail whose batched output differs."""

import random

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, default_collate
from torchvision import transforms as T
from torchvision.transforms import v2

from bisect_pipeline.core.fixes import DEVICE_AUGMENT, DEVICE_TAIL
from bisect_pipeline.measure import cache, tail
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.pipeline.split import replaced
from conftest import Preset


class Pictures(Dataset):
    """PIL images made from a seed (`mode` L, RGB or F), `vary`: heights that differ."""

    def __init__(self, transform, mode="RGB", vary=False, n=32):
        self.transform, self.mode, self.vary, self.n = transform, mode, vary, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        h = 20 + (i % 3 if self.vary else 0)
        if self.mode == "F":
            return self.transform(Image.fromarray(rng.uniform(0, 4000, (h, 16)).astype(np.float32), mode="F")), i % 3
        shape = (h, 16, 3) if self.mode == "RGB" else (h, 16)
        return self.transform(Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=self.mode)), i % 3


def filled(ds, collate_fn=None):
    kw = {"collate_fn": collate_fn} if collate_fn else {}
    return cache.fill(describe(DataLoader(ds, batch_size=8, **kw)), cache_mb=64, max_batches=3)


def checked(ds, collate=default_collate):
    c = filled(ds, collate if collate is not default_collate else None)
    fixes, usable = tail.checked(c, collate, lambda b: b)
    return {f.kind: f for f in fixes}, usable, c


MNIST = T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))])


def test_tototensor_is_split_and_the_moved_pipeline_matches_with_a_quarter_of_the_payload():
    fixes, usable, _ = checked(Pictures(MNIST, mode="L"))
    f = fixes[DEVICE_TAIL]
    assert f.usable and f.moved == ("ToTensor's scaling", "Normalize") and f.kept == ("PILToTensor",)
    assert f.max_difference == 0.0 and f.samples == 16 and f.batches == 2 and f.random == ()
    assert f.before == {"dtype": "float32", "bytes": 8 * 20 * 16 * 4, "shape": [8, 1, 20, 16]}
    assert f.after == {"dtype": "uint8", "bytes": 8 * 20 * 16, "shape": [8, 1, 20, 16]}
    assert DEVICE_AUGMENT not in fixes  # nothing random to move
    assert "PILToTensor()" in f.code and "Normalize(" in f.code and "batch[0] = tail(batch[0].to(device" in f.code


def test_the_tail_stops_at_the_first_transform_that_is_not_exact_on_a_batch():
    transform = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(12), v2.ColorJitter(0.3, 0.3),
                            v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.2] * 3)])
    fixes, usable, _ = checked(Pictures(transform))
    exact, moved = fixes[DEVICE_TAIL], fixes[DEVICE_AUGMENT]
    assert exact.usable and exact.moved == ("ToDtype", "Normalize") and exact.kept == ("ToImage", "RandomResizedCrop",
                                                                                         "ColorJitter")
    assert exact.before["dtype"] == "float32" and exact.after["dtype"] == "uint8"
    # the random candidate: every tensor transform that takes a batch, one draw for all of it
    assert moved.usable and moved.moved == ("RandomResizedCrop", "ColorJitter", "ToDtype", "Normalize")
    assert moved.random == ("RandomResizedCrop", "ColorJitter") and moved.max_difference is None
    assert isinstance(usable[DEVICE_AUGMENT].head, v2.Compose)


def test_a_random_start_whose_images_differ_in_size_gives_way_to_a_later_one():
    transform = T.Compose([T.RandomResizedCrop(12), T.RandomHorizontalFlip(), T.ToTensor()])
    fixes, _, _ = checked(Pictures(transform, vary=True))
    assert fixes[DEVICE_AUGMENT].usable and fixes[DEVICE_AUGMENT].moved == ("RandomHorizontalFlip",
                                                                          "ToTensor's scaling")
    assert fixes[DEVICE_AUGMENT].kept == ("RandomResizedCrop", "PILToTensor")


def test_a_tail_whose_batched_output_differs_is_refused_with_the_difference_said():
    # a float image: ToTensor does not scale it, so its split (PILToTensor, / 255) is not ToTensor
    fixes, usable, _ = checked(Pictures(T.Compose([T.ToTensor(), T.Normalize((100.0,), (50.0,))]), mode="F"))
    f = fixes[DEVICE_TAIL]
    assert f.ok and not f.matches and not f.usable and DEVICE_TAIL not in usable
    assert f.max_difference > 1.0 and f.mismatch.startswith("values differ by up to")


def test_a_collate_fn_that_changes_the_images_refuses_the_tail():
    def doubled(samples):
        x, y = default_collate(samples)
        return [x * 2, y]
    fixes, _, _ = checked(Pictures(MNIST, mode="L"), doubled)
    assert not fixes[DEVICE_TAIL].matches


def test_a_moved_pipeline_that_raises_is_failed_with_the_error():
    fixes, usable, _ = checked(Pictures(MNIST, mode="L"), lambda samples: default_collate(
        [(s[0].float(), s[1]) if s[0].dtype == torch.float32 else (s[0] + "x", s[1]) for s in samples]))
    assert fixes[DEVICE_TAIL].status == "failed" and "raised TypeError" in fixes[DEVICE_TAIL].reason
    assert not usable


@pytest.mark.parametrize("transform, why", [
    (T.Compose([T.ToTensor(), T.Lambda(lambda x: x)]), "nothing at its end runs the same on a batch"),
    (lambda im: T.functional.to_tensor(im), "not a torchvision Compose or transform"),
])
def test_no_tail_says_why(transform, why):
    fixes, usable, _ = checked(Pictures(transform, mode="L"))
    assert not usable and fixes[DEVICE_TAIL].status == "unavailable" and why in fixes[DEVICE_TAIL].reason


def test_a_single_transform_is_a_tail_of_its_own():
    fixes, usable, _ = checked(Pictures(T.ToTensor(), mode="L"))
    assert fixes[DEVICE_TAIL].usable and fixes[DEVICE_TAIL].kept == ("PILToTensor",)
    assert isinstance(usable[DEVICE_TAIL].head, T.PILToTensor)


def test_the_check_leaves_the_users_random_states_and_dataset_as_they_were():
    ds = Pictures(T.Compose([T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize((0.5,), (0.2,))]), mode="L")
    c = filled(ds)
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    fixes, usable = tail.checked(c, default_collate, lambda b: b)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()
    split = usable[DEVICE_TAIL]
    moved = replaced(c.dataset, split.call, split.head)
    x, _ = moved[0]
    assert x.dtype == torch.uint8 and ds[0][0].dtype == torch.float32  # the user's dataset still returns floats
    assert c.dataset.transform.fn is ds.transform  # the cache's copy keeps the user's transform
    batch = split.tail([x[None], torch.tensor([0])])
    assert batch[0].dtype == torch.float32 and batch[0].shape == (1, 1, 20, 16)


def test_a_preset_object_keeping_a_compose_is_split_in_a_copy_of_itself():
    preset = Preset(12)
    fixes, usable, _ = checked(Pictures(preset))
    f, split = fixes[DEVICE_TAIL], usable[DEVICE_TAIL]
    assert f.usable and f.moved == ("ConvertImageDtype", "Normalize") and f.max_difference == 0.0
    assert isinstance(split.head, Preset) and split.head is not preset and len(preset.transforms.transforms) == 5
    assert [type(t).__name__ for t in split.head.transforms.transforms] == ["RandomResizedCrop", "RandomHorizontalFlip",
                                                                          "PILToTensor"]
    assert f.code.startswith("dataset.transform.transforms = Compose([RandomResizedCrop(")
