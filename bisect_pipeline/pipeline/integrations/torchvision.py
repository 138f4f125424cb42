"""torchvision: the v2 wrapper (`wrap_dataset_for_transforms_v2`) keeps the dataset's
transforms on itself and calls only its joint `transforms` on the wrapped sample."""

from __future__ import annotations

from typing import Any

from ..recording import RecordingTransform
from ._common import by_name


def is_v2_wrapper(obj: Any) -> bool:
    return by_name(obj, ("torchvision",), ("VisionDatasetTVTensorWrapper",))


def instrument(ds: Any, ds2: Any, where: str, recorder: Any, found: dict) -> None:
    """The joint `transforms` call is the augment stage; reading, decoding and the
    tv_tensor wrapping of the target are loading (the inner dataset's transforms are None)."""
    fn = getattr(ds, "transforms", None)
    if fn is not None and callable(fn):
        ds2.transforms = RecordingTransform(fn, f"{where}.transforms", recorder)
        found[f"{where}.transforms"] = f"{where}.transforms ({type(fn).__name__}, wrap_dataset_for_transforms_v2)"
