"""What every cost alone shares (timed.py): the workers' threads while their stages are
timed; the timing loop itself is exercised through every part in test_isolate.py."""

import pytest
import torch

from bisect_pipeline.measure import timed


def test_the_workers_work_is_timed_on_one_thread_as_a_worker_has_and_the_threads_are_restored():
    from types import SimpleNamespace
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        with timed.worker_threads(SimpleNamespace(num_workers=2)):
            seen.append(torch.get_num_threads())
        with timed.worker_threads(SimpleNamespace(num_workers=0)):  # in this process: its own threads
            seen.append(torch.get_num_threads())
        with pytest.raises(RuntimeError):
            with timed.worker_threads(SimpleNamespace(num_workers=1)):
                raise RuntimeError("a transform failed")
        assert seen == [1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
