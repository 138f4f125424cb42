"""timm end to end: `timm.data.create_loader` returns a PrefetchLoader around the real
DataLoader that converts and normalizes each batch on the device. The bisection runs on
the inner DataLoader and that device-side work runs in the step, at every point.
Offline: a timm ImageDataset over JPEG files written here, a tiny model, no weights."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402
from torchvision import transforms as T  # noqa: E402

from bisect_pipeline import BisectError, bisect  # noqa: E402
from conftest import FAST_PLAN, TINY_PLAN, Sleep, SleepLayer, all_measured, assert_names  # noqa: E402

pytestmark = pytest.mark.e2e  # end to end on real loaders: not in the fast subset

timm_data = pytest.importorskip("timm.data")

MAX_S = 8
SIZE = 16


@pytest.fixture(autouse=True)
def offline(monkeypatch):  # one intra-op thread comes from conftest
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_jpegs(root, classes=2, per_class=12, size=24):
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(root / f"class{c}", exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / f"class{c}" / f"{i}.jpg")
    return str(root)


class Probe(nn.Module):
    """Records what reaches the model: dtype and the mean of the first batch it sees."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self.zeros = []  # share of exact zeros: what timm's 'const' random erasing writes

    def forward(self, x):
        if len(self.seen) < 64:
            self.seen.append((x.dtype, float(x.float().mean())))
            self.zeros.append(float((x == 0).float().mean()))
        return x


def model(step_ms=2.0):
    torch.manual_seed(0)
    return nn.Sequential(Probe(), SleepLayer(step_ms), nn.Flatten(), nn.Linear(3 * SIZE * SIZE, 2))


def timm_loader(root, num_workers=0, augment_ms=0.0, batch_size=8, **kw):
    ds = timm_data.ImageDataset(root)
    loader = timm_data.create_loader(ds, input_size=(3, SIZE, SIZE), batch_size=batch_size, is_training=True,
                                     use_prefetcher=True, device=torch.device("cpu"), num_workers=num_workers,
                                     persistent_workers=False, **kw)
    if augment_ms:  # a planted cost in front of timm's own training transforms
        ds.transform = T.Compose([Sleep(augment_ms), ds.transform])
    return loader


def run(m, loader, **kw):
    return bisect(m, loader, device="cpu", max_seconds=MAX_S, plan=FAST_PLAN, **kw)


def statuses(report):
    return {p.point: p.status for p in report.points}


def test_prefetch_loader_is_unwrapped_and_normalizes_inside_the_step(tmp_path):
    loader = timm_loader(write_jpegs(tmp_path / "imgs"), augment_ms=6.0)
    assert type(loader).__name__ == "PrefetchLoader"
    m = model()
    report = run(m, loader)
    assert statuses(report) == all_measured(report), str(report)
    assert_names(report, "augment")
    assert list(report.cache.raw_transforms) == ["dataset.transform (Compose)"]
    # the loader yields uint8 batches (fast_collate); the step saw them converted and
    # normalized, as the PrefetchLoader does on the device: float32, about zero-mean
    assert report.loader["collate_fn"] == "fast_collate"
    dtypes = {dt for dt, _ in m[0].seen}
    assert dtypes == {torch.float32}, m[0].seen
    assert all(abs(mean) < 3.0 for _, mean in m[0].seen), m[0].seen  # uint8 would average ~128
    assert max(m[0].zeros) < 0.01  # no random erasing asked for: none done


def test_random_erasing_on_the_device_is_kept_with_workers(tmp_path, no_leftover_workers):
    loader = timm_loader(write_jpegs(tmp_path / "imgs"), num_workers=2, re_prob=1.0, batch_size=4)
    assert loader.random_erasing is not None
    m = model()
    report = bisect(m, loader, device="cpu", max_seconds=4, plan=TINY_PLAN, verify_seconds=0)
    assert statuses(report) == all_measured(report), str(report)
    # normalized and erased on the device, in the step: float32 with erased (zero) patches
    assert {dt for dt, _ in m[0].seen} == {torch.float32}
    assert min(m[0].zeros) > 0.01, m[0].zeros


def test_user_step_gets_the_normalized_batch(tmp_path):
    loader = timm_loader(write_jpegs(tmp_path / "imgs"))
    m = model(0.0)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    seen = []

    def step(batch):
        x, y = batch
        seen.append(x.dtype)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()

    report = bisect(m, loader, step=step, optimizer=opt, device="cpu", max_seconds=4, plan=TINY_PLAN, verify_seconds=0)
    assert statuses(report) == all_measured(report), str(report)
    assert set(seen) == {torch.float32}


def test_prefetcher_around_something_else_is_a_clear_error():
    class Fake:
        pass

    pf = timm_data.loader.PrefetchLoader(Fake(), device=torch.device("cpu"))
    with pytest.raises(BisectError, match="PrefetchLoader wraps a Fake, not a DataLoader"):
        run(model(), pf)


def test_missing_optional_library_names_the_extra_to_install(tmp_path, monkeypatch):
    import sys

    from bisect_pipeline.pipeline import entry

    path = tmp_path / "needs_timm.py"
    path.write_text("import timm\n\ndef make():\n    return None\n")
    monkeypatch.setitem(sys.modules, "timm", None)  # as if timm were not installed
    with pytest.raises(BisectError) as info:
        entry.load(f"{path}:make")
    assert 'pip install "bisect-pipeline[timm]"' in str(info.value)
