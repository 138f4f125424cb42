"""A torchdata.nodes graph's caches and batch sources: cache.py's `fill` and sources.py's
sources for a NodeSpec (pipeline/integrations/nodes.py), the measuring layer's one
interface (Experiment dispatches to them where it builds caches and sources).

The fill runs a copy of the graph in this thread (every Mapper inline, no Prefetcher
or PinMemory) with a tap at each cut, and records each per-sample Mapper's calls (their
input and function: `raw_calls`, what worker_stages.py replays alone). Each point's source is
the graph downstream of its cut rebuilt with the user's settings over a node that
cycles over the cached items (Cycle), or, at `full`, over a copy of its source started
again at its end (Endless): no epoch ends inside a window. Leaving a source stops its
threads and processes (shutdown).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import time
from typing import Any, Callable, Iterator, Optional

from ..core import faults, tree
from ..core.errors import BisectError
from ..pipeline import recording
from ..pipeline.integrations import nodes
from ..pipeline.integrations._common import require
from ..pipeline.recording import Call
from .cache import DEFAULT_CACHE_BATCHES, Caches, batch_size_of, stopped


@dataclasses.dataclass
class GraphCaches(Caches):
    """Caches of a node graph: `samples` are the items at the `augmented` cut (or the
    `raw` cut where there is none), `batches` the root's outputs (host, device)."""

    raw_items: list = dataclasses.field(default_factory=list)  # the items at the `raw` cut
    collated: list = dataclasses.field(default_factory=list)  # the items at the `collated` cut
    raw_copy: bool = False  # a Mapper changes its input in place: the `raw` point hands out copies
    whole_batches: bool = False  # the items read alone are whole batches (NodeSpec.batched_keys)

    @property
    def items_per_batch(self) -> float:
        """As Caches', but one where the items read alone are whole batches: the graph
        batches its keys before the Mapper that reads them, once a batch."""
        return 1.0 if self.whole_batches else super().items_per_batch


# --------------------------------------------------------------------------------------
# Nodes of the tool's own
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _classes() -> dict:
    """The tool's BaseNodes (torchdata imported on first use)."""
    tn = require("torchdata.nodes")

    class Cycle(tn.BaseNode):
        """Cached items, cycled forever (a copy of each with `copy`)."""

        def __init__(self, items: list, copy: bool = False) -> None:
            super().__init__()
            self.items, self.copy = items, copy
            self._it: Optional[Iterator] = None

        def reset(self, initial_state: Optional[dict] = None) -> None:
            super().reset(initial_state)
            self._it = itertools.cycle(self.items)

        def next(self) -> Any:
            item = next(self._it)
            return tree.clone(item) if self.copy else item

        def get_state(self) -> dict:
            return {}

    class Endless(tn.BaseNode):
        """A copy of the source, started again at its end without ending the epoch
        downstream (the DataLoader's `full` point cycles its sampler so)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.restarts = 0

        def reset(self, initial_state: Optional[dict] = None) -> None:
            super().reset(initial_state)
            self.inner.reset()

        def next(self) -> Any:
            for _ in range(2):
                try:
                    return next(self.inner)
                except StopIteration:
                    self.restarts += 1
                    self.inner.reset()
            raise RuntimeError("the graph's source yields nothing")

        def get_state(self) -> dict:
            return {}

    class Tap(tn.BaseNode):
        """Passes its source's items on, keeping a copy of each (the fill)."""

        def __init__(self, inner: Any, kept: list) -> None:
            super().__init__()
            self.inner, self.kept = inner, kept

        def reset(self, initial_state: Optional[dict] = None) -> None:
            super().reset(initial_state)
            self.inner.reset()

        def next(self) -> Any:
            item = next(self.inner)
            self.kept.append(tree.clone(item))
            return item

        def get_state(self) -> dict:
            return {}
    return {"Cycle": Cycle, "Endless": Endless, "Tap": Tap}


def cycle(items: list, copy: bool = False) -> Any:
    return _classes()["Cycle"](items, copy)


class Replay:
    """The `raw` point's map where the transform calls are given (confirm.py): the cached
    sample at position i rebuilt by replaying its calls."""

    def __init__(self, templates: list, calls: list) -> None:
        self.templates, self.calls = templates, calls

    def __call__(self, i: int) -> Any:
        return recording.replay_sample(self.templates[i], self.calls[i])


class _Recorded:
    """A per-sample Mapper's function that records each call (its input, copied) for
    worker_stages.py's replay, and whether it changes its input in place."""

    def __init__(self, fn: Callable, name: str, calls: list, changes: set) -> None:
        self.fn, self.name, self.calls, self.changes = fn, name, calls, changes
        self.tagged = faults.Tagged(fn, "augment")

    def __call__(self, x: Any) -> Any:
        before = tree.clone(x)
        out = self.tagged(x)
        if len(self.calls) < 2 and not tree.same_values(x, before):
            self.changes.add(self.name)
        self.calls.append(Call(self.fn, self.name, (before,), {}, placements=[((), ())]))
        return out


# --------------------------------------------------------------------------------------
# The fill
# --------------------------------------------------------------------------------------


def fill(spec: nodes.NodeSpec, *, cache_mb: float, max_batches: int = DEFAULT_CACHE_BATCHES,
         time_budget: float = 10.0, clock: Callable[[], float] = time.perf_counter,
         on_batch: Callable[[int], None] = lambda n: None, batch_size: Any = None) -> GraphCaches:
    """The first batches of a copy of the graph, built in this thread, every cut's items
    kept (see the module's docstring); stops as cache.fill does (`max_batches`, the
    memory budget, `time_budget`), and raises FillError where not one batch is built."""
    start = clock()
    c = spec.cuts
    # the samples: the items at `augmented`, else at `raw`, else the source's own (a graph
    # that batches its source's keys before a Mapper that loads them: cuts_of)
    at_samples = next(i for i in (c.augmented, c.raw, 0) if i is not None)
    taps: dict = {i: [] for i in {c.raw, c.augmented, c.collated, at_samples} if i is not None}
    per_fn: dict = {i: [] for i in c.augment}
    changes: set = set()
    fns = {i: _Recorded(spec.chain[i].fn, _fn_name(spec.chain[i].fn), per_fn[i], changes)
           for i in c.augment}
    Tap = _classes()["Tap"]

    def tap(i: int, node: Any) -> Any:
        return Tap(node, taps[i]) if i in taps else node
    root = spec.build(0, tap(0, spec.source_copy()), inline=True, fns=fns, tap=tap)
    samples = taps[at_samples]
    batches: list = []
    groups: list = []
    held = 0
    limited_by = stopped_by = None
    while len(batches) < max_batches:
        before = len(samples)
        try:
            batch = next(root)
        except StopIteration:
            break
        except Exception as exc:  # a hang (the watchdog's StepTimeout) or an error: kept what was built
            stopped_by = stopped(exc, "the graph", first=not batches)
            break
        batches.append(tree.clone(batch))
        groups.append(list(range(before, len(samples))))
        held = sum(tree.nbytes(x) for x in taps.values()) + 2 * tree.nbytes(batches)
        on_batch(len(batches))
        if held / len(batches) * (len(batches) + 1) > cache_mb * 2**20:
            limited_by = "memory budget"
            break
        if clock() - start > time_budget:
            limited_by = "time"
            break
    if not batches:
        raise BisectError("the node graph yields no batch: its source is empty (or smaller than one batch with "
                          "drop_last=True). Check the graph your code builds.")
    raw_calls, raw_reason = _raw_calls(spec, per_fn, len(samples), changes)
    size, source = batch_size_of(spec, groups, batches, batch_size, samples=samples)
    if source == "DataLoader.batch_size":
        source = "Batcher.batch_size"
    nbytes = {k: sum(tree.nbytes(x) for x in v) for k, v in taps.items()}
    return GraphCaches(
        batch_size=size, dataset=None, samples=samples, raw_calls=raw_calls, raw_reason=raw_reason,
        raw_found=[spec.chain[i].describe() for i in c.augment] if raw_calls is not None else [],
        batches=batches, batch_bytes=max(tree.nbytes(b) for b in batches), fill_seconds=clock() - start,
        limited_by=limited_by, stopped_by=stopped_by, groups=groups, batch_size_source=source,
        held={"raw_inputs": nbytes.get(c.raw, 0) if c.raw is not None else 0,
              "samples": nbytes.get(at_samples, 0),
              "collated": nbytes.get(c.collated, 0), "point_copy": tree.nbytes(batches)},
        budget_bytes=int(cache_mb * 2**20), raw_items=taps.get(c.raw, []) if c.raw is not None else [],
        collated=taps[c.collated], raw_copy=bool(changes), whole_batches=spec.batched_keys)


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _raw_calls(spec: nodes.NodeSpec, per_fn: dict, n_samples: int, changes: set) -> tuple:
    """Per sample, the per-sample Mappers' calls in order (worker_stages.py replays them
    alone), or None with the reason."""
    c = spec.cuts
    if not c.augment:
        return None, c.why.get("raw") or c.why.get("augmented") or "no per-sample Mapper in the graph"
    between = [spec.chain[i].describe() for i in range(c.raw + 1, c.augmented + 1) if spec.chain[i].kind != "map"]
    lists = [per_fn[i] for i in c.augment]
    if between or any(len(x) != n_samples for x in lists):
        why = f" ({', '.join(between)})" if between else ""
        return None, (f"a node between the source and the Batcher that is not a Mapper{why} changes how many samples "
                      "pass: the Mappers' calls cannot be replayed sample by sample")
    calls = [list(x) for x in zip(*lists)]
    for per_sample in calls:
        recording.mark_copies(per_sample, changes)
    return calls, None


# --------------------------------------------------------------------------------------
# The sources
# --------------------------------------------------------------------------------------


def root_of(spec: nodes.NodeSpec, name: str, caches: Optional[GraphCaches], *, epochs: bool = False,
            calls: Optional[list] = None, fresh: bool = False) -> Any:
    """Point `name`'s graph (full, raw, augmented, collated), not started."""
    c = spec.cuts
    if name == "full":
        source = spec.source_copy()
        return spec.build(0, source if epochs else _classes()["Endless"](source))
    if name == "raw" and calls is not None:  # the transforms replayed from their cached inputs (confirm.py)
        first = c.augment[0]
        return spec.build(c.raw, cycle(list(range(len(calls)))), skip=c.augment[1:],
                          fns={first: faults.Tagged(Replay(caches.samples, calls), "augment")})
    if name == "raw":
        return spec.build(c.raw, cycle(caches.raw_items, caches.raw_copy))
    if name == "augmented":
        return spec.build(c.augmented, cycle(caches.samples, fresh and c.augmented == c.collated))
    return spec.build(c.collated, cycle(caches.collated, fresh))


@contextlib.contextmanager
def source(spec: nodes.NodeSpec, name: str, caches: Optional[GraphCaches], *, epochs: bool = False,
           calls: Optional[list] = None, fresh: bool = False) -> Iterator[Callable[[], Any]]:
    """Point `name`'s batch source: a context manager yielding next_batch. With `epochs`
    (`full` only), the graph's epochs end as a Loader ends them: at the source's end the
    graph is reset, its threads started again."""
    root = root_of(spec, name, caches, epochs=epochs, calls=calls, fresh=fresh)

    def next_epoch() -> Any:
        try:
            return next(root)
        except StopIteration:
            root.reset()
            return next(root)
    try:
        yield next_epoch if epochs else root.__next__
    finally:
        shutdown(root)


def shutdown(node: Any) -> None:
    """Stop the threads and processes of a graph the tool built: every iterator its nodes
    hold (ParallelMapper's, Prefetcher's, PinMemory's) shut down, upstream to the source."""
    seen: set = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen or isinstance(n, (list, tuple, dict, str, bytes)):
            continue
        seen.add(id(n))
        stop = getattr(n, "_shutdown", None)
        if callable(stop) and not isinstance(n, type):
            try:
                stop()
            except Exception:
                pass
        for attr in ("_it", "source", "inner", "root"):
            stack.append(getattr(n, attr, None) if hasattr(n, "__dict__") else None)
