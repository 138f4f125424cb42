"""Streaming / IterableDataset pipelines end to end: webdataset over local tar shards
(sharded by worker) with two workers, and the warning for an IterableDataset whose
workers all yield the same samples (silent when it shards)."""

import io
import time
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from bisect_pipeline import bisect
import conftest
from conftest import CLASSES, FAST_PLAN, FEATURES, TINY_PLAN, PlantedIterable, all_measured, assert_names, tiny_model

pytestmark = pytest.mark.e2e  # end to end on real loaders: not in the fast subset

wds = pytest.importorskip("webdataset")

MAX_S = 8
# raw needs per-sample transforms apart from loading; an iterator has none
DUPLICATES = "times per epoch: split the data by worker."



def write_shards(root, shards=4, per_shard=32):
    return conftest.write_shards(root, shards, per_shard)


class Decode:
    """Decode one webdataset sample to (tensor, label), with a planted cost."""

    def __init__(self, ms):
        self.ms = ms

    def __call__(self, sample):
        if self.ms:
            time.sleep(self.ms / 1e3)
        x = np.load(io.BytesIO(sample["x.npy"]))
        return torch.from_numpy(x), int(sample["cls"])


def run(model, loader, plan=FAST_PLAN):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = bisect(model, loader, device="cpu", max_seconds=MAX_S if plan is FAST_PLAN else 4, plan=plan,
                        verify_seconds=0)
    # the warning is in report.warnings, and bisect() does not print it as a Python warning
    assert not [w for w in caught if "does not shard" in str(w.message)]
    return report, list(report.warnings)


def test_webdataset_sharded_by_worker(tmp_path, no_leftover_workers):
    urls = write_shards(tmp_path)
    ds = wds.WebDataset(urls, shardshuffle=False, repeat=True).map(Decode(10.0))  # split_by_worker by default
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    report, messages = run(tiny_model(2.0), loader)
    assert {p.point: p.status for p in report.points} == dict(all_measured(report), raw="unavailable"), str(report)
    assert "IterableDataset" in report.point("raw").reason
    assert_names(report, "load")  # without raw, load + augment is reported as load
    assert not [m for m in messages if DUPLICATES in m], messages


def test_webdataset_without_worker_split_warns_about_duplicates(tmp_path, no_leftover_workers):
    urls = write_shards(tmp_path)
    ds = wds.WebDataset(urls, shardshuffle=False, repeat=True, workersplitter=None).map(Decode(0.0))
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    report, messages = run(tiny_model(2.0), loader, TINY_PLAN)
    assert report.point("full").status == "ok", str(report)
    dup = [m for m in messages if DUPLICATES in m]
    assert dup and dup[0].endswith(" yields every sample 2 times per epoch: split the data by worker."), messages
    (note,) = [n for n in report.notes if n.kind == "pipeline"]
    assert "does not shard across workers" in note.detail and "get_worker_info" in note.detail


class Unsharded(IterableDataset):
    """The classic mistake: every worker runs the whole range."""

    def __init__(self, n=4000):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((FEATURES,), float(i)), i % CLASSES


def test_unsharded_iterable_warns_and_sharded_one_is_silent(no_leftover_workers):
    _, messages = run(tiny_model(2.0), DataLoader(Unsharded(), batch_size=8, num_workers=2,
                                                  multiprocessing_context="fork"), TINY_PLAN)
    assert [m for m in messages if DUPLICATES in m and "Unsharded" in m], messages
    _, messages = run(tiny_model(2.0), DataLoader(PlantedIterable(n=4000), batch_size=8, num_workers=2,
                                                  multiprocessing_context="fork"), TINY_PLAN)
    assert not [m for m in messages if DUPLICATES in m], messages


def test_sharding_in_worker_init_fn_is_followed():
    from bisect_pipeline.pipeline.integrations.iterable import duplicates as iterable_duplicates

    class Ranged(IterableDataset):
        def __init__(self):
            self.start, self.end = 0, 100

        def __iter__(self):
            return iter(range(self.start, self.end))

    def shard(worker_id):  # the torch docs' pattern: split the range in worker_init_fn
        info = torch.utils.data.get_worker_info()
        per = (info.dataset.end - info.dataset.start) // info.num_workers
        info.dataset.start += worker_id * per
        info.dataset.end = info.dataset.start + per

    ds = Ranged()
    assert iterable_duplicates(ds, 2, shard) is None
    assert DUPLICATES in iterable_duplicates(ds, 2, None).message
    assert (ds.start, ds.end) == (0, 100)  # probed on copies
    assert iterable_duplicates(ds, 1, None) is None  # one worker: nothing to duplicate


def test_probe_leaves_state_kept_by_the_datasets_iterators_alone():
    from bisect_pipeline.pipeline.integrations.iterable import duplicates as iterable_duplicates

    class Epochs(IterableDataset):
        def __init__(self):
            self.state = {"epoch": 0}  # e.g. a shard shuffler's epoch counter

        def __iter__(self):
            self.state["epoch"] += 1
            return iter(range(10))

    ds = Epochs()
    assert DUPLICATES in iterable_duplicates(ds, 2, None).message
    assert ds.state == {"epoch": 0}
