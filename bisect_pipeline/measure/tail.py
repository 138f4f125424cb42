"""The device tail: the end of the dataset's transforms that gives the same result on a
batch as on each sample, taken out of the workers and run batched on the device inside
the step. The workers then hand over uint8, and the transfer carries uint8: a quarter
of float32's bytes.

    yours   in the workers:  RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize
    moved   in the workers:  RandomResizedCrop, RandomHorizontalFlip, PILToTensor
            in the step:     ToTensor's scaling (to float, / 255), Normalize   on the batch

What is exact on a batch (EXACT, torchvision v1 and v2 by class name): the dtype
conversions with their scaling (ConvertImageDtype, ToDtype), Normalize, ToPureTensor,
and ToTensor, split into PILToTensor (left in the workers) and its scaling (moved): each
computes every value of a sample from that value alone, the same arithmetic on a batch.
The tail is the longest run of them at the end of the Compose; anything else before it
stays in the workers.

The random candidate (`device_augment`) moves more: the tensor transforms before the
tail that take a batch (BATCHABLE: flips, colour, blur, crops, ...), as torchvision's
transforms do on a batched tensor: ONE RANDOM DRAW PER BATCH instead of per sample (every
image of a batch flipped, or none). That changes the augmentation; the report says so and
the user decides. Its images are converted to tensors before it (PILToTensor in the
workers: torchvision's transforms compute the same on a tensor up to rounding), and it
needs images of one size at its start (they must collate).

Before any timing (`check`) a few cached batches are built both ways from the `raw`
point's recorded inputs, under the same random draws (the user's RNG states restored
after): the user's samples collated and moved, and the moved pipeline's collated, moved
and run through the tail. The device tail must match them value for value (up to a few
units in the last place: TOLERANCE_ULPS), the random candidate in structure, shapes and
dtypes; the largest difference is reported either way, and a fix that does not match is
not timed.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional

import torch

from ..core import tree
from ..core.fixes import DEVICE_AUGMENT, DEVICE_TAIL, Fix
from ..pipeline import recording, state
from . import breakdown
from .reorder import _known as torchvision_name

# Exact on a batch (see the module's docstring); ToTensor is split.
EXACT = frozenset({"Normalize", "ConvertImageDtype", "ToDtype", "ToPureTensor", "ToTensor"})
# Conversions of an image to a tensor that the moved pipeline does in the workers (hoisted
# before the random transforms it moves).
TO_TENSOR = frozenset({"PILToTensor", "ToImage"})
# Tensor transforms that take a batch, with one random draw for all of it.
BATCHABLE = frozenset({
    "RandomHorizontalFlip", "RandomVerticalFlip", "ColorJitter", "GaussianBlur", "GaussianNoise", "RandomGrayscale",
    "Grayscale", "RandomInvert", "RandomPosterize", "RandomSolarize", "RandomAdjustSharpness", "RandomAutocontrast",
    "RandomEqualize", "RandomPhotometricDistort", "RandomErasing", "RandomResizedCrop", "RandomCrop", "CenterCrop",
    "Resize", "RandomRotation", "RandomAffine", "RandomPerspective", "AutoAugment", "RandAugment",
    "TrivialAugmentWide", "AugMix"})
# Batches built both ways by the check of the device tail (each a batch of the cache's
# grouping); the random candidate's, one.
CHECK_BATCHES = 2
# Where the random candidate may start, longest first: a start whose images differ in
# size within a batch cannot collate, and the next is tried.
MAX_RANDOM_CUTS = 3
# The device tail matches where no value differs by more than this many units in the
# last place of the output's dtype at the output's magnitude (0 on the CPU, where the
# arithmetic is the same; a GPU's division is correctly rounded too).
TOLERANCE_ULPS = 8
SEED = 20260101


def _v2(fn: Any) -> bool:
    return (type(fn).__module__ or "").startswith("torchvision.transforms.v2")


# --------------------------------------------------------------------------------------
# What moves
# --------------------------------------------------------------------------------------


class Scale:
    """ToTensor's scaling of a uint8 image, on a batch: to the default float dtype, / 255
    (ToTensor's own arithmetic, and ConvertImageDtype's)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.get_default_dtype()).div(255)

    def __repr__(self) -> str:
        return "ConvertImageDtype(torch.float32)"


class Identity:
    """The transforms left in the workers where none are left (picklable)."""

    def __call__(self, x: Any) -> Any:
        return x

    def __repr__(self) -> str:
        return "Identity()"


class DeviceTail:
    """The moved transforms, run on the batch's part at `path` after it is on the device
    (the step calls it first)."""

    def __init__(self, path: tuple, ops: list) -> None:
        self.path = path
        self.ops = ops

    def __call__(self, batch: Any) -> Any:
        x = tree.get(batch, self.path)
        for op in self.ops:
            x = op(x)
        return tree.replace(batch, self.path, x)


@dataclasses.dataclass
class Split:
    """One fix of the dataset's transforms (see the module's docstring): the recorded
    call it changes, the transforms left in the workers (`head`, a Compose of the user's
    kind) and the tail run on the batch."""

    kind: str
    call: str  # the recorded call's name: "dataset.transform"
    path: tuple  # where its output lands in the sample, and in the batch
    head: Callable
    tail: DeviceTail
    moved: tuple
    kept: tuple
    random: tuple
    preset: bool = False  # the user's transform is an object keeping a Compose (`inner`)

    def calls(self, calls: list) -> list:
        """A sample's recorded calls with this one's transforms the head."""
        return [dataclasses.replace(c, fn=self.head, copy_input=True) if c.name == self.call else c for c in calls]

    def fix(self, **kw: Any) -> Fix:
        return Fix(kind=self.kind, where=self.call, moved=self.moved, kept=self.kept, random=self.random,
                   path=path_text(self.path), **kw)

    def code(self) -> str:
        """The change as code: the transforms left, and the tail in the step."""
        part = f"batch{path_text(self.path)}"
        ops = ", ".join(code_repr(op) for op in self.tail.ops)
        head = self.head.transforms if self.preset else self.head
        left = ("lambda img: img" if self.preset else "None") if isinstance(head, Identity) else _listing(head)
        return (f"{self.call}{'.transforms' if self.preset else ''} = {left}  # in the workers: uint8 tensors\n"
                f"tail = Compose([{ops}])  # in the step, on the device:\n"
                f"{part} = tail({part}.to(device, non_blocking=True))")


def _listing(head: Callable) -> str:
    """The transforms left in the workers as code: a Compose as `Compose([...])` on one
    line (a preset object: its Compose), the user's own transforms by name alone
    (`RandomResizedCrop(...)`: they stay as they are), those the fix adds in full."""
    transforms = getattr(head, "transforms", None)
    if transforms is None:
        return _kept(head)
    if not breakdown.is_compose(head):
        return _listing(transforms)
    return f"{type(head).__name__}([" + ", ".join(_kept(t) for t in transforms) + "])"


def _kept(fn: Any) -> str:
    code, name = code_repr(fn), type(fn).__name__
    return code if isinstance(fn, Scale) or code == f"{name}()" else f"{name}(...)"


def code_repr(fn: Any) -> str:
    """A transform as code: its repr, but v2's ToDtype with its dtype (its repr leaves it out)."""
    if torchvision_name(fn) == "ToDtype" and isinstance(getattr(fn, "dtype", None), torch.dtype):
        return f"ToDtype({fn.dtype}, scale={fn.scale})"
    return repr(fn)


def path_text(path: tuple) -> str:
    return "".join(f"[{k!r}]" for k in path)


def steps_of(call: recording.Call) -> tuple[Optional[list], str]:
    """(the steps of a recorded call in the order they run, nested Composes flattened:
    breakdown._Part; or None, why not)."""
    if call.kwargs or len(call.args) != 1:
        return None, f"{call.name} is called with {len(call.args)} arguments or keywords, not one image"
    placements = call.placements
    if len(placements) != 1 or placements[0][0] != ():
        return None, f"the output of {call.name} is not one part of the sample"
    compose = inner(call.fn)
    if compose is None:
        return None, f"{call.name} is not a torchvision Compose or transform"
    if not breakdown.is_compose(compose):
        return [breakdown._Part(torchvision_name(compose), call.name, compose)], ""
    steps, _ = breakdown.parts_of(dataclasses.replace(call, fn=compose))
    if len(steps) == 1 and steps[0].note:
        return None, f"{call.name}: {steps[0].note}"
    return steps, ""


def inner(fn: Any) -> Any:
    """The torchvision transform a recorded call runs: `fn` itself, or the Compose a
    preset object keeps as `.transforms` and calls (torchvision's references'
    ClassificationPresetTrain); None where neither (the check would show a preset that
    does more than call it)."""
    if torchvision_name(fn) is not None:
        return fn
    kept = getattr(fn, "transforms", None)
    return kept if kept is not None and breakdown.is_compose(kept) else None


def rebuilt(fn: Any, fns: list) -> Any:
    """`fn` (the user's transform: a Compose, one transform, or a preset keeping a
    Compose: `inner`) with `fns` in place of its transforms: a copy, the user's unchanged."""
    compose = inner(fn)
    if not fns:
        head = Identity()
    elif breakdown.is_compose(compose):
        head = type(compose)(fns)
    elif len(fns) == 1:
        head = fns[0]
    else:  # one transform, and a conversion added before it
        from torchvision.transforms import Compose
        head = Compose(fns)
    if compose is fn:
        return head
    out = copy.copy(fn)
    out.transforms = head
    return out


def cuts(steps: list) -> tuple[Optional[int], list]:
    """(where the exact tail starts, or None without one; where the random candidates
    may start, longest first: at each transform of BATCHABLE before the tail, up to
    MAX_RANDOM_CUTS). A container (RandomApply, ...) or a transform not in the tables
    stops both."""
    exact = len(steps)
    while exact > 0 and steps[exact - 1].kind is None and torchvision_name(steps[exact - 1].fn) in EXACT:
        exact -= 1
    start = exact
    while start > 0 and steps[start - 1].kind is None and torchvision_name(steps[start - 1].fn) in BATCHABLE | TO_TENSOR:
        start -= 1
    randoms = [j for j in range(start, exact) if torchvision_name(steps[j].fn) in BATCHABLE]
    return (exact if exact < len(steps) else None), randoms[:MAX_RANDOM_CUTS]


def build(kind: str, call: recording.Call, steps: list, cut: int) -> tuple[Optional[Split], str]:
    """The Split that moves steps[cut:] of `call` (its head checked on the call's own
    recorded input: a PIL image there gets PILToTensor in the workers); or None, why not."""
    head_fns = [s.fn for s in steps[:cut]]
    snap = state.capture(None, None)  # the head's random draws are not the user's
    try:
        x = tree.clone(call.args[0])
        for fn in head_fns:
            x = fn(x)
    finally:
        state.restore(snap, None, None)
    v2 = _v2(inner(call.fn))
    if tree._is_pil(x):
        from torchvision.transforms import PILToTensor
        from torchvision.transforms.v2 import PILToTensor as PILToTensorV2
        head_fns.append(PILToTensorV2() if v2 else PILToTensor())
    elif not isinstance(x, torch.Tensor):
        return None, f"the transforms left in the workers would return a {type(x).__name__}, not an image or tensor"
    ops, moved, random = [], [], []
    for s in steps[cut:]:
        name = torchvision_name(s.fn)
        if name in TO_TENSOR:
            continue  # done in the workers
        moved.append("ToTensor's scaling" if name == "ToTensor" else name)
        ops.append(Scale() if name == "ToTensor" else s.fn)
        if name in BATCHABLE and _draws(name):
            random.append(name)
    head = rebuilt(call.fn, head_fns)
    kept = tuple(label(fn) for fn in head_fns)
    path = call.placements[0][1]
    return Split(kind, call.name, path, head, DeviceTail(path, ops), tuple(moved), kept, tuple(random),
                 preset=inner(call.fn) is not call.fn), ""


def label(fn: Any) -> str:
    """A transform as the report names it: its class ("ToTensor's scaling" for Scale)."""
    return "ToTensor's scaling" if isinstance(fn, Scale) else torchvision_name(fn) or type(fn).__name__


def _draws(name: str) -> bool:
    return name.startswith("Random") or name in ("ColorJitter", "GaussianBlur", "GaussianNoise", "AutoAugment",
                                                 "RandAugment", "TrivialAugmentWide", "AugMix")


def splits(calls: list) -> tuple[list, str]:
    """The fixes of one sample's recorded calls (the cache's first): the device tail, and
    the random candidate where one would move more; ([], why) without any."""
    why = "no transform was recorded"
    for call in calls:
        steps, why = steps_of(call)
        if steps is None:
            continue
        exact, randoms = cuts(steps)
        out = []
        for kind, cut in ([(DEVICE_TAIL, exact)] if exact is not None else []) + [(DEVICE_AUGMENT, c) for c in randoms]:
            try:
                split, why = build(kind, call, steps, cut)
            except Exception as exc:  # the head cannot run as built: no fix here
                split, why = None, f"{type(exc).__name__}: {exc}"[:300]
            if split is not None:
                out.append(split)
        if out:
            return out, ""
        why = why or (f"{call.name} ends with {steps[-1].name}: nothing at its end runs the same on a batch "
                      "(dtype conversion, Normalize)")
    return [], why


# --------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------


def checked(caches: Any, collate: Callable, move: Callable) -> tuple[list, dict]:
    """Every fix of the dataset's transforms (`splits` of the cache's first sample),
    checked: (one Fix per kind, the usable Split of each kind). Of the random candidate's
    starts, the longest that passes; where none does, the first's Fix says why."""
    if caches is None or not caches.raw_calls:
        why = "the caches could not be filled" if caches is None else caches.raw_reason or "no transform was split"
        return [Fix(kind=DEVICE_TAIL, status="unavailable", reason=f"the transforms were not split: {why}")], {}
    found, why = splits(caches.raw_calls[0])
    if not found:
        return [Fix(kind=DEVICE_TAIL, status="unavailable", reason=why)], {}
    fixes: dict = {}
    usable: dict = {}
    for split in found:
        if split.kind in usable:
            continue
        try:
            fix = check(split, caches, collate, move)
        except Exception as exc:  # the moved pipeline cannot build a batch: not offered, and why
            fix = split.fix(status="failed", code=split.code(),
                            reason=f"the moved pipeline raised {type(exc).__name__}: {exc}"[:300])
        if fix.usable:
            usable[split.kind] = split
        if fix.usable or split.kind not in fixes:
            fixes[split.kind] = fix
    return list(fixes.values()), usable


def check(split: Split, caches: Any, collate: Callable, move: Callable) -> Fix:
    """Build CHECK_BATCHES cached batches both ways under the same random draws and
    compare them (see the module's docstring): the Fix, `matches` set. The random
    candidate's values differ by design: its largest difference is not reported."""
    exact = split.kind == DEVICE_TAIL
    groups = caches.groups[:CHECK_BATCHES if exact else 1]  # (shapes and dtypes: one batch says them)
    theirs, before = _batches(groups, caches, collate, move, path=split.path)
    mine, after = _batches(groups, caches, collate, move, path=split.path, calls_of=split.calls, tail=split.tail)
    n = sum(len(g) for g in groups)
    diff = differences(theirs, mine, values=exact)
    kw = dict(batches=len(groups), samples=n, before=before, after=after, code=split.code(), mismatch=diff.mismatch)
    if exact:
        return split.fix(matches=diff.mismatch is None, max_difference=diff.max, mean_difference=diff.mean,
                         tolerance=diff.tolerance, **kw)
    return split.fix(matches=diff.mismatch is None, **kw)


def _batches(groups: list, caches: Any, collate: Callable, move: Callable, *, path: tuple,
             calls_of: Callable = lambda calls: calls, tail: Callable = lambda batch: batch) -> tuple[list, dict]:
    """The batches of `groups` replayed from the cache with `calls_of(calls)`, collated,
    moved and through `tail`, under SEED's draws (the RNG states restored after); and
    what the workers hand over at `path` (dtype, bytes per batch)."""
    snap = state.capture(None, None)
    torch.manual_seed(SEED)
    try:
        out, payload = [], {}
        for g in groups:
            batch = collate([recording.replay_sample(caches.samples[i], calls_of(caches.raw_calls[i])) for i in g])
            part = tree.get(batch, path)
            if isinstance(part, torch.Tensor):
                payload = {"dtype": str(part.dtype).replace("torch.", ""), "bytes": part.numel() * part.element_size(),
                           "shape": list(part.shape)}
            out.append(tail(move(batch)))
        return out, payload
    finally:
        state.restore(snap, None, None)


@dataclasses.dataclass
class Differences:
    max: float = 0.0
    mean: float = 0.0
    tolerance: float = 0.0
    mismatch: Optional[str] = None


def differences(a: list, b: list, values: bool = True) -> Differences:
    """How batches `b` differ from `a`: structure, shapes and dtypes (`mismatch`, the
    first difference), and the largest and mean absolute difference of their tensors'
    values with the tolerance of TOLERANCE_ULPS at their magnitude."""
    out = Differences()
    total, count = 0.0, 0
    for x, y in zip(a, b):
        what = tree.same_structure(x, y)
        if what is not None:
            out.mismatch = what
            return out
        for (p, u), (_, v) in zip(tree.leaves(x), tree.leaves(y)):
            if not isinstance(u, torch.Tensor):
                continue
            if u.shape != v.shape:
                out.mismatch = f"{path_text(p)} shape {list(u.shape)} vs {list(v.shape)}"
                return out
            d = (u.double() - v.to(u.device).double()).abs()
            if d.numel():
                out.max = max(out.max, float(d.max()))
                total, count = total + float(d.sum()), count + d.numel()
            if u.is_floating_point():
                ulp = torch.finfo(u.dtype).eps * max(1.0, float(u.abs().max()) if u.numel() else 1.0)
                out.tolerance = max(out.tolerance, TOLERANCE_ULPS * ulp)
    out.mean = total / count if count else 0.0
    if values and out.max > out.tolerance and out.mismatch is None:
        out.mismatch = f"values differ by up to {out.max:.3g} (tolerance {out.tolerance:.3g})"
    return out
