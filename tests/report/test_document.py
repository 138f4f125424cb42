"""The JSON document of a report, both ways (report/document.py): a report read back
says exactly what the run said; an older document still reads."""

import json
import pathlib

import pytest

from bisect_pipeline import Report
from bisect_pipeline.report import build, measurements_of
from bisect_pipeline.core.results import Note, PointResult
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.derive.drops import POINTS

DEMO = pathlib.Path(__file__).resolve().parents[2] / "docs" / "demo-report.json"
BS = 8


def planted(ms: dict, **kw) -> Report:
    points = []
    for name in POINTS:
        if name in ms:
            wins = tuple(Window(10, 10 * ms[name] / 1e3 * f) for f in (0.99, 1.0, 1.01, 0.995, 1.005))
            points.append(PointResult(name, "ok", Throughput(wins, BS), first_batch_seconds=0.01, wait_seconds=0.2))
        else:
            points.append(PointResult(name, "skipped", reason="no accelerator: host and device coincide"))
    return build(points, BS, "cpu", loader={"num_workers": 0, "pin_memory": False}, run={"cpu_count": 2}, **kw)


def test_a_report_reads_back_the_same_notes_and_all():
    r = planted({"device": 10, "collated": 10.1, "augmented": 10.2, "raw": 60, "full": 61},
                warnings=[Note("shm", "/dev/shm is small")], cache={"batches": 1, "limited_by": "memory budget"})
    doc = json.loads(r.to_json())
    again = Report.from_dict(doc)
    assert again.to_dict() == doc and again.bottleneck == "augment"
    kinds = [(n["kind"], n["derived"]) for n in doc["notes"]]
    assert ("shm", False) in kinds and ("cache", True) in kinds  # measured, and derived from the numbers
    assert again.warnings == r.warnings and len([w for w in again.warnings if "/dev/shm" in w]) == 1


def test_the_demo_document_reads_back_with_its_advice_check_and_timings_unchanged():
    doc = json.loads(DEMO.read_text())
    again = Report.from_dict(doc).to_dict()
    for key in ("verdict", "stages", "advice", "isolated", "verification", "run", "warnings", "loader"):
        assert again[key] == doc[key], key


def test_an_older_document_without_notes_keeps_its_measured_warnings_once():
    r = planted({"device": 10, "augmented": 10.2, "raw": 60, "full": 61}, warnings=["a measured warning"])
    doc = json.loads(r.to_json())
    del doc["notes"]  # as written before notes were kept
    m = measurements_of(doc)
    assert [n.message for n in m.notes] == ["a measured warning"]  # the derived ones are derived again, not kept
    assert Report.from_dict(doc).warnings == r.warnings


def test_another_schema_version_is_refused():
    doc = json.loads(planted({"device": 10, "full": 61}).to_json())
    doc["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version"):
        Report.from_dict(doc)


def paired(ms: dict) -> Report:
    """Each point measured in as many rounds as `ms` lists its ms per batch."""
    points = []
    for name in POINTS:
        if name in ms:
            wins = tuple(Window(10, 10 * t / 1e3 * f, r) for r, t in enumerate(ms[name]) for f in (0.99, 1.01))
            points.append(PointResult(name, "ok", Throughput(wins, BS), first_batch_seconds=0.01))
        else:
            points.append(PointResult(name, "skipped", reason="no accelerator: host and device coincide"))
    return build(points, BS, "cpu", loader={"num_workers": 0, "pin_memory": False}, run={"cpu_count": 2})


def test_schema_2_keeps_each_windows_round_a_tie_and_the_leads():
    r = paired({"device": [10, 10.2, 9.9, 10.1], "collated": [10.1] * 4, "augmented": [10.2] * 4,
                "raw": [55.2, 55.4, 55.0, 55.3], "full": [98.2, 98.6, 98.0, 98.3]})
    doc = json.loads(r.to_json())
    assert doc["schema_version"] == 2 and doc["bottleneck"] == "tie"
    assert doc["verdict"]["tied"] == ["augment", "load"]
    assert [w["round"] for w in doc["points"][0]["windows"]] == [0, 0, 1, 1, 2, 2, 3, 3]
    lead = doc["verdict"]["leads"][0]
    assert (lead["stage"], lead["over"], lead["real"], lead["rounds"]) == ("augment", "load", False, 4)
    assert lead["ms_per_batch"] < lead["threshold_ms"]
    assert next(s for s in doc["stages"] if s["stage"] == "augment")["rounds"] == 4
    again = Report.from_dict(doc)
    assert again.to_dict() == doc and again.verdict.tied == ("augment", "load")


def test_a_schema_1_document_still_reads_and_compares_with_its_windows_noise():
    from bisect_pipeline import compare

    r = planted({"device": 10, "collated": 10.1, "augmented": 10.2, "raw": 60, "full": 61})
    doc = json.loads(r.to_json())
    doc["schema_version"] = 1
    for p in doc["points"]:  # as written before windows had rounds
        for w in p["windows"]:
            w.pop("round", None)
    old = Report.from_dict(doc)
    assert old.bottleneck == "augment" and old.verdict.gap_rounds is None  # the windows' noise, rounds unknown
    assert all(s.rounds is None for s in old.verdict.stages)
    new = paired({"device": [10] * 3, "collated": [10.1] * 3, "augmented": [10.2] * 3, "raw": [30, 30.1, 29.9],
                  "full": [31, 31.2, 30.9]})
    out = compare.compare(old, new)
    assert out["bottleneck"] == ["augment", "augment"]
    aug = next(s for s in out["stages"] if s["stage"] == "augment")
    assert aug["real"] and aug["label"].endswith("cheaper")


def test_a_failed_points_original_error_is_kept_beside_its_cause():
    told = PointResult("full", "failed", reason="load failed: shard a.tar is truncated ...", failed_stage="load",
                       error="ReadError: unexpected end of data @ <_io.BufferedReader name='a.tar'>")
    r = build([told, PointResult("device", "ok", Throughput(tuple(Window(10, 0.1) for _ in range(5)), BS))], BS, "cpu")
    doc = json.loads(r.to_json())
    full = next(p for p in doc["points"] if p["point"] == "full")
    assert full["error"].startswith("ReadError: unexpected end of data")
    assert "error" not in next(p for p in doc["points"] if p["point"] == "device")  # only where there is one
    assert Report.from_dict(doc).point("full").error == told.error
