"""The pipeline's own fixes as the check built them, before any of them is timed: records
with their JSON form (results.Record).

A fix is a modified copy of the user's pipeline and step (measure/tail.py,
measure/decode.py): the transforms at the end of the dataset's Compose moved out of the
workers to run batched on the device inside the step (`device_tail`, exact; or
`device_augment`, random transforms with one draw per batch), or PIL's decoding replaced
by torchvision's (`decode`). Before it is timed against the user's pipeline (advise/
verify.py), a few cached batches are built both ways and compared: `Fix` says what moved,
what was compared and what differed. A fix that does not match is not timed, and the
report says why.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from .record import Part

# The kinds of fix, in the order the check tries them.
DEVICE_TAIL = "device_tail"
DEVICE_AUGMENT = "device_augment"
DECODE = "decode"
KINDS = (DEVICE_TAIL, DECODE, DEVICE_AUGMENT)


@dataclasses.dataclass(frozen=True)
class Fix(Part):
    """One fix as built and checked (see the module's docstring). `status`: ok (built and
    compared: `matches` says whether it passed), unavailable (it cannot be built for this
    pipeline: `reason`), failed (building or comparing it raised: `reason`)."""

    kind: Optional[str] = None
    where: Optional[str] = None  # the recorded transform it changes: "dataset.transform"
    moved: tuple = ()  # the user's transforms that run elsewhere, in order ("ToTensor's scaling", "Normalize")
    kept: tuple = ()  # the user's transforms left in the workers
    random: tuple = ()  # the moved ones that draw at random: one draw per batch instead of per sample
    path: Optional[str] = None  # where in the batch the moved transforms act: "[0]"
    batches: Optional[int] = None  # batches built both ways and compared
    samples: Optional[int] = None
    matches: Optional[bool] = None
    max_difference: Optional[float] = None  # the largest absolute difference of a value
    mean_difference: Optional[float] = None
    tolerance: Optional[float] = None  # what `max_difference` (decode: `mean_difference`) is held against
    level: Optional[float] = None  # decode: one grey level in the batch's units (its range over 255)
    mismatch: Optional[str] = None  # what differs, where it does not match
    # the batch's part at `path`, as the workers hand it over, before and after:
    # {"dtype": "float32", "bytes": 802816}
    before: Optional[dict] = None
    after: Optional[dict] = None
    code: Optional[str] = None  # the change as code: what to write in the transforms and the step
    # decode: where the files are decoded: a device, in the step (measure/decode_device.py); None: in the workers
    device: Optional[str] = None
    # on CUDA, the host-device syncs the tail adds per batch: a Syncs record's JSON form (device_alone.count_syncs)
    syncs: Optional[dict] = None

    @property
    def usable(self) -> bool:
        """Built and passed its check: it may be timed."""
        return self.ok and bool(self.matches)


@dataclasses.dataclass(frozen=True)
class Variant:
    """A fix as a visit of `full` runs it (Experiment.open): the dataset copy its loader
    reads, what runs on each batch after its transfer to the device (None: nothing), in
    the step's stream and inside the timed window, and the collate_fn its loader uses
    (None: the user's)."""

    dataset: Any
    after: Optional[Callable[[Any], Any]] = None
    collate: Optional[Callable[[list], Any]] = None

    def through(self, move: Optional[Callable[[Any], Any]]) -> Optional[Callable[[Any], Any]]:
        """The transfer `move` followed by `after` (`move` alone where there is none)."""
        if self.after is None or move is None:
            return move
        after = self.after
        return lambda batch: after(move(batch))
