"""Hugging Face datasets: a `datasets.Dataset` keeps `with_transform` / `set_transform` in
its format (_format_type "custom", _format_kwargs["transform"]). The formatter reads the
Arrow rows and decodes their features (images, audio: loading), then calls the transform
on a batch of rows (augment); Dataset.__getitems__ does that once for a whole batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

from ...core import tree
from ..recording import RecordingTransform, place
from ._common import by_name


def is_dataset(obj: Any) -> bool:
    return by_name(obj, ("datasets",), ("Dataset",)) and hasattr(obj, "_format_kwargs")


def instrument(ds: Any, ds2: Any, where: str, recorder: Any, found: dict) -> None:
    """The copy gets its own format kwargs with a recording proxy; the user's dataset
    keeps its own."""
    kwargs = getattr(ds, "_format_kwargs", None) or {}
    fn = kwargs.get("transform")
    if getattr(ds, "_format_type", None) != "custom" or fn is None or not callable(fn):
        return
    ds2._format_kwargs = dict(kwargs, transform=_FormatTransform(fn, f"{where}.set_transform", recorder))
    found[f"{where}.set_transform"] = (f"{where} format transform ({getattr(fn, '__qualname__', type(fn).__name__)}, "
                                       "with_transform/set_transform)")


def no_transform_reason(ds: Any) -> Optional[str]:
    """Why `raw` is unavailable, in the library's own terms, when the dataset (or the one
    under a Subset chain) is a library dataset without a transform we can separate."""
    while isinstance(ds, torch.utils.data.Subset):
        ds = ds.dataset
    if is_dataset(ds):
        fmt = getattr(ds, "_format_type", None)
        return (f"the Hugging Face Dataset has no format transform (its format is {fmt!r}): its rows are read, "
                "decoded and formatted in one step, so nothing separates loading from augmentation. Apply the "
                "per-sample transforms with ds.with_transform(fn) or ds.set_transform(fn) (not .map(), which "
                "runs once ahead of time) to make the raw point available")
    return None


def fetches_batches(ds: Any) -> bool:
    """Whether a DataLoader fetches a whole batch from `ds` in one call that runs a
    Hugging Face format transform once for all its rows (Dataset.__getitems__, also
    through Subset, which forwards it; ConcatDataset does not)."""
    while isinstance(ds, torch.utils.data.Subset):
        ds = ds.dataset
    return is_dataset(ds) and callable(getattr(ds, "__getitems__", None))


def mark_batched(calls: list) -> None:
    """Mark the recorded format-transform calls of a sample as fetched in batches."""
    for call in calls:
        if isinstance(call.fn, HFRow):
            call.fn.batched = True


def replay_batched(templates: list, calls: list) -> Optional[list]:
    """Replay the samples of one batch with a single call of their format transform, as
    Dataset.__getitems__ does; None when these samples were not fetched that way (each
    is then replayed alone)."""
    if not templates or any(len(c) != 1 or not isinstance(c[0].fn, HFRow) or not c[0].fn.batched for c in calls):
        return None
    transform = calls[0][0].fn.transform
    if any(c[0].fn.transform is not transform for c in calls):
        return None
    rows = [tree.clone(c[0].args[0]) for c in calls]
    if not all(isinstance(r, Mapping) and not c[0].kwargs for r, c in zip(rows, calls)):
        return None
    batch = {k: [v for r in rows for v in r[k]] for k in rows[0]}
    out = transform(batch)
    return [place(template, {k: v[i] for k, v in out.items()}, c[0].placements)
            for i, (template, c) in enumerate(zip(templates, calls))]


class HFRow:
    """Replays a Hugging Face format transform on one recorded row batch and returns the
    row, as the formatter does (`{column: values[0]}`)."""

    def __init__(self, transform: Callable) -> None:
        self.transform = transform
        self.batched = False  # the loader fetches whole batches: replay_batched runs it once per batch

    def __call__(self, batch: Any) -> Any:
        out = self.transform(batch)
        return {k: v[0] for k, v in out.items()}


class HFLocate:
    """Where a replayed row goes in the sample: each column the transform returns."""

    def __init__(self, keys: list) -> None:
        self.keys = keys

    def __call__(self, sample: Any) -> Optional[list]:
        if not isinstance(sample, Mapping) or not self.keys:
            return None
        return [((k,), (k,)) for k in self.keys if k in sample] or None


class _FormatTransform:
    """Stands in for the format transform on the dataset copy (picklable for workers)."""

    stage = "augment"

    def __init__(self, fn: Callable, name: str, recorder: Any) -> None:
        self.inner = RecordingTransform(fn, name, recorder)

    def __call__(self, batch: Any) -> Any:
        calls = self.inner.recorder.calls
        mark = len(calls) if calls is not None else None
        out = self.inner(batch)
        if mark is not None and len(calls) > mark:
            call = calls[-1]
            call.fn = HFRow(call.fn)
            call.output = None
            if isinstance(out, Mapping):
                call.locate = HFLocate(list(out.keys()))
        return out
