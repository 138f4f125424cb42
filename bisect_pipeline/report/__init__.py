"""The result of a run: data built once from the measurements (build), its JSON document,
and its renderings as pure functions of it: text, html, plot."""

from .build import build, from_dict, point_dict, stage_dict, to_dict
from .model import NOT_SELECTED, POINT_MEANING, SCHEMA_VERSION, STATUSES, PointResult, Report, write_atomic

__all__ = sorted(["NOT_SELECTED", "POINT_MEANING", "PointResult", "Report", "SCHEMA_VERSION", "STATUSES", "build",
                  "from_dict",
                  "point_dict", "stage_dict", "to_dict", "write_atomic"])
