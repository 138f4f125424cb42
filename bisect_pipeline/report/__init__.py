"""The report: a diagnosis that renders itself (model.Report), its JSON document both
ways (document), and its renderings as pure functions of it: text, html, plot; the
torchrun report of all ranks (ranks)."""

from ..core.results import NOT_SELECTED, STATUSES, PointResult
from .document import SCHEMA_VERSION, measurements_of, point_dict, stage_dict, to_dict
from .figures import POINT_MEANING, write_atomic
from .model import Report, build

__all__ = sorted(["NOT_SELECTED", "POINT_MEANING", "PointResult", "Report", "SCHEMA_VERSION", "STATUSES", "build",
                  "measurements_of", "point_dict", "stage_dict", "to_dict", "write_atomic"])
