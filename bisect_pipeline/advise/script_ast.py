"""The user's script as `--patch` (patch.py) reads it: the syntax tree with each node's
parent, positions as character offsets in its lines, its argparse flags, and the call at
a line that built the training loader. Apart from what changes the script (patch.py) and
from the diff (edits.py): every rewrite reads the script the same way.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any, Optional

LOADER_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "pin_memory_device")


class Script:
    """The parsed source, with parents, line offsets, the script's argparse flags and the
    names that build a DataLoader in it."""

    def __init__(self, source: str, tree: ast.Module, path: str) -> None:
        self.source, self.tree, self.path = source, tree, path
        self.lines = source.splitlines(keepends=True)
        self.newline = "\r\n" if self.lines and self.lines[0].endswith("\r\n") else "\n"
        self.parent: dict = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.flags = argparse_flags(tree)
        self.loaders = _loader_classes(tree)

    def where(self, node: ast.AST) -> str:
        return f"{self.path}:{node.lineno}"

    def col(self, line: int, byte_col: int) -> int:
        """ast's UTF-8 byte offset as a character offset in the line."""
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def start(self, node: ast.AST) -> tuple:
        return node.lineno, self.col(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> tuple:
        return node.end_lineno, self.col(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ast.unparse(node)

    def enclosing(self, node: ast.AST, kinds: tuple) -> Optional[ast.AST]:
        p = self.parent.get(node)
        while p is not None and not isinstance(p, kinds):
            p = self.parent.get(p)
        return p

    def indent(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[: len(text) - len(text.lstrip(" \t"))]


@dataclasses.dataclass(frozen=True)
class Flag:
    """An option of the script's argparse parser: its option strings, dest and action
    (store, store_true, store_false, boolean_optional, or another it cannot set)."""

    options: tuple
    dest: str
    action: str = "store"

    def tokens(self, value: Any) -> Optional[tuple]:
        """The command-line tokens that set `value`, or None when this flag cannot."""
        opt = self.options[0]
        if self.action == "store":
            return opt, repr(value) if not isinstance(value, str) else value
        if self.action == "store_true" and value is True or self.action == "store_false" and value is False:
            return (opt,)
        if self.action == "boolean_optional":
            long = next((o for o in self.options if o.startswith("--")), opt)
            return (long,) if value else ("--no-" + long[2:],)
        return None


def argparse_flags(tree: ast.AST) -> dict:
    """dest -> Flag, from every `X.add_argument('-j', '--workers', ...)` call in the
    source (a parser, a group or a subparser alike)."""
    out: dict = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        options = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                        and a.value.startswith("-"))
        if not options:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        dest = kw.get("dest")
        name = dest.value if isinstance(dest, ast.Constant) else _dest(options)
        out.setdefault(name, Flag(options, name, _action(kw.get("action"))))
    return out


def _dest(options: tuple) -> str:
    long = next((o for o in options if o.startswith("--")), None)
    return (long[2:] if long else options[0].lstrip("-")).replace("-", "_")


def _action(node: Optional[ast.AST]) -> str:
    if node is None:
        return "store"
    if isinstance(node, ast.Constant):
        return node.value if node.value in ("store", "store_true", "store_false") else "other"
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return "boolean_optional" if name == "BooleanOptionalAction" else "other"


def name_of(func: ast.AST) -> str:
    """The called name as written, its last part: `torch.utils.data.DataLoader` -> DataLoader."""
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Call):  # super().__init__ and the like
        return name_of(func.func)
    return ""


def called_through(s: Script, func: ast.AST) -> str:
    """The called name's prefix as written: `transforms.` of `transforms.ToTensor` ('' for
    a bare name)."""
    return s.text(func.value) + "." if isinstance(func, ast.Attribute) else ""


def is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def after_imports(tree: ast.Module) -> int:
    """The line after the module's first run of top-level imports (__future__'s among them;
    what comes before it, a docstring, a sys.path line, is skipped), or after a leading
    docstring where the module imports nothing: where a line the whole script needs goes."""
    last = 0
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            last = node.end_lineno
        elif last:
            break
    if not last and tree.body and is_docstring(tree.body[0]):
        last = tree.body[0].end_lineno
    return last + 1


def imported_names(s: Script) -> set:
    """The names the module's top-level imports bind."""
    out = set()
    for node in s.tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def uses(tree: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name or isinstance(n, ast.Attribute) and n.attr == name
               for n in ast.walk(tree))


def _loader_classes(tree: ast.Module) -> set:
    """Names that build a DataLoader: DataLoader (and ...DataLoader), and the classes the
    script derives from one."""
    names = {"DataLoader"}
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for _ in range(3):  # a subclass of a subclass
        for c in classes:
            if any(name_of(b) in names or name_of(b).endswith("DataLoader") for b in c.bases):
                names.add(c.name)
    return names


def find_call(s: Script, line: int) -> Optional[ast.Call]:
    """The call at `line` that built the loader: among the calls whose span holds the
    line, a DataLoader (or a class derived from one) first, then one that takes a loader's
    keywords (a factory), then the outermost (the frame's line is where the called name
    ends: `torch.utils.data.DataLoader(` of a call over several lines)."""
    calls = [n for n in ast.walk(s.tree) if isinstance(n, ast.Call) and n.lineno <= line <= n.end_lineno]
    if not calls:
        return None

    def rank(c: ast.Call) -> tuple:
        keys = any(k.arg in LOADER_KEYS or k.arg is None for k in c.keywords)
        return (accepts_loader_keywords(s, c), keys, c.func.end_lineno == line, -(c.lineno * 10**6 + c.col_offset))

    return max(calls, key=rank)


def accepts_loader_keywords(s: Script, call: ast.Call) -> bool:
    """Whether keywords a DataLoader takes can be added to this call: a DataLoader, a
    class derived from one, or its super().__init__; not a factory of a library."""
    name = name_of(call.func)
    return name in s.loaders or name.endswith("DataLoader") or _is_super_init(s, call)


def _is_super_init(s: Script, call: ast.Call) -> bool:
    """`super().__init__(...)` inside a class derived from a DataLoader."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "__init__" and isinstance(f.value, ast.Call)
            and name_of(f.value.func) == "super"):
        return False
    cls = s.enclosing(call, (ast.ClassDef,))
    return cls is not None and cls.name in s.loaders
