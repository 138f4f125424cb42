"""The one walker over nested batches and samples: which nodes are containers, their
children, and rebuilding them.

Containers: tuples, lists, namedtuples, mappings (dict and its subclasses; other
Mapping types are rebuilt as dicts when their type cannot be built from one),
dataclass instances, and custom batch classes (the torch docs' pattern: plain
attributes and a `to()` or `pin_memory()` method). Everything else is a leaf: tensors,
numpy arrays, PIL images, numbers, strings, None, any other object. Nesting deeper than
MAX_DEPTH is left as it is (a leaf), the same limit for every caller.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional

# Deep enough for any batch seen in practice (a dict of lists of tuples of tensors is 3);
# bounded so that a self-referencing object cannot recurse forever.
MAX_DEPTH = 8

Path = tuple


def is_batch_object(obj: Any) -> bool:
    """A custom batch class: plain attributes and a `to()` or `pin_memory()` method."""
    return (hasattr(obj, "__dict__") and not isinstance(obj, type) and not _is_module(obj)
            and (callable(getattr(obj, "pin_memory", None)) or callable(getattr(obj, "to", None)))
            and not _is_tensor_like(obj))


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _is_tensor_like(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.Tensor)


def children(obj: Any) -> list:
    """[(key, child)] of a container, [] for a leaf."""
    if isinstance(obj, (tuple, list)):
        return list(enumerate(obj))
    if isinstance(obj, Mapping):
        return list(obj.items())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    if is_batch_object(obj):
        return list(vars(obj).items())
    return []


def is_container(obj: Any) -> bool:
    return (isinstance(obj, (tuple, list, Mapping)) or (dataclasses.is_dataclass(obj) and not isinstance(obj, type))
            or is_batch_object(obj))


def rebuild(obj: Any, new: dict) -> Any:
    """A copy of container `obj` whose children are replaced by `new` (key -> value);
    children not in `new` are kept."""
    if isinstance(obj, tuple):
        items = [new.get(i, v) for i, v in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        return [new.get(i, v) for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        merged = {k: new.get(k, v) for k, v in obj.items()}
        if type(obj) is dict:
            return merged
        try:  # keep the user's mapping type (OrderedDict, defaultdict, BatchEncoding, ...)
            out = copy.copy(obj)
            for k, v in merged.items():
                out[k] = v
            return out
        except Exception:
            try:
                return type(obj)(merged)
            except Exception:  # a mapping type that cannot be copied or built from a dict
                return merged
    if dataclasses.is_dataclass(obj):
        init = {f.name: new[f.name] for f in dataclasses.fields(obj) if f.init and f.name in new}
        out = dataclasses.replace(obj, **init)
        for f in dataclasses.fields(obj):
            if not f.init and f.name in new:
                object.__setattr__(out, f.name, new[f.name])
        return out
    if is_batch_object(obj):
        out = copy.copy(obj)
        for k, v in new.items():
            setattr(out, k, v)
        return out
    raise TypeError(f"a {type(obj).__name__} is not a container")


def map_leaves(fn: Callable[[Any], Any], obj: Any, *, depth: int = 0) -> Any:
    """`obj` rebuilt with `fn(leaf)` in place of every leaf (containers are new objects)."""
    if depth > MAX_DEPTH or not is_container(obj):
        return fn(obj)
    try:
        return rebuild(obj, {k: map_leaves(fn, v, depth=depth + 1) for k, v in children(obj)})
    except (AttributeError, TypeError, copy.Error):  # read-only attributes: kept as it is
        return obj


def leaves(obj: Any, path: Path = (), *, depth: int = 0) -> Iterator[tuple[Path, Any]]:
    """(path, leaf) for every leaf, depth first, in the containers' order."""
    if depth > MAX_DEPTH or not is_container(obj):
        yield path, obj
        return
    for k, v in children(obj):
        yield from leaves(v, path + (k,), depth=depth + 1)


def nodes(obj: Any, *, depth: int = 0) -> Iterator[tuple[int, Any]]:
    """(depth, node) for every node, containers included, depth first."""
    yield depth, obj
    if depth < MAX_DEPTH and is_container(obj):
        for _, v in children(obj):
            yield from nodes(v, depth=depth + 1)


def find(obj: Any, target: Any) -> Optional[Path]:
    """The path of `target` inside `obj`, by identity, or None."""
    if obj is target:
        return ()
    for path, node in _paths(obj, ()):
        if node is target:
            return path
    return None


def _paths(obj: Any, path: Path, depth: int = 0) -> Iterator[tuple[Path, Any]]:
    if depth >= MAX_DEPTH:
        return
    for k, v in children(obj):
        yield path + (k,), v
        yield from _paths(v, path + (k,), depth + 1)


def replace(obj: Any, path: Path, value: Any) -> Any:
    """A copy of `obj` with the node at `path` replaced (the containers on the way are rebuilt)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    current = dict(children(obj))
    if key not in current:
        raise KeyError(f"{key!r} is not in a {type(obj).__name__}")
    return rebuild(obj, {key: replace(current[key], rest, value)})
