"""Render stored reports again: for a refactor that must not change what a report says.

Each JSON document given (by default docs/demo-report.json and docs/gpu/*.json) is
diagnosed again from its measurements (`Report.from_dict`) and written to OUT as its JSON
document, its text (`--breakdown all` too), its `--brief` summary and its HTML. Run it on
the code before a change and after it, then compare the two folders:

    python scripts/render_stored.py --out /tmp/before          # on the old code
    python scripts/render_stored.py --out /tmp/after           # on the new code
    diff -r /tmp/before /tmp/after && echo identical
"""

from __future__ import annotations

import argparse
import glob
import json
import pathlib

from bisect_pipeline.report.model import Report

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT = [str(ROOT / "docs" / "demo-report.json")] + sorted(glob.glob(str(ROOT / "docs" / "gpu" / "*.json")))


def render(path: str, out: pathlib.Path) -> None:
    with open(path) as f:
        doc = json.load(f)
    if "batch_size" not in doc and "ranks" not in doc:  # a --sweep's table, a gpu_check record
        print(f"{path}: not a report document, skipped")
        return
    if "ranks" in doc:  # a torchrun document of all ranks: each rank's report
        docs = {f"rank{i}": d for i, d in enumerate(doc["ranks"])}
    else:
        docs = {"": doc}
    for suffix, one in docs.items():
        name = pathlib.Path(path).stem + (f"-{suffix}" if suffix else "")
        report = Report.from_dict(one)
        (out / f"{name}.json").write_text(report.to_json() + "\n")
        (out / f"{name}.txt").write_text(report.text() + "\n")
        (out / f"{name}.all.txt").write_text(report.text(breakdown="all") + "\n")
        (out / f"{name}.brief.txt").write_text(report.brief() + "\n")
        (out / f"{name}.html").write_text(report.html() + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("documents", nargs="*", default=DEFAULT, help="JSON documents (default: the stored ones)")
    ap.add_argument("--out", required=True, help="folder for the renderings")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for path in args.documents:
        render(path, out)
    print(f"{len(args.documents)} documents rendered to {out}")


if __name__ == "__main__":
    main()
