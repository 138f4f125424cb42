"""IterableDataset: does it shard across workers? (An IterableDataset that does not
yields every sample once per worker.)"""

from __future__ import annotations

import copy
import hashlib
import itertools
from typing import Any, Callable, Optional

import torch

from ...core import tree
from ...core.results import Note
from . import streaming

PROBE_SAMPLES = 2


def duplicates(dataset: Any, num_workers: int, worker_init_fn: Optional[Callable] = None) -> Optional[Note]:
    """A warning (a `pipeline` note) when an IterableDataset yields the same first samples
    in two workers.

    The check runs in this process: for worker 0 and worker 1 it takes a fresh copy of
    the dataset, makes `torch.utils.data.get_worker_info()` return what a real worker
    would see (id, num_workers, that copy), calls the loader's worker_init_fn (where the
    torch docs shard), and takes the first samples. Equal fingerprints mean the workers
    would both yield them. This follows whatever sharding the dataset does (get_worker_info
    in __iter__, webdataset's split_by_worker, worker_init_fn) without starting a process
    or reading the dataset's code, and costs a few samples. RNG states and the thread count
    are restored after it.
    """
    if num_workers < 2 or not isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    if streaming.is_streaming(dataset):  # they partition by worker themselves (and wait for each other to)
        return None
    from torch.utils.data._utils import worker as worker_mod

    from .. import state as state_mod

    snap = state_mod.capture(None, None)
    prints = []
    try:
        for wid in (0, 1):
            ds = _probe_copy(dataset)
            saved = worker_mod._worker_info
            worker_mod._worker_info = worker_mod.WorkerInfo(id=wid, num_workers=num_workers, seed=wid, dataset=ds)
            it = None
            try:
                if worker_init_fn is not None:
                    worker_init_fn(wid)
                it = iter(ds)
                items = list(itertools.islice(it, PROBE_SAMPLES))
            finally:
                worker_mod._worker_info = saved
                close = getattr(it, "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception:
                        pass
            prints.append(_fingerprint(items))
    except Exception:
        return None  # the check is best effort; the measurement itself will show failures
    finally:
        state_mod.restore(snap, None, None)
    if not prints[0] or prints[0] != prints[1]:
        return None
    return Note("pipeline", f"{type(dataset).__name__} yields every sample {num_workers} times per epoch: split the "
                            "data by worker.",
                detail=f"it is an IterableDataset that does not shard across workers: workers 0 and 1 of "
                       f"{num_workers} yield the same first samples. Split the data by worker in __iter__ "
                       "(torch.utils.data.get_worker_info()), or use a sharded source (e.g. webdataset's "
                       "split_by_worker)")


# A dataset holding more than this in memory is probed on a shallow copy (a deep copy
# would cost time and memory); smaller ones on a deep copy, so that state their
# iterators keep (shard-shuffle epochs, counters) stays the user's own.
_DEEPCOPY_MAX_BYTES = 64 * 2**20


def _probe_copy(dataset: Any) -> Any:
    try:
        if tree.nbytes(vars(dataset)) <= _DEEPCOPY_MAX_BYTES:
            return copy.deepcopy(dataset)
    except Exception:  # not deep-copyable (open files, locks): a shallow copy
        pass
    return copy.copy(dataset)


def _fingerprint(obj: Any, depth: int = 0) -> Optional[str]:
    """A digest of the samples' values and structure, or None when a part of them cannot
    be compared (an object with neither bytes nor attributes)."""
    h = hashlib.sha1()
    if depth > tree.MAX_DEPTH:
        return h.hexdigest()
    for path, leaf in tree.leaves(obj):
        h.update(repr(path).encode())
        if not _feed(h, leaf, depth):
            return None
    return h.hexdigest()


def _feed(h: Any, leaf: Any, depth: int) -> bool:
    if isinstance(leaf, torch.Tensor):
        t = leaf.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return True
    if isinstance(leaf, (str, bytes, int, float, bool, type(None))):
        h.update(repr(leaf).encode())
        return True
    tobytes = getattr(leaf, "tobytes", None)  # numpy arrays, PIL images
    if callable(tobytes):
        h.update(type(leaf).__name__.encode())
        h.update(tobytes())
        return True
    if hasattr(leaf, "__dict__"):  # a plain object: its attributes
        digest = _fingerprint(dict(vars(leaf)), depth + 1)
        if digest is None:
            return False
        h.update(type(leaf).__name__.encode() + digest.encode())
        return True
    return False
