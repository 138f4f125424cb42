"""torchrun on CPU (gloo): every rank bisects its pipeline in lockstep, rank 0 names the
straggler; a rank that fails at a point does not leave the others blocked."""

import json
import os
import subprocess
import sys
import signal
import textwrap
import time

import pytest
import torch.distributed as dist

from bisect_pipeline.measure import distributed
from bisect_pipeline.report import ranks
from conftest import PLANTED_DATA, assert_names

MAX_SECONDS = 24

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not dist.is_available(),
                                                  reason="torch.distributed is not available")]

ENTRY = PLANTED_DATA + textwrap.dedent('''
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    from bisect_pipeline import Workload

    def _parts(slow_ms):
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
        ds = Data(512, slow_ms if dist.get_rank() == 1 else 0.0)
        return model, DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, seed=0))

    def straggler():
        return _parts(5.0)  # rank 1: 5 ms per sample of augmentation, 40 ms per batch

    def failing():
        model, loader = _parts(0.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        calls = [0]
        def step(batch):
            calls[0] += 1
            if dist.get_rank() == 1 and calls[0] == 40:  # once, in the middle of the first point
                raise RuntimeError("planted failure on rank 1")
            x, y = batch
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return Workload(model=model, loader=loader, step=step)

    def losing():
        # LOSE=rank:how:seconds: that rank's process ends (how: exit, kill), or a SIGTERM
        # comes (term: to that rank, which then steps 2 s late while the other waits in
        # DDP's all-reduce; term-peer: that rank sends it to rank 0, so it lands while rank
        # 0 waits in the all-reduce), or it hangs in its step (hang: the test sends the
        # signals), that many seconds after its first step
        import os, signal, time
        model, loader = _parts(0.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        rank, how, after = os.environ["LOSE"].split(":")
        open(f"rank{dist.get_rank()}.pid", "w").write(str(os.getpid()))
        started = []
        def step(batch):
            now = time.monotonic()
            started.append(now) if not started else None
            if dist.get_rank() == int(rank) and len(started) == 1 and now - started[0] > float(after):
                started.append(now)
                if how == "exit":
                    os._exit(3)
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if how == "hang":
                    open("hung", "w").close()
                    time.sleep(3600)
                os.kill(os.getpid() if how == "term" else int(open("rank0.pid").read()), signal.SIGTERM)
                time.sleep(2)
            x, y = batch
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return Workload(model=model, loader=loader, step=step)
''')


def torchrun(tmp_path, func, timeout=150, then=None, **env):
    """torchrun's 2 ranks on `func` of ENTRY, to the end (`then(tmp_path)` meanwhile)."""
    (tmp_path / "ddp_entry.py").write_text(ENTRY)
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "bisect_pipeline", "--entry", f"{tmp_path / 'ddp_entry.py'}:{func}", "--device", "cpu",
           "--max-seconds", str(MAX_SECONDS), "--json", str(out), "--step-timeout", "30"]
    env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                             start_new_session=True)
    try:
        if then is not None:
            then(tmp_path)
        stdout, stderr = popen.communicate(timeout=timeout)
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.communicate()
    return subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr), out


def _no_children_left() -> None:
    import psutil

    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left behind: {left}"


@pytest.mark.alone  # two ranks in lockstep on the 2 cores, named on the rounds alone: under pytest -n
# 3 beside other tests' runs both read inconclusive once (2026-11-29 10:38), and pass alone
def test_two_ranks_name_the_straggler_and_its_stage(tmp_path):
    proc, out = torchrun(tmp_path, "straggler")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 2 and [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert doc["distributed"]["straggler_ranks"] == [1]
    assert doc["distributed"]["pace_rank"] == 1
    assert_names(doc, "augment")
    waits = [r["input_wait_ms_per_batch"]["full"] for r in doc["ranks"]]
    assert waits[1] > 20 and waits[1] > 4 * waits[0], waits  # rank 1 waits ~40 ms per batch for its data
    rank1 = doc["ranks"][1]["report"]
    assert_names(rank1, "augment")
    # lockstep: both ranks ran the same steps at every point
    for p0, p1 in zip(doc["ranks"][0]["report"]["points"], rank1["points"]):
        assert p0["status"] == p1["status"]
        assert [w["steps"] for w in p0["windows"]] == [w["steps"] for w in p1["windows"]]
    table = {p["point"]: p for p in doc["distributed"]["points"]}
    assert table["full"]["ranks_ok"] == 2 and table["full"]["slowest_samples_per_sec"] is not None
    # only rank 0 prints the report
    assert proc.stdout.count("torch.distributed: world size 2") == 1
    assert "straggler rank(s) 1" in proc.stdout
    _no_children_left()


def test_a_rank_failing_mid_point_does_not_block_the_other(tmp_path):
    proc, out = torchrun(tmp_path, "failing")
    # device fails on both ranks; the other points are measured, so there is a verdict
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    r0, r1 = (doc["ranks"][i]["report"] for i in (0, 1))
    dev0 = next(p for p in r0["points"] if p["point"] == "device")
    dev1 = next(p for p in r1["points"] if p["point"] == "device")
    assert dev1["status"] == "failed" and "planted failure on rank 1" in dev1["reason"]
    assert dev0["status"] == "failed" and "rank 1 failed at this point" in dev0["reason"]
    # the run went on: the next points were measured on both ranks
    for r in (r0, r1):
        full = next(p for p in r["points"] if p["point"] == "full")
        assert full["status"] == "ok"
    _no_children_left()


def _exit_codes(proc) -> dict:
    """{rank: exit code} from torchrun's failure table (ranks that exited 0 are not in it)."""
    import re

    found = re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\n\s*exitcode\s*: (-?\d+)", proc.stderr + proc.stdout)
    return {int(r): int(c) for r, c in found}


def _lost_run(tmp_path, lose, then=None, within=12):
    t0 = time.monotonic()
    proc, out = torchrun(tmp_path, "losing", LOSE=lose, then=then)
    wall = time.monotonic() - t0
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    # in time: the measuring ended with the loss, well within --max-seconds (the start-up,
    # imports and the entry on a busy machine, is before the clock starts)
    assert doc["run"]["elapsed_s"] < within, doc["run"]
    assert wall < doc["run"]["startup_s"] + MAX_SECONDS + 15, (wall, doc["run"]["startup_s"])
    assert doc["complete"] is False and doc["interrupted"] is True and doc["world_size"] == 2
    _no_children_left()
    return proc, doc


@pytest.mark.alone  # two ranks in lockstep on the 2 cores (as the tests above)
@pytest.mark.parametrize("lost,how,code,words", [
    (1, "exit", 3, "its process exited with code 3"),
    (0, "kill", -9, "its process was killed by SIGKILL, usually by the out-of-memory killer"),
])
def test_a_rank_whose_process_ends_mid_run_is_named_and_the_others_results_kept(tmp_path, lost, how, code, words):
    proc, doc = _lost_run(tmp_path, f"{lost}:{how}:2.5")
    survivor = 1 - lost
    dist_ = doc["distributed"]
    assert [r["rank"] for r in doc["ranks"]] == [survivor]  # what the surviving rank measured
    assert dist_["written_by"] == survivor  # rank 0, or the lowest surviving rank when rank 0 is lost
    (entry,) = dist_["lost_ranks"]
    assert entry["rank"] == lost and words in entry["how"]
    assert (entry["exit_code"], entry["signal"]) == ((3, None) if how == "exit" else (None, "SIGKILL"))
    assert dist_["lost_error"]  # the collective that failed
    points = {p["point"]: p for p in doc["ranks"][0]["report"]["points"]}
    assert points["device"]["status"] == "ok"  # measured before the loss, kept
    assert any(p["status"] == "not run" for p in points.values())
    printed = proc.stdout
    assert printed.count("torch.distributed: world size 2") == 1  # the writer alone prints the report
    assert f"rank {lost} was lost mid-run: {words}" in " ".join(printed.split())
    codes = _exit_codes(proc)
    assert codes[lost] == code  # torchrun sees the lost rank end as it did
    assert codes.get(survivor) in (1, 143)  # 143: the launcher's SIGTERM came during the run


@pytest.mark.alone  # two ranks in lockstep on the 2 cores (as the tests above)
@pytest.mark.parametrize("how,signalled", [("term", 1), ("term-peer", 0)])
def test_sigterm_to_one_rank_while_the_other_waits_in_a_collective_stops_both(tmp_path, how, signalled):
    # term: rank 1 is signalled, then steps 2 s late while rank 0 waits in DDP's all-reduce;
    # term-peer: rank 0 is signalled while it waits there
    proc, doc = _lost_run(tmp_path, f"1:{how}:2.5")
    dist_ = doc["distributed"]
    assert dist_["stopped_by"] == [{"rank": signalled, "signal": "SIGTERM"}]
    assert dist_["lost_ranks"] == [] and dist_["written_by"] == 0
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]  # both ranks' results, gathered as at the end
    for r in doc["ranks"]:
        points = {p["point"]: p for p in r["report"]["points"]}
        assert points["device"]["status"] == "ok" and points["full"]["status"] == "not run"
    assert "SIGTERM on rank" in " ".join(proc.stdout.split())
    assert _exit_codes(proc) == {0: 143, 1: 143}  # every rank stopped as on SIGTERM


def _signal_both_once_rank_1_hangs(tmp_path):
    deadline = time.monotonic() + 120
    while not (tmp_path / "hung").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # rank 0 is in DDP's all-reduce, waiting for rank 1
    for r in (0, 1):
        os.kill(int((tmp_path / f"rank{r}.pid").read_text()), signal.SIGTERM)


@pytest.mark.alone  # two ranks in lockstep on the 2 cores (as the tests above)
def test_a_rank_stuck_in_a_collective_at_a_sigterm_is_rescued_in_time(tmp_path):
    # a preempted job: rank 1 hangs in its step, rank 0 waits for it in DDP's all-reduce
    # (native code: its handler cannot run); the SIGTERM to both, and each rank's rescue
    # writes what it measured within its grace, rank 0 the job's document
    # measuring from 0 s, the hang at 2.5, the signal about 1 s later, the rescue 10 s after
    proc, doc = _lost_run(tmp_path, "1:hang:2.5", then=_signal_both_once_rank_1_hangs, within=20)
    dist_ = doc["distributed"]
    assert dist_["stopped_by"] == [{"rank": 0, "signal": "SIGTERM"}, {"rank": 1, "signal": "SIGTERM"}]
    assert "stuck" in dist_["stopped_how"] and dist_["written_by"] == 0 and dist_["lost_ranks"] == []
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert "main thread was stuck" in " ".join(proc.stdout.split())
    assert _exit_codes(proc) == {0: 143, 1: 143}


def test_straggler_rule():
    # (wait s per batch at full, s per batch at full) per rank
    assert ranks.stragglers([(0.0, 0.04), (0.035, 0.04)]) == [1]
    assert ranks.stragglers([(0.0005, 0.04), (0.001, 0.04)]) == []  # nobody really waits
    assert ranks.stragglers([(0.03, 0.04), (0.028, 0.04), (0.0, 0.04)]) == [0, 1]
    assert ranks.stragglers([None, (0.03, 0.04)]) == [1]



def test_closing_the_coordinator_destroys_its_side_group_and_leaves_the_users():
    # Under `run` the script owns the default group; the tool's side group is its own to
    # close, after a last barrier: a rank that left while another still used it aborted
    # now and then in gloo's teardown ("terminate called without an active exception").
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        coord = distributed.Coordinator()
        side = coord.group
        assert dist.get_process_group_ranks(side) == [0]
        coord.close()
        with pytest.raises(KeyError):
            dist.get_process_group_ranks(side)  # gone
        assert dist.is_initialized()  # the user's default group is theirs
    finally:
        dist.destroy_process_group()

SCRIPT = PLANTED_DATA + textwrap.dedent('''
    import os
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def main():
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ds = Data(1024, 5.0 if dist.get_rank() == 1 else 0.0)  # rank 1: 5 ms per sample of augmentation
        sampler = DistributedSampler(ds, seed=0)
        loader = DataLoader(ds, batch_size=8, sampler=sampler)
        lose, after = os.environ.get("LOSE", "-1:0").split(":")  # that rank's script exits, after that many s
        started = []
        try:
            for epoch in range(100):
                sampler.set_epoch(epoch)
                for x, y in loader:
                    started.append(time.monotonic()) if not started else None
                    if dist.get_rank() == int(lose) and time.monotonic() - started[0] > float(after):
                        os._exit(3)
                    opt.zero_grad(set_to_none=True)
                    nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
        finally:
            dist.destroy_process_group()

    if __name__ == "__main__":
        main()
''')


def torchrun_script(tmp_path, **env):
    """torchrun's 2 ranks running SCRIPT under `bisect-pipeline run`, to the end."""
    (tmp_path / "ddp_train.py").write_text(SCRIPT)
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "bisect_pipeline", "run", "--device", "cpu", "--max-seconds", "30", "--json", str(out),
           "ddp_train.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path, start_new_session=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **env))
    return proc, out


@pytest.mark.alone  # two ranks in lockstep on the 2 cores, named on the rounds alone: under pytest -n
# 3 beside other tests' runs both read inconclusive once (2026-11-29 10:38), and pass alone
def test_under_torchrun_every_rank_bisects_the_scripts_own_loop_in_lockstep(tmp_path):
    proc, out = torchrun_script(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 2 and doc["mode"] == "loop"
    assert doc["distributed"]["straggler_ranks"] == [1]
    assert_names(doc, "augment")
    r0, r1 = (doc["ranks"][i]["report"] for i in (0, 1))
    for p0, p1 in zip(r0["points"], r1["points"]):  # lockstep: the same steps at every point
        assert [w["steps"] for w in p0["windows"]] == [w["steps"] for w in p1["windows"]]
    assert proc.stderr.count("torch.distributed: world size 2") == 1  # only rank 0 prints the report
    _no_children_left()


@pytest.mark.alone  # two ranks in lockstep on the 2 cores (as the tests above)
@pytest.mark.parametrize("lost", [1, 0])
def test_under_run_a_rank_whose_script_exits_mid_run_is_named_by_the_other(tmp_path, lost):
    proc, out = torchrun_script(tmp_path, LOSE=f"{lost}:1.5")
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    dist_ = doc["distributed"]
    assert dist_["written_by"] == 1 - lost
    (entry,) = dist_["lost_ranks"]
    assert entry["rank"] == lost and entry["how"] == "its process exited with code 3"
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1]  # the leaving rank posted what it measured
    assert proc.stderr.count("torch.distributed: world size 2") == 1
    assert _exit_codes(proc)[lost] == 3
    _no_children_left()
