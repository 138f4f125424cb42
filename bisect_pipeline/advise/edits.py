"""What a rewrite of `--patch` (patch.py) writes: spans of the user's script replaced,
keywords added to a call in its style, one unified diff of them all (git's a/ b/ form,
by difflib), one Change per setting; `applied` reads such a diff back onto a source. Apart
from deciding what to change: every rewrite's edits go through here, untouched lines kept.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
from typing import Any, Optional

from ..core.results import Record
from .script_ast import Script


@dataclasses.dataclass(frozen=True)
class Change(Record):
    """One setting: `how` it is applied (keyword: in the diff; flag: rerun with it;
    lines: lines added by the diff; env: the command's prefix; unchanged: the script
    already says so; not applied: `text` says why), `where` (file:line) and `text`."""

    setting: str
    value: Any
    how: str
    where: Optional[str] = None
    text: str = ""
    tokens: Optional[tuple] = None  # a flag: what to pass, e.g. ("-j", "1")
    aliases: Optional[tuple] = None  # a flag: every spelling of it, to take out of the command line


class Edits:
    """Spans of the original text replaced (start, end as (line, col), 1-based lines),
    applied from the last to the first so earlier positions hold."""

    def __init__(self, s: Script) -> None:
        self.s = s
        self.spans: list = []
        self.wraps: dict = {}  # id(expr) -> (expr, {name: value})
        self.adds: dict = {}  # id(call) -> (call, {name: value})

    def replace(self, node: ast.AST, text: str) -> None:
        self.spans.append((self.s.start(node), self.s.end(node), text))

    def cut(self, start: tuple, end: tuple) -> None:
        """Remove the text from `start` to `end` ((line, col), as Script.start and .end)."""
        self.spans.append((start, end, ""))

    def insert_lines(self, line: int, lines: list) -> None:
        nl = self.s.newline
        self.spans.append(((line, 0), (line, 0), "".join(x + nl for x in lines)))

    def wrap(self, expr: ast.AST, name: str, value: Any) -> None:
        self.wraps.setdefault(id(expr), (expr, {}))[1][name] = value

    def add(self, call: ast.Call, values: dict) -> None:
        self.adds.setdefault(id(call), (call, {}))[1].update(values)

    def _all(self) -> list:
        spans = list(self.spans)
        for expr, values in self.wraps.values():
            items = ", ".join(f"{k}={v!r}" for k, v in values.items())
            spans.append((self.s.start(expr), self.s.end(expr), f"dict({self.s.text(expr)}, {items})"))
        for call, values in self.adds.values():
            spans.append(_added(self.s, call, values))
        return sorted(spans, key=lambda x: (x[0], x[1]), reverse=True)

    def apply(self) -> str:
        lines = list(self.s.lines)
        text = "".join(lines)
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line))
        for (l0, c0), (l1, c1), new in self._all():
            a, b = offsets[l0 - 1] + c0, offsets[l1 - 1] + c1
            text = text[:a] + new + text[b:]
        return text

    def diff(self, name: str) -> str:
        if not self.spans and not self.wraps and not self.adds:
            return ""
        after = self.apply().splitlines(keepends=True)
        before = self.s.lines
        if before and not before[-1].endswith(("\n", "\r")):  # difflib needs the last line ended
            before = before[:-1] + [before[-1] + "\n\\ No newline at end of file\n"]
            after = after[:-1] + [after[-1] + "\n\\ No newline at end of file\n"] if after else after
        return "".join(difflib.unified_diff(before, after, f"a/{name}", f"b/{name}"))


def _added(s: Script, call: ast.Call, values: dict) -> tuple:
    """The span that adds keywords `values` to `call`, in its style: one per line after a
    last argument on a line of its own (its trailing comma kept), else `, k=v` after it."""
    items = [f"{k}={v!r}" for k, v in values.items()]
    args = sorted(list(call.args) + list(call.keywords), key=lambda n: (n.lineno, n.col_offset))
    if not args:  # DataLoader(): just inside the parentheses
        end = s.end(call)
        return (end[0], end[1] - 1), (end[0], end[1] - 1), ", ".join(items)
    last = args[-1]
    end = s.end(last)
    close = s.end(call)
    between = _between(s, end, (close[0], close[1] - 1))
    own_line = last.lineno > (args[-2].end_lineno if len(args) > 1 else call.func.end_lineno)
    if own_line:
        indent = s.indent(last.lineno)
        nl = s.newline
        if "," in between.split("#")[0]:
            comma = (end[0], end[1] + between.index(",") + 1)
            return comma, comma, "".join(f"{nl}{indent}{x}," for x in items)
        return end, end, "".join(f",{nl}{indent}{x}" for x in items)
    return end, end, "".join(f", {x}" for x in items)


def _between(s: Script, start: tuple, end: tuple) -> str:
    (l0, c0), (l1, c1) = start, end
    if l0 == l1:
        return s.lines[l0 - 1][c0:c1]
    return s.lines[l0 - 1][c0:] + "".join(s.lines[l0:l1 - 1]) + s.lines[l1 - 1][:c1]


def applied(source: str, diff: str) -> str:
    """`source` with a unified diff of it applied (the diffs `make` writes: exact context);
    ValueError where the diff does not match the source."""
    old = source.splitlines(keepends=True)
    out: list = []
    at = 0  # lines of `old` consumed
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not lines[i].startswith("@@"):
            i += 1
            continue
        start = int(lines[i].split()[1][1:].split(",")[0])
        start = start - 1 if start else 0  # an empty old side starts at 0
        out += old[at:start]
        at = start
        i += 1
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, text = lines[i][:1], lines[i][1:]
            if i + 1 < len(lines) and lines[i + 1].startswith("\\"):
                text = text.rstrip("\r\n")  # "\ No newline at end of file"
            if tag in (" ", "-"):
                if at >= len(old) or old[at] != text:
                    raise ValueError(f"the diff does not match line {at + 1}")
                at += 1
            if tag in (" ", "+"):
                out.append(text)
            i += 1
    return "".join(out + old[at:])
