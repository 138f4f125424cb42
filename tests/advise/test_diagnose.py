"""What follows from the measurements (diagnosis.py, pure): the verdict, the points left
out, the notes the numbers call for, the advice before and after its check, the summary."""

import dataclasses

import pytest

from bisect_pipeline.advise.diagnose import derived_notes, diagnose, points_note, summary, to_check
from bisect_pipeline.core.results import (AllocatorHold, CacheInfo, Isolated, Measurements, Note, PointResult, RunInfo,
                                          Verification, Workers)
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.derive.drops import POINTS

BS = 8
AUGMENT = {"device": 10, "collated": 10.1, "augmented": 10.2, "raw": 60, "full": 61}


def windows(ms: float, spread: float = 0.01) -> Throughput:
    return Throughput(tuple(Window(10, 10 * ms / 1e3 * f) for f in (1 - spread, 1 - spread / 2, 1, 1 + spread / 2,
                                                                  1 + spread)), BS)


def measurements(ms: dict, *, spread: dict = {}, point_kw: dict = {}, **kw) -> Measurements:
    points = tuple(PointResult(n, "ok", windows(ms[n], spread.get(n, 0.01)), **point_kw.get(n, {})) if n in ms
                   else PointResult(n, "skipped", reason="no accelerator: host and device coincide") for n in POINTS)
    kw.setdefault("loader", {"num_workers": 0, "pin_memory": False})
    kw.setdefault("run", RunInfo(cpu_count=2))
    return Measurements("cpu", BS, points, **kw)


def test_the_verdict_the_summary_and_the_points_as_shown():
    d = diagnose(measurements(AUGMENT))
    assert d.bottleneck == "augment" and d.rate("full") == pytest.approx(BS / 0.061)
    assert summary(d).startswith("Bottleneck: augment. It costs 49.") and d.summary == summary(d)
    assert [p.point for p in d.points] == list(POINTS)  # upstream first, whatever order they came in


def test_a_point_slower_than_one_doing_more_work_is_left_out_and_said():
    d = diagnose(measurements({"device": 30, "collated": 10.1, "augmented": 10.2, "raw": 60, "full": 61}))
    dev = d.point("device")
    assert dev.status == "failed" and dev.failed_stage == "inconsistent"
    assert any(n.kind == "inconsistent" and n.point == "device" and n.derived for n in d.notes)
    assert d.verdict.ceiling == "collated" and d.bottleneck == "augment"


def test_the_notes_the_numbers_call_for():
    m = measurements(AUGMENT, spread={"full": 0.3},
                     point_kw={"raw": {"stopped_by_deadline": True}, "augmented": {"steady": False},
                               "device": {"pauses": 3, "paused_seconds": 1.5, "discarded": 1}},
                     cache=CacheInfo(batches=2, limited_by="memory budget"),
                     loader={"num_workers": 4, "pin_memory": False},
                     run=RunInfo(cpu_count=2, allocator=AllocatorHold(controlled=False, reason="musl")),
                     notes=(Note("shm", "measured while filling"),))
    d = diagnose(m)
    kinds = {n.kind for n in d.notes if n.derived}
    assert kinds >= {"noise", "deadline", "unsteady", "paused", "cache", "workers", "allocator"}
    assert d.notes[0] == Note("shm", "measured while filling")  # the measured ones first, as they were
    paused = next(n for n in d.notes if n.kind == "paused")
    assert paused.point == "device"
    assert paused.message == "Loop paused 3 times at device (1.5 s, 1 window voided): raise --max-seconds."
    assert paused.detail.endswith(": the window under way when one came was discarded, so that no window holds the "
                                  "pause")
    # a pause between windows voids none: nothing to do, and its why says no more than that
    between = points_note("paused", [PointResult("full", "ok", pauses=1, paused_seconds=0.6)])
    assert between.message == "Loop paused 1 time at full (0.6 s, in no window): nothing to do."
    assert between.detail == "epoch ends, evaluations, other loaders: it came between windows"
    assert derived_notes(d) == [n for n in d.notes if n.derived]


def test_the_advice_is_checked_only_once_a_check_was_made():
    iso = Isolated(workers=Workers(needed=3, worker_ms_per_batch=50.0, step_ms_per_batch=10.0, cores=8, available=7,
                                   fits=True))
    m = measurements(AUGMENT, isolated=iso)
    draft = to_check(m)
    assert [f.kind for f in draft][:1] == ["num_workers"] and draft[0].verified is None
    off = diagnose(dataclasses.replace(m, verification=Verification(status="off", reason="turned off")))
    f = next(f for f in off.advice if f.kind == "num_workers")
    assert f.verified.status == "not measured" and f.message.endswith("Not measured before printing: turned off.")
    assert next(f for f in diagnose(m).advice if f.kind == "num_workers").verified is None  # no check: as written


def test_no_verdict_without_the_full_pipeline_says_why():
    points = tuple(PointResult(n, "failed", reason="boom", failed_stage="load") if n == "full"
                   else PointResult(n, "skipped", reason="x") for n in POINTS)
    d = diagnose(Measurements("cpu", BS, points))
    assert d.bottleneck is None and "failed: boom" in d.verdict.reason and summary(d).startswith("No verdict")


def test_a_cache_limited_by_the_memory_budget_says_the_arithmetic():
    mb = 2**20
    c = CacheInfo(batches=5, limited_by="memory budget", budget_bytes=1024 * mb,
                  held={"raw_inputs": 0, "samples": 5 * 39 * mb, "collated": 5 * 39 * mb, "point_copy": 5 * 39 * mb})
    d = diagnose(measurements(AUGMENT, cache=c))
    (note,) = [n for n in d.notes if n.kind == "cache"]
    assert note.message == "The caches hold 5 batches, limited by the memory budget: raise --cache-mb."
    # the arithmetic is its why (the HTML folds it, the JSON keeps it)
    assert note.detail.startswith("--cache-mb counts everything cached at once: per batch 39.0 MB collated + 39.0 MB "
                                  "as samples + 0.0 MB of the transforms' inputs + 39.0 MB for the copy the host or "
                                  "device point makes while it is measured = 117.0 MB; 5 batch(es) hold 585.0 MB of "
                                  "1,024.0 MB, and one more would not fit")
    # a document written before the parts were counted: the note without its arithmetic
    old = diagnose(measurements(AUGMENT, cache=CacheInfo(batches=5, limited_by="memory budget")))
    assert [(n.message, n.detail) for n in old.notes if n.kind == "cache"] == [
        (note.message, "cached points cycle over fewer distinct batches")]
    # limited by time: what to raise is --max-seconds
    timed = diagnose(measurements(AUGMENT, cache=CacheInfo(batches=1, limited_by="time")))
    assert [n.message for n in timed.notes if n.kind == "cache"] == [
        "The caches hold 1 batch, limited by time: raise --max-seconds."]


def test_a_stage_named_on_its_cost_alone_while_the_rounds_read_nothing_is_summed_up_with_that_cost():
    """verdict._bound_alone names a stage the rounds cannot tell (they read 0.0 ms within
    their noise): the summary gives the cost the costs alone put on the loop, not the
    rounds' 0.0 ms, 0% lost and +0% without it, which would contradict the name."""
    d = diagnose(measurements({"device": 50, "augmented": 50, "raw": 50, "full": 50}))
    assert not d.stage("augment").significant
    v = dataclasses.replace(d.verdict, bottleneck="augment", witness="isolated costs",
                            predicted={"augment": (0.0102, 0.0004, 0.0004), "load": (0.0007, 0.0001, 0.0001)})
    s = summary(dataclasses.replace(d, verdict=v))
    assert s.startswith("Bottleneck: augment, named on the stages' costs alone: by them it costs the loop 10.2 ms "
                        "of every 50.0-ms batch, where the rounds read 0.0 ms, within their noise")
    assert "+0%" not in s and "lost to input" not in s
