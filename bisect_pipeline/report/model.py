"""The result of a run as data: each point's raw windows and status, the verdict, and
what was derived from them once (advice, summary, warnings; report/build.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from typing import Any, Optional

from ..results import NOT_SELECTED, STATUSES, PointResult  # noqa: F401 (re-exported)
from ..stats import Throughput
from ..verdict import StageCost, Verdict

# Version history of the JSON document:
#   1 - first release: schema_version, device, batch_size, bottleneck, points, stages,
#       verdict, loader, cache, advice, warnings, run, complete, interrupted.
SCHEMA_VERSION = 1


POINT_MEANING = {
    "device": "batches cached on the device: step only (the ceiling)",
    "host": "batches cached on the host: transfer + step",
    "collated": "collated batches cached: handoff + transfer + step",
    "augmented": "dataset outputs cached: collate + handoff + transfer + step",
    "raw": "loaded samples cached: augment + collate + handoff + transfer + step",
    "full": "your pipeline as it is",
}


@dataclasses.dataclass(frozen=True)
class Report:
    """What `bisect()` returns. `bottleneck` is the verdict; `str()` the text table;
    `to_dict()` the JSON document; in a notebook it renders as HTML.

    Built once by report.build (which derives the verdict, warnings, advice and summary
    from the points); a report loaded from JSON is built the same way from its windows."""

    device: str
    batch_size: int
    points: tuple[PointResult, ...]
    verdict: Verdict
    loader: dict = dataclasses.field(default_factory=dict)
    cache: dict = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    run: dict = dataclasses.field(default_factory=dict)
    complete: bool = True
    interrupted: bool = False
    # Stage costs measured in isolation in this process (isolate.py), and the host-device
    # syncs counted in the step.
    isolated: dict = dataclasses.field(default_factory=dict)
    syncs: dict = dataclasses.field(default_factory=dict)
    advice: tuple = ()  # findings as JSON-ready dicts (advice.py)
    summary: str = ""  # the verdict in one sentence
    batch_size_source: str = ""  # where batch_size comes from (cache.batch_size_of)
    # The advice's recommended settings measured against the user's (verify.run_trials):
    # raw windows; each advice item's `verified` is derived from them.
    verification: dict = dataclasses.field(default_factory=dict)

    @property
    def bottleneck(self) -> Optional[str]:
        return self.verdict.bottleneck

    def point(self, name: str) -> PointResult:
        for p in self.points:
            if p.point == name:
                return p
        raise KeyError(name)

    def stage(self, name: str) -> StageCost:
        for s in self.verdict.stages:
            if s.stage == name:
                return s
        raise KeyError(name)

    def throughput(self, name: str) -> Optional[Throughput]:
        """The windows of a point measured ok, else None."""
        p = next((p for p in self.points if p.point == name), None)
        return p.throughput if p is not None and p.status == "ok" else None

    def rate(self, name: str) -> Optional[float]:
        """The samples/s the report shows for a point: the verdict's fitted estimate
        (verdict.decide), else the median of its windows; None when not measured."""
        t = self.verdict.fitted.get(name)
        if t:
            return self.batch_size / t
        tp = self.throughput(name)
        return tp.samples_per_sec if tp else None

    def to_dict(self) -> dict:
        from .build import to_dict

        return to_dict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save_json(self, path: str) -> None:
        write_atomic(path, self.to_json() + "\n")

    def __str__(self) -> str:
        from .text import to_text

        return to_text(self)

    def _repr_html_(self) -> str:
        from .html import to_html

        return to_html(self)

    def plot(self, ax: Any = None) -> Any:
        """A matplotlib figure of samples/s per point, the bottleneck's drop highlighted
        (drawn into `ax` when given). Needs the optional extra: pip install bisect-pipeline[plot]."""
        from .plot import plot

        return plot(self, ax=ax)

    @classmethod
    def from_dict(cls, doc: dict) -> "Report":
        from .build import from_dict

        return from_dict(doc)


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
