"""torchdata.nodes end to end: planted node pipelines (load, augment, collate planted in
turn) named right with `raw` measured, by bisect(); a Loader by --entry and under `run`
(its own loop the step); the step's threads as they were. Real torchdata, wide margins
(bisect_pipeline.testing.planted_nodes), one run per kind shared by the session."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

pytest.importorskip("torchdata.nodes")

from bisect_pipeline.testing import planted_nodes  # noqa: E402
from conftest import FAST_PLAN, assert_names, cli_in_process  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def nodes_run():
    """`nodes_run(kind)`: bisect() of planted_nodes(kind), made once per session."""
    from bisect_pipeline import bisect

    reports: dict = {}

    def get(kind: str):
        if kind not in reports:
            model, loader = planted_nodes(kind)
            threads = torch.get_num_threads()
            reports[kind] = bisect(model, loader, device="cpu", max_seconds=20, plan=FAST_PLAN, verify_seconds=0)
            assert torch.get_num_threads() == threads  # the graph's thread workers set theirs, not this one's
        return reports[kind]
    return get


@pytest.mark.parametrize("kind", ["load", "augment", "collate"])
def test_a_planted_stage_of_a_node_graph_is_named_with_raw_measured(nodes_run, kind):
    r = nodes_run(kind)
    assert_names(r, kind)
    doc = r.to_dict()
    points = {p["point"]: p for p in doc["points"]}
    assert points["raw"]["status"] == "ok" and points["augmented"]["status"] == "ok"
    assert doc["loader"]["kind"] == "torchdata.nodes" and doc["loader"]["num_workers"] == 2
    assert doc["batch_size"] == 8 and "Batcher" in doc["batch_size_source"]
    assert doc["verdict"]["witness"] == "rounds"  # threads of their own: the costs alone do not witness


def test_the_augment_of_a_node_graph_is_timed_alone_on_its_mapper_and_advised_on_its_nodes(nodes_run):
    r = nodes_run("augment")
    iso = r.to_dict()["isolated"]
    assert 4.0 < iso["augment"]["ms_per_sample"] < 20.0  # the mapper's Sleep(5 ms) replayed alone
    assert [row["name"] for row in iso["augment"]["breakdown"]["rows"]] == ["Sleep"]
    text = str(r)
    assert "ParallelMapper" in text and "persistent_workers" not in text


def test_a_loader_by_entry(tmp_path):
    (tmp_path / "entry.py").write_text(textwrap.dedent('''
        from bisect_pipeline import Workload
        from bisect_pipeline.testing import planted_nodes

        def make():
            model, loader = planted_nodes("augment", n=32)
            return Workload(model=model, loader=loader)
        '''))
    r = cli_in_process("--entry", "entry.py:make", "--max-seconds", "10", "--verify-seconds", "0", "--json",
                       "out.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["mode"] == "entry" and doc["loader"]["kind"] == "torchdata.nodes"
    assert doc["loader"]["graph"][0] == "IterableWrapper(PlantedIterable)"
    assert {p["point"]: p["status"] for p in doc["points"]}["raw"] == "ok"


# A training script over planted_nodes: its Loader (`loader=True`), or its root node that
# the loop resets and iterates itself each epoch.
TRAIN = textwrap.dedent('''
    import torch
    from bisect_pipeline.testing import planted_nodes

    model, loader = planted_nodes("augment", n=32, loader={loader})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(300):
        {reset}
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    ''')


@pytest.mark.parametrize("loader", [True, False], ids=["Loader", "root node"])
def test_a_graph_under_run_is_the_training_loader_and_its_loop_the_step(tmp_path, loader):
    (tmp_path / "train.py").write_text(TRAIN.format(loader=loader, reset="pass" if loader else "loader.reset()"))
    r = cli_in_process("run", "--max-seconds", "10" if loader else "8", "--verify-seconds", "0", "--json", "out.json",
                       "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["mode"] == "loop" and doc["loader"]["kind"] == "torchdata.nodes"
    src = doc["source"]
    assert src["created_at"].endswith("train.py:5")
    assert src["dataset"] == ("Loader" if loader else "Prefetcher") + " over IterableWrapper"
    assert src["batch_size"] == 8 and src["batches"] > 0
    assert {p["point"]: p["status"] for p in doc["points"]}["raw"] == "ok"
