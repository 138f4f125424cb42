"""compare: per point and stage changes against the noise; reads JSON only."""

import json
import os
import pickle
import textwrap

import pytest
from click.testing import CliRunner

from bisect_pipeline import compare
from bisect_pipeline.cli import main
from bisect_pipeline.report import PointResult, Report, build
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.derive.drops import POINTS

BS = 16
TESTS = os.path.dirname(os.path.abspath(__file__))


def tp(ms: float, spread: float = 0.01) -> Throughput:
    return Throughput(tuple(Window(10, 10 * ms / 1e3 * f) for f in (1 - spread, 1 - spread / 2, 1, 1 + spread / 2,
                                                                     1 + spread)), BS)


def make_report(ms: dict, num_workers: int = 0, spread: float = 0.01) -> Report:
    skipped = {"host": "no accelerator: host and device coincide"}
    points = tuple(PointResult(p, "ok", tp(ms[p], spread)) if p in ms else PointResult(p, "skipped", reason=skipped["host"])
                   for p in POINTS)
    return build(points, BS, "cpu", loader={"num_workers": num_workers, "pin_memory": False})


BEFORE = {"device": 10, "collated": 10.5, "augmented": 11, "raw": 60, "full": 61}  # augment-bound, 0 workers
AFTER = {"device": 10, "collated": 10.6, "augmented": 11.1, "raw": 30, "full": 30.5}  # 2 workers: half the cost


def test_point_change_labels():
    assert compare.point_change(tp(10), tp(10.2))["label"] == "within noise"  # 2% < the 5% floor
    c = compare.point_change(tp(20), tp(10))  # half the time per batch: twice the samples/s
    assert c["real"] and c["label"] == "2.00\u00d7 faster" and c["ratio"] == pytest.approx(2.0)
    assert compare.point_change(tp(10), tp(25))["label"] == "2.50\u00d7 slower"
    # 30% apart, but windows that disagree by +-60%: not beyond the noise
    assert compare.point_change(tp(10, 0.6), tp(13, 0.6))["label"] == "within noise"
    assert compare.point_change(None, tp(10))["label"] == "not measured in both runs"


def test_compare_per_point_and_stage():
    c = compare.compare(make_report(BEFORE), make_report(AFTER, num_workers=2))
    points = {p["point"]: p for p in c["points"]}
    assert points["full"]["label"] == "2.00\u00d7 faster"
    assert points["device"]["label"] == "within noise"
    assert points["host"]["label"] == "not measured in both runs"
    stages = {s["stage"]: s for s in c["stages"]}
    assert stages["augment"]["diff_ms"] == pytest.approx(-30.1, abs=0.01)
    assert stages["augment"]["label"] == "30.1 ms per batch cheaper"
    assert stages["collate"]["label"] == "within noise"
    assert c["loader_changes"] == {"num_workers": [0, 2]}
    assert c["bottleneck"] == ["augment", "augment"]
    text = compare.to_text(c)
    assert "num_workers 0 -> 2" in text and "Full pipeline: 2.00\u00d7 faster (262.3 -> 524.6 samples/s)" in text


def write(tmp_path, name, report):
    path = tmp_path / name
    report.save_json(str(path))
    return str(path)


def test_compare_cli_on_two_json_files(tmp_path):
    before = write(tmp_path, "before.json", make_report(BEFORE))
    after = write(tmp_path, "after.json", make_report(AFTER, num_workers=2))
    out = tmp_path / "cmp.json"
    r = CliRunner().invoke(main, ["compare", before, after, "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "within noise" in r.output and "2.00\u00d7 faster" in r.output and "ms per batch cheaper" in r.output
    doc = json.loads(out.read_text())
    assert doc["kind"] == "compare" and doc["full"]["real"] is True
    # a run against itself: nothing changed
    r = CliRunner().invoke(main, ["compare", before, before])
    assert r.exit_code == 0 and "Full pipeline: within noise" in r.output and "faster" not in r.output


class _Payload:
    """Unpickling this creates a file: compare must never unpickle."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("content,needle", [
    ("not json at all", "is not a JSON document"),
    ('{"x": 1}', "no schema_version"),
    ("[1, 2]", "holds a JSON list"),
    ('{"kind": "sweep", "schema_version": 1}', "JSON of a sweep"),
    ('{"schema_version": 1, "batch_size": 8, "points": ["full"]}', "not a bisect-pipeline result of schema_version 1"),
    ('{"schema_version": 7, "batch_size": 8}', "unsupported schema_version 7"),
])
def test_compare_rejects_other_documents_with_exit_2(tmp_path, content, needle):
    good = write(tmp_path, "good.json", make_report(BEFORE))
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    r = CliRunner().invoke(main, ["compare", good, str(bad)])
    assert r.exit_code == 2, r.output
    assert "bisect-pipeline: error: compare:" in r.output and needle in r.output and "bad.json" in r.output
    assert "Traceback" not in r.output


def test_compare_never_unpickles(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.json"
    evil.write_bytes(pickle.dumps(_Payload(str(marker))))
    good = write(tmp_path, "good.json", make_report(BEFORE))
    r = CliRunner().invoke(main, ["compare", str(evil), good])
    assert r.exit_code == 2 and "is not a JSON document" in r.output
    assert not marker.exists()
    r = CliRunner().invoke(main, ["compare", str(tmp_path / "missing.json"), good])
    assert r.exit_code == 2 and "missing.json" in r.output


ENTRY = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import PlantedDataset, Sleep, make_loader, tiny_model

    def make(workers=0):
        # 8 x 10 ms of (sleeping) augment per batch, a ~2 ms step
        return tiny_model(2.0), make_loader(PlantedDataset(transform=Sleep(10.0)), batch_size=8, num_workers=workers)

    def make_w4():
        # workers kept between visits (persistent): started once, so a 7-s run gets several
        # windows of full (started anew each visit, a busy 2-core machine measured two)
        return tiny_model(2.0), make_loader(PlantedDataset(transform=Sleep(10.0)), batch_size=8, num_workers=4,
                                            persistent_workers=True)
""")


@pytest.mark.e2e
def test_compare_end_to_end_two_real_runs(tmp_path, no_leftover_workers):
    entry = tmp_path / "cmp_entry.py"
    entry.write_text(ENTRY.format(tests=TESTS))
    runner = CliRunner()
    for func, name in (("make", "w0.json"), ("make_w4", "w4.json")):
        # 12 s: at 7 a busy 2-core machine measured the 4-worker run's full in 3 windows over
        # 2 rounds (t at 2 degrees of freedom), and a 5x change read "within noise"
        r = runner.invoke(main, ["--entry", f"{entry}:{func}", "--max-seconds", "12", "--verify-seconds", "0",
                                 "--quiet", "--points", "full,augmented,device", "--json", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["compare", str(tmp_path / "w0.json"), str(tmp_path / "w4.json")])
    assert r.exit_code == 0, r.output
    assert "num_workers 0 -> 4" in r.output
    full = [line for line in r.output.splitlines() if line.startswith("full ")][0]
    assert "faster" in full, r.output  # 4 sleeping workers overlap the 80 ms of augment per batch: ~4x


def test_a_point_of_one_window_has_no_noise_estimate_and_says_so():
    one = Throughput((Window(10, 10 * 61 / 1e3),), BS)
    c = compare.point_change(one, tp(30.5))
    assert c["real"] is None and "noise unknown (1 window)" in c["label"] and c["threshold_rel"] is None
    # two windows: t at one degree of freedom, any change "within noise" by the rule; said
    # as unknown (CI: 91 -> 412 samples/s, a point of two windows after, read "within noise")
    two = Throughput((Window(11, 0.184), Window(14, 0.324)), BS)
    c = compare.point_change(tp(61), two)
    assert c["real"] is None and "noise unknown (2 windows)" in c["label"] and c["ratio"] > 3
    three = Throughput((Window(11, 0.184), Window(14, 0.324), Window(12, 0.25)), BS)
    assert compare.point_change(tp(61), three)["real"] is not None
    before = make_report(BEFORE)
    after = make_report(AFTER)
    doc = compare.compare(before, build(tuple(PointResult(p.point, p.status, one if p.point == "full" else p.throughput,
                                                          reason=p.reason) for p in after.points), BS, "cpu",
                                        loader={"num_workers": 2, "pin_memory": False}))
    assert doc["full"]["real"] is None
    text = compare.to_text(doc)
    assert "Full pipeline: within noise" not in text and "no noise estimate" in text


def test_compare_warns_when_the_ceiling_itself_moved():
    # the same loader settings, but every point 2x slower: the machine changed, not the loader
    slow = {k: 2 * v for k, v in BEFORE.items()}
    c = compare.compare(make_report(BEFORE), make_report(slow))
    assert c["ceiling"]["point"] == "device" and c["ceiling"]["label"] == "2.00\u00d7 slower"
    assert c["share_of_ceiling"] == [pytest.approx(10 / 61, abs=1e-3)] * 2
    assert "machine's load or the step changed" in c["warning"]
    assert "Warning: the ceiling (device" in compare.to_text(c)
    # a loader change under a steady ceiling: no warning, the share moves
    c = compare.compare(make_report(BEFORE), make_report(AFTER, num_workers=2))
    assert c["warning"] is None and c["ceiling"]["label"] == "within noise"
    assert c["share_of_ceiling"][1] == pytest.approx(10 / 30.5, abs=1e-3)


# --------------------------------------------------------------------------------------
# Per part inside a stage, from hand-built isolated records
# --------------------------------------------------------------------------------------

def with_parts(ms: dict, rows=(), split=None, collate=None, num_workers: int = 0) -> Report:
    """make_report, its isolated costs holding the augment rows (name, where, ms or None
    for a row not run), load's split and collate's."""
    from bisect_pipeline.core.results import Breakdown, BreakdownRow, Isolated, PerSample
    brows = tuple(BreakdownRow(name=n, where=w, ms_per_sample=x, share=None, input="a", output="b", samples=4)
                  if x is not None else BreakdownRow(status="not run", reason="out of time", name=n, where=w)
                  for n, w, x in rows)
    iso = Isolated(augment=PerSample(ms_per_sample=5.0, samples=4, breakdown=Breakdown(rows=brows, samples=4))
                   if rows else None,
                   load=PerSample(ms_per_sample=4.0, samples=4, split=split), collate=collate)
    skipped = {"host": "no accelerator: host and device coincide"}
    points = tuple(PointResult(p, "ok", tp(ms[p])) if p in ms else PointResult(p, "skipped", reason=skipped["host"])
                   for p in POINTS)
    return build(points, BS, "cpu", loader={"num_workers": num_workers, "pin_memory": False}, isolated=iso.to_dict())


T = "dataset.transform"


def test_augment_parts_matched_by_where_then_by_name_and_one_sided_parts_listed():
    before = with_parts(BEFORE, rows=[("ColorJitter", f"{T}[0]", 3.0), ("RandomResizedCrop", f"{T}[1]", 1.0),
                                      ("GaussianBlur", f"{T}[2]", 2.0), ("Normalize", f"{T}[3]", 0.5)])
    # ColorJitter moved after the crop, GaussianBlur dropped, ToDtype added, Normalize not reached this time
    after = with_parts(AFTER, rows=[("RandomResizedCrop", f"{T}[0]", 1.2), ("ColorJitter", f"{T}[1]", 0.75),
                                    ("ToDtype", f"{T}[2]", 0.1), ("Normalize", f"{T}[3]", None)])
    c = compare.compare(before, after)
    parts = c["parts"]
    assert [(p["part"], p["in"]) for p in parts] == [
        ("ColorJitter", "both"), ("RandomResizedCrop", "both"), ("GaussianBlur", "first run only"),
        ("Normalize", "both"), ("ToDtype", "second run only")]
    cj, rrc, blur, norm, dtype = parts
    assert cj["before_ms"] == 3.0 and cj["after_ms"] == 0.75 and cj["diff_ms"] == pytest.approx(-2.25)
    assert cj["where"] == [f"{T}[0]", f"{T}[1]"] and cj["unit"] == "ms/sample"
    assert cj["label"] == f"-2.25 ms/sample (-75%); moved from {T}[0] to {T}[1]"
    assert rrc["label"] == "+0.20 ms/sample (+20%); moved from dataset.transform[1] to dataset.transform[0]"
    assert blur["label"] == "only in the first run" and blur["after_ms"] is None
    assert norm["label"] == "not timed in both runs" and "diff_ms" not in norm
    assert dtype["label"] == "only in the second run" and dtype["before_ms"] is None
    text = compare.to_text(c)
    assert "Inside the stages (timed alone in each run" in text
    line = next(x for x in text.splitlines() if x.startswith("augment  ColorJitter"))
    assert line.split()[:5] == ["augment", "ColorJitter", "ms/sample", "3.00", "0.75"]
    json.dumps(c)  # the document stays JSON


def test_a_transform_in_place_is_matched_by_where_before_its_namesake_elsewhere():
    # two Normalize in the second run: the one at the same place is the same part
    before = with_parts(BEFORE, rows=[("Normalize", f"{T}[1]", 1.0)])
    after = with_parts(AFTER, rows=[("Normalize", f"{T}[0]", 9.0), ("Normalize", f"{T}[1]", 2.0)])
    parts = compare.compare(before, after)["parts"]
    assert [(p["where"], p["in"]) for p in parts] == [([f"{T}[1]", f"{T}[1]"], "both"), ([None, f"{T}[0]"],
                                                                                        "second run only")]
    assert parts[0]["diff_ms"] == pytest.approx(1.0)


def test_load_split_and_collate_split_before_and_after():
    from bisect_pipeline.core.results import Collate, LoadSplit
    split = LoadSplit(read_ms_per_sample=3.0, decode_ms_per_sample=1.0, read_mb_per_s=80.0, bound="read")
    faster = LoadSplit(read_ms_per_sample=0.5, decode_ms_per_sample=1.1, read_mb_per_s=480.0, bound="decode")
    col = Collate(ms_per_batch=12.4, collate_fn="pad", default_collate_ms_per_batch=5.1)
    vectorized = Collate(ms_per_batch=5.5, collate_fn="pad", default_collate_ms_per_batch=5.0)
    c = compare.compare(with_parts(BEFORE, split=split, collate=col), with_parts(AFTER, split=faster,
                                                                                collate=vectorized))
    got = {(p["stage"], p["part"]): p for p in c["parts"]}
    assert list(got) == [("load", "read"), ("load", "decode"), ("collate", "stacking"),
                         ("collate", "your collate's own work")]
    assert got["load", "read"]["label"] == "-2.50 ms/sample (-83%)"
    assert got["load", "decode"]["diff_ms"] == pytest.approx(0.1)
    assert got["collate", "stacking"]["unit"] == "ms/batch" and got["collate", "stacking"]["before_ms"] == 5.1
    own = got["collate", "your collate's own work"]
    assert own["before_ms"] == pytest.approx(7.3) and own["after_ms"] == pytest.approx(0.5)
    assert "where" not in own
    # a split measured in one run only: its parts are listed as such
    one = compare.compare(with_parts(BEFORE, split=split), with_parts(AFTER))["parts"]
    assert [(p["part"], p["label"]) for p in one] == [("read", "only in the first run"),
                                                      ("decode", "only in the first run")]
    # a split that failed is no part
    failed = LoadSplit.missing("failed", "no /proc")
    assert compare.compare(with_parts(BEFORE, split=failed), with_parts(AFTER, split=failed))["parts"] == []


def test_without_parts_the_output_is_as_before():
    c = compare.compare(make_report(BEFORE), make_report(AFTER, num_workers=2))
    assert c["parts"] == []
    assert "Inside the stages" not in compare.to_text(c)


def test_compare_cli_reads_the_parts_from_the_documents(tmp_path):
    before = write(tmp_path, "before.json", with_parts(BEFORE, rows=[("GaussianBlur", f"{T}[0]", 2.0)]))
    after = write(tmp_path, "after.json", with_parts(AFTER, rows=[("GaussianBlur", f"{T}[0]", 0.5)]))
    out = tmp_path / "cmp.json"
    r = CliRunner().invoke(main, ["compare", before, after, "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "-1.50 ms/sample (-75%)" in r.output
    assert json.loads(out.read_text())["parts"][0]["diff_ms"] == pytest.approx(-1.5)
