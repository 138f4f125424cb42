"""Hugging Face `datasets` end to end: a Dataset whose format transform (with_transform /
set_transform) is the augment stage, read by a DataLoader. Offline: nothing is downloaded."""

import io
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from bisect_pipeline import bisect  # noqa: E402
from conftest import CLASSES, FAST_PLAN, FEATURES, LONG_EPOCHS, TINY_PLAN, Sleep, SleepLayer, all_measured, assert_names, tiny_model  # noqa: E402

pytestmark = pytest.mark.e2e  # end to end on real loaders: not in the fast subset

datasets = pytest.importorskip("datasets")

MAX_S = 8
SIZE = 16


@pytest.fixture(autouse=True)
def offline(monkeypatch):  # one intra-op thread comes from conftest
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def run(model, loader, max_seconds=MAX_S, **kw):
    # the bisection is under test: it may use the whole time (no advice check)
    return bisect(model, loader, device="cpu", max_seconds=max_seconds, plan=FAST_PLAN, verify_seconds=0, **kw)


def statuses(report):
    return {p.point: p.status for p in report.points}


class ToTensors:
    """A format transform: a batch of rows (dict of lists) -> tensors, with a planted cost
    per row (module level: it crosses to the workers)."""

    def __init__(self, ms_per_row):
        self.sleep = Sleep(ms_per_row)

    def __call__(self, batch):
        for _ in batch["x"]:
            self.sleep(None)
        return {"inputs": [torch.tensor(x, dtype=torch.float32) for x in batch["x"]],
                "targets": [int(y) for y in batch["y"]]}


def table(n=64):
    rng = np.random.default_rng(0)
    return datasets.Dataset.from_dict({"x": rng.standard_normal((n, FEATURES)).astype(np.float32).tolist(),
                                       "y": [i % CLASSES for i in range(n)]})


def test_with_transform_is_the_augment_stage():
    ds = table().with_transform(ToTensors(6.0))
    report = run(tiny_model(2.0), DataLoader(ds, batch_size=8, shuffle=True))
    assert statuses(report) == all_measured(report), str(report)
    assert_names(report, "augment")
    assert list(report.cache.raw_transforms) == ["dataset format transform (ToTensors, with_transform/set_transform)"]
    # the user's dataset keeps its own format transform
    assert isinstance(ds._format_kwargs["transform"], ToTensors)


def jpeg_bytes(rng):
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


class ImagesToTensors:
    """set_transform on an Image column: the rows arrive decoded (PIL: decoding is load)."""

    def __init__(self, ms_per_row):
        self.sleep = Sleep(ms_per_row)

    def __call__(self, batch):
        out = []
        for img in batch["image"]:
            self.sleep(None)
            out.append(torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.float32)).permute(2, 0, 1) / 255)
        return {"pixel_values": out, "label": batch["label"]}


def test_set_transform_on_an_image_column_with_workers(no_leftover_workers):
    rng = np.random.default_rng(1)
    jpegs = [jpeg_bytes(rng) for _ in range(48)]  # in epochs of LONG_EPOCHS rows: their start is not timed
    ds = datasets.Dataset.from_dict({"image": [{"bytes": jpegs[i % 48], "path": None} for i in range(LONG_EPOCHS)],
                                     "label": [i % 2 for i in range(LONG_EPOCHS)]},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.Value("int64")}))
    ds.set_transform(ImagesToTensors(10.0))  # JPEG decode (load): ~1 ms a row on a busy machine
    torch.manual_seed(0)
    model = nn.Sequential(SleepLayer(2.0), nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 2))
    seen = []

    def step(batch):  # dict batch: the default step's keys (pixel_values, label) are found too
        seen.append((batch["pixel_values"].dtype, tuple(batch["pixel_values"].shape[1:])))
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(batch["pixel_values"]), batch["label"]).backward()
        opt.step()

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, multiprocessing_context="fork")
    # 20 s: two workers on a busy 2-core machine give windows +-10-20% at full and raw,
    # and 8 s (2 rounds) has left load's noise (3.6 +- 5.8 ms) too wide to rank augment first
    report = run(model, loader, max_seconds=20, optimizer=opt, step=step)
    assert statuses(report) == all_measured(report), str(report)
    assert_names(report, "augment")
    assert set(seen) == {(torch.float32, (3, SIZE, SIZE))}


class KeepImage:
    """A format transform that hands the decoded image on untouched (a later transform, in
    the step, works on it): the replayed row holds a copy of the image (a plain PIL Image),
    the real one the JpegImageFile the Image feature decoded."""

    def __init__(self, ms_per_row):
        self.sleep = Sleep(ms_per_row)

    def __call__(self, batch):
        for _ in batch["image"]:
            self.sleep(None)
        return {"image": list(batch["image"]), "label": batch["label"]}


def pil_collate(rows):
    x = torch.stack([torch.from_numpy(np.asarray(r["image"].convert("RGB"), dtype=np.float32)) for r in rows])
    return x.permute(0, 3, 1, 2) / 255, torch.tensor([r["label"] for r in rows])


def test_an_image_feature_over_jpeg_bytes_keeps_the_raw_point():
    # The split check compared types strictly ("Image vs JpegImageFile"): raw was unavailable.
    rng = np.random.default_rng(2)
    ds = datasets.Dataset.from_dict({"image": [{"bytes": jpeg_bytes(rng), "path": None} for _ in range(32)],
                                     "label": [i % 2 for i in range(32)]},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.Value("int64")}))
    ds = ds.with_transform(KeepImage(0.0))
    assert type(ds[0]["image"]).__name__ == "JpegImageFile"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 2))
    report = bisect(model, DataLoader(ds, batch_size=4, collate_fn=pil_collate), device="cpu", max_seconds=4,
                    plan=TINY_PLAN)
    assert statuses(report) == all_measured(report), str(report)


def test_default_step_reads_the_transformed_dict_batch():
    ds = table().with_transform(ToTensors(0.0))
    report = bisect(tiny_model(2.0), DataLoader(ds, batch_size=8, shuffle=True), device="cpu", max_seconds=4,
                    plan=TINY_PLAN)  # no step given: the default step finds "inputs" and "targets"
    assert statuses(report) == all_measured(report), str(report)


def test_dataset_without_format_transform_says_why_raw_is_unavailable():
    ds = table().with_format("torch")
    report = bisect(tiny_model(2.0), DataLoader(ds, batch_size=8, shuffle=True), device="cpu", max_seconds=4,
                    plan=TINY_PLAN)
    raw = report.point("raw")
    assert raw.status == "unavailable" and "has no format transform (its format is 'torch')" in raw.reason, str(report)
    assert "with_transform" in raw.reason
    assert all(s == all_measured(report)[p] for p, s in statuses(report).items() if p != "raw"), str(report)


class PerCallCost:
    """A format transform whose cost is per call, not per row (a tokenizer call, a model
    call): the DataLoader calls it once per batch (Dataset.__getitems__)."""

    def __init__(self, ms_per_call):
        self.sleep = Sleep(ms_per_call)

    def __call__(self, batch):
        self.sleep(None)
        return {"inputs": [torch.tensor(x, dtype=torch.float32) for x in batch["x"]],
                "targets": [int(y) for y in batch["y"]]}


def test_raw_replays_the_format_transform_once_per_batch_as_the_loader_does():
    ds = table().with_transform(PerCallCost(20.0))
    report = run(tiny_model(2.0), DataLoader(ds, batch_size=8, shuffle=True))
    assert statuses(report) == all_measured(report), str(report)
    # once per row would cost 8 x 20 ms a batch at raw against 20 ms in full: raw would be
    # several times slower than full and load would come out hugely negative
    raw, full = report.point("raw").throughput.samples_per_sec, report.point("full").throughput.samples_per_sec
    assert raw > 0.6 * full, str(report)
    assert_names(report, "augment")
