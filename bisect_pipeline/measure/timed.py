"""How a cost alone is timed, whatever the stage: items timed one after another
(timed_loop, repeated) into a Timed, a failing measurement turned into a part that says
why (guard), the intra-op threads a worker has (worker_threads). Separate so that every
cost alone, and those to come (a streaming dataset's iterator, a fix), is timed one way."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator, Optional

import torch

from ..core import faults
from ..core.results import Part
from ..core.stats import mean_se
from ..pipeline.loader import LoaderSpec
from . import devices


@contextlib.contextmanager
def worker_threads(spec: LoaderSpec) -> Iterator[None]:
    """The work of the workers (load, augment, collate) timed with the intra-op threads
    a worker has: DataLoader sets one in each worker process, while this process may run
    several, and a tensor transform timed on 2 threads of a busy 2-core machine read 2-60x
    its time on one. Without workers it runs in this process, on its threads."""
    before = torch.get_num_threads()
    if spec.num_workers > 0:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def attempt(fn: Callable[[], Any], otherwise: Callable[[Exception], Any]) -> Any:
    """fn(), or otherwise(its exception) where it fails; KeyboardInterrupt and the
    watchdog's StepTimeout propagate (the watchdog ends all of the isolation)."""
    try:
        return fn()
    except (KeyboardInterrupt, faults.StepTimeout):
        raise
    except Exception as exc:
        return otherwise(exc)


def guard(kind: type, fn: Callable[[], Part]) -> Part:
    return attempt(fn, lambda exc: kind.missing("failed", reason_of(exc)))


def reason_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


@dataclasses.dataclass(frozen=True)
class Timed:
    """What timed_loop measured: the items timed, their wall time in all and each one's,
    and the CPU time of this process over them."""

    n: int
    seconds: float
    each: tuple = ()
    cpu_seconds: float = 0.0

    @property
    def ms(self) -> float:
        return self.seconds / self.n * 1e3

    @property
    def se_ms(self) -> Optional[float]:
        return se_ms(self.each)

    @property
    def cpu_ms(self) -> float:
        return self.cpu_seconds / self.n * 1e3


def se_ms(seconds: Any) -> Optional[float]:
    """The standard error of the mean of per-item `seconds` (their spread over sqrt(n)),
    in ms; None below two."""
    return round(mean_se(seconds) * 1e3, 5) if len(seconds) >= 2 else None


def timed_loop(items: list, fn: Callable[[Any], Any], share: float, clock,
               started: Optional[Callable[[], None]] = None) -> Timed:
    """Run fn over items until `share` seconds pass (at least one call). The first call
    is a warm-up when there are more: it is not timed. `started` is called as the timing
    starts (after the warm-up). Each call is timed, and the process's CPU time over all.
    A call that raises StopIteration (an iterator that ended before the items) ends it."""
    if len(items) > 1:
        fn(items[0])
        items = items[1:]
    if started is not None:
        started()
    cpu0 = devices.cpu_seconds()
    t0 = last = clock()
    each = []
    for item in items:
        try:
            fn(item)
        except StopIteration:
            if not each:
                raise RuntimeError("the iterator ended before one item could be timed") from None
            break
        now = clock()  # one read an item: its end is the next one's start
        each.append(now - last)
        last = now
        if now - t0 >= share:
            break
    return Timed(len(each), last - t0, tuple(each), max(0.0, devices.cpu_seconds() - cpu0))


def repeated(items: list, fn: Callable[[Any], Any], share: float, clock, at_least: int) -> Timed:
    """timed_loop over the items, then again over them while fewer than `at_least` calls
    were timed and the share is not spent: the timings of every pass together. A pass
    that fails (a function that changes its input in place cannot run twice on it) ends
    it with the calls timed before."""
    timed = timed_loop(items, fn, share, clock)
    while timed.n < at_least and timed.seconds < share and len(items) > 1:
        more = attempt(lambda: timed_loop(items, fn, share - timed.seconds, clock), lambda exc: None)
        if more is None:
            break
        timed = Timed(timed.n + more.n, timed.seconds + more.seconds, timed.each + more.each,
                      timed.cpu_seconds + more.cpu_seconds)
    return timed
