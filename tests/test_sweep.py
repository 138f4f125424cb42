"""What-if sweep: parsing, the settings it measures, its table and JSON, end to end
through the CLI on a planted pipeline."""

import json
import os
import sys
import textwrap

import pytest
from click.testing import CliRunner

from bisect_pipeline import BisectError, Workload, sweep
from bisect_pipeline.cli import main
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.core.stats import Throughput, Window
from conftest import FAST_PLAN, PlantedDataset, Sleep, cli_in_process, make_loader, planted, tiny_model

TESTS = os.path.dirname(os.path.abspath(__file__))

ENTRY = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import PlantedDataset, Sleep, make_loader, tiny_model
    from bisect_pipeline import Workload

    def make():
        # 8 x 10 ms of (sleeping) augment per batch, a ~2 ms step: workers overlap it
        loader = make_loader(PlantedDataset(transform=Sleep(10.0)), batch_size=8, num_workers=0)
        return Workload(model=tiny_model(2.0), loader=loader)
""")


def write_entry(tmp_path):
    path = tmp_path / "sweep_entry.py"
    path.write_text(ENTRY.format(tests=TESTS))
    return path


# --- parsing and the settings measured ---------------------------------------------------------


def test_parse_grid():
    grid = sweep.parse(["num_workers=0,2,2,4", "pin_memory=0,true", "prefetch_factor=4", "persistent_workers=1",
                        "batch_size=8,16"])
    assert grid == {"num_workers": [0, 2, 4], "pin_memory": [False, True], "prefetch_factor": [4],
                    "persistent_workers": [True], "batch_size": [8, 16]}


@pytest.mark.parametrize("opt,needle", [
    ("lr=0.1,0.2", "cannot be swept"), ("num_workers", "NAME=V1,V2"), ("num_workers=", "NAME=V1,V2"),
    ("num_workers=-1", "must be >= 0"), ("batch_size=0", "must be >= 1"), ("pin_memory=maybe", "not a boolean"),
    ("num_workers=two", "invalid literal")])
def test_parse_rejects_bad_options_with_a_clear_message(opt, needle):
    with pytest.raises(BisectError, match=needle):
        sweep.parse([opt])
    with pytest.raises(BisectError, match="given twice"):
        sweep.parse(["num_workers=0", "num_workers=2"])


def test_combinations_start_with_the_users_setting_and_drop_no_op_duplicates():
    _, loader = planted("augment", 0)
    combos = sweep.combinations(describe(loader), {"num_workers": [0, 2], "persistent_workers": [False, True]})
    # num_workers=0 makes persistent_workers a no-op: (0, False) and (0, True) are one setting
    assert [(c["num_workers"], c["persistent_workers"]) for c in combos] == [(0, False), (2, False), (2, True)]
    assert combos[0]["prefetch_factor"] is None and combos[1]["prefetch_factor"] == 2


def rows_result(rates: dict, spread: float = 0.01) -> sweep.SweepResult:
    """A SweepResult from planted samples/s per num_workers, the first the user's."""
    rows = []
    for nw, rate in rates.items():
        t = 10 * 8 / rate
        wins = tuple(Window(10, t * f) for f in (1 - spread, 1 - spread / 2, 1, 1 + spread / 2, 1 + spread))
        rows.append(sweep.Row({"num_workers": nw, "pin_memory": False, "prefetch_factor": None,
                               "persistent_workers": False, "batch_size": 8}, "ok", Throughput(wins, 8)))
    return sweep.SweepResult(device="cpu", grid={"num_workers": list(rates)}, rows=tuple(rows), loader={}, run={})


def test_table_names_the_best_with_its_speedup_against_the_users_setting():
    res = rows_result({0: 100.0, 1: 180.0, 2: 250.0})
    assert res.best.settings["num_workers"] == 2
    assert res.speedup(res.best) == pytest.approx(2.5, rel=1e-3)
    text = str(res)
    assert "your setting" in text and "2.50\u00d7" in text and "1.80\u00d7" in text
    assert "Best: num_workers=2 at 250.0 samples/s, 2.50\u00d7 your setting (num_workers=0, 100.0 samples/s)" in text
    doc = res.to_dict()
    assert doc["kind"] == "sweep" and doc["best"]["num_workers"] == 2
    assert [r["user_setting"] for r in doc["rows"]] == [True, False, False]
    assert [r["beyond_noise"] for r in doc["rows"]][1:] == [True, True]


def test_a_gain_within_noise_keeps_the_users_setting():
    res = rows_result({0: 100.0, 2: 103.0})  # 3%: under the 5% floor
    assert not res.beyond_noise(res.rows[1])
    assert "Your setting (num_workers=0) is the best within noise" in res.summary()
    assert "(noise)" in str(res)


def test_sweeping_a_worker_loader_down_to_zero_workers(no_leftover_workers):
    # the user's loader has workers and a multiprocessing_context: num_workers=0 must drop it
    model = tiny_model(2.0)
    loader = make_loader(PlantedDataset(transform=Sleep(2.0)), batch_size=8, num_workers=2)
    res = sweep.run(Workload(model=model, loader=loader), {"num_workers": [0]}, device="cpu", max_seconds=4,
                    plan=FAST_PLAN)
    assert [r.status for r in res.rows] == ["ok", "ok"], [r.reason for r in res.rows]
    assert [r.settings["num_workers"] for r in res.rows] == [2, 0]


# --- end to end through the CLI ------------------------------------------------------------------


@pytest.mark.e2e
def test_sweep_cli_prints_the_table_names_the_best_and_writes_json(tmp_path):
    entry = write_entry(tmp_path)
    out = tmp_path / "sweep.json"
    # in this process (conftest.cli_in_process): the command is sent no signal
    r = cli_in_process("--entry", f"{entry}:make", "--sweep", "num_workers=0,2", "--max-seconds", "15", "--json",
                       str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "num_workers" in r.stdout and "samples/s" in r.stdout and "vs yours" in r.stdout
    assert "your setting" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["kind"] == "sweep" and doc["grid"] == {"num_workers": [0, 2]}
    rows = {row["settings"]["num_workers"]: row for row in doc["rows"]}
    assert rows[0]["user_setting"] and rows[0]["speedup"] == 1.0
    assert rows[2]["status"] == "ok" and rows[2]["speedup"] > 1.3, doc  # 2 workers overlap the 80 ms augment
    assert doc["best"]["num_workers"] == 2
    assert "Best: num_workers=2" in r.stdout and doc["summary"] in r.stdout


def test_sweep_cli_usage_errors_exit_2(tmp_path):
    entry = write_entry(tmp_path)
    r = CliRunner().invoke(main, ["--entry", f"{entry}:make", "--sweep", "learning_rate=1,2"])
    assert r.exit_code == 2
    assert "learning_rate" in r.output and "cannot be swept" in r.output
    assert "Traceback" not in r.output
