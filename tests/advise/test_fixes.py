"""The pipeline's own fixes built from an experiment's caches, and measured end to end
against the user's pipeline (planted costs: real work, wide margins)."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from bisect_pipeline import bisect
from bisect_pipeline.advise import fixes
from bisect_pipeline.measure import cache
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.report.summary import first_item
from conftest import Sleep


class Images(Dataset):
    """uint8 images (`side` pixels square, 3 channels) through `transform`, 4 classes."""

    def __init__(self, transform, side=16, n=4096):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 256, (8, 3, side, side), dtype=torch.uint8, generator=g)
        self.transform, self.n = transform, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.transform(self.data[i % 8].clone()), i % 4


class Pooled(nn.Module):
    """A classifier of the images' channel means; `ms`: a planted cost per step."""

    def __init__(self, ms: float = 0.0):
        super().__init__()
        self.fc, self.ms = nn.Linear(3, 4), ms

    def forward(self, x):
        Sleep(self.ms)(None)
        return self.fc(x.mean(dim=(2, 3)))


TAIL = [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)]


def experiment(ds, batch_size=8):
    spec = describe(DataLoader(ds, batch_size=batch_size))
    return SimpleNamespace(caches=cache.fill(spec, cache_mb=64, max_batches=3), spec=spec, move=lambda b: b,
                           wrapper=None, loop_stages=None, device=torch.device("cpu"))


def test_the_fixes_are_built_as_variants_of_the_cache_own_copy():
    ds = Images(v2.Compose(TAIL))
    built, variants = fixes.build(experiment(ds))
    assert [f.kind for f in built] == ["device_tail", "decode"]
    assert built[0].usable and built[1].status == "unavailable" and set(variants) == {"device_tail"}
    v = variants["device_tail"]
    x, _ = v.dataset[0]
    assert x.dtype == torch.uint8 and ds[0][0].dtype == torch.float32
    moved = v.through(lambda b: b)([x[None], torch.tensor([0])])
    assert torch.equal(moved[0], ds[0][0][None])


def test_no_fix_is_built_for_a_pipeline_the_tool_cannot_copy():
    exp = experiment(Images(v2.Compose(TAIL)))
    exp.wrapper = object()
    built, variants = fixes.build(exp)
    assert built[0].status == "unavailable" and "wrapper" in built[0].reason and not variants


@pytest.mark.e2e
@pytest.mark.alone  # the check's gain on 1 worker and 2 cores: under pytest -n other tests' processes share them
# (a clean clone's suite read 5.8x within the noise, 0.38-89x; alone it helps 4 runs in 4)
def test_a_float32_tail_that_costs_the_workers_most_of_a_batch_moved_to_the_step_helps_and_is_first(
        no_leftover_workers):
    # 512 small images a batch: the tail's per-sample calls cost the one worker most of
    # its time; on the batch they are two calls (a hand loop: 4-6x on this machine)
    ds = Images(v2.Compose(TAIL), side=16)
    loader = DataLoader(ds, batch_size=512, shuffle=True, num_workers=1, persistent_workers=True)
    r = bisect(Pooled(), loader, device="cpu", max_seconds=25, verify_seconds=20)
    f = next(f for f in r.advice if f.kind == "device_tail")
    assert f.verified.status == "helps" and f.verified.speedup > 1.5, str(r)
    assert first_item(r) is f or (first_item(r).verified.status == "helps" and "device_tail" in str(r))
    assert r.verification.fixes[0].usable and r.verification.fixes[0].max_difference == 0.0


@pytest.mark.e2e
def test_a_cheap_tail_beside_a_heavy_step_gets_no_gain_and_is_not_first(no_leftover_workers):
    # the tail's cost in the loop, about 3.4 ms a batch of 8, is 2% of a batch of about
    # 170 ms: under half the 5% floor under which no gain is real (outcome.judged). With a
    # 20-ms step (a 75-ms batch) a fresh clone once read it 1.05x (1.03-1.07), helps; with a
    # 60-ms step it read 1.038x (1.029-1.048), too near the floor
    ds = Images(v2.Compose([Sleep(6.0)] + TAIL), side=8, n=512)
    loader = DataLoader(ds, batch_size=8, shuffle=True)
    r = bisect(Pooled(ms=120.0), loader, device="cpu", max_seconds=25, verify_seconds=20)
    f = next((f for f in r.advice if f.kind == "device_tail"), None)
    assert f is not None, str(r)
    assert f.verified is not None and f.verified.status in ("no gain", "slower", "not measured"), str(r)
    assert first_item(r) is not f


@pytest.mark.e2e
@pytest.mark.alone  # the check's gain on 1 worker and 2 cores, as the test above (no gain on a busy clone, 2026-12-06)
def test_in_a_users_loop_the_fix_hands_over_batches_the_tail_has_run_on(no_leftover_workers):
    from bisect_pipeline import watching

    ds = Images(v2.Compose(TAIL), side=16)
    loader = DataLoader(ds, batch_size=512, shuffle=True, num_workers=1, persistent_workers=True)
    model = Pooled()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = set()
    with watching(max_seconds=25, verify_seconds=15) as s:
        for epoch in range(1000):
            for x, y in loader:
                seen.add(x.dtype)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    assert s.report.measurements.mode == "loop"
    f = next(f for f in s.report.advice if f.kind == "device_tail")
    assert f.verified is not None and f.verified.status == "helps", str(s.report)
    assert seen == {torch.float32}  # the workers handed over uint8; the loop got the tail's output


@pytest.mark.e2e
def test_a_pil_decoded_folder_gets_the_decode_fix_checked_and_measured(tmp_path, no_leftover_workers):
    import numpy as np
    from PIL import Image
    from torchvision import datasets, transforms as T

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    for i in range(64):  # photographs' size: decoding them is most of a sample's cost
        (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
        base = np.stack([(x * 0.5 + 7 * i) % 256, (y * 0.6) % 256, ((x + y) * 0.3) % 256], -1)
        Image.fromarray(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)).save(
            tmp_path / f"c{i % 2}" / f"{i}.jpg", quality=90)
    ds = datasets.ImageFolder(str(tmp_path), transform=T.Compose([T.CenterCrop(64), T.ToTensor()]))
    r = bisect(Pooled(), DataLoader(ds, batch_size=8, shuffle=True), device="cpu", max_seconds=25, verify_seconds=15)
    fix = next(f for f in r.verification.fixes if f.kind == "decode")
    assert fix.usable and fix.max_difference == 0.0  # a crop of the same decoded pixels
    if "load" in (r.verdict.tied if r.bottleneck == "tie" else (r.bottleneck,)):
        f = next(f for f in r.advice if f.kind == "decode")
        assert "built both ways on 8 samples before timing" in " ".join(f.message.split())
        # measured where the check's budget reaches it (the workers' candidates and the tail come first)
        assert f.verified is not None and f.verified.status in ("helps", "no gain", "slower", "not measured"), str(r)


def test_a_fix_whose_building_raises_is_failed_with_the_error_and_the_others_are_built(monkeypatch):
    from bisect_pipeline.measure import decode

    def broken(caches):
        raise RuntimeError("no decoder here")
    monkeypatch.setattr(decode, "build", broken)
    built, variants = fixes.build(experiment(Images(v2.Compose(TAIL))))
    assert built[0].usable and built[1].status == "failed" and "no decoder here" in built[1].reason
    assert set(variants) == {"device_tail"}
