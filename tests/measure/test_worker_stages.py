"""The workers' stages timed alone (worker_stages.py): the collate warm and beside
default_collate, the batch mixers a collate_fn holds, what a sample holds for
default_collate, a streaming dataset's load across its chunks."""

import time

import numpy as np
import pytest
import torch
from PIL import Image

from bisect_pipeline.measure import worker_stages
from conftest import FakeClock


def test_sample_structure_counts_what_default_collate_turns_into_tensors():
    sample = {"img": Image.new("RGB", (8, 8)), "feats": [0.5] * 20, "arr": np.zeros(3), "name": "a",
              "t": torch.zeros(2), "label": 3}
    st = worker_stages.sample_structure(sample).to_dict()
    assert st["images"] == 1 and st["numbers"] == 21 and st["longest_list"] == 20
    assert st["ndarrays"] == 1 and st["strings"] == 1 and st["tensors"] == 1
    assert st["leaves"] == 25


def test_default_collate_runs_beside_a_custom_collate_on_the_same_batches(monkeypatch):
    from types import SimpleNamespace
    clock, seen = FakeClock(), []

    def mixup(samples):  # 10 ms a batch on the fake clock
        clock.t += 0.010
        return torch.stack([s * 0.5 for s in samples])

    def stacking(samples):  # torch's default_collate, recorded
        seen.append(len(samples))
        return torch.stack(samples)
    monkeypatch.setattr(worker_stages, "default_collate", stacking)
    samples = [torch.full((2,), float(i)) for i in range(16)]
    spec = SimpleNamespace(auto_collation=True, collate_fn=mixup)
    caches = SimpleNamespace(samples=samples, groups=[list(range(i, i + 2)) for i in range(0, 16, 2)])
    col = worker_stages.time_collate(spec, caches, 0.06, clock)  # 30 ms for mixup: 3 timed batches after the warm-up
    assert col.batches == 3 and col.ms_per_batch == 10.0 and col.collate_fn == "test_default_collate_runs_" \
        "beside_a_custom_collate_on_the_same_batches.<locals>.mixup"
    assert seen == [2] * 4  # the warm-up and the 3 batches mixup was timed on, not the 8 cached
    assert col.default_collate_ms_per_batch == 0.0


def test_a_collate_of_microseconds_is_timed_warm_over_the_cached_batches_again():
    """The caches hold a few batches; the first calls of a collate run colder than a
    worker's batch after batch. On a fake clock the collate_fn takes 10 ms on each of its
    first three calls (the first untimed), 1 ms after: one pass over 8 batches reads
    (2 x 10 + 5) / 7 = 3.6 ms; timed again over the same batches up to COLLATE_CALLS, the
    figure comes near the 1 ms a worker pays batch after batch. A collate_fn that cannot
    run twice on its batches (it pops their keys) keeps the first pass's figure."""
    from types import SimpleNamespace
    clock, calls = FakeClock(), []

    def warming(samples):
        calls.append(len(samples))
        clock.t += 0.010 if len(calls) <= 3 else 0.001
        return torch.stack(samples)
    samples = [torch.full((2,), float(i)) for i in range(16)]
    caches = SimpleNamespace(samples=samples, groups=[list(range(i, i + 2)) for i in range(0, 16, 2)])
    col = worker_stages.time_collate(SimpleNamespace(auto_collation=True, collate_fn=warming), caches, 10.0, clock)
    assert col.batches >= worker_stages.COLLATE_CALLS
    assert 1.0 < col.ms_per_batch < 1.5

    def popping(samples):
        clock.t += 0.002
        return torch.stack([s.pop("x") for s in samples])
    dicts = [{"x": torch.full((2,), float(i))} for i in range(16)]
    caches = SimpleNamespace(samples=dicts, groups=[list(range(i, i + 2)) for i in range(0, 16, 2)])
    col = worker_stages.time_collate(SimpleNamespace(auto_collation=True, collate_fn=popping), caches, 10.0, clock)
    assert col.ok and col.batches == 7 and col.ms_per_batch == pytest.approx(2.0)


def test_batch_mixers_are_found_where_a_collate_fn_keeps_them():
    import functools
    from torch.utils.data import default_collate
    from torchvision.transforms import v2
    mixup, cutmix = v2.MixUp(num_classes=4), v2.CutMix(num_classes=4)
    choice = v2.RandomChoice([mixup, cutmix])

    def reference(batch):  # the torchvision reference's collate_fn: a closure over RandomChoice
        return choice(*default_collate(batch))

    class Holder:
        def __init__(self):
            self.mix = mixup

        def __call__(self, batch):
            return self.mix(*default_collate(batch))

    def mixes(fn, batch, m):
        return m(*default_collate(batch))
    assert worker_stages.batch_mixers(reference) == ("MixUp", "CutMix")
    assert worker_stages.batch_mixers(Holder()) == ("MixUp",)
    assert worker_stages.batch_mixers(functools.partial(mixes, m=cutmix)) == ("CutMix",)
    assert worker_stages.batch_mixers(mixup) == ("MixUp",)
    assert worker_stages.batch_mixers(default_collate) == () and worker_stages.batch_mixers(lambda b: b) == ()


def test_a_streaming_datasets_load_is_timed_across_its_chunks_through_its_iterator(tmp_path):
    """litdata reads a chunk of 50 samples at once: its opening (20 ms planted on the fake
    clock) is paid once a chunk, so a sample costs 0.4 ms in a worker; the 8 cached
    samples lie inside the first chunk, whose opening is the untimed warm-up."""
    ld = pytest.importorskip("litdata", reason="litdata is not installed: pip install 'bisect-pipeline[litdata]'")
    from types import SimpleNamespace
    from litdata.streaming.cache import Cache
    from litdata.streaming.sampler import ChunkedIndex
    from bisect_pipeline.core.results import PerSample
    writer = Cache(str(tmp_path), chunk_size=50)
    for i in range(200):
        writer[i] = {"x": float(i), "y": i % 3}
    writer.done()
    writer.merge()
    clock, opened, seen = FakeClock(), [], []

    class ChunkOpening(ld.StreamingDataset):
        def __getitem__(self, index):
            i = int(index.index if isinstance(index, ChunkedIndex) else index)
            seen.append(isinstance(index, ChunkedIndex))
            if not opened or opened[-1] != i // 50:
                opened.append(i // 50)
                clock.t += 0.020
            return super().__getitem__(index)
    spec = SimpleNamespace(iterable=True, dataset=ChunkOpening(str(tmp_path)), batch_sampler=None)
    caches = SimpleNamespace(samples=[None] * 8, stages=None)
    load = worker_stages.time_load(spec, caches, PerSample.missing("unavailable", "no transform"), 1.0, clock)
    assert all(seen) and opened == [0, 1, 2, 3]  # its iterator, one epoch: every chunk
    assert load.samples == 199 and load.ms_per_sample == pytest.approx(60 / 199, abs=1e-3)


class StreamingDataset(torch.utils.data.IterableDataset):
    """Stands in for MosaicML's (named so, in a module named `streaming`): `get_item` takes
    1 ms a sample (a planted sleep); its iterator, as the loader's workers run it, 3 ms more
    (the partition, the shard bookkeeping, the threads that get shards ready)."""

    def __len__(self):
        return 400

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.full((4,), float(i))

    def __iter__(self):
        for i in range(len(self)):
            time.sleep(0.003)
            yield self[i]


StreamingDataset.__module__ = "streaming.base.dataset"


def test_a_streaming_dataset_whose_iterator_costs_more_than_its_get_item_has_the_iterator_s_cost_alone():
    from types import SimpleNamespace
    from bisect_pipeline.core.results import PerSample
    spec = SimpleNamespace(iterable=True, dataset=StreamingDataset(), batch_sampler=None, num_workers=2,
                           worker_init_fn=None, multiprocessing_context=None)
    caches = SimpleNamespace(samples=[None] * 8, stages=None)
    load = worker_stages.time_load(spec, caches, PerSample.missing("unavailable", "no transform"), 0.6,
                                   time.perf_counter)
    # through its iterator in a worker: about 4 ms a sample; by index, kept beside it: about 1
    assert load.ok and load.index_ms_per_sample is not None and load.samples >= 20
    assert 0.9 <= load.index_ms_per_sample < 2.5 and load.ms_per_sample >= load.index_ms_per_sample + 2.0
    assert "through its iterator in a worker" in load.note
    # where the loader has no workers of its own, by index as before
    alone = worker_stages.time_load(SimpleNamespace(**{**spec.__dict__, "num_workers": 0}), caches,
                                    PerSample.missing("unavailable", "no transform"), 0.3, time.perf_counter)
    assert alone.index_ms_per_sample is None and alone.ms_per_sample < 2.5
