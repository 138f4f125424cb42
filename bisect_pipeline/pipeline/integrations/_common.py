"""What every integration needs: recognising a library's objects without importing the
library, and importing it with an install hint when the user's objects need it."""

from __future__ import annotations

import importlib
from typing import Any, Optional

from ...core.errors import BisectError

# extra of setup.cfg that installs each optional library
EXTRAS = {"datasets": "hf", "timm": "timm", "lightning": "lightning", "pytorch_lightning": "lightning",
          "webdataset": "webdataset", "streaming": "mosaicml", "litdata": "litdata", "torchdata": "nodes"}


def by_name(obj: Any, modules: tuple, names: tuple) -> bool:
    """Whether a class in obj's MRO is named one of `names` and defined under one of
    `modules` (checked by name: nothing is imported)."""
    if obj is None:
        return False
    for cls in type(obj).__mro__:
        mod = cls.__module__ or ""
        if cls.__name__ in names and any(mod == m or mod.startswith(m + ".") for m in modules):
            return True
    return False


def require(module: str) -> Any:
    """Import an optional library, or raise a BisectError that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS.get(module.split(".")[0], module)
        raise BisectError(
            f"this pipeline needs the optional library {module!r}, which is not installed ({exc}). "
            f'Install it with: pip install "bisect-pipeline[{extra}]"'
        ) from exc


def install_hint(exc: BaseException) -> Optional[str]:
    """For an ImportError of an optional library an integration covers: how to install it."""
    name = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    extra = EXTRAS.get((name or "").split(".")[0])
    if extra is None:
        return None
    return f'the pipeline needs {name.split(".")[0]!r}: pip install "bisect-pipeline[{extra}]"'
