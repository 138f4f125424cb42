"""The augment stage transform by transform: the children of a torchvision Compose (v1
or v2, nested Composes flattened) timed one after the other on the cached inputs of the
`raw` point, each fed what the one before returned, and their sum held against the
stage timed whole on the same samples (isolate.py).

A transform the tool cannot see into (a function, a lambda, an object that is not a
Compose), or one called with several arguments or keywords unless it is a torchvision v2
Compose (whose children take the same structure), is one row, with the reason.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable, Optional

from . import tree
from .results import Breakdown, BreakdownRow, PerSample
from .stats import noise_threshold, small_sample_factor

# Where the noise of the parts' sum is unknown (fewer samples), they agree with the
# whole within this share of it; else by the one noise rule (stats.noise_threshold: the
# sum's standard error and, as large, the whole's, and 5% of the whole at least).
PLAIN_TOLERANCE = 0.2
NOISE_MIN_SAMPLES = 3
MAX_ROWS = 32  # a Compose longer than this: the rest is one row


@dataclasses.dataclass
class _Part:
    """A row to time: `fn` called as the Compose would call it, or the whole call."""

    name: str
    where: str
    fn: Callable
    note: Optional[str] = None


def is_compose(fn: Any) -> bool:
    """torchvision's Compose, v1 or v2 (by its class, so torchvision need not be imported)."""
    return any(c.__name__ == "Compose" and (c.__module__ or "").startswith("torchvision.transforms")
               for c in type(fn).__mro__)


def _is_v2(fn: Any) -> bool:
    return any((c.__module__ or "").startswith("torchvision.transforms.v2") for c in type(fn).__mro__)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__  # a function's own name, else its class


def _flatten(fn: Any, where: str) -> list:
    """The leaves of nested Composes, in the order they run, as (where, transform)."""
    if not is_compose(fn):
        return [(where, fn)]
    out = []
    for i, child in enumerate(fn.transforms):
        out.extend(_flatten(child, f"{where}[{i}]"))
    return out


def parts_of(call: Any) -> tuple[list, bool]:
    """(the rows of one recorded call, whether its inputs are passed unpacked)."""
    fn, n_args, kwargs = call.fn, len(call.args), call.kwargs
    whole = _Part(_name(fn), call.name, fn)
    if not is_compose(fn):
        whole.note = "not a Compose: cannot be seen into"
        return [whole], n_args > 1
    if kwargs or (n_args != 1 and not _is_v2(fn)):
        how = f"{n_args} arguments" + (f" and keywords ({', '.join(kwargs)})" if kwargs else "")
        whole.note = f"called with {how}: not broken down (only a v2 Compose passes them on to its transforms)"
        return [whole], n_args > 1
    leaves = _flatten(fn, call.name)
    if len(leaves) > MAX_ROWS:
        whole.note = f"{len(leaves)} transforms: more than {MAX_ROWS}, not broken down"
        return [whole], n_args > 1
    return [_Part(_name(f), w, f) for w, f in leaves], n_args > 1


def describe(x: Any) -> str:
    """What a transform ran on: "3x224x224 uint8", "500x375 RGB", a tuple's parts."""
    if isinstance(x, (tuple, list)) and x:
        return ", ".join(describe(v) for v in x[:4]) + (", ..." if len(x) > 4 else "")
    if isinstance(x, dict) and x:
        return ", ".join(f"{k}: {describe(v)}" for k, v in list(x.items())[:4])
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return "x".join(str(int(d)) for d in shape) + " " + str(dtype).replace("torch.", "")
    if tree._is_pil(x):
        return f"{x.size[0]}x{x.size[1]} {x.mode}"
    return type(x).__name__


class _Rows:
    """What the rows measured so far hold: seconds, samples, input and output seen first."""

    def __init__(self) -> None:
        self.order: list = []
        self.parts: dict = {}
        self.seconds: dict = {}
        self.samples: dict = {}
        self.sizes: dict = {}

    def add(self, key: tuple, part: _Part, sec: float, sizes: Callable[[], tuple]) -> None:
        if key not in self.parts:
            self.order.append(key)
            self.parts[key] = part
            self.seconds[key], self.samples[key] = 0.0, 0
        self.seconds[key] += sec
        self.samples[key] += 1
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


def _run_call(call: Any, rows: _Rows, clock: Callable[[], float], out_of_time: Callable[[], bool]) -> bool:
    """Time the rows of one call on its cached input; False when the budget ran out
    before its last row (the rest are planned, not measured)."""
    parts, unpack = parts_of(call)
    inputs, kwargs = tree.clone(call.args), tree.clone(call.kwargs)  # keywords only where the call is one row
    for i, part in enumerate(parts):
        t = clock()
        out = part.fn(*inputs, **kwargs)
        sec = clock() - t
        rows.add((call.name, part.where), part, sec, lambda: (_shown(inputs, unpack, kwargs), describe(out)))
        inputs = tuple(out) if unpack else (out,)
        if out_of_time() and i + 1 < len(parts):
            _plan(rows, call.name, parts[i + 1:])
            return False
    return True


def _plan(rows: _Rows, name: str, parts: list) -> None:
    for part in parts:
        rows.plan((name, part.where), part)


def measure(calls_per_sample: list, share: float, clock: Callable[[], float], augment: PerSample) -> Breakdown:
    """Time the rows on the samples (each a list of recorded calls) until `share` seconds
    pass: within the first sample after each row, then after each whole sample."""
    rows, totals = _Rows(), []
    end = clock() + share
    out_of_time = (lambda: clock() >= end)
    for calls in calls_per_sample:
        before = sum(rows.seconds.values())
        first = not totals
        for j, call in enumerate(calls):
            cut = first and j > 0 and out_of_time()
            if cut or not _run_call(call, rows, clock, out_of_time if first else (lambda: False)):
                for later in calls[j if cut else j + 1:]:
                    _plan(rows, later.name, parts_of(later)[0])
                break
        totals.append(sum(rows.seconds.values()) - before)
        if out_of_time():
            break
    return _summary(rows, totals, augment)


def _summary(rows: _Rows, totals: list, augment: PerSample) -> Breakdown:
    measured = {k: rows.seconds[k] / rows.samples[k] * 1e3 for k in rows.order if rows.samples.get(k)}
    whole = sum(measured.values())
    out = []
    for k in rows.order:
        p = rows.parts[k]
        if k not in measured:
            out.append(BreakdownRow(status="not run", reason="out of time: the budget ran out before it",
                                    name=p.name, where=p.where, note=p.note))
            continue
        inp, outp = rows.sizes[k]
        out.append(BreakdownRow(name=p.name, where=p.where, ms_per_sample=round(measured[k], 4),
                                share=round(measured[k] / whole, 4) if whole > 0 else None, input=inp, output=outp,
                                samples=rows.samples[k], note=p.note))
    complete = len(measured) == len(rows.order)
    result = Breakdown(rows=tuple(out), samples=len(totals), sum_ms_per_sample=round(whole, 4) if complete else None)
    if not complete or augment is None or not augment.ok or augment.ms_per_sample is None:
        return result
    return dataclasses.replace(result, **agreement(whole, augment.ms_per_sample, totals))


def agreement(sum_ms: float, whole_ms: float, totals: list) -> dict:
    """Whether the parts' sum agrees with the stage timed whole: within 3 combined
    standard errors (from the spread of the per-sample sums, counted twice: the whole's
    noise is as large) and at least 5% of the whole; a plain 20% with fewer samples."""
    if len(totals) >= NOISE_MIN_SAMPLES:
        n = len(totals)
        se = statistics.stdev(totals) * 1e3 / math.sqrt(n) * small_sample_factor(n)
        tol, how = noise_threshold(math.sqrt(2) * se, whole_ms), "3 combined standard errors, at least 5%"
    else:
        tol, how = PLAIN_TOLERANCE * whole_ms, "20% (too few samples for the noise)"
    return dict(augment_ms_per_sample=round(whole_ms, 4), tolerance_ms=round(tol, 4), tolerance=how,
                agrees=abs(sum_ms - whole_ms) <= tol)
