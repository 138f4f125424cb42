"""Each fault of issue 6, planted: a clear status and reason, other points still
measured, no worker left behind, no half-written file."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from bisect_pipeline import BisectError, Plan, bisect
from bisect_pipeline.core import faults
from bisect_pipeline.report import write_atomic
from conftest import FAST_PLAN, TINY_PLAN, PlantedDataset, Sleep, cli_in_process, make_loader, tiny_model

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(model, loader, **kw):
    kw.setdefault("plan", FAST_PLAN)
    kw.setdefault("max_seconds", 15)
    kw.setdefault("verify_seconds", 0)  # the advice's check: test_verify.py
    return bisect(model, loader, device="cpu", **kw)


def statuses(report):
    return {p.point: p.status for p in report.points}


# ---------------------------------------------------------------- user code that raises


class Boom:
    def __call__(self, x):
        raise ValueError("bad pixel")


class RaisesAt(Dataset):
    """Raises in __getitem__ for indices >= `bad_from` (only inside workers if `in_workers`)."""

    def __init__(self, bad_from=0, in_workers=False, transform=None):
        self.data = torch.randn(64, 16)
        self.bad_from = bad_from
        self.in_workers = in_workers
        self.transform = transform

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= self.bad_from and (not self.in_workers or torch.utils.data.get_worker_info() is not None):
            raise OSError(f"cannot read sample {i}")
        x = self.data[i]
        if self.transform is not None:
            x = self.transform(x)
        return x, i % 4


def bad_collate(samples):
    raise TypeError("cannot stack")


def bad_init(worker_id):
    raise RuntimeError("no database connection")


@pytest.mark.e2e
@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitem_raising_everywhere_fails_every_point_naming_load(num_workers, no_leftover_workers):
    loader = make_loader(RaisesAt(0), num_workers=num_workers)
    report = run(tiny_model(), loader)
    assert report.bottleneck is None
    for name in ("full", "raw", "augmented", "collated", "device"):
        p = report.point(name)
        assert p.status == "failed" and p.failed_stage == "load", (name, p.reason)
        assert "OSError: cannot read sample" in p.reason


@pytest.mark.e2e
@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitem_raising_later_keeps_the_cached_points(num_workers, no_leftover_workers):
    # the first samples load, so the caches fill; the full pipeline hits the bad samples
    ds = RaisesAt(bad_from=0, in_workers=True) if num_workers else RaisesAt(bad_from=40)
    loader = DataLoader(ds, batch_size=8, num_workers=num_workers, multiprocessing_context="fork" if num_workers else None)
    report = run(tiny_model(), loader)
    full = report.point("full")
    assert full.status == "failed" and full.failed_stage == "load" and "cannot read sample" in full.reason
    if num_workers:
        assert "DataLoader worker" in full.reason
    assert report.point("device").status == "ok" and report.point("augmented").status == "ok"
    assert report.bottleneck is None  # no verdict without the full pipeline


@pytest.mark.parametrize("num_workers", [0, 2])
def test_transform_raising_names_augment(num_workers, no_leftover_workers):
    loader = make_loader(PlantedDataset(transform=Boom()), num_workers=num_workers)
    report = run(tiny_model(), loader)
    full = report.point("full")
    assert full.status == "failed" and full.failed_stage == "augment"
    assert "ValueError: bad pixel" in full.reason


def test_collate_raising_names_collate_at_every_point(no_leftover_workers):
    # the fill fails at the first collate, so even the cached points have nothing to cache
    loader = make_loader(PlantedDataset(), num_workers=2, collate_fn=bad_collate)
    report = run(tiny_model(), loader)
    for name in ("full", "raw", "augmented", "collated", "device"):
        p = report.point(name)
        assert p.failed_stage == "collate" and "TypeError: cannot stack" in p.reason


@pytest.mark.e2e
def test_worker_init_fn_raising_fails_worker_points_only(no_leftover_workers):
    loader = make_loader(PlantedDataset(transform=Sleep(0.0)), num_workers=2, worker_init_fn=bad_init)
    report = run(tiny_model(), loader)
    assert report.point("device").status == "ok"
    for name in ("full", "raw", "augmented", "collated"):
        p = report.point(name)
        assert p.status == "failed" and p.failed_stage == "worker_init_fn", (name, p.reason)
        assert "no database connection" in p.reason


class KillsWorker(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.zeros(16), 0


@pytest.mark.e2e
def test_killed_worker_is_explained(no_leftover_workers):
    loader = DataLoader(KillsWorker(), batch_size=8, num_workers=2, multiprocessing_context="fork")
    report = run(tiny_model(), loader)
    full = report.point("full")
    assert full.status == "failed" and full.failed_stage == "worker"
    assert "out-of-memory" in full.reason
    assert report.point("device").status == "ok"


def test_signal_meanings_come_from_the_cause_chain():
    try:
        try:
            raise RuntimeError("DataLoader worker (pid 12) is killed by signal: Bus error. ")
        except RuntimeError as inner:
            raise RuntimeError("DataLoader worker (pid(s) 12) exited unexpectedly") from inner
    except RuntimeError as exc:
        stage, reason = faults.classify(exc)
    assert stage == "worker" and "/dev/shm" in reason
    assert "native crash" in faults.classify(RuntimeError("worker (pid 3) is killed by signal: Segmentation fault."))[1]
    # without torch's period (a message cut, or re-raised bare): the same meaning
    assert "/dev/shm" in faults.classify(RuntimeError("DataLoader worker (pid 1) is killed by signal: Bus error"))[1]
    assert "out-of-memory" in faults.classify(RuntimeError("worker (pid 2) is killed by signal: Killed"))[1]


# ---------------------------------------------------------------- hangs


class Hangs(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            time.sleep(3600)
        return torch.zeros(16), 0


@pytest.mark.e2e
def test_hanging_worker_is_cut_by_the_watchdog(no_leftover_workers):
    loader = DataLoader(Hangs(), batch_size=8, num_workers=2, multiprocessing_context="fork")
    t0 = time.monotonic()
    report = run(tiny_model(), loader, step_timeout=1.0, max_seconds=30)
    assert time.monotonic() - t0 < 25
    # terminated by the run (within its 1-s grace, which the 1-s watchdog once cut), not
    # left hung until garbage collection, whose shutdown waits 5 s for each
    assert multiprocessing.active_children() == []
    full = report.point("full")
    assert full.status == "failed" and "no batch in 1 s" in full.reason
    assert report.point("device").status == "ok"


@pytest.mark.e2e
def test_hanging_step_is_cut_by_the_watchdog():
    state = {"calls": 0}

    def step(batch):
        state["calls"] += 1
        if state["calls"] > 5:
            time.sleep(3600)

    report = run(tiny_model(), make_loader(PlantedDataset()), step=step, step_timeout=1.0,
                 points=["full", "device"])
    device = report.point("device")
    assert device.status == "failed" and "training step did not finish in 1 s" in device.reason


# ---------------------------------------------------------------- step errors


def test_step_raising_names_the_step():
    def step(batch):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x16 and 3x4)")

    report = run(tiny_model(), make_loader(PlantedDataset()), step=step)
    device = report.point("device")
    assert device.status == "failed" and device.failed_stage == "step" and "shapes cannot be multiplied" in device.reason
    assert report.bottleneck is None


def test_out_of_memory_names_the_point_and_the_cache_option():
    def step(batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    report = run(tiny_model(), make_loader(PlantedDataset()), step=step, points=["full", "device"])
    assert "--cache-mb" in report.point("device").reason


# ---------------------------------------------------------------- data problems


@pytest.mark.e2e
def test_step_mutating_its_batch_gets_fresh_copies():
    seen = []

    def step(batch):
        x, _ = batch
        seen.append(float(x.abs().sum()))
        x.mul_(2)

    report = run(tiny_model(), make_loader(PlantedDataset(n=8)), step=step, points=["full", "device"])
    assert any("in place" in w for w in report.warnings)
    assert report.point("device").status == "ok"
    # one cached batch (8 samples): every step saw the same, unmodified values
    device_sums = seen[-10:]
    assert max(device_sums) == pytest.approx(min(device_sums))


def test_empty_dataset_is_a_clear_error():
    with pytest.raises(BisectError, match="empty"):
        run(tiny_model(), DataLoader(PlantedDataset(n=0), batch_size=8))  # shuffle=True would fail in torch


@pytest.mark.e2e
def test_loader_shorter_than_the_steps_cycles():
    report = run(tiny_model(40.0), make_loader(PlantedDataset(n=8)))  # one batch per epoch
    assert report.point("full").status == "ok" and report.point("full").throughput.steps > 3


class NoLen(Dataset):
    def __getitem__(self, i):
        return torch.zeros(16), 0


class Indices(torch.utils.data.Sampler):
    def __iter__(self):
        return iter(range(16))


@pytest.mark.e2e
def test_dataset_without_len_is_measured():
    loader = DataLoader(NoLen(), batch_size=8, sampler=Indices())
    report = run(tiny_model(), loader, max_seconds=6, plan=TINY_PLAN)  # no planted cost, no verdict: structure only
    assert report.point("full").status == "ok" and report.point("augmented").status == "ok"


@pytest.mark.e2e
def test_cache_over_budget_keeps_fewer_batches_and_says_so():
    report = run(tiny_model(), make_loader(PlantedDataset()), cache_mb=0.001, max_seconds=5, plan=TINY_PLAN)
    assert report.cache.batches == 1 and report.cache.limited_by == "memory budget"
    assert "The caches hold 1 batch, limited by the memory budget: raise --cache-mb." in report.warnings


@pytest.mark.e2e
def test_small_dev_shm_is_detected_before_the_run(monkeypatch):
    monkeypatch.setattr(faults, "shm_free_bytes", lambda path="/dev/shm": 1000)
    events = []
    report = run(tiny_model(), make_loader(PlantedDataset(), num_workers=2), progress=events.append,
                 points=["full", "device"], plan=TINY_PLAN)
    assert any("/dev/shm" in w and "--shm-size" in w for w in report.warnings)
    first_warning = next(i for i, e in enumerate(events) if e["event"] == "warning")
    first_point = next(i for i, e in enumerate(events) if e["event"] == "point")
    assert first_warning < first_point


def test_shm_rule():
    assert faults.shm_problem(0, 0, 10**9, 10) is None
    assert faults.shm_problem(2, 4, 1000, 10**6) is None
    small = faults.shm_problem(2, 4, 10**6, 10**6)
    assert small.message == "/dev/shm has 1 MiB free, workers need about 8: give docker --shm-size=2g."
    assert "fewer workers" in small.detail and "bus error" in small.detail


# ---------------------------------------------------------------- files and interruption


def test_atomic_write_never_leaves_half_a_file(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text('{"old": true}')

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        write_atomic(str(target), '{"new": true}')
    assert json.loads(target.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["r.json"]  # no temporary left


ENTRY = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import planted

    def make():
        return planted("augment", 2)
""")


@pytest.mark.e2e
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_writes_the_partial_result_and_leaves_no_worker(tmp_path, sig, code):
    psutil = pytest.importorskip("psutil")
    (tmp_path / "slow_entry.py").write_text(ENTRY.format(tests=TESTS))
    out = tmp_path / "partial.json"
    proc = subprocess.Popen([sys.executable, "-m", "bisect_pipeline", "--entry", "slow_entry.py:make", "--json",
                             str(out), "--max-seconds", "120"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(proc.pid)
    # wait until a point with workers runs (its worker processes exist), then interrupt;
    # workers are forks of the tool's python, not the short-lived commands its imports
    # run (torch's import runs /sbin/ldconfig: caught here once, the signal came inside
    # `import torch`)
    deadline = time.monotonic() + 60
    children = []
    while time.monotonic() < deadline and not children:
        time.sleep(0.2)
        children = [c for c in parent.children(recursive=True) if _a_python(c, psutil)]
    assert children, "no worker process was started"
    proc.send_signal(sig)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # hung at its exit: stopped, its workers with it, so no later test finds them
        for p in [*parent.children(recursive=True), parent]:
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.communicate()
        raise
    assert proc.returncode == code, stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["interrupted"] is True
    assert any(p["status"] == "ok" for p in doc["points"])  # the points measured so far are kept
    assert any(p["status"] == "not run" for p in doc["points"])
    assert "device" in stdout  # the partial table was printed
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"workers left behind: {alive}"


def _a_python(proc, psutil) -> bool:
    try:
        return proc.exe() == psutil.Process().exe()
    except psutil.Error:  # gone already, or not ours to read
        return False


HANGS_AT_50 = textwrap.dedent("""
    import time
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    class HangsAt50(Dataset):
        def __len__(self):
            return 256

        def __getitem__(self, i):
            if i == 50:
                time.sleep(3600)
            return torch.zeros(16), i % 4

    def make():
        loader = DataLoader(HangsAt50(), batch_size=8, num_workers=1, multiprocessing_context="fork")
        return nn.Linear(16, 4), loader
""")


@pytest.mark.e2e
@pytest.mark.parametrize("extra,bound", [(["--step-timeout", "3"], 6 + 10), ([], 6 + 10)])
def test_a_sample_hanging_in_the_fill_ends_the_run_in_time_with_the_json(tmp_path, extra, bound):
    # issue 11's case: __getitem__ sleeps forever at index 50, num_workers=1, batch 8.
    # With --step-timeout 3 the hang is cut by the watchdog; without it (120 s default),
    # by --max-seconds: either way the run ends within --max-seconds + 10 s.
    (tmp_path / "hang_entry.py").write_text(HANGS_AT_50)
    out = tmp_path / "hang.json"
    t0 = time.monotonic()
    r = cli_in_process("--entry", "hang_entry.py:make", "--json", str(out), "--max-seconds", "6", "-q", *extra,
                       cwd=tmp_path)
    assert time.monotonic() - t0 < bound
    assert r.returncode == 1, r.stderr  # no verdict: the full pipeline hangs
    doc = json.loads(out.read_text())
    stopped = [n for n in doc["notes"] if n["message"].startswith("Filling the caches failed after 6 batches")]
    assert stopped and "sample 50 hung in load" in stopped[0]["detail"]
    full = next(p for p in doc["points"] if p["point"] == "full")
    assert full["status"] in ("failed", "not run") and doc["bottleneck"] is None
    if full["status"] == "failed":
        assert full["failed_stage"] == "hang"
    assert next(p for p in doc["points"] if p["point"] == "device")["status"] == "ok"  # 6 batches were cached


@pytest.mark.e2e
def test_a_hang_before_the_first_batch_fails_the_cached_points_naming_sample_and_stage():
    class HangsInTransform(Dataset):
        def __init__(self):
            self.transform = Sleep(3_600_000)

        def __len__(self):
            return 64

        def __getitem__(self, i):
            return self.transform(torch.zeros(16)), 0

    t0 = time.monotonic()
    report = run(tiny_model(), DataLoader(HangsInTransform(), batch_size=8), step_timeout=2.0, max_seconds=10)
    assert time.monotonic() - t0 < 20
    device = report.point("device")
    assert device.status == "failed" and device.failed_stage == "hang"
    assert "sample 0 hung in augment" in device.reason
    assert report.point("full").status in ("failed", "not run")


def test_no_watchdog_outside_the_main_thread():
    import threading

    result = {}

    def worker():
        result["active"] = faults.Watchdog(1.0).active

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert result["active"] is False


def test_bad_step_timeout_is_rejected():
    with pytest.raises(BisectError, match="step_timeout"):
        run(tiny_model(), make_loader(PlantedDataset()), step_timeout=0)


def test_plan_is_validated():
    with pytest.raises(ValueError):
        Plan(windows_per_visit=0)


def test_a_swallowed_interrupt_is_raised_again_at_the_next_step():
    # a signal landing in code whose exceptions Python ignores (an at-fork hook while
    # workers start) loses its KeyboardInterrupt; the CLI's handler also sets this flag
    dog = faults.Watchdog(None)
    dog.beat()  # no request: nothing happens
    faults.INTERRUPT_REQUESTED[0] = True
    try:
        with pytest.raises(KeyboardInterrupt):
            dog.beat()
    finally:
        faults.INTERRUPT_REQUESTED[0] = False


# ------------------------------------------------ signals held while a worker pool starts or stops


def _cli_handler(signum, frame):  # as the command line's (cli._on_sigterm)
    if faults.interrupt_now():
        raise KeyboardInterrupt()


@pytest.mark.parametrize("handler", ["command line", "python"])
def test_a_signal_in_a_held_block_is_raised_at_the_end_of_the_outermost(handler):
    mine = _cli_handler if handler == "command line" else signal.default_int_handler
    previous = signal.signal(signal.SIGINT, mine)
    ran = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with faults.signals_held():
                signal.raise_signal(signal.SIGINT)
                ran.append("the block goes on")
                with faults.signals_held():
                    ran.append("an inner block")
                ran.append("the inner block did not raise it")
        assert ran == ["the block goes on", "an inner block", "the inner block did not raise it"]
        assert signal.getsignal(signal.SIGINT) is mine and faults.HELD == [0]
        with faults.signals_held():  # raised once: nothing is owed any more
            pass
        with pytest.raises(KeyboardInterrupt):  # outside a held block, at once as before
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_held_block_that_raises_gives_way_to_the_signal_that_came_in_it():
    previous = signal.signal(signal.SIGINT, _cli_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            with faults.signals_held():
                signal.raise_signal(signal.SIGINT)
                raise OSError("the pool failed to start")
        assert isinstance(caught.value.__context__, OSError)  # as Python would have raised it
        assert faults.OWED == [False]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_under_a_lockstep_pythons_own_handler_still_raises_at_the_blocks_end():
    # bisect() under torchrun without the command line: Python's handler never waited for
    # an agreement, so a held block must not swallow its Ctrl-C either
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    faults.DEFER_INTERRUPTS[0] += 1
    try:
        with pytest.raises(KeyboardInterrupt):
            with faults.signals_held():
                signal.raise_signal(signal.SIGINT)
    finally:
        faults.DEFER_INTERRUPTS[0] -= 1
        signal.signal(signal.SIGINT, previous)


def test_under_a_lockstep_a_held_block_leaves_the_signal_to_the_next_agreement():
    previous = signal.signal(signal.SIGINT, _cli_handler)
    faults.DEFER_INTERRUPTS[0] += 1
    try:
        with faults.signals_held():
            signal.raise_signal(signal.SIGINT)
        assert faults.OWED == [False]  # only noted (the lockstep reads INTERRUPT_REQUESTED)
    finally:
        faults.DEFER_INTERRUPTS[0] -= 1
        signal.signal(signal.SIGINT, previous)


def _answers_sigint_as_python(queue) -> None:
    queue.put(signal.getsignal(signal.SIGINT) is signal.default_int_handler)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_a_worker_forked_in_a_held_block_answers_ctrl_c_as_python_does():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue()
    try:
        with faults.signals_held():  # the block's own SIGINT handler is not the worker's
            worker = ctx.Process(target=_answers_sigint_as_python, args=(queue,))
            worker.start()
        worker.join(30)
        assert queue.get() is True
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_watchdogs_alarm_waits_for_a_held_block_to_end():
    fired = []
    with faults.Watchdog(0.3) as dog:
        assert dog.active
        with faults.signals_held():
            time.sleep(1.0)  # no beat past the timeout: the alarm comes, and waits
        try:
            time.sleep(10)  # it comes again after the timeout
        except faults.StepTimeout:
            fired.append("after the block")
    assert fired == ["after the block"]


# ---------------------------------------------------------------- the rescue (torchrun)


def _rescue(grace=0.3, late=0.0):
    called = []
    rescue = faults.Rescue(called.append, grace=grace, late=late)
    return rescue, called


def test_the_rescue_acts_when_a_sigterm_is_not_answered_in_time():
    previous = signal.signal(signal.SIGTERM, lambda *a: None)  # noted, as under a lockstep
    rescue, called = _rescue()
    try:
        rescue.arm()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
        assert called == [signal.SIGTERM]
    finally:
        rescue.disarm()
        signal.signal(signal.SIGTERM, previous)


def test_the_rescue_stands_aside_for_a_run_that_ends_or_is_writing():
    previous = signal.signal(signal.SIGTERM, lambda *a: None)
    rescue, called = _rescue()
    try:
        rescue.arm()
        rescue.final()  # the main thread writes: the rescue waits for it...
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.6)
        assert called == []
    finally:
        rescue.disarm()  # ...and the run ended: nothing to do
        signal.signal(signal.SIGTERM, previous)
    time.sleep(0.4)
    assert called == []


def test_the_rescue_acts_past_the_runs_end():
    rescue, called = _rescue(grace=0.2, late=0.2)
    try:
        rescue.arm()
        rescue.watch(time.monotonic())
        time.sleep(0.2)
        assert called == []
        time.sleep(0.6)
        assert called == [0]
    finally:
        rescue.disarm()
