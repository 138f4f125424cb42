"""Batch sources of the points (sources.py): what each cache point adds must be paid on
both sides of a drop, and every loader shape keeps producing batches."""

from __future__ import annotations

import multiprocessing.util
import os
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from bisect_pipeline import bisect
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.measure.sources import BatchCache, LoaderSource, full_loader
from conftest import FAST_PLAN, FEATURES, PlantedIterable, make_loader

PIXELS = (3, 160, 160)  # float32: 300 KiB a sample, 19 MiB a batch of 64


class BigImages(Dataset):
    def __init__(self, n: int = 256) -> None:
        self.images = torch.rand(8, *PIXELS)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.images[i % 8], i % 4


def sleep_step(batch) -> None:
    time.sleep(0.010)


def test_batch_cache_copies_only_where_the_real_pipeline_makes_a_new_batch():
    batches = [torch.arange(4.0)]
    assert BatchCache(batches)[0] is batches[0]  # main process: the loop copies nothing there
    fresh = BatchCache(batches, fresh=True)[0]  # a step that changes its batch gets a copy
    assert fresh is not batches[0] and torch.equal(fresh, batches[0])


@pytest.mark.e2e
def test_at_num_workers_0_large_batches_show_no_handoff_cost():
    # Nothing happens between collate and the step when num_workers=0. The collated point
    # used to copy each 19 MiB batch, a cost the real loop never pays: it read as a real
    # handoff of several ms per batch next to a 10 ms step. Now collated coincides with
    # device there, and handoff does not apply.
    loader = make_loader(BigImages(), batch_size=64)
    report = bisect(None, loader, step=sleep_step, device="cpu", plan=FAST_PLAN, max_seconds=30,
                    points=["full", "augmented", "collated", "device"], verify_seconds=0)  # (the check: test_verify.py)
    handoff = report.stage("handoff")
    assert handoff.status == "skipped" and "num_workers=0" in handoff.reason, handoff
    assert report.point("collated").status == "skipped"
    assert report.bottleneck != "handoff"
    assert not any(n.kind == "rules" for n in report.notes), report.warnings


@pytest.mark.e2e
@pytest.mark.parametrize("persistent", [False, True])
def test_an_iterable_dataset_that_ends_inside_a_point_is_started_again(persistent, no_leftover_workers):
    # 16 samples, batches of 4 over 2 workers: an epoch ends every 4 batches; with
    # persistent workers the restart used to call iter() on a loader whose workers the
    # tool had just shut down, which raised.
    loader = DataLoader(PlantedIterable(n=16), batch_size=4, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=persistent)
    spec = describe(loader)
    source = full_loader(spec)
    with source as next_batch:
        batches = [next_batch() for _ in range(20)]
    assert source.restarts >= 4
    assert all(b[0].shape == (4, FEATURES) for b in batches)


class WorkerPid(Dataset):
    """Each sample is the pid of the process that made it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        import os

        return torch.tensor([os.getpid()])


@pytest.mark.parametrize("persistent", [False, True])
def test_full_with_epochs_ends_them_as_the_users_loop_does(persistent, no_leftover_workers):
    # verify.py measures the full pipeline with its epochs: 8 samples, batches of 4 = an
    # epoch every 2 batches; workers that are not persistent are forked again at each
    # (new pids), persistent ones serve every epoch. Without epochs: one endless epoch.
    loader = DataLoader(WorkerPid(), batch_size=4, shuffle=True, num_workers=1, multiprocessing_context="fork",
                        persistent_workers=persistent)
    spec = describe(loader)
    source = full_loader(spec, epochs=True)
    with source as next_batch:
        pids = [int(next_batch()[0]) for _ in range(6)]
    assert source.restarts == 2
    assert len(set(pids)) == (1 if persistent else 3), pids
    endless = full_loader(spec)
    with endless as next_batch:
        pids = [int(next_batch()[0]) for _ in range(6)]
    assert endless.restarts == 0 and len(set(pids)) == 1



class CountsFetches(Dataset):
    """Each sample is (its index, the pid of the worker that made it); every fetch is
    counted in shared memory, seen by the main process."""

    def __init__(self) -> None:
        import multiprocessing

        self.fetched = multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        with self.fetched.get_lock():
            self.fetched.value += 1
        return torch.tensor([i, os.getpid()])


@pytest.mark.parametrize("pin", [False, pytest.param(True, marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="pin_memory's thread needs CUDA"))])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_parked_loader_does_no_work_until_resumed_on_the_same_workers(persistent, pin, no_leftover_workers):
    # Kept between the visits of the rounds (Experiment._kept): parked, it ends its epoch
    # after the batches in flight and its workers sit idle while other points are
    # measured; resumed, it goes on in the same order on the same workers (not forked
    # again: the step after a fork pays for copy-on-write). Without parking, its workers
    # would go on filling the prefetch queue beside the next point. With pin_memory (a
    # thread between the workers and the step, primed again by DataLoader's reset) the
    # batches still come pinned after the resume.
    ds = CountsFetches()
    loader = DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork", prefetch_factor=2,
                        persistent_workers=persistent, pin_memory=pin)
    source = full_loader(describe(loader), park=True)
    with source as next_batch:
        first = [next_batch() for _ in range(3)]
        assert source.park()
        time.sleep(0.3)
        parked = ds.fetched.value
        time.sleep(0.3)
        assert ds.fetched.value == parked == 2 * (3 + 4)  # the 3 taken and the 4 in flight: no more
        source.resume()
        later = [next_batch() for _ in range(3)]
    assert all(b.is_pinned() == pin for b in first + later)
    pids = {int(p) for b in first + later for p in b[:, 1]}
    assert len(pids) == 2  # two workers, started once
    order = [int(i) for b in first + later for i in b[:, 0]]
    assert order == list(range(6)) + list(range(14, 20))  # the 4 batches drained are skipped, not repeated


def test_a_loader_that_ends_its_epochs_is_parked_between_visits_on_the_same_workers(no_leftover_workers):
    # a --tune candidate (verify._visit): its epochs end as in the user's loop, its workers
    # persistent; parked, its epoch ends early after the batches in flight, and the next
    # visit starts another epoch (a pass of the sampler) on the same workers, its own end
    # starting the next one as a loop's would
    ds = CountsFetches()
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork", prefetch_factor=2,
                        persistent_workers=True)
    source = full_loader(describe(loader), epochs=True, park=True)
    with source as next_batch:
        first = [next_batch() for _ in range(3)]
        assert source.park()
        source.resume()
        later = [next_batch() for _ in range(20)]  # a whole epoch of 16 batches, and into the next
    assert source.restarts == 1
    assert len({int(p) for b in first + later for p in b[:, 1]}) == 2  # two workers, started once
    assert sorted(int(i) for b in later[:16] for i in b[:, 0]) == list(range(64))  # a whole pass


def test_a_loader_without_a_gate_is_not_parked(no_leftover_workers):
    loader = DataLoader(CountsFetches(), batch_size=2, num_workers=1, multiprocessing_context="fork")
    source = full_loader(describe(loader))
    with source as next_batch:
        next_batch()
        assert source.gate is None and not source.park()


class HangsAt(Dataset):
    """Sample `hang` never comes: its worker sleeps in user code."""

    def __init__(self, hang: int) -> None:
        self.hang = hang

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        if i == self.hang:
            time.sleep(120)
        return torch.tensor([i])


def _mark(folder: str, worker_id: int) -> None:
    open(os.path.join(folder, f"left-{worker_id}"), "w").close()


@pytest.mark.e2e
def test_a_failed_point_stops_idle_workers_cleanly_and_terminates_a_hung_one(tmp_path, no_leftover_workers):
    # Batches of 1 over 2 workers take turns: worker 1 hangs on sample 3, worker 0 serves
    # 0, 2, 4 and waits. Terminating every worker at once also killed idle ones inside
    # the done event's check, leaving its lock held: the shutdown's done_event.set() then
    # hung until the watchdog ended the run. A worker that leaves its loop runs its
    # finalizers (a signalled one does not; torch's handler makes both exit with 0).
    def init(worker_id: int) -> None:
        multiprocessing.util.Finalize(None, _mark, args=(str(tmp_path), worker_id), exitpriority=10)

    loader = DataLoader(HangsAt(3), batch_size=1, num_workers=2, multiprocessing_context="fork",
                        worker_init_fn=init)
    source = full_loader(describe(loader))
    t0 = time.monotonic()
    with pytest.raises(ValueError):
        with source as next_batch:
            assert [int(next_batch()) for _ in range(3)] == [0, 1, 2]
            time.sleep(0.5)  # worker 0 is idle now, worker 1 still asleep in sample 3
            raise ValueError("the point failed")
    assert time.monotonic() - t0 < 30  # not the 120 s of the hung sample
    assert sorted(os.listdir(tmp_path)) == ["left-0"]  # the idle one left by itself, the hung one was stopped


class CtrlCAtStart(torch.utils.data.Sampler):
    """A sampler that gets a Ctrl-C when its iterator starts: inside iter(loader), the
    workers forked and DataLoader's reset priming their queues."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        signal.raise_signal(signal.SIGINT)
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("persistent", [False, True])
def test_a_ctrl_c_while_the_workers_start_is_raised_once_they_have_and_stops_them(persistent):
    # Raised inside iter(loader), the KeyboardInterrupt left the workers running behind a
    # half-built iterator (and, where it landed in a queue's `with lock:`, the lock held:
    # the process hung at its exit, faults.signals_held). Now it is raised once iter()
    # is done, and the source shuts the workers down on the way out.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own (bisect() in a notebook)
    before = set(multiprocessing.active_children())
    source = LoaderSource(lambda: DataLoader(list(range(16)), batch_size=4, sampler=CtrlCAtStart(16), num_workers=2,
                                             persistent_workers=persistent, multiprocessing_context="fork"))
    try:
        with pytest.raises(KeyboardInterrupt) as caught:  # (its traceback kept: the frames stay alive)
            with source:
                pytest.fail("the visit ran after a Ctrl-C")
        assert set(multiprocessing.active_children()) <= before, caught  # shut down, not left to gc
        assert source.loader is None and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
