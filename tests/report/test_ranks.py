"""The job's report under torchrun (report/ranks.py) from gathered documents: the
straggler's verdict, and a run that lost a rank or was stopped by a signal."""

from bisect_pipeline.measure.distributed import Gathered
from bisect_pipeline.report.ranks import combine
from test_document import planted


def _doc(rank, report, wait_ms=0.0):
    return {"rank": rank, "report": report.to_dict(), "input_wait_ms_per_batch": {"full": wait_ms}}


def test_the_straggler_sets_the_verdict():
    fast = planted({"device": 10, "augmented": 10.2, "raw": 10.4, "full": 61})
    slow = planted({"device": 10, "augmented": 10.2, "raw": 60, "full": 61})
    job = combine(fast, Gathered([_doc(0, fast, 0.5), _doc(1, slow, 50.0)], 2), 0)
    assert job.pace_rank == 1 and job.straggler_ranks == (1,) and job.bottleneck == slow.bottleneck
    assert job.to_dict()["distributed"]["lost_ranks"] == []


def test_a_lost_rank_is_named_and_the_survivors_report_follows():
    r1 = planted({"device": 10, "augmented": 10.2}, complete=False, interrupted=True)
    lost = {"rank": 0, "host": "node-a", "pid": 4242, "exit_code": None, "signal": "SIGKILL",
            "how": "its process was killed by SIGKILL (the out-of-memory killer, or a launcher's kill)"}
    job = combine(r1, Gathered([_doc(1, r1)], 2, writer=1, lost=[lost], error="RuntimeError: Connection closed"), 1)
    doc = job.to_dict()
    assert doc["world_size"] == 2 and [d["rank"] for d in doc["ranks"]] == [1]
    assert doc["distributed"]["written_by"] == 1 and doc["distributed"]["lost_ranks"] == [lost]
    assert doc["distributed"]["lost_error"] == "RuntimeError: Connection closed"
    text = " ".join(job.text().split())
    assert "rank 0 was lost mid-run: its process was killed by SIGKILL" in text
    assert "written by rank 1" in text and "rank 1's report follows" in text
    assert "lost: rank 0 on node-a (pid 4242)" in text
    assert "Next: run it again to its end: it was interrupted before a verdict." in text  # not "raise --max-seconds"
    assert job.writer == job.rank  # the command line: this rank writes


def test_a_signal_that_stopped_every_rank_is_said():
    r = planted({"device": 10}, complete=False, interrupted=True)
    job = combine(r, Gathered([_doc(0, r), _doc(1, r)], 2, signals={1: "SIGTERM"},
                              how="every rank stopped at the next agreement"), 0)
    assert job.to_dict()["distributed"]["stopped_by"] == [{"rank": 1, "signal": "SIGTERM"}]
    assert "SIGTERM on rank 1: every rank stopped at the next agreement" in " ".join(job.summary.split())
