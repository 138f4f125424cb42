"""The device path (issue 13): devices checked up front, every accelerator synchronised,
the optimizer's state moved with the model, custom batches moved non_blocking, copies that
keep pinning, bad input refused with exit 2 and the user's state untouched. What needs a
GPU runs on CUDA only (skipped here without one) and in scripts/gpu_check.py."""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
from torch import nn

from bisect_pipeline import BisectError, bisect
from bisect_pipeline.measure import devices
from bisect_pipeline.core import tree
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.measure.experiment import Experiment
from bisect_pipeline.measure.sources import host_batches
from bisect_pipeline.measure.plan import Plan
from conftest import planted

CUDA = torch.cuda.is_available()


# ---------------------------------------------------------------- devices


@pytest.mark.parametrize("name", ["mps", "xpu"])
def test_an_accelerator_torch_does_not_see_is_refused(name, monkeypatch):
    monkeypatch.setattr(devices, "_accelerator", lambda: None)
    with pytest.raises(BisectError, match=f"device '{name}' is not available here"):
        devices.resolve(name)


def test_an_accelerator_torch_sees_is_synchronised_through_torch_accelerator(monkeypatch):
    calls = []
    monkeypatch.setattr(devices, "_accelerator", lambda: "xpu")
    monkeypatch.setattr(torch, "accelerator", type("A", (), {"synchronize": staticmethod(calls.append)}), raising=False)
    dev = devices.resolve("xpu")
    devices.synchronizer(dev)()
    assert dev.type == "xpu" and calls == [dev]


def test_a_cuda_index_the_machine_does_not_have_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(BisectError, match=r"device 'cuda:5': this machine has 1 CUDA device\(s\), cuda:0 to cuda:0"):
        devices.resolve("cuda:5")


def test_bad_devices_exit_2_with_one_line_and_leave_the_model_alone(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from bisect_pipeline.cli import main

    entry = tmp_path / "e.py"
    entry.write_text("from conftest import planted\n\ndef make():\n    return planted('augment', 0)\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    for dev in ("xpu", "cuda:5", "meta"):
        r = CliRunner().invoke(main, ["--entry", f"{entry}:make", "--device", dev])
        assert r.exit_code == 2, (dev, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_a_model_on_the_meta_device_is_a_clear_error_and_changes_nothing():
    _, loader = planted("augment", 0)
    with torch.device("meta"):
        model = nn.Linear(16, 4)
    with pytest.raises(BisectError, match="meta device"):
        bisect(model, loader)
    assert model.weight.is_meta  # untouched


# ---------------------------------------------------------------- transfers and copies


def test_only_the_batches_used_are_pinned(monkeypatch):
    from torch.utils.data._utils import pin_memory as pm

    pinned = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(pm, "pin_memory", lambda b: pinned.append(b) or b)
    _, loader = planted("augment", 0)
    spec = describe(torch.utils.data.DataLoader(loader.dataset, batch_size=8, pin_memory=True))
    caches = type("C", (), {"batches": [torch.zeros(2)] * 8})()
    assert len(host_batches(caches, spec, torch.device("cuda"), 1)) == 1 and len(pinned) == 1
    assert len(host_batches(caches, spec, torch.device("cuda"))) == 8 and len(pinned) == 9


def test_a_step_that_changes_its_batch_gets_a_device_copy_after_the_transfer():
    # host point on an accelerator: the host batch is never handed to the step (the
    # transfer makes new device tensors), so it is not copied (a host copy loses pinning);
    # the copy is made after the move, as the device point makes one.
    _, loader = planted("augment", 0)
    spec = describe(loader)
    batch = (torch.ones(8, 16), torch.zeros(8, dtype=torch.long))
    caches = type("C", (), {"batches": [batch], "batch_size": 8})()
    moved = []
    exp = Experiment(spec, torch.device("cuda"), Plan(), lambda: 0.0, lambda e: None, None, start=0, end=1,
                     deadline=1, move=lambda b: moved.append(b) or tree.clone(b), caches=caches, fresh=True)
    with exp.open("host") as (next_batch, move):
        first, second = next_batch(), next_batch()
    assert first is second  # the cached (pinned) host batch itself, each step
    out = move(first)
    assert moved == [first] and out[0] is not first[0] and torch.equal(out[0], first[0])
    exp.fresh = False
    with exp.open("host") as (_, move):
        assert move is exp.move


def test_plan_and_inputs_are_checked_before_the_state_is_touched():
    model, loader = planted("augment", 0)
    w = model[1].weight.detach().clone()
    with pytest.raises(BisectError):
        bisect(model, loader, max_seconds=math.nan)
    assert torch.equal(model[1].weight, w)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"),
                    reason="needs sched_setaffinity and /proc (Linux)")
def test_cpu_seconds_counts_the_time_spent_waiting_for_a_core_as_computing():
    # a loop that computes, on a core shared with a process that spins: descheduled half its
    # time, its CPU time is about half its wall time (read as waiting on storage before:
    # witness.waits), its CPU time with the run-queue delay about all of it
    import subprocess
    import time

    before = os.sched_getaffinity(0)
    core = min(before)
    os.sched_setaffinity(0, {core})
    spinner = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    try:
        time.sleep(0.3)  # the spinner running
        w0, p0, c0 = time.perf_counter(), time.process_time(), devices.cpu_seconds()
        while time.perf_counter() - w0 < 0.6:
            pass
        wall = time.perf_counter() - w0
        process, with_queue = time.process_time() - p0, devices.cpu_seconds() - c0
    finally:
        spinner.kill()
        spinner.wait()
        os.sched_setaffinity(0, before)
    assert process < 0.8 * wall, (process, wall)  # the core was shared
    assert with_queue > 0.9 * wall, (with_queue, process, wall)
