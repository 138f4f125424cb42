"""Known failure messages told as their cause and fix: each mapped message, and real
failures where they are cheap to produce (a truncated tar read through webdataset, a
worker killed by each signal, a missing file)."""

import io
import os
import signal
import tarfile

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from bisect_pipeline.core import causes, faults

MiB = 2**20


def told(exc, where=None):
    return faults.classify(exc, where)


# ------------------------------------------------------------------- mapped messages


def test_a_full_dev_shm_gives_the_three_fixes_and_what_a_batch_needs():
    exc = faults.StageError("collate failed: RuntimeError: unable to write to file </torch_18693_1954506624>: "
                            "No space left on device (28)")
    stage, reason = told(exc, causes.Where(batch_bytes=48 * MiB, num_workers=8, prefetch_factor=2, shm_total=64 * MiB))
    assert stage == "collate"
    assert "/dev/shm (64 MiB) is full" in reason
    assert "each batch needs 48 MiB" in reason and "8 workers x prefetch_factor 2" in reason
    assert "768 MiB" in reason  # 8 x 2 x 48 MiB in flight
    assert "--shm-size" in reason and "fewer workers" in reason and "smaller prefetch_factor" in reason
    assert "No space left" not in reason  # the raw text is kept apart
    assert "No space left on device" in faults.raw(exc)


@pytest.mark.parametrize("message", [
    "unable to allocate shared memory(shm) for file </torch_1_2>: No space left on device (28)",
    "unable to mmap 1048576 bytes from file </torch_9_1>: Cannot allocate memory (12)",
    "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
])
def test_shared_memory_messages(message):
    assert "/dev/shm" in told(RuntimeError(message))[1] and "is full" in told(RuntimeError(message))[1]


@pytest.mark.parametrize("name,sig,words", [
    ("Killed", "SIGKILL", "out-of-memory killer"),
    ("Bus error", "SIGBUS", "/dev/shm is too small"),
    ("Segmentation fault", "SIGSEGV", "native crash"),
    ("Aborted", "SIGABRT", "aborted"),
])
def test_a_worker_killed_by_each_signal(name, sig, words):
    try:
        try:
            raise RuntimeError(f"DataLoader worker (pid 12) is killed by signal: {name}. ")
        except RuntimeError as inner:
            raise RuntimeError("DataLoader worker (pid(s) 12) exited unexpectedly") from inner
    except RuntimeError as exc:
        stage, reason = told(exc)
    assert stage == "worker" and f"killed by {sig}" in reason and words in reason


def test_a_worker_that_exited_without_a_signal_name():
    stage, reason = told(RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly"))
    assert stage == "worker" and "exited unexpectedly" in reason and "dmesg" in reason


def test_a_truncated_shard_is_named_with_the_fix():
    text = ("Caught ReadError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            "  ...\ntarfile.ReadError: (\"unexpected end of data @ <_io.BufferedReader "
            "name='/data/shards/train-0002.tar'>\", <_io.BufferedReader name='/data/shards/train-0002.tar'>, "
            "'/data/shards/train-0002.tar')\n")
    stage, reason = told(faults.StageError("load failed: ReadError: " + text))
    assert stage == "load"
    assert "shard train-0002.tar is truncated" in reason and "ends mid-member" in reason
    assert "Copy it again" in reason and "handler=wds.warn_and_continue" in reason
    assert "BufferedReader" not in reason


def test_an_unreadable_shard_says_what_is_wrong():
    reason = told(RuntimeError("ReadError: invalid header @ url='s3://bucket/train-0007.tar'"))[1]
    assert "shard train-0007.tar is not a readable archive (invalid header" in reason


def test_a_sample_cut_short_in_a_shard():
    reason = told(ValueError("didn't find ['x.npy'] in ['__key__', '__url__', 'cls', '__local_path__']"))[1]
    assert "a sample of a shard lacks ['x.npy']" in reason and "cut short mid-sample" in reason
    assert "handler=wds.warn_and_continue" in reason


@pytest.mark.parametrize("message", ["[Errno 24] Too many open files: '/data/x.jpg'", "received 0 items of ancdata"])
def test_the_descriptor_limit(message):
    reason = told(OSError(message))[1]
    assert "ran out of file descriptors" in reason and "ulimit -n" in reason
    assert 'set_sharing_strategy("file_system")' in reason


def test_a_truncated_image():
    reason = told(OSError("image file is truncated (17 bytes not processed)"))[1]
    assert "truncated (17 bytes missing)" in reason and "LOAD_TRUNCATED_IMAGES" in reason


def test_an_unknown_error_keeps_its_own_words():
    assert told(ValueError("bad pixel")) == (None, "ValueError: bad pixel")


# ------------------------------------------------------------------- real failures


def test_a_missing_file(tmp_path):
    try:
        open(tmp_path / "train" / "0001.jpg", "rb")
    except OSError as exc:
        stage, reason = told(faults.stage_error("load", exc))
    assert stage == "load" and f"file {tmp_path / 'train' / '0001.jpg'} does not exist" in reason
    assert "data path" in reason


def _shard(path, n):
    with tarfile.open(path, "w") as tf:
        for i in range(n):
            for ext, data in (("cls", str(i % 4).encode()), ("pth", b"x" * 4000)):
                info = tarfile.TarInfo(f"{i:05d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


@pytest.mark.e2e
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_real_truncated_shard_read_through_webdataset(tmp_path, num_workers):
    wds = pytest.importorskip("webdataset")
    _shard(tmp_path / "train-0002.tar", 20)
    data = (tmp_path / "train-0002.tar").read_bytes()
    (tmp_path / "train-0002.tar").write_bytes(data[: len(data) // 2 + 100])  # a copy cut short
    ds = wds.WebDataset([str(tmp_path / "train-0002.tar")], shardshuffle=False).to_tuple("pth", "cls")
    with pytest.raises(Exception) as info:
        for _ in DataLoader(ds, batch_size=4, num_workers=num_workers):
            pass
    stage, reason = told(faults.stage_error("load", info.value))
    assert "shard train-0002.tar is truncated" in reason and "handler=wds.warn_and_continue" in reason


class KillsItself(Dataset):
    def __init__(self, sig):
        self.sig = sig

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), self.sig)
        return torch.zeros(4), 0


@pytest.mark.e2e
@pytest.mark.parametrize("sig,words", [(signal.SIGKILL, "out-of-memory killer"),
                                       (signal.SIGBUS, "/dev/shm is too small"),
                                       (signal.SIGSEGV, "native crash")])
def test_a_real_worker_killed_by_each_signal(sig, words, no_leftover_workers):
    loader = DataLoader(KillsItself(sig), batch_size=4, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(RuntimeError) as info:
        for _ in loader:
            pass
    stage, reason = told(info.value)
    assert stage == "worker" and f"killed by {signal.Signals(sig).name}" in reason and words in reason
