"""The device side timed alone: the training step on one device batch (the median after
warm-up steps), its host-device syncs and the peak memory on CUDA, and what moving a
batch to the device costs and carries. Separate from the workers' stages: these run the
user's step, on the caller's threads, and size the step the workers must feed."""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
import warnings
from typing import Any, Callable, Optional

import torch

from ..core import tree
from ..core.results import BatchShape, Memory, StepTime, SyncSite, Syncs, TensorInfo, Transfer
from ..core.stats import NOISY_REL_IQR, median
from . import devices, sources
from .timed import timed_loop

# The isolated step: untimed warm-up steps, then at most this many timed ones.
STEP_WARMUP = 3
STEP_MAX_TIMED = 20
# A long step whose two last warm-up calls agree within this share of the slower is
# steady: they are its timed steps (time_step).
STEP_SETTLED = NOISY_REL_IQR
# Training steps run under torch.cuda.set_sync_debug_mode("warn") to count syncs (one
# for a long step: sync_steps).
SYNC_STEPS = 3
# At most this many tensors of a batch are described in the JSON.
_MAX_TENSORS = 16


def time_step(train_step, batch, device, share, clock, *, long_s: float = math.inf) -> StepTime:
    """The step alone on one device batch, after STEP_WARMUP untimed steps: a fresh
    step's first calls are several times slower (lazy initialisation, the optimizer's
    first update), which would overstate the step and understate the workers needed.
    A long step (calls of `long_s` seconds or more: a window's, Plan.long) whose last two
    warm-up calls agree within STEP_SETTLED has paid those costs: the two are its timed
    steps. Each call of it takes seconds, and a step of 3 s on a GPU took 12 s here
    before any point (the probe's call before it: prepare.probe_step)."""
    sync = devices.synchronizer(device)

    def one(b):
        train_step(b)
        sync()
    warm: list = []
    for _ in range(STEP_WARMUP):
        t = clock()
        one(batch)
        warm.append(clock() - t)
        last = warm[-2:]
        if len(last) == 2 and min(last) >= long_s and max(last) - min(last) <= STEP_SETTLED * max(last):
            return StepTime(ms_per_batch=round(median(last) * 1e3, 3), steps=2,
                            source="median of steps timed in isolation")
    # The median step: on a shared machine a few steps wait for a core, and the step's
    # own time is what the workers must keep up with.
    times: list = []
    t0 = clock()
    while len(times) < STEP_MAX_TIMED:
        t = clock()
        one(batch)
        times.append(clock() - t)
        if clock() - t0 >= share:
            break
    return StepTime(ms_per_batch=round(median(times) * 1e3, 3), steps=len(times),
                    source="median of steps timed in isolation")


def time_transfer(spec, caches, device, move, *, share, clock) -> Transfer:
    host = sources.host_batches(caches, spec, device)
    nbytes = tree.nbytes(host[0])
    if device.type == "cpu":
        return Transfer(status="skipped", reason="no accelerator: host and device coincide", bytes_per_batch=nbytes)
    sync = devices.synchronizer(device)

    def one(batch):
        move(batch)
        sync()
    timed = timed_loop(host, one, share, clock)
    n, per = timed.n, timed.seconds / timed.n
    return Transfer(ms_per_batch=round(per * 1e3, 4), bytes_per_batch=nbytes, pinned=bool(spec.pin_memory), batches=n,
                    gb_per_s=round(nbytes / per / 1e9, 3) if per > 0 else None)


def memory(device: torch.device) -> Memory:
    total = torch.cuda.get_device_properties(device).total_memory
    peak = torch.cuda.max_memory_allocated(device)
    return Memory(peak_bytes=int(peak), total_bytes=int(total), fraction=round(peak / total, 4) if total else None,
                  note="peak since the process started (includes the tool's cached batches): an upper bound")


def is_image(shape: list, dtype: str) -> bool:
    """A batch of images: rank 4, channels (1, 3 or 4) first or last, and 2-D extent."""
    if len(shape) != 4:
        return False
    c_first = shape[1] in (1, 3, 4) and min(shape[2], shape[3]) >= 8
    c_last = shape[3] in (1, 3, 4) and min(shape[1], shape[2]) >= 8
    return c_first or c_last


def describe_batch(batch: Any) -> BatchShape:
    tensors = []
    for path, t in tree.tensors(batch):
        shape = tuple(t.shape)
        dtype = str(t.dtype).replace("torch.", "")
        tensors.append(TensorInfo(path="batch" + "".join(f"[{k!r}]" for k in path), dtype=dtype, shape=shape,
                                  bytes=t.element_size() * t.nelement(),
                                  image=t.is_floating_point() and is_image(list(shape), dtype)))
    return BatchShape(bytes=int(tree.nbytes(batch)), n_tensors=len(tensors), tensors=tuple(tensors[:_MAX_TENSORS]))


# Frames a sync is not attributed to: torch's own (the call that synchronizes is inside
# torch; its caller is the site) and the warnings machinery. A sync whose innermost
# other frame is this package's (a window edge, a batch moved for the step) is the
# tool's, not the step's: not counted. The planted workloads are user code.
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_WORKLOADS = (os.path.join(_OWN_DIR, "testing.py"), os.path.join(_OWN_DIR, "demo.py"))


def sync_site(frame: Any) -> Optional[str]:
    """Where a host-device sync was asked for, from the Python frame it was reported in:
    "file:line" of the innermost frame outside torch and the warnings module; None when
    that frame is this package's (the tool's own sync) or there is none."""
    f = frame
    while f is not None and (f.f_code.co_filename.startswith(_TORCH_DIR)
                             or f.f_globals.get("__name__") in ("warnings", "_py_warnings")):
        f = f.f_back
    if f is None:
        return None
    name = os.path.abspath(f.f_code.co_filename)
    if name.startswith(_OWN_DIR) and name not in _WORKLOADS:
        return None
    return f"{f.f_code.co_filename}:{f.f_lineno}"


class SyncRecorder:
    """Records the host-device syncs torch reports as warnings (their message says
    "synchronizing") while it is open, with the site each was asked for at (sync_site):
    only those of the thread that opened it (the loop's; a sync in another thread does
    not stall the step) and not the tool's own. Other warnings are swallowed, as the
    "always" filter would repeat them every step."""

    def __init__(self) -> None:
        self.sites: list = []
        self._catch = warnings.catch_warnings()
        self._thread = None

    def __enter__(self) -> "SyncRecorder":
        self._thread = threading.get_ident()
        self._catch.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._show
        return self

    def __exit__(self, *exc: Any) -> None:
        self._catch.__exit__(*exc)

    def _show(self, message: Any, *_: Any) -> None:  # warnings.showwarning's arguments
        if "synchroniz" not in str(message).lower() or threading.get_ident() != self._thread:
            return
        site = sync_site(sys._getframe(1))
        if site is not None:
            self.sites.append(site)

    def syncs(self, steps: int) -> Syncs:
        top = collections.Counter(self.sites).most_common(5)  # ties in the order first seen, as before
        return Syncs(steps=steps, total=len(self.sites), per_step=round(len(self.sites) / max(steps, 1), 2),
                     sites=tuple(SyncSite(k, c) for k, c in top))


class SyncCounter:
    """Counts host-device synchronizations while it is open, with
    torch.cuda.set_sync_debug_mode("warn") (the mode is restored on exit) and a
    SyncRecorder; `syncs(steps)` is the count per step over the `steps` that ran inside.
    Around the tool's own step (count_syncs) or a span of the user's loop
    (phases.SyncCount)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._recorder = SyncRecorder()
        self._previous = 0

    def __enter__(self) -> "SyncCounter":
        torch.cuda.synchronize(self.device)
        self._previous = torch.cuda.get_sync_debug_mode()
        self._recorder.__enter__()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            torch.cuda.set_sync_debug_mode(self._previous)
        finally:
            self._recorder.__exit__(*exc)
        torch.cuda.synchronize(self.device)

    def syncs(self, steps: int) -> Syncs:
        return self._recorder.syncs(steps)


def no_syncs_counted(device: torch.device) -> Optional[Syncs]:
    """Why syncs are not counted on this device (None on CUDA, where they are)."""
    if device.type == "cuda":
        return None
    return Syncs.missing("skipped", f"no CUDA device (running on {device.type}): host-device syncs are counted on "
                                    "CUDA only")


def sync_steps(step_s: Optional[float], long_s: float) -> int:
    """The steps the sync count runs: SYNC_STEPS, one where the step timed alone
    (`step_s`) is long (`long_s` or more): its syncs are its code's, the same each step,
    and each step takes seconds."""
    return 1 if step_s is not None and step_s >= long_s else SYNC_STEPS


def count_syncs(train_step: Callable[[Any], Any], batch: Any, device: torch.device, steps: int = SYNC_STEPS) -> Syncs:
    """Host-device synchronizations per training step, over `steps` steps on one device
    batch (SyncCounter)."""
    skipped = no_syncs_counted(device)
    if skipped is not None:
        return skipped
    with SyncCounter(device) as counter:
        for _ in range(steps):
            train_step(batch)
    return counter.syncs(steps)
