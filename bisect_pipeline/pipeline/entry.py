"""Load the user's workload from `--entry MODULE:FUNCTION` or `path/to/file.py:FUNCTION`.

This imports and runs the user's code, by design (like `uvicorn app:app`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

from ..core.errors import BisectError
from .workload import Workload, as_workload

CONTRACT = (
    "The entry is MODULE:FUNCTION (MODULE importable from the current directory) or "
    "path/to/file.py:FUNCTION; FUNCTION takes no required arguments and returns "
    "bisect_pipeline.Workload(model=..., loader=...), a dict with those keys, or a (model, loader) tuple."
)


def resolve(spec: str) -> Callable[[], Any]:
    """Import the module of `spec` and return its function (not called yet)."""
    module_part, sep, func_name = spec.rpartition(":")
    if not sep or not module_part or not func_name:
        raise BisectError(f"--entry {spec!r} is not of the form MODULE:FUNCTION. {CONTRACT}")
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        module = _import_file(module_part, spec)
    else:
        module = _import_module(module_part, spec)
    func = getattr(module, func_name, None)
    if func is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:10]
        raise BisectError(
            f"--entry {spec!r}: module {module.__name__!r} has no attribute {func_name!r} "
            f"(callables there: {', '.join(public) or 'none'}). {CONTRACT}"
        )
    if not callable(func):
        raise BisectError(f"--entry {spec!r}: {func_name!r} is a {type(func).__name__}, not a function. {CONTRACT}")
    return func


def load(spec: str) -> Workload:
    """Import, call and validate the entry function."""
    func = resolve(spec)
    try:
        result = func()
    except BisectError:
        raise
    except TypeError as exc:
        raise BisectError(f"--entry {spec!r}: calling it without arguments failed: {exc}. {CONTRACT}") from exc
    except Exception as exc:
        raise BisectError(
            f"--entry {spec!r} raised {type(exc).__name__}: {exc}.{_hint(exc)} Fix the entry function "
            "(rerun with --debug for the traceback)."
        ) from exc
    return as_workload(result, where=f"--entry {spec!r}")


def _import_module(name: str, spec: str):
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise BisectError(
                f"--entry {spec!r}: no module named {name!r} importable from {cwd}. "
                f"Run from the directory that holds it, or give a file path (path/to/{name.replace('.', '/')}.py:FUNCTION). "
                f"{CONTRACT}"
            ) from exc
        raise _import_failed(spec, exc) from exc
    except Exception as exc:
        raise _import_failed(spec, exc) from exc


def _import_file(path: str, spec: str):
    if not os.path.isfile(path):
        raise BisectError(f"--entry {spec!r}: no file {path!r} (from {os.getcwd()}). {CONTRACT}")
    path = os.path.abspath(path)
    name = os.path.splitext(os.path.basename(path))[0]
    if not name.isidentifier():
        name = "_bisect_entry_" + "".join(c if c.isalnum() else "_" for c in name)
    # The file's folder goes on sys.path so that its own imports work, and the module is
    # registered under its name so that worker processes (spawn) can unpickle its classes.
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise _import_failed(spec, exc) from exc
    return module


def _import_failed(spec: str, exc: BaseException) -> BisectError:
    return BisectError(
        f"--entry {spec!r}: importing it raised {type(exc).__name__}: {exc}.{_hint(exc)} The error is in the "
        "user's module, not in bisect-pipeline (rerun with --debug for the traceback)."
    )


def _hint(exc: BaseException) -> str:
    """' Install it: pip install "bisect-pipeline[hf]".' when an optional library is missing."""
    from .integrations import install_hint

    hint = install_hint(exc)
    return f" Missing optional library: {hint}." if hint else ""
