"""Replay loaders: what each cache point adds must be paid on both sides of a drop."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

from bisect_pipeline import bisect
from bisect_pipeline.sources import BatchCache
from conftest import FAST_PLAN, make_loader

PIXELS = (3, 160, 160)  # float32: 300 KiB a sample, 19 MiB a batch of 64


class BigImages(Dataset):
    def __init__(self, n: int = 256) -> None:
        self.images = torch.rand(8, *PIXELS)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.images[i % 8], i % 4


def sleep_step(batch) -> None:
    time.sleep(0.010)


def test_batch_cache_copies_only_where_the_real_pipeline_makes_a_new_batch():
    batches = [torch.arange(4.0)]
    assert BatchCache(batches)[0] is batches[0]  # main process: the loop copies nothing there
    fresh = BatchCache(batches, fresh=True)[0]  # a step that changes its batch gets a copy
    assert fresh is not batches[0] and torch.equal(fresh, batches[0])


def test_at_num_workers_0_large_batches_show_no_handoff_cost():
    # Nothing happens between collate and the step when num_workers=0. The collated point
    # used to copy each 19 MiB batch, a cost the real loop never pays: it read as a real
    # handoff of several ms per batch next to a 10 ms step.
    loader = make_loader(BigImages(), batch_size=64)
    report = bisect(None, loader, step=sleep_step, device="cpu", plan=FAST_PLAN, max_seconds=30,
                    points=["full", "augmented", "collated", "device"])
    handoff = report.stage("handoff")
    assert handoff.status == "ok" and not handoff.significant, handoff
    assert report.bottleneck != "handoff"
    assert not any("breaks its own rules" in w for w in report.warnings)
