"""The device a run trains on: resolved and checked up front, and synchronised at the
edges of a timed window (never per step) whatever the accelerator; and this process's
time on the CPU (cpu_seconds)."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch

from ..core.errors import BisectError


def resolve(device: Any) -> torch.device:
    """The torch.device to train on (CUDA when available and none is given), or a
    BisectError naming what is wrong: not a device, CUDA absent, a CUDA index this
    machine does not have, an accelerator torch does not see here."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BisectError(f"device {device!r} is not a torch device ({exc}); use e.g. 'cpu', 'cuda', 'cuda:1'.") from exc
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BisectError(f"device {device!r} asked for, but CUDA is not available here; use --device cpu.")
        if dev.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        n = torch.cuda.device_count()
        if dev.index >= n:
            raise BisectError(f"device {device!r}: this machine has {n} CUDA device(s), cuda:0 to cuda:{n - 1}.")
        return dev
    seen = _accelerator()
    if seen != dev.type:
        raise BisectError(f"device {device!r} is not available here (torch sees {seen or 'no accelerator'}); "
                          "use --device cpu" + (f" or {seen}" if seen else "") + ".")
    return dev


def _accelerator() -> Any:
    acc = getattr(torch, "accelerator", None)
    if acc is None or not acc.is_available():
        return None
    return acc.current_accelerator().type


def synchronizer(dev: torch.device) -> Callable[[], None]:
    """What waits for the device's queued work: nothing on the CPU, CUDA's own
    synchronize, and torch.accelerator's for any other accelerator (MPS, XPU, ...)."""
    if dev.type == "cpu":
        return lambda: None
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: torch.accelerator.synchronize(dev)


def cpu_seconds() -> float:
    """This process's CPU time and the time its threads waited for a CPU (their run-queue
    delay, /proc/self/task/*/schedstat): what it would have computed on a machine of its
    own. A stage timed alone on a busy machine (another process on its core) is
    descheduled, its wall time twice its CPU time, and read as waiting on storage it put
    workers past the cores (witness.waits); its run-queue time is computing, not waiting.
    process_time alone where /proc cannot tell (not Linux)."""
    delay = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return time.process_time()
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                delay += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return time.process_time() + delay / 1e9
