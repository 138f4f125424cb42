"""The text report's layout: its width, prose wrapped to it and plain tables whose last
(text) column is wrapped to it. Shared by the report's sections (text.py, text_inside.py)."""

from __future__ import annotations

import textwrap

from tabulate import tabulate

WIDTH = 80  # the text report fits a classic terminal: prose is wrapped, tables' last column too


def wrap(text: str, first: str = "", rest: str = "") -> list:
    """`text` as lines of at most WIDTH columns, `first` before the first, `rest` before the others."""
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [first]


def table(title: str, headers: list, rows: list, align: str) -> list:
    """A plain table under its title (tabulate): columns two spaces apart, `align` "l" or
    "r" per column (numbers right-aligned with the same decimals per column, so they line
    up), the last (text) column wrapped so that each line fits WIDTH."""
    widths = [max([len(headers[i])] + [len(row[i]) for row in rows]) for i in range(len(headers) - 1)]
    room = max(16, WIDTH - sum(widths) - 2 * len(widths))
    widths.append(min(room, max([len(headers[-1])] + [len(row[-1]) for row in rows])))
    cells = [row[:-1] + ["\n".join(textwrap.wrap(row[-1], widths[-1], break_on_hyphens=False) or [""])]
             for row in rows]
    # the header and its rule as rows of a plain table: tabulate's own headers are padded
    table = tabulate([headers, ["-" * w for w in widths]] + cells, tablefmt="plain", disable_numparse=True,
                     colalign=["right" if a == "r" else "left" for a in align])
    return [title] + [line.rstrip() for line in table.splitlines()]
