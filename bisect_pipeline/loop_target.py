"""What the user's training loop iterates, read from its frames: the `for` statement the
optimizer step runs inside, and the objects its expression names (loop_end.py says it
when no loader the tool can cache was found: never silent); and where the user's code
created a loader (creation_site).

From the frame that called the optimizer outward, the first frame of the user's code
(not torch, the frameworks or this tool) whose current instruction lies inside a `for`
loop (a FOR_ITER whose body spans it) is the loop; the names and attributes its
iterable expression loads, before its GET_ITER, are looked up in that frame. The
object taken is the first loader-like one (a DataLoader, a node graph), else the last
iterable one, else the last function called (what it returns is iterated).
"""

from __future__ import annotations

import builtins
import dataclasses
import dis
import inspect
import linecache
import os
import site
import sys
import sysconfig
import types
from typing import Any, Callable, Optional

from torch.utils.data import DataLoader

from .pipeline.integrations import nodes

_LOADS = ("LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF")
_ATTRS = ("LOAD_ATTR", "LOAD_METHOD")
_MISSING = object()
# Frames of these packages are not where a loader is created: its creator is the first
# frame outside them (the user's script).
_FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "accelerate", "transformers", "bisect_pipeline", "runpy")


@dataclasses.dataclass(frozen=True)
class Target:
    """The loop found: where (file:line), its `for` line as written, what it iterates
    (`what`: a phrase, 'a generator (batches, defined at train.py:12)'), and why the
    tool cannot cache it (`why`)."""

    where: Optional[str]
    line: str
    what: str
    why: str
    obj: Any = dataclasses.field(default=None, compare=False, repr=False)


def find(frame: Any, user_code: Callable[[Any], bool], site_of: Callable[[Any], Optional[str]]) -> Optional[Target]:
    """The loop around `frame` (see the module's docstring), or None where no frame of
    the user's code is inside a `for` loop. `user_code(frame)`: whether a frame is the
    user's; `site_of(obj)`: where the user's code created a loader, where known."""
    f = frame
    while f is not None:
        if user_code(f):
            at = _enclosing_for(f)
            if at is not None:
                return _target(f, at, site_of)
        f = f.f_back
    return None


def at(frame: Any, obj: Any, user_code: Callable[[Any], bool], site_of: Callable[[Any], Optional[str]],
       index: Optional[int] = None) -> Optional[Target]:
    """The loop's place where it takes batches of `obj` (a loader it iterates, known to
    the caller) without a `for` over it (`next(it)` in a `while` or a `for i in range`):
    the first frame of the user's code around `frame`, its line, and `obj` described."""
    f = frame
    while f is not None and not user_code(f):
        f = f.f_back
    if f is None:
        return None
    path = f.f_code.co_filename
    what, why = describe(obj, None, site_of, index)
    return Target(f"{os.path.abspath(path)}:{f.f_lineno}", linecache.getline(path, f.f_lineno).strip(), what, why,
                  obj)


def of(frame: Any, loader: Any, index: Optional[int], sites: Any) -> Optional[Target]:
    """What the loop around `frame` iterates (find), the user's code told from the
    libraries' by where its files are; where it takes batches of `loader` (the `index`-th
    loader the script iterated) without a `for` over it, that loader at the loop's line
    (at). `sites`: loader -> where it was created. None where the frames cannot be read."""
    user_code = _user_code()

    def site_of(obj: Any) -> Optional[str]:
        try:
            return sites.get(obj)
        except TypeError:  # not weakly referable: no loader of ours
            return None
    try:
        target = find(frame, user_code, site_of)
        if loader is not None and (target is None or target.obj is not loader):
            return at(frame, loader, user_code, site_of, index)
        if target is not None and index is not None and target.obj is loader:
            what, why = describe(loader, None, site_of, index)
            return dataclasses.replace(target, what=what, why=why)
        return target
    except Exception:  # reading the frames is best effort: the message says less
        return None


def creation_site(loader: DataLoader) -> Optional[str]:
    """file:line where the user's code created the loader: the first frame outside the
    standard library, installed packages (a library's DataLoader subclass calling
    super().__init__), torch, the frameworks and this package, and outside the loader's
    own __init__ chain (a subclass in the user's code: where it is instantiated)."""
    user_code = _user_code()
    f = sys._getframe(1)
    while f is not None:
        if user_code(f) and f.f_locals.get("self") is not loader:
            return f"{os.path.abspath(f.f_code.co_filename)}:{f.f_lineno}"
        f = f.f_back
    return None


def _user_code() -> Callable[[Any], bool]:
    """Whether a frame is the user's code: not in the standard library, an installed
    package, torch, the frameworks or this package (by where its file is)."""
    skipped = _skipped_dirs()
    return lambda f: (not f.f_code.co_filename.startswith("<")
                      and not os.path.abspath(f.f_code.co_filename).startswith(skipped))


def _skipped_dirs() -> tuple:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    dirs = [os.path.abspath(d) + os.sep for d in dirs]
    for name in _FRAMEWORKS:
        m = sys.modules.get(name)
        dirs.extend(os.path.abspath(p) + os.sep for p in (getattr(m, "__path__", None) or ()))
    return tuple(dirs)


def _enclosing_for(frame: Any) -> Optional[tuple]:
    """(the instructions, the index of the innermost FOR_ITER whose body holds the
    frame's current instruction), or None."""
    try:
        instrs = list(dis.get_instructions(frame.f_code))
    except Exception:
        return None
    lasti = frame.f_lasti
    best = None
    for k, ins in enumerate(instrs):
        if ins.opname == "FOR_ITER" and ins.offset < lasti and isinstance(ins.argval, int) and ins.argval > lasti:
            best = k
    return None if best is None else (instrs, best)


def _target(frame: Any, at: tuple, site_of: Callable[[Any], Optional[str]]) -> Target:
    instrs, k = at
    lineno = instrs[k].positions.lineno if instrs[k].positions else None
    path = frame.f_code.co_filename
    where = f"{os.path.abspath(path)}:{lineno}" if lineno else None
    line = linecache.getline(path, lineno).strip() if lineno else ""
    values = _loaded(frame, instrs, k)
    obj, name = _pick(values)
    what, why = describe(obj, name, site_of)
    return Target(where, line, what, why, obj)


def _loaded(frame: Any, instrs: list, k: int) -> list:
    """(name, value) of each name the `for` expression loads (attributes followed)."""
    start = k - 1 if k and instrs[k - 1].opname == "GET_ITER" else k
    line = instrs[start].positions.lineno if instrs[start].positions else None
    i = start
    while i > 0 and instrs[i - 1].positions and instrs[i - 1].positions.lineno == line \
            and not instrs[i - 1].opname.startswith(("STORE", "JUMP", "POP_JUMP", "FOR_ITER", "RETURN")):
        i -= 1
    values: list = []
    scope = {**vars(builtins), **frame.f_globals, **frame.f_locals}
    for ins in instrs[i:start]:
        if ins.opname in _LOADS:
            values.append((str(ins.argval), scope.get(ins.argval, _MISSING)))
        elif ins.opname in _ATTRS and values:
            name, val = values[-1]
            try:
                got = getattr(val, ins.argval) if val is not _MISSING else _MISSING
            except Exception:
                got = _MISSING
            values[-1] = (f"{name}.{ins.argval}", got)
    return [(n, v) for n, v in values if v is not _MISSING]


def _loader_like(obj: Any) -> bool:
    return isinstance(obj, DataLoader) or nodes.is_graph(obj)


def _pick(values: list) -> tuple:
    """(the object the loop iterates, its name in the expression): see the docstring."""
    for name, v in values:
        if _loader_like(v):
            return v, name
    data = [(n, v) for n, v in values if _iterable(v)]
    if data:
        return data[-1][1], data[-1][0]
    calls = [(n, v) for n, v in values if callable(v) and not isinstance(v, type)]
    if calls:
        return calls[-1][1], calls[-1][0]
    return (values[-1][1], values[-1][0]) if values else (None, None)


def _iterable(v: Any) -> bool:
    if isinstance(v, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, str, bytes)):
        return False
    return hasattr(type(v), "__iter__") or hasattr(type(v), "__getitem__")


def _defined(fn: Any) -> str:
    code = getattr(fn, "__code__", None) or getattr(fn, "gi_code", None)
    if code is None:
        return ""
    return f", defined at {os.path.abspath(code.co_filename)}:{code.co_firstlineno}"


def describe(obj: Any, name: Optional[str], site_of: Callable[[Any], Optional[str]],
             index: Optional[int] = None) -> tuple[str, str]:
    """(what the loop iterates, as a phrase; why the tool cannot cache it). `index`: the
    loader's place in the order the script iterates loaders, where known (--loader N)."""
    cls = type(obj)
    full = f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else cls.__qualname__
    site = site_of(obj) if obj is not None else None
    made = f" created at {site}" if site else ""
    if obj is None:
        return "nothing the tool could look up", "the tool could not read the loop's iterable from its frame"
    if isinstance(obj, DataLoader) or nodes.is_graph(obj):
        shown = f"torchdata.nodes.{cls.__name__}" if nodes.is_graph(obj) else full
        n = f"--loader {index}" if index else "--loader N (its place in the order your script iterates loaders)"
        return (f"a {shown}{made}" + (f" ({name})" if name else ""),
                "which the tool can measure, but it was not chosen as your training loader: no optimizer step was "
                "taken between two of its batches with grad enabled, so there is no training step to measure. To "
                f"measure it with your loop's own work between two batches as the step, name it with {n}")
    if isinstance(obj, type) and obj.__module__ == "builtins":  # range(...), zip(...): no loader at all
        what = f"{obj.__name__}(...), making its batches itself"
    elif isinstance(obj, types.GeneratorType):
        what = f"a generator ({obj.__qualname__}{_defined(obj)})"
    elif inspect.isgeneratorfunction(obj):
        what = f"a generator, {name}(...) ({obj.__qualname__}{_defined(obj)})"
    elif callable(obj) and not _iterable(obj):
        what = f"what {name}(...) returns ({getattr(obj, '__qualname__', full)}{_defined(obj)})"
    else:
        what = f"a {full}{made} ({name})"
    return what, ("which is not a torch DataLoader or a torchdata.nodes Loader (or root node), the loaders the tool "
                  "can rebuild and cache point by point: its batches come out of code the tool cannot replay. "
                  "Iterate a DataLoader or a tn.Loader in the loop, or measure the pipeline with --entry and a "
                  "Workload whose loader is one")
