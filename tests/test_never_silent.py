"""Never silent: a loop that takes optimizer steps over nothing the tool can cache is
told at its first step what it iterates and how long the tool waits, and after
--max-seconds of its loop is stopped (or let train on) with one paragraph that names
what it iterates. On a fake clock (loop.Session's), and once for real (a script)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch

from bisect_pipeline import loop_target
from bisect_pipeline.loop import Session
from bisect_pipeline.loop_end import ScriptStopped
from conftest import FakeClock


def batches(n, features=3):
    for _ in range(n):
        yield torch.randn(4, features), torch.randint(0, 2, (4,))


def train(clock, steps=50, per_step=1.0):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    done = 0
    for x, y in batches(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        clock.t += per_step
        done += 1
    return done


def test_the_loop_is_told_after_a_tenth_of_max_seconds_and_stopped_after_all_of_it():
    clock, events, stopped = FakeClock(100.0), [], []
    with Session(max_seconds=5, clock=clock, progress=events.append) as s:  # (it ends the with block, as a script)
        try:
            train(clock)
        except ScriptStopped:
            stopped.append(True)
            raise
    assert stopped
    waiting = [e["message"] for e in events if e["event"] == "waiting"]
    assert len(waiting) == 1 and "waits 5 s (--max-seconds)" in waiting[0]  # (said at the 2nd step: 1 s >= 0.5)
    assert "test_never_silent.py" in waiting[0] and "batches" in waiting[0]
    assert clock.t == 105.0  # stopped at the step 5 s after the first: the 6th
    msg = s.gave_up
    assert msg.startswith("no training loader after 5 s of your loop (--max-seconds 5, from its first optimizer step)")
    assert "`for x, y in batches(steps):`" in msg and "a generator, batches(...) (batches, defined at" in msg
    assert "not a torch DataLoader or a torchdata.nodes Loader" in msg and "The script is stopped" in msg
    assert s.report is not None and s.report.measurements.source["ended"]["no_loader"] == msg  # the partial JSON


def test_with_keep_training_the_loop_trains_on_after_the_paragraph():
    clock, events = FakeClock(), []
    with Session(max_seconds=3, clock=clock, progress=events.append, keep_training=True) as s:
        assert train(clock, steps=20) == 20
    assert s.gave_up.endswith("It trains on (--keep-training).")
    assert [e["event"] for e in events] == ["waiting", "waiting"]  # the wait, then the paragraph


def test_a_loop_that_finds_its_loader_in_time_is_never_stopped():
    from bisect_pipeline.testing import planted

    clock = FakeClock()
    model, loader = planted("augment", n=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Session(max_seconds=1000, clock=clock, verify_seconds=0) as s:
        for _ in train_steps(model, opt, batches(3, features=16), clock):  # a warm-up on other data first
            pass
        clock.t += 500
        for x, y in loader:  # then the loader: chosen at its first step
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            break
        assert s.chosen is loader and s.gave_up is None


def train_steps(model, opt, data, clock):
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        clock.t += 1
        yield


class Holder:
    def __init__(self):
        self.loader = [1, 2, 3]


def _found():
    return loop_target.find(sys._getframe(1), lambda f: True, lambda obj: None)


def test_the_loop_target_is_read_from_the_for_statement_around_the_step():
    holder = Holder()
    for i, item in enumerate(holder.loader):
        t = _found()
        break
    assert t.obj is holder.loader and t.line == "for i, item in enumerate(holder.loader):"
    assert t.what == "a list (holder.loader)"
    gen = (x for x in range(3))
    for x in gen:
        t = _found()
        break
    assert t.what.startswith("a generator (") and "<genexpr>, defined at" in t.what
    assert "not a torch DataLoader" in t.why


def test_a_loop_that_takes_batches_but_no_optimizer_step_is_told_after_a_share_and_names_the_loader():
    """pytorch/data's nodes imagenet_benchmark.py: `it = iter(loader)` then `next(it)` in
    a `for i in range(...)`, no optimizer: the loader is named, with --loader 1."""
    import torchdata.nodes as tn

    clock, events = FakeClock(), []
    with Session(max_seconds=10, clock=clock, progress=events.append) as s:
        loader = tn.Loader(tn.Batcher(tn.IterableWrapper(list(range(10 ** 6))), 4))
        it = iter(loader)
        for i in range(100):
            next(it)
            clock.t += 0.5
    assert clock.t == 10.0  # stopped at the batch 10 s after the first
    waiting = [e["message"] for e in events if e["event"] == "waiting"]
    assert len(waiting) == 1 and "takes batches of a torchdata.nodes.Loader created at" in waiting[0]
    assert "but no optimizer step" in waiting[0]
    msg = s.gave_up
    assert "from its first batch" in msg and "`next(it)`" in msg and "--loader 1" in msg
    assert "there is no training step to measure" in msg


def test_a_loader_iterated_but_not_chosen_is_named_with_how_to_choose_it():
    loader = torch.utils.data.DataLoader(list(range(4)))
    for _ in loader:
        t = _found()
        break
    assert t.what.startswith("a torch.utils.data.dataloader.DataLoader") and "--loader N" in t.why


@pytest.mark.e2e
def test_a_script_over_a_generator_exits_1_within_max_seconds_with_the_paragraph(tmp_path):
    (tmp_path / "gen.py").write_text(textwrap.dedent('''
        import time, torch
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def stream():
            while True:
                time.sleep(0.005)
                yield torch.randn(8, 4), torch.randint(0, 2, (8,))

        for x, y in stream():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        '''))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bisect_pipeline", "run", "--max-seconds", "2", "--json", "out.json",
                        "gen.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert "waiting for a training loader" in r.stderr
    assert "no training loader after 2 s of your loop" in r.stderr
    assert "gen.py:11: `for x, y in stream():`" in r.stderr and "a generator, stream(...)" in r.stderr
    assert wall < 60  # the script alone would never end (start-up is the rest)
    assert (tmp_path / "out.json").exists()
