"""The ranks' board on the launcher's store (measure/board.py), on an in-process store
and a fake clock: how long the surviving ranks wait for one another, who writes, and
how a lost rank's end is told."""

import json
import os
import socket
import subprocess
import sys

import torch.distributed as dist

from bisect_pipeline.measure import board
from conftest import FakeClock


def _board(store, rank, world=3, clock=None):
    b = board.Board(store, rank, world, "bisect-pipeline/test/run1", clock=clock or FakeClock())
    b._set(f"hello/{rank}", {"host": socket.gethostname(), "pid": os.getpid()})
    return b


def _record(store, rank, **record):
    store.set(f"{board._base()}/proc/{rank}", json.dumps(record))


def test_the_ranks_wait_for_one_another_until_every_rank_posted_or_ended(monkeypatch):
    store = dist.HashStore()
    clock = FakeClock()
    b0, b1 = _board(store, 0, clock=clock), _board(store, 1, clock=clock)
    _record(store, 2, signal="SIGKILL")  # rank 2's supervisor: its process was killed
    b0.post({"rank": 0})
    b1.post({"rank": 1})
    assert sorted(b0.collect(grace=5)) == [0, 1]  # at once: rank 2 is known to be gone
    assert b0.writer([0, 1]) == 0 and b1.writer([1]) == 0  # the first proposal holds for every rank


def test_a_rank_that_neither_posts_nor_ends_is_waited_for_the_grace_only(monkeypatch):
    store = dist.HashStore()
    clock = FakeClock()
    b1 = _board(store, 1, world=2, clock=clock)
    _board(store, 0, world=2, clock=clock)  # rank 0: alive (this process), silent
    b1.post({"rank": 1})

    def sleep(s):
        clock.t += s

    monkeypatch.setattr(board.time, "sleep", sleep)
    assert list(b1.collect(grace=3)) == [1]
    assert 3 <= clock.t < 3.2
    (lost,) = b1.lost([0])
    assert lost["rank"] == 0 and "alive but stopped answering" in lost["how"]


def test_how_a_lost_rank_ended(monkeypatch):
    store = dist.HashStore()
    b = _board(store, 0, world=5)
    _record(store, 1, exit_code=3)
    _record(store, 2, signal="SIGKILL")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    b._set("hello/3", {"host": socket.gethostname(), "pid": gone.pid})  # ended here, with no record
    b._set("hello/4", {"host": "another-node", "pid": 1234})
    monkeypatch.setattr(board, "RECORD_S", 0.0)
    told = {e["rank"]: e for e in b.lost([1, 2, 3, 4])}
    assert told[1]["exit_code"] == 3 and told[1]["how"] == "its process exited with code 3"
    assert told[2]["signal"] == "SIGKILL" and "killed by SIGKILL, usually by the out-of-memory killer" in told[2]["how"]
    assert "its process ended; how is not recorded" in told[3]["how"]
    assert "on host another-node" in told[4]["how"] and told[4]["pid"] == 1234


def test_no_store_no_board(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert board.Board.open(0, 2) is None


def test_only_a_torchrun_rank_is_supervised(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert not board.supervisable()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert board.supervisable() == hasattr(os, "fork")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not board.supervisable()


def test_a_store_that_is_gone_leaves_each_rank_its_own_document(monkeypatch):
    class Gone:
        def __getattr__(self, name):
            def fails(*args, **kwargs):
                raise RuntimeError("Connection refused")
            return fails

    clock = FakeClock()
    monkeypatch.setattr(board.time, "sleep", lambda s: setattr(clock, "t", clock.t + s))
    b = board.Board(Gone(), 1, 2, "bisect-pipeline/test/run1", clock=clock)
    b.post({"rank": 1})  # nowhere to post: no error
    assert b.collect(grace=1) == {} and b.writer([1]) == 1
