"""The augment stage transform by transform (breakdown.py): planted costs on a fake clock
come back exact, in order, with their shares and sizes; nested Composes are flattened;
what cannot be seen into is one row with its reason; the budget cut keeps the rows
measured; real torchvision transforms add up to the stage timed whole."""

import time

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as v1
from torchvision.transforms import v2

from bisect_pipeline.measure import breakdown, cache, worker_stages
from bisect_pipeline.pipeline import loader as loader_mod
from bisect_pipeline.pipeline.recording import Call
from bisect_pipeline.core.results import Isolated, PerSample
from conftest import FakeClock, PILImages, make_loader


class Planted:
    """A transform that costs `ms` on the fake clock and returns `out` (else its input)."""

    def __init__(self, clock, ms, out=None):
        self.clock, self.ms, self.out = clock, ms, out

    def __call__(self, *xs):  # one input, or several passed on as a v2 Compose does
        self.clock.t += self.ms / 1e3
        return self.out if self.out is not None else xs[0] if len(xs) == 1 else xs


def samples(fn, n, *args, **kwargs):
    if not args and not kwargs:
        args = (torch.zeros(3, 8, 8, dtype=torch.uint8),)
    return [[Call(fn, "dataset.transform", args, kwargs)]
            for _ in range(n)]


def whole(ms):
    return PerSample(ms_per_sample=ms, samples=4)


def test_a_compose_of_planted_costs_gives_its_rows_in_order_with_shares_and_sizes():
    clock = FakeClock(10.0)
    resized = torch.zeros(3, 4, 4, dtype=torch.float32)
    compose = v1.Compose([Planted(clock, 0.0), Planted(clock, 5.0, out=resized), Planted(clock, 20.0)])
    b = breakdown.measure(samples(compose, 4), 1.0, clock, whole(25.0))
    assert [(r.name, r.where) for r in b.rows] == [("Planted", "dataset.transform[0]"),
                                                   ("Planted", "dataset.transform[1]"),
                                                   ("Planted", "dataset.transform[2]")]
    assert [r.ms_per_sample for r in b.rows] == [0.0, 5.0, 20.0]
    assert [r.share for r in b.rows] == [0.0, 0.2, 0.8]
    assert [(r.input, r.output) for r in b.rows] == [("3x8x8 uint8", "3x8x8 uint8"), ("3x8x8 uint8", "3x4x4 float32"),
                                                     ("3x4x4 float32", "3x4x4 float32")]
    assert b.samples == 4 and b.sum_ms_per_sample == 25.0 and b.agrees is True
    assert all(r.status == "ok" and r.note is None for r in b.rows)


def test_parts_that_do_not_add_up_to_the_whole_say_so():
    clock = FakeClock()
    compose = v2.Compose([Planted(clock, 5.0), Planted(clock, 5.0)])
    b = breakdown.measure(samples(compose, 2), 1.0, clock, whole(20.0))
    assert b.sum_ms_per_sample == 10.0 and b.agrees is False
    assert b.tolerance_ms == 4.0 and b.tolerance.startswith("20%")  # too few samples for the noise
    assert breakdown.measure(samples(compose, 2), 1.0, clock, whole(11.0)).agrees is True


def test_nested_composes_are_flattened_and_a_lambda_is_one_row():
    clock = FakeClock()
    inner = v2.Compose([Planted(clock, 1.0), v1.Compose([Planted(clock, 2.0)])])
    b = breakdown.measure(samples(v1.Compose([inner, Planted(clock, 3.0)]), 1), 1.0, clock, whole(6.0))
    assert [(r.where, r.ms_per_sample) for r in b.rows] == [("dataset.transform[0][0]", 1.0),
                                                            ("dataset.transform[0][1][0]", 2.0),
                                                            ("dataset.transform[1]", 3.0)]
    lam = breakdown.measure(samples(lambda x: x + 1, 1), 1.0, clock, whole(1.0))
    assert [(r.name, r.note) for r in lam.rows] == [("<lambda>", "not a Compose: cannot be seen into")]
    assert lam.rows[0].output == "3x8x8 uint8"


def test_several_arguments_are_not_broken_down_unless_the_compose_is_v2():
    clock = FakeClock()
    img, mask = torch.zeros(3, 8, 8), torch.zeros(8, 8, dtype=torch.int64)
    joint = v1.Compose([Planted(clock, 1.0), Planted(clock, 2.0)])
    b = breakdown.measure(samples(lambda **kw: kw, 1, image=img, mask=mask), 1.0, clock, whole(0.0))
    assert len(b.rows) == 1 and "not a Compose" in b.rows[0].note
    assert b.rows[0].input == "image: 3x8x8 float32, mask: 8x8 int64"
    with pytest.raises(TypeError):  # a v1 Compose takes one image: called with two, it fails whole
        breakdown.measure(samples(joint, 1, img, mask), 1.0, clock, whole(3.0))
    rows, _ = breakdown.parts_of(samples(joint, 1, img, mask)[0][0])
    assert len(rows) == 1 and rows[0].note.startswith("called with 2 arguments")
    pair = v2.Compose([v2.RandomHorizontalFlip(p=1.0), Planted(clock, 2.0)])
    b2 = breakdown.measure(samples(pair, 1, img, mask), 1.0, clock, whole(2.0))
    assert [r.name for r in b2.rows] == ["RandomHorizontalFlip", "Planted"]
    assert b2.rows[0].input == "3x8x8 float32, 8x8 int64" and b2.rows[1].ms_per_sample == 2.0


def test_the_budget_cut_keeps_the_rows_measured_and_marks_the_rest():
    clock = FakeClock()
    compose = v1.Compose([Planted(clock, 5.0), Planted(clock, 300.0), Planted(clock, 1.0)])
    b = breakdown.measure(samples(compose, 5), 0.1, clock, whole(306.0))
    assert [r.status for r in b.rows] == ["ok", "ok", "not run"]
    assert [r.ms_per_sample for r in b.rows] == [5.0, 300.0, None]
    assert b.rows[2].reason.startswith("out of time") and b.samples == 1
    assert b.sum_ms_per_sample is None and b.agrees is None  # no sum of parts missing one
    # a later sample runs whole: the cut falls between samples
    b2 = breakdown.measure(samples(v1.Compose([Planted(clock, 30.0), Planted(clock, 30.0)]), 5), 0.1, clock,
                           whole(60.0))
    assert b2.samples == 2 and [r.samples for r in b2.rows] == [2, 2] and b2.agrees is True


def test_the_breakdown_round_trips_through_the_document():
    clock = FakeClock()
    b = breakdown.measure(samples(v1.Compose([Planted(clock, 2.0)]), 3), 1.0, clock, whole(2.0))
    iso = Isolated(augment=PerSample(ms_per_sample=2.0, samples=3, breakdown=b))
    again = Isolated.from_dict(iso.to_dict())
    assert again == iso and again.augment.breakdown.rows[0].ms_per_sample == 2.0


@pytest.mark.e2e
def test_real_torchvision_transforms_give_their_sizes_and_add_up_to_the_whole(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(12):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)).save(paths[-1])
    transform = v1.Compose([v1.RandomResizedCrop(224), v1.RandomHorizontalFlip(), v1.ToTensor(),
                            v1.Normalize([0.5] * 3, [0.25] * 3)])
    spec = loader_mod.describe(make_loader(PILImages(paths, transform), batch_size=4))
    caches = cache.fill(spec, cache_mb=64, max_batches=3, time_budget=10)
    aug = worker_stages.time_augment(caches, 2.0, time.perf_counter)
    rows = aug.breakdown.rows
    assert [r.name for r in rows] == ["RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]
    assert [(r.input, r.output) for r in rows] == [("500x375 RGB", "224x224 RGB"), ("224x224 RGB", "224x224 RGB"),
                                                   ("224x224 RGB", "3x224x224 float32"),
                                                   ("3x224x224 float32", "3x224x224 float32")]
    assert aug.breakdown.samples == aug.samples  # the same samples as the whole
    assert aug.breakdown.sum_ms_per_sample > 0
    # The whole and its parts are timed one after the other on a shared machine: the
    # tolerance is theirs (noise); the parts are the whole's own work, so far apart only
    # by the clones and placements of a replay, never by a factor of two.
    assert 0.5 * aug.ms_per_sample <= aug.breakdown.sum_ms_per_sample <= 2.0 * aug.ms_per_sample, aug


def test_each_recorded_transform_gets_its_rows_and_a_cut_between_them_plans_the_rest():
    clock = FakeClock()
    image, target = torch.zeros(3, 8, 8, dtype=torch.uint8), torch.zeros(4)
    calls = [Call(v2.Compose([Planted(clock, 1.0), Planted(clock, 2.0)]), "dataset.transform", (image,), {}),
             Call(Planted(clock, 4.0), "dataset.target_transform", (target,), {})]
    b = breakdown.measure([calls] * 3, 1.0, clock, whole(7.0))
    assert [(r.where, r.ms_per_sample, r.samples) for r in b.rows] == [
        ("dataset.transform[0]", 1.0, 3), ("dataset.transform[1]", 2.0, 3), ("dataset.target_transform", 4.0, 3)]
    assert b.rows[2].input == "4 float32" and b.sum_ms_per_sample == 7.0 and b.agrees is True
    # the budget runs out with the first transform: the second is planned, not run
    cut = breakdown.measure([calls] * 3, 0.002, clock, whole(7.0))
    assert [(r.where, r.status) for r in cut.rows] == [("dataset.transform[0]", "ok"), ("dataset.transform[1]", "ok"),
                                                      ("dataset.target_transform", "not run")]


def test_random_containers_are_walked_as_they_draw_and_their_rows_still_add_up():
    clock = FakeClock()
    torch.manual_seed(0)
    compose = v2.Compose([v2.RandomApply([Planted(clock, 10.0)], p=0.5),
                          v2.RandomChoice([Planted(clock, 2.0), Planted(clock, 4.0)], p=[0.75, 0.25]),
                          v2.RandomOrder([Planted(clock, 1.0), Planted(clock, 3.0)])])
    n = 400
    b = breakdown.measure(samples(compose, n), 100.0, clock, whole(12.5))
    rows = {r.where: r for r in b.rows}
    assert list(rows) == ["dataset.transform[0][0]", "dataset.transform[1][0]", "dataset.transform[1][1]",
                          "dataset.transform[2][0]", "dataset.transform[2][1]"]
    assert all(r.samples == n for r in b.rows)  # every sample counts, at zero where a row did not run
    applied = rows["dataset.transform[0][0]"]
    assert applied.ms_per_sample == pytest.approx(10.0 * applied.ran / n) and 0.4 < applied.ran / n < 0.6
    two, four = rows["dataset.transform[1][0]"], rows["dataset.transform[1][1]"]
    assert two.ran + four.ran == n and 0.68 < two.ran / n < 0.82  # one child per sample, by the weights
    assert [rows[w].ran for w in ("dataset.transform[2][0]", "dataset.transform[2][1]")] == [n, n]
    assert b.sum_ms_per_sample == pytest.approx(sum(r.ms_per_sample for r in b.rows), abs=1e-3)
    assert b.sum_ms_per_sample == pytest.approx(5.0 + 2.5 + 4.0, abs=1.0)  # the expected cost of one sample


def test_a_random_container_inside_a_v1_compose_and_one_never_applied():
    clock = FakeClock()
    compose = v1.Compose([v1.RandomApply([v1.Compose([Planted(clock, 1.0), Planted(clock, 2.0)])], p=0.0),
                          Planted(clock, 5.0)])
    b = breakdown.measure(samples(compose, 3), 1.0, clock, whole(5.0))
    assert [(r.where, r.ms_per_sample, r.ran) for r in b.rows] == [
        ("dataset.transform[0][0][0]", 0.0, 0), ("dataset.transform[0][0][1]", 0.0, 0), ("dataset.transform[1]", 5.0, 3)]
    assert b.rows[0].input is None  # never ran: no size is invented
    order = breakdown.measure(samples(v1.RandomOrder([Planted(clock, 1.0), Planted(clock, 2.0)]), 2), 1.0, clock,
                              whole(3.0))
    assert [r.ms_per_sample for r in order.rows] == [1.0, 2.0]  # a container called alone is seen into too


def test_the_whole_is_timed_in_turn_with_the_rows_and_held_against_them_sample_by_sample():
    clock = FakeClock()
    order = []

    class Logged(Planted):
        def __call__(self, *xs):
            order.append(f"part{len([o for o in order if o.startswith('whole')]) - 1}")
            return super().__call__(*xs)
    compose = v1.Compose([Logged(clock, 2.0), Logged(clock, 3.0)])

    def whole(i, ms=5.0):
        clock.t += 1e-3  # copying the sample's inputs: untimed, as the rows' copies are

        def run():
            order.append(f"whole{i}")
            clock.t += ms / 1e3
        return run
    stage, b = breakdown.measure_with_whole(samples(compose, 4), 1.0, clock, whole)
    assert order[:6] == ["whole0", "part0", "part0", "whole1", "part1", "part1"]
    assert stage.ms_per_sample == 5.0 and stage.samples == 4 and b.samples == 4  # not 6: the copy is not augment
    assert b.agrees is True and b.tolerance.startswith("3 standard errors of the per-sample differences")
    assert b.tolerance_ms == pytest.approx(0.25)  # no spread in the differences: the 5% floor
    _, slow = breakdown.measure_with_whole(samples(compose, 4), 1.0, clock, lambda i: whole(i, 8.0))
    assert slow.agrees is False and slow.augment_ms_per_sample == 8.0 and slow.sum_ms_per_sample == 5.0


def test_a_transform_that_fails_alone_leaves_the_stage_timed_whole(tmp_path):
    class NeedsTwo:  # a transform a Compose can call but that fails called alone here
        def __call__(self, x):
            raise TypeError("needs its partner")
    caches = type("C", (), {})()
    x = torch.zeros(3, 4, 4)
    caches.samples = [x.clone() for _ in range(4)]
    caches.raw_calls = [[Call(v1.Compose([NeedsTwo()]), "dataset.transform", (x,), {}, placements=[])]
                        for _ in range(4)]
    caches.raw_reason = None
    import bisect_pipeline.pipeline.recording as rec
    real = rec.replay_sample
    try:
        rec.replay_sample = lambda template, calls: template  # the whole replays fine
        aug = worker_stages.time_augment(caches, 0.05, time.perf_counter)
    finally:
        rec.replay_sample = real
    assert aug.ok and aug.samples >= 1 and aug.breakdown.status == "failed"
    assert "needs its partner" in aug.breakdown.reason


def test_an_albumentations_compose_is_broken_down_as_it_calls_its_children():
    A = pytest.importorskip("albumentations")
    clock = FakeClock()

    class PlantedA(A.ImageOnlyTransform):  # a real albumentations transform costing `ms`
        def __init__(self, ms):
            super().__init__(p=1.0)
            self.ms = ms

        def apply(self, img, **params):
            clock.t += self.ms / 1e3
            return img
    image = np.zeros((16, 16, 3), dtype=np.uint8)
    mask = np.zeros((16, 16), dtype=np.uint8)
    compose = A.Compose([A.HorizontalFlip(p=1.0), PlantedA(4.0), A.Resize(8, 8), PlantedA(1.0)])
    b = breakdown.measure([[Call(compose, "dataset.transform", (), {"image": image, "mask": mask})]] * 3, 1.0, clock,
                          whole(5.0))
    assert [r.name for r in b.rows] == ["preprocess", "HorizontalFlip", "PlantedA", "Resize", "PlantedA", "postprocess"]
    assert [r.where for r in b.rows][1:3] == ["dataset.transform[0]", "dataset.transform[1]"]
    assert [r.ms_per_sample for r in b.rows if r.name == "PlantedA"] == [4.0, 1.0]
    resize = next(r for r in b.rows if r.name == "Resize")
    assert resize.input == "image: 16x16x3 uint8, mask: 16x16 uint8" and resize.output == "image: 8x8x3 uint8, mask: 8x8 uint8"
    assert b.sum_ms_per_sample == pytest.approx(5.0) and b.agrees is True
    # positional data, or p < 1: one row with the reason
    rows, _ = breakdown.parts_of(Call(A.Compose([A.HorizontalFlip()], p=0.5), "t", (), {"image": image}))
    assert len(rows) == 1 and rows[0].note == "albumentations Compose applied with p=0.5: not broken down"


def test_a_monai_compose_is_broken_down_through_apply_transform_and_its_random_compositions_are_one_row():
    mt = pytest.importorskip("monai.transforms")
    clock = FakeClock()
    image = torch.zeros(1, 8, 8)
    inner = mt.Compose([mt.ScaleIntensity(), Planted(clock, 3.0)])
    compose = mt.Compose([mt.EnsureType(), Planted(clock, 2.0), inner, mt.OneOf([Planted(clock, 7.0)])])
    b = breakdown.measure(samples(compose, 3, image), 1.0, clock, whole(12.0))
    assert [(r.name, r.where) for r in b.rows] == [
        ("EnsureType", "dataset.transform[0]"), ("Planted", "dataset.transform[1]"),
        ("ScaleIntensity", "dataset.transform[2][0]"), ("Planted", "dataset.transform[2][1]"),
        ("OneOf", "dataset.transform[3]")]
    assert [r.ms_per_sample for r in b.rows][1::2] == [2.0, 3.0] and b.rows[4].ms_per_sample == pytest.approx(7.0)
    # a dict of arrays through dictionary transforms, mapped as MONAI maps them
    d = mt.Compose([mt.ScaleIntensityd(keys="image"), Planted(clock, 1.0)])
    bd = breakdown.measure(samples(d, 2, {"image": image, "label": 1}), 1.0, clock, whole(1.0))
    assert [r.name for r in bd.rows] == ["ScaleIntensityd", "Planted"] and bd.rows[0].input.startswith("image: 1x8x8")
    lazy = mt.Compose([mt.ScaleIntensity()], lazy=True)
    rows, _ = breakdown.parts_of(samples(lazy, 1, image)[0][0])
    assert len(rows) == 1 and "lazy resampling" in rows[0].note


def test_a_row_s_sizes_name_the_arrays_and_images_it_ran_on():
    assert breakdown.describe(torch.zeros(3, 224, 224, dtype=torch.uint8)) == "3x224x224 uint8"
    assert breakdown.describe(Image.new("RGB", (500, 375))) == "500x375 RGB"
    assert breakdown.describe((torch.zeros(2, 4), 7)) == "2x4 float32, int"
    # a dict's arrays only: MONAI's trace of what ran beside them is not a size
    out = {"image": torch.zeros(3, 96, 96), "image_transforms": [{"class": "RandFlipd", "id": 1}]}
    assert breakdown.describe(out) == "image: 3x96x96 float32"
    assert breakdown.describe({"label": 3}) == "label: int"  # nothing sized: all of it
