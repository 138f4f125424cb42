"""Decode by torchvision on the device: where the samples are JPEG files decoded with PIL
(decode.site), a copy whose workers only read each file's bytes; the batch's files are
decoded together on the device inside the step (`torchvision.io.decode_jpeg(files,
device=...)`: nvJPEG's batched decode on CUDA), then the user's transforms, adapted for a
tensor as decode.adapted adapts them, run on each image there, one after the other, and
the images stacked:

    worker:  path -> read_file(path)                 (the file's bytes: no decode, no transform)
    collate: the bytes kept as a list (Encoded), the rest of each sample collated as before
    step:    decode_jpeg(files, device) -> each image transformed -> stacked at the image's place

The transforms draw from the training process's generator instead of a worker's, one
image after the other as a worker does: the same augmentation, drawn elsewhere.

Built on CUDA only (advise/fixes.py): on the CPU this would move the decode from the
workers into the training process. Only JPEG files (nvJPEG's), only the default collate
(the collate must not see the bytes). Checked as decode is (decode.compare: the first
decode.CHECK_SAMPLES samples built both ways under the same draws, equal shapes, a mean
difference within decode.MEAN_LEVELS grey levels: nvJPEG and libjpeg-turbo may round
differently). Its mechanism is tested on the CPU (device "cpu"); it has not yet been
run on CUDA.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
from torch.utils.data import Subset

from ..core import tree
from ..core.fixes import DECODE, Fix
from ..pipeline.split import replaced
from . import decode, tail

JPEG_SUFFIXES = (".jpg", ".jpeg")


class Encoded:
    """A batch's image files as their bytes (uint8 tensors, one a file): not a container
    the transfer walks, nor one with a `.to()`, so the bytes stay on the host, where
    decode_jpeg takes them."""

    def __init__(self, files: list) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)


class ReadBytes:
    """The dataset's loader in the workers: the file's bytes, not decoded, in a tensor of
    their own (torchvision's read_file gives one whose storage a worker cannot hand over:
    torch's sharing of it fails with EBADF)."""

    def __call__(self, path: Any) -> torch.Tensor:
        with open(os.fspath(path), "rb") as fh:
            return torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8)

    def __repr__(self) -> str:
        return "lambda path: torch.frombuffer(bytearray(open(path, 'rb').read()), dtype=torch.uint8)"


class Collate:
    """The user's collate of the samples with the image at `path` set aside, and the
    images' bytes put there as one Encoded."""

    def __init__(self, collate: Callable, path: tuple) -> None:
        self.collate, self.path = collate, path

    def __call__(self, samples: list) -> Any:
        files = [tree.get(s, self.path) for s in samples]
        rest = [tree.replace(s, self.path, 0) for s in samples]
        return tree.replace(self.collate(rest), self.path, Encoded(files))


class DecodeOnDevice:
    """The step's side: the files at `path` decoded together on `device`, each image
    transformed by `fn` (the user's transforms adapted), the images stacked there."""

    def __init__(self, path: tuple, fn: Callable, device: Any) -> None:
        self.path, self.fn, self.device = path, fn, torch.device(device)

    def __call__(self, batch: Any) -> Any:
        from torchvision.io import ImageReadMode, decode_jpeg

        files = tree.get(batch, self.path).files
        images = decode_jpeg(files, mode=ImageReadMode.RGB, device=self.device)
        return tree.replace(batch, self.path, torch.stack([self.fn(x) for x in images]))


def build(caches: Any, collate: Callable, device: Any) -> tuple[Optional[tuple], Fix]:
    """((the dataset copy, its Collate, its DecodeOnDevice), or None; the Fix as built,
    not checked yet: unavailable with the reason where it cannot be)."""
    f, refused = decode.found(caches, device=str(device))
    if f is None:
        return None, refused
    call, where = f.call, f.where
    why = _why_not(caches.dataset, collate, call)
    if why:
        return None, Fix(kind=DECODE, where=where, status="unavailable", reason=why, device=str(device))
    path = call.placements[0][1]
    dataset = replaced(replaced(caches.dataset, where, ReadBytes()), call.name, tail.Identity())
    code = (f"{where} = {ReadBytes()!r}; {call.name} = None; collate_fn keeps each batch's files as a list; in the "
            f"step: images = decode_jpeg(files, mode=ImageReadMode.RGB, device='{device}'); "
            f"batch{tail.path_text(path)} = torch.stack([transform(x) for x in images]), transform = "
            f"{tail._listing(f.fn)}")
    return (dataset, Collate(collate, path), DecodeOnDevice(path, f.fn, device)), Fix(
        kind=DECODE, where=where, moved=("PIL decode",) + f.labels, path=tail.path_text(path), code=code,
        device=str(device))


def _why_not(dataset: Any, collate: Callable, call: Any) -> Optional[str]:
    from torch.utils.data import default_collate

    if len(call.placements) != 1:
        return f"the output of {call.name} is not one part of the sample"
    if getattr(collate, "__wrapped__", collate) is not default_collate:
        return "the loader's collate_fn is not the default one: it would be handed the files' bytes"
    ds = dataset
    while isinstance(ds, Subset):
        ds = ds.dataset
    files = [s[0] for s in getattr(ds, "samples", ())]
    other = [f for f in files if not os.fspath(f).lower().endswith(JPEG_SUFFIXES)]
    if not files or other:
        return (f"{len(other)} of the dataset's {len(files)} files are not JPEG files, which nvJPEG alone decodes"
                if files else "the dataset lists no files")
    return None


def check(fix: Fix, user: Any, made: tuple, collate: Callable, move: Callable) -> Fix:
    """The first samples built by the user's dataset copy and by the device path (the
    copy's bytes, collated, moved, decoded and transformed on the device), under the same
    random draws, compared (decode.compare): `fix` with what was compared."""
    dataset, mine_collate, after = made
    n = min(decode.CHECK_SAMPLES, len(user))
    return decode.compare(fix, decode._batch(user, n, collate, move),
                          decode._batch(dataset, n, mine_collate, lambda batch: after(move(batch))), n)
