"""torchdata.nodes: a node graph read as a NodeSpec, the loader spec of its own kind: what
the measuring layer, the advice and --tune read of a LoaderSpec (num_workers, settings(),
with_settings(), ...), the graph rebuilt from a cut with those settings (build), and what
the stages timed alone read (SourceView, Collate). Its chain and cuts: node_chain.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional

from ...core import faults
from ...core.results import Note
from ._common import require
from .node_chain import (Cuts, Node, chain_of, cuts_of, fresh_source, is_loader, is_node, rebuild, tagged_source,
                         yields_keys)

# ParallelMapper's own default when max_concurrent is None: tasks in flight, 2 per worker.
TASKS_PER_WORKER = 2


def is_graph(obj: Any) -> bool:
    """A tn.Loader or a node graph's root node."""
    return is_loader(obj) or is_node(obj)


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """A node graph's settings, read once: what the measuring layer reads of a LoaderSpec
    (num_workers, prefetch_depth, batches_per_epoch, pin_memory, settings(),
    with_settings(), ...), and the chain to rebuild its points from (build).

    `num_workers`, `method`, `in_order`: the graph's main Mapper (the one with the most
    workers, the first of them): what the advice and --tune speak of; `prefetch_factor`:
    its last Prefetcher's."""

    chain: tuple
    cuts: Cuts
    loader: Any  # the user's Loader, or the root node itself
    loader_cls: type
    restart_on_stop_iteration: bool = True
    overrides: dict = dataclasses.field(default_factory=dict)  # with_settings: the main Mapper's, the Prefetcher's

    kind = "torchdata.nodes"
    timeout = 0.0
    worker_init_fn = None
    batch_sampler = None
    pin_memory_device = ""

    # -- what the measuring layer reads of a LoaderSpec -----------------------------------

    @property
    def main_mapper(self) -> Optional[int]:
        maps = [i for i, n in enumerate(self.chain) if n.kind == "map"]
        if not maps:
            return None
        return max(maps, key=lambda i: (self.chain[i].args["num_workers"], -i))

    def _mapper_arg(self, key: str, default: Any = None) -> Any:
        i = self.main_mapper
        if i is None:
            return default
        return self.overrides.get(key, self.chain[i].args[key])

    @property
    def num_workers(self) -> int:
        return int(self._mapper_arg("num_workers", 0) or 0)

    @property
    def method(self) -> Optional[str]:
        return self._mapper_arg("method")

    @property
    def in_order(self) -> bool:
        return bool(self._mapper_arg("in_order", True))

    @property
    def multiprocessing_context(self) -> Any:
        return self._mapper_arg("multiprocessing_context")

    @property
    def prefetch_factor(self) -> Optional[int]:
        if "prefetch_factor" in self.overrides:
            return self.overrides["prefetch_factor"]
        pre = [n for n in self.chain if n.kind == "prefetch"]
        return pre[-1].args["prefetch_factor"] if pre else None

    @property
    def pin_memory(self) -> bool:
        return bool(self.overrides.get("pin_memory", any(n.kind == "pin" for n in self.chain)))

    persistent_workers = False  # every epoch's reset starts the graph's threads again
    iterable = False  # (its source is read through SourceView, an indexed stand-in: worker_stages.py's load)

    @property
    def batcher(self) -> Optional[Node]:
        return next((n for n in self.chain if n.kind == "batch"), None)

    @property
    def batch_size(self) -> Optional[int]:
        b = self.batcher
        return b.args["batch_size"] if b is not None else None

    @property
    def drop_last(self) -> bool:
        b = self.batcher
        return bool(b.args["drop_last"]) if b is not None else False

    @property
    def auto_collation(self) -> bool:
        return self.batcher is not None

    @property
    def prefetch_depth(self) -> int:
        """Batches the graph can have ready before the loop asks for one: its Prefetcher's
        queue, PinMemory's one, and a Mapper's tasks in flight after the Batcher."""
        depth = 0
        after_batcher = False
        for i, n in enumerate(self.chain):
            if n.kind == "batch":
                after_batcher = True
            elif n.kind == "map" and after_batcher:
                w = self._workers_at(i)
                depth += (n.args["max_concurrent"] or TASKS_PER_WORKER * w) if w else 0
            elif n.kind == "prefetch":
                depth += int(self.overrides.get("prefetch_factor", n.args["prefetch_factor"]))
            elif n.kind == "pin":
                depth += 1
        return depth

    def _workers_at(self, i: int) -> int:
        if i == self.main_mapper and "num_workers" in self.overrides:
            return int(self.overrides["num_workers"])
        return int(self.chain[i].args["num_workers"])

    @property
    def batches_per_epoch(self) -> Optional[int]:
        """Batches in one epoch, where the source's length is its epoch's (a sampler; a
        sequence an IterableWrapper reads through __getitem__: a list, a map-style
        Dataset; not an iterable with a __len__ of its own and an __iter__ that may yield
        more, or forever) and only Mappers and a Batcher follow it (a Mapper keeps the
        count, a Batcher divides it)."""
        src = self.chain[0]
        data = src.node.iterable if src.kind == "iterable" else getattr(src.node, "sampler", None)
        if src.kind == "iterable" and not isinstance(data, (list, tuple, range)) and hasattr(type(data), "__iter__"):
            return None
        try:
            n = len(data)
        except TypeError:
            return None
        for node in self.chain[1:]:
            if node.kind == "batch":
                bs = node.args["batch_size"]
                n = n // bs if node.args["drop_last"] else -(-n // bs)
            elif node.kind not in ("map", "prefetch", "pin"):
                return None
        return n

    @property
    def dataset(self) -> "SourceView":
        return SourceView(self)

    @property
    def sampler(self) -> range:
        return range(2**31 - 1)  # (SourceView's keys: it reads its source in order whatever they are)

    @property
    def batched_keys(self) -> bool:
        """Whether the graph batches its source's keys before the Mapper that reads them
        (cuts_of: no `raw`, no `augmented`): each item read alone (SourceView) is then a
        whole batch, built by that Mapper, and nothing is left for the collate."""
        return self.cuts.raw is None and self.cuts.augmented is None

    @property
    def collate_fn(self) -> Callable:
        """The work between `augmented` and `collated` on a list of samples: the Batcher's
        list through the Mappers after it (none where the keys are batched: batched_keys)."""
        if self.batched_keys:
            return Collate(())
        fns = [self.chain[i].fn for i in range((self.batcher_index or 0) + 1, self.cuts.collated + 1)
               if self.chain[i].kind == "map"]
        return Collate(tuple(fns))

    @property
    def batcher_index(self) -> Optional[int]:
        return next((i for i, n in enumerate(self.chain) if n.kind == "batch"), None)

    def with_settings(self, settings: dict) -> "NodeSpec":
        """This graph with other settings of its main Mapper (num_workers, method) and its
        Prefetcher (prefetch_factor: one is added where the graph has none); others
        (persistent_workers: a graph's threads start again every epoch whatever) ignored."""
        keep = {k: v for k, v in settings.items() if k in ("num_workers", "method", "prefetch_factor", "in_order",
                                                           "pin_memory")}
        if "num_workers" in keep and self.main_mapper is None:
            keep.pop("num_workers")
        if keep.get("prefetch_factor") is None:
            keep.pop("prefetch_factor", None)
        return dataclasses.replace(self, overrides={**self.overrides, **keep})

    def settings(self) -> dict:
        """A JSON-friendly summary for the report: the DataLoader-like keys the advice and
        the search read (num_workers, prefetch_factor, ...), and the graph itself."""
        return {
            "kind": self.kind,
            "dataset": type(self.chain[0].node).__name__,
            "iterable": False,
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "method": self.method,
            "in_order": self.in_order,
            "max_concurrent": self._mapper_arg("max_concurrent"),
            "pin_memory": self.pin_memory,
            "drop_last": self.drop_last,
            "prefetch_factor": self.prefetch_factor,
            "persistent_workers": False,
            "batches_per_epoch": self.batches_per_epoch,
            "multiprocessing_context": self.multiprocessing_context,
            "graph": [n.describe() for n in self.chain],
            "main_mapper": None if self.main_mapper is None else self.chain[self.main_mapper].describe(),
            "mappers": [{"node": n.describe(), "stage": self.stage_of(i), "num_workers": self._workers_at(i),
                         "main": i == self.main_mapper} for i, n in enumerate(self.chain) if n.kind == "map"],
            "witnessed": witnessed(self),
            "loader_class": f"{self.loader_cls.__module__}.{self.loader_cls.__qualname__}",
        }

    # -- rebuilding -------------------------------------------------------------------

    def build(self, after: int, source: Any, *, upto: Optional[int] = None, inline: bool = False,
              fns: Optional[dict] = None, skip: tuple = (), tap: Optional[Callable] = None) -> Any:
        """The chain's nodes after index `after` (through `upto`, the root by default)
        rebuilt over `source` with this spec's settings, each Mapper's function tagged
        with its stage. `fns`: index -> the map function to use instead (the `raw`
        point's replay, the fill's recording); `skip`: indices left out; `inline`: every
        Mapper in this thread and no Prefetcher or PinMemory (the fill); `tap(i, node)`:
        what to put after node i (the fill's taps)."""
        node = source
        last = len(self.chain) - 1 if upto is None else upto
        pinned = False
        for i in range(after + 1, last + 1):
            n = self.chain[i]
            if i in skip or (inline and n.kind in ("prefetch", "pin")) or (n.kind == "pin" and not self.pin_memory):
                continue
            settings = self._settings_at(i)
            if inline and n.kind == "map":
                settings = dict(settings, num_workers=0)
            fn = None
            if n.kind == "map":
                fn = (fns or {}).get(i) or faults.Tagged(n.fn, self.stage_of(i))
            node = rebuild(n, node, settings, fn)
            pinned = pinned or n.kind == "pin"
            if tap is not None:
                node = tap(i, node)
        return self._with_added(node, last, inline, pinned)

    def _with_added(self, node: Any, last: int, inline: bool, pinned: bool) -> Any:
        """A Prefetcher (prefetch_factor set where the graph has none) and a PinMemory
        (pin_memory set where it has none) added at the root by with_settings."""
        if inline or last != len(self.chain) - 1:
            return node
        tn = require("torchdata.nodes")
        if self.pin_memory and not pinned and not any(n.kind == "pin" for n in self.chain):
            node = tn.PinMemory(node)
        if "prefetch_factor" in self.overrides and not any(n.kind == "prefetch" for n in self.chain):
            node = tn.Prefetcher(node, prefetch_factor=int(self.overrides["prefetch_factor"]))
        return node

    def _settings_at(self, i: int) -> dict:
        n = self.chain[i]
        if n.kind == "map" and i == self.main_mapper:
            return {k: v for k, v in self.overrides.items() if k in ("num_workers", "method", "in_order")}
        if n.kind == "prefetch" and "prefetch_factor" in self.overrides:
            return {"prefetch_factor": int(self.overrides["prefetch_factor"])}
        return {}

    def stage_of(self, i: int) -> str:
        """The stage node i's work belongs to."""
        c = self.cuts
        if i <= (c.raw if c.raw is not None else (c.augmented or 0)):
            return "load"
        if i in c.augment:
            return "augment"
        return "collate"

    def source_copy(self) -> Any:
        """A copy of the source node (never the user's), its errors named `load`."""
        return tagged_source(fresh_source(self.chain[0]))

    def full(self) -> Any:
        """The whole graph rebuilt over a copy of its source."""
        return self.build(0, self.source_copy())


class Collate:
    """The batch side of the graph on one group of samples (worker_stages.py's collate): the
    Batcher's list through the Mappers after it."""

    def __init__(self, fns: tuple) -> None:
        self.fns = fns
        self.__qualname__ = " -> ".join(["Batcher"] + [getattr(f, "__qualname__", type(f).__name__) for f in fns])

    def __call__(self, samples: list) -> Any:
        out: Any = list(samples)
        for fn in self.fns:
            out = fn(out)
        return out


class SourceView:
    """The graph's source side read in this process, one item per key (keys ignored:
    the source's own order), through the per-sample Mappers: what worker_stages.py times as a
    dataset's __getitem__ (load and the transforms), from a copy of the source started
    afresh for each copy of the view. A graph that batches its keys (NodeSpec.
    batched_keys): one item per batch, through the Mapper that reads and builds it."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self._it: Optional[Iterator] = None

    def __copy__(self) -> "SourceView":
        return SourceView(self.spec)

    def __len__(self) -> int:
        raise TypeError("a node graph's source has no length here")

    def _next_raw(self) -> Any:
        c = self.spec.cuts
        raw = c.raw if c.raw is not None else c.augmented
        for _ in range(2):
            if self._it is None:
                self._it = self.spec.build(0, self.spec.source_copy(), upto=raw, inline=True)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
        raise StopIteration

    def __getitem__(self, key: Any) -> Any:
        x = self._next_raw()
        for i in self.spec.cuts.augment:
            x = self.spec.chain[i].fn(x)
        return x


def describe(loader: Any) -> NodeSpec:
    """Read a tn.Loader (or a root node) without iterating it."""
    root = loader.root if is_loader(loader) else loader
    chain = chain_of(root)
    return NodeSpec(chain, cuts_of(chain, yields_keys(chain[0])), loader, type(loader),
                    bool(getattr(loader, "restart_on_stop_iteration", True)))


def witnessed(spec: Any) -> bool:
    """Whether the stages' costs timed alone (isolate.py) can witness the drops: their
    model is DataLoader's (every worker runs load, augment and collate; or all of it in
    the loop's thread). A node graph runs each node in threads of its own (the source in
    one, a ParallelMapper in its workers, the Batcher in its consumer's), so only one
    that runs wholly in the loop's thread (inline Mappers, no Prefetcher or PinMemory)
    is witnessed; the others are named on the rounds' drops alone."""
    if not isinstance(spec, NodeSpec):
        return True
    return not any(n.kind in ("prefetch", "pin") or (n.kind == "map" and n.args["num_workers"]) for n in spec.chain)


def notes(spec: NodeSpec) -> list:
    """What the report says of the graph before it is measured: nodes of the user's own
    classes, rebuilt from shallow copies."""
    own = [n.name for n in spec.chain if n.kind == "other"]
    if not own:
        return []
    return [Note("pipeline", f"{', '.join(own)} {'is a node' if len(own) == 1 else 'are nodes'} of your own class: "
                             "each point rebuilds it from a shallow copy; give it a reset() that starts it afresh.",
                 detail="the tool rebuilds every node downstream of a cut; a node of the library's own kind from its "
                        "constructor's arguments, one of yours from a copy whose .source is the new upstream node and "
                        "whose reset() is called before its first item, so state it keeps outside reset() is shared "
                        "with your own")]
