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
    """A custom batch class: plain attributes and a `to()` or `pin_memory()` method (not
    a module or a tensor, which have them too)."""
    if not hasattr(obj, "__dict__") or isinstance(obj, type):
        return False
    import torch

    return (not isinstance(obj, (torch.nn.Module, torch.Tensor))
            and (callable(getattr(obj, "pin_memory", None)) or callable(getattr(obj, "to", None))))


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


def map_leaves(fn: Callable[[Any], Any], obj: Any, *, stop: Optional[Callable[[Any], bool]] = None,
               depth: int = 0) -> Any:
    """`obj` rebuilt with `fn(leaf)` in place of every leaf (containers are new objects).
    A container for which `stop(node)` is true is handed to `fn` whole."""
    if depth > MAX_DEPTH or not is_container(obj) or (stop is not None and stop(obj)):
        return fn(obj)
    try:
        return rebuild(obj, {k: map_leaves(fn, v, stop=stop, depth=depth + 1) for k, v in children(obj)})
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


def get(obj: Any, path: Path) -> Any:
    """The node at `path` inside `obj` (a path from find)."""
    for key in path:
        obj = dict(children(obj))[key]
    return obj


def replace(obj: Any, path: Path, value: Any) -> Any:
    """A copy of `obj` with the node at `path` replaced (the containers on the way are rebuilt)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if type(obj) in (tuple, list) and type(key) is int and 0 <= key < len(obj):  # the common sample: no walk
        items = list(obj)
        items[key] = replace(items[key], rest, value)
        return tuple(items) if type(obj) is tuple else items
    current = dict(children(obj))
    if key not in current:
        raise KeyError(f"{key!r} is not in a {type(obj).__name__}")
    return rebuild(obj, {key: replace(current[key], rest, value)})


# --------------------------------------------------------------------------------------
# What the tool computes over batches, with the walker above
# --------------------------------------------------------------------------------------


def clone(obj: Any) -> Any:
    """A copy that shares no tensor, array or image storage with `obj` (cached data must
    neither keep worker shared memory alive nor be changed by the code that uses it)."""
    return map_leaves(_clone_leaf, obj)


def _clone_leaf(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    module = type(x).__module__ or ""
    if module.startswith("numpy") or module.startswith("PIL"):
        return x.copy()
    return x


def _is_pil(x: Any) -> bool:
    return (type(x).__module__ or "").startswith("PIL") and hasattr(x, "mode") and hasattr(x, "size")


def nbytes(obj: Any) -> int:
    """Memory held by the tensors, arrays and images inside `obj` (approximate)."""
    return sum(_leaf_bytes(x) for _, x in leaves(obj))


def _leaf_bytes(x: Any) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.element_size() * x.nelement()
    n = getattr(x, "nbytes", None)
    if isinstance(n, int):
        return n
    size = getattr(x, "size", None)
    if (type(x).__module__ or "").startswith("PIL") and isinstance(size, tuple):
        return size[0] * size[1] * len(x.getbands())
    return 0


def tensors(obj: Any) -> Iterator[tuple[Path, Any]]:
    """(path, tensor) for every tensor leaf."""
    import torch

    return ((p, x) for p, x in leaves(obj) if isinstance(x, torch.Tensor))


def leading_dim(obj: Any) -> Optional[int]:
    """The first dimension of the first tensor with one, or None."""
    return next((x.shape[0] for _, x in tensors(obj) if x.dim()), None)


def shared_leading_dim(obj: Any) -> Optional[int]:
    """The first dimension every tensor with one shares (a batch's samples), or None when
    they disagree or there is none."""
    dims = {x.shape[0] for _, x in tensors(obj) if x.dim()}
    return dims.pop() if len(dims) == 1 else None


def same_values(a: Any, b: Any) -> bool:
    """Equal tensors (values, shapes, dtypes) and equal everything else, node by node."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if is_container(a) or is_container(b):
        ca, cb = children(a), children(b)
        return type(a) is type(b) and len(ca) == len(cb) and all(
            ka == kb and same_values(va, vb) for (ka, va), (kb, vb) in zip(ca, cb))
    try:
        return bool(a == b)
    except Exception:
        return a is b


def same_structure(a: Any, b: Any, *, depth: int = 0) -> Optional[str]:
    """None if `a` and `b` have the same nesting, types, tensor dtypes and ranks; else a
    short description of the first difference. Types match as a transform sees them: a
    subclass matches its base, and PIL images match by mode and size (a decoded
    JpegImageFile and its copy, a plain Image, are the same input)."""
    import torch

    if _is_pil(a) and _is_pil(b):  # a decoded JpegImageFile and its loaded copy (Image) are the same input
        if (a.mode, a.size) != (b.mode, b.size):
            return f"image {a.mode} {a.size} vs {b.mode} {b.size}"
        return None
    if not (isinstance(a, type(b)) or isinstance(b, type(a))):  # a subclass is what its base is
        return f"{type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.dim() != b.dim():
            return f"tensor {a.dtype}/{a.dim()}d vs {b.dtype}/{b.dim()}d"
        return None
    if depth > MAX_DEPTH:
        return None
    ca, cb = children(a), children(b)
    if len(ca) != len(cb):
        return f"{len(ca)} vs {len(cb)} elements"
    for (ka, va), (kb, vb) in zip(ca, cb):
        if ka != kb:
            return f"key {ka!r} vs {kb!r}"
        diff = same_structure(va, vb, depth=depth + 1)
        if diff:
            return f"[{ka!r}] {diff}"
    return None
