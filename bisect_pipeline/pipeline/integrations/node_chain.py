"""torchdata.nodes: a node graph (a `tn.Loader` over a chain of BaseNodes, or the root
node itself) read once as a chain of Nodes, cut at the points, each node rebuilt over a
new upstream node: the graph's own shape, apart from the NodeSpec read of it (nodes.py),
which changes when the measuring layer reads more, this when torchdata adds a node.

The graph is a chain: each node reads the one before it (`.source`). Its cuts, the
points of the bisection (SPEC "Beyond the map-style DataLoader"):

    source side ──raw── per-sample Mappers ──augmented── Batcher (+ Mappers) ──collated── PinMemory, Prefetcher ──host

The source side is the source node (IterableWrapper, SamplerWrapper, a node of the
user's), and where it is a SamplerWrapper the first Mapper after it too: a sampler
yields keys, and what maps a key to data (MapStyleWrapper's `dataset.__getitem__`) is
the load. Graphs in other orders are cut where their nodes are: a Mapper after the
Batcher maps whole batches (augment and collate in one call: no `augmented` point).

Rebuilt, every node downstream of a cut gets the user's constructor arguments (workers,
thread or process, in_order, max_concurrent, prefetch_factor, pinning), over a copy of
the source or a node of cached items: the user's node instances are never iterated,
reset or shared (they may be live in the user's loop). A node of the user's own class
is rebuilt from a shallow copy with its `.source` replaced.

Recognised by class names: torchdata is imported only where the user's objects come
from it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Callable, Optional

from ...core import faults
from .. import recording
from ._common import by_name, require

MODULES = ("torchdata.nodes",)
# A node graph deeper than this is not a chain the tool follows (a cycle of `.source`s).
MAX_NODES = 64


def is_loader(obj: Any) -> bool:
    return by_name(obj, MODULES, ("Loader",))


def is_node(obj: Any) -> bool:
    return by_name(obj, MODULES, ("BaseNode",))


def is_graph(obj: Any) -> bool:
    """A tn.Loader or a node graph's root node."""
    return is_loader(obj) or is_node(obj)


def _kind(node: Any) -> str:
    for name, kind in (("ParallelMapper", "map"), ("Batcher", "batch"), ("Unbatcher", "unbatch"),
                       ("PinMemory", "pin"), ("Prefetcher", "prefetch"), ("IterableWrapper", "iterable"),
                       ("SamplerWrapper", "sampler")):
        if by_name(node, MODULES, (name,)):
            return kind
    return "other"


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of the chain, read once: its kind and what rebuilding it takes."""

    kind: str  # map | batch | unbatch | pin | prefetch | iterable | sampler | other
    node: Any  # the user's node: read, never iterated
    fn: Optional[Callable] = None  # a Mapper's function (before its prebatch wrapping)
    args: dict = dataclasses.field(default_factory=dict)  # its constructor's arguments

    @property
    def name(self) -> str:
        return type(self.node).__name__

    def describe(self) -> str:
        a = self.args
        if self.kind == "map":
            fn = getattr(self.fn, "__qualname__", type(self.fn).__name__)
            return (f"ParallelMapper({fn}, num_workers={a['num_workers']}, method={a['method']!r}, "
                    f"in_order={a['in_order']})" if a["num_workers"] else f"Mapper({fn})")
        if self.kind == "batch":
            return f"Batcher(batch_size={a['batch_size']}, drop_last={a['drop_last']})"
        if self.kind == "prefetch":
            return f"Prefetcher(prefetch_factor={a['prefetch_factor']})"
        if self.kind == "iterable":
            return f"IterableWrapper({type(self.node.iterable).__name__})"
        if self.kind == "sampler":
            return f"SamplerWrapper({type(self.node.sampler).__name__})"
        return self.name


def _read(node: Any) -> tuple[Node, Any]:
    """(the node read, the node upstream of it or None for a source)."""
    kind = _kind(node)
    if kind == "map":
        fn, upstream = node.map_fn, node.source
        if node.prebatch is not None:  # ParallelMapper made a Batcher and a MapOverBatch of its own
            fn, upstream = fn.map_fn, upstream.source
        args = dict(num_workers=int(node.num_workers), in_order=bool(node.in_order), method=node.method,
                    multiprocessing_context=node.multiprocessing_context, max_concurrent=node.max_concurrent,
                    snapshot_frequency=node.snapshot_frequency, prebatch=node.prebatch)
        return Node(kind, node, fn, args), upstream
    if kind == "batch":
        return Node(kind, node, args=dict(batch_size=int(node.batch_size), drop_last=bool(node.drop_last))), node.source
    if kind == "prefetch":
        return Node(kind, node, args=dict(prefetch_factor=int(node.prefetch_factor),
                                          snapshot_frequency=node.snapshot_frequency)), node.source
    if kind == "pin":
        return Node(kind, node, args=dict(pin_memory_device=node._pin_memory_device or "",
                                          snapshot_frequency=node.snapshot_frequency)), node.source
    if kind == "unbatch":
        return Node(kind, node), node.source
    if kind in ("iterable", "sampler"):
        return Node(kind, node), None
    upstream = getattr(node, "source", None)
    return Node(kind, node), (upstream if is_node(upstream) else None)


def chain_of(root: Any) -> tuple:
    """The graph's nodes from its source to `root`, read (Node)."""
    out: list = []
    node: Any = root
    while node is not None:
        if len(out) >= MAX_NODES:
            raise ValueError(f"the node graph is deeper than {MAX_NODES} nodes (a cycle of .source?)")
        read, node = _read(node)
        out.append(read)
    return tuple(reversed(out))


@dataclasses.dataclass(frozen=True)
class Cuts:
    """Where each point cuts the chain: the index of the last node upstream of it (None:
    the point does not exist in this graph; `why` says so, per point)."""

    raw: Optional[int]
    augmented: Optional[int]
    collated: int
    augment: tuple  # indices of the per-sample Mappers between raw and augmented
    why: dict  # point -> why it is skipped or unavailable here


def cuts_of(chain: tuple, keys: bool = False) -> Cuts:
    """The cuts of `chain`; `keys`: its source yields names of data (indices, paths, keys:
    recording.names_only), which its first Mapper loads, as a sampler's keys are."""
    kinds = [n.kind for n in chain]
    load_end = 0
    if (kinds[0] == "sampler" or keys) and "map" in kinds:
        first_map = kinds.index("map")
        if "batch" not in kinds[:first_map]:
            load_end = first_map  # the Mapper that turns the sampler's keys into data is the load
    batcher = next((i for i in range(load_end + 1, len(chain)) if kinds[i] == "batch"), None)
    end = batcher if batcher is not None else len(chain)
    augment = tuple(i for i in range(load_end + 1, end) if kinds[i] == "map")
    if batcher is not None:  # the Batcher, and the Mappers right after it (the collate, or a whole-batch map)
        collated = batcher
        while collated + 1 < len(chain) and kinds[collated + 1] in ("map", "other"):
            collated += 1
    else:
        collated = (augment[-1] if augment else load_end)
    why: dict = {}
    raw, augmented = load_end, (augment[-1] if augment else load_end)
    source = "the map of the source's keys (the load)" if load_end else chain[0].describe()
    if not augment:
        batch_maps = [i for i in range(collated + 1) if kinds[i] == "map" and i > load_end
                      and not is_collate(chain[i].fn)]
        if batch_maps:
            augmented = None
            why["augmented"] = (f"the graph's Mapper ({chain[batch_maps[0]].describe()}) maps whole batches after the "
                                "Batcher: augment and collate run in one call, so there is no point between them. Map "
                                "each sample before the Batcher to measure them apart")
            if keys and not load_end:  # it is handed batches of keys: it reads the data too
                raw = None
                why["raw"] = (f"the graph batches the names its source yields (indices, paths, keys) before its Mapper "
                              f"({chain[batch_maps[0]].describe()}) reads them: loading, augment and collate run in "
                              "one call. Load each sample in a Mapper before the Batcher to measure them apart")
        else:
            raw = None
            why["raw"] = (f"no Mapper between {source} and the Batcher: the samples the source yields are the ones "
                          "batched, so raw and augmented coincide (measured as augmented)")
    if batcher is None:
        why["collated"] = ("no Batcher in the graph: its items are batched upstream of it (the source yields "
                           "batches), so collated and augmented coincide")
    elif collated == len(chain) - 1:
        why["collated"] = ("nothing after the Batcher (no PinMemory, no Prefetcher): no node hands batches over, so "
                           "collated and host coincide (no handoff)")
    return Cuts(raw, augmented, collated, augment, why)


# A Mapper after the Batcher whose function is one of these collates (torch's, or a
# function named as a collate_fn): the collate stage, not a map of whole batches.
COLLATE_NAMES = ("default_collate", "default_convert", "collate", "collate_fn")


def is_collate(fn: Any) -> bool:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return name in COLLATE_NAMES or name.endswith("_collate_fn")


def fresh_source(n: Node) -> Any:
    """A copy of the source node, restarted: the user's is never iterated."""
    tn = require("torchdata.nodes")
    if n.kind == "iterable":
        it = n.node.iterable
        if iter_is_self(it):
            raise TypeError(f"the IterableWrapper wraps a {type(it).__name__}, an iterator (a generator) that can be "
                            "iterated once: the tool cannot rebuild it without taking your loop's items. Wrap an "
                            "iterable instead (a list, a Dataset, an object whose __iter__ starts again)")
        return tn.IterableWrapper(_copy(it))
    if n.kind == "sampler":
        s = n.node
        return tn.SamplerWrapper(_copy(s.sampler, deep=True), initial_epoch=s.epoch, epoch_updater=s.epoch_updater)
    return renewed(n.node)


def iter_is_self(obj: Any) -> bool:
    try:
        return iter(obj) is obj
    except TypeError:
        return False


def _copy(obj: Any, deep: bool = False) -> Any:
    """A copy of `obj` (copy.deepcopy with `deep`), or `obj` itself where it cannot be copied."""
    try:
        return copy.deepcopy(obj) if deep else copy.copy(obj)
    except Exception:
        return obj


def renewed(node: Any, source: Any = None) -> Any:
    """A shallow copy of a node of the user's own class, not yet started (its next
    next() resets it), reading `source` where it has one."""
    out = copy.copy(node)
    for name in ("_it", "_iter"):
        if name in vars(out):
            setattr(out, name, None)
    out._BaseNode__initialized = False
    if source is not None:
        out.source = source
    return out


def rebuild(n: Node, source: Any, settings: Optional[dict] = None, fn: Optional[Callable] = None) -> Any:
    """Node `n` built anew over `source` with its own constructor arguments, `settings`
    overriding them (NodeSpec.with_settings), `fn` its map function (a Mapper's, tagged)."""
    tn = require("torchdata.nodes")
    a = dict(n.args, **(settings or {}))
    if n.kind == "map":
        if not a["num_workers"]:
            a.update(in_order=True, method="thread", max_concurrent=None)  # (Mapper's: inline)
        elif a["max_concurrent"] is not None:
            a["max_concurrent"] = min(a["max_concurrent"], a["num_workers"])
        return tn.ParallelMapper(source, fn or n.fn, **a)
    if n.kind == "batch":
        return tn.Batcher(source, **a)
    if n.kind == "unbatch":
        return tn.Unbatcher(source)
    if n.kind == "prefetch":
        return tn.Prefetcher(source, **a)
    if n.kind == "pin":
        return tn.PinMemory(source, **a)
    return renewed(n.node, source)


def tagged_source(source: Any) -> Any:
    """`source` whose errors name the load stage."""
    return _load_tagged()(source)


@functools.lru_cache(maxsize=None)
def _load_tagged() -> type:
    """The node class of tagged_source (a BaseNode: torchdata imported on first use)."""
    tn = require("torchdata.nodes")

    class LoadTagged(tn.BaseNode):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def reset(self, initial_state: Optional[dict] = None) -> None:
            super().reset(initial_state)
            self.inner.reset()

        def next(self) -> Any:
            try:
                return next(self.inner)
            except (StopIteration, faults.StageError, faults.StepTimeout):
                raise
            except Exception as exc:
                raise faults.stage_error("load", exc) from exc

        def get_state(self) -> dict:
            return {}
    return LoadTagged


def yields_keys(source: Node) -> bool:
    """Whether the source yields names of data rather than data (recording.names_only of
    its first item, from a copy: `IterableWrapper(range(n))`, a list of paths): then the
    Mapper after it reads the data, the load, as after a sampler. False where a copy
    cannot be read (a node of the user's own class, an iterator: not iterated here)."""
    if source.kind != "iterable" or iter_is_self(source.node.iterable):
        return False
    try:
        first = next(iter(_copy(source.node.iterable)))
    except Exception:  # empty, or it fails: the fill will say so
        return False
    return recording.names_only(first)
