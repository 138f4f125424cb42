"""Order of operations: a photometric transform that runs on more pixels than a later
crop or resize keeps (the seed slides' "blur then crop"), moved to just after that crop
and timed both ways on the same cached inputs (the `raw` point's), alternating. Only the
segment that changes is timed (from the first transform moved to the crop): what comes
before it feeds both orders the same input, what comes after gets the same type and size.

What may move, and past what (`MOVABLE`, `CROPS`): the reordered pipeline must show the
model what the original does, up to the transforms' own randomness. Only a transform of
the table moves; it moves with the photometric transforms next to it as one block in
their own order (two photometric transforms need not commute: Normalize then ColorJitter
is not ColorJitter then Normalize), crossing only flips (which commute with a per-pixel
map, a symmetric kernel and an image statistic) and the crops or resizes it moves past.
Anything else stops it: a geometric transform (rotation, affine, perspective, elastic:
they move pixels and fill borders, and never commute with a crop), a type conversion
(ToTensor, ToDtype: the transform would see another type), a transform the tool does
not know, a container (RandomApply, RandomChoice, RandomOrder) or a row breakdown.py
notes. The block and the crop must see the same type of input (PIL image or tensor,
mode or dtype and channels) after the move as before, checked by running both orders
once, and the crop must keep fewer pixels without padding any.

Never moved: RandomErasing (the rectangle's area is a share of the image it gets: after
a crop it erases a share of the crop, another distribution), LinearTransformation (a
map of the whole flattened image), anything geometric.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable, Optional

from ..core import tree
from ..core.results import Reorder
from ..core.stats import noise_threshold, small_sample_factor
from . import breakdown

# What each movable transform computes, which says past what it may move:
#   pointwise  - the same map at every pixel (Normalize, grayscale, invert, posterize,
#                solarize; ColorJitter without contrast): equal after a crop; after a
#                resize equal up to rounding and, for a non-linear map (posterize,
#                solarize, hue), where the resize blends pixels across a threshold.
#   statistics - a per-pixel map with a statistic of the whole image (ColorJitter's
#                contrast blends with the image's mean, autocontrast its min and max,
#                equalize its histogram): after the move the statistic is the crop's, the
#                order of the usual recipes (RandomResizedCrop, then ColorJitter).
#   local      - a neighbourhood kernel or per-pixel noise, sized in pixels (blur,
#                sharpness, Gaussian noise): equal after a crop up to a border of half
#                the kernel; after a resize it would act at another scale (a blur of
#                sigma 2 before halving the image is a blur of sigma 1 after it), so it
#                moves past crops only.
MOVABLE = {"Normalize": "pointwise", "Grayscale": "pointwise", "RandomGrayscale": "pointwise",
           "RandomInvert": "pointwise", "RandomPosterize": "pointwise", "RandomSolarize": "pointwise",
           "RGB": "pointwise", "ColorJitter": "pointwise",
           "RandomAutocontrast": "statistics", "RandomEqualize": "statistics",
           "RandomPhotometricDistort": "statistics",
           "GaussianBlur": "local", "RandomAdjustSharpness": "local", "GaussianNoise": "local"}
# Transforms a block crosses unchanged: a flip commutes with all of the above.
FLIPS = ("RandomHorizontalFlip", "RandomVerticalFlip")
# What a block may move past: "crop" keeps pixel values (RandomCrop without padding),
# "resize" interpolates them.
CROPS = {"CenterCrop": "crop", "RandomCrop": "crop", "Resize": "resize", "RandomResizedCrop": "resize"}
PASSES = {"pointwise": ("crop", "resize"), "statistics": ("crop", "resize"), "local": ("crop",)}
MAX_PAIRS = 48  # timed pairs (original, reordered) at most
# ... and at least, whatever the budget: the noise of the mean of 2 differences is
# unknown to a factor of 6 (stats.small_sample_factor(2)), of 3 to a factor of 3.
MIN_PAIRS = 3


@dataclasses.dataclass
class Plan:
    """A reorder of one recorded call's transforms: `moved` (indices into `parts`, in
    their order) go to just after `after` (an index); `parts` from breakdown.parts_of.
    Only the segment from the first moved transform to `after` changes: the transforms
    before it feed both orders the same input, those after get the same type and size."""

    name: str  # the recorded call's name: dataset.transform
    parts: list
    moved: list
    after: int
    pixels_before: Optional[int] = None
    pixels_after: Optional[int] = None

    @property
    def order(self) -> list:
        """The indices of the parts in the new order."""
        rest = [i for i in range(len(self.parts)) if i not in self.moved]
        at = rest.index(self.after) + 1
        return rest[:at] + self.moved + rest[at:]

    def prefix(self) -> list:
        """The transforms before the segment (run once per input, not timed)."""
        return [p.fn for p in self.parts[:self.moved[0]]]

    def segment(self, reordered: bool) -> list:
        """The transforms from the first moved one to `after`, as they are or reordered."""
        span = slice(self.moved[0], self.after + 1)
        return [self.parts[i].fn for i in (self.order[span] if reordered else range(len(self.parts))[span])]


def _known(fn: Any) -> Optional[str]:
    """The class name of a torchvision transform (v1 or v2), else None."""
    cls = type(fn)
    return cls.__name__ if (cls.__module__ or "").startswith("torchvision.transforms") else None


def movable(fn: Any) -> Optional[str]:
    """pointwise, statistics or local (MOVABLE), with ColorJitter's contrast counted; None
    when the transform never moves."""
    name = _known(fn)
    kind = MOVABLE.get(name) if name else None
    if name == "ColorJitter" and getattr(fn, "contrast", None) is not None:
        return "statistics"
    return kind


def crop_kind(fn: Any) -> Optional[str]:
    """crop or resize (CROPS); None for anything else, and for a RandomCrop that pads."""
    name = _known(fn)
    if name == "RandomCrop" and (getattr(fn, "padding", None) or getattr(fn, "pad_if_needed", False)):
        return None
    return CROPS.get(name) if name else None


def _block(parts: list, g: int) -> list:
    """The movable transforms before the crop at `g` that may pass it, crossing flips:
    indices in their order; stops at anything else."""
    kind, block = crop_kind(parts[g].fn), []
    for j in range(g - 1, -1, -1):
        p = parts[j]
        if p.note is None and _known(p.fn) in FLIPS:
            continue
        m = movable(p.fn) if p.note is None else None
        if m is None or kind not in PASSES[m]:
            break
        block.insert(0, j)
    return block


def _further(parts: list, block: list, g: int) -> int:
    """The last crop the block may go on past after `g`: across flips only."""
    last = g
    for j in range(g + 1, len(parts)):
        p = parts[j]
        if p.note is None and _known(p.fn) in FLIPS:
            continue
        kind = crop_kind(p.fn) if p.note is None else None
        if kind is None or not all(kind in PASSES[movable(parts[i].fn)] for i in block):
            break
        last = j
    return last


def plans(parts: list) -> list:
    """Each reorder the table allows, by the transforms' classes alone: (block, first
    crop, last crop) for every crop with a movable block before it."""
    out = []
    for g, p in enumerate(parts):
        if p.note is not None or crop_kind(p.fn) is None:
            continue
        block = _block(parts, g)
        if block and not any(block == b for b, _, _ in out):
            out.append((block, g, _further(parts, block, g)))
    return out


def possible(calls_per_sample: list) -> bool:
    """Whether a sample's transforms hold a reorder the table allows (no transform run)."""
    calls = calls_per_sample[0] if calls_per_sample else []
    return any(plans(_parts(call) or []) for call in calls)


def _parts(call: Any) -> Optional[list]:
    """The parts of a call of one input to a Compose, else None (not reordered)."""
    if len(call.args) != 1 or call.kwargs or not breakdown.is_compose(call.fn):
        return None
    parts, unpack = breakdown.parts_of(call)
    return None if unpack or any(p.fn is call.fn for p in parts) else parts


def pixels(x: Any) -> Optional[tuple]:
    """(width, height) of a PIL image or an image tensor (..., H, W), else None."""
    if tree._is_pil(x):
        return tuple(x.size)
    shape = getattr(x, "shape", None)
    if shape is not None and getattr(x, "dtype", None) is not None and len(shape) >= 2 and not _is_numpy(x):
        return int(shape[-1]), int(shape[-2])
    return None


def _is_numpy(x: Any) -> bool:
    return (type(x).__module__ or "").startswith("numpy")


def _family(x: Any) -> tuple:
    """What a crop needs its input to stay: a PIL image (any mode), or a tensor type and dtype."""
    return ("PIL",) if tree._is_pil(x) else _kind(x)[:2]


def _kind(x: Any) -> tuple:
    """What a transform is fed, without its size: the type and mode, or dtype and channels."""
    if tree._is_pil(x):
        return "PIL", x.mode
    shape = getattr(x, "shape", None)
    return type(x).__name__, str(getattr(x, "dtype", None)), int(shape[-3]) if shape is not None and len(shape) >= 3 \
        else None


def _trace(fns: list, x: Any) -> list:
    """Run `fns` in order; what each was fed, and last what the final one returned."""
    seen = []
    for f in fns:
        seen.append(x)
        x = f(x)
    return seen + [x]


def settle(name: str, parts: list, x: Any) -> Optional[Plan]:
    """The first reorder the table allows that holds on input `x` (past the furthest crop
    it may, else one fewer): the crops it passes keep fewer pixels, none more on either
    side, and both orders of the segment feed each moved transform the same type and end
    in the same type and size. None when none holds."""
    tries = [(block, first, end) for block, first, last in plans(parts)  # the furthest crop first
             for end in range(last, first - 1, -1) if crop_kind(parts[end].fn)]
    for block, first, last in tries:
        plan = Plan(name, parts, block, last)
        fed = _run(plan.prefix(), tree.clone(x))
        seen = _trace(plan.segment(False), tree.clone(fed))
        at = {i: k for k, i in enumerate(range(block[0], last + 1))}  # part -> its place in `seen`
        sizes = [(pixels(seen[at[g]]), pixels(seen[at[g] + 1])) for g in range(first, last + 1)
                 if crop_kind(parts[g].fn)]
        if any(a is None or b is None or b[0] > a[0] or b[1] > a[1] or a == b for a, b in sizes):
            continue
        try:
            again = _trace(plan.segment(True), tree.clone(fed))
        except Exception:  # a crop that cannot take what the block was fed: not a reorder
            continue
        where = {i: k for k, i in enumerate(plan.order[block[0]:last + 1])}
        if any(_kind(again[where[i]]) != _kind(seen[at[i]]) for i in block) or \
                _family(again[where[first]]) != _family(seen[at[first]]) or \
                (_kind(again[-1]), pixels(again[-1])) != (_kind(seen[-1]), pixels(seen[-1])):
            continue
        before, after = sizes[0][0], sizes[-1][1]
        plan.pixels_before, plan.pixels_after = before[0] * before[1], after[0] * after[1]
        return plan
    return None


def _run(fns: list, x: Any) -> Any:
    for f in fns:
        x = f(x)
    return x


def compare(plan: Plan, inputs: list, share: float, clock: Callable[[], float]) -> Reorder:
    """The segment both ways on the same inputs (each run through the transforms before
    it once, untimed), alternating which order runs first, until `share` seconds pass
    (MIN_PAIRS to MAX_PAIRS pairs): the saving is the mean of the per-input differences,
    real beyond the one noise rule (stats.noise_threshold of its standard error, with the
    small-sample factor; 5% of the original at least)."""
    end = clock() + share
    original, reordered = plan.segment(False), plan.segment(True)
    fed: dict = {}
    a, b = [], []
    for i in range(MAX_PAIRS):
        k = i % len(inputs)
        if k not in fed:
            fed[k] = _run(plan.prefix(), tree.clone(inputs[k]))
        sides = ((original, a), (reordered, b)) if i % 2 == 0 else ((reordered, b), (original, a))
        for fns, out in sides:
            x = tree.clone(fed[k])
            t = clock()
            _run(fns, x)
            out.append(clock() - t)
        if i + 1 >= MIN_PAIRS and clock() >= end:
            break
    return _record(plan, a, b)


def _record(plan: Plan, a: list, b: list) -> Reorder:
    n = len(a)
    ms, ms_new = statistics.fmean(a) * 1e3, statistics.fmean(b) * 1e3
    diffs = [(x - y) * 1e3 for x, y in zip(a, b)]
    saving = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(n) * small_sample_factor(n) if n >= 2 else math.inf
    tol = noise_threshold(se, ms)
    names, crop = [p.name for p in plan.parts], plan.parts[plan.after]
    return Reorder(transform=", ".join(names[i] for i in plan.moved),
                   where=", ".join(plan.parts[i].where for i in plan.moved), after=crop.name, after_where=crop.where,
                   order=tuple(names[i] for i in plan.order),
                   pixels_before=plan.pixels_before, pixels_after=plan.pixels_after, ms_per_sample=round(ms, 4),
                   reordered_ms_per_sample=round(ms_new, 4), saving_ms_per_sample=round(saving, 4),
                   tolerance_ms=round(tol, 4) if math.isfinite(tol) else None, samples=n,
                   real=bool(saving > tol))


def measure(calls_per_sample: list, share: float, clock: Callable[[], float]) -> tuple:
    """A Reorder for each recorded call (of the first sample) whose transforms hold one,
    timed on that call's cached inputs across the samples, within `share` seconds shared
    by the calls; () when none holds."""
    if not calls_per_sample:
        return ()
    end = clock() + share
    found = []
    for call in calls_per_sample[0]:
        parts = _parts(call)
        plan = settle(call.name, parts, call.args[0]) if parts else None
        if plan is not None:
            found.append(plan)
    out = []
    for k, plan in enumerate(found):
        inputs = [c.args[0] for calls in calls_per_sample for c in calls if c.name == plan.name and len(c.args) == 1]
        out.append(compare(plan, inputs, max(0.0, end - clock()) / (len(found) - k), clock))
    return tuple(out)
