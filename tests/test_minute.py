"""The GPU server's minute (issue 51): a 60-s `run --tune --patch` on a pipeline whose
worker pools take 3 s to their first batch, on one fake clock from the run's start to
the change's check: the budget as api.start divides it, the bisection's time, the
advice's check and the search as phases.advise runs them (real visits of planted pools,
test_verify.FakePool), and the patched script's run (change.check, its run planted).
"""

from __future__ import annotations

import pytest
import torch

from bisect_pipeline import api, phases
from bisect_pipeline.advise import change, tune
from bisect_pipeline.advise.diagnose import judged
from bisect_pipeline.core.results import AllocatorHold, Isolated
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.measure import isolate, point_sources
from bisect_pipeline.measure.visit import drive_all
from bisect_pipeline.pipeline.loader import describe
from bisect_pipeline.report import PointResult
from bisect_pipeline.testing import PlantedDataset, make_loader
from conftest import FakeClock
from test_change import SCRIPT, line_of_loader, planted_runs, script  # noqa: F401 (the fixture)
from test_outcome import BS
from test_verify import FakePool

LOAD_MS, STEP_MS, POOL_START_S = 40.0, 5.0, 3.0  # a batch's load (one process), the step, a pool's start
STARTUP_S = 4.0  # the script's own start-up: each run of the patched script pays it again
CORES = 16
BISECTED = 43.0  # seconds the bisection took


def ms_per_batch(workers: int) -> float:
    """The planted pipeline: its load (waiting: many workers overlap it) beside the step."""
    return LOAD_MS + STEP_MS if workers == 0 else max(STEP_MS, LOAD_MS / workers)


def point(name: str, ms: float) -> PointResult:
    wins = tuple(Window(10, ms * 10 / 1e3 * (1 + 0.01 * (i % 3 - 1))) for i in range(9))
    return PointResult(name, "ok", Throughput(wins, BS), visits=3, first_batch_seconds=ms / 1e3)


def test_a_60_s_run_on_a_heavy_start_pipeline_ends_with_a_verdict_a_measured_best_and_a_checked_change(
        script, monkeypatch):
    # issue 51: on a GPU server one `run --tune --patch --max-seconds 180` measured no
    # candidate in its search's share (each fresh pool 2-3 s to a first batch, paid in
    # every visit), and ended with the time kept for checking the change unused. Here:
    # 60 s, a script that starts in 4 s, a load of 40 ms a batch that 8 workers hide
    # behind a 5-ms step, and every pool of workers 3 s to its first batch; the minimum
    # rounds of the bisection ran far past their share (43 s of the 48 before the change's)
    clock = FakeClock(1000.0)
    monkeypatch.setattr(api, "startup_s", lambda *a: STARTUP_S)
    monkeypatch.setattr(isolate, "cores", lambda: CORES)
    monkeypatch.setattr(point_sources, "room_for_a_pool", lambda: True)
    spec = describe(make_loader(PlantedDataset(n=64), batch_size=BS))
    points = ("full", "raw", "device")
    options = phases.Options(points, 60.0, tune=True, patch=True)
    exp = api.start(spec, torch.device("cpu"), options, coord=None, clock=clock)
    assert exp.budget.patching >= 12.0 and exp.end == pytest.approx(1000.0 + 60.0 - exp.budget.patching)

    # the bisection: the load stage named by both witnesses, its minimum rounds to 1043,
    # 5 s before the change's share (a heavy-start pipeline's rounds: every visit of full
    # waits for its pool)
    exp.results = {"full": point("full", ms_per_batch(0)), "raw": point("raw", STEP_MS),
                   "device": point("device", STEP_MS)}
    exp.isolated = Isolated.from_dict({
        "status": "ok", "batch_size": BS,
        "load": {"status": "ok", "ms_per_sample": LOAD_MS / BS, "samples": 64, "cpu_ms_per_sample": 0.1},
        "step": {"status": "ok", "ms_per_batch": STEP_MS, "source": "the device point"},
        "workers": {"status": "ok", "worker_ms_per_batch": LOAD_MS, "step_ms_per_batch": STEP_MS, "needed": 8,
                    "cores": CORES, "available": CORES - 1, "step_threads": 1, "fits": True}})
    clock.t = 1000.0 + BISECTED
    end = exp.end

    def source(name, spec, epochs, calls=None, park=False, variant=None):
        w = spec.num_workers
        return FakePool(clock, POOL_START_S if w else 0.0, ms_per_batch(w) - STEP_MS), None
    monkeypatch.setattr(exp, "_source", source)

    def step(batch):
        clock.t += STEP_MS / 1e3
    FakePool.starts = 0
    src = {"created_at": f"{script}:{line_of_loader()}"}
    draft = exp.measurements(points, held=AllocatorHold(), interrupted=False, mode="loop", source=src)
    assert judged(draft).verdict.bottleneck == "load"
    drive_all(phases.advise(exp, draft, options), step)
    m = exp.measurements(points, held=AllocatorHold(), interrupted=False, mode="loop", source=src)

    # a measured best, near the 8 workers that feed the step, each pool started once (the
    # check's candidate, cut short by its share, continued by the search on its own pool),
    # the search run into the change's share (nothing to check before it found one)
    found = tune.summarize(m.tune, BS)
    assert found.best is not None and found.best.full["num_workers"] >= 6 and found.best.speedup == pytest.approx(9.0, rel=0.05)
    measured = [t for t in m.tune.trials if t.candidate_windows]  # (the check's cut one continued among them)
    assert FakePool.starts == len(measured)
    assert all(t.candidate_start_s == pytest.approx(POOL_START_S, abs=0.1) for t in measured)
    assert clock.t > end and not m.verification.trials[0].candidate_windows  # the check: its pool started, no window

    # the change written and checked by one run of the patched script, inside the minute
    m = change.patched(m, ["train.py"])
    assert m.tune.patch["flags"] == ["-j", str(found.best.full["num_workers"])]
    seen: list = []

    def run(command, env):  # the patched script: its start-up, then what it measures
        seconds = float(command[command.index("--max-seconds") + 1])
        clock.t += STARTUP_S + seconds
        return planted_runs(1e3 / ms_per_batch(found.best.full["num_workers"]), seen,
                            loader=dict(found.best.full, prefetch_factor=2))(command, env)
    checked = change.check(m, change.Target("train.py", None, ()), end=exp.start + 60.0, clock=clock, run=run)
    assert len(seen) == 1
    done = tune.summarize(checked.tune, BS)
    assert done.applied is not None and done.applied.status == "helps" and done.agrees is True
    assert clock.t - 1000.0 <= 60.0 + 1e-6
    spent = checked.run.budget["spent"]
    assert set(spent) == {"bisecting", "checking", "searching", "patching"} and spent["bisecting"] == BISECTED
