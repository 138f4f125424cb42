"""Loaders people have (issue 13): a length-bucketing batch sampler with a padding collate,
sequence-first batches, DataLoader subclasses. Each keeps its behaviour at every point."""

from __future__ import annotations

import random
import statistics
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from bisect_pipeline import Workload, bisect
from bisect_pipeline.testing import SeveralPerItem, flatten_collate
from conftest import FAST_PLAN, LONG_EPOCHS, TINY_PLAN, PlantedDataset, Sleep, SleepLayer, assert_names, tiny_model

pytestmark = pytest.mark.e2e  # end to end on real loaders: not in the fast subset

LENGTHS = (4, 64)  # two buckets of sequence lengths


class Sequences(Dataset):
    """Token sequences of two very different lengths; augment costs `ms` a sample."""

    def __init__(self, n: int = 64, ms: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.seqs = [torch.randint(1, 100, (LENGTHS[i % 2],), generator=g) for i in range(n)]
        self.transform = Sleep(ms)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int):
        return self.transform(self.seqs[i]), i % 2


class Buckets(Sampler):
    """Batches of sequences of one length (shuffled within and across buckets)."""

    def __init__(self, ds: Sequences, batch_size: int) -> None:
        self.ds, self.bs = ds, batch_size

    def __iter__(self):
        rng = random.Random(0)
        out = []
        for length in LENGTHS:
            idx = [i for i, s in enumerate(self.ds.seqs) if len(s) == length]
            rng.shuffle(idx)
            out += [idx[i:i + self.bs] for i in range(0, len(idx), self.bs)]
        rng.shuffle(out)
        return iter(out)

    def __len__(self) -> int:
        return sum(-(-sum(len(s) == n for s in self.ds.seqs) // self.bs) for n in LENGTHS)


def pad(samples):
    seqs, labels = zip(*samples)
    return nn.utils.rnn.pad_sequence(list(seqs), batch_first=True), torch.tensor(labels)


class PerToken(nn.Module):
    """A model whose step costs 0.5 ms per padded token position: padding is paid for."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.EmbeddingBag(100, 4)

    def forward(self, x):
        time.sleep(0.0005 * x.shape[1])
        return self.emb(x)


def test_a_bucketing_sampler_with_padding_shows_no_spurious_collate_cost(no_leftover_workers):
    # raw and augmented used to re-batch the cached samples at random: mixed lengths padded
    # to 64 made the step ~2x slower there than at collated, a collate cost that is not there.
    ds = Sequences(ms=5.0)  # 40 ms of augment a batch of 8
    loader = DataLoader(ds, batch_sampler=Buckets(ds, 8), collate_fn=pad)
    report = bisect(PerToken(), loader, device="cpu", max_seconds=40, plan=FAST_PLAN, verify_seconds=0)
    assert_names(report, "augment")
    assert not report.stage("collate").significant, str(report)
    assert report.batch_size == 8 and "batch sampler" in report.batch_size_source


def seq_first(samples):
    seqs, labels = zip(*samples)
    return torch.stack(seqs, dim=1), torch.tensor(labels)  # (T, B), as the PyTorch language examples


class SeqFirstModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.EmbeddingBag(100, 4)
        self.slow = SleepLayer(2.0)

    def forward(self, x):  # x: (T, B)
        return self.emb(self.slow(x).t())


class FixedLength(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((32,), i % 100), i % 2


def test_sequence_first_batches_count_samples_not_time_steps():
    # an own batch sampler (batch_size=None): the size used to be the first tensor's first
    # dimension, here the 32 time steps, not the 8 sequences
    loader = DataLoader(FixedLength(), batch_sampler=torch.utils.data.BatchSampler(range(64), 8, False),
                        collate_fn=seq_first)
    report = bisect(SeqFirstModel(), loader, device="cpu", max_seconds=10, plan=FAST_PLAN, verify_seconds=0,
                    points=["full", "device"])
    assert report.batch_size == 8 and "batch sampler" in report.batch_size_source
    device = report.point("device")
    w = device.throughput.windows[0]
    assert device.throughput.samples_per_sec == pytest.approx(
        statistics.median(x.steps / x.seconds * 8 for x in device.throughput.windows))
    assert w.steps > 0
    assert report.to_dict()["batch_size_source"] == report.batch_size_source


def test_items_that_become_several_samples_count_what_the_step_gets():
    # each item makes 4 samples (MONAI's RandCropByPosNegLabeld(num_samples=4)) that the
    # collate flattens (list_data_collate): batch_size=2 items, 8 samples a step
    loader = DataLoader(SeveralPerItem(n=32, k=4, ms=2.0), batch_size=2, shuffle=True, collate_fn=flatten_collate)
    report = bisect(tiny_model(2.0), loader, device="cpu", max_seconds=8, plan=FAST_PLAN, verify_seconds=0)
    assert report.batch_size == 8, str(report)
    assert report.batch_size_source == "counted in the collated batch: loader batch_size 2 \u00d7 4 per sample"
    assert "batch size 8 (counted in the collated batch: loader batch_size 2 \u00d7 4 per sample)" in " ".join(str(report).split())
    full = report.point("full").throughput
    assert full.samples_per_sec == pytest.approx(statistics.median(w.steps / w.seconds * 8 for w in full.windows))
    # the costs timed alone are per item: the worker work of a batch holds 2 of them, not 8
    iso = report.to_dict()["isolated"]
    assert iso["items_per_batch"] == 2 and iso["batch_size"] == 8
    per_item = iso["load"]["ms_per_sample"] + iso["augment"]["ms_per_sample"]
    assert iso["workers"]["worker_ms_per_batch"] == pytest.approx(per_item * 2 + iso["collate"]["ms_per_batch"],
                                                                  abs=2e-3)


def test_the_entry_can_say_how_many_samples_a_batch_holds():
    # a dataset that returns whole sequence-first batches: nothing but the workload knows
    class Batches(Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return torch.full((32, 8), i % 100), torch.zeros(8, dtype=torch.long)

    loader = DataLoader(Batches(), batch_size=None)
    wl = Workload(model=SeqFirstModel(), loader=loader, batch_size=lambda b: b[0].shape[1])
    report = bisect(workload=wl, device="cpu", max_seconds=4, plan=TINY_PLAN, points=["full", "device"],
                    verify_seconds=0)
    assert report.batch_size == 8 and report.batch_size_source.startswith("Workload.batch_size (a function")
    fixed = bisect(SeqFirstModel(), DataLoader(Batches(), batch_size=None), batch_size=8, device="cpu",
                   max_seconds=4, plan=TINY_PLAN, points=["full", "device"], verify_seconds=0)
    assert fixed.batch_size == 8 and fixed.batch_size_source == "Workload.batch_size"


class Counting(DataLoader):
    """A user subclass that overrides __iter__: 15 ms more per batch, in the loop."""

    iterations = 0

    def __iter__(self):
        Counting.iterations += 1
        for batch in super().__iter__():
            time.sleep(0.015)
            yield batch


def test_a_dataloader_subclass_is_rebuilt_through_its_own_class(no_leftover_workers):
    # Rebuilt as a plain DataLoader, the 15 ms per batch its __iter__ adds vanished from
    # every point; rebuilt through the class, it shows where it happens: in the loop,
    # between the collated batches and the step (handoff; with workers, so that the
    # collated point is measured).
    Counting.iterations = 0
    loader = Counting(PlantedDataset(n=LONG_EPOCHS, transform=Sleep(0.0)), batch_size=8, shuffle=True, num_workers=2,
                      multiprocessing_context="fork")
    report = bisect(tiny_model(2.0), loader, device="cpu", max_seconds=30, plan=FAST_PLAN, verify_seconds=0)
    assert Counting.iterations >= 4  # full, raw, augmented, collated at least
    assert report.loader["loader_class"].endswith("Counting")
    assert_names(report, "handoff")
    assert not any("could not be rebuilt" in w for w in report.warnings)


class OwnSignature(DataLoader):
    def __init__(self, data):  # not the DataLoader arguments
        super().__init__(data, batch_size=8)


def test_a_subclass_that_cannot_be_rebuilt_says_what_is_not_measured():
    report = bisect(tiny_model(2.0), OwnSignature(PlantedDataset(transform=Sleep(0.0))), device="cpu",
                    max_seconds=5, plan=TINY_PLAN, points=["full", "device"], verify_seconds=0)
    (w,) = [n for n in report.notes if "could not be rebuilt" in n.message]
    assert w.message == "OwnSignature could not be rebuilt: let it take DataLoader's arguments."
    assert "what OwnSignature itself adds per batch" in w.detail and "is not measured" in w.detail
    assert report.point("full").status == "ok"


def test_timms_multi_epochs_loader_is_rebuilt_through_its_class(no_leftover_workers):
    timm_loader = pytest.importorskip("timm.data.loader")
    loader = timm_loader.MultiEpochsDataLoader(PlantedDataset(transform=Sleep(0.0)), batch_size=8, shuffle=True,
                                               num_workers=2, multiprocessing_context="fork")
    # no planted cost, so no verdict to wait for: what is asserted is that every point was
    # built through the class and measured (one left out as inconsistent on a busy machine
    # still has its windows; this test failed CI once on that before): one round does it
    report = bisect(tiny_model(2.0), loader, device="cpu", max_seconds=8, plan=TINY_PLAN, verify_seconds=0)
    assert report.loader["loader_class"].endswith("MultiEpochsDataLoader")
    assert not any("could not be rebuilt" in w for w in report.warnings), report.warnings
    measured = {p.point for p in report.points if p.throughput is not None and p.status in ("ok", "failed")
                and p.failed_stage in (None, "inconsistent")}
    assert measured == {"full", "raw", "augmented", "collated", "device"}, str(report)


def test_a_short_iterable_with_persistent_workers_is_measured(no_leftover_workers):
    from conftest import PlantedIterable

    loader = DataLoader(PlantedIterable(n=16), batch_size=4, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True)
    report = bisect(tiny_model(2.0), loader, device="cpu", max_seconds=6, plan=TINY_PLAN, verify_seconds=0)
    assert report.point("full").status == "ok", str(report)
