"""The pipeline's own fixes, built for the advice's check: each a modified copy of the
user's pipeline and step (a `Variant`: the dataset copy the full pipeline runs over, and
what runs on each batch after its transfer), checked against the user's batches before
anything is timed (measure/tail.py: the device tail and the random candidate;
measure/decode.py: decode by torchvision). The usable ones are then timed as loader
settings are (verify.py: the full pipeline, the user's against the fix, in A B B A
visits), as the trial of the settings {"fix": kind}.

Built where the full pipeline is a DataLoader over a map-style dataset whose transforms
were split (the `raw` point's recorded calls), with no loader wrapper or loop stages
between the loader and the step. Nothing of the user's is changed: the dataset copies
are shallow copies of the cache's own (split.replaced), the tail runs on the batches of
the fix's own visits, and the checks restore the RNG states they draw from.

On CUDA the tail runs in the step's stream inside the timed window (after the batch's
transfer, before the step); the host-device syncs it adds are counted once on a cached
device batch, as the step's are (device_alone.count_syncs), and kept with its Fix; so
are those of decode on the device (decode_device), on a batch of the files.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from ..core.fixes import DECODE, DEVICE_TAIL, KINDS, Fix, Variant
from ..measure import decode, decode_device, tail
from ..pipeline import recording
from ..pipeline.split import replaced


# The device types whose check decodes the batch's files on the device (decode_device);
# elsewhere they are decoded in the workers (decode).
DECODE_ON = ("cuda",)


def applicable(exp: Any) -> Optional[str]:
    """Why no fix can be built for this experiment's pipeline, or None."""
    caches, spec = exp.caches, exp.spec
    if caches is None:
        return "the caches could not be filled"
    if getattr(spec, "iterable", True) or caches.stages is not None or not hasattr(spec, "collate_fn"):
        return "the pipeline is not a DataLoader over a map-style dataset (its transforms cannot be swapped in a copy)"
    if not spec.auto_collation:
        return "the loader does not batch its samples (batch_size=None)"
    if exp.wrapper is not None or exp.loop_stages is not None:
        return "the batches go through a loader wrapper or loop stages before the step"
    return None


def build(exp: Any, count_syncs: Optional[Callable] = None) -> tuple[tuple, dict]:
    """(the Fix of each kind, checked; the usable ones' Variants by kind). `count_syncs(fn,
    batch)`: the host-device syncs of `fn` on a device batch (CUDA), kept with each usable
    device tail."""
    why = applicable(exp)
    if why is not None:
        return (Fix(kind=DEVICE_TAIL, status="unavailable", reason=why),), {}
    tails, variants = _guarded(DEVICE_TAIL, lambda: _tails(exp, count_syncs))
    decoded, found = _guarded(DECODE, lambda: _decode(exp, count_syncs))
    variants.update(found)
    return tuple(sorted(tails + decoded, key=lambda f: KINDS.index(f.kind))), variants


def _guarded(kind: str, build_them: Callable) -> tuple[list, dict]:
    """`build_them()`, or where it raised, one failed Fix of `kind` with the error: a fix
    that cannot be built is not offered, and the run goes on."""
    try:
        return build_them()
    except Exception as exc:
        return [Fix(kind=kind, status="failed", reason=f"building it raised {type(exc).__name__}: {exc}"[:300])], {}


def _tails(exp: Any, count_syncs: Optional[Callable]) -> tuple[list, dict]:
    """The device tail and the random candidate, checked; their usable Variants."""
    caches = exp.caches
    fixes, splits = tail.checked(caches, exp.spec.collate_fn, exp.move)
    variants = {kind: Variant(replaced(caches.dataset, s.call, s.head), s.tail) for kind, s in splits.items()}
    if count_syncs is not None:
        fixes = [_with_syncs(f, splits.get(f.kind), exp, count_syncs) for f in fixes]
    return list(fixes), variants


def _decode(exp: Any, count_syncs: Optional[Callable] = None) -> tuple[list, dict]:
    """Decode by torchvision, checked; its Variant where usable: in the workers, or on
    CUDA batched on the device (decode_device), with the syncs its step side adds on a
    batch of the files (`count_syncs`, as a tail's)."""
    caches, collate = exp.caches, exp.spec.collate_fn
    on_device = exp.device.type in DECODE_ON
    made, fix = decode_device.build(caches, collate, exp.device) if on_device else decode.build(caches)
    if made is None:
        return [fix], {}
    try:
        fix = decode_device.check(fix, caches.dataset, made, collate, exp.move) if on_device else \
            decode.check(fix, caches.dataset, made[0], collate, exp.move)
    except Exception as exc:  # the decoded copy cannot build a batch: not offered, and why
        fix = dataclasses.replace(fix, status="failed", reason=f"the decoded copy raised {type(exc).__name__}: {exc}"[:300])
    if not fix.usable:
        return [fix], {}
    if not on_device:
        return [fix], {DECODE: Variant(made[0])}
    dataset, collate_files, after = made
    if count_syncs is not None:
        files = exp.move(collate_files([dataset[i] for i in exp.caches.groups[0]]))
        fix = dataclasses.replace(fix, syncs=count_syncs(after, files).to_dict())
    return [fix], {DECODE: Variant(dataset, after=after, collate=collate_files)}


def _with_syncs(fix: Fix, split: Optional[tail.Split], exp: Any, count_syncs: Callable) -> Fix:
    """A usable tail's Fix with the syncs its tail adds on a cached device batch."""
    if split is None or not fix.usable:
        return fix
    moved = split.calls
    group = exp.caches.groups[0]
    batch = exp.move(exp.spec.collate_fn([recording.replay_sample(exp.caches.samples[i], moved(exp.caches.raw_calls[i]))
                                          for i in group]))
    return dataclasses.replace(fix, syncs=count_syncs(split.tail, batch).to_dict())


def usable(fixes: tuple) -> dict:
    """The fixes that passed their check, by kind."""
    return {f.kind: f for f in fixes or () if f.usable}
