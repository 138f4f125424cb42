"""Numbers and strings as the report shows them, shared by the text, the HTML and the document."""

from __future__ import annotations

import html
import math
import os
import tempfile
from typing import Any, Optional

from ..derive.drops import StageCost

POINT_MEANING = {
    "device": "batches cached on the device: step only (the ceiling)",
    "host": "batches cached on the host: transfer + step",
    "collated": "collated batches cached: handoff + transfer + step",
    "augmented": "dataset outputs cached: collate + handoff + transfer + step",
    "raw": "loaded samples cached: augment + collate + handoff + transfer + step",
    "full": "your pipeline as it is",
}


def step_alone_text(p) -> str:
    """What the points table adds for a point first read from the step timed alone before
    the points (PointResult.step_alone: a tight budget's ceiling), else ''."""
    if not p.step_alone:
        return ""
    windows = len(p.throughput.windows) if p.throughput is not None else 0
    return ("; the step timed alone before the points" if windows <= 1 else
            "; its first reading the step timed alone before the points")


def batch_size_text(batch_size: float, source: str) -> str:
    """The batch size and, unless it is the loader's batch_size, where it comes from (the
    source's first clause: "8 (counted in the collated batch: loader batch_size 2 × 4 per
    sample)")."""
    if source and source != "DataLoader.batch_size":
        return f"{batch_size} ({source.split(' (')[0]})"
    return str(batch_size)


def ended_parts(source: Optional[dict], bottleneck: Optional[str]) -> Optional[tuple]:
    """Where the user's script ended on its own before the experiment did
    (loop_end.Ending._shortfall): (what happened: the batches it gave and the fewest the
    measurement needs; what to run instead, or ""). None otherwise."""
    e = (source or {}).get("ended")
    if not e:
        return None
    how = {"exit": f"Your script exited ({e.get('detail')})", "raised": f"Your script raised {e.get('detail')}"}.get(
        e.get("how"), "Your script ended")
    if e.get("no_loader"):
        return f"{how} before anything was measured: {e['no_loader']}.", ""
    batches, needed = e.get("batches") or 0, e.get("needed") or 0
    text = f"{how} after {batches:,} batches of its training loader, before the measurement was done"
    if needed > batches:
        text += (f": it needs at least about {needed:,} ({e.get('rounds')} rounds over {e.get('points')} points, "
                 "each visit its first batch, a warm-up and its timed windows)")
    text += "; the verdict above is from what was measured." if bottleneck else "."
    epoch, per_epoch = e.get("epoch_batches"), e.get("epoch_needs")
    if epoch and per_epoch and epoch < per_epoch:
        return (text + f" Its epochs are {epoch:,} batches, fewer than the {per_epoch:,} one timed window needs "
                "within an epoch (each epoch's end voids the window under way, and the point warms up again "
                "after it), so more epochs would not help.", "Measure it with --entry (a function that returns your "
                "model and loader), or with epochs of more batches.")
    if needed > batches:
        times = -(-needed // max(batches, 1))
        return text, (f"Run it for more epochs or steps (about {times}x as many batches), or measure it with "
                      "--entry (a function that returns your model and loader).")
    return text, "Run it for more epochs or steps, so that the rounds can settle the noise."


def incomplete_why(r_interrupted: bool, source: Optional[dict]) -> str:
    """Why a run is incomplete, in a few words."""
    if r_interrupted:
        return "interrupted"
    return "your script ended first" if (source or {}).get("ended") else "stopped by --max-seconds"


def gain_if_free(s: StageCost, full: Optional[float]) -> Optional[float]:
    """Relative throughput gain if the stage were free: if_free / full - 1 (0.33 = +33%);
    `full` is the full pipeline's samples/s as the report shows it."""
    if s.samples_per_sec_if_free is None or not full or full <= 0:
        return None
    return s.samples_per_sec_if_free / full - 1


def num(x: Optional[float], nd: int = 1) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def finite(x: Optional[float], nd: int) -> Optional[float]:
    """Rounded for the document; None where there is no finite value (JSON has no inf)."""
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def ms(x: Optional[float]) -> Optional[float]:
    return finite(None if x is None else x * 1e3, 3)


def write_atomic(path: str, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: never half a document."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Footnotes:
    """Why rows were not measured, each reason once: `mark(status, reason)` is the row's
    note ('skipped [1]'), `new()` the (number, reason) pairs first marked since the last
    call, for the notes under a table (a reason already given above keeps its number).
    The text and the HTML tables share it."""

    def __init__(self) -> None:
        self.reasons: list = []
        self._shown = 0

    def mark(self, status: str, reason: Optional[str]) -> str:
        if not reason:
            return status
        if reason not in self.reasons:
            self.reasons.append(reason)
        return f"{status} [{self.reasons.index(reason) + 1}]"

    def new(self) -> list:
        fresh = self.reasons[self._shown:]
        start, self._shown = self._shown + 1, len(self.reasons)
        return list(enumerate(fresh, start))
