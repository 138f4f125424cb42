"""bisect-pipeline: find the stage of a PyTorch input pipeline that starves the training step."""

from .api import Interrupted, bisect
from .errors import BisectError
from .report import Report
from .plan import Plan
from .workload import Workload

__version__ = "0.1.0"

__all__ = sorted(["BisectError", "Interrupted", "Plan", "Report", "Workload", "bisect", "__version__"])
assert __all__ == sorted(__all__)
