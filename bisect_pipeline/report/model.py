"""The report: a diagnosis (diagnosis.py) that renders itself as text, HTML, a plot and
the JSON document. Nothing here measures or derives."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Optional

from ..advise.diagnose import diagnose
from ..core.errors import AnalysisFailed, BisectError
from ..core.results import (AllocatorHold, CacheInfo, Isolated, Measurements, Note, PointResult, RunInfo, Syncs,
                            Verification)
from ..derive.findings import Diagnosis
from . import document, html, plot as plot_mod, text
from .figures import write_atomic


@dataclasses.dataclass(frozen=True)
class Report(Diagnosis):
    """What `bisect()` returns. `bottleneck` is the verdict; `str()` the text table;
    `to_dict()` the JSON document; in a notebook it renders as HTML. A report loaded
    from JSON (`from_dict`) is diagnosed again from its measurements."""

    @classmethod
    def of(cls, m: Measurements) -> "Report":
        """The report of a run's measurements; AnalysisFailed, with them, where deriving it
        fails (a bug: the measurements are still written, cli._saved)."""
        try:
            d = diagnose(m)
        except BisectError:
            raise
        except Exception as exc:
            raise AnalysisFailed(m, exc) from exc
        return cls(**{f.name: getattr(d, f.name) for f in dataclasses.fields(Diagnosis)})

    @classmethod
    def from_dict(cls, doc: dict) -> "Report":
        return cls.of(document.measurements_of(doc))

    def to_dict(self) -> dict:
        return document.to_dict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save_json(self, path: str) -> None:
        write_atomic(path, self.to_json() + "\n")

    def __str__(self) -> str:
        return self.text()

    def text(self, *, breakdown: str = "bottleneck") -> str:
        """The text report; `breakdown` "all" shows the augment stage transform by
        transform whatever the bottleneck (by default only when augment is in question:
        named, or tied for the lead)."""
        return text.to_text(self, breakdown=breakdown)

    def brief(self) -> str:
        """The summary alone, at most 6 lines (`--brief`): the verdict with its cost, how
        firm it is, the first change with its measured figure, what to measure next."""
        return text.brief(self)

    def html(self, *, breakdown: str = "bottleneck") -> str:
        """The HTML fragment a notebook shows; `breakdown` "all" shows the parts inside
        every stage measured by parts (by default only inside the stages in question)."""
        return html.to_html(self, breakdown=breakdown)

    def _repr_html_(self) -> str:
        return self.html()

    def plot(self, ax: Any = None) -> Any:
        """A matplotlib figure of samples/s per point, the bottleneck's drop highlighted
        (drawn into `ax` when given). Needs the optional extra: pip install bisect-pipeline[plot]."""
        return plot_mod.plot(self, ax=ax)


def build(points: Iterable[PointResult], batch_size: float, device: str, *, loader: Optional[dict] = None,
          cache: Any = None, warnings: Iterable[Any] = (), run: Any = None, complete: bool = True,
          interrupted: bool = False, isolated: Any = None, syncs: Any = None, batch_size_source: str = "",
          verification: Any = None) -> Report:
    """A report from planted or hand-made measurements: the records, or their JSON forms
    (dicts, as a document holds them); warnings as notes or strings."""
    m = Measurements(device=device, batch_size=batch_size, points=tuple(points), batch_size_source=batch_size_source,
                     loader=loader or {}, cache=CacheInfo.from_dict(cache) or CacheInfo(),
                     run=RunInfo.from_dict(run) or RunInfo(), isolated=Isolated.from_dict(isolated),
                     syncs=Syncs.from_dict(syncs), verification=Verification.from_dict(verification),
                     notes=tuple(w if isinstance(w, Note) else Note("measured", str(w)) for w in warnings),
                     complete=complete, interrupted=interrupted)
    return Report.of(m)


__all__ = ["AllocatorHold", "Report", "build"]
