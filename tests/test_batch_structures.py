"""Batches of any structure end to end: dicts, namedtuples, dataclasses, nested lists,
a custom batch class with pin_memory()/to() (the torch docs' pattern), and a padding
collate for variable-length token sequences (token ids + lengths). Each runs every point
with the planted augment cost found, and the step sees the structure it was built for."""

import collections
import dataclasses
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bisect_pipeline import bisect
from conftest import CLASSES, FAST_PLAN, FEATURES, TINY_PLAN, Sleep, SleepLayer, all_measured, assert_names

pytestmark = pytest.mark.e2e  # end to end on real loaders: not in the fast subset

MAX_S = 8
AUG_MS = 6.0  # per sample: 48 ms a batch of 8, against a 2 ms step

Pair = collections.namedtuple("Pair", ["image", "label"])


@dataclasses.dataclass
class Sample:
    features: torch.Tensor
    label: int


@dataclasses.dataclass
class Batch:
    features: torch.Tensor
    labels: torch.Tensor


class CustomBatch:
    """The torch docs' custom batch: built by collate_fn, pins and moves itself."""

    def __init__(self, samples):
        self.inp = torch.stack([s[0] for s in samples])
        self.tgt = torch.tensor([s[1] for s in samples])

    def pin_memory(self):
        self.inp = self.inp.pin_memory()
        self.tgt = self.tgt.pin_memory()
        return self

    def to(self, device, non_blocking=False):
        new = object.__new__(CustomBatch)
        new.inp = self.inp.to(device, non_blocking=non_blocking)
        new.tgt = self.tgt.to(device, non_blocking=non_blocking)
        return new


def custom_collate(samples):
    return CustomBatch(samples)


def dataclass_collate(samples):
    return Batch(torch.stack([s.features for s in samples]), torch.tensor([s.label for s in samples]))


class Structured(Dataset):
    """Map-style, transform in self.transform (so raw exists), sample in `kind`'s shape."""

    def __init__(self, kind, n=64, transform=None):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randn(n, FEATURES, generator=g)
        self.kind = kind
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x = self.data[i].clone()
        if self.transform is not None:
            x = self.transform(x)
        y = i % CLASSES
        if self.kind == "dict":
            return {"inputs": x, "targets": y, "meta": {"index": i}}
        if self.kind == "namedtuple":
            return Pair(x, y)
        if self.kind == "dataclass":
            return Sample(x, y)
        if self.kind == "nested":
            return [[x, x[: FEATURES // 2]], y]
        return x, y  # "custom": a plain tuple, batched by custom_collate


def net():
    torch.manual_seed(0)
    return nn.Sequential(SleepLayer(2.0), nn.Linear(FEATURES, CLASSES))


def train(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


# kind -> (collate_fn, how the step takes (inputs, targets) from the batch, the batch type)
CASES = {
    "dict": (None, lambda b: (b["inputs"], b["targets"]), dict),
    "namedtuple": (None, lambda b: (b.image, b.label), Pair),
    "dataclass": (dataclass_collate, lambda b: (b.features, b.labels), Batch),
    "nested": (None, lambda b: (b[0][0] + b[0][1].repeat(1, 2), b[1]), list),
    "custom": (custom_collate, lambda b: (b.inp, b.tgt), CustomBatch),
}



@pytest.mark.parametrize("kind", list(CASES))
def test_structured_batches_every_point(kind):
    """Every point caches, copies, replays and moves the structure intact (the padding
    test below also checks the verdict on such a pipeline)."""
    collate, unpack, batch_type = CASES[kind]
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = set()

    def step(batch):
        seen.add(type(batch))
        x, y = unpack(batch)
        train(model, opt, x, y)

    ds = Structured(kind, transform=Sleep(1.0))
    loader = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate)
    report = bisect(model, loader, optimizer=opt, step=step, device="cpu", max_seconds=4, plan=TINY_PLAN, verify_seconds=0)
    assert {p.point: p.status for p in report.points} == all_measured(report), str(report)
    assert list(report.cache.raw_transforms) == ["dataset.transform (Sleep)"]
    assert seen == {batch_type}


def test_dict_and_namedtuple_batches_work_with_the_default_step():
    for kind in ("dict", "namedtuple"):
        loader = DataLoader(Structured(kind, transform=Sleep(1.0)), batch_size=8, shuffle=True)
        report = bisect(net(), loader, device="cpu", max_seconds=4, plan=TINY_PLAN, verify_seconds=0)
        assert {p.point: p.status for p in report.points} == all_measured(report), str(report)


# ---- variable-length token sequences with a padding collate --------------------------


class Tokens(Dataset):
    """Token id sequences of 4..24 tokens; the transform (random token dropout) is augment.
    Loading costs `load_ms` a sample: without a cost of its own, `raw` runs as fast as
    `full`, and on a busy 2-core machine either may read slower than the other by more
    than the rule for an inconsistent point allows (CI once left `raw` out so)."""

    def __init__(self, n=64, vocab=50, transform=None, load_ms=0.0):
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(4, 25, (n,), generator=g)
        self.seqs = [torch.randint(1, vocab, (int(n_),), generator=g) for n_ in lengths]
        self.transform = transform
        self.load_ms = load_ms  # a number, not a callable attribute (which the split would try as a transform)

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        if self.load_ms:
            time.sleep(self.load_ms / 1e3)
        ids = self.seqs[i].clone()
        if self.transform is not None:
            ids = self.transform(ids)
        return {"input_ids": ids, "label": i % 2}


class TokenDropout:
    def __init__(self, ms, p=0.1):
        self.sleep, self.p = Sleep(ms), p

    def __call__(self, ids):
        self.sleep(None)
        keep = torch.rand(len(ids)) >= self.p
        keep[0] = True
        return ids[keep]


def pad_collate(samples):
    """Pads to the longest sequence: (token ids [B, T], lengths [B], labels [B])."""
    ids = nn.utils.rnn.pad_sequence([s["input_ids"] for s in samples], batch_first=True, padding_value=0)
    lengths = torch.tensor([len(s["input_ids"]) for s in samples])
    return ids, lengths, torch.tensor([s["label"] for s in samples])


class BagOfTokens(nn.Module):
    def __init__(self, vocab=50):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.EmbeddingBag(vocab, 8, mode="mean")
        self.head = nn.Linear(8, 2)
        self.delay = SleepLayer(2.0)

    def forward(self, ids, lengths):
        mask = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
        return self.delay(self.head(self.emb(ids[mask], offsets)))


def test_padding_collate_for_variable_length_tokens():
    model = BagOfTokens()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    widths = set()

    def step(batch):
        ids, lengths, labels = batch
        widths.add(ids.shape[1])
        assert int(lengths.max()) == ids.shape[1]
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(ids, lengths), labels).backward()
        opt.step()

    # load 1.5 ms a sample, a quarter of augment's: both stages real, augment far ahead
    loader = DataLoader(Tokens(transform=TokenDropout(AUG_MS), load_ms=AUG_MS / 4), batch_size=8, shuffle=True,
                        collate_fn=pad_collate)
    report = bisect(model, loader, optimizer=opt, step=step, device="cpu", max_seconds=MAX_S, plan=FAST_PLAN, verify_seconds=0)
    assert {p.point: p.status for p in report.points} == all_measured(report), str(report)
    assert_names(report, "augment")
    assert len(widths) > 1  # batches really are padded to different lengths


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pin_memory()/to() of a custom batch need CUDA")
def test_custom_batch_pins_and_moves_itself_on_cuda():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    devices = set()

    def step(batch):
        devices.add((batch.inp.device.type, batch.tgt.device.type))
        train(model, opt, batch.inp, batch.tgt)

    loader = DataLoader(Structured("custom", transform=Sleep(AUG_MS)), batch_size=8, shuffle=True,
                        collate_fn=custom_collate, pin_memory=True)
    report = bisect(model, loader, optimizer=opt, step=step, device="cuda", max_seconds=MAX_S, plan=FAST_PLAN, verify_seconds=0)
    assert {p.point: p.status for p in report.points} == all_measured(report), str(report)
    assert devices == {("cuda", "cuda")}
