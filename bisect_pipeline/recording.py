"""Transform proxies: record what a transform receives and where its output lands in a
sample, then replay the transform alone on the recorded input (the `raw` point)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from . import tree
from .faults import StageError, StepTimeout, stage_error

_SCALARS = (int, float, complex, str, bytes, bool, type(None))


@dataclasses.dataclass
class Call:
    """One call of a transform recorded while a sample was built."""

    fn: Callable
    name: str
    args: tuple
    kwargs: dict
    output: Any = None
    placements: list = dataclasses.field(default_factory=list)  # (element index or None, path)
    locate: Optional[Callable] = None  # sample -> placements, when identity cannot find them (integrations)


class Recorder:
    def __init__(self) -> None:
        self.calls: Optional[list[Call]] = None


class RecordingTransform:
    """Stands in for a transform on the dataset copy: records its input, then runs it."""

    stage = "augment"  # what faults.stage_in_traceback names when it hangs

    def __init__(self, fn: Callable, name: str, recorder: Recorder) -> None:
        self.fn = fn
        self.name = name
        self.recorder = recorder

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        recording = self.recorder.calls is not None
        if recording:
            saved_args, saved_kwargs = tree.clone(args), tree.clone(kwargs)
        try:
            out = self.fn(*args, **kwargs)
        except (StageError, StepTimeout):
            raise
        except Exception as exc:  # name the stage; the message survives a worker
            raise stage_error("augment", exc) from exc
        if recording:
            self.recorder.calls.append(Call(self.fn, self.name, saved_args, saved_kwargs, out))
        return out


class SplitError(Exception):
    """The dataset cannot be split into loading and transforms; the message says why."""


def record_sample(inst: Any, index: Any) -> tuple[Any, list[Call]]:
    """Build sample `index` through the proxies; return it and the transform calls that
    produced parts of it, with where each output landed."""
    inst.recorder.calls = []
    try:
        sample = inst.dataset[index]
        calls = inst.recorder.calls
    finally:
        inst.recorder.calls = None
    placed = []
    for call in calls:
        call.placements = call.locate(sample) if call.locate is not None else _locate(call.output, sample)
        call.locate = None
        if call.placements is None:
            raise SplitError(
                f"the output of {call.name} is changed inside __getitem__ before it is returned, so replaying "
                "the transform alone would not rebuild the sample. Apply everything after loading inside the "
                "transform (e.g. append the extra step to the Compose) to make the raw point available."
            )
        if call.placements:
            placed.append(call)
        call.output = None  # not needed any more; do not keep it alive
    return sample, placed


def _locate(output: Any, sample: Any) -> Optional[list]:
    """Where `output` (or each element of a tuple output) sits in `sample`, by identity.

    [] means nothing to replay (a scalar output, e.g. an int label: too cheap to matter
    and ambiguous to find); None means a non-scalar output is nowhere in the sample.
    """
    if isinstance(output, _SCALARS):
        return []
    path = tree.find(sample, output)
    if path is not None:
        return [(None, path)]
    if isinstance(output, (tuple, list)):
        placements = []
        for i, elem in enumerate(output):
            if isinstance(elem, _SCALARS):
                continue
            p = tree.find(sample, elem)
            if p is None:
                return None
            placements.append((i, p))
        return placements
    return None


def replay_sample(template: Any, calls: list[Call]) -> Any:
    """Rebuild a sample: run each recorded transform on its cached input and put the
    output where it landed in the original sample."""
    sample = template
    for call in calls:
        out = call.fn(*tree.clone(call.args), **tree.clone(call.kwargs))
        for elem, path in call.placements:
            sample = tree.replace(sample, path, out if elem is None else out[elem])
    return sample


