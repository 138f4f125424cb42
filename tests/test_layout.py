"""The package's shape (issue 12): no import cycle between its modules, no function with
more than 6 positional parameters, bisect() on one screen, every module importable alone.
Read from the source (ast), so these run in milliseconds."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "bisect_pipeline"
MAX_POSITIONAL = 6
SCREEN_LINES = 60


def modules() -> dict:
    """'bisect_pipeline.report.text' -> its ast, for every module of the package."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = (path, ast.parse(path.read_text(), str(path)))
    return out


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> list:
    """The package modules a `from ... import ...` at module level loads."""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    out = [target]
    for alias in node.names:  # `from . import tree` loads the module bisect_pipeline.tree
        out.append(f"{target}.{alias.name}")
    return out


def import_graph() -> dict:
    mods = modules()
    graph = {}
    for name, (path, tree) in mods.items():
        deps = set()
        for node in tree.body:  # module level only: a function's own import runs when it is called
            if isinstance(node, ast.ImportFrom):
                deps.update(d for d in _resolve(name, path.name == "__init__.py", node) if d in mods)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
        deps.discard(name)
        # a submodule's import of its own package is not a cycle: the package is loading it
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def test_the_modules_import_each_other_without_a_cycle():
    graph = import_graph()
    assert len(graph) > 20
    state: dict = {}

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                pytest.fail("import cycle: " + " -> ".join(path + [node, dep]))
            if dep not in state:
                visit(dep, path + [node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_no_function_takes_more_than_six_positional_parameters():
    too_many = []
    for name, (path, tree) in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                if len(args) > MAX_POSITIONAL:
                    too_many.append(f"{name}.{node.name} ({len(args)})")
    assert not too_many


def test_bisect_fits_on_one_screen():
    _, tree = modules()["bisect_pipeline.api"]
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "bisect"]
    assert fn.end_lineno - fn.lineno + 1 <= SCREEN_LINES


@pytest.mark.e2e
def test_every_module_imports_alone():
    # One interpreter for all, importing each module first into a fresh set of modules.
    names = sorted(modules())
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    for m in [m for m in sys.modules if m.startswith('bisect_pipeline')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
