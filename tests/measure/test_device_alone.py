"""The device side timed alone (device_alone.py): what a batch carries, and the step's
host-device syncs, counted on CUDA only and attributed to the line that asked for them."""

import os
import sys
import threading
import warnings

import pytest
import torch

from bisect_pipeline.measure import device_alone

CPU = torch.device("cpu")


def test_syncs_skipped_on_cpu_with_reason():
    calls = []
    s = device_alone.count_syncs(lambda b: calls.append(b), torch.zeros(2), CPU).to_dict()
    assert s["status"] == "skipped" and "no CUDA device" in s["reason"] and "cpu" in s["reason"]
    assert calls == []  # nothing run for nothing


def timed_calls(seconds: list):
    """A training step on a fake clock whose calls take `seconds` in turn (the last one
    again after them), the clock, and the calls made."""
    from conftest import FakeClock
    clock, calls = FakeClock(), []

    def step(batch):
        clock.t += seconds[min(len(calls), len(seconds) - 1)]
        calls.append(batch)
    return step, clock, calls


def test_a_long_step_whose_warm_up_calls_agree_is_timed_by_them():
    # a 3-s step (a GPU's detection model): its second call after the probe agrees with
    # the first within 10%: two calls, not three warm-ups and a timed one (12 s)
    step, clock, calls = timed_calls([3.1, 3.0, 3.0])
    t = device_alone.time_step(step, "b", CPU, 0.3, clock, long_s=0.25)
    assert len(calls) == 2 and t.steps == 2 and t.ms_per_batch == pytest.approx(3050.0)
    # its first calls slower (lazy costs the probe did not pay): warm-up until two agree
    step, clock, calls = timed_calls([9.0, 3.1, 3.0])
    t = device_alone.time_step(step, "b", CPU, 0.3, clock, long_s=0.25)
    assert len(calls) == 3 and t.ms_per_batch == pytest.approx(3050.0)
    # calls that never agree: the warm-up and the timed steps as for any step
    step, clock, calls = timed_calls([3.0, 4.5, 3.0, 4.5])
    t = device_alone.time_step(step, "b", CPU, 0.3, clock, long_s=0.25)
    assert len(calls) == device_alone.STEP_WARMUP + 1 and t.steps == 1
    # a short step: always STEP_WARMUP untimed calls first, then the median of those timed
    step, clock, calls = timed_calls([0.02])
    t = device_alone.time_step(step, "b", CPU, 0.3, clock, long_s=0.25)
    assert len(calls) == device_alone.STEP_WARMUP + t.steps and t.steps == 15 and t.ms_per_batch == pytest.approx(20.0)


def test_the_sync_count_of_a_long_step_runs_one_step():
    assert device_alone.sync_steps(3.0, 0.25) == 1
    assert device_alone.sync_steps(0.05, 0.25) == device_alone.SYNC_STEPS
    assert device_alone.sync_steps(None, 0.25) == device_alone.SYNC_STEPS  # not timed: as before


def describe_batch(batch) -> dict:
    return device_alone.describe_batch(batch).to_dict()


def test_describe_batch_flags_float_images_only():
    d = describe_batch((torch.zeros(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)))
    assert d["n_tensors"] == 2 and d["bytes"] == 4 * 3 * 32 * 32 * 4 + 4 * 8
    assert [t["image"] for t in d["tensors"]] == [True, False]
    assert d["tensors"][0]["path"] == "batch[0]" and d["tensors"][0]["shape"] == [4, 3, 32, 32]
    assert not describe_batch({"x": torch.zeros(4, 3, 32, 32, dtype=torch.uint8)})["tensors"][0]["image"]
    assert not describe_batch(torch.zeros(4, 16))["tensors"][0]["image"]
    assert describe_batch(torch.zeros(4, 32, 32, 3))["tensors"][0]["image"]  # channels last


SYNC_MESSAGE = "called a synchronizing CUDA operation"  # what torch warns in sync debug mode


def _defined_in(path, body: str):
    """A function `f` whose code says it lives in `path` (a frame of that file)."""
    ns = {"warnings": warnings, "SYNC_MESSAGE": SYNC_MESSAGE}
    exec(compile(body, path, "exec"), ns)
    return ns["f"]


def test_a_sync_is_attributed_to_the_users_line_that_asked_for_it_through_torch():
    # torch's sync is reported inside torch (torch/cuda/__init__.py): the site is the caller
    inside_torch = _defined_in(os.path.join(os.path.dirname(torch.__file__), "cuda", "fake.py"),
                               "def f():\n    warnings.warn(SYNC_MESSAGE)\n")
    with device_alone.SyncRecorder() as rec:
        for _ in range(2):
            inside_torch(); line = sys._getframe().f_lineno  # noqa: E702
        warnings.warn("an unrelated warning")  # swallowed, not counted
    s = rec.syncs(2)
    assert s.total == 2 and s.per_step == 1.0
    assert [(x.where, x.count) for x in s.sites] == [(f"{__file__}:{line}", 2)]


def test_the_tools_own_syncs_and_other_threads_syncs_are_not_the_steps():
    own = _defined_in(os.path.join(os.path.dirname(device_alone.__file__), "visit.py"),
                      "def f():\n    warnings.warn(SYNC_MESSAGE)\n")  # a window edge's sync
    workload = _defined_in(os.path.join(os.path.dirname(os.path.dirname(device_alone.__file__)), "testing.py"),
                           "def f():\n    warnings.warn(SYNC_MESSAGE)\n")  # a planted step: user code
    with device_alone.SyncRecorder() as rec:
        own()
        t = threading.Thread(target=lambda: warnings.warn(SYNC_MESSAGE))
        t.start(); t.join()  # noqa: E702
        workload()
    s = rec.syncs(1)
    assert s.total == 1 and s.sites[0].where.endswith("testing.py:2")


def test_warnings_are_as_they_were_after_recording():
    before = (warnings.showwarning, list(warnings.filters))
    with device_alone.SyncRecorder():
        warnings.warn(SYNC_MESSAGE)
    assert (warnings.showwarning, list(warnings.filters)) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counting host-device syncs needs CUDA")
def test_cuda_counts_a_planted_item_sync_per_step():
    dev = torch.device("cuda")
    batch = torch.randn(64, 64, device=dev)
    w = torch.randn(64, 64, device=dev)

    def syncing(b):
        return (b @ w).sum().item()  # one device-to-host copy: a sync per step

    def clean(b):
        return (b @ w).sum()

    s = device_alone.count_syncs(syncing, batch, dev, steps=3).to_dict()
    assert s["status"] == "ok" and s["steps"] == 3 and s["per_step"] >= 1, s
    assert s["sites"] and "test_device_alone.py" in s["sites"][0]["where"]
    assert device_alone.count_syncs(clean, batch, dev, steps=3).per_step == 0
    assert torch.cuda.get_sync_debug_mode() == 0  # restored
