"""One batch source per cache point: the replay loaders and cached batches that the timed
loop draws from.

Every loader built here keeps the user's settings downstream of its cache point
(workers, pinning, prefetching, collate, worker_init_fn, multiprocessing context), so
the drop between two adjacent points is the cost of exactly one stage. Each source is a
context manager: leaving it shuts its workers down, whatever happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
import time
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, get_worker_info

from ..core import faults, tree
from ..pipeline import integrations, recording
from ..pipeline.loader import LoaderSpec, copy_or_same, index_order, sampler_copy
from . import devices

# Replay samplers never end. A length is still given, as large as len() takes, for
# DataLoader subclasses that count batches per epoch (timm's MultiEpochsDataLoader).
ENDLESS = sys.maxsize


class Forever(Sampler):
    """Cycles `range(n)` in a fixed shuffled order, forever: no epoch boundary (and no
    worker restart) inside a measurement."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = n
        self.seed = seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(self.n, generator=g).tolist()
        return itertools.cycle(order)

    def __len__(self) -> int:
        return ENDLESS


class Groups(Sampler):
    """A batch sampler that cycles over the groups the user's sampler formed when the
    caches were filled (`raw`, `augmented`): the same samples batched together, so a
    length-bucketing sampler's padding is what it is in the full pipeline."""

    def __init__(self, groups: list) -> None:
        self.groups = groups

    def __iter__(self):
        return itertools.cycle(self.groups)

    def __len__(self) -> int:
        return ENDLESS


class Gate(Sampler):
    """The index sampler of a replay loader kept between visits: the order of `inner`
    (endless) continued from one epoch to the next, each epoch lasting until `close()`.
    Closed, it ends the epoch under way: the loader hands out the batches its workers
    have in hand and stops, and with persistent workers the next iter() starts another
    epoch on the same workers (LoaderSource.park, resume). `epochs`: `inner` is one
    epoch of the user's sampler (full_loader's `epochs`): each iter() is a pass of it,
    ended by its own end or by `close()`."""

    def __init__(self, inner: Sampler, epochs: bool = False) -> None:
        self.inner = inner
        self.epochs = epochs
        self._order: Optional[Iterator] = None
        self._open = True

    def __iter__(self):
        self._open = True
        if self.epochs:
            return self._pass(iter(self.inner))
        if self._order is None:
            self._order = iter(self.inner)
        return self._epoch()

    def _epoch(self):
        while self._open:
            yield next(self._order)

    def _pass(self, order: Iterator):
        for index in order:
            if not self._open:
                return
            yield index

    def close(self) -> None:
        self._open = False

    def __len__(self) -> int:
        if self.epochs:
            try:
                return len(self.inner)
            except TypeError:
                return ENDLESS
        return ENDLESS


class _FromIterator(Sampler):
    def __init__(self, it: Iterator) -> None:
        self.it = it

    def __iter__(self):
        return self.it

    def __len__(self) -> int:
        return ENDLESS


class SampleCache(Dataset):
    """`augmented`: the dataset's outputs, cached."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        return self.samples[i]


class RawReplay(Dataset):
    """`raw`: the transforms' inputs, cached; the transforms run again on every call."""

    def __init__(self, templates: list, calls: list) -> None:
        self.templates = templates
        self.calls = calls
        self._replay = faults.Tagged(recording.replay_sample, "augment")
        self._replay_batched = faults.Tagged(integrations.hf.replay_batched, "augment")

    def __len__(self) -> int:
        return len(self.templates)

    def __getitem__(self, i: int) -> Any:
        return self._replay(self.templates[i], self.calls[i])

    def __getitems__(self, indices: list) -> list:
        """A batch of samples, as the DataLoader's fetcher asks for them. Where the user's
        dataset fetches whole batches (a Hugging Face Dataset runs its format transform
        once on all the rows of a batch), the transform is replayed the same way."""
        batched = self._replay_batched([self.templates[i] for i in indices], [self.calls[i] for i in indices])
        return batched if batched is not None else [self[i] for i in indices]


class BatchCache(Dataset):
    """`collated`: collate_fn's outputs, cached.

    Inside a worker each fetch returns a fresh copy in shared memory, as collate_fn
    makes its output there, so the handoff costs what it costs for real. In the main
    process (num_workers=0) it returns the cached batch itself, as the `device` point
    does: the real loop copies nothing between collate and the step, so neither side of
    the handoff may (a copy there read as a handoff cost that does not exist). With
    `fresh` (a step that changes its batch in place) both sides copy it.
    """

    def __init__(self, batches: list, fresh: bool = False) -> None:
        self.batches = batches
        self.fresh = fresh

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Any:
        if get_worker_info() is not None:
            return tree.map_leaves(_shared_leaf, self.batches[i])
        return tree.clone(self.batches[i]) if self.fresh else self.batches[i]


def _shared_leaf(x: Any) -> Any:
    """A copy of `x` whose tensor lives in new shared memory, as a worker's collate_fn
    makes its output."""
    if not isinstance(x, torch.Tensor):
        return tree.clone(x)
    try:
        storage = x._typed_storage()._new_shared(x.numel(), device=x.device)
        return x.new(storage).view(x.shape).copy_(x)
    except Exception:  # private API moved: a plain copy still works, moved to shm on send
        return x.clone()


def identity(batch: Any) -> Any:
    return batch


def only(items: list) -> Any:
    """The collate of the `collated` point: each group is one cached batch."""
    return items[0]


# --------------------------------------------------------------------------------------
# Sources: what the timed loop calls once per step
# --------------------------------------------------------------------------------------


class LoaderSource:
    """A replay DataLoader; its workers are shut down on exit. One built with `park`
    (its index sampler a Gate, its workers persistent) can be parked between visits
    and resumed (`park`, `resume`), its workers started once."""

    def __init__(self, make_loader: Callable[[], DataLoader], restart: bool = False) -> None:
        self._make = make_loader
        self._restart = restart  # an IterableDataset ends: start it again
        self.loader: Optional[DataLoader] = None
        self._it = None
        self.restarts = 0
        self.gate: Optional[Gate] = None
        self._parked = False

    @property
    def parked(self) -> bool:
        """Parked (`park`): its queue empty and its workers idle until `resume`."""
        return self._parked

    def __enter__(self) -> Callable[[], Any]:
        try:
            with faults.signals_held():  # its workers forked and primed whole, or a Ctrl-C leaves a lock held
                self.loader = self._make()
                self._it = iter(self.loader)
        except BaseException:  # (a Ctrl-C that came meanwhile, raised after): its workers shut down
            self.__exit__(*sys.exc_info())
            raise
        index = self.loader.batch_sampler if self.loader.batch_sampler is not None else self.loader.sampler
        if isinstance(index, Gate) and self.loader.num_workers > 0 and self.loader.persistent_workers:
            self.gate = index
        if self._restart:
            return self._next_restarting
        return self._next if self.gate is not None else self._it.__next__

    def _next(self) -> Any:
        return next(self._it)

    def park(self) -> bool:
        """End the epoch under way and take the batches the workers have in hand (those
        in flight: prefetch_factor per worker at most), so that the workers sit idle
        until `resume`: a parked loader does no work while other points are measured.
        False where it cannot be parked (no gate, or its epoch did not end after the
        batches in flight): close it instead. What the pipeline raises meanwhile goes
        through, as in a window."""
        if self.gate is None or self._it is None:
            return False
        self.gate.close()
        in_flight = (self.loader.prefetch_factor or 2) * self.loader.num_workers
        try:
            for _ in range(in_flight + 1):
                next(self._it)
        except StopIteration:
            self._parked = True
            return True
        return False

    def resume(self) -> None:
        """The next epoch of a parked loader, on its workers (DataLoader's reset of an
        iterator with persistent workers: the prefetch is primed again, as at a start)."""
        if self._parked:
            with faults.signals_held():  # DataLoader's reset: the workers told, the queues primed
                self._it = iter(self.loader)
                self._parked = False

    def _next_restarting(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            self.restarts += 1
            if self.restarts > 1000:
                raise RuntimeError("the dataset yields no batch")
            with faults.signals_held():
                if not (self.loader.persistent_workers and self.loader.num_workers):
                    shutdown(self._it)
                # With persistent workers iter() resets the same iterator and keeps its workers:
                # shutting them down first would leave it nothing to reset.
                self._it = iter(self.loader)
            return next(self._it)

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        with faults.signals_held():
            if exc_type is not None:
                _terminate(self._it)  # a hung worker would hold the shutdown for 5 s per worker
            shutdown(self._it)
            if self.loader is not None:
                shutdown(getattr(self.loader, "_iterator", None))
            self._it = None
            self.loader = None


def _terminate(it: Any, grace: float = 1.0) -> None:
    """Stop a failed point's workers within `grace` seconds in all: DataLoader's own
    shutdown (done event, a None to each worker, join), with a short join, then terminate
    the ones still running: hung in user code. Terminating at once would also kill an
    idle worker in the middle of `done_event.is_set()`, leaving the event's lock held and
    the shutdown's `done_event.set()` blocked for good."""
    workers = [w for w in getattr(it, "_workers", None) or () if w.is_alive()]
    if not workers:
        return
    # Unregister the workers from DataLoader's SIGCHLD check first: killed on purpose
    # here, they would otherwise raise "worker killed by signal Terminated" in whatever
    # the main thread runs next (the next point), hiding the error that ended this one.
    if getattr(it, "_worker_pids_set", False):
        try:
            from torch.utils.data._utils import signal_handling

            signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
        except Exception:  # a torch without this private API: the shutdown still happens
            pass
    done = getattr(it, "_workers_done_event", None)
    if done is not None:
        done.set()
        for q in getattr(it, "_index_queues", None) or ():
            q.put(None)  # the final signal: an idle worker leaves its loop and exits
    end = time.monotonic() + grace
    for w in workers:
        w.join(max(0.0, end - time.monotonic()))
    for w in workers:
        if w.is_alive():
            w.terminate()


def shutdown(it: Any) -> None:
    """Shut a DataLoader iterator's workers down (a replay loader's, or an iterator of the
    user's, which the experiment takes over: loop_loaders.py)."""
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        with faults.signals_held():  # a Ctrl-C in the middle would leave workers, or a lock, behind
            stop()


@contextlib.contextmanager
def cached_source(batches: list, fresh: bool = False):
    """`host` / `device`: cycle over batches already where they need to be. With
    `fresh`, each step gets a copy (for a step that changes its batch in place)."""
    nxt = itertools.cycle(batches).__next__
    if not fresh:
        yield nxt
    else:
        yield lambda: tree.clone(nxt())


def _generator() -> torch.Generator:
    # Our own generator: creating an iterator then draws its seed from here, not from
    # the global torch RNG.
    return torch.Generator().manual_seed(0)


def _kwargs(spec: LoaderSpec, collate_fn: Callable, park: bool = False) -> dict:
    """The user's worker settings, with its code tagged so a failure names its stage.
    `park`: workers persistent, so that the loader can be parked between visits (its
    epochs end only there, outside any window, where persistence is all it changes)."""
    kw = spec.worker_kwargs(generator=_generator(), collate_fn=collate_fn,
                            worker_init_fn=faults.tag(spec.worker_init_fn, "worker_init_fn"))
    if park and spec.num_workers > 0:
        kw["persistent_workers"] = True
    return kw


def _index(sampler: Sampler, park: bool, epochs: bool = False) -> Sampler:
    """A replay loader's index sampler, behind a Gate when the loader is to be parked
    (`epochs`: a sampler of one epoch, Gate's)."""
    return Gate(sampler, epochs) if park else sampler


def loader_class(spec: LoaderSpec) -> tuple[LoaderSpec, Optional[str]]:
    """`spec` with the class its replay loaders are built through: the user's own class
    when it builds and yields batches from the DataLoader arguments over replay data (one
    tiny loader in this process, two batches), else DataLoader, with a warning that says
    what is then not measured."""
    cls = spec.loader_cls
    if cls is DataLoader:
        return spec, None
    try:
        probe = cls(list(range(4)), batch_sampler=Groups([[0, 1], [2, 3]]), num_workers=0, collate_fn=identity)
        it = iter(probe)
        next(it), next(it)
        shutdown(getattr(probe, "_iterator", None))
        return spec, None
    except Exception as exc:
        name = f"{cls.__module__}.{cls.__qualname__}"
        return dataclasses.replace(spec, loader_cls=DataLoader), (
            f"the loader is a {name}, which could not be rebuilt from the DataLoader arguments over replay data "
            f"({type(exc).__name__}: {str(exc)[:200]}): every point runs a plain DataLoader with your settings, so "
            f"what {cls.__qualname__} itself adds per batch (an overridden __iter__, a device move, ...) is not "
            "measured.")


def full_loader(spec: LoaderSpec, dataset: Any = None, epochs: bool = False, park: bool = False) -> LoaderSource:
    """`full`: the user's pipeline rebuilt as it is, over a copy of the dataset, in the
    user's sampler order cycled forever. `dataset` is that copy when the caller has one
    (with its transforms proxied, so their failures are named `augment`).

    `epochs`: end each epoch as the user's loop does, and start the next with iter()
    on the loader, which forks the workers again unless they are persistent (verify.py:
    adding workers adds that cost per epoch, which a loop at num_workers=0 never pays).
    The points of the bisection all run without epoch ends, alike.
    `park`: a loader that can be parked between visits (LoaderSource.park; map-style
    datasets only; with `epochs`, where the settings' workers are persistent: parked,
    its epoch ends early, and the next visit starts another on the same workers, as the
    next epoch of the user's loop would)."""
    dataset = copy_or_same(spec.dataset) if dataset is None else dataset
    park = park and not spec.iterable and (not epochs or bool(spec.persistent_workers))
    kw = _kwargs(spec, faults.Tagged(spec.collate_fn, "collate"), park)
    if spec.iterable:
        return stream_loader(spec, dataset, kw)

    def make() -> DataLoader:
        # one epoch of a copy of the user's sampler per iter(), or its order cycled forever
        sampler = sampler_copy(spec) if epochs else _FromIterator(index_order(spec))
        if spec.batch_sampler is not None:
            return spec.loader_cls(dataset, batch_sampler=_index(sampler, park, epochs), **kw)
        if spec.auto_collation:
            batches = BatchSampler(sampler, spec.batch_size, spec.drop_last)
            return spec.loader_cls(dataset, batch_sampler=_index(batches, park, epochs), **kw)
        return spec.loader_cls(dataset, batch_size=None, sampler=_index(sampler, park, epochs), **kw)
    return LoaderSource(make, restart=epochs)


def stream_loader(spec: LoaderSpec, dataset: Any, kw: Optional[dict] = None) -> LoaderSource:
    """An IterableDataset in the user's loader settings, started again where it ends:
    `full` of an IterableDataset, and the `raw` and `augmented` replays of a pipeline cut
    into its stages (integrations.webdataset.Cuts.replay)."""
    kw = kw if kw is not None else _kwargs(spec, faults.Tagged(spec.collate_fn, "collate"))

    def make() -> DataLoader:
        if spec.auto_collation:
            return spec.loader_cls(dataset, batch_size=spec.batch_size, drop_last=spec.drop_last, **kw)
        return spec.loader_cls(dataset, batch_size=None, **kw)
    return LoaderSource(make, restart=True)


def sample_loader(spec: LoaderSpec, dataset: Dataset, groups: list, park: bool = False) -> LoaderSource:
    """`raw` and `augmented`: samples from a cache dataset, in the groups the user's
    sampler formed (cache.Caches.groups). `park`: see full_loader."""
    kw = _kwargs(spec, faults.Tagged(spec.collate_fn, "collate"), park)

    def make() -> DataLoader:
        if not spec.auto_collation:
            return spec.loader_cls(dataset, batch_size=None, sampler=_index(Forever(len(dataset)), park), **kw)
        return spec.loader_cls(dataset, batch_sampler=_index(Groups(groups), park), **kw)
    return LoaderSource(make)


def batch_loader(spec: LoaderSpec, batches: list, fresh: bool = False, park: bool = False) -> LoaderSource:
    """`collated`: whole batches through the user's workers and pinning (the handoff).
    `park`: see full_loader."""
    kw = _kwargs(spec, only, park)
    dataset = BatchCache(batches, fresh)
    # groups of one batch, through a batch_sampler like every other point: the form a
    # DataLoader subclass is probed with (sources.loader_class); timm's
    # MultiEpochsDataLoader cannot take batch_size=None with a sampler of no length
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()
    groups = Groups([[i] for i in order])
    return LoaderSource(lambda: spec.loader_cls(dataset, batch_sampler=_index(groups, park), **kw))


def host_batches(caches: Any, spec: LoaderSpec, device: torch.device, n: Optional[int] = None) -> list:
    """The first `n` cached batches (all by default) as the loader yields them: pinned
    when the loader pins."""
    out = [tree.clone(b) for b in caches.batches[:n]]
    if spec.pin_memory and device.type != "cpu" and torch.cuda.is_available():
        from torch.utils.data._utils.pin_memory import pin_memory

        out = [pin_memory(b) for b in out]
    return out


def device_batches(host: list, move: Callable[[Any], Any], device: torch.device) -> list:
    """Batches already on the device (the ceiling). On the CPU a move returns the same
    tensors, so they are copied to keep them apart from the other caches."""
    out = [move(b) for b in host]
    if device.type == "cpu":
        out = [tree.clone(b) for b in out]
    devices.synchronizer(device)()
    return out
