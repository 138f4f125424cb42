"""The ranks' board: what survives a rank that dies under torchrun.

The lockstep (distributed.py) agrees on a gloo group; a rank whose process dies breaks
that group for every other rank. What the ranks still share is the launcher's key-value
store (torchrun's agent holds it at MASTER_ADDR:MASTER_PORT, outside every rank), and
the board is written there:

- each rank says where it runs (`hello`: host and pid);
- when a rank is lost, each surviving rank posts its document (`post`); they wait for
  one another a bounded time (`collect`), and the lowest rank that posted writes the
  job's document (`writer`, agreed with one compare-and-set);
- how the lost ranks ended (`lost`): each rank's supervisor (`supervise`) records its
  process's exit code or signal; a rank with no record is told as far as can be known
  (its process gone or alive on this host, or silent on another).

The supervisor: under torchrun, on Linux, the command line forks once before anything
runs. The child is the rank; the parent waits for it, records how it ended and ends the
same way (torchrun sees the child's exit code or signal). The child runs in a process
group of its own, so the launcher's SIGTERM to the rank's group reaches the parent only,
which hands it to the child: the rank stops its DataLoader workers itself, instead of
the signal killing them mid-point. The child dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import time
from typing import Any, Callable, Iterable, Optional

from ..core import causes

# How long the surviving ranks wait for one another's documents (torchrun kills a rank 30
# s after its SIGTERM: the documents, the writing and the exit fit in that).
COLLECT_S = 10.0
# How long a rank that leaves on its own (its script ended) waits for the others' documents:
# the others are measuring, and learn of its leaving only once its process has ended.
LEAVE_S = 2.0
# How long a lost rank's supervisor is waited for, once its process is gone.
RECORD_S = 1.0
_POLL_S = 0.05
_STORE_TIMEOUT = datetime.timedelta(seconds=10)

# Signals the supervisor hands to the rank.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_SUPERVISED: list = [False]  # this process is a supervised rank (the child)
_RUNS: list = [0]  # boards opened in this process: the n-th on every rank is the same run


def _base() -> str:
    return f"bisect-pipeline/{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}/" \
           f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _store() -> Any:
    """A client of the launcher's store (MASTER_ADDR:MASTER_PORT), or None."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        import torch.distributed as dist

        return dist.TCPStore(host, int(port), is_master=False, timeout=_STORE_TIMEOUT, wait_for_workers=False)
    except Exception:  # no store there (a launcher whose rank 0 held it, and is gone)
        return None


class Board:
    """One run's board on the store (module docstring)."""

    def __init__(self, store: Any, rank: int, world_size: int, run: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.run = run
        self.clock = clock

    @classmethod
    def open(cls, rank: int, world_size: int) -> Optional["Board"]:
        """This process's next run's board, or None where no store can be reached."""
        store = _store()
        _RUNS[0] += 1
        if store is None:
            return None
        board = cls(store, rank, world_size, f"{_base()}/run{_RUNS[0]}")
        board._set(f"hello/{rank}", {"host": socket.gethostname(), "pid": os.getpid()})
        return board

    def _key(self, key: str) -> str:
        return key if key.startswith("bisect-pipeline/") else f"{self.run}/{key}"

    def _set(self, key: str, value: Any) -> None:
        try:
            self.store.set(self._key(key), json.dumps(value))
        except Exception:  # the store is gone (its host, node 0, lost): each rank keeps its own document
            pass

    def _get(self, key: str) -> Any:
        """The value, or None when the key is not there (never waits)."""
        key = self._key(key)
        try:
            if not self.store.check([key]):
                return None
            return json.loads(self.store.get(key))
        except Exception:  # the store is gone: nothing more to learn from it
            return None

    # -- when a rank is lost ------------------------------------------------------------

    def post(self, doc: dict) -> None:
        self._set(f"doc/{self.rank}", doc)

    def collect(self, grace: float = COLLECT_S) -> dict:
        """{rank: document} of the ranks that posted, waiting until every rank has posted
        or is known to be gone, at most `grace` seconds."""
        end = self.clock() + grace
        while True:
            docs = {r: d for r in range(self.world_size) if (d := self._get(f"doc/{r}")) is not None}
            waiting = [r for r in range(self.world_size) if r not in docs and not self.gone(r)]
            if not waiting or self.clock() >= end:
                return docs
            time.sleep(_POLL_S)

    def writer(self, posted: Iterable[int]) -> int:
        """The rank that writes the job's document: the lowest that posted, as the first
        rank to ask proposed it (one compare-and-set: every rank gets the same answer)."""
        lowest = str(min(posted))
        try:
            return int(self.store.compare_set(self._key("writer"), "", lowest))
        except Exception:
            return int(lowest)

    def lost(self, ranks: Iterable[int]) -> list:
        """How each of `ranks` ended, as far as can be known: its supervisor's record
        (exit code or signal), else whether its process is gone or alive (same host)."""
        out = []
        for r in ranks:
            hello = self._get(f"hello/{r}") or {}
            record = self._record(r, wait=RECORD_S if self.gone(r) else 0.0)
            entry = {"rank": r, "host": hello.get("host"), "pid": hello.get("pid"), "exit_code": None,
                     "signal": None}
            if record is not None:
                entry.update(exit_code=record.get("exit_code"), signal=record.get("signal"))
            entry["how"] = _how(entry, self._alive_here(hello))
            out.append(entry)
        return out

    def _record(self, rank: int, wait: float) -> Optional[dict]:
        end = self.clock() + wait
        while True:
            record = self._get(f"{_base()}/proc/{rank}")
            if record is not None or self.clock() >= end:
                return record
            time.sleep(_POLL_S)

    def gone(self, rank: int) -> bool:
        """Known to have ended: its supervisor recorded it, or its process is gone here."""
        if self._get(f"{_base()}/proc/{rank}") is not None:
            return True
        return self._alive_here(self._get(f"hello/{rank}") or {}) is False

    @staticmethod
    def _alive_here(hello: dict) -> Optional[bool]:
        """Whether the process `hello` names is alive (None: on another host, or unknown)."""
        if hello.get("host") != socket.gethostname() or not hello.get("pid"):
            return None
        try:
            with open(f"/proc/{hello['pid']}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return False


def _how(entry: dict, alive: Optional[bool]) -> str:
    """A lost rank's end in words."""
    if entry["signal"]:
        meaning = causes.signal_meaning(entry["signal"])
        return f"its process was killed by {entry['signal']}" + (f", {meaning}" if meaning else "")
    if entry["exit_code"] is not None:
        return f"its process exited with code {entry['exit_code']}"
    if alive is True:
        return "its process is alive but stopped answering (stuck in a step or a collective)"
    if alive is False:
        return "its process ended; how is not recorded (it was not started by the bisect-pipeline command)"
    return f"it stopped answering (on host {entry['host'] or 'unknown'}: its process ended or is stuck)"


# --------------------------------------------------------------------------------------
# The supervisor
# --------------------------------------------------------------------------------------


def supervisable() -> bool:
    """Under torchrun (its agent holds the store), on Linux, with 2 ranks or more, not
    supervised already."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return False
    return (world > 1 and "TORCHELASTIC_RUN_ID" in os.environ and hasattr(os, "fork")
            and os.path.exists("/proc/self/stat") and not _SUPERVISED[0])


def supervised() -> bool:
    """Whether this process is a rank its supervisor forked (and so ends with the run)."""
    return _SUPERVISED[0]


def supervise() -> None:
    """Fork the rank (module docstring): returns in the child; the parent waits, records
    and ends as the child did, never returning."""
    if not supervisable():
        return
    import sys

    for stream in (sys.stdout, sys.stderr):  # nothing buffered is written twice
        stream.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _SUPERVISED[0] = True
        os.setpgid(0, 0)
        _die_with(parent)
        return
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: _forward(child, signum))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:  # pragma: no cover - reaped elsewhere
            status = 0
            break
    code = os.waitstatus_to_exitcode(status)
    _record_exit(code)
    _end_as(code)


def _forward(child: int, signum: int) -> None:
    try:
        os.kill(child, signum)
    except ProcessLookupError:
        pass


def _die_with(parent: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _record_exit(code: int) -> None:
    store = _store()
    if store is None:
        return
    rank = os.environ.get("RANK", "0")
    record = {"signal": signal_name(-code)} if code < 0 else {"exit_code": code}
    try:
        store.set(f"{_base()}/proc/{rank}", json.dumps(record))
    except Exception:
        pass


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _end_as(code: int) -> None:
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if code < 0:
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP keep theirs
            pass
        os.kill(os.getpid(), -code)
        time.sleep(1)
    os._exit(code if code >= 0 else 128 - code)
