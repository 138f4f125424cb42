"""bisect-pipeline: find the stage of a PyTorch input pipeline that starves the training step."""

from .api import Interrupted, bisect
from .core.errors import BisectError
from .loop import ScriptStopped, Session, watch, watching
from .measure.plan import Plan
from .pipeline.workload import Workload
from .report import Report

__version__ = "0.2.0"

__all__ = sorted(["BisectError", "Interrupted", "Plan", "Report", "ScriptStopped", "Session", "Workload", "bisect",
                  "watch", "watching", "__version__"])
assert __all__ == sorted(__all__)
