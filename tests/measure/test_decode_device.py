"""Decode by torchvision on the device (decode_device.py), its mechanism on the CPU
(device "cpu": the same calls as on CUDA, decode_jpeg on a list of files): the workers
read bytes, the collate keeps them as a list, the step decodes and transforms them; the
check against the user's PIL pipeline; what it refuses. On CUDA the check builds it in
place of the workers' decode (advise/fixes.py)."""

import time
import types

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate
from torchvision import datasets, transforms as T

from bisect_pipeline.advise import fixes
from bisect_pipeline.core.fixes import DECODE
from bisect_pipeline.core.isolated import Syncs
from bisect_pipeline.measure import cache, decode_device
from bisect_pipeline.measure.experiment import Experiment
from bisect_pipeline.measure.plan import Plan
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.pipeline.step import to_device
from test_decode import IMAGENET, folder  # noqa: F401  (the fixture)

CPU = torch.device("cpu")


def filled(ds, collate=None):
    kw = {} if collate is None else {"collate_fn": collate}
    return cache.fill(describe(DataLoader(ds, batch_size=4, **kw)), cache_mb=64, max_batches=2)


def move(batch):
    return to_device(batch, CPU)


def test_the_workers_read_bytes_and_the_step_decodes_and_transforms_them(folder):  # noqa: F811
    ds = datasets.ImageFolder(folder, transform=IMAGENET)
    c = filled(ds)
    made, fix = decode_device.build(c, default_collate, CPU)
    assert fix.ok and fix.kind == DECODE and fix.device == "cpu" and fix.path == "[0]"
    assert fix.moved == ("PIL decode", "RandomResizedCrop", "RandomHorizontalFlip", "ToTensor's scaling", "Normalize")
    assert "decode_jpeg(files, mode=ImageReadMode.RGB, device='cpu')" in fix.code
    dataset, collate, after = made
    x, y = dataset[0]
    assert x.dtype == torch.uint8 and x.dim() == 1 and bytes(x[:2].tolist()) == b"\xff\xd8" and y == 0
    # through a real loader with two workers: the bytes cross the workers' queue, the move leaves them on the host
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate)
    batch = next(iter(loader))
    assert isinstance(batch[0], decode_device.Encoded) and len(batch[0]) == 4 and batch[1].tolist() == [0, 0, 0, 0]
    images, labels = after(move(batch))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32 and labels.shape == (4,)
    # the check: the user's batch and this one under the same draws, within a grey level
    f = decode_device.check(fix, c.dataset, made, default_collate, move)
    assert f.usable and f.samples == 8 and f.mismatch is None and f.mean_difference <= f.tolerance
    assert ds.loader is datasets.folder.default_loader and ds.transform is IMAGENET  # the user's, as they were


def test_what_it_cannot_take_is_unavailable_with_the_reason(folder, tmp_path):  # noqa: F811
    ds = datasets.ImageFolder(folder, transform=IMAGENET)
    mine = lambda samples: default_collate(samples)  # noqa: E731
    assert "collate_fn is not the default one" in decode_device.build(filled(ds, mine), mine, CPU)[1].reason
    (tmp_path / "c0").mkdir()
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "c0" / "a.png")
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "c0" / "b.jpg")
    png = datasets.ImageFolder(str(tmp_path), transform=T.Compose([T.Resize(8), T.ToTensor()]))
    _, fix = decode_device.build(filled(png), default_collate, CPU)
    assert fix.status == "unavailable" and "1 of the dataset's 2 files are not JPEG files" in fix.reason
    tensors = torch.utils.data.TensorDataset(torch.zeros(8, 3))
    assert "loader" in decode_device.build(filled(tensors), default_collate, CPU)[1].reason


def test_on_cuda_the_check_builds_the_device_decode_in_place_of_the_workers(folder):  # noqa: F811
    ds = datasets.ImageFolder(folder, transform=IMAGENET)
    c = filled(ds)
    spec = describe(DataLoader(ds, batch_size=4))
    exp = types.SimpleNamespace(caches=c, spec=spec, device=torch.device("cuda"), move=move)
    (fix,), variants = fixes._decode(exp)
    assert fix.device == "cuda" and fix.kind == DECODE
    if torch.cuda.is_available():  # checked on the device: usable, its Variant with its collate and its step side
        assert fix.usable and variants[DECODE].collate is not None and variants[DECODE].after is not None
    else:  # this machine has no CUDA: decode_jpeg(device="cuda") raises in the check, and the fix is not offered
        assert fix.status == "failed" and fix.reason.startswith("the decoded copy raised") and not variants
    exp.device = CPU  # on the CPU: the workers' decode, as before
    (fix,), variants = fixes._decode(exp)
    assert fix.device is None and fix.usable and variants[DECODE].collate is None


def test_a_visit_of_full_runs_the_variant_through_the_user_s_loader_settings(folder, monkeypatch):  # noqa: F811
    # the check's visit of the fix (verify.py: Experiment.open with the Variant), its loader with two workers
    monkeypatch.setattr(fixes, "DECODE_ON", ("cpu",))
    spec = describe(DataLoader(datasets.ImageFolder(folder, transform=IMAGENET), batch_size=4, num_workers=2))
    exp = Experiment(spec, CPU, Plan(), time.perf_counter, lambda e: None, None, start=0.0, end=1e9, deadline=1e9)
    exp.caches, exp.move = cache.fill(spec, cache_mb=64, max_batches=2), move
    (fix,), variants = fixes._decode(exp)
    assert fix.usable and fix.device == "cpu" and fix.syncs is None  # counted on CUDA only (phases.py)
    counted = []
    (fix,), _ = fixes._decode(exp, lambda fn, batch: counted.append(fn(batch)) or Syncs(steps=1, total=0, per_step=0.0))
    assert fix.syncs["per_step"] == 0.0 and counted[0][0].shape == (4, 3, 32, 32)  # the step side, on a batch of files
    with exp.open("full", variant=variants[DECODE]) as (next_batch, transfer):
        batches = [transfer(next_batch()) for _ in range(3)]
    assert all(x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (4,) for x, y in batches)
