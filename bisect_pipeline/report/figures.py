"""Numbers as the report shows them, shared by the text, the HTML and the document."""

from __future__ import annotations

import math
import os
import tempfile
from typing import Optional

from ..verdict import StageCost

POINT_MEANING = {
    "device": "batches cached on the device: step only (the ceiling)",
    "host": "batches cached on the host: transfer + step",
    "collated": "collated batches cached: handoff + transfer + step",
    "augmented": "dataset outputs cached: collate + handoff + transfer + step",
    "raw": "loaded samples cached: augment + collate + handoff + transfer + step",
    "full": "your pipeline as it is",
}


def batch_size_text(batch_size: float, source: str) -> str:
    """The batch size and, unless it is the loader's batch_size, where it comes from (the
    source's first clause: "8 (counted in the collated batch: loader batch_size 2 × 4 per
    sample)")."""
    if source and source != "DataLoader.batch_size":
        return f"{batch_size} ({source.split(' (')[0]})"
    return str(batch_size)


def gain_if_free(s: StageCost, full: Optional[float]) -> Optional[float]:
    """Relative throughput gain if the stage were free: if_free / full - 1 (0.33 = +33%);
    `full` is the full pipeline's samples/s as the report shows it."""
    if s.samples_per_sec_if_free is None or not full or full <= 0:
        return None
    return s.samples_per_sec_if_free / full - 1


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
