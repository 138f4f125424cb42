"""The points' sources (point_sources.py): a worker pool kept between visits, parked
and resumed, where it can be and while the machine has the memory for it."""

import torch

from bisect_pipeline.measure import point_sources
from conftest import PlantedDataset, make_loader
from test_experiment import experiment


class Pids(torch.utils.data.Dataset):
    """Each sample: the pid of the process that made it."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import os

        return torch.tensor([float(os.getpid())]), 0


def test_a_worker_points_loader_is_started_once_and_parked_between_its_visits(no_leftover_workers):
    # Workers that your loop starts every epoch were started at every visit of the
    # rounds: the step after a fork pays for copy-on-write, about a step more on a
    # MobileNet, in every visit of every worker point. They are now started once and
    # parked between visits (idle: sources.LoaderSource.park).
    exp = experiment(torch.utils.data.DataLoader(Pids(), batch_size=4, num_workers=2,
                                                 multiprocessing_context="fork"))
    assert all(exp.parks(n) and exp.keeps(n) for n in ("full", "raw", "augmented", "collated"))
    assert not exp.keeps("device")
    pids = []
    for _ in range(2):
        with exp.open("full", keep=True) as (next_batch, move):
            pids.append({int(p) for _ in range(4) for p in next_batch()[0].flatten()})
        assert exp.kept["full"][3].gate is not None
    assert len(pids[0]) == 2 and pids[0] == pids[1]
    exp.close_kept()
    assert exp.kept == {}


def test_a_loader_that_cannot_be_parked_is_kept_only_where_its_workers_are_persistent(monkeypatch):
    monkeypatch.setattr(point_sources, "room_for_a_pool", lambda: True)
    # behind a loader wrapper (timm's) the replay loader is not ours to end: kept open as
    # your persistent workers are, or started at every visit as yours are every epoch
    for persistent in (False, True):
        exp = experiment(make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2,
                                     persistent_workers=persistent))
        exp.wrapper = object()
        assert not exp.parks("full") and exp.keeps("full") == persistent
    no_workers = experiment(make_loader(PlantedDataset(n=32), batch_size=8))
    assert not no_workers.keeps("full") and not no_workers.parks("collated")


def test_a_pool_is_kept_only_while_the_machine_has_the_memory_for_it(monkeypatch):
    # each kept pool comes to hold the old copy of every page the step writes after its
    # fork (copy-on-write): without the room, a point's workers start at every visit
    exp = experiment(make_loader(PlantedDataset(n=32), batch_size=8, num_workers=2))
    assert isinstance(point_sources.room_for_a_pool(), bool)
    monkeypatch.setattr(point_sources, "room_for_a_pool", lambda: False)
    assert exp.parks("full") and not exp.keeps("full")
    exp.kept["raw"] = ("already open",)
    assert exp.keeps("raw")  # a pool already kept stays so
    exp.kept.clear()


def test_a_resumed_pool_warms_up_without_the_prefetch(no_leftover_workers):
    # At a start the workers may fill the whole prefetch while the first steps run slow
    # (the fork's copy-on-write): the warm-up steps through it. A parked pool's queue was
    # emptied at the park and its workers sat idle: resumed, no batch is ready ahead of
    # the step (Experiment.resumes), and the plan's own warm-up steps are enough.
    loader = torch.utils.data.DataLoader(Pids(), batch_size=4, num_workers=2, prefetch_factor=3,
                                         multiprocessing_context="fork")
    exp = experiment(loader)
    warm = []
    for _ in range(2):
        visit = exp.visit("full", 1e9, keep=1, keep_open=exp.keeps("full"))
        assert visit.prefetch_depth == 6  # a pause inside a visit still warms up through all of it
        warm.append(visit.first_prefetch)
        with visit as batches:
            for _, batch in zip(range(12), batches):
                pass
    assert warm == [6, 0] and exp.resumes("full")
    exp.close_kept()
    assert not exp.resumes("full")
