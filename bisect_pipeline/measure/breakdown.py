"""The augment stage transform by transform: the children of a torchvision Compose (v1
or v2, nested Composes flattened) timed one after the other on the cached inputs of the
`raw` point, each fed what the one before returned, and their sum held against the
stage timed whole on the same samples (worker_stages.py).

torchvision's RandomApply, RandomChoice and RandomOrder (v1 and v2) are walked as they
run: a draw like theirs decides which children run for each sample (the children of a
RandomApply only with its p, one child of a RandomChoice by its weights, every child of a
RandomOrder in a shuffled order), so a child's ms per sample is its mean over all the
samples, zero where it did not run, and the rows still add up to the whole.

A transform the tool cannot see into (a function, a lambda, an object that is not a
Compose), or one called with several arguments or keywords unless it is a torchvision v2
Compose (whose children take the same structure), is one row, with the reason.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable, Optional

import torch

from ..core import tree
from ..core.results import Breakdown, BreakdownRow, PerSample
from ..core.stats import mean_se, noise_threshold, small_sample_factor
from . import devices

# Where the noise of the parts' sum is unknown (fewer samples), they agree with the
# whole within this share of it; else by the one noise rule (stats.noise_threshold: the
# sum's standard error and, as large, the whole's, and 5% of the whole at least).
PLAIN_TOLERANCE = 0.2
NOISE_MIN_SAMPLES = 3
MAX_ROWS = 32  # a Compose longer than this: the rest is one row


# torchvision's random containers, walked as they run (see the module's docstring).
RANDOM_CONTAINERS = ("RandomApply", "RandomChoice", "RandomOrder")


@dataclasses.dataclass
class _Part:
    """A step to time: `fn` called as the Compose would call it, or the whole call. A
    random container (`kind` one of RANDOM_CONTAINERS) is no row itself: `children` holds
    the steps of each of its children, drawn as the container draws them."""

    name: str
    where: str
    fn: Callable
    note: Optional[str] = None
    kind: Optional[str] = None
    children: Optional[list] = None

    def leaves(self) -> list:
        """The rows under this step, in order (the step itself when it is a row)."""
        if self.children is None:
            return [self]
        return [leaf for steps in self.children for step in steps for leaf in step.leaves()]


def _torchvision_class(fn: Any, names: tuple) -> Optional[str]:
    """The first of `names` that is a torchvision.transforms class in fn's MRO (by name,
    so torchvision need not be imported)."""
    for c in type(fn).__mro__:
        if c.__name__ in names and (c.__module__ or "").startswith("torchvision.transforms"):
            return c.__name__
    return None


def is_compose(fn: Any) -> bool:
    """torchvision's Compose, v1 or v2."""
    return _torchvision_class(fn, ("Compose",)) is not None


def random_kind(fn: Any) -> Optional[str]:
    """RandomApply, RandomChoice or RandomOrder (v1 or v2), else None."""
    kind = _torchvision_class(fn, RANDOM_CONTAINERS)
    return kind if kind is not None and isinstance(getattr(fn, "transforms", None), (list, tuple)) else None


def _is_v2(fn: Any) -> bool:
    return any((c.__module__ or "").startswith("torchvision.transforms.v2") for c in type(fn).__mro__)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__  # a function's own name, else its class


def _steps(fn: Any, where: str) -> list:
    """The steps of `fn` in the order they run: nested Composes flattened, a random
    container one step holding its children's steps, anything else one row."""
    if is_compose(fn):
        return [step for i, child in enumerate(fn.transforms) for step in _steps(child, f"{where}[{i}]")]
    kind = random_kind(fn)
    if kind is not None:
        return [_Part(_name(fn), where, fn, kind=kind,
                      children=[_steps(child, f"{where}[{i}]") for i, child in enumerate(fn.transforms)])]
    return [_Part(_name(fn), where, fn)]


def parts_of(call: Any) -> tuple[list, bool]:
    """(the steps of one recorded call, whether its inputs are passed unpacked). A step
    is a row, or a random container whose rows are `_Part.leaves()`. The steps take the
    inputs `call_inputs` gives."""
    fn, n_args, kwargs = call.fn, len(call.args), call.kwargs
    whole = _Part(_name(fn), call.name, fn)
    library = _library_compose(fn)
    if library is not None:
        return _library_parts(library, call, whole)
    if not is_compose(fn) and random_kind(fn) is None:
        whole.note = "not a Compose: cannot be seen into"
        return [whole], n_args > 1
    if kwargs or (n_args != 1 and not _is_v2(fn)):
        how = f"{n_args} arguments" + (f" and keywords ({', '.join(kwargs)})" if kwargs else "")
        whole.note = f"called with {how}: not broken down (only a v2 Compose passes them on to its transforms)"
        return [whole], n_args > 1
    steps = _steps(fn, call.name)
    n = sum(len(step.leaves()) for step in steps)
    if n > MAX_ROWS:
        whole.note = f"{n} transforms: more than {MAX_ROWS}, not broken down"
        return [whole], n_args > 1
    return steps, n_args > 1


def call_inputs(call: Any, steps: list) -> tuple[tuple, dict]:
    """(positional inputs, keywords) the first of `steps` (parts_of) is called with, copied:
    the call's own, except for a broken-down albumentations Compose, whose steps pass the
    keywords on as one dict (as the Compose does)."""
    if steps and isinstance(steps[0].fn, _AlbumentationsPre):
        return (tree.clone(dict(call.kwargs)),), {}
    return tree.clone(call.args), tree.clone(call.kwargs)


def describe(x: Any) -> str:
    """What a transform ran on: "3x224x224 uint8", "500x375 RGB", a tuple's parts."""
    if isinstance(x, (tuple, list)) and x:
        return ", ".join(describe(v) for v in x[:4]) + (", ..." if len(x) > 4 else "")
    if isinstance(x, dict) and x:  # its arrays and images (not MONAI's trace of what ran), else all
        items = [(k, v) for k, v in x.items() if _sized(v)] or list(x.items())
        return ", ".join(f"{k}: {describe(v)}" for k, v in items[:4])
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return "x".join(str(int(d)) for d in shape) + " " + str(dtype).replace("torch.", "")
    if tree._is_pil(x):
        return f"{x.size[0]}x{x.size[1]} {x.mode}"
    return type(x).__name__


def _sized(x: Any) -> bool:
    """An array or an image, or a tuple or list holding one."""
    if isinstance(x, (tuple, list)):
        return any(_sized(v) for v in x[:4])
    return (getattr(x, "shape", None) is not None and getattr(x, "dtype", None) is not None) or tree._is_pil(x)


class _Rows:
    """What the rows measured so far hold: seconds, samples, input and output seen first."""

    def __init__(self) -> None:
        self.order: list = []
        self.parts: dict = {}
        self.seconds: dict = {}
        self.samples: dict = {}
        self.sizes: dict = {}
        self.ran: dict = {}  # samples a row ran on (fewer than `samples` under a random container)

    def add(self, key: tuple, part: _Part, sec: float, sizes: Optional[Callable[[], tuple]]) -> None:
        """One sample's time of a row; `sizes` None: a random container did not run it
        for this sample (it counts, at zero)."""
        if key not in self.parts or key not in self.seconds:
            if key not in self.parts:
                self.order.append(key)
                self.parts[key] = part
            self.seconds[key], self.samples[key], self.ran[key] = 0.0, 0, 0
        self.seconds[key] += sec
        self.samples[key] += 1
        if sizes is not None:
            self.ran[key] += 1
            if key not in self.sizes:
                self.sizes[key] = sizes()

    def plan(self, key: tuple, part: _Part) -> None:
        """A row not measured yet (the budget ran out before it)."""
        if key not in self.parts:
            self.order.append(key)
            self.parts[key] = part


def _shown(inputs: tuple, unpack: bool, kwargs: dict) -> str:
    """What a row ran on: its positional inputs as the transform got them, and keywords."""
    shown = [describe(inputs if unpack else inputs[0])] if inputs else []
    return ", ".join(shown + ([describe(kwargs)] if kwargs else []))


@dataclasses.dataclass
class _Run:
    """What the steps of one call are timed with."""

    name: str  # the recorded call's
    rows: _Rows
    clock: Callable[[], float]
    unpack: bool
    kwargs: dict


def _run_call(call: Any, rows: _Rows, clock: Callable[[], float], out_of_time: Callable[[], bool]) -> bool:
    """Time the rows of one call on its cached input; False when the budget ran out
    before its last step (the rest are planned, not measured)."""
    parts, unpack = parts_of(call)
    inputs, kwargs = call_inputs(call, parts)
    run = _Run(call.name, rows, clock, unpack, kwargs)  # keywords only where the call is one row
    for i, part in enumerate(parts):
        inputs = _step(run, part, inputs)
        if out_of_time() and i + 1 < len(parts):
            _plan(rows, call.name, parts[i + 1:])
            return False
    return True


def _step(run: _Run, part: _Part, inputs: tuple) -> tuple:
    """Run one step on `inputs`, timing its rows; the next step's inputs."""
    if part.kind is not None:
        return _random_step(run, part, inputs)
    t = run.clock()
    out = part.fn(*inputs, **run.kwargs)
    sec = run.clock() - t
    run.rows.add((run.name, part.where), part, sec, lambda: (_shown(inputs, run.unpack, run.kwargs), describe(out)))
    return tuple(out) if run.unpack else (out,)


def _random_step(run: _Run, part: _Part, inputs: tuple) -> tuple:
    """A random container as it runs: its children drawn as it draws them (torch's
    generator, as torchvision's v2 containers draw), the rows not run counted at zero."""
    _plan(run.rows, run.name, [part])  # its rows in the order they are written, whatever the draw
    n = len(part.children)
    if part.kind == "RandomApply":
        chosen = list(range(n)) if float(torch.rand(1)) < float(getattr(part.fn, "p", 0.5)) else []
    elif part.kind == "RandomChoice":
        weights = getattr(part.fn, "p", None) or [1.0] * n
        chosen = [int(torch.multinomial(torch.tensor(weights, dtype=torch.float), 1))]
    else:  # RandomOrder
        chosen = torch.randperm(n).tolist()
    for i in chosen:
        for step in part.children[i]:
            inputs = _step(run, step, inputs)
    for i in set(range(n)) - set(chosen):
        for leaf in (leaf for step in part.children[i] for leaf in step.leaves()):
            run.rows.add((run.name, leaf.where), leaf, 0.0, None)
    return inputs


def _plan(rows: _Rows, name: str, parts: list) -> None:
    for leaf in (leaf for part in parts for leaf in part.leaves()):
        rows.plan((name, leaf.where), leaf)


def measure(calls_per_sample: list, share: float, clock: Callable[[], float], augment: PerSample) -> Breakdown:
    """Time the rows on the samples (each a list of recorded calls) until `share` seconds
    pass: within the first sample after each row, then after each whole sample; their
    sum held against `augment`, the stage timed whole elsewhere."""
    rows, totals = _time_rows(calls_per_sample, share, clock)
    return _summary(rows, totals, augment)


def measure_with_whole(calls_per_sample: list, share: float, clock: Callable[[], float],
                       whole: Callable[[int], Callable[[], Any]]) -> tuple[PerSample, Breakdown]:
    """(the stage timed whole, its rows): as `measure`, with `whole(i)()`, the stage replayed
    whole on sample i, timed right before that sample's rows (`whole(i)`, untimed, copies
    the inputs, as the rows' inputs are copied before their timers). Interleaved, a moment of a
    busy machine weighs on both alike, and the parts are held against the whole sample by
    sample (agreement's paired rule)."""
    wholes: list = []
    cpu = [0.0]

    def timed(i: int) -> None:
        run = whole(i)
        c = devices.cpu_seconds()
        t = clock()
        run()
        wholes.append(clock() - t)
        cpu[0] += max(0.0, devices.cpu_seconds() - c)
    rows, totals = _time_rows(calls_per_sample, share, clock, before=timed)
    stage = PerSample(ms_per_sample=round(statistics.fmean(wholes) * 1e3, 4), samples=len(wholes),
                      se_ms_per_sample=round(mean_se(wholes) * 1e3, 5) if len(wholes) >= 2 else None,
                      cpu_ms_per_sample=round(cpu[0] / len(wholes) * 1e3, 4))
    return stage, _summary(rows, totals, stage, wholes)


def _time_rows(calls_per_sample: list, share: float, clock: Callable[[], float],
               before: Optional[Callable[[int], None]] = None) -> tuple[_Rows, list]:
    """The rows timed sample by sample until `share` seconds pass (`before(i)` first on
    each); (the rows, each sample's sum of its rows' seconds)."""
    rows, totals = _Rows(), []
    end = clock() + share
    out_of_time = (lambda: clock() >= end)
    for i, calls in enumerate(calls_per_sample):
        if before is not None:
            before(i)
        already = sum(rows.seconds.values())
        first = not totals
        for j, call in enumerate(calls):
            cut = first and j > 0 and out_of_time()
            if cut or not _run_call(call, rows, clock, out_of_time if first else (lambda: False)):
                for later in calls[j if cut else j + 1:]:
                    _plan(rows, later.name, parts_of(later)[0])
                break
        totals.append(sum(rows.seconds.values()) - already)
        if out_of_time():
            break
    return rows, totals


def _summary(rows: _Rows, totals: list, augment: PerSample, wholes: Optional[list] = None) -> Breakdown:
    measured = {k: rows.seconds[k] / rows.samples[k] * 1e3 for k in rows.order if rows.samples.get(k)}
    whole = sum(measured.values())
    out = []
    for k in rows.order:
        p = rows.parts[k]
        if k not in measured:
            out.append(BreakdownRow(status="not run", reason="out of time: the budget ran out before it",
                                    name=p.name, where=p.where, note=p.note))
            continue
        inp, outp = rows.sizes.get(k, (None, None))
        out.append(BreakdownRow(name=p.name, where=p.where, ms_per_sample=round(measured[k], 4),
                                share=round(measured[k] / whole, 4) if whole > 0 else None, input=inp, output=outp,
                                samples=rows.samples[k], ran=rows.ran[k], note=p.note))
    complete = len(measured) == len(rows.order)
    result = Breakdown(rows=tuple(out), samples=len(totals), sum_ms_per_sample=round(whole, 4) if complete else None)
    if not complete or augment is None or not augment.ok or augment.ms_per_sample is None:
        return result
    return dataclasses.replace(result, **agreement(whole, augment.ms_per_sample, totals, wholes))


def agreement(sum_ms: float, whole_ms: float, totals: list, wholes: Optional[list] = None) -> dict:
    """Whether the parts' sum agrees with the stage timed whole, by the one noise rule
    (stats.noise_threshold: 3 standard errors, at least 5% of the whole). With the whole
    timed on the same samples in turn (`wholes`, seconds, paired with `totals`): the
    standard error of the per-sample differences; else the spread of the per-sample sums,
    counted twice (the whole's noise is as large); a plain 20% with fewer samples."""
    n = len(totals)
    if wholes is not None and len(wholes) == n and n >= NOISE_MIN_SAMPLES:
        diffs = [w - t for w, t in zip(wholes, totals)]
        se = statistics.stdev(diffs) * 1e3 / math.sqrt(n) * small_sample_factor(n)
        tol, how = noise_threshold(se, whole_ms), "3 standard errors of the per-sample differences, at least 5%"
    elif n >= NOISE_MIN_SAMPLES:
        se = statistics.stdev(totals) * 1e3 / math.sqrt(n) * small_sample_factor(n)
        tol, how = noise_threshold(math.sqrt(2) * se, whole_ms), "3 combined standard errors, at least 5%"
    else:
        tol, how = PLAIN_TOLERANCE * whole_ms, "20% (too few samples for the noise)"
    return dict(augment_ms_per_sample=round(whole_ms, 4), tolerance_ms=round(tol, 4), tolerance=how,
                agrees=abs(sum_ms - whole_ms) <= tol)


# --------------------------------------------------------------------------------------
# albumentations and MONAI Composes: their children called as the Compose calls them
# --------------------------------------------------------------------------------------


def _library_compose(fn: Any) -> Optional[str]:
    """"albumentations" or "monai" for those libraries' plain Compose (not their OneOf,
    SomeOf or RandomOrder, which derive from it in MONAI: those are one row)."""
    cls = type(fn)
    module = cls.__module__ or ""
    if cls.__name__ != "Compose":
        return None
    if module.startswith("albumentations"):
        return "albumentations"
    if module.startswith("monai.transforms"):
        return "monai"
    return None


class _AlbumentationsPre:
    """The Compose's preprocessing (shape checks, bbox/keypoint conversion) on the data dict."""

    def __init__(self, compose: Any) -> None:
        self.compose = compose

    def __call__(self, data: dict) -> dict:
        self.compose.preprocess(data)
        return data


class _AlbumentationsStep:
    """One child, `t(**data)`, and the Compose's check after it."""

    def __init__(self, compose: Any, t: Any) -> None:
        self.compose, self.t = compose, t

    def __call__(self, data: dict) -> dict:
        return self.compose.check_data_post_transform(self.t(**data))


class _AlbumentationsPost(_AlbumentationsPre):
    def __call__(self, data: dict) -> dict:
        return self.compose.postprocess(data)


class _MonaiStep:
    """One child through monai.transforms.apply_transform with its Compose's settings."""

    def __init__(self, compose: Any, t: Any) -> None:
        self.compose, self.t = compose, t

    def __call__(self, data: Any) -> Any:
        from monai.transforms import apply_transform  # only ever called on a MONAI Compose
        c = self.compose
        return apply_transform(self.t, data, c.map_items, c.unpack_items, lazy=c.lazy, overrides=c.overrides,
                               log_stats=c.log_stats)


def _monai_steps(compose: Any, where: str) -> list:
    out = []
    for i, t in enumerate(compose.transforms):
        if _library_compose(t) == "monai" and not getattr(t, "lazy", False):
            out.extend(_monai_steps(t, f"{where}[{i}]"))
        else:
            out.append(_Part(_name(t), f"{where}[{i}]", _MonaiStep(compose, t)))
    return out


def _library_parts(library: str, call: Any, whole: _Part) -> tuple[list, bool]:
    fn, n_args, kwargs = call.fn, len(call.args), call.kwargs
    if library == "albumentations":
        why = ("called without keywords" if n_args or not kwargs else
               f"applied with p={fn.p}" if getattr(fn, "p", 1.0) < 1.0 else
               "saves the applied parameters" if getattr(fn, "save_applied_params", False) else None)
        steps = ([_Part("preprocess", f"{call.name}.preprocess", _AlbumentationsPre(fn))]
                 + [_Part(_name(t), f"{call.name}[{i}]", _AlbumentationsStep(fn, t)) for i, t in enumerate(fn.transforms)]
                 + [_Part("postprocess", f"{call.name}.postprocess", _AlbumentationsPost(fn))])
    else:
        why = ("called with keywords or several arguments" if kwargs or n_args != 1 else
               "lazy resampling: the transforms' work is done at the end, together" if getattr(fn, "lazy", False)
               else None)
        steps = _monai_steps(fn, call.name)
    if why is None and len(steps) > MAX_ROWS:
        why = f"{len(steps)} transforms: more than {MAX_ROWS}"
    if why is not None:
        whole.note = f"{library} Compose {why}: not broken down"
        return [whole], n_args > 1
    return steps, False
