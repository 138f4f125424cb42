"""Regenerate the README's sample output and the HTML report's screenshots from one
captured run, docs/demo-report.json, so that all three show the same report.

    python scripts/screenshot.py              # the README sample, then scripts/screenshots/report-{1280,800}.png
    python scripts/screenshot.py --sample     # the README sample only (no browser needed)
    python scripts/screenshot.py --print      # print the sample and change nothing

The sample is `str(Report.from_dict(document))`, written into the fenced block that
follows the line `<!-- sample: docs/demo-report.json -->` in README.md
(tests/test_readme.py checks it). The screenshots are the standalone HTML report
(`bisect_pipeline.report.html.to_document`) taken by headless Chromium at 1280 and 800 px
wide and cut below the report; they need Chromium (Debian: apt-get install chromium) and
Pillow (in the test extra). To capture a new run first:

    python -m bisect_pipeline demo --json docs/demo-report.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout's package, also when it is not installed

from bisect_pipeline import Report  # noqa: E402

DOCUMENT = os.path.join(ROOT, "docs", "demo-report.json")
README = os.path.join(ROOT, "README.md")
SHOTS = os.path.join(ROOT, "scripts", "screenshots")
MARKER = "<!-- sample: docs/demo-report.json -->"
WIDTHS = (1280, 800)
# The browser window starts this tall; a page that reaches its bottom is taken again in
# a window twice as tall (at most MAX_HEIGHT).
START_HEIGHT = 2400
MAX_HEIGHT = 19200
# White space kept below the report when the screenshot is cut.
MARGIN_PX = 24
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# No network on the machines that run this: nothing may try to reach one.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--force-device-scale-factor=1")


def load(path: str = DOCUMENT) -> Report:
    with open(path, encoding="utf-8") as f:
        return Report.from_dict(json.load(f))


def sample_block(readme: str) -> tuple[int, int]:
    """(first, last) line indices of the sample's fence lines in `readme`: the fenced block
    right after the MARKER line."""
    lines = readme.split("\n")
    try:
        at = lines.index(MARKER)
    except ValueError:
        raise SystemExit(f"README.md has no line {MARKER!r}") from None
    if at + 1 >= len(lines) or not lines[at + 1].startswith("```"):
        raise SystemExit(f"README.md: the line after {MARKER!r} must open a fenced code block")
    for end in range(at + 2, len(lines)):
        if lines[end] == "```":
            return at + 1, end
    raise SystemExit("README.md: the sample's code block is not closed")


def write_sample(text: str, readme_path: str = README) -> bool:
    """Put `text` into the README's sample block; True when the README changed."""
    with open(readme_path, encoding="utf-8") as f:
        readme = f.read()
    first, last = sample_block(readme)
    lines = readme.split("\n")
    new = "\n".join(lines[:first + 1] + text.split("\n") + lines[last:])
    if new == readme:
        return False
    with open(readme_path, "w", encoding="utf-8") as f:
        f.write(new)
    return True


def find_browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no Chromium found (looked for " + ", ".join(BROWSERS) + "); on Debian: apt-get install chromium")


def _take(browser: str, url: str, out: str, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--screenshot={out}", url]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode != 0 or not os.path.exists(out):
        raise SystemExit(f"{os.path.basename(browser)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def screenshot(browser: str, html_path: str, out: str, width: int) -> tuple[int, int]:
    """The page at `width` px, full height: taken in a tall window, then cut MARGIN_PX
    below the last row that is not white. Returns the PNG's size."""
    try:
        from PIL import Image, ImageChops
    except ImportError:
        raise SystemExit('the screenshots need Pillow: pip install pillow (or pip install -e ".[test]")') from None
    url = "file://" + os.path.abspath(html_path)
    height = START_HEIGHT
    while True:
        _take(browser, url, out, width, height)
        with Image.open(out) as img:
            rgb = img.convert("RGB")
        white = Image.new("RGB", rgb.size, (255, 255, 255))
        box = ImageChops.difference(rgb, white).getbbox()
        bottom = box[3] if box else 0
        if bottom < rgb.height - MARGIN_PX or height >= MAX_HEIGHT:
            break
        height *= 2
    cut = rgb.crop((0, 0, rgb.width, min(rgb.height, bottom + MARGIN_PX)))
    cut.save(out, optimize=True)
    return cut.size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--sample", action="store_true", help="refresh the README sample only")
    what.add_argument("--print", dest="print_only", action="store_true", help="print the sample, change nothing")
    ap.add_argument("--json", default=DOCUMENT, help="the report's JSON document (default: docs/demo-report.json)")
    args = ap.parse_args()

    report = load(args.json)
    text = str(report)
    if args.print_only:
        print(text)
        return
    changed = write_sample(text)
    print(f"README.md sample: {'updated' if changed else 'already up to date'} (verdict {report.bottleneck})")
    if args.sample:
        return

    from bisect_pipeline.report.html import to_document

    browser = find_browser()
    os.makedirs(SHOTS, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "report.html")
        with open(page, "w", encoding="utf-8") as f:
            f.write(to_document(report))
        for width in WIDTHS:
            out = os.path.join(SHOTS, f"report-{width}.png")
            size = screenshot(browser, page, out, width)
            print(f"{os.path.relpath(out, ROOT)}: {size[0]}x{size[1]}")


if __name__ == "__main__":
    main()
