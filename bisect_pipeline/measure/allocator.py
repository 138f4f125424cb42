"""Hold the C allocator still during a run, so the step costs the same at every point.

glibc's malloc hands large freed blocks back to the kernel: blocks above its mmap
threshold are unmapped when freed, and free memory at the top of the heap above its
trim threshold is trimmed. The next step then page-faults the same memory in again
(the kernel zeroes every page). Whether that happens between two steps depends on what
else allocates in between, so it differs from one cache point to the next, and the
ceiling can land below points that do more work (docs/how-it-works.md: the demo's step).

`Held` sets glibc's parameters with mallopt(3) for the duration of a run (fork-started
DataLoader workers inherit them); before it does, it can time the step as the process
runs and again held still, for the `allocator` advice. Elsewhere (macOS, Windows, musl, an allocator
preloaded with LD_PRELOAD) nothing is changed and the run's `allocator` block says so.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import platform
from typing import Callable, Optional

from ..core.results import AllocatorHold, AllocatorTiming
from ..core.stats import is_real, median, median_se

# mallopt(3) parameter numbers (malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Settings:
    """glibc malloc parameters; trim_threshold -1 means never trim (mallopt(3))."""

    mmap_threshold: int
    trim_threshold: int
    top_pad: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# During a run: blocks up to 32 MiB come from the heap and are reused (32 MiB is the
# largest mmap threshold glibc accepts on 64-bit, DEFAULT_MMAP_THRESHOLD_MAX; larger
# blocks are mapped and unmapped at every step at every point alike), the heap is never
# trimmed, and it grows 64 MiB at a time (fewer brk calls while the caches fill). The
# memory this keeps is at most the run's own peak; it is given back when the run ends.
HELD = Settings(mmap_threshold=32 * MIB, trim_threshold=-1, top_pad=64 * MIB)
# After a run. Any mallopt call ends glibc's sliding threshold for good, so the
# parameters are set to where that sliding threshold itself goes in a process that
# frees a 32 MiB block (mmap threshold 32 MiB, trim threshold twice that), unless the
# user set MALLOC_*_ variables, whose values are put back.
AFTER = Settings(mmap_threshold=32 * MIB, trim_threshold=64 * MIB, top_pad=0)
_ENV = {"mmap_threshold": "MALLOC_MMAP_THRESHOLD_", "trim_threshold": "MALLOC_TRIM_THRESHOLD_",
        "top_pad": "MALLOC_TOP_PAD_"}
_PARAM = {"mmap_threshold": M_MMAP_THRESHOLD, "trim_threshold": M_TRIM_THRESHOLD, "top_pad": M_TOP_PAD}
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc", "hoard", "scalloc")

# The step timed as the process runs, then held still: at least BLOCK_STEPS timed steps
# each (a median of fewer is not a measurement), at most MAX_BLOCK_STEPS.
BLOCK_STEPS = 5
MAX_BLOCK_STEPS = 50
# Untimed steps before the first block: a step's first calls are slower (lazy set-up,
# the first optimizer update), which would be charged to the allocator as it was.
WARMUP_STEPS = 3
# The fewest steps time_step takes: its warm-up, then per block a transition step and
# BLOCK_STEPS timed ones.
LEAST_STEPS = WARMUP_STEPS - 1 + 2 * (1 + BLOCK_STEPS)


class Glibc:
    """glibc's malloc controls through ctypes."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._mallopt = libc.mallopt
        self._mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        self._mallopt.restype = ctypes.c_int
        self._trim = libc.malloc_trim
        self._trim.argtypes = [ctypes.c_size_t]
        self._trim.restype = ctypes.c_int

    def apply(self, s: Settings) -> bool:
        ok = True
        for name, param in _PARAM.items():
            ok = bool(self._mallopt(param, int(getattr(s, name)))) and ok
        return ok

    def release(self) -> None:
        """Give the free memory the run kept back to the OS."""
        self._trim(0)


def find() -> tuple[Optional[Glibc], str]:
    """glibc's controls when glibc's malloc is the one in use, else (None, why not)."""
    if platform.system() != "Linux":
        return None, f"{platform.system()}: only glibc's malloc (Linux) can be held still"
    name, version = platform.libc_ver()
    if name != "glibc":
        return None, f"the C library is {name or 'not glibc'}: only glibc's malloc can be held still"
    preload = os.environ.get("LD_PRELOAD", "")
    other = next((a for a in _OTHER_ALLOCATORS if a in preload), None)
    if other:
        return None, f"{other} is preloaded (LD_PRELOAD) and serves malloc: left as it is"
    try:
        libc = ctypes.CDLL("libc.so.6")
        here = ctypes.CDLL(None)
        address = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        other = other_malloc(address(here.malloc), address(libc.malloc), _maps(), os.path.realpath("/proc/self/exe"))
        if other:
            return None, other
        return Glibc(libc), f"glibc {version}"
    except (OSError, AttributeError) as exc:
        return None, f"glibc's mallopt could not be reached ({exc})"


def _maps() -> str:
    try:
        with open("/proc/self/maps") as f:
            return f.read()
    except OSError:
        return ""


def _mappings(maps: str):
    """(start, end, path) of each mapping of a /proc/PID/maps text that names a file."""
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and "-" in parts[0]:
            lo, hi = parts[0].split("-")
            yield int(lo, 16), int(hi, 16), parts[5].strip()


def other_malloc(malloc: int, glibc_malloc: int, maps: str, exe: str) -> Optional[str]:
    """Why malloc in this process is not glibc's, or None when it is. `malloc`: the
    address the process's symbol lookup gives; `glibc_malloc`: libc.so.6's own.

    They differ where another library defines malloc first (an allocator preloaded or
    linked in), and also where the executable is not position-independent (Debian's and
    Ubuntu's python3): there the lookup gives the executable's PLT entry, which the
    dynamic linker binds to the first library defining malloc, so the libraries loaded
    say which one serves it."""
    if malloc == glibc_malloc:
        return None
    owner = next((path for lo, hi, path in _mappings(maps) if lo <= malloc < hi), None)
    if owner is not None and os.path.realpath(owner) == exe:
        other = next((a for _, _, path in _mappings(maps) for a in _OTHER_ALLOCATORS
                      if a in os.path.basename(path)), None)
        return None if other is None else f"{other} is loaded and may serve malloc: left as it is"
    where = f" ({os.path.basename(owner)})" if owner else ""
    return f"malloc is served by another allocator than glibc's{where}: left as it is"


def after_settings(env: Optional[dict] = None) -> Settings:
    """What a run leaves: the user's MALLOC_*_ values where set, else AFTER."""
    env = os.environ if env is None else env
    values = {}
    for name, var in _ENV.items():
        try:
            values[name] = int(env[var])
        except (KeyError, ValueError):
            values[name] = getattr(AFTER, name)
    return Settings(**values)


class Held:
    """The allocator of one run: `time_step` (optional) times the step as the process
    runs now, holds the allocator still and times it again; `hold` holds it without
    timing; `release` ends the hold. `record` is the run's `allocator` block."""

    def __init__(self, enabled: bool = True) -> None:
        self.glibc: Optional[Glibc] = None
        self.holding = False  # held now
        self.controlled = False  # held at some point of the run
        self.after: Optional[Settings] = None
        if not enabled:
            self.platform, self.reason = "not changed", "turned off (hold_allocator=False / --no-hold-allocator)"
            return
        self.glibc, self.platform = find()
        self.reason = None if self.glibc is not None else self.platform

    def hold(self) -> bool:
        if self.holding or self.glibc is None:
            return self.holding
        self.after = after_settings()
        self.holding = self.controlled = self.glibc.apply(HELD)
        if not self.holding:
            self.reason = "glibc's mallopt refused the settings"
        return self.holding

    def release(self) -> None:
        if self.holding:
            self.glibc.apply(self.after)
            self.glibc.release()
            self.holding = False

    def time_step(self, step_once: Callable[[], None], budget_s: float, clock: Callable[[], float]) -> AllocatorTiming:
        """The step alone as the process runs now (glibc's sliding thresholds, or what
        the user set), then held still: BLOCK_STEPS-or-more timed steps each, in half of
        `budget_s` each, after one untimed transition step. Then the allocator stays held.

        The default cannot be timed again after: any mallopt call ends glibc's sliding
        threshold for good. The cost is the difference of the two median steps, real when
        above the noise of the steps (stats.is_real on stats.median_se)."""
        if self.glibc is None:
            self.hold()
            return AllocatorTiming.missing("skipped", self.reason)
        for _ in range(WARMUP_STEPS - 1):  # _block's own first step is the last of them
            step_once()
        default = _block(step_once, budget_s / 2, clock)
        if not self.hold():
            return AllocatorTiming.missing("skipped", self.reason)
        held = _block(step_once, budget_s / 2, clock)
        d, h = median(default), median(held)
        sigma = math.hypot(median_se(default), median_se(held))
        return AllocatorTiming(default_ms_per_batch=round(d * 1e3, 3), held_ms_per_batch=round(h * 1e3, 3),
                               cost_ms_per_batch=round((d - h) * 1e3, 3), noise_ms=round(sigma * 1e3, 3),
                               real=is_real(d - h, sigma, h), steps=(len(default), len(held)), held=HELD.to_dict(),
                               source="the step alone on one cached batch, before and after holding the allocator "
                                      "still")

    def record(self) -> AllocatorHold:
        """The run's `allocator` block: held still or not, and how."""
        if not self.controlled:
            return AllocatorHold(controlled=False, allocator=self.platform, reason=self.reason)
        return AllocatorHold(controlled=True, allocator=self.platform, during=HELD.to_dict(), after=self.after.to_dict(),
                             note="freed memory is kept for reuse during the run; afterwards the free memory is given "
                                  "back (malloc_trim) and the parameters are set to 'after'")


def _block(step_once: Callable[[], None], budget_s: float, clock: Callable[[], float]) -> list:
    step_once()  # the transition: memory handed back or faulted in, thresholds moved
    times: list = []
    start = clock()
    while len(times) < BLOCK_STEPS or (clock() - start < budget_s and len(times) < MAX_BLOCK_STEPS):
        t = clock()
        step_once()
        times.append(clock() - t)
    return times
