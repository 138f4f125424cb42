"""The failure messages people meet on a GPU server, told as their cause and what to do.

A DataLoader, its workers and the streaming libraries fail with messages written for
their own developers: "unable to write to file </torch_18693_1954506624>: No space left
on device (28)", "received 0 items of ancdata", "unexpected end of data @
<_io.BufferedReader name='train-0002.tar'>". Each known one is matched here (in the
message and the messages it was raised from) and told as one `Cause`: what is wrong,
with the names the message holds (the shard, the file, the signal), and the fix. The
original text is kept beside it (the point's `error`, shown with --debug).

The catalogue, most specific first (a worker killed by a bus error is a shared-memory
fault told as the signal's meaning; a shared-memory file that cannot be opened for want
of descriptors is a descriptor fault):

| kind | matched on |
|---|---|
| `fd limit` | "Too many open files", "[Errno 24]", "received 0 items of ancdata" |
| `shm` | a `/torch_...` shared-memory file or "shared memory" that cannot be written, mapped or allocated |
| `worker killed` | "is killed by signal: Killed / Bus error / Segmentation fault / ...", "exited unexpectedly" |
| `shard` | tarfile's "unexpected end of data", "invalid header", "bad checksum", ...; gzip's early end; webdataset's "didn't find [...] in [...]" |
| `image` | PIL's "image file is truncated", "cannot identify image file" |
| `missing file` | "[Errno 2] No such file or directory: 'PATH'" |
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Where:
    """What the caller knows of the pipeline that failed, for the figures a cause quotes:
    the bytes of one batch, the workers and the batches each keeps in flight, and the size
    of /dev/shm (None: unknown)."""

    batch_bytes: Optional[int] = None
    num_workers: int = 0
    prefetch_factor: Optional[int] = None
    shm_total: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Cause:
    """A known failure: `kind` (see the module's table), what is wrong and what to do."""

    kind: str
    cause: str
    fix: str

    def text(self) -> str:
        """One paragraph: the cause, then the fix as a sentence of its own."""
        return f"{self.cause}. {self.fix[:1].upper()}{self.fix[1:]}"


# What a process killed by a signal usually means (a DataLoader worker; under torchrun a
# rank), by the name torch's message gives the signal ("is killed by signal: Bus error."),
# and the fix for a worker.
SIGNALS = {
    "Killed": ("SIGKILL", "usually by the out-of-memory killer: more host memory was used than the machine, or the "
                          "container's limit, allows (or by a launcher's kill)",
               "use fewer workers, a smaller prefetch_factor or smaller batches (`dmesg`, or the container's "
               "events, say whether the out-of-memory killer acted)"),
    "Bus error": ("SIGBUS", "usually because /dev/shm is too small for the batches in flight",
                  "give the container more shared memory (docker run --shm-size=2g, or --ipc=host), or use fewer "
                  "workers, a smaller prefetch_factor or smaller batches"),
    "Segmentation fault": ("SIGSEGV", "a native crash in a library the dataset or its transforms call (an image "
                                      "decoder, OpenCV with threads, ...)",
                           "rerun with num_workers=0 to get its traceback"),
    "Aborted": ("SIGABRT", "a native library aborted", "rerun with num_workers=0 to see its message"),
    "Terminated": ("SIGTERM", "sent by something outside the loader (a launcher, a scheduler, a person)",
                   "look for who sends SIGTERM to the job's processes"),
    "Floating point exception": ("SIGFPE", "a native library divided by zero",
                                 "rerun with num_workers=0 to get its traceback"),
    "Illegal instruction": ("SIGILL", "a native library built for another CPU",
                            "reinstall the library built for this machine"),
}

def signal_meaning(name: str) -> Optional[str]:
    """What a process killed by the signal `name` (SIGKILL, ...) usually means, or None."""
    return next((meaning for sig, meaning, _ in SIGNALS.values() if sig == name), None)


# the signal's name, with or without torch's period after it (a message cut, or re-raised bare)
_KILLED = re.compile(r"is killed by signal: ([A-Za-z]+(?: [A-Za-z]+)*)")
_EXITED = re.compile(r"exited unexpectedly(?: with exit code (-?\d+))?")
_FD = re.compile(r"Too many open files|\[Errno 24\]|received 0 items of ancdata", re.I)
_SHM = re.compile(r"unable to (?:allocate|write to|mmap|open|resize|extend)[^\n]*(?:shared memory|</torch_)|"
                  r"insufficient shared memory|shm_open|No space left on device[^\n]*(?:/dev/shm|shm)|"
                  r"/dev/shm[^\n]*No space left on device", re.I)
_TAR = re.compile(r"unexpected end of data|invalid header|bad checksum|truncated header|empty header|"
                  r"file could not be opened successfully|not a gzip file|"
                  r"Compressed file ended before the end-of-stream marker was reached|Error -3 while decompressing",
                  re.I)
_MISSING_KEYS = re.compile(r"didn't find (\[[^\]]*\]) in (\[[^\]]*\])")
_TRUNCATED = re.compile(r"unexpected end of data|Compressed file ended before|truncated header", re.I)
_SHARD_NAME = re.compile(r"name='([^']+)'|name=\"([^\"]+)\"|'([^'\s]+\.(?:tar|tgz|tar\.gz|tar\.zst))'|"
                         r"url=['\"]?([^'\"\s,)]+)")
_IMAGE_TRUNCATED = re.compile(r"image file is truncated(?: \((\d+) bytes not processed\))?", re.I)
_IMAGE_UNREADABLE = re.compile(r"cannot identify image file ('[^']*'|<[^>]*>|\S+)", re.I)
_MISSING = (re.compile(r"No such file or directory: '([^']*)'"), re.compile(r"No such file or directory: (\S+)"),
            re.compile(r"FileNotFoundError: ([^\n]+)"))


def explain(text: str, where: Optional[Where] = None) -> Optional[Cause]:
    """The cause and fix of a failure whose text (an exception's message, or several
    joined: see `texts`) holds a known message; None when none is known."""
    where = where or Where()
    for rule in (_fd_limit, _shared_memory, _killed, _shard, _image, _missing):
        cause = rule(text, where)
        if cause is not None:
            return cause
    return None


def texts(exc: BaseException) -> str:
    """The messages of `exc` and of the exceptions it was raised from, with their types,
    one per line: what `explain` reads."""
    out, e, seen = [], exc, 0
    while e is not None and seen < 10:
        out.append(f"{type(e).__name__}: {e}")
        e, seen = e.__cause__ or e.__context__, seen + 1
    return "\n".join(out)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def _fd_limit(text: str, where: Where) -> Optional[Cause]:
    if not _FD.search(text):
        return None
    limit = ""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = f" (ulimit -n is {soft})" if soft != resource.RLIM_INFINITY else ""
    except (ImportError, ValueError, OSError):
        pass
    return Cause("fd limit",
                 f"the process ran out of file descriptors{limit}: DataLoader workers hand each tensor to the "
                 "loop through a descriptor of its own (torch's \"file_descriptor\" sharing strategy)",
                 "raise the limit (ulimit -n 65536; docker run --ulimit nofile=65536:65536), or call "
                 "torch.multiprocessing.set_sharing_strategy(\"file_system\") at the start of your script")


def _shared_memory(text: str, where: Where) -> Optional[Cause]:
    if not _SHM.search(text):
        return None
    need = ""
    if where.batch_bytes:
        depth = max(1, where.num_workers) * (where.prefetch_factor or 2)
        need = (f"; each batch needs {_mib(where.batch_bytes)} there, and {max(1, where.num_workers)} workers x "
                f"prefetch_factor {where.prefetch_factor or 2} keep about {_mib(depth * where.batch_bytes)} of "
                "batches in flight")
    total = where.shm_total if where.shm_total is not None else _shm_total()
    size = f" ({_mib(total)})" if total else ""
    return Cause("shm",
                 f"/dev/shm{size} is full: DataLoader workers hand their batches to the loop through it{need}",
                 "give the container more shared memory (docker run --shm-size=2g, or --ipc=host; on Kubernetes "
                 "an emptyDir with medium: Memory at /dev/shm), or use fewer workers or a smaller prefetch_factor")


def _shm_total() -> Optional[int]:
    try:
        import shutil

        return shutil.disk_usage("/dev/shm").total
    except OSError:
        return None


def _killed(text: str, where: Where) -> Optional[Cause]:
    m = _KILLED.search(text)
    if m:
        name = m.group(1).strip()
        sig, meaning, fix = SIGNALS.get(name, (name, f"killed by signal {name}", "rerun with num_workers=0"))
        return Cause("worker killed", f"a DataLoader worker was killed by {sig}, {meaning}", fix)
    m = _EXITED.search(text)
    if m and "worker" in text.lower():
        code = f" with exit code {m.group(1)}" if m.group(1) else ""
        return Cause("worker killed", f"a DataLoader worker exited unexpectedly{code}, most often killed by the "
                                      "out-of-memory killer or a native crash",
                     "`dmesg` says whether the out-of-memory killer acted; rerun with num_workers=0 for a crash's "
                     "traceback")
    return None


def _shard(text: str, where: Where) -> Optional[Cause]:
    fix = ("copy it again (compare its size or checksum with the source), or let the pipeline skip broken "
           "samples with webdataset's handler=wds.warn_and_continue (WebDataset(urls, handler=...))")
    keys = _MISSING_KEYS.search(text)
    if keys and "__key__" in keys.group(2):  # webdataset's to_tuple: a sample without a file the pipeline asks for
        return Cause("shard", f"a sample of a shard lacks {keys.group(1)} (it holds {keys.group(2)}): the shard was "
                              "cut short mid-sample, or its files are named otherwise than the pipeline asks", fix)
    m = _TAR.search(text)
    if not m:
        return None
    names = [g for hit in _SHARD_NAME.finditer(text) for g in hit.groups() if g]
    shard = os.path.basename(names[0]) if names else None
    what = "shard " + shard if shard else "a shard"
    if _TRUNCATED.search(text):
        wrong = f"{what} is truncated (it ends mid-member: a copy or download cut short)"
    else:
        wrong = f"{what} is not a readable archive ({m.group(0)}: corrupt, or not a tar file)"
    return Cause("shard", wrong, fix)


def _image(text: str, where: Where) -> Optional[Cause]:
    m = _IMAGE_TRUNCATED.search(text)
    if m:
        left = f" ({m.group(1)} bytes missing)" if m.group(1) else ""
        return Cause("image", f"an image file is truncated{left}",
                     "copy the dataset again, or let PIL decode what is there "
                     "(PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True)")
    m = _IMAGE_UNREADABLE.search(text)
    if m:
        return Cause("image", f"file {m.group(1)} is not a readable image (corrupt, empty, or another format)",
                     "copy it again, or leave it out of the dataset's file list")
    return None


def _missing(text: str, where: Where) -> Optional[Cause]:
    m = next((hit for hit in (p.search(text) for p in _MISSING) if hit), None)
    if m is None:
        return None
    path = m.group(1).strip()
    where_from = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
    return Cause("missing file", f"file {path}{where_from} does not exist",
                 "check the data path the dataset is given, that the volume is mounted, and under torchrun on "
                 "several nodes that every node sees it")
