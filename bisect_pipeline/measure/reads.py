"""File reads timed while the tool builds samples: load split into *read* (bytes from
storage) and *decode* (everything else the dataset does), on the same samples
(worker_stages.py's load timing runs inside `Reads`).

While a `Reads` is open, in the thread that opened it:

- `builtins.open` and `io.open` (whatever they are at the time, so a wrapper of the
  user's own is inside the timing) return, for a file opened for reading in binary
  mode, a thin proxy whose read, readinto, read1, readinto1, readall, readline,
  readlines, iteration, seek and peek add their wall time and the bytes they return to
  the counters; the open itself is timed too (on a network file system it is a round
  trip). PIL's Image.open(path), torchvision's pil_loader, numpy's np.load, torch.load
  and pathlib's read_bytes all open files this way. Text-mode and writing opens, and
  opens in other threads, are left alone.
- `torchvision.io.read_file` (also where torchvision.io.image keeps it, as its
  decode_image(path) and read_image call it) is timed, and its tensor's bytes counted,
  when torchvision is imported.

Everything is restored on exit, also on an exception. What the proxy cannot see: reads
through the file's descriptor (`fileno()`, `mmap`: PIL maps uncompressed images with a
file name into memory, numpy's memmap), files opened before the `Reads` (a file the
dataset keeps open), readers in C that open files themselves (cv2.imread, h5py, LMDB,
Arrow), and reads in other threads (a dataset's own thread pool). A file-type check
(numpy's np.load on .npy) sees the proxy as a generic file and takes its generic read
path, timed like the rest. Nested opens and reads (a wrapper reading through another
timed one) are counted once, at the outermost.
"""

from __future__ import annotations

import builtins
import functools
import io
import sys
import threading
import time
from typing import Any, Callable, Optional

from ..core.results import MERGED_WITH_LOAD, LoadSplit, PerSample

OPEN = "open()"
READ_FILE = "torchvision.io.read_file"
# torchvision's modules that hold read_file, patched when imported.
_READ_FILE_MODULES = ("torchvision.io.image", "torchvision.io")
# Timed through __getattr__ where the file has them (a raw FileIO has no peek).
_OPTIONAL = {"read1": len, "readinto1": int, "readall": len, "peek": None}

NOTHING_READ = ("no file was read through open() or torchvision.io.read_file while a sample was built: the data is "
                "already in memory (tensors, decoded arrays, Arrow tables), or it is read where the tool cannot see "
                "(a file the dataset keeps open, mmap, a reader in C such as cv2.imread or h5py, another thread)")
PAGE_CACHE = ("the tool's cache fill had just read these files, so they came from the page cache where the OS kept "
              "them: a first epoch from cold storage reads slower")


def _size(x: Any) -> int:
    return len(x) if x else 0


def _count(x: Any) -> int:
    return int(x) if x else 0


def _binary_read(args: tuple, kwargs: dict) -> bool:
    mode = args[0] if args else kwargs.get("mode", "r")
    return isinstance(mode, str) and "b" in mode and "r" in mode and not set(mode) & set("wax+")


class Reads:
    """Times file reads in this thread while open (see the module's docstring):
    `seconds`, `bytes`, `files`, and `seen`, files by how they were read."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._thread: Optional[int] = None
        self._depth = 0
        self._saved: list = []
        self.reset()

    def reset(self) -> None:
        """Counters to zero (after an untimed warm-up); files opened stay timed."""
        self.seconds, self.bytes, self.files = 0.0, 0, 0
        self.seen: dict = {}

    def mine(self) -> bool:
        """Whether a call now is counted: inside the Reads, in its thread, not nested."""
        return self._thread is not None and threading.get_ident() == self._thread and not self._depth

    def __enter__(self) -> "Reads":
        self._thread = threading.get_ident()
        try:
            self._patch(builtins, "open", self._opener(builtins.open))
            self._patch(io, "open", self._opener(io.open))
            wrapped: dict = {}
            for name in _READ_FILE_MODULES:
                module = sys.modules.get(name)
                original = getattr(module, "read_file", None)
                if callable(original):
                    if id(original) not in wrapped:
                        wrapped[id(original)] = self._read_file(original)
                    self._patch(module, "read_file", wrapped[id(original)])
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._thread = None
        while self._saved:
            obj, name, original = self._saved.pop()
            setattr(obj, name, original)

    def _patch(self, obj: Any, name: str, new: Any) -> None:
        self._saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, new)

    def timed(self, fn: Callable, args: tuple, size: Optional[Callable[[Any], int]]) -> Any:
        """fn(*args), its time and the bytes `size` says it returned counted when mine()."""
        if not self.mine():
            return fn(*args)
        self._depth += 1
        t = self.clock()
        try:
            out = fn(*args)
        finally:
            self._depth -= 1
            self.seconds += self.clock() - t
        if size is not None:
            self.bytes += size(out)
        return out

    def _file(self, how: str) -> None:
        self.files += 1
        self.seen[how] = self.seen.get(how, 0) + 1

    def _opener(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def open(file: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.mine() or not _binary_read(args, kwargs):
                return original(file, *args, **kwargs)
            f = self.timed(lambda: original(file, *args, **kwargs), (), None)
            self._file(OPEN)
            return TimedFile(f, self)
        return open

    def _read_file(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def read_file(path: Any) -> Any:
            if not self.mine():
                return original(path)
            data = self.timed(original, (path,), lambda t: int(t.numel() * t.element_size()))
            self._file(READ_FILE)
            return data
        return read_file


class TimedFile:
    """A file opened inside a Reads: its reads timed while the Reads is open (they only
    pass through after), everything else the file's own."""

    def __init__(self, f: Any, reads: Reads) -> None:
        self._f = f
        self._reads = reads

    def read(self, *args: Any) -> Any:
        return self._reads.timed(self._f.read, args, _size)

    def readinto(self, *args: Any) -> Any:
        return self._reads.timed(self._f.readinto, args, _count)

    def readline(self, *args: Any) -> Any:
        return self._reads.timed(self._f.readline, args, _size)

    def readlines(self, *args: Any) -> Any:
        return self._reads.timed(self._f.readlines, args, lambda lines: sum(map(len, lines)))

    def seek(self, *args: Any) -> Any:
        return self._reads.timed(self._f.seek, args, None)

    def __iter__(self) -> "TimedFile":
        return self

    def __next__(self) -> Any:
        return self._reads.timed(self._f.__next__, (), _size)

    def __enter__(self) -> "TimedFile":
        self._f.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._f.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        if name in ("_f", "_reads"):  # not set yet (a copy being made)
            raise AttributeError(name)
        attr = getattr(self._f, name)
        if name not in _OPTIONAL:
            return attr
        return lambda *args: self._reads.timed(attr, args, _OPTIONAL[name])

    def __repr__(self) -> str:
        return f"<timed {self._f!r}>"


io.IOBase.register(TimedFile)  # isinstance(f, io.IOBase) holds as it did for the file


def split(reads: Reads, samples: int, load: PerSample) -> LoadSplit:
    """load (ms per sample, from `samples` __getitem__ calls timed inside `reads`) split
    into reading and the rest, and what a streaming iterator adds where load was timed
    through it; unavailable, with the reason, when no read was seen."""
    if samples <= 0 or load.ms_per_sample is None:
        return LoadSplit.missing("unavailable", "no sample was timed")
    if not reads.files and not reads.bytes:
        return LoadSplit.missing("unavailable", NOTHING_READ)
    read_ms = reads.seconds / samples * 1e3
    # the reads were seen on the samples by index: where load is the iterator's figure
    # (worker_stages._through_iterator), decode is split from the figure by index and the
    # iterator's excess is a part of its own
    index = load.index_ms_per_sample
    decode_ms = max(0.0, (load.ms_per_sample if index is None else index) - read_ms)
    iterator_ms = None if index is None else max(0.0, load.ms_per_sample - index)
    parts = {"read": read_ms, "decode": decode_ms, "iterator": iterator_ms or 0.0}
    seen = " and ".join(f"{how} ({n} file{'s' if n != 1 else ''})" for how, n in reads.seen.items())
    merged = ("; decode includes " + " and ".join(MERGED_WITH_LOAD[s] for s in load.includes[1:] if s in MERGED_WITH_LOAD)
              + ", which could not be split from loading" if "augment" in (load.includes or ()) else "")
    return LoadSplit(read_ms_per_sample=round(read_ms, 4), decode_ms_per_sample=round(decode_ms, 4),
                     bytes_per_sample=round(reads.bytes / samples, 1),
                     read_mb_per_s=float(f"{reads.bytes / reads.seconds / 1e6:.4g}") if reads.seconds > 0 else None,
                     files_per_sample=round(reads.files / samples, 3), samples=samples,
                     iterator_ms_per_sample=None if iterator_ms is None else round(iterator_ms, 4),
                     bound=max(parts, key=parts.get),
                     how=f"reads timed through {seen or OPEN}{merged}; {PAGE_CACHE}")
