"""The user's own loop as the step (loop.py, script.py): which loader is chosen, epochs,
pauses, and scripts run unchanged with `bisect-pipeline run`.

The choosing and the epochs are tested with the experiment stubbed out (no clock); the
e2e tests run planted scripts whose augmentation costs many times everything else."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from bisect_pipeline import script as script_mod
from bisect_pipeline import loop_loaders, loop_patches
from bisect_pipeline.core.errors import BisectError
from bisect_pipeline.loop import Session, watching
from bisect_pipeline.loop_end import ScriptStopped
from conftest import FAST_PLAN, PLANTED_DATA, PlantedDataset, Sleep, assert_names, make_loader, tiny_model


def test_the_command_line_after_the_options_is_the_script_and_its_own_arguments(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("")
    assert script_mod.target_of((str(train), "--epochs", "3", "--json", "x")) == (str(train), None,
                                                                                 ["--epochs", "3", "--json", "x"])
    assert script_mod.target_of(("-m", "pkg.train", "--lr", "0.1")) == (None, "pkg.train", ["--lr", "0.1"])
    for bad, match in (((), "give the script"), (("-m",), "needs a module"), (("--nope", "x.py"), "before the script"),
                       ((str(tmp_path / "missing.py"),), "no script")):
        with pytest.raises(BisectError, match=match):
            script_mod.target_of(bad)


# --- which loader, and its epochs, with the experiment stubbed out -----------------------------


def loop(loaders: dict, seen: list, epochs: int = 2, steps_on: str = "train", every: int = 1) -> None:
    """A training loop over `loaders` (name -> loader, or name -> a function that builds
    it anew every epoch): an optimizer step every `every` batches of `steps_on`, the
    others iterated under no_grad; `seen` gets (epoch, name, batch) for every batch."""
    model = tiny_model(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(epochs):
        for name, loader in loaders.items():
            loader = loader() if callable(loader) else loader
            grad = name == steps_on
            with torch.set_grad_enabled(grad):
                for i, batch in enumerate(loader):
                    seen.append((epoch, name, batch))
                    if grad:
                        model(batch[0]).sum().backward()
                        if (i + 1) % every == 0:
                            opt.step()


class Stubbed(Session):
    """A session whose experiment hands out batches of zeros without measuring, and stops
    the loop after 30."""

    handed = 0

    def next_batch(self):
        self.state = "measuring"
        self.handed += 1
        if self.handed > 30:
            raise ScriptStopped()
        return (torch.zeros(8, 16), torch.zeros(8, dtype=torch.long))


def test_the_loader_the_optimizer_steps_on_is_chosen_not_the_evaluation_one():
    val = make_loader(PlantedDataset(n=16), batch_size=8)
    train = make_loader(PlantedDataset(n=40), batch_size=8)
    seen: list = []
    with Stubbed() as s:
        loop({"val": val, "train": train}, seen, epochs=20, every=2)  # gradient accumulation: a step every 2 batches
    assert s.chosen is train and [x.index for x in s.seen] == [1, 2]
    assert not s.seen[0].with_grad  # validation: seen, never chosen
    # every batch a loader's iterators handed the loop is counted: its own, the experiment's,
    # and a loader's iterated after the training loader was chosen
    val_batches = sum(1 for _, name, _ in seen if name == "val")
    assert val_batches > 2 and s.seen[0].batches == val_batches
    assert s.seen[1].batches == sum(1 for _, name, _ in seen if name == "train") == 32  # 2 its own, 30 the experiment's
    # the loader's own batches until the optimizer steps, then the experiment's (zeros)
    train_batches = [b for _, name, b in seen if name == "train"]
    assert [bool(b[0].abs().sum()) for b in train_batches[:4]] == [True, True, False, False]
    # an epoch of the train loader has len(loader) batches, the experiment's included
    per_epoch = [sum(1 for e, name, _ in seen if name == "train" and e == epoch) for epoch in range(5)]
    assert per_epoch == [5, 5, 5, 5, 5]


def build(dataset, batch_size):
    """A helper that makes every loader of the script at one line (train and val)."""
    return make_loader(dataset, batch_size=batch_size)


def rebuilt(dataset):
    """A loader built anew every epoch, by the one helper line (`build`)."""
    return lambda: build(dataset, 8)


def test_a_training_loader_built_anew_every_epoch_goes_on_with_the_experiment():
    # before: the second epoch's loader was "another loader", the experiment never got a
    # request again, and `run` said the script ended after one epoch
    seen: list = []
    with Stubbed() as s:
        loop({"train": rebuilt(PlantedDataset(n=40))}, seen, epochs=20)
    assert s.handed > 30  # the experiment's batches went on to the stop
    assert [x.index for x in s.seen] == [1] and s.seen[0].rebuilt >= 5  # one loader, built anew each epoch
    assert s.seen[0].batches == len(seen)
    assert [sum(1 for e, _, _ in seen if e == epoch) for epoch in range(6)] == [5] * 6  # len(loader) an epoch
    # an epoch built anew starts with its own batch, until the optimizer steps on it
    firsts = [b for i, (e, _, b) in enumerate(seen) if i and seen[i - 1][0] != e]
    assert firsts and all(bool(b[0].abs().sum()) for b in firsts)
    assert s.source()["rebuilt"] == s.seen[0].rebuilt


@pytest.mark.parametrize("val_n", [16, 40])  # a shorter evaluation set, and one as long as the training set
def test_an_evaluation_loader_from_the_same_helper_is_never_taken_for_the_training_one(val_n):
    seen: list = []
    with Stubbed() as s:
        loop({"train": rebuilt(PlantedDataset(n=40)), "val": rebuilt(PlantedDataset(n=val_n))}, seen, epochs=20)
    assert s.handed > 30 and s.seen[0].rebuilt >= 5
    val = [b for _, name, b in seen if name == "val"]
    assert val and all(bool(b[0].abs().sum()) for b in val)  # its own batches, never the experiment's zeros
    assert sum(x.batches for x in s.seen[1:]) == len(val)  # each evaluation loader counted as its own


class _RepeatSampler:
    """timm.data.loader's: the batch sampler repeated forever (no length)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class MultiEpochs(torch.utils.data.DataLoader):
    """timm's MultiEpochsDataLoader (--use-multi-epochs-loader): one iterator over an
    endless batch sampler, made in __init__, and len(self) batches of it per epoch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._DataLoader__initialized = False
        self.batch_sampler = _RepeatSampler(self.batch_sampler)
        self._DataLoader__initialized = True
        self.iterator = super().__iter__()

    def __len__(self):
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


def test_a_loader_whose_one_iterator_spans_every_epoch_gets_its_epochs_from_itself():
    # the iterator made once in __init__ (a LoopIterator while the session is open) never
    # ends an epoch of its own: the loader's __iter__ does, after len(self) batches. An end
    # at len(loader) raised StopIteration inside that generator (RuntimeError in timm's
    # train.py --use-multi-epochs-loader after its first epoch)
    seen: list = []
    with Stubbed() as s:
        train = MultiEpochs(PlantedDataset(n=40), batch_size=8)
        loop({"train": train}, seen, epochs=20)
    assert s.chosen is train and s.handed > 30  # the experiment's batches until it stopped the loop
    per_epoch = [sum(1 for e, _, _ in seen if e == epoch) for epoch in range(6)]
    assert per_epoch == [5, 5, 5, 5, 5, 5]


def test_loader_n_picks_another_loader():
    a = make_loader(PlantedDataset(n=16), batch_size=8)
    b = make_loader(PlantedDataset(n=16), batch_size=8)
    with Stubbed(loader=2) as s:
        loop({"a": a, "b": b}, [], epochs=20, steps_on="a")
    assert s.chosen is b
    with pytest.raises(BisectError, match="from 1"):
        Session(loader=0)


def test_another_loader_between_two_requests_voids_the_window_under_way():
    voids = []

    class Visit:
        def void(self):
            voids.append(1)

    val = make_loader(PlantedDataset(n=16), batch_size=8)
    train = make_loader(PlantedDataset(n=24), batch_size=8)
    with Stubbed() as s:
        s.visit = Visit()
        loop({"train": train, "val": val}, [], epochs=20)
    # each epoch of the experiment: its end, then the validation loader: two pauses
    assert len(voids) >= 2 * 8


def test_the_patches_come_off_when_the_session_closes():
    from torch.utils.data import DataLoader

    before = (DataLoader.__init__, DataLoader.__iter__)
    with Stubbed():
        assert DataLoader.__iter__ is not before[1]
    assert (DataLoader.__init__, DataLoader.__iter__) == before and not loop_patches.SESSIONS


# --- end to end: planted scripts ----------------------------------------------------------------

PLANTED = PLANTED_DATA + textwrap.dedent('''
    import argparse, sys
    from torch import nn
    from torch.utils.data import DataLoader

    def main():
        ap = argparse.ArgumentParser()
        ap.add_argument("--epochs", type=int, default=100)
        ap.add_argument("--raise-after", type=int, default=0)
        ap.add_argument("--exit-after", type=int, default=0)
        args = ap.parse_args()
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        train = DataLoader(Data(320, 4.0), batch_size=8, shuffle=True)  # augment: 8 x 4 ms a batch
        val = DataLoader(Data(32, 0.0), batch_size=8)
        steps = 0
        try:
            for epoch in range(args.epochs):
                for i, (x, y) in enumerate(train):
                    loss = nn.functional.cross_entropy(model(x), y) / 2
                    loss.backward()
                    if i % 2 == 1:  # gradient accumulation
                        opt.step()
                        opt.zero_grad()
                    seen = loss.item()  # a metric read every step
                    steps += 1
                    if steps == args.raise_after:
                        raise ValueError("planted failure in the training loop")
                    if steps == args.exit_after:
                        sys.exit(3)
                    if steps % 25 == 0:  # validation every 25 steps, inside an epoch
                        with torch.no_grad():
                            for vx, vy in val:
                                model(vx)
                with torch.no_grad():  # and every epoch
                    for x, y in val:
                        model(x)
                time.sleep(0.05)  # and a checkpoint
                print(f"epoch {epoch} loss {seen:.3f}", flush=True)
        finally:
            print("finally ran", flush=True)
        print("done")

    if __name__ == "__main__":
        main()
''')


class Ran:
    """A command's exit status and output, as subprocess.run gives them."""

    def __init__(self, result) -> None:
        self.returncode, self.stdout, self.stderr = result.exit_code, result.stdout, result.stderr


def run_cli(tmp_path, *args):
    """`bisect-pipeline run --json r.json ARGS` in this process (click's runner, from
    tmp_path): the script runs here as it would in a fresh interpreter, without one."""
    from click.testing import CliRunner

    from bisect_pipeline.cli import main

    (tmp_path / "planted.py").write_text(PLANTED)
    out = tmp_path / "r.json"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(main, ["run", "--json", str(out), *args])
    finally:
        os.chdir(cwd)
    doc = json.loads(out.read_text()) if out.exists() else None
    return Ran(result), doc


@pytest.mark.e2e
def test_a_script_runs_unchanged_and_its_own_loop_is_the_step(tmp_path):
    # (the advice's check in a loop: test_watching_in_python_keeps_training...)
    proc, doc = run_cli(tmp_path, "--max-seconds", "30", "--verify-seconds", "0", "planted.py", "--epochs", "100")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert doc["mode"] == "loop"
    assert_names(doc, "augment")
    src = doc["source"]
    assert src["index"] == 1 and src["dataset"] == "Data" and src["batch_size"] == 8
    line = next(i for i, ln in enumerate(PLANTED.splitlines(), 1) if "train = DataLoader(" in ln)
    assert src["created_at"].endswith(f"planted.py:{line}")  # where the script builds its train loader
    assert [x["index"] for x in src["loaders"]] == [1, 2]  # the validation loader seen, not chosen
    # the validation passes and checkpoints paused the loop: out of every window, counted, and said
    pauses = sum(p["pauses"] for p in doc["points"])
    assert pauses >= 4 and sum(p["paused_seconds"] for p in doc["points"]) >= 0.05 * pauses / 4
    assert sum(p["discarded_windows"] for p in doc["points"]) >= 1  # the ones inside an epoch hit windows
    assert any(n["kind"] == "paused" for n in doc["notes"])
    aug = next(s for s in doc["stages"] if s["stage"] == "augment")
    assert 20 <= aug["ms_per_batch"] <= 80, aug  # 8 x 4 ms planted, sleeps run long
    # stopped cleanly at the verdict: its finally ran, it did not reach the end
    assert "finally ran" in proc.stdout and "done" not in proc.stdout
    assert "Bottleneck: augment" in proc.stderr or "Inconclusive" in proc.stderr  # the report on stderr
    assert "your training loop was the step" in proc.stderr


@pytest.mark.e2e
def test_a_script_that_raises_shows_its_own_traceback_and_writes_the_partial_report(tmp_path):
    proc, doc = run_cli(tmp_path, "--max-seconds", "30", "--verify-seconds", "0", "planted.py", "--raise-after", "60")
    assert proc.returncode == 1
    assert "ValueError: planted failure in the training loop" in proc.stderr
    tb = proc.stderr[proc.stderr.index("Traceback"):]
    assert 'planted.py", line' in tb and "runpy" not in tb and "bisect_pipeline" not in tb
    assert doc is not None and doc["mode"] == "loop" and not doc["complete"]
    assert "finally ran" in proc.stdout


@pytest.mark.e2e
def test_a_script_that_never_iterates_a_loader_or_ends_early_says_what_it_saw(tmp_path):
    (tmp_path / "noloader.py").write_text("import torch\nprint('no loader here')\n")
    proc, doc = run_cli(tmp_path, "noloader.py")
    assert proc.returncode == 1 and "iterated no DataLoader" in proc.stderr, proc.stderr
    assert doc["bottleneck"] is None and "iterated no DataLoader" in doc["source"]["ended"]["no_loader"]
    proc, doc = run_cli(tmp_path, "--max-seconds", "30", "planted.py", "--exit-after", "50")
    assert proc.returncode == 1 and "exited (sys.exit(3))" in proc.stderr, proc.stderr
    assert doc is not None and doc["bottleneck"] is None and "finally ran" in proc.stdout
    assert doc["source"]["ended"]["how"] == "exit" and doc["source"]["ended"]["detail"] == "sys.exit(3)"


@pytest.mark.e2e
def test_sigterm_writes_the_partial_report_and_leaves_no_worker(tmp_path):
    import psutil

    (tmp_path / "planted.py").write_text(PLANTED.replace("shuffle=True)", "shuffle=True, num_workers=2)"))
    out = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "bisect_pipeline", "run", "--json", str(out), "--max-seconds", "60",
                             "planted.py"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # the progress lines: into the points, with the replay loaders' workers up
        if "measuring raw" in line:
            break
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    doc = json.loads(out.read_text())
    assert doc["interrupted"] and doc["mode"] == "loop" and doc["bottleneck"] is None
    assert not [p for p in psutil.process_iter(["ppid"]) if p.info["ppid"] == proc.pid]


@pytest.mark.e2e
def test_watching_in_python_keeps_training_on_the_real_loader_after_the_verdict(no_leftover_workers):
    model = tiny_model(2.0)
    loader = make_loader(PlantedDataset(n=160, transform=Sleep(4.0)), batch_size=8, num_workers=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    after = []
    with watching(max_seconds=25, keep_training=True, plan=FAST_PLAN, verify_seconds=4) as s:
        for epoch in range(200):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                if s.report is not None:
                    after.append(x)
            if len(after) > 2 * len(loader):
                break
    assert_names(s.report, "augment")
    assert s.report.measurements.mode == "loop"
    assert s.report.verification.status in ("ok", "out of time")  # the advice's check, in the loop too
    assert len(after) > 2 * len(loader)  # the loop went on, with real batches
    assert not loop_patches.SESSIONS


@pytest.mark.e2e
def test_a_loop_that_changes_its_batch_in_place_is_told_so_in_one_line(no_leftover_workers):
    model = tiny_model(1.0)
    loader = make_loader(PlantedDataset(n=64), batch_size=8, num_workers=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watching(max_seconds=6, plan=FAST_PLAN, verify_seconds=0) as s:
        for epoch in range(1000):
            for x, y in loader:
                x.mul_(0.5)  # the batch it is handed, changed
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    (note,) = [n for n in s.report.notes if n.kind == "step"]
    assert note.message == "Your loop changes its input batch in place: leave the batch as it is given."
    assert "fresh copy" in note.detail


def test_created_at_is_the_user_s_line_for_a_library_subclass_and_a_subclass_of_their_own():
    monai = pytest.importorskip("monai.data")

    class Mine(torch.utils.data.DataLoader):  # the user's own subclass: where it is instantiated counts
        def __init__(self, dataset, **kw):
            super().__init__(dataset, **kw)

    with Stubbed() as s:
        here = sys._getframe().f_lineno
        library = monai.DataLoader(PlantedDataset(n=16), batch_size=8)  # its super().__init__ is in site-packages
        mine = Mine(PlantedDataset(n=16), batch_size=4)
        for loader in (library, mine):
            next(iter(loader))
    created = [x.created_at for x in s.seen]
    assert created == [f"{os.path.abspath(__file__)}:{here + 1}", f"{os.path.abspath(__file__)}:{here + 2}"], created


def test_a_loop_that_evaluates_every_k_steps_gets_windows_that_end_before_it():
    c = loop_loaders.Cadence()
    for _ in range(7):
        c.handed()
    c.paused()  # the experiment started mid-way: a first gap of 7
    assert c.room() is None
    for _ in range(20):
        c.handed()
    c.paused()
    c.paused()  # two loaders in one pause count once
    assert c.room() is None  # 7 then 20: no cadence yet
    for _ in range(20):
        c.handed()
    c.paused()
    assert c.room() == 20  # two gaps of 20: the next pause in 20 batches, this one included
    for _ in range(15):
        c.handed()
    assert c.room() == 5
    for _ in range(5):
        c.handed()
    assert c.room() is None and c.gaps == []  # due, and it did not come: no prediction


def test_the_room_is_the_nearer_of_the_epoch_s_end_and_the_next_evaluation():
    train = make_loader(PlantedDataset(n=80), batch_size=8)  # 10 batches an epoch
    with Stubbed() as s:
        it = iter(train)
        s.epoch = it
        it.served = 4
        assert s._room() == 6  # no cadence: the epoch's end
        s.cadence.gaps, s.cadence.since = [3, 3], 1
        assert s._room() == 2  # the evaluation comes first
        s.cadence.gaps = [30, 30]
        assert s._room() == 6
