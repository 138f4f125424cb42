"""The costliest transform measured in the pipeline (confirm.py): the target is the
costliest step (a random container as a whole); the two sides replay the same calls
from the step's input and from its output, and rebuild the recorded sample exactly; the
figures come from the windows alone; an e2e run on planted sleeps finds the planted cost
under the loader's workers."""

import dataclasses

import pytest
import torch
from torchvision.transforms import v2

from bisect_pipeline import bisect
from bisect_pipeline.advise import confirm
from bisect_pipeline.pipeline import recording
from bisect_pipeline.pipeline.recording import Call
from bisect_pipeline.core.results import Breakdown, BreakdownRow, Isolated, PerSample, Trial, VisitWindow
from bisect_pipeline.testing import PlantedDataset, Sleep, make_loader, tiny_model
from conftest import FAST_PLAN, LONG_EPOCHS


class Add:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x + self.k


class Double:
    def __call__(self, *xs):  # one input, or several as a v2 Compose passes them
        return xs[0] * 2 if len(xs) == 1 else tuple(x * 2 for x in xs)


def _iso(rows):
    b = Breakdown(rows=tuple(BreakdownRow(name=n, where=w, ms_per_sample=ms, samples=4) for n, w, ms in rows),
                  samples=4)
    return Isolated(augment=PerSample(ms_per_sample=1.0, samples=4, breakdown=b))


def test_the_target_is_the_costliest_step_and_a_random_container_counts_as_one():
    compose = v2.Compose([Add(1), v2.RandomChoice([Add(2), Add(3)]), Double()])
    calls = [[Call(compose, "dataset.transform", (torch.zeros(2),), {})]]
    rows = [("Add", "dataset.transform[0]", 1.0), ("Add", "dataset.transform[1][0]", 1.5),
            ("Add", "dataset.transform[1][1]", 1.5), ("Double", "dataset.transform[2]", 2.5)]
    t, why = confirm.target(_iso(rows), calls)
    assert (t.call, t.index, t.name, t.where, t.ms_per_sample) == (
        "dataset.transform", 1, "RandomChoice", "dataset.transform[1]", 3.0) and why == ""
    assert confirm.target(_iso([]), calls)[0] is None
    assert confirm.target(_iso(rows[:1] + [("Add", "x", 0.0)]), [[Call(Add(1), "y", (torch.zeros(2),), {})]])[0] is None


def test_both_sides_rebuild_the_recorded_sample_from_the_steps_input_and_output():
    compose = v2.Compose([Add(1), Double(), Add(5)])
    x = torch.arange(3.0)
    template = (x.clone(), 7)
    call = Call(compose, "dataset.transform", (x,), {}, placements=[((), (0,))])
    other = Call(Add(100), "dataset.target_transform", (torch.zeros(1),), {}, placements=[])
    t = confirm.Target("dataset.transform", 1, "Double", "dataset.transform[1]", 2.0)
    with_, without = confirm.sub_calls([[call, other]], t)
    assert with_[0][1] is other and without[0][1] is other  # the other calls as recorded
    assert with_[0][0].args[0].tolist() == [1.0, 2.0, 3.0]  # Double's input
    assert without[0][0].args[0].tolist() == [2.0, 4.0, 6.0]  # its output
    want = recording.replay_sample(template, [call])[0].tolist()
    assert want == [7.0, 9.0, 11.0]
    for side in (with_, without):
        assert recording.replay_sample(template, side[0][:1])[0].tolist() == want
    assert x.tolist() == [0.0, 1.0, 2.0]  # the recorded input is left as it was


def test_a_v2_compose_of_several_inputs_is_cut_with_its_inputs_unpacked():
    compose = v2.Compose([v2.RandomHorizontalFlip(p=1.0), Double()])
    img, mask = torch.arange(4.0).reshape(1, 2, 2), torch.ones(1, 2, 2)
    call = Call(compose, "dataset.transforms", (img, mask), {}, placements=[((0,), (0,)), ((1,), (1,))])
    t = confirm.Target("dataset.transforms", 1, "Double", "dataset.transforms[1]", 1.0)
    with_, without = confirm.sub_calls([[call]], t)
    assert len(without[0][0].args) == 2  # the flip's two outputs, unpacked as the Compose passes them
    a = recording.replay_sample((img, mask), with_[0])
    b = recording.replay_sample((img, mask), without[0])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[0].flatten().tolist() == [2.0, 0.0, 6.0, 4.0]


def test_the_figures_come_from_the_windows_of_the_two_sides():
    t = confirm.Target("dataset.transform", 0, "Blur", "dataset.transform[0]", 2.0)
    with_ = tuple(VisitWindow(10, 1.0 + 0.01 * (i % 2), i // 2) for i in range(8))  # 100 ms per batch
    without = tuple(VisitWindow(10, 0.6 + 0.006 * (i % 2), i // 2) for i in range(8))  # 60 ms
    c = confirm.confirmation(t, Trial("confirm", {}, with_, without), 8, predicted=32.0)
    assert c.ok and c.real and c.transform == "Blur" and c.windows == 16
    assert c.measured_ms_per_batch == pytest.approx(40.0, abs=0.5)
    assert c.with_ms_per_batch == pytest.approx(100.5, abs=0.1) and c.without_ms_per_batch == pytest.approx(60.3, abs=0.1)
    assert 0 < c.tolerance_ms < 5 and c.predicted_ms_per_batch == 32.0
    same = confirm.confirmation(t, Trial("confirm", {}, with_, with_), 8, predicted=32.0)
    assert same.ok and not same.real and same.measured_ms_per_batch == 0.0
    short = confirm.confirmation(t, Trial("confirm", {}, with_[:1], ()), 8, predicted=32.0)
    assert short.status == "not run" and short.predicted_ms_per_batch == 32.0 and "two pairs of visits" in short.reason
    # the document keeps the raw windows: the figures can be derived again
    again = type(c).from_dict(c.to_dict())
    assert again == c and again.trial.user_windows == with_


def test_a_confirmation_is_placed_in_the_augment_breakdown_and_skipped_only_where_augment_is_in_question():
    iso = _iso([("Blur", "dataset.transform[0]", 1.0)])
    c = confirm.skipped(iso, ("augment",), "the check is off (verify_seconds=0)")
    assert c.augment.breakdown.confirmed.status == "skipped" and c.augment.breakdown.rows == iso.augment.breakdown.rows
    assert confirm.skipped(iso, ("load", "augment"), "off").augment.breakdown.confirmed.status == "skipped"  # tied
    assert confirm.skipped(iso, ("load",), "off") is iso and confirm.skipped(iso, (), "off") is iso
    assert confirm.with_confirmation(Isolated.missing("skipped", "x"), c.augment.breakdown.confirmed).status == "skipped"


@pytest.mark.e2e
def test_the_planted_costliest_transform_is_measured_under_the_loaders_workers():
    """Per sample 1 + 12 + 1 ms of planted sleep, batches of 8, two workers, a cheap
    step: the 12 ms transform costs the loop about 12 x 8 / 2 = 48 ms per batch."""
    import torchvision.transforms as v1
    dataset = PlantedDataset(n=LONG_EPOCHS, transform=v1.Compose([Sleep(1.0), Sleep(12.0), Sleep(1.0)]))
    loader = make_loader(dataset, batch_size=8, num_workers=2)
    r = bisect(tiny_model(), loader, device="cpu", max_seconds=30, plan=FAST_PLAN)
    if r.bottleneck != "augment":
        pytest.skip(f"not named augment on this machine ({r.bottleneck}); the confirmation runs only then")
    c = r.isolated.augment.breakdown.confirmed
    assert c is not None and c.ok, c
    assert (c.transform, c.where) == ("Sleep", "dataset.transform[1]")
    assert c.predicted_ms_per_batch == pytest.approx(48.0, rel=0.25)
    assert 0.5 * 48 <= c.measured_ms_per_batch <= 1.5 * 48, c
    assert c.real and c.windows >= 4


def test_an_albumentations_compose_is_cut_on_its_data_dict():
    A = pytest.importorskip("albumentations")
    import numpy as np
    image = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
    compose = A.Compose([A.HorizontalFlip(p=1.0), A.Resize(2, 2)])
    call = Call(compose, "dataset.transform", (), {"image": image}, placements=[(("image",), (0,))])
    t = confirm.Target("dataset.transform", 1, "HorizontalFlip", "dataset.transform[0]", 1.0)  # steps: pre, flip, ...
    with_, without = confirm.sub_calls([[call]], t)
    want = recording.replay_sample((image, 0), [call])[0]
    for side in (with_, without):
        got = recording.replay_sample((image, 0), side[0])[0]
        assert got.shape == (2, 2, 3) and (got == want).all()
    assert without[0][0].args[0]["image"].tolist() == image[:, ::-1].tolist()  # the flip's output, cached


def test_the_intermediates_must_fit_in_what_the_cache_budget_leaves():
    from types import SimpleNamespace
    compose = v2.Compose([Add(1), Double()])
    calls = [[Call(compose, "dataset.transform", (torch.zeros(1024),), {})] for _ in range(4)]  # 4 KiB a float tensor
    t = confirm.Target("dataset.transform", 1, "Double", "dataset.transform[1]", 1.0)
    fits = SimpleNamespace(raw_calls=calls, budget_bytes=64 * 1024, held={"samples": 16 * 1024})
    assert confirm._over_budget(fits, t) is None  # 4 samples x (4 + 4) KiB = 32 KiB of the 48 left
    tight = SimpleNamespace(raw_calls=calls, budget_bytes=40 * 1024, held={"samples": 16 * 1024})
    why = confirm._over_budget(tight, t)
    assert why.startswith("its inputs and outputs for the 4 cached samples would hold about 0 MB") and "--cache-mb" in why
    assert confirm._over_budget(SimpleNamespace(raw_calls=calls, budget_bytes=None, held={}), t) is None


def test_intermediates_that_would_take_longer_than_the_check_s_time_are_not_computed():
    # a heavy step's run named augment on the costs alone in one round, leaving the check
    # 0.9 s: 48 cached samples of a 125-ms augment would take 6 s to replay (issue 59)
    from types import SimpleNamespace
    caches = SimpleNamespace(raw_calls=[[None]] * 48)
    iso = Isolated(augment=PerSample(ms_per_sample=125.0, samples=8))
    why = confirm._over_time(caches, iso, 0.9)
    assert why == ("out of time: its inputs and outputs for the 48 cached samples would take about 6.0 s to compute, "
                   "more than the 0.9 s the check gives it")
    assert confirm._over_time(caches, iso, 10.0) is None
    assert confirm._over_time(caches, None, 0.9) is None
