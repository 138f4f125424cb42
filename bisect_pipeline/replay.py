"""Fill the caches once, then build one batch source per cache point.

Every loader built here keeps the user's settings downstream of its cache point
(workers, pinning, prefetching, collate, worker_init_fn, multiprocessing context), so
the drop between two adjacent points is the cost of exactly one stage. Each source is a
context manager: leaving it shuts its workers down, whatever happened.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import time
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, get_worker_info

from . import faults, stages
from .errors import BisectError
from .faults import StageError, StepTimeout
from .stages import LoaderSpec, SplitError

# Distinct batches kept per cache point: enough that a replay loader with a few workers
# and prefetching cycles through different data, few enough to fill in seconds.
DEFAULT_CACHE_BATCHES = 8
# Copies of each batch the caches hold at once (raw inputs, samples, collated, host,
# device): used to turn the memory budget into a number of batches.
_COPIES = 5


@dataclasses.dataclass
class Caches:
    batch_size: int
    dataset: Any  # the copy of the user's dataset used to fill (transforms proxied when found)
    samples: list  # dataset outputs (the `augmented` point)
    raw_calls: Optional[list]  # per sample, the transform calls to replay (the `raw` point)
    raw_reason: Optional[str]  # why `raw` is unavailable, when it is
    raw_found: list  # the transforms found on the dataset
    batches: list  # collate_fn outputs (the `collated` point)
    batch_bytes: int
    fill_seconds: float
    limited_by: Optional[str] = None  # "memory budget" or "time" when fewer batches were kept
    stopped_by: Optional[str] = None  # an error that ended the fill after the first batch
    warnings: list = dataclasses.field(default_factory=list)  # problems seen while filling (for the report)

    @property
    def n_batches(self) -> int:
        return len(self.batches)


def fill(spec: LoaderSpec, *, cache_mb: float, max_batches: int = DEFAULT_CACHE_BATCHES,
         time_budget: float = 10.0, clock: Callable[[], float] = time.perf_counter,
         on_batch: Callable[[int], None] = lambda n: None) -> Caches:
    """Build the first batches of the pipeline once, in this process, keeping every
    intermediate product: transform inputs, samples, and collated batches.

    Stops at `max_batches`, at the memory budget, or after `time_budget` seconds (with
    at least one batch). An error after the first batch keeps what was built (said in
    `stopped_by`); an error before it raises FillError naming the stage. A hang is
    ended by the caller's watchdog (faults.StepTimeout): the reason names the sample
    and the stage it hung in. `on_batch(n)` is called after each batch is cached.
    """
    start = clock()
    found_warnings = _pipeline_warnings(spec)
    rec = _Recording(spec)
    samples: list = []
    batches: list = []
    batch_bytes = 0
    limited_by = stopped_by = None
    batch_size = spec.batch_size
    groups = _sample_groups(spec, rec.dataset)
    at = {"index": None, "n": 0}  # the sample being built, for a hang's reason
    while True:
        try:
            group = next(groups)
            group_samples = []
            for index, item in group:
                at["index"], at["n"] = index, at["n"] + 1
                group_samples.append(rec.sample(index, item))
            batch = faults.Tagged(spec.collate_fn, "collate")(
                group_samples if spec.auto_collation else group_samples[0])
        except StopIteration:
            break
        except faults.StepTimeout as exc:
            stage = faults.stage_in_traceback(exc) or "load"
            which = f"sample {at['index']}" if at["index"] is not None else f"sample #{at['n']} of the iterator"
            reason = f"{which} hung in {stage}: {exc}"
            if not batches:
                raise FillError(stage, reason, hang=True) from exc
            stopped_by = reason
            break
        except Exception as exc:
            tagged = exc if isinstance(exc, StageError) else faults.stage_error("load", exc)
            stage, reason = faults.classify(tagged)
            if not batches:
                raise FillError(stage, reason) from exc
            stopped_by = reason  # keep the batches already cached
            break
        samples.extend(group_samples)
        batches.append(stages.clone_data(batch))
        if batch_size is None:
            batch_size = stages.leading_dim(batch) or 1
        batch_bytes = max(batch_bytes, stages.nbytes(batch))
        on_batch(len(batches))
        if len(batches) >= max_batches:
            break
        if (len(batches) + 1) * batch_bytes * _COPIES > cache_mb * 2**20:
            limited_by = "memory budget"
            break
        if clock() - start > time_budget:
            limited_by = "time"
            break
    if not batches:
        raise BisectError("the loader yields no batch: its dataset is empty (or smaller than one batch with "
                          "drop_last=True). Check the dataset your entry function builds.")
    raw_calls = rec.raw_calls if rec.raw_calls is not None and len(rec.raw_calls) == len(samples) else None
    return Caches(batch_size=batch_size, dataset=rec.dataset, samples=samples, raw_calls=raw_calls, raw_reason=rec.raw_reason,
                  raw_found=rec.found, batches=batches, batch_bytes=batch_bytes, fill_seconds=clock() - start,
                  limited_by=limited_by, stopped_by=stopped_by, warnings=found_warnings)


def _pipeline_warnings(spec: LoaderSpec) -> list:
    """Problems of the pipeline itself, seen before it is measured: an IterableDataset
    whose workers all yield the same samples. They reach the report's warnings
    (api._before_run): bisect() never prints."""
    from . import integrations

    out = []
    if spec.iterable:
        dup = integrations.iterable_duplicates(spec.dataset, spec.num_workers, spec.worker_init_fn)
        if dup:
            out.append(dup)
    return out


class FillError(Exception):
    """Not even one batch could be built: every cached point fails with this reason."""

    def __init__(self, stage: Optional[str], reason: str, hang: bool = False) -> None:
        super().__init__(reason)
        self.stage = stage
        self.reason = reason
        self.hang = hang


class _Recording:
    """Builds samples through proxied transforms while the raw split holds, recording
    each sample's transform calls; gives the split up (with the reason) when it fails."""

    def __init__(self, spec: LoaderSpec) -> None:
        self.spec = spec
        self.inst = None
        self.raw_reason: Optional[str] = None
        if spec.iterable:
            self.raw_reason = ("the dataset is an IterableDataset: its samples come out of one iterator, so its "
                               "transforms cannot be run apart from loading")
        else:
            try:
                self.inst = stages.instrument(spec.dataset)
            except Exception as exc:  # copy.copy refused
                self.raw_reason = f"the dataset could not be copied to proxy its transforms ({type(exc).__name__}: {exc})"
            if self.inst is not None and not self.inst.found:
                from . import integrations

                self.raw_reason = integrations.no_transform_reason(spec.dataset) or (
                    f"no per-sample transform was found on {type(spec.dataset).__name__} (looked for "
                    f"{', '.join(stages.TRANSFORM_ATTRS)}, also through Subset and ConcatDataset). Keep the "
                    "transforms in `self.transform` and apply them in __getitem__, as torchvision datasets do, "
                    "to separate loading from augmentation")
                self.inst = None
        self.found = list(self.inst.found) if self.inst is not None else []
        self.dataset = self.inst.dataset if self.inst is not None else _copy_or_same(spec.dataset)
        self.raw_calls: Optional[list] = [] if self.inst is not None else None
        from .integrations import fetches_batches

        self.batched_fetch = self.inst is not None and fetches_batches(spec.dataset)

    def sample(self, index: Any, item: Any) -> Any:
        if self.spec.iterable:
            return stages.clone_data(item)
        if self.raw_calls is None:
            return stages.clone_data(self.dataset[index])
        try:
            sample, calls = stages.record_sample(self.inst, index)
            if len(self.raw_calls) < 2:  # check the split on the first samples
                if not calls:
                    raise SplitError(f"{', '.join(self.inst.found)} exist(s) but __getitem__ never called them")
                diff = stages.same_structure(stages.replay_sample(sample, calls), sample)
                if diff:
                    raise SplitError(f"replaying the transforms does not rebuild the sample ({diff})")
        except SplitError as exc:
            self.raw_reason, self.raw_calls = str(exc), None
            return stages.clone_data(self.dataset[index])
        if self.batched_fetch:
            from .integrations import mark_batched

            mark_batched(calls)
        self.raw_calls.append(calls)
        return stages.clone_data(sample)


def _copy_or_same(dataset: Any) -> Any:
    try:
        return copy.copy(dataset)
    except Exception:
        return dataset


def _sample_groups(spec: LoaderSpec, dataset: Any) -> Iterator[list]:
    """Yield the (index, sample-or-None) pairs of each batch, in the user's order."""
    if spec.iterable:
        it = iter(dataset)
        size = spec.batch_size if spec.auto_collation else 1
        while True:
            group = list(itertools.islice(((None, s) for s in it), size))
            if not group or (spec.drop_last and len(group) < size):
                return
            yield group
    order = stages.index_order(spec)
    if spec.batch_sampler is not None:
        for indices in order:
            yield [(i, None) for i in indices]
    elif spec.auto_collation:
        while True:
            yield [(next(order), None) for _ in range(spec.batch_size)]
    else:
        for i in order:
            yield [(i, None)]


# --------------------------------------------------------------------------------------
# Datasets and samplers of the replay loaders (module level: they cross to workers)
# --------------------------------------------------------------------------------------


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


class _FromIterator(Sampler):
    def __init__(self, it: Iterator) -> None:
        self.it = it

    def __iter__(self):
        return self.it


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

    def __len__(self) -> int:
        return len(self.templates)

    def __getitem__(self, i: int) -> Any:
        try:
            return stages.replay_sample(self.templates[i], self.calls[i])
        except (StageError, StepTimeout):
            raise
        except Exception as exc:
            raise faults.stage_error("augment", exc) from exc

    def __getitems__(self, indices: list) -> list:
        """A batch of samples, as the DataLoader's fetcher asks for them. Where the user's
        dataset fetches whole batches (a Hugging Face Dataset runs its format transform
        once on all the rows of a batch), the transform is replayed the same way."""
        from .integrations import replay_batched

        try:
            batched = replay_batched([self.templates[i] for i in indices], [self.calls[i] for i in indices])
        except (StageError, StepTimeout):
            raise
        except Exception as exc:
            raise faults.stage_error("augment", exc) from exc
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
            return _fresh(self.batches[i], shared=True)
        return stages.clone_data(self.batches[i]) if self.fresh else self.batches[i]


def _fresh(obj: Any, shared: bool) -> Any:
    if isinstance(obj, torch.Tensor) and shared:
        try:
            storage = obj._typed_storage()._new_shared(obj.numel(), device=obj.device)
            return obj.new(storage).view(obj.shape).copy_(obj)
        except Exception:  # private API moved: a plain copy still works, moved to shm on send
            return obj.clone()
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (tuple, list, dict)) or dataclasses.is_dataclass(obj):
        return _map(obj, lambda t: _fresh(t, shared))
    return stages.clone_data(obj)


def _map(obj: Any, fn: Callable) -> Any:
    if isinstance(obj, tuple):
        items = [fn(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        return [fn(v) for v in obj]
    if isinstance(obj, dict):
        new = copy.copy(obj)
        for k, v in obj.items():
            new[k] = fn(v)
        return new
    return dataclasses.replace(obj, **{f.name: fn(getattr(obj, f.name))
                                       for f in dataclasses.fields(obj) if f.init})


def identity(batch: Any) -> Any:
    return batch


# --------------------------------------------------------------------------------------
# Sources: what the timed loop calls once per step
# --------------------------------------------------------------------------------------


class LoaderSource:
    """A replay DataLoader, iterated once; its workers are shut down on exit."""

    def __init__(self, make_loader: Callable[[], DataLoader], restart: bool = False) -> None:
        self._make = make_loader
        self._restart = restart  # an IterableDataset ends: start it again
        self.loader: Optional[DataLoader] = None
        self._it = None
        self.restarts = 0

    def __enter__(self) -> Callable[[], Any]:
        self.loader = self._make()
        self._it = iter(self.loader)
        if not self._restart:
            return self._it.__next__
        return self._next_restarting

    def _next_restarting(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            self.restarts += 1
            if self.restarts > 1000:
                raise RuntimeError("the dataset yields no batch")
            _shutdown(self._it)
            self._it = iter(self.loader)
            return next(self._it)

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:
            _terminate(self._it)  # a hung worker would hold the shutdown for 5 s per worker
        _shutdown(self._it)
        if self.loader is not None:
            _shutdown(getattr(self.loader, "_iterator", None))
        self._it = None
        self.loader = None


def _terminate(it: Any) -> None:
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
    for w in getattr(it, "_workers", None) or ():
        if w.is_alive():
            w.terminate()


def _shutdown(it: Any) -> None:
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        stop()


@contextlib.contextmanager
def cached_source(batches: list, fresh: bool = False):
    """`host` / `device`: cycle over batches already where they need to be. With
    `fresh`, each step gets a copy (for a step that changes its batch in place)."""
    nxt = itertools.cycle(batches).__next__
    if not fresh:
        yield nxt
    else:
        yield lambda: stages.clone_data(nxt())


def _generator() -> torch.Generator:
    # Our own generator: creating an iterator then draws its seed from here, not from
    # the global torch RNG.
    return torch.Generator().manual_seed(0)


def _kwargs(spec: LoaderSpec, collate_fn: Callable) -> dict:
    """The user's worker settings, with its code tagged so a failure names its stage."""
    return spec.worker_kwargs(generator=_generator(), collate_fn=collate_fn,
                              worker_init_fn=faults.tag(spec.worker_init_fn, "worker_init_fn"))


def full_loader(spec: LoaderSpec, dataset: Any = None) -> LoaderSource:
    """`full`: the user's pipeline rebuilt as it is, over a copy of the dataset, in the
    user's sampler order cycled forever. `dataset` is that copy when the caller has one
    (with its transforms proxied, so their failures are named `augment`)."""
    dataset = _copy_or_same(spec.dataset) if dataset is None else dataset
    kw = _kwargs(spec, faults.Tagged(spec.collate_fn, "collate"))
    if spec.iterable:
        def make() -> DataLoader:
            if spec.auto_collation:
                return DataLoader(dataset, batch_size=spec.batch_size, drop_last=spec.drop_last, **kw)
            return DataLoader(dataset, batch_size=None, **kw)
        return LoaderSource(make, restart=True)

    def make() -> DataLoader:
        order = stages.index_order(spec)
        if spec.batch_sampler is not None:
            return DataLoader(dataset, batch_sampler=_FromIterator(order), **kw)
        if spec.auto_collation:
            bs = BatchSampler(_FromIterator(order), spec.batch_size, spec.drop_last)
            return DataLoader(dataset, batch_sampler=bs, **kw)
        return DataLoader(dataset, batch_size=None, sampler=_FromIterator(order), **kw)
    return LoaderSource(make)


def sample_loader(spec: LoaderSpec, dataset: Dataset, batch_size: int) -> LoaderSource:
    """`raw` and `augmented`: samples from a cache dataset, batched as the user batches."""
    kw = _kwargs(spec, faults.Tagged(spec.collate_fn, "collate"))

    def make() -> DataLoader:
        if not spec.auto_collation:
            return DataLoader(dataset, batch_size=None, sampler=Forever(len(dataset)), **kw)
        bs = BatchSampler(Forever(len(dataset)), batch_size, drop_last=True)
        return DataLoader(dataset, batch_sampler=bs, **kw)
    return LoaderSource(make)


def batch_loader(spec: LoaderSpec, batches: list, fresh: bool = False) -> LoaderSource:
    """`collated`: whole batches through the user's workers and pinning (the handoff)."""
    kw = _kwargs(spec, identity)
    dataset = BatchCache(batches, fresh)
    return LoaderSource(lambda: DataLoader(dataset, batch_size=None, sampler=Forever(len(dataset)), **kw))


def host_batches(caches: Caches, spec: LoaderSpec, device: torch.device) -> list:
    """Batches as the loader yields them: pinned when the loader pins."""
    out = [stages.clone_data(b) for b in caches.batches]
    if spec.pin_memory and device.type != "cpu" and torch.cuda.is_available():
        from torch.utils.data._utils.pin_memory import pin_memory

        out = [pin_memory(b) for b in out]
    return out


def device_batches(host: list, move: Callable[[Any], Any], device: torch.device) -> list:
    """Batches already on the device (the ceiling). On the CPU a move returns the same
    tensors, so they are copied to keep them apart from the other caches."""
    out = [move(b) for b in host]
    if device.type == "cpu":
        out = [stages.clone_data(b) for b in out]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out
