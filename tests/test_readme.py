"""The documentation stays true: the README's sample output is the report rebuilt from
docs/demo-report.json, every relative link and anchor in README.md and docs/*.md
resolves, the README stays small, and the Quickstart commands (which .ci/run reads) are
there. Fast: reads files and renders one report, runs nothing."""

from __future__ import annotations

import difflib
import json
import pathlib
import re

import pytest

from bisect_pipeline import Report

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOCUMENT = DOCS / "demo-report.json"
MARKER = "<!-- sample: docs/demo-report.json -->"
README_MAX_BYTES = 10_240
QUICKSTART = (
    "python -m pip install -e . && bisect-pipeline demo",
    'python -m pip install -e ".[test]" && python -m pytest -q -n 3',
)
REGENERATE = ("regenerate it from the same document with `python scripts/screenshot.py --sample` "
              "(and the screenshots with `python scripts/screenshot.py`)")

MARKDOWN = [README] + sorted(DOCS.glob("*.md"))
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")


def sample_lines(text: str) -> list:
    """The lines of the fenced block right after the MARKER line."""
    lines = text.split("\n")
    assert MARKER in lines, f"README.md has no line {MARKER!r} before its sample output"
    at = lines.index(MARKER)
    assert lines[at + 1].startswith("```"), f"the line after {MARKER!r} must open a fenced code block"
    end = lines.index("```", at + 2)
    return lines[at + 2:end]


def test_the_readme_sample_is_the_report_rebuilt_from_its_json_document():
    shown = "\n".join(sample_lines(README.read_text(encoding="utf-8")))
    expected = str(Report.from_dict(json.loads(DOCUMENT.read_text(encoding="utf-8"))))
    if shown != expected:
        diff = "\n".join(difflib.unified_diff(shown.split("\n"), expected.split("\n"), "README.md sample",
                                              "str(Report.from_dict(docs/demo-report.json))", lineterm=""))
        pytest.fail(f"README.md's sample output differs from the report rendered from {DOCUMENT.name} (the text "
                    f"renderer changed?): {REGENERATE}.\n{diff}")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set:
    out, seen = set(), {}
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: pathlib.Path) -> list:
    """Relative link and image targets of a Markdown file, outside code."""
    text = INLINE_CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT) if ROOT in dest.parents else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)


def test_the_readme_links_the_docs():
    targets = {t.partition("#")[0] for t in links(README)}
    missing = [p.relative_to(ROOT).as_posix() for p in sorted(DOCS.glob("*.md"))
               if p.relative_to(ROOT).as_posix() not in targets]
    assert not missing, f"README.md does not link {missing}"


def test_the_readme_is_at_most_10_kib():
    size = README.stat().st_size
    assert size <= README_MAX_BYTES, (f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/ "
                                      "and link it")


def test_the_quickstart_commands_are_there_verbatim():
    lines = README.read_text(encoding="utf-8").split("\n")
    for command in QUICKSTART:
        assert command in lines, f"README.md's Quickstart must have the line {command!r}"
    # what .ci/run greps for: the test command, alone on its line
    assert re.search(r'^python -m pip install -e "\.\[test\]" && python -m pytest', "\n".join(lines), re.MULTILINE)
