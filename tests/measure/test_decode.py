"""Decode by torchvision: an ImageFolder's PIL loader swapped for torchvision's decoder,
its transforms adapted to a tensor, and the check of shapes and pixel difference."""

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Subset, default_collate
from torchvision import datasets, transforms as T

from bisect_pipeline.core.fixes import DECODE
from bisect_pipeline.measure import cache, decode
from bisect_pipeline.pipeline.loader import describe
from conftest import Preset


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:60, 0:80]
    for i in range(12):
        (root / f"c{i % 2}").mkdir(exist_ok=True)
        base = np.stack([(x * 2 + 7 * i) % 256, (y * 3) % 256, (x + y) % 256], -1)
        arr = np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(root / f"c{i % 2}" / f"{i}.jpg", quality=90)
    return str(root)


def built(ds):
    c = cache.fill(describe(DataLoader(ds, batch_size=4)), cache_mb=64, max_batches=2)
    return c, decode.build(c)


IMAGENET = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


def test_an_image_folder_gets_the_decode_fix_checked_within_a_grey_level(folder):
    ds = datasets.ImageFolder(folder, transform=IMAGENET)
    c, (made, fix) = built(ds)
    assert fix.ok and fix.kind == DECODE and fix.where == "dataset.loader" and fix.moved == ("PIL decode",)
    assert fix.kept == ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor's scaling", "Normalize")
    dataset, transform = made
    assert transform == "dataset.transform" and "decode_jpeg" in fix.code
    f = decode.check(fix, c.dataset, dataset, default_collate, lambda b: b)
    assert f.usable and f.samples == 8 and f.mismatch is None
    assert f.level == pytest.approx(f.level) and f.mean_difference <= f.tolerance == pytest.approx(f.level)
    x, y = dataset[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert ds.loader is datasets.folder.default_loader and ds.transform is IMAGENET  # the user's, as they were


def test_uint8_outputs_are_compared_in_grey_levels(folder):
    ds = Subset(datasets.ImageFolder(folder, transform=T.Compose([T.Resize(24), T.CenterCrop(24), T.PILToTensor()])),
                list(range(10)))
    c, (made, fix) = built(ds)
    assert fix.where == "dataset.dataset.loader" and fix.kept == ("Resize", "CenterCrop")
    f = decode.check(fix, c.dataset, made[0], default_collate, lambda b: b)
    assert f.usable and f.level == 1.0 and f.max_difference <= 3


def test_a_transform_that_needs_a_pil_image_raises_in_the_check(folder):
    ds = datasets.ImageFolder(folder, transform=T.Compose([T.Lambda(lambda im: im.convert("L")), T.ToTensor()]))
    c, (made, fix) = built(ds)
    with pytest.raises(Exception, match="convert"):
        decode.check(fix, c.dataset, made[0], default_collate, lambda b: b)


def test_a_dataset_without_a_pil_loader_is_unavailable_with_the_reason(folder):
    ds = datasets.ImageFolder(folder, transform=IMAGENET, loader=lambda p: Image.open(p).convert("RGB"))
    _, (made, fix) = built(ds)
    assert made is None and fix.status == "unavailable" and "not torchvision's PIL loader" in fix.reason
    images = torch.utils.data.TensorDataset(torch.zeros(8, 3, 4, 4), torch.zeros(8))
    _, (made, fix) = built(images)
    assert made is None and "no image files through a `loader` attribute" in fix.reason


def test_the_decoder_reads_jpegs_and_other_formats_as_rgb(folder, tmp_path):
    path = tmp_path / "grey.png"
    Image.fromarray(np.full((5, 7), 9, dtype=np.uint8), mode="L").save(path)
    png = decode.TorchvisionDecode()(path)
    assert png.shape == (3, 5, 7) and png.dtype == torch.uint8 and int(png.max()) == 9
    jpg = decode.TorchvisionDecode()(datasets.ImageFolder(folder).samples[0][0])
    assert jpg.shape == (3, 60, 80)


def test_a_preset_object_keeping_a_compose_is_adapted_in_a_copy_of_itself(folder):
    preset = Preset(32)
    c, (made, fix) = built(datasets.ImageFolder(folder, transform=preset))
    assert fix.kept == ("RandomResizedCrop", "RandomHorizontalFlip", "ConvertImageDtype", "Normalize")
    assert "dataset.transform.transforms = Compose([RandomResizedCrop(...)" in fix.code
    assert decode.check(fix, c.dataset, made[0], default_collate, lambda b: b).usable
    assert len(preset.transforms.transforms) == 5  # the user's, as it was
