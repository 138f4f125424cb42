"""bisect-pipeline: find the stage of a PyTorch input pipeline that starves the training step."""

import time as _time

# When this program's own code first ran, on time.perf_counter's clock (before torch is
# imported): where the process was exec'd by a shell that worked first, its fork time is
# the shell's (api.program_start).
_FIRST_CODE_AT = _time.perf_counter()

from .api import Interrupted, bisect
from .core.errors import BisectError
from .loop import Session, watch, watching
from .loop_end import ScriptStopped
from .measure.plan import Plan
from .pipeline.workload import Workload
from .report import Report

__version__ = "0.2.0"

__all__ = sorted(["BisectError", "Interrupted", "Plan", "Report", "ScriptStopped", "Session", "Workload", "bisect",
                  "watch", "watching", "__version__"])
assert __all__ == sorted(__all__)
