"""Decode by torchvision: where a dataset decodes its image files with PIL through a
`loader` attribute (torchvision's ImageFolder and DatasetFolder, `default_loader` or
`pil_loader`), a copy that reads each file's bytes in the worker and decodes them with
`torchvision.io.decode_jpeg` (`decode_image` for other formats) to a uint8 RGB tensor;
its transforms then get a tensor instead of a PIL image, so they are adapted: ToTensor
becomes its scaling (a tensor's, the same arithmetic), PILToTensor and ToImage are
dropped (the image is one already), and the others run as they are on the tensor
(torchvision's transforms take tensors: a resize interpolates a tensor slightly
differently from a PIL image, antialiased both ways).

Before any timing (`check`), the first samples are built both ways under the same random
draws (the user's RNG states restored after): equal shapes, dtypes and structure, and a
mean absolute difference of at most MEAN_LEVELS grey levels of the image (a level: the
original batch's range of values over 255; on the generated JPEGs of the benchmarks the
decoders agreed exactly and the resizes within one level). Both differences are
reported; a copy that does not match is not timed.

On CUDA the check builds decode_device's candidate instead: the files decoded together
on the device by nvJPEG, the transforms after it run there.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

import torch
from torch.utils.data import Subset

from ..core import tree
from ..core.fixes import DECODE, Fix
from ..pipeline import state
from ..pipeline.split import replaced
from . import tail

# The decoded copy matches where its values differ from the user's by at most this many
# grey levels on average (see the module's docstring).
MEAN_LEVELS = 1.0
# Samples built both ways.
CHECK_SAMPLES = 8
JPEG_MAGIC = b"\xff\xd8"


class TorchvisionDecode:
    """ImageFolder's loader, decoded by torchvision: the file's bytes read here (in the
    worker) and decoded to a uint8 RGB tensor, channels first (pil_loader's image
    converted to RGB, as a tensor)."""

    def __call__(self, path: Any) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file

        data = read_file(os.fspath(path))
        if bytes(data[:2].tolist()) == JPEG_MAGIC:
            return decode_jpeg(data, mode=ImageReadMode.RGB)
        return decode_image(data, mode=ImageReadMode.RGB)

    def __repr__(self) -> str:
        return "lambda path: decode_jpeg(read_file(path), mode=ImageReadMode.RGB)"


def site(dataset: Any) -> tuple[Optional[str], str]:
    """(the name of the attribute that decodes the dataset's images with PIL:
    "dataset.loader", through Subsets; or None, why not)."""
    from torchvision.datasets import folder

    name, ds = "dataset", dataset
    while isinstance(ds, Subset):
        name, ds = name + ".dataset", ds.dataset
    loader = getattr(ds, "loader", None)
    if loader is None or not hasattr(ds, "samples"):
        return None, ("the dataset decodes no image files through a `loader` attribute (torchvision's ImageFolder "
                      "and DatasetFolder do): the tool cannot swap its decoder")
    if loader not in (folder.default_loader, folder.pil_loader):
        return None, f"its loader ({getattr(loader, '__name__', type(loader).__name__)}) is not torchvision's PIL loader"
    return name + ".loader", ""


def adapted(call: Any) -> tuple[Optional[Callable], str]:
    """The recorded transform `call` as it must be for a tensor image (see the module's
    docstring), or None, why not."""
    steps, why = tail.steps_of(call)
    if steps is None:
        return None, why
    fns = []
    for s in steps:
        name = tail.torchvision_name(s.fn)
        if name in tail.TO_TENSOR:
            continue
        if name == "ToPILImage":
            return None, f"{call.name} converts to a PIL image ({s.where}), which a tensor decode would undo"
        fns.append(tail.Scale() if name == "ToTensor" else s.fn)
    return tail.rebuilt(call.fn, fns), ""


@dataclasses.dataclass(frozen=True)
class Found:
    """Where a dataset's PIL decode can be swapped: the loader's name ("dataset.loader"),
    the recorded transform call that takes the decoded image, that transform adapted for a
    tensor (`adapted`), and the adapted transforms as the report names them."""

    where: str
    call: Any
    fn: Callable
    labels: tuple


def found(caches: Any, device: Optional[str] = None) -> tuple[Optional[Found], Optional[Fix]]:
    """(the Found, None), or (None, the unavailable Fix with the reason; `device` its
    Fix.device): what build and decode_device.build both start from."""
    name, why = site(caches.dataset) if caches is not None else (None, "the caches could not be filled")
    if name is None:
        return None, Fix(kind=DECODE, status="unavailable", reason=why, device=device)
    calls = caches.raw_calls[0] if caches.raw_calls else []
    call = next((c for c in calls if len(c.args) == 1 and tree._is_pil(c.args[0])), None)
    if call is None:
        return None, Fix(kind=DECODE, where=name, status="unavailable", device=device,
                         reason="no transform of the dataset takes its decoded PIL image")
    fn, why = adapted(call)
    if fn is None:
        return None, Fix(kind=DECODE, where=name, status="unavailable", reason=why, device=device)
    compose = tail.inner(fn)
    labels = tuple(tail.label(t) for t in (compose.transforms if tail.breakdown.is_compose(compose) else [fn]))
    return Found(name, call, fn, labels), None


def build(caches: Any) -> tuple[Optional[tuple], Fix]:
    """(the decoded dataset copy and its transform's name, or None; the Fix as built,
    not checked yet: unavailable with the reason where it cannot be)."""
    f, refused = found(caches)
    if f is None:
        return None, refused
    call = f.call
    dataset = replaced(replaced(caches.dataset, f.where, TorchvisionDecode()), call.name, f.fn)
    preset = tail.inner(call.fn) is not call.fn
    code = f"{f.where} = {TorchvisionDecode()!r}\n{call.name}{'.transforms' if preset else ''} = {tail._listing(f.fn)}"
    return (dataset, call.name), Fix(kind=DECODE, where=f.where, moved=("PIL decode",), kept=f.labels,
                                     path=tail.path_text(call.placements[0][1]) if call.placements else None,
                                     code=code)


def check(fix: Fix, user: Any, decoded: Any, collate: Callable, move: Callable) -> Fix:
    """The first CHECK_SAMPLES samples (in the dataset's order) built by the user's
    dataset copy and by the decoded one, under the same random draws, collated, moved and
    compared (see the module's docstring): `fix` with what was compared."""
    n = min(CHECK_SAMPLES, len(user))
    return compare(fix, _batch(user, n, collate, move), _batch(decoded, n, collate, move), n)


def compare(fix: Fix, theirs: Any, mine: Any, n: int) -> Fix:
    """`fix` with how batch `mine` differs from `theirs` (the user's, of `n` samples):
    equal structure, shapes and dtypes, and a mean difference within MEAN_LEVELS grey
    levels (decode_device's check too)."""
    diff = tail.differences([theirs], [mine], values=False)
    level = _level(theirs)
    tolerance = MEAN_LEVELS * level
    matches = diff.mismatch is None and diff.mean <= tolerance
    mismatch = diff.mismatch or (None if matches else
                                 f"values differ by {diff.mean / level:.2f} grey levels on average (tolerance "
                                 f"{MEAN_LEVELS:g})")
    return dataclasses.replace(fix, batches=1, samples=n, matches=matches, max_difference=diff.max,
                    mean_difference=diff.mean, tolerance=tolerance, level=level,
                               mismatch=mismatch)


def _batch(dataset: Any, n: int, collate: Callable, move: Callable) -> Any:
    snap = state.capture(None, None)
    torch.manual_seed(tail.SEED)
    try:
        return move(collate([dataset[i] for i in range(n)]))
    finally:
        state.restore(snap, None, None)


def _level(batch: Any) -> float:
    """One grey level in the batch's units: its floating tensors' range over 255 (1 for
    integer images)."""
    ranges = [float(x.max() - x.min()) for _, x in tree.leaves(batch)
              if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() and x.dim() >= 3]
    return max(ranges) / 255 if ranges and max(ranges) > 0 else 1.0
