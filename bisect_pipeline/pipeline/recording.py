"""Transform proxies: record what a transform receives and where its output lands in a
sample, then replay the transform alone on the recorded input (the `raw` point)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import Any, Callable, Iterable, Iterator, Optional

from ..core import tree
from ..core.faults import StageError, StepTimeout, stage_error

_SCALARS = (int, float, complex, str, bytes, bytearray, bool, type(None))


@dataclasses.dataclass
class Call:
    """One call of a transform recorded while a sample was built."""

    fn: Callable
    name: str
    args: tuple
    kwargs: dict
    output: Any = None
    # (path in the output, path in the sample) for each part of the output the sample
    # holds: () for the whole output, (1,) for a tuple's second element, ("mask",) for a
    # dict's value that __getitem__ unpacked.
    placements: list = dataclasses.field(default_factory=list)
    locate: Optional[Callable] = None  # sample -> placements, when identity cannot find them (integrations)
    tentative: bool = False  # a callable found by the attribute scan: replayed only if it acts as a transform
    # Replay hands the transform a copy of its recorded input (a transform may change its
    # input in place); not where the input is images and scalars only that replaying was
    # seen to leave as they were (settle_copies): the copy is work the pipeline does not do.
    copy_input: bool = True


class Recorder:
    """What the proxies of one dataset copy share: the calls of the sample being recorded
    (`calls`, while record_sample runs), and, while `timing`, the wall time of their
    outermost calls in the thread that started it (`seconds`): the transforms timed where
    the dataset runs them (worker_stages.time_load), a transform nested in another counted once."""

    def __init__(self) -> None:
        self.calls: Optional[list[Call]] = None
        self.clock: Optional[Callable[[], float]] = None
        self.seconds = 0.0
        self._thread: Optional[int] = None
        self._depth = 0

    @contextlib.contextmanager
    def timing(self, clock: Callable[[], float]) -> Iterator["Recorder"]:
        self.clock, self.seconds, self._thread, self._depth = clock, 0.0, threading.get_ident(), 0
        try:
            yield self
        finally:
            self.clock, self._thread = None, None

    def timed(self) -> bool:
        """Whether a call starting now is timed: timing, in its thread, not nested."""
        return self.clock is not None and not self._depth and threading.get_ident() == self._thread


class RecordingTransform:
    """Stands in for a transform on the dataset copy: records its input, then runs it.

    A tentative proxy (a callable attribute that may be loading, not a transform) names
    no stage until the fill has seen it act as a transform (split.Instrumented.settle):
    its errors and hangs are not blamed on augment meanwhile."""

    def __init__(self, fn: Callable, name: str, recorder: Recorder, tentative: bool = False) -> None:
        self.fn = fn
        self.name = name
        self.recorder = recorder
        self.tentative = tentative
        self.stage: Optional[str] = None if tentative else "augment"  # what faults.stage_in_traceback names

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rec = self.recorder
        recording = rec.calls is not None
        if recording:
            saved_args, saved_kwargs = tree.clone(args), tree.clone(kwargs)
        timed = rec.timed()
        if timed:
            rec._depth += 1
            t = rec.clock()
        try:
            out = self.fn(*args, **kwargs)
        except (StageError, StepTimeout):
            raise
        except Exception as exc:  # name the stage; the message survives a worker
            if self.stage is None:
                raise
            raise stage_error(self.stage, exc) from exc
        finally:
            if timed:
                rec.seconds += rec.clock() - t
                rec._depth -= 1
        if recording:
            call = Call(self.fn, self.name, saved_args, saved_kwargs, out, tentative=self.tentative)
            self.recorder.calls.append(call)
        return out


class SplitError(Exception):
    """The dataset cannot be split into loading and transforms; the message says why."""


def record_sample(inst: Any, index: Any) -> tuple[Any, list[Call]]:
    """Build sample `index` through the proxies; return it and the transform calls that
    produced parts of it, with where each part of their outputs landed. A tentative
    call that does not act as a transform is left on the loading side, with the reason
    in `inst.dropped`; a declared transform that cannot be replayed refuses the split."""
    inst.recorder.calls = []
    try:
        sample = inst.dataset[index]
        calls = inst.recorder.calls
    finally:
        inst.recorder.calls = None
    placed = []
    for call in calls:
        why = _place(call, sample)
        call.output = None  # not needed any more; do not keep it alive
        if why is not None and call.tentative:
            inst.dropped.setdefault(call.name, why)
        elif why is not None:
            raise SplitError(why)
        elif call.placements:
            placed.append(call)
    return sample, placed


def _place(call: Call, sample: Any) -> Optional[str]:
    """Find where the parts of the call's output landed in `sample` (call.placements);
    None when the call can be replayed, else why not."""
    if call.tentative and names_only((call.args, call.kwargs)):
        return (f"{call.name} is called with names only (paths, indices, keys, encoded bytes), so it reads or "
                "decodes data rather than transforming it: it stays with loading")
    if call.locate is not None:
        call.placements = call.locate(sample)
        missing = [()] if call.placements is None else []
    else:
        call.placements, missing = _locate(call.output, sample)
    call.locate = None
    if not missing:
        return None
    parts = ", ".join(f"{call.name}(...)" + "".join(f"[{k!r}]" for k in path) if path else f"the output of {call.name}"
                      for path in missing)
    verb = "is" if len(missing) == 1 else "are"
    return (f"{parts} {verb} changed inside __getitem__ before it is returned (not in the sample as the transform "
            "returned it: e.g. converted with .long(), torch.from_numpy or a permute, or left out), so replaying "
            "the transform would not rebuild the sample. Do that step inside the transform (append it to the "
            "Compose, e.g. as a Lambda, or ToTensorV2 for albumentations) and return or unpack the transform's "
            "outputs as they are (`image, mask = out['image'], out['mask']` is fine) to make the raw point available")


def names_only(obj: Any) -> bool:
    """Whether every leaf of a call's arguments names data (a path, an index, a key) or holds
    it still encoded (bytes): what a loader is called with; a transform gets loaded data.
    The one test of every pipeline kind: a map-style dataset's callables, a webdataset
    stage, a node graph's first Mapper."""
    return all(isinstance(x, _SCALARS) or isinstance(x, os.PathLike) or getattr(x, "ndim", None) == 0
               for _, x in tree.leaves(obj))


def _locate(output: Any, sample: Any) -> tuple[list, list]:
    """(placements, missing): where `output` sits in `sample` by identity, else where each
    of its parts does (tuple elements, dict values, nested), and the paths of the parts
    found nowhere.

    Scalars and empty containers are skipped (an int label is too cheap to matter and
    ambiguous to find): a scalar output gives ([], []), nothing to replay."""
    placements: list = []
    missing: list = []
    stack = [((), output)]
    while stack:
        out_path, node = stack.pop()
        if isinstance(node, _SCALARS) or (tree.is_container(node) and not tree.children(node)):
            continue
        path = tree.find(sample, node)
        if path is not None:
            placements.append((out_path, path))
        elif tree.is_container(node) and len(out_path) < tree.MAX_DEPTH:
            stack.extend((out_path + (k,), v) for k, v in reversed(tree.children(node)))
        else:
            missing.append(out_path)
    return placements, missing


def place(sample: Any, output: Any, placements: list) -> Any:
    """`sample` with each placed part of a replayed transform's `output` put where it landed."""
    for out_path, path in placements:
        sample = tree.replace(sample, path, tree.get(output, out_path))
    return sample


def replay_sample(template: Any, calls: list[Call]) -> Any:
    """Rebuild a sample: run each recorded transform on its cached input (a copy where
    it may change it: Call.copy_input) and put the parts of its output where they landed
    in the original sample. Kept lean: it runs per sample inside the `raw` point's
    timed windows, where whatever it adds to the transforms lands in augment."""
    return _run(template, calls, map(_inputs, calls))


def prepared_sample(template: Any, calls: list[Call]) -> Callable[[], Any]:
    """replay_sample with the cached inputs copied now (a transform may change its input
    in place): the function returned runs the transforms only, which is what a timer of
    the augment stage must hold (the copy of a 384x384 image is 7% of a blur's cost; the
    pipeline's augment does not copy)."""
    inputs = [_inputs(call) for call in calls]
    return lambda: _run(template, calls, inputs)


def _run(template: Any, calls: list[Call], inputs: Iterable) -> Any:
    """The transforms run on `inputs` (one (args, kwargs) per call), each output placed."""
    sample = template
    for call, (args, kwargs) in zip(calls, inputs):
        sample = place(sample, call.fn(*args, **kwargs), call.placements)
    return sample


def _inputs(call: Call) -> tuple:
    """The (args, kwargs) a replay hands the transform: copies where it may change them."""
    return (tree.clone(call.args), tree.clone(call.kwargs)) if call.copy_input else (call.args, call.kwargs)


def images_only(call: Call) -> bool:
    """Whether a call's input is PIL images and scalars only: what torchvision's and most
    users' transforms replace rather than change (a tensor or an array is often changed
    in place: Normalize(inplace=True), RandomErasing)."""
    return all(isinstance(x, _SCALARS) or tree._is_pil(x) for _, x in tree.leaves((call.args, call.kwargs)))


def settle_copies(template: Any, calls: list, changes: set) -> None:
    """Replay one sample without copying the inputs of its image-only calls, and keep it
    so for the calls whose input stayed as it was; a call that changed it (its name is
    added to `changes`) gets its recorded input back and is copied from then on, as is
    every later call of that name. On the first samples of the fill (cache.py): a small
    image's copy can cost as much as loading it, and would land in augment and come off load."""
    trial = [c for c in calls if c.name not in changes and images_only(c)]
    saved = {id(c): tree.clone((c.args, c.kwargs)) for c in trial}
    for c in trial:
        c.copy_input = False
    try:
        replay_sample(template, calls)
    finally:
        for c in trial:
            if not tree.same_values((c.args, c.kwargs), saved[id(c)]):
                changes.add(c.name)
                c.args, c.kwargs = saved[id(c)]
                c.copy_input = True


def mark_copies(calls: list, changes: set) -> None:
    """The copies of a later sample's calls as settle_copies decided on the first ones."""
    for c in calls:
        c.copy_input = c.name in changes or not images_only(c)
