"""The change under `run --tune` (change.py): the search's best written against the
script where its loader was created, and checked after the change by running the patched
script once, against the search's figure for the setting (the run planted).
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
from typing import Optional

import pytest

from bisect_pipeline.advise import change, edits, patch, tune
from bisect_pipeline.report import text as text_mod
from bisect_pipeline.measure import plan
from bisect_pipeline.core.fixes import Fix
from bisect_pipeline.core.results import AllocatorTiming, Isolated, Measurements, Trial, Tuning, Verification
from conftest import FakeClock
from test_outcome import BS, side
from test_patch_tail import MNIST

SCRIPT = textwrap.dedent('''
    import argparse
    import torch
    parser = argparse.ArgumentParser()
    parser.add_argument("-j", "--workers", type=int, default=0)

    def main():
        args = parser.parse_args()
        loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=args.workers)
        return loader

    if __name__ == "__main__":
        main()
    ''').lstrip()
USER = {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False, "pin_memory": False,
        "torch_num_threads": 2}
BEST = {"num_workers": 1, "persistent_workers": True, "torch_num_threads": 1}


def measured(path: str, *, rate: float = 20.0, mode: str = "loop", isolated=None) -> Measurements:
    """A run whose search found BEST at `rate` steps/s against the user's 10."""
    t = Tuning(status="ok", user=USER, workers=(1, 2), start=1, ceiling_ms_per_batch=50.0, ceiling_rel_se=0.01,
               trials=(Trial.from_dict({"item": "tune", "settings": BEST, "user_windows": side(10.0),
                                        "candidate_windows": side(rate)}),))
    return Measurements(device="cpu", batch_size=BS, points=(), loader={"num_workers": 0, "pin_memory": False},
                        mode=mode, source={"created_at": f"{path}:{line_of_loader()}"}, tune=t, isolated=isolated)


def line_of_loader() -> int:
    return next(i for i, t in enumerate(SCRIPT.splitlines(), 1) if "DataLoader(" in t)


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    return str(tmp_path / "train.py")


def test_the_best_is_written_against_the_line_that_created_the_loader(script):
    m = change.patched(measured(script), ["train.py", "--epochs", "3", "-j", "0"])
    p = m.tune.patch
    assert p["path"] == "train.py" and p["line"] == line_of_loader() and p["flags"] == ["-j", "1"]
    assert p["command"] == "python train.py --epochs 3 -j 1"
    assert "+    torch.set_num_threads(1)\n" in p["diff"] and "num_workers=args.workers, persistent_workers=True)" in p["diff"]
    assert edits.applied(SCRIPT, p["diff"]).count("persistent_workers=True") == 1
    assert open(script).read() == SCRIPT  # the user's file as it was


def test_the_allocator_variables_join_the_change_where_the_report_found_they_help(script):
    held = AllocatorTiming(default_ms_per_batch=41.0, held_ms_per_batch=24.0, real=True)
    m = measured(script, isolated=Isolated(allocator=held))
    assert change.settings_to_write(m) == dict(BEST, env={"MALLOC_MMAP_THRESHOLD_": "33554432",
                                                          "MALLOC_TRIM_THRESHOLD_": "-1"})
    p = change.patched(m, ["train.py"]).tune.patch
    assert p["command"] == "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=-1 python train.py -j 1"


def test_a_script_outside_the_working_directory_is_named_by_its_name_and_applied_there(script, tmp_path,
                                                                                      monkeypatch):
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    p = change.patched(measured(script), ["../train.py"]).tune.patch
    assert p["path"] == "train.py" and p["diff"].startswith("--- a/train.py\n") and p["apply_in"] == str(tmp_path)


def test_no_patch_says_why(script, tmp_path):
    entry = change.patched(measured(script, mode="entry")).tune.patch
    assert entry["reason"].startswith("with --entry the tool does not see where your loader is built")
    gone = change.patched(measured(str(tmp_path / "gone.py"))).tune.patch
    assert gone["reason"].startswith("where the loader was created is not a file the tool can read")
    import torch

    library = change.patched(measured(torch.utils.data.dataloader.__file__)).tune.patch
    assert library["reason"].startswith("the loader was created in an installed library")
    nothing = measured(script, rate=10.0)  # no candidate helps: nothing to write
    assert change.patched(nothing) is nothing and change.settings_to_write(nothing) is None


LOADER = {"num_workers": 1, "persistent_workers": True, "pin_memory": False, "prefetch_factor": 2}


def planted_runs(rate: float, seen: list, loader: dict = LOADER, rounds: int = 3):
    """change.check's runs planted: each a run of the patched copy whose full point gives
    a window a round at `rate` steps/s (+-2% from round to round), its loader `loader`."""
    def run(command, env):
        copy = next((c for c in command if change.COPY_SUFFIX in c), None)
        seen.append((copy, copy is not None and os.path.exists(copy), command, env))
        return [{"steps": 10, "seconds": 10 / (rate * (1 + 0.02 * (r % 3 - 1))), "round": r}
                for r in range(rounds)], loader, None
    return run


def test_the_change_is_checked_in_one_run_of_the_patched_copy_against_the_search_s_figure(script):
    # issue 51: the search measured the setting against yours in this process; one run of
    # the patched script confirms what only it can: its loader built with the change, at
    # the search's speed (it ran four times before, A B B A against the original)
    m = change.patched(measured(script), ["train.py"])
    target = change.Target("train.py", None, ("--epochs", "3"))
    seen: list = []
    checked = change.check(m, target, seconds=5.0, run=planted_runs(19.5, seen))
    assert len(seen) == 1
    copy, there, command, _ = seen[0]
    assert os.path.dirname(copy) == os.path.dirname(script) and there and not os.path.exists(copy)  # gone after
    assert "--no-hold-allocator" not in command  # the allocator held still, as the search held it
    a = checked.tune.applied
    assert a.user_windows == () and {w.visit for w in a.candidate_windows} == {0, 1, 2}
    found = tune.summarize(checked.tune, BS)
    # its speed over yours as the search measured them: 19.5 over 10 steps/s
    assert found.applied.status == "helps" and found.applied.speedup == pytest.approx(1.95, rel=0.01)
    assert found.agrees is True  # 19.5 steps/s against the search's 20 for the setting: within the 5% floor
    slow = change.check(m, target, seconds=5.0, run=planted_runs(12.0, []))
    assert tune.summarize(slow.tune, BS).agrees is False
    text = text_mod.applied_text(found, None)
    assert text.startswith("Checked after the change: your script with it built its loader with the change and ran "
                           "at 51.3 ms per batch, 1.95\u00d7") and "your settings' 100.0 ms in the search" in text
    assert text.endswith("the search measured 50.0 ms per batch with these settings: they agree within the noise.")


def test_the_search_s_figure_holds_the_epochs_pause_the_patched_run_leaves_out(script):
    # the search's visits end their epochs as the loop does (the pause at each epoch's
    # start in their windows), the patched run's windows never hold one: its figure is
    # its windows' time to that plus the pause its run estimated. The search read 50 ms
    # a batch; the patched run 45.5 ms (22 steps/s) in its windows, 10% faster
    m = change.patched(measured(script), ["train.py"])
    target = change.Target("train.py", None, ())
    bare = change.check(m, target, seconds=5.0, run=planted_runs(22.0, [], loader=LOADER))
    assert tune.summarize(bare.tune, BS).agrees is False  # no pause said: beyond the 5% floor
    paused = change.check(m, target, seconds=5.0, run=planted_runs(22.0, [], loader=dict(LOADER, epoch_ms_per_batch=3.0)))
    assert paused.tune.applied.epoch_ms_per_batch == 3.0 and tune.summarize(paused.tune, BS).agrees is True
    # a search slower than the range by more than the noise still differs
    slow = change.check(change.patched(measured(script, rate=15.0), ["train.py"]), target, seconds=5.0,
                        run=planted_runs(22.0, [], loader=dict(LOADER, epoch_ms_per_batch=3.0)))
    assert tune.summarize(slow.tune, BS).agrees is False


def test_a_patched_script_whose_loader_is_not_the_change_fails_the_check(script):
    m = change.patched(measured(script), ["train.py"])
    checked = change.check(m, change.Target("train.py", None, ()), seconds=5.0,
                           run=planted_runs(19.5, [], loader=dict(LOADER, num_workers=0)))
    assert checked.tune.applied.error == ("the patched script: it built its loader with num_workers=0, not 1: the "
                                          "change did not reach the loader it trains on")
    assert tune.summarize(checked.tune, BS).applied.status == "failed"


def test_the_patched_side_runs_with_the_flags_and_the_variables(script):
    command, env = change._command(change.Target("train.py", None, ("-j", "4", "--epochs", "3")),
                                   patch.Patch(flags=("-j", "1"), env={"X_": "1"}, changes=(edits.Change(
                                       "num_workers", 1, "flag", tokens=("-j", "1"), aliases=("-j", "--workers")),)),
                                   "/d/train_bisect_tuned_x.py", 5.0)
    assert command[-5:] == ["/d/train_bisect_tuned_x.py", "--epochs", "3", "-j", "1"] and env["X_"] == "1"
    assert command[command.index("--points") + 1] == "full" and command[command.index("--max-seconds") + 1] == "5"
    module, _ = change._command(change.Target(None, "pkg.train", ("-j", "4")), patch.Patch(), None, 5.0)
    assert module[-4:] == ["-m", "pkg.train", "-j", "4"]


def test_the_check_fits_the_time_left_of_max_seconds(script):
    # the budget kept 12 s for it and the script starts in 4 s: one run measuring 12 - 4
    # - 2 = 6 s, stopped at the end of --max-seconds
    import dataclasses

    from bisect_pipeline.core.results import RunInfo

    m = change.patched(measured(script), ["train.py"])
    m = dataclasses.replace(m, run=RunInfo(startup_s=4.0, budget={"bisecting": 48.0, "patching": 12.0,
                                                                 "patch_runs": 1, "spent": {"bisecting": 20.0}}))
    assert change.fit_runs(m, 12.0) == (None, 6.0, 1)
    why, _, n = change.fit_runs(m, 9.0)  # the search ran over: the run does not fit
    assert n == 0 and why.startswith("out of time: 9 s of --max-seconds were left for it, less than a run of your "
                                     "script needs")
    clock = FakeClock(100.0)
    seen: list = []

    def timed(command, env):
        clock.t += 8.0
        return planted_runs(19.5, seen)(command, env)
    checked = change.check(m, change.Target("train.py", None, ()), end=112.0, clock=clock, run=timed)
    assert len(seen) == 1 and tune.summarize(checked.tune, BS).applied.status == "helps"
    assert checked.run.budget["spent"] == {"bisecting": 20.0, "patching": 8.0}  # where the time went
    late = change.check(m, change.Target("train.py", None, ()), end=108.0, clock=clock,
                        run=lambda c, e: pytest.fail("ran"))
    assert late.tune.applied is None and late.tune.applied_reason.startswith("out of time")
    planned_none = dataclasses.replace(m, run=RunInfo(budget={"bisecting": 30.0, "patch_reason": "too short"}))
    assert change.check(planned_none, change.Target("train.py", None, ()), end=200.0, clock=clock,
                        run=lambda c, e: pytest.fail("ran")).tune.applied_reason == "out of time: too short"


def test_a_run_whose_speed_has_no_spread_is_followed_by_a_second_where_the_time_holds_one(script):
    import dataclasses

    from bisect_pipeline.core.results import RunInfo

    m = change.patched(measured(script), ["train.py"])
    m = dataclasses.replace(m, run=RunInfo(startup_s=1.0, budget={"patching": 30.0, "patch_runs": 1}))
    clock = FakeClock(100.0)
    seen: list = []

    def one_round(command, env):
        clock.t += 10.0
        return planted_runs(19.5, seen, rounds=1)(command, env)
    checked = change.check(m, change.Target("train.py", None, ()), end=130.0, clock=clock, run=one_round)
    assert len(seen) == 2 and {w.visit for w in checked.tune.applied.candidate_windows} == {0, 1}
    assert float(seen[1][2][seen[1][2].index("--max-seconds") + 1]) == pytest.approx(17.0)  # what was left


def test_a_run_past_its_share_is_stopped_and_its_partial_windows_count(tmp_path):
    # a fake `bisect-pipeline run`: writes its windows at SIGTERM, as the real one does
    fake = tmp_path / "fake.py"
    fake.write_text(textwrap.dedent('''
        import json, signal, sys, time
        out = sys.argv[1]
        def term(*a):
            doc = {"points": [{"point": "full", "windows": [{"steps": 5, "seconds": 0.5}] * 2}],
                   "loader": {"num_workers": 1}}
            json.dump(doc, open(out, "w"))
            sys.exit(143)
        signal.signal(signal.SIGTERM, term)
        time.sleep(60)
        '''))
    import sys
    import time

    t0 = time.monotonic()
    windows, loader, error = change.run_once([sys.executable, str(fake), "{json}"], dict(os.environ), limit=1.0)
    assert error is None and len(windows) == 2 and time.monotonic() - t0 < 10
    assert loader == {"num_workers": 1, "epoch_ms_per_batch": None}


def test_a_change_that_cannot_be_run_from_a_copy_is_not_checked(script, tmp_path):
    m = change.patched(measured(script), ["train.py"])
    elsewhere = change.check(m, change.Target(str(tmp_path / "other.py"), None, ()), seconds=5.0,
                             run=lambda c, e: pytest.fail("ran"))
    assert elsewhere.tune.applied is None and "not in the script run" in elsewhere.tune.applied_reason
    failing = change.check(m, change.Target("train.py", None, ()), seconds=5.0,
                           run=lambda c, e: ([], None, "exit 1: Traceback"))
    assert failing.tune.applied.error == "the patched script: exit 1: Traceback"
    assert tune.summarize(failing.tune, BS).applied.status == "failed"


# --- the device tail in the change (tune.written) ------------------------------------------

TAIL_FIX = Fix(kind="device_tail", status="ok", moved=("ToTensor's scaling", "Normalize"), kept=("PILToTensor",),
               path="[0]", matches=True)


def tail_trial(rate: float, base: Optional[dict] = None, user: float = 10.0) -> Trial:
    """The advice's check's trial of the device tail: `rate` steps/s against `user`'s (the
    user's settings, or `base`: the workers item's, which the tail is measured on top of)."""
    return Trial.from_dict({"item": "device_tail", "settings": {**(base or {}), "fix": "device_tail"},
                            "user_windows": side(user), "candidate_windows": side(rate), "base": base})


def with_tail(path: str, *trials: Trial, rate: float = 20.0) -> Measurements:
    """The MNIST example's shape (test_patch_tail.MNIST), its search's best BEST at `rate`
    (None: nothing beat yours), the tail's trials `trials` in the advice's check."""
    searched = measured(path, rate=rate or 10.0)
    line = next(i for i, t in enumerate(MNIST.splitlines(), 1) if "DataLoader(dataset1" in t)
    return dataclasses.replace(searched, source={"created_at": f"{path}:{line}"},
                               verification=Verification(status="ok", trials=trials, fixes=(TAIL_FIX,)))


@pytest.fixture
def mnist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "main.py").write_text(MNIST)
    return str(tmp_path / "main.py")


def checked(m: Measurements, rate: float) -> tuple:
    """The change written and checked: the patched run planted at `rate` steps/s."""
    m = change.patched(m, ["main.py"])
    done = change.check(m, change.Target("main.py", None, ()), seconds=5.0, run=planted_runs(rate, []))
    return m.tune.patch, tune.summarize(done.tune, BS, checks=change.checks(done))


def test_the_tail_measured_on_top_of_the_best_goes_with_it_and_is_checked_against_that_figure(mnist):
    # the tail on top of BEST: 25 steps/s against BEST's 20, as the check measured it
    m = with_tail(mnist, tail_trial(12.0), tail_trial(25.0, base=BEST, user=20.0))
    assert change.settings_to_write(m) == dict(BEST, fix="device_tail")
    p, found = checked(m, 24.5)
    after = edits.applied(MNIST, p["diff"])
    assert "transforms.PILToTensor()\n        ])" in after and "num_workers=1, persistent_workers=True" in after
    assert after.count("device_tail(data.to(device))") == 2 and "torch.set_num_threads(1)" in after
    assert found.applied.speedup == pytest.approx(2.45, rel=0.01) and found.agrees is True and found.whole
    assert "on top of these by the advice's check: 1.25\u00d7" in found.summary
    text = text_mod.applied_text(found, None)
    assert ("the advice's check measured 40.0 ms per batch with the transforms' tail run batched on the device with "
            "num_workers=1, persistent_workers=True, torch_num_threads=1, on top of the settings: they agree within "
            "the noise.") in text
    # the settings' own speed is not what the change holds: beyond the noise of the tail's figure
    assert checked(m, 20.0)[1].agrees is False


def test_the_tail_alone_where_the_search_found_nothing(mnist):
    m = with_tail(mnist, tail_trial(13.0), rate=None)
    assert change.settings_to_write(m) == {"fix": "device_tail"}
    p, found = checked(m, 13.0)
    assert [c["setting"] for c in p["changes"]] == ["device_tail"] and "'num_workers'" not in p["diff"]
    assert found.best is None and found.agrees is True and found.applied.speedup == pytest.approx(1.3, rel=0.01)
    assert "The change is the transforms' tail run batched on the device, which the advice's check measured at " \
           "1.30\u00d7" in found.summary
    assert "the advice's check measured 76.9 ms per batch with the transforms' tail run batched on the device: they " \
           "agree" in text_mod.applied_text(found, None)


def test_a_tail_that_did_not_help_is_not_written(mnist):
    assert change.settings_to_write(with_tail(mnist, tail_trial(10.0), rate=None)) is None
    # it helps on your settings, not on top of the best's: the settings alone
    on_top = with_tail(mnist, tail_trial(13.0), tail_trial(20.0, base=BEST, user=20.0))
    assert change.settings_to_write(on_top) == BEST
    p, found = checked(on_top, 20.0)
    assert "device_tail" not in p["diff"] and found.compared.startswith("the search measured 50.0 ms per batch")


def test_a_tail_not_measured_on_top_of_the_best_is_compared_with_the_settings_figure_said_so(mnist):
    m = with_tail(mnist, tail_trial(13.0))  # the workers item did not help: nothing measured on top
    assert change.settings_to_write(m) == dict(BEST, fix="device_tail")
    p, found = checked(m, 26.0)  # faster than the settings' figure: what the tail adds
    assert "device_tail(data.to(device))" in p["diff"] and not found.whole and found.agrees is True
    text = text_mod.applied_text(found, None)
    assert "compared with the search's 50.0 ms per batch for the settings alone, since the advice's check did not " \
           "measure the transforms' tail run batched on the device on top of them" in text and text.endswith(
               ": it is not slower beyond the noise.")
    assert checked(m, 15.0)[1].agrees is False  # slower than the settings' figure beyond the noise


def test_a_tail_the_script_cannot_take_leaves_the_settings_checked(script):
    # SCRIPT has no Compose list: the settings are written and checked alone, the tail said
    m = dataclasses.replace(measured(script), verification=Verification(status="ok", trials=(tail_trial(13.0),),
                                                                        fixes=(TAIL_FIX,)))
    m = change.patched(m, ["train.py"])
    p = m.tune.patch
    assert p["flags"] == ["-j", "1"] and "device_tail" not in p["diff"] and not p.get("reason")
    (why,) = [c for c in p["changes"] if c["setting"] == "device_tail"]
    assert why["how"] == "not applied" and why["text"].startswith(
        "the transforms' tail run batched on the device is not in the diff: no Compose([...]) list")
    target = change.Target("train.py", None, ())
    done = change.check(m, target, seconds=5.0, run=planted_runs(19.5, []))
    assert "fix" not in done.tune.applied.settings
    found = tune.summarize(done.tune, BS, checks=change.checks(done))
    assert found.agrees is True and found.whole and found.compared.startswith("the search measured 50.0 ms")


# --- end to end ---------------------------------------------------------------------------------

TUNED = textwrap.dedent('''
    import argparse
    from torch import nn
    from torch.utils.data import DataLoader

    def main():
        ap = argparse.ArgumentParser()
        ap.add_argument("-j", "--workers", type=int, default=0)
        args = ap.parse_args()
        torch.set_num_threads(1)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        train = DataLoader(Data(320, 4.0), batch_size=8, shuffle=True, num_workers=args.workers)
        for epoch in range(1000):
            for x, y in train:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()

    if __name__ == "__main__":
        main()
    ''')


@pytest.mark.e2e
def test_run_tune_patch_gives_the_flag_and_checks_the_change(tmp_path, monkeypatch):
    # augment sleeps 4 ms a sample (32 ms a batch of 8): workers from the script's own -j
    from conftest import PLANTED_DATA, cli_in_process

    # the check's run pays python's and torch's start, about 8 s here, which a run in this
    # process does not measure as its own start-up (conftest.cli_in_process)
    monkeypatch.setattr(plan, "PATCH_RUN_MARGIN_S", 7.0)
    monkeypatch.setattr(plan, "PATCH_MAX_SHARE", 0.9)
    monkeypatch.setattr(change, "PATCH_RUN_MARGIN_S", 7.0)
    monkeypatch.setattr(change, "PATCH_RUN_LEAST_S", 1.0)
    monkeypatch.setattr(plan, "PATCH_RUN_LEAST_S", 2.0)
    source = PLANTED_DATA + TUNED
    (tmp_path / "train.py").write_text(source)
    ran = cli_in_process("run", "--tune", "--patch", "p.diff", "--json", "r.json", "--max-seconds", "60",
                         "train.py", "-j", "0", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    import json

    doc = json.loads((tmp_path / "r.json").read_text())["tune"]
    best = doc["best"]["settings"]
    assert best["num_workers"] >= 1 and doc["patch"]["flags"] == ["-j", str(best["num_workers"])]
    assert doc["patch"]["command"].startswith(f"python train.py -j {best['num_workers']}")
    assert "applied" in doc, (doc.get("applied_reason"), ran.stderr[-1500:])
    applied = doc["applied"]
    assert not applied.get("user_windows") and len({w["visit"] for w in applied["candidate_windows"]}) >= 2
    assert doc["applied_outcome"]["status"] == "helps"
    assert "Checked after the change: your script with it built its loader with the change" in ran.stderr
    assert (tmp_path / "train.py").read_text() == source
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.diff", "r.json", "train.py"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "train.py"]


def test_patch_without_tune_and_tune_with_sweep_are_usage_errors(tmp_path):
    from conftest import cli_in_process

    (tmp_path / "train.py").write_text("")
    ran = cli_in_process("run", "--patch", "p.diff", "train.py", cwd=tmp_path)
    assert ran.returncode == 2 and "--patch writes the change the search of --tune finds: give --tune too" in ran.stderr
    ran = cli_in_process("demo", "--tune", "--sweep", "num_workers=0,1", cwd=tmp_path)
    assert ran.returncode == 2 and "--sweep and --tune" in ran.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
