"""torchvision pipelines end to end: ImageFolder over real JPEG files, transforms.v2 with
joint (image, target) transforms, FakeData, Subset/ConcatDataset chains, and
datasets.wrap_dataset_for_transforms_v2."""

import os

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Subset
from torchvision import datasets, tv_tensors
from torchvision.transforms import v2

from bisect_pipeline import bisect
from conftest import FAST_PLAN, LONG_EPOCHS, TINY_PLAN, Sleep, SleepLayer, all_measured, assert_names

pytestmark = pytest.mark.e2e  # end to end on real loaders: not in the fast subset

MAX_S = 8
SIZE = 32


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a 2-core machine shared with other jobs, OpenMP threads
    that spin-wait for a descheduled sibling make CPU steps erratic (10x spikes)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_jpegs(root, classes=2, per_class=8, size=40):
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(root / f"class{c}", exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.jpg", quality=90)
    return root


def image_model(step_ms=2.0, classes=2):
    torch.manual_seed(0)
    return nn.Sequential(SleepLayer(step_ms), nn.Flatten(), nn.Linear(3 * SIZE * SIZE, classes))


def v2_train(extra_ms=0.0):
    steps = [v2.ToImage(), v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip(),
             v2.ToDtype(torch.float32, scale=True)]
    if extra_ms:
        steps.insert(0, Sleep(extra_ms))
    return v2.Compose(steps)


class SlowPilLoader:
    """ImageFolder's default loader (open + decode to RGB) plus a planted read cost."""

    def __init__(self, ms):
        self.sleep = Sleep(ms)

    def __call__(self, path):
        self.sleep(None)
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")


def run(model, loader, max_seconds=MAX_S, plan=FAST_PLAN, **kw):
    # the bisection is under test: it may use the whole time (no advice check)
    return bisect(model, loader, device="cpu", max_seconds=max_seconds, plan=plan, verify_seconds=0, **kw)


def statuses(report):
    return {p.point: p.status for p in report.points}




def loader_of(ds, num_workers=0, batch_size=8, **kw):
    if num_workers:
        kw.setdefault("multiprocessing_context", "fork")
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=num_workers, **kw)


def test_imagefolder_decode_cost_lands_in_load(tmp_path):
    root = write_jpegs(tmp_path / "imgs")
    ds = datasets.ImageFolder(root, transform=v2_train(), loader=SlowPilLoader(6.0))
    transform_before = ds.transform
    report = run(image_model(), loader_of(ds))
    assert statuses(report) == all_measured(report), str(report)
    assert_names(report, "load")
    assert any("dataset.transform (Compose)" in t for t in report.cache.raw_transforms)
    assert ds.transform is transform_before  # the user's dataset is untouched


class JointDetection(torch.utils.data.Dataset):
    """A detection-style dataset: JPEG image and a target dict with tv_tensors boxes; a
    joint v2 transform on (image, target) through `self.transforms`."""

    def __init__(self, root, transforms=None):
        self.paths = sorted(str(p) for p in root.rglob("*.jpg"))
        self.transforms = transforms

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            img = Image.open(f).convert("RGB")
        w, h = img.size
        target = {"boxes": tv_tensors.BoundingBoxes([[2, 2, w // 2, h // 2]], format="XYXY", canvas_size=(h, w)),
                  "labels": torch.tensor([i % 2])}
        if self.transforms is not None:
            img, target = self.transforms(img, target)
        return img, target


def detection_collate(samples):
    images = torch.stack([s[0] for s in samples])
    return images, [s[1] for s in samples]


def test_joint_v2_transforms_on_image_and_target(tmp_path):
    root = write_jpegs(tmp_path / "imgs")
    joint = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(p=1.0), v2.Resize((SIZE, SIZE), antialias=True),
                        v2.ToDtype(torch.float32, scale=True)])
    ds = JointDetection(root, transforms=joint)
    model = image_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []

    def step(batch):
        images, targets = batch
        seen.append(type(targets[0]["boxes"]))
        labels = torch.cat([t["labels"] for t in targets])
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()

    # what was replayed and measured, no verdict: one round (TINY_PLAN)
    report = run(model, loader_of(ds, collate_fn=detection_collate), optimizer=opt, step=step, plan=TINY_PLAN)
    assert statuses(report) == all_measured(report), str(report)
    assert list(report.cache.raw_transforms) == ["dataset.transforms (Compose)"]
    # the joint transform was replayed on (image, target): boxes stay tv_tensors, resized
    assert set(seen) == {tv_tensors.BoundingBoxes}


def test_fakedata_with_workers(tmp_path, no_leftover_workers):
    # FakeData draws its image on the CPU (0.5 ms a sample alone, 5 ms on a busy 2-core machine with
    # two workers): the planted augment cost is 15 ms a sample so that augment stays well ahead of load,
    # in batches of 4 so that a batch (30 ms from two workers) leaves room for several windows.
    # (epochs long enough that their start is not timed: conftest.LONG_EPOCHS)
    ds = datasets.FakeData(size=LONG_EPOCHS, image_size=(3, SIZE, SIZE), num_classes=2,
                           transform=v2_train(extra_ms=15.0))
    # bursty: 2 workers; 20 s has ended inconclusive on a busy machine (full, raw +-40%)
    report = run(image_model(), loader_of(ds, num_workers=2, batch_size=4), max_seconds=30)
    assert statuses(report) == all_measured(report), str(report)
    assert_names(report, "augment")


def test_wrap_dataset_for_transforms_v2_in_subset_and_concat_chain(tmp_path):
    root = write_jpegs(tmp_path / "imgs")
    plain = datasets.ImageFolder(root, transform=v2_train(extra_ms=6.0))
    wrapped = datasets.wrap_dataset_for_transforms_v2(datasets.ImageFolder(root, transform=v2_train(extra_ms=6.0)))
    transforms_before = wrapped.transforms
    chain = Subset(ConcatDataset([plain, wrapped]), list(range(0, 32)))
    report = run(image_model(), loader_of(chain))
    assert statuses(report) == all_measured(report), str(report)
    assert_names(report, "augment")
    found = report.cache.raw_transforms
    assert "dataset.dataset.datasets[0].transform (Compose)" in found
    assert any(t.startswith("dataset.dataset.datasets[1].transforms") and "wrap_dataset_for_transforms_v2" in t
               for t in found), found
    # the wrapper keeps the transforms on itself and None on the inner dataset: both as they were
    assert wrapped.transforms is transforms_before and wrapped._dataset.transform is None


def pil_collate(samples):
    images = [v2.functional.to_dtype(v2.functional.to_image(s[0]), torch.float32, scale=True)[:, :SIZE, :SIZE]
              for s in samples]
    return torch.stack(images), torch.tensor([s[1] for s in samples])


def test_wrapped_dataset_without_transforms_says_why_raw_is_unavailable(tmp_path):
    root = write_jpegs(tmp_path / "imgs")
    ds = datasets.wrap_dataset_for_transforms_v2(datasets.ImageFolder(root))
    report = bisect(image_model(), loader_of(ds, collate_fn=pil_collate), device="cpu", max_seconds=4,
                    plan=TINY_PLAN)
    raw = report.point("raw")
    assert raw.status == "unavailable" and "no per-sample transform" in raw.reason
    assert all(s == all_measured(report)[p] for p, s in statuses(report).items() if p != "raw"), str(report)
