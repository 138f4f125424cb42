"""The package's shape: its folders are its layers, and no module imports from a folder
above its own (imports inside functions and under `TYPE_CHECKING` counted); no import
cycle between its modules, for the type checker either; tests/ mirrors the folders; no
module over about 500 lines without the reason at its top, none over 600 unless
docs/development.md names it with its reason; no function with more than 5
positional parameters, none over 60 lines in the measuring and derivation layers,
bisect() on one screen, every module importable alone. Read from the source (ast), so
these run in milliseconds."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "bisect_pipeline"
TESTS = pathlib.Path(__file__).resolve().parent
# The layers, bottom to top (docs/development.md): a module imports from its own folder and
# those below it. "" is the package's top: the drivers and the public API.
LAYERS = ("core", "pipeline", "derive", "measure", "advise", "report", "")
LONG_MODULE = 500  # lines; a longer module says why at its top ("Why one module: ...")
MAX_MODULE = 600  # lines; a longer one is named, with its reason, in docs/development.md
DEVELOPMENT = PKG.parent / "docs" / "development.md"
LONGER_HEADING = "### Modules past 600 lines"
MAX_POSITIONAL = 5
SCREEN_LINES = 60
# The layers below the report: what measures and what derives from the measurements.
MEASURING_AND_DERIVING = ("bisect_pipeline.measure.plan", "bisect_pipeline.measure.visit",
                          "bisect_pipeline.core.results", "bisect_pipeline.measure.experiment",
                          "bisect_pipeline.measure.rounds", "bisect_pipeline.measure.distributed",
                          "bisect_pipeline.advise.verify", "bisect_pipeline.sweep", "bisect_pipeline.measure.cache",
                          "bisect_pipeline.measure.sources", "bisect_pipeline.measure.isolate",
                          "bisect_pipeline.measure.breakdown", "bisect_pipeline.advise.confirm",
                          "bisect_pipeline.measure.reads", "bisect_pipeline.measure.reorder",
                          "bisect_pipeline.measure.allocator", "bisect_pipeline.core.stats",
                          "bisect_pipeline.derive.verdict", "bisect_pipeline.derive.witness",
                          "bisect_pipeline.advise.advice", "bisect_pipeline.advise.outcome",
                          "bisect_pipeline.advise.diagnose", "bisect_pipeline.loop", "bisect_pipeline.advise.patch",
                          "bisect_pipeline.advise.tune", "bisect_pipeline.derive.findings", "bisect_pipeline.core.noise",
                          # split from the modules above (issue 57)
                          "bisect_pipeline.derive.drops", "bisect_pipeline.derive.reasons",
                          "bisect_pipeline.advise.context", "bisect_pipeline.advise.wording",
                          "bisect_pipeline.advise.rules_workers", "bisect_pipeline.advise.rules_load",
                          "bisect_pipeline.advise.rules_augment", "bisect_pipeline.advise.rules_batch",
                          "bisect_pipeline.advise.rules_step", "bisect_pipeline.advise.script_ast",
                          "bisect_pipeline.advise.edits", "bisect_pipeline.loop_patches", "bisect_pipeline.loop_loaders",
                          "bisect_pipeline.loop_end", "bisect_pipeline.measure.prepare",
                          "bisect_pipeline.measure.iterator_alone",  # issue 59
                          "bisect_pipeline.measure.point_sources", "bisect_pipeline.core.record",
                          "bisect_pipeline.core.isolated", "bisect_pipeline.core.trials",
                          "bisect_pipeline.measure.worker_stages", "bisect_pipeline.measure.device_alone",
                          "bisect_pipeline.measure.timed",
                          # the stage's own fixes (issue 58)
                          "bisect_pipeline.measure.tail", "bisect_pipeline.measure.decode",
                          "bisect_pipeline.core.fixes", "bisect_pipeline.advise.fixes",
                          "bisect_pipeline.advise.rules_fixes", "bisect_pipeline.advise.turns",
                          "bisect_pipeline.advise.patch_tail")


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
    for alias in node.names:  # `from . import tree` loads the module bisect_pipeline.core.tree
        out.append(f"{target}.{alias.name}")
    return out


def _imports(node: ast.AST, typing: bool = False):
    """Every import statement that can run: at module level and inside functions; those
    under `if TYPE_CHECKING:`, which never run, only when `typing`."""
    for child in ast.iter_child_nodes(node):
        if not typing and isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _imports(child, typing)


def import_graph(typing: bool = False) -> dict:
    """module -> the package modules it imports (with `typing`, the type checker's imports too)."""
    mods = modules()
    graph = {}
    for name, (path, tree) in mods.items():
        deps = set()
        for node in _imports(tree, typing):
            if isinstance(node, ast.ImportFrom):
                deps.update(d for d in _resolve(name, path.name == "__init__.py", node) if d in mods)
            else:
                deps.update(a.name for a in node.names if a.name in mods)
        deps.discard(name)
        # a submodule's import of its own package is not a cycle: the package is loading it
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def layer(module: str) -> str:
    """The layer (folder) a module of the package is in; "" at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else ""


def upward(graph: dict) -> list:
    """Every import of a module in a layer above the importer's."""
    return [f"{m} ({layer(m) or 'top'}) imports {d} ({layer(d) or 'top'})"
            for m, deps in sorted(graph.items()) for d in sorted(deps)
            if LAYERS.index(layer(d)) > LAYERS.index(layer(m))]


def test_every_module_is_in_a_layer_and_none_imports_from_a_layer_above_its_own():
    graph = import_graph(typing=True)
    assert {layer(m) for m in graph} == set(LAYERS)
    assert not upward(graph)


def test_an_import_from_a_layer_above_is_caught_even_for_the_type_checker():
    assert upward({"bisect_pipeline.advise.advice": {"bisect_pipeline.report.text"}})
    assert upward({"bisect_pipeline.report.text": {"bisect_pipeline.api"}})
    assert not upward({"bisect_pipeline.api": {"bisect_pipeline.core.stats"}})
    assert layer("bisect_pipeline.pipeline.integrations.hf") == "pipeline"
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .x import Y\n")
    assert [n.module for n in _imports(tree)] == ["typing"]
    assert [n.module for n in _imports(tree, typing=True)] == ["typing", "x"]


def test_tests_mirror_the_package_folders():
    strays = []
    for path in sorted(TESTS.rglob("test_*.py")):
        folder = path.parent.relative_to(TESTS).parts
        if not folder:  # the drivers' tests and those of the whole tool
            continue
        subject = path.stem[len("test_"):]
        if subject.startswith("integrations_"):  # test_integrations_hf: integrations/hf.py
            folder, subject = folder + ("integrations",), subject[len("integrations_"):]
        if not PKG.joinpath(*folder, subject + ".py").exists():
            strays.append(str(path.relative_to(TESTS)))
    assert not strays, strays


def test_no_module_is_over_500_lines_without_saying_why_at_its_top():
    silent = []
    for name, (path, tree) in modules().items():
        lines = len(path.read_text().splitlines())
        if lines > LONG_MODULE and "Why one module:" not in (ast.get_docstring(tree) or ""):
            silent.append(f"{name} ({lines} lines)")
    assert not silent, silent


def longer_allowed(text: str) -> dict:
    """docs/development.md's list of the modules allowed past MAX_MODULE lines: each bullet
    under LONGER_HEADING, "- `bisect_pipeline/x/y.py`: the reason", as path -> reason."""
    out, inside = {}, False
    for line in text.splitlines():
        if line.startswith("#"):
            inside = line.strip() == LONGER_HEADING
        elif inside and line.startswith("- `"):
            path, _, reason = line[3:].partition("`")
            out[path] = reason.lstrip(":").strip()
    return out


def too_long(lengths: dict, allowed: dict) -> list:
    """Modules past MAX_MODULE lines without a reason in the list, and entries of the list
    that are not past it (a stale reason)."""
    over = {path for path, n in lengths.items() if n > MAX_MODULE}
    return ([f"{p} ({lengths[p]} lines) has no reason in {LONGER_HEADING!r}" for p in sorted(over) if not allowed.get(p)]
            + [f"{p} is listed but not past {MAX_MODULE} lines" for p in sorted(set(allowed) - over)])


def test_no_module_is_past_600_lines_unless_development_md_says_why():
    lengths = {str(path.relative_to(PKG.parent)): len(path.read_text().splitlines()) for path, _ in modules().values()}
    assert not too_long(lengths, longer_allowed(DEVELOPMENT.read_text()))


def test_the_600_line_rule_reads_its_reasons_and_catches_both_ways():
    doc = (f"## Layout\n\n{LONGER_HEADING}\n\n- `bisect_pipeline/a.py`: one table the report renders whole\n"
           "- `bisect_pipeline/b.py`:\n\n## Next\n\n- `bisect_pipeline/c.py`: not in the list\n")
    allowed = longer_allowed(doc)
    assert allowed == {"bisect_pipeline/a.py": "one table the report renders whole", "bisect_pipeline/b.py": ""}
    assert not too_long({"bisect_pipeline/a.py": 700, "bisect_pipeline/d.py": 600}, {"bisect_pipeline/a.py": "why"})
    problems = too_long({"bisect_pipeline/a.py": 601, "bisect_pipeline/b.py": 650, "bisect_pipeline/c.py": 900,
                         "bisect_pipeline/e.py": 10}, {**allowed, "bisect_pipeline/e.py": "stale"})
    assert problems == ["bisect_pipeline/b.py (650 lines) has no reason in '### Modules past 600 lines'",
                        "bisect_pipeline/c.py (900 lines) has no reason in '### Modules past 600 lines'",
                        "bisect_pipeline/e.py is listed but not past 600 lines"]


def test_the_modules_import_each_other_without_a_cycle_even_for_the_type_checker():
    graph = import_graph(typing=True)
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


def test_no_function_takes_more_than_five_positional_parameters():
    too_many = []
    for name, (path, tree) in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                if len(args) > MAX_POSITIONAL:
                    too_many.append(f"{name}.{node.name} ({len(args)})")
    assert not too_many


def test_no_function_of_the_measuring_and_deriving_layers_is_longer_than_a_screen():
    long = []
    for name, (path, tree) in modules().items():
        if name not in MEASURING_AND_DERIVING:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > SCREEN_LINES:
                long.append(f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long


def test_bisect_fits_on_one_screen():
    _, tree = modules()["bisect_pipeline.api"]
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "bisect"]
    assert fn.end_lineno - fn.lineno + 1 <= SCREEN_LINES


@pytest.mark.e2e
def test_every_module_imports_alone():
    # Importing any module first imports the package (its __init__), so each module is
    # imported alone, from a fresh set of modules, only when the package's own import does
    # not already bring it in: the same coverage as one fresh import per module.
    names = sorted(modules())
    code = ("import importlib, sys\n"
            "def fresh():\n"
            "    for m in [m for m in sys.modules if m.startswith('bisect_pipeline')]:\n"
            "        del sys.modules[m]\n"
            "import bisect_pipeline\n"
            "with_package = {m for m in sys.modules if m.startswith('bisect_pipeline')}\n"
            f"for name in {names!r}:\n"
            "    if name not in with_package:\n"
            "        fresh()\n"
            "        importlib.import_module(name)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
