"""A streaming dataset's samples timed as its loader gets them: through its iterator, in a
worker process (worker_stages.time_load).

A streaming dataset (MosaicML's StreamingDataset) builds each sample in its iterator:
the worker's partition of the samples, its shard bookkeeping and the threads that get the
shards ready run around the per-sample access (`get_item`, then the transforms). Timed by
index in this process, `dataset[i]` misses all of that (docs/supported-pipelines.md). It
cannot be iterated in this process (its shared state would count the process as a worker
of its own and hang the user's workers: cache.by_index), so it is iterated where the
loader iterates it: in a DataLoader worker of its own (one worker, the user's
worker_init_fn and start method: its worker info, its one intra-op thread), the dataset
wrapped so that the worker times each sample it takes from the iterator and hands back
those times only, never the samples. The whole sample is timed, transforms and all: in
the worker its threads slow whatever the main thread runs (the transforms too:
docs/benchmarks.md), and the rounds put all of that in `load` (full less raw, where raw
replays the transforms without the iterator), so the caller takes from it the
transforms as timed without the iterator.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Optional

import torch

from ..core import faults
from ..pipeline.loader import LoaderSpec
from . import devices, sources
from .timed import Timed

# Seconds the worker may take to hand over its first timing (its start, the iterator's
# partition and first shard, one untimed sample) beyond the share: past it the figure by
# index stands (DataLoader's timeout ends the wait).
START_S = 10.0


class _Timing(torch.utils.data.IterableDataset):
    """`dataset` iterated in the worker: for each sample after the first (the iterator's
    start, untimed), the seconds from asking for it to having it, for `share` seconds."""

    def __init__(self, dataset: Any, share: float) -> None:
        self.dataset, self.share = dataset, share

    def __iter__(self) -> Iterator[tuple]:
        clock = time.perf_counter
        it = iter(self.dataset)
        if next(it, StopIteration) is StopIteration:
            return
        t0 = clock()
        while clock() - t0 < self.share:
            cpu, start = devices.cpu_seconds(), clock()
            if next(it, StopIteration) is StopIteration:
                return
            took = clock() - start
            yield took, devices.cpu_seconds() - cpu


def in_a_worker(spec: LoaderSpec, dataset: Any, share: float) -> Optional[Timed]:
    """The samples timed through the iterator (whole: their transforms in), or None where
    the worker handed over none in `share` (a dataset that ended). Raises where the worker
    fails or does not start within START_S (the caller keeps the figure by index)."""
    loader = torch.utils.data.DataLoader(_Timing(dataset, share), batch_size=None, num_workers=1,
                                         worker_init_fn=spec.worker_init_fn,
                                         multiprocessing_context=spec.multiprocessing_context,
                                         timeout=START_S + share)
    it, rows = None, []
    try:
        with faults.signals_held():  # its worker forked whole (faults.signals_held)
            it = iter(loader)
        for row in it:
            rows.append(tuple(float(x) for x in row))
    finally:
        sources.shutdown(it)
    if not rows:
        return None
    each = tuple(r[0] for r in rows)
    return Timed(len(rows), sum(each), each, sum(r[1] for r in rows))
