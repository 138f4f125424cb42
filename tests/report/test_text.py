"""The text report (`str(report)`), on reports built from planted numbers (no run): every
line fits 80 columns, each table states its one time unit, numbers line up, and the
verdict and the advice come last, readable as whole sentences."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import pytest
import torch

from bisect_pipeline.advise import advice as advice_mod
from bisect_pipeline.derive.findings import Finding
from bisect_pipeline.report import Report
from bisect_pipeline.core.results import Isolated, PointResult
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.report import build
from bisect_pipeline.report.text import to_text
from bisect_pipeline.report.text_layout import WIDTH
from test_html import AUGMENT, planted_report

LONG_ADVICE = ("num_workers=0: augment (62.2 ms per batch) runs in the training loop's own process. Alone it costs "
               "60.1 ms of worker work per batch against a 34.8 ms step: 2 worker(s) would feed the step. "
               "Set num_workers=2.")


def blocks(text: str) -> list:
    return [b.splitlines() for b in text.split("\n\n")]


def table(text: str, title_start: str) -> list:
    (block,) = [b for b in blocks(text) if b[0].startswith(title_start)]
    assert set(block[2].replace(" ", "")) == {"-"}  # title, header, rule, rows
    return block


def row(block: list, first: str) -> str:
    (line,) = [ln for ln in block[3:] if ln.split() and ln.split()[0] == first]
    return line


def right_edge(header: str, name: str) -> int:
    return header.index(name) + len(name)


@pytest.fixture
def long_advice(monkeypatch):
    monkeypatch.setattr(advice_mod, "findings", lambda r: [
        Finding("workers", "augment", LONG_ADVICE),
        Finding("augment", "augment", "Second piece of advice, " + "quite long " * 12 + "end."),
    ])


def test_every_line_fits_80_columns(long_advice):
    r = planted_report(
        {"device": 950.0, "collated": 930.0, "full": 320.0},
        status={"augmented": ("failed", "RuntimeError: " + "a very long error message from user code " * 4),
                "raw": ("unavailable", "the dataset has no transform attribute to split raw samples from " * 2)},
        loader={"dataset": "AVeryLongDatasetClassNameThatGoesOnAndOn" * 3, "num_workers": 4, "pin_memory": True},
        warnings=("full: windows disagree by 40% (IQR/median); the machine is busy or the pipeline is bursty. "
                  "Close other work or raise --max-seconds for more windows.", "x" * 120),
        complete=False,
    )
    text = to_text(r)
    assert WIDTH == 80
    too_wide = [ln for ln in text.splitlines() if len(ln) > 80]
    assert too_wide == []
    # one line, its reason below the table, wrapped, not cut: the failed point's reason is all there
    block = table(text, "Throughput at each point")
    mark = row(block, "augmented").split()[-1]
    assert row(block, "augmented").endswith("failed " + mark) and mark.startswith("[")
    start = next(i for i, ln in enumerate(block) if ln.startswith(mark + " "))
    cont = list(itertools.takewhile(lambda ln: ln.startswith("    "), block[start + 1:]))
    note = " ".join(ln.strip() for ln in [block[start][len(mark):]] + cont)
    assert note.startswith("RuntimeError: a very long error message")
    assert note.count("from user code") == 4
    assert "Incomplete run (stopped by --max-seconds)." in " ".join(blocks(text)[0])  # in the summary


def test_each_table_states_its_time_unit_and_uses_only_it():
    r = planted_report(AUGMENT)
    text = to_text(r)
    points = table(text, "Throughput at each point")
    assert points[0].endswith("(times in ms)")
    stages = table(text, "What each stage costs")
    assert stages[0].endswith("(times in ms per batch)")
    # full runs at 320 samples/s with batches of 32: 100 ms per batch, printed in ms
    full = row(points, "full").split()
    assert full[1:4] == ["320.0", "±1.0%", "100.00"] and full[4] == "50"  # first batch 0.05 s
    # augment costs 32/330 - 32/920 s per batch = 62.19 ms; without it 32/(100 - 62.19 ms)
    augment = row(stages, "augment").split()
    cost = 32 / 330 - 32 / 920
    assert augment[1] == f"{cost * 1e3:.2f}" == "62.19"
    free = 32 / (32 / 320 - cost)
    assert augment[2] == "-"  # no isolated costs planted: no second witness
    assert augment[3] == "94%" and augment[4] == f"{free:.1f}" and augment[5] == f"+{(free / 320 - 1) * 100:.0f}%"
    for block in (points, stages):
        for line in block[1:]:
            assert not re.search(r"\d\s*(s|sec|µs|us)\b", line), line  # no second unit in a table


def test_numbers_are_right_aligned_in_their_columns():
    r = planted_report({"device": 12345.0, "collated": 930.0, "augmented": 920.0, "raw": 33.0, "full": 32.0})
    text = to_text(r)
    points = table(text, "Throughput at each point")
    header = points[1]
    for name in ("samples/s", "spread", "per batch", "first batch"):
        edge = right_edge(header, name)
        for line in points[3:]:
            if line[:9].strip() and not line.startswith("["):  # a row, not a wrapped note or a footnote
                assert line[edge - 1] != " " and (len(line) == edge or line[edge] == " "), (name, line)
    rates = [row(points, p) for p in ("device", "collated", "raw")]
    dots = {ln.index(".", len("device")) for ln in rates}
    assert len(dots) == 1  # 12,345.0 and 33.0: the decimal points line up
    stages = table(text, "What each stage costs")
    for name in ("added", "of gap", "samples/s if free", "gain"):
        edge = right_edge(stages[1], name)
        for line in stages[3:]:
            if line[:8].strip() and not line.startswith("["):  # a row, not a footnote
                assert line[edge - 1] != " ", (name, line)


def test_noise_is_said_in_the_note_not_glued_to_the_number():
    r = planted_report({"device": 950.0, "collated": 948.0, "augmented": 920.0, "raw": 330.0, "full": 320.0})
    stages = table(to_text(r), "What each stage costs")
    collate = row(stages, "collate")
    assert "within noise (±" in collate
    assert re.match(r"collate\s+\d+\.\d\d\s+-\s+\d+%", collate)  # its cost, none alone (not planted), its share


def test_the_answer_comes_first_then_warnings_advice_and_the_evidence(long_advice):
    r = planted_report(AUGMENT, warnings=("device: windows disagree by 14% (IQR/median)",))
    text = to_text(r)
    lines = text.splitlines()
    # the summary opens the report, wrapped at word boundaries: it reads back as the verdict's sentence
    summary = blocks(text)[0]
    assert " ".join(summary).startswith(r.summary) and len(summary) <= 6
    assert max(len(ln) for ln in summary) <= 80
    at = {k: next(i for i, ln in enumerate(lines) if ln.startswith(k)) for k in (
        "Warnings:", "What to do", "Why augment:", "What each stage costs", "Throughput at each point",
        "bisect-pipeline: device")}
    assert list(at) == sorted(at, key=at.get)  # in that order
    # the advice: each item numbered, its action first, continuation lines indented under it
    bullets = lines[at["What to do"] + 1:at["Why augment:"] - 1]
    assert bullets[0].startswith("  1. ") and sum(ln.startswith("  2. ") for ln in bullets) == 1
    assert all(ln.startswith("     ") for ln in bullets if not ln.startswith(("  1. ", "  2. ")))
    # the first is the summary's first change, said there; the second in full
    assert bullets[0] == "  1. The first change, above." and LONG_ADVICE in " ".join(summary)
    second = bullets[bullets.index(next(b for b in bullets if b.startswith("  2. "))):]
    assert " ".join(ln.strip() for ln in second).startswith("2. Second piece of advice, quite long")


def test_each_advice_item_leads_with_its_action_and_figure_the_reasoning_indented_beneath():
    from bisect_pipeline.core.results import Isolated
    iso = Isolated.from_dict({"status": "ok", "workers": {"status": "ok", "needed": 3, "cores": 8, "available": 7,
                                                          "step_threads": 1, "worker_ms_per_batch": 60.0,
                                                          "step_ms_per_batch": 35.0}})
    r = planted_report(AUGMENT, isolated=iso.to_dict())
    text = to_text(r)
    summary = " ".join(blocks(text)[0])
    # unchecked (no verification block): the first change says it was not measured
    assert "First change: set num_workers=3, persistent_workers=True: not measured." in summary
    (advice,) = [b for b in blocks(text) if b[0].startswith("What to do")]
    assert advice[1] == "  1. The first change, above; why:"
    assert advice[2].startswith("       With num_workers=0, augment runs in the training loop's own process.")
    second = next(i for i, ln in enumerate(advice) if ln.startswith("  2. "))
    assert all(ln.startswith("       ") for ln in advice[2:second])
    # the second item: its action and its figure, then the reasoning beneath
    assert advice[second] == "  2. Make the dataset's transforms cheaper."
    assert advice[second + 1].startswith("       Move work that is the same every epoch")


def test_quiet_summary_and_json_summary_stay_one_line():
    r = planted_report(AUGMENT)
    assert "\n" not in r.summary and len(r.summary) > 80
    assert r.to_dict()["verdict"]["summary"] == r.summary


def test_a_report_loaded_from_json_renders_the_same():
    r = planted_report(AUGMENT)
    again = Report.from_dict(json.loads(r.to_json()))
    assert to_text(again).splitlines()[:4] == to_text(r).splitlines()[:4]
    assert "Bottleneck: augment" in to_text(again)


def test_a_noisy_run_says_inconclusive_and_claims_no_input_bound_class():
    # a noisy run: full looks 30% slower than the ceiling, but within noise: neither
    # "keeps up" nor "highly input-bound" can be said
    r = planted_report({"device": 950.0, "full": 665.0}, jitter=0.6)
    assert r.bottleneck == "inconclusive" and r.verdict.input_bound_fraction > 0.2
    text = " ".join(to_text(r).split())
    assert text.startswith("Inconclusive: whether input holds the step back is not known yet")
    assert "Why inconclusive: the measurements are too noisy to tell (the loss to input could be up to" in text
    assert "Windows spread ±" in text and " at full and device: close other programs." in text  # where: a warning
    assert "keeps up" not in text and "Input-bound:" not in text and "input-bound)" not in text
    # no rounds in a planted run without them: what to do next, from the noise
    assert "Next: close other work on this machine, or raise --max-seconds for more rounds." in text


def test_input_bound_line_of_a_none_verdict_says_the_loss_is_within_noise():
    r = planted_report({"device": 950.0, "full": 940.0})
    assert r.bottleneck == "none"
    text = " ".join(to_text(r).split())
    assert text.startswith("The input pipeline keeps up: the full pipeline runs at the ceiling within noise (it "
                           "loses at most ")
    assert "the training step itself is the limit." in text
    assert "Input-bound:" not in text and "lost to input" not in text  # no class but `not` claimed


def test_the_head_says_where_the_batch_size_comes_from_unless_it_is_the_loaders():
    counted = "counted in the collated batch: loader batch_size 8 \u00d7 4 per sample"
    r = planted_report(AUGMENT, batch_size_source=counted)
    (run,) = [b for b in blocks(to_text(r)) if b[0].startswith("bisect-pipeline: device")]
    assert " ".join(" ".join(run).split()).startswith(f"bisect-pipeline: device cpu, batch size 32 ({counted})")
    assert f"32 ({counted})" in r._repr_html_()
    plain = planted_report(AUGMENT, batch_size_source="DataLoader.batch_size")
    (run,) = [b for b in blocks(to_text(plain)) if b[0].startswith("bisect-pipeline: device")]
    assert run[0].startswith("bisect-pipeline: device cpu, batch size 32, num_workers")
    assert Report.from_dict(r.to_dict()).batch_size_source == counted  # the document keeps it


def _with_breakdown(rates: dict, agrees=True, cut=False, reorders=None, in_place=None) -> Report:
    from bisect_pipeline.core.results import Breakdown, BreakdownRow, Isolated, PerSample
    rows = (BreakdownRow(name="RandomResizedCrop", where="dataset.transform[0]", ms_per_sample=5.0, share=0.2,
                         input="500x375 RGB", output="224x224 RGB", samples=4),
            BreakdownRow(name="ToTensor", where="dataset.transform[1]", ms_per_sample=20.0, share=0.8,
                         input="224x224 RGB", output="3x224x224 float32", samples=4))
    if cut:
        rows += (BreakdownRow(status="not run", reason="out of time: the budget ran out before it",
                              name="Normalize", where="dataset.transform[2]"),)
    b = Breakdown(rows=rows, samples=4, sum_ms_per_sample=None if cut else 25.0, augment_ms_per_sample=26.0 if agrees
                  else 40.0, tolerance_ms=5.2, tolerance="20%", agrees=None if cut else agrees, reorders=reorders)
    aug = (PerSample(ms_per_sample=26.0, samples=4, breakdown=b) if in_place is None else
           PerSample(ms_per_sample=in_place, samples=4, breakdown=b, alone_ms_per_sample=26.0))
    iso = Isolated(augment=aug, items_per_batch=32)
    return planted_report(rates, isolated=iso.to_dict())


def test_augment_timed_in_the_datasets_own_calls_is_told_apart_from_the_rows_replayed_alone():
    """Augment's cost alone timed where the dataset calls its transforms (21.5) differs from
    the breakdown's whole, replayed on the cached inputs (26.0): the report says which is
    which, in the text and the HTML, and says nothing where the two are one figure."""
    r = _with_breakdown(AUGMENT, in_place=21.5)
    said = ("Where the dataset calls them, in its own __getitem__, the transforms took 21.50 ms/sample: augment's "
            "cost alone. The rows are replayed on the cached inputs.")
    block = table(to_text(r), "The augment stage transform by transform")
    assert " ".join(line.strip() for line in block[-4:]).endswith(said)
    assert said.replace("'", "&#x27;") in r._repr_html_()
    assert Report.from_dict(r.to_dict()).isolated.augment.alone_ms_per_sample == 26.0  # the document keeps it
    assert "Where the dataset calls them" not in to_text(_with_breakdown(AUGMENT))


def test_the_augment_breakdown_is_a_table_under_the_stages_only_when_augment_is_in_question():
    r = _with_breakdown(AUGMENT)
    text = to_text(r)
    block = table(text, "The augment stage transform by transform")
    assert block[0].endswith("times in ms per sample)")
    assert row(block, "RandomResizedCrop").split() == ["RandomResizedCrop", "5.00", "20%", "500x375", "RGB", "->",
                                                       "224x224", "RGB"]
    assert row(block, "ToTensor").split()[1:3] == ["20.00", "80%"]
    assert " ".join(block[-2:]).startswith("Sum 25.00 over 4 samples; the stage replayed whole 26.00: they agree")
    stages_at = text.index("What each stage costs")
    assert stages_at < text.index("The augment stage transform by transform") < text.index("Isolated (this process")
    assert all(len(line) <= WIDTH for line in text.splitlines())
    # the same measurements, another bottleneck: no table
    load_bound = _with_breakdown({"device": 950.0, "collated": 930.0, "augmented": 920.0, "raw": 910.0,
                                  "full": 320.0})
    assert load_bound.bottleneck == "load"
    assert "transform by transform" not in to_text(load_bound)
    # load and augment tied for the lead: both are in question, the table shown
    tied = _with_breakdown({"device": 950.0, "collated": 930.0, "augmented": 920.0, "raw": 500.0, "full": 330.0})
    assert tied.bottleneck == "tie" and set(tied.verdict.tied) == {"load", "augment"}
    assert "Bottleneck: augment and load, tied" in str(tied) or "Bottleneck: load and augment, tied" in str(tied)
    assert table(to_text(tied), "The augment stage transform by transform")[3:] == block[3:]
    # unless asked for always (--breakdown all): the same table
    every = load_bound.text(breakdown="all")
    assert table(every, "The augment stage transform by transform")[3:] == block[3:]
    assert str(r) == r.text() == r.text(breakdown="all")
    # and a report loaded from its JSON renders it the same
    assert to_text(Report.from_dict(json.loads(json.dumps(r.to_dict())))) == text


def test_the_breakdown_says_when_its_parts_disagree_with_the_whole_or_were_cut():
    text = " ".join(to_text(_with_breakdown(AUGMENT, agrees=False)).split())
    assert "they disagree by more than the noise (±5.20)" in text
    cut = table(to_text(_with_breakdown(AUGMENT, cut=True)), "The augment stage transform by transform")
    assert row(cut, "Normalize").split()[1:5] == ["-", "-", "not", "run:"]
    assert "the parts have no sum" in " ".join(cut)


def _isolated_line(collate: dict) -> str:
    from bisect_pipeline.core.results import Isolated
    text = to_text(planted_report(AUGMENT, isolated=Isolated.from_dict({"status": "ok", "collate": collate}).to_dict()))
    (line,) = [b for b in blocks(text) if b[0].startswith("Isolated")]
    return " ".join(" ".join(line).split())


def test_a_custom_collate_is_split_into_stacking_and_its_own_work():
    own = {"status": "ok", "ms_per_batch": 12.4, "batches": 5, "collate_fn": "mixup"}
    assert "collate 12.40 ms/batch (stacking 5.10 + your collate 7.30)" in _isolated_line(
        dict(own, default_collate_ms_per_batch=5.1))
    assert "collate 3.00 ms/batch (default_collate on the same samples: 5.10)" in _isolated_line(
        dict(own, ms_per_batch=3.0, default_collate_ms_per_batch=5.1))
    # default_collate itself, or one that default_collate cannot stack: the figure alone
    assert "collate 12.40 ms/batch." in _isolated_line(dict(own, default_collate_reason="TypeError: no"))


def test_a_row_under_a_random_container_says_on_how_many_samples_it_ran():
    from bisect_pipeline.core.results import Breakdown, BreakdownRow, Isolated, PerSample
    rows = (BreakdownRow(name="GaussianBlur", where="dataset.transform[0][0]", ms_per_sample=1.0, share=0.5,
                         input="3x8x8 uint8", output="3x8x8 uint8", samples=20, ran=9),
            BreakdownRow(name="Solarize", where="dataset.transform[0][1]", ms_per_sample=0.0, share=0.0,
                         samples=20, ran=0),
            BreakdownRow(name="Normalize", where="dataset.transform[1]", ms_per_sample=1.0, share=0.5,
                         input="3x8x8 float32", output="3x8x8 float32", samples=20, ran=20))
    iso = Isolated(augment=PerSample(ms_per_sample=2.0, samples=20,
                                     breakdown=Breakdown(rows=rows, samples=20, sum_ms_per_sample=2.0)))
    body = " ".join(to_text(planted_report(AUGMENT, isolated=iso.to_dict())).split())
    assert "3x8x8 uint8 -> 3x8x8 uint8; ran on 9 of 20 samples" in body
    assert "Solarize" in body and "ran on 0 of 20 samples" in body and "None" not in body
    assert "float32; ran on" not in body  # a row that ran on every sample says nothing more


def test_the_costliest_transform_measured_in_the_pipeline_is_printed_beside_its_prediction():
    from bisect_pipeline.core.results import Breakdown, BreakdownRow, Confirmation, Isolated, PerSample
    rows = (BreakdownRow(name="GaussianBlur", where="dataset.transform[1]", ms_per_sample=4.0, share=1.0,
                         input="3x8x8 uint8", output="3x8x8 uint8", samples=8),)

    def text_with(c):
        b = Breakdown(rows=rows, samples=8, sum_ms_per_sample=4.0, confirmed=c)
        iso = Isolated(augment=PerSample(ms_per_sample=4.0, samples=8, breakdown=b))
        return " ".join(to_text(planted_report(AUGMENT, isolated=iso.to_dict())).split())
    ok = Confirmation(transform="GaussianBlur", where="dataset.transform[1]", predicted_ms_per_batch=32.0,
                      measured_ms_per_batch=29.5, tolerance_ms=2.25, real=True, with_ms_per_batch=40.1,
                      without_ms_per_batch=10.6, windows=12)
    assert ("In the pipeline with num_workers=0: GaussianBlur (dataset.transform[1]) costs the loop 29.5 ± 2.2 ms per "
            "batch (40.1 with it, 10.6 from its cached output, 12 windows); predicted from its isolated cost: 32.0."
            in text_with(ok))
    noise = text_with(dataclasses.replace(ok, real=False, measured_ms_per_batch=0.4))
    assert "costs the loop 0.4 ± 2.2 ms per batch (within the noise: no real cost)" in noise
    off = text_with(Confirmation.missing("skipped", "the check is off (verify_seconds=0)"))
    assert "In the pipeline with num_workers=0: the costliest transform not measured (skipped: the check is off" in off
    assert "In the pipeline" not in text_with(None)
LOAD = {"device": 950.0, "collated": 930.0, "augmented": 920.0, "raw": 910.0, "full": 320.0}


def _with_split(rates: dict, split: dict) -> Report:
    from bisect_pipeline.core.results import Isolated
    iso = {"status": "ok", "load": {"status": "ok", "ms_per_sample": 12.0, "samples": 8, "includes": ["load"],
                                    "split": split}}
    return planted_report(rates, isolated=Isolated.from_dict(iso).to_dict())


READ_SPLIT = {"status": "ok", "read_ms_per_sample": 9.0, "decode_ms_per_sample": 3.0, "bytes_per_sample": 2_000_000.0,
              "read_mb_per_s": 222.2, "files_per_sample": 1.0, "samples": 8, "bound": "read", "how": "open()"}


def test_load_split_into_read_and_decode_is_a_table_only_when_load_is_the_bottleneck():
    r = _with_split(LOAD, READ_SPLIT)
    assert r.bottleneck == "load"
    text = to_text(r)
    block = table(text, "Load split into read and decode")
    assert block[0].endswith("8 samples, times in ms per sample)")
    assert row(block, "read").split()[:8] == ["read", "9.00", "75%", "222.2", "MB/s,", "2.0", "MB", "per"]
    assert row(block, "decode").split()[:3] == ["decode", "3.00", "25%"]
    said = " ".join(" ".join(b) for b in blocks(text) if b[0].startswith("Load split"))
    assert "Read is the larger part: attack storage" in said and "page cache" in said
    assert text.index("What each stage costs") < text.index("Load split") < text.index("Isolated (this process")
    assert all(len(line) <= WIDTH for line in text.splitlines())
    assert to_text(Report.from_dict(json.loads(json.dumps(r.to_dict())))) == text
    # another bottleneck: no table, unless asked for always
    augment_bound = _with_split(AUGMENT, dict(READ_SPLIT, bound="decode", read_ms_per_sample=1.0,
                                              decode_ms_per_sample=11.0))
    assert "Load split" not in to_text(augment_bound)
    every = table(augment_bound.text(breakdown="all"), "Load split into read and decode")
    assert row(every, "decode").split()[:3] == ["decode", "11.00", "92%"]
    assert "Decode is the larger part: attack decoding" in " ".join(every)


def test_a_load_timed_through_its_iterator_says_what_the_iterator_adds():
    # a streaming dataset's load (3.06 ms a sample through its iterator, 0.06 by index):
    # the iterator's part is a row of its own, the larger part, and the advice says so
    split = dict(READ_SPLIT, read_ms_per_sample=0.05, decode_ms_per_sample=0.01, iterator_ms_per_sample=3.0,
                 bound="iterator")
    r = _with_split(LOAD, split)
    text = to_text(r)
    block = table(text, "Load split into read and decode")
    assert row(block, "iterator").split()[:3] == ["iterator", "3.00", "98%"]
    said = " ".join(" ".join(b) for b in blocks(text) if b[0].startswith("Load split"))
    assert "Iterator is the larger part: attack the streaming dataset's iteration" in said
    assert "getting the samples through its iterator adds 3.00 ms" in " ".join(text.split())
    assert all(len(line) <= WIDTH for line in text.splitlines())
    assert to_text(Report.from_dict(json.loads(json.dumps(r.to_dict())))) == text
    assert "Getting the samples through the iterator is the larger part" in r.html()


def test_an_unavailable_split_is_one_line_with_its_reason_when_load_is_named():
    r = _with_split(LOAD, {"status": "unavailable", "reason": "no file was read through open()"})
    text = " ".join(to_text(r).split())
    assert "Load could not be split into read and decode: no file was read through open()." in text
    assert "Load could not be split" not in to_text(_with_split(AUGMENT, {"status": "unavailable", "reason": "x"}))


def _reorder(real: bool, saving: float = 0.29, tolerance=0.03):
    from bisect_pipeline.core.results import Reorder
    return Reorder(transform="ColorJitter", where="dataset.transform[0]", after="RandomResizedCrop",
                   after_where="dataset.transform[1]", order=("RandomResizedCrop", "ColorJitter", "ToTensor"),
                   pixels_before=187500, pixels_after=50176, ms_per_sample=0.41, reordered_ms_per_sample=0.41 - saving,
                   saving_ms_per_sample=saving, tolerance_ms=tolerance, samples=24, real=real)


def test_a_reorder_found_faster_is_said_once_as_advice_or_under_the_breakdown_and_one_not_faster_only_with_all():
    r = _with_breakdown(AUGMENT, reorders=(_reorder(True), _reorder(False, saving=0.01, tolerance=None)))
    text = to_text(r)
    flat = " ".join(text.split())
    line = ("Reorder: move ColorJitter after RandomResizedCrop: 0.41 \u2192 0.12 ms/sample (saves 0.29 \u00b1 0.03, on "
            "the same 24 inputs).")
    # augment named: the move is an advice item, so the breakdown does not say it again
    assert line not in flat and flat.count("saves 0.29") == 1
    assert "not faster beyond the noise" not in flat
    # augment tied for the lead: no advice item, the breakdown says it
    tied = _with_breakdown({"device": 950.0, "collated": 930.0, "augmented": 920.0, "raw": 500.0, "full": 330.0},
                           reorders=(_reorder(True),))
    assert tied.bottleneck == "tie" and not [f for f in tied.advice if f.kind == "reorder"]
    flat = " ".join(to_text(tied).split())
    assert line in flat and flat.index("they agree") < flat.index(line) < flat.index("Isolated (this process")
    every = " ".join(r.text(breakdown="all").split())
    assert ("Reorder: move ColorJitter after RandomResizedCrop: 0.41 \u2192 0.40 ms/sample: not faster beyond the "
            "noise (+0.01; too few samples for the noise).") in every
    assert all(len(x) <= WIDTH for x in text.splitlines())
    assert to_text(Report.from_dict(json.loads(json.dumps(r.to_dict())))) == text
    # the advice item: the move, both timings, the saving per batch; not checked in the full pipeline
    (item,) = [f for f in r.advice if f.kind == "reorder"]
    assert item.stage == "augment" and item.verified is None
    msg = " ".join(item.message.split())
    assert msg.startswith("Move ColorJitter (dataset.transform[0]) after RandomResizedCrop (dataset.transform[1]): "
                          "saves 0.29 \u00b1 0.03 ms per sample, 9.3 ms per batch of 32. 0.41 \u2192 0.12 ms per sample on "
                          "the same inputs; it then runs on 50,176 pixels instead of 187,500.")
    assert "New order: RandomResizedCrop, ColorJitter, ToTensor. ColorJitter's contrast (when set) blends with the " \
           "image's mean: after the move, the crop's" in msg
    assert "not checked" in msg
    assert item.numbers["saving_ms_per_batch"] == 9.28 and item.numbers["order"] == ["RandomResizedCrop",
                                                                                      "ColorJitter", "ToTensor"]
    kinds = [f.kind for f in r.advice]
    assert kinds.index("augment") + 1 == kinds.index("reorder")


def _loop_report(source: dict, complete: bool = False, rates: dict = AUGMENT) -> Report:
    m = planted_report(rates, complete=complete).measurements
    return Report.of(dataclasses.replace(m, mode="loop", source=source))


def test_a_loop_on_a_batch_sampler_says_the_batch_size_counted():
    r = _loop_report({"index": 1, "dataset": "CocoDetection", "batch_size": None, "created_at": "train.py:9"},
                     complete=True)
    assert "on loader #1 (CocoDetection, batch size 32, created at train.py:9)" in " ".join(to_text(r).split())


def test_a_script_that_ended_first_says_what_to_run_in_the_summary_and_what_it_gave_and_needed_beneath():
    short = {"how": "ended", "detail": None, "batches": 100, "needed": 334, "rounds": 2, "points": 5,
             "epoch_batches": 10, "epoch_needs": 19}
    r = _loop_report({"index": 1, "dataset": "Data", "batch_size": 2, "ended": short}, rates={})
    text = to_text(r)
    summary, facts = (" ".join(b) for b in blocks(text)[:2])
    assert summary.startswith("No verdict: ") and "Incomplete run (your script ended first)." in summary
    assert summary.endswith("Next: measure it with --entry (a function that returns your model and loader), or with "
                            "epochs of more batches.")
    assert facts.startswith("Your script ended after 100 batches of its training loader, before the measurement "
                            "was done: it needs at least about 334 (2 rounds over 5 points")
    assert "Its epochs are 10 batches, fewer than the 19" in facts and "more epochs would not help" in facts
    assert "stopped by --max-seconds" not in text and "no verdict" not in facts  # the summary said it
    html = r._repr_html_()
    assert "Your script ended after 100 batches" in html and "your script ended first" in html
    # epochs long enough: more of them is the answer, said with the factor
    longer = dict(short, epoch_batches=50, how="exit", detail="sys.exit(0)")
    summary, facts = (" ".join(b) for b in blocks(to_text(_loop_report({"ended": longer}, rates={})))[:2])
    assert facts.startswith("Your script exited (sys.exit(0)) after 100 batches")
    assert "Next: run it for more epochs or steps (about 4x as many batches)" in summary
    assert "would not help" not in facts
    # enough batches for the least measurement, yet no settled verdict: the one from what was measured
    enough = dict(short, batches=400, epoch_batches=None)
    text = to_text(_loop_report({"ended": enough}))
    summary = " ".join(blocks(text)[0])
    assert summary.startswith("Bottleneck: augment.")
    assert "Next: run it for more epochs or steps, so that the rounds can settle the noise." in summary
    facts = next(" ".join(b) for b in blocks(text) if b[0].startswith("Your script"))
    assert "needs at least" not in facts and "the verdict above is from what was measured" in facts


def test_the_closing_line_says_no_verdict_when_the_tool_stopped_the_script():
    from types import SimpleNamespace

    from bisect_pipeline import script as script_mod

    report = SimpleNamespace(verdict=SimpleNamespace(reason="out of time before one window"),
                             measurements=SimpleNamespace(source={}))
    stopped = SimpleNamespace(exp=object(), ended=None)  # the experiment ended first: the tool stopped it
    assert script_mod._no_verdict(stopped, report, None, None) == (
        "no verdict: out of time before one window; the partial report is written.")
    ended = SimpleNamespace(exp=object(), ended=("ended", None))
    assert script_mod._no_verdict(ended, report, None, None).startswith("your script ended before a verdict")


# --- the answer first (issue 45): every kind of report ---------------------------------------------


def rounds_report(ms: dict, rounds: int, spread: dict, loader: dict = None) -> Report:
    """A report whose points take `ms` per batch, each measured in `rounds` rounds of 3
    windows; a point's time moves from round to round by up to +-`spread[point]` (a fixed
    pattern): the verdict's noise comes from its rounds, as a real run's does."""
    from bisect_pipeline.report import PointResult, build
    from bisect_pipeline.core.stats import Throughput, Window
    points = []
    for name in ("full", "raw", "augmented", "collated", "host", "device"):
        if name not in ms:
            points.append(PointResult(name, "skipped", reason="no accelerator: host and device coincide")
                          if name == "host" else PointResult(name, "not run", reason="out of time"))
            continue
        wins = tuple(Window(10, ms[name] * 10 / 1e3 * (1 + spread.get(name, 0.01) * ((k * 7 + len(name)) % 5 - 2) / 2),
                            round=k) for k in range(rounds) for _ in range(3))
        points.append(PointResult(name, "ok", Throughput(wins, 32), first_batch_seconds=0.05))
    run = {"max_seconds": 30.0, "elapsed_s": 29.0, "verdict_s": 24.0, "rounds": rounds, "settled": False}
    return build(points, 32, "cpu", loader=loader or {"num_workers": 0, "pin_memory": False}, run=run)


def demo_report() -> Report:
    from test_readme import DOCUMENT
    return Report.from_dict(json.loads(DOCUMENT.read_text(encoding="utf-8")))


def tuned_report() -> Report:
    from bisect_pipeline.core.results import Trial, Tuning
    from test_outcome import side
    from test_tune import USER, key, planted as tune_planted
    d = tune_planted({"device": 20.0, "augmented": 20.0, "raw": 60.0, "full": 60.0}, needed=2)
    trial = Trial.from_dict({"item": "tune", "settings": dict(key(2)), "user_windows": side(10.0),
                             "candidate_windows": side(20.0)})
    t = Tuning(status="ok", elapsed_s=8.0, user=USER, workers=(1, 2, 3), start=2, why="num_workers 1 to 3",
               ceiling_ms_per_batch=50.0, ceiling_rel_se=0.01, trials=(trial,), stopped="at the ceiling")
    return Report.of(dataclasses.replace(d.measurements, tune=t))


class _Unsharded(torch.utils.data.IterableDataset):
    """Every worker yields the whole range (integrations.iterable.duplicates warns)."""

    def __iter__(self):
        return iter(range(100))


class _OwnLoader(torch.utils.data.DataLoader):
    pass


def _point(name: str, rate: float, jitter: float = 0.01, **kw):
    from bisect_pipeline.report import PointResult
    from bisect_pipeline.core.stats import Throughput, Window
    secs = 10 * 32 / rate
    tp = Throughput(tuple(Window(10, secs * (1 + jitter * ((i % 3) - 1))) for i in range(6)), 32)
    return PointResult(name, "ok", tp, first_batch_seconds=0.05, **kw)


def warned_report() -> Report:
    """A report with every kind of warning a run can give, each made by the code that
    makes it in a run: the notes seen while measuring (a small /dev/shm, an unsharded
    IterableDataset, a loader class not rebuilt, a fill that failed, a step that changes
    its batch, the two budget notes and the batches note, a rule broken) and those its numbers call for
    (device slower than collated, two noisy points, a pause, a point cut short, one not
    steady, a cache at its memory budget, more workers than cores, an allocator not held)."""
    from bisect_pipeline.measure import prepare, rounds
    from bisect_pipeline.core import faults
    from bisect_pipeline.pipeline.integrations.iterable import duplicates
    from bisect_pipeline.report import PointResult, build
    from bisect_pipeline.core.results import Note
    from bisect_pipeline.core.stats import Throughput, Window
    from bisect_pipeline.derive.self_check import self_check
    from bisect_pipeline.derive.verdict import decide
    points = [_point("full", 320, 0.3, pauses=2, paused_seconds=3.0, discarded=1),
              _point("raw", 330, 0.25, stopped_by_deadline=True), _point("augmented", 940, steady=False),
              _point("collated", 950), PointResult("host", "skipped", reason="no accelerator: host and device coincide"),
              _point("device", 800)]
    one = {"device": Throughput((Window(10, 0.1),) * 3, 8), "collated": Throughput((Window(10, 0.12),) * 3, 8)}
    broken = self_check({"device": 80.0, "collated": 100.0}, decide(one, 8), 0, False)
    measured = [faults.shm_problem(4, 2, 10**8, 64 * 2**20), duplicates(_Unsharded(), 2),
                prepare.loader_note(_OwnLoader, "the loader is a _OwnLoader, which could not be rebuilt from the "
                                                "DataLoader arguments (TypeError: x)"),
                prepare.fill_failed_note(6, "sample 50 hung in load: no batch in 120 s"), prepare.fresh_copy_note(),
                rounds.no_window_note("augmented"), rounds.step_budget_note(2.1, 90, 3, 5, 30.0),
                rounds.batches_note(120, 400, 3, 5)] + [Note("rules", w) for w in broken]
    held = {"controlled": False, "reason": "the C library is musl: only glibc's malloc can be held still"}
    return build(points, 32, "cpu", loader={"num_workers": 4, "pin_memory": False},
                 cache={"batches": 2, "limited_by": "memory budget"}, warnings=measured,
                 run={"cpu_count": 2, "max_seconds": 30.0, "elapsed_s": 29.0, "allocator": held})


KINDS = {
    "demo": demo_report,
    "none": lambda: planted_report({"device": 950.0, "full": 940.0}),
    "tie": lambda: rounds_report({"device": 20.0, "augmented": 21.0, "raw": 41.0, "full": 62.0}, 5,
                                 {"full": 0.08, "raw": 0.08}),
    "inconclusive": lambda: rounds_report({"device": 20.0, "full": 23.0}, 4, {"full": 0.3, "device": 0.3}),
    "run": lambda: _loop_report({"index": 1, "dataset": "Data", "batch_size": 2, "created_at": "train.py:9"},
                                complete=True),
    "tune": tuned_report,
    "warned": warned_report,
}
VERDICT_WORDS = {"demo": "Bottleneck: augment.", "none": "The input pipeline keeps up", "tie": ", tied:",
                 "inconclusive": "Inconclusive:", "run": "Bottleneck: augment.", "tune": "Bottleneck: augment.",
                 "warned": ", tied:"}


def sentences(flat: str) -> list:
    """The sentences of a text (whitespace already collapsed) of five words or more."""
    return [x for x in re.split(r"(?<=[.!?])\s+(?=[A-Z(\[])", flat) if len(x.split()) >= 5]


def repeated(flat: str) -> list:
    seen, out = set(), []
    for x in sentences(flat):
        if x in seen:
            out.append(x)
        seen.add(x)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_report_opens_with_a_summary_of_at_most_6_lines_naming_the_verdict_and_the_first_change(kind):
    from bisect_pipeline.report.summary import SUMMARY_LINES, summarize
    r = KINDS[kind]()
    text = to_text(r)
    summary = blocks(text)[0]
    assert 1 <= len(summary) <= SUMMARY_LINES == 6 and all(len(ln) <= WIDTH for ln in summary), "\n".join(summary)
    flat = " ".join(summary)
    assert flat.startswith(r.summary) and VERDICT_WORDS[kind] in flat, flat
    s = summarize(r)
    if kind in ("demo", "tune"):  # a change measured: named first, with its figure and interval
        assert re.search(r"First change[^:]*: set num_workers=\d.*: measured \d\.\d\d\u00d7 \(\d\.\d\d\u2013\d\.\d\d\u00d7\)",
                         flat), flat
    if kind in ("tie", "inconclusive"):  # nothing settled: what to measure next
        assert "Next: " in flat and s.next in flat
    if s.first:  # the action, then its figure
        assert s.first in flat and re.match(r"First change[^:]*: [^:]+: \S", s.first), s.first
    # --brief (Report.brief()) is the summary alone
    assert r.brief() == "\n".join(summary)


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_sentence_appears_twice_in_one_report(kind):
    r = KINDS[kind]()
    assert repeated(" ".join(to_text(r).split())) == []
    assert repeated(" ".join(" ".join(visible_text(r.html())).split())) == []


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_row_not_measured_is_one_line_its_reason_once_below_the_table(kind):
    r = KINDS[kind]()
    text = to_text(r)
    for title in ("What each stage costs", "Throughput at each point"):
        block = table(text, title)
        rows = block[3:]
        for i, line in enumerate(rows):
            m = re.search(r"(skipped|unavailable|not run|failed|merged) \[(\d+)\]$", line)
            if m:  # the next line is another row or a note, never the rest of this one
                nxt = rows[i + 1] if i + 1 < len(rows) else ""
                assert not nxt.startswith(" "), (line, nxt)
    flat = " ".join(text.split())
    for p in r.points:
        if p.status != "ok" and p.reason:
            assert flat.count(" ".join(p.reason.split())) == 1, p.reason
    html = r.html()
    for p in r.points:
        if p.status != "ok" and p.reason:
            assert " ".join(" ".join(visible_text(html)).split()).count(" ".join(p.reason.split())) == 1


def visible_text(markup: str) -> list:
    """The text a browser shows: not the CSS, not the SVG's hover titles."""
    from html.parser import HTMLParser

    class Visible(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.hidden, self.out = 0, []

        def handle_starttag(self, tag, attrs):
            self.hidden += tag in ("style", "title")

        def handle_endtag(self, tag):
            self.hidden -= tag in ("style", "title")

        def handle_data(self, data):
            if not self.hidden:
                self.out.append(data)
    v = Visible()
    v.feed(markup)
    return v.out


def test_brief_is_the_summary_alone_and_the_html_box_holds_the_same_sentences():
    from bisect_pipeline.report.summary import summarize
    r = demo_report()
    s = summarize(r)
    box = r.html()
    box = box[box.index('<div class="summary'):]
    box = " ".join(" ".join(visible_text(box[:box.index("</div>")])).split())
    assert box == " ".join(r.brief().split()) == " ".join(s.paragraphs())


def test_brief_on_the_command_line_prints_the_summary_alone(tmp_path, monkeypatch):
    from bisect_pipeline import api
    from conftest import cli_in_process
    r = demo_report()
    monkeypatch.setattr(api, "bisect", lambda **kw: r)  # no run: the report as measured
    ran = cli_in_process("demo", "--brief", cwd=tmp_path)
    assert ran.returncode == 0 and ran.stdout.rstrip("\n") == r.brief() and len(r.brief().splitlines()) <= 6
    assert "--brief" in cli_in_process("run", "--help", cwd=tmp_path).stdout


# --- the warnings (issue 45): one line each, what was seen then the next step -----------------------

# The kinds of warning a report can carry (results.Note), all of them planted in warned_report.
WARNING_KINDS = {"shm", "pipeline", "loader", "cache", "step", "budget", "batches", "rules", "inconsistent", "noise",
                 "paused", "deadline", "unsteady", "workers", "allocator"}
# What a warning's next step starts with: a verb the user acts on (or "nothing to do").
NEXT_STEPS = {"close", "raise", "rerun", "run", "fix", "give", "use", "drop", "read", "leave", "let", "split", "report",
              "nothing"}


def warnings_block(text: str) -> list:
    (block,) = [b for b in blocks(text) if b[0] == "Warnings:"]
    return block[1:]


def test_every_kind_of_warning_is_one_line_what_was_seen_then_the_next_step():
    from bisect_pipeline.report.summary import warnings
    r = warned_report()
    assert {n.kind for n in r.notes} == WARNING_KINDS
    items = warnings_block(to_text(r))
    # one line each: no item wraps onto a second line
    assert all(ln.startswith("  - ") and len(ln) <= WIDTH for ln in items), "\n".join(items)
    lines = [w.message for w in warnings(r)]
    assert [ln[4:] for ln in items] == lines
    # 15 kinds, the budget's two and the cache's two, the noisy points (full, raw) in one line
    assert len(lines) == 17 and sum("Windows spread" in w for w in lines) == 1
    for line in lines:
        assert not re.search(r"[.;]\s", line), line  # one sentence
        seen, step = line.rsplit(": ", 1)
        assert seen and step.split()[0] in NEXT_STEPS and step.endswith("."), line
    # what was seen, with its figure where it has one
    for figure in ("/dev/shm has 64 MiB free, workers need about 381", "every sample 2 times per epoch",
                   "failed after 6 batches", "Steps of 2.1 s need about 90 s", "about 120 batches left, 400 needed",
                   "device ran 16% slower than collated", "Windows spread ±40-49% at full and raw",
                   "Loop paused 2 times at full (3.0 s, 1 window voided)", "at raw (6 windows)",
                   "The caches hold 2 batches", "num_workers=4 is more than this machine's 2 cores"):
        assert sum(figure in w for w in lines) == 1, figure


def test_the_html_warnings_are_the_same_lines_their_why_folded_beneath():
    import html as html_mod
    from bisect_pipeline.report.summary import warnings
    r = warned_report()
    page = r.html()
    section = page[page.index('<ul class="warnings">'):]
    section = section[:section.index("</ul>")]
    items = re.findall(r"<li>(.*?)(?:<details><summary>why</summary><p>(.*?)</p></details>)?</li>", section)
    notes = warnings(r)
    assert [html_mod.unescape(line) for line, _ in items] == [n.message for n in notes]
    # the why where a note has one (the noise's, the cache's arithmetic, the error the fill stopped on, ...)
    assert [bool(why) for _, why in items] == [bool(n.detail) for n in notes]
    assert "Sample 50 hung in load: no batch in 120 s." in [html_mod.unescape(why) for _, why in items]


def test_the_points_of_one_kind_are_one_warning_however_many():
    from bisect_pipeline.report.summary import warnings
    r = planted_report(AUGMENT, jitter=0.3)  # every point noisy
    (noisy,) = [w.message for w in warnings(r) if w.kind == "noise"]
    assert re.fullmatch(r"Windows spread ±\d+% at 5 points: close other programs\.", noisy), noisy
    assert sum(n.kind == "noise" for n in r.notes) == 5  # the JSON keeps one note per point


def test_the_warnings_and_their_why_read_back_from_json_the_same():
    r = warned_report()
    doc = json.loads(r.to_json())
    again = Report.from_dict(doc)
    assert to_text(again) == to_text(r) and again.html() == r.html()
    assert again.to_dict() == doc
    kept = {n["kind"]: n for n in doc["notes"]}
    assert kept["cache"]["detail"] and "derived" in kept["noise"] and doc["warnings"] == [n["message"] for n in doc["notes"]]


def test_a_script_that_ended_first_is_not_told_again_in_a_warning_to_run_more_epochs():
    from bisect_pipeline.measure import rounds
    from bisect_pipeline.report.summary import warnings
    foretold = rounds.batches_note(100, 334, 2, 5)
    short = {"how": "ended", "detail": None, "batches": 100, "needed": 334, "rounds": 2, "points": 5,
             "epoch_batches": 10, "epoch_needs": 19}
    m = _loop_report({"ended": short}, rates={}).measurements
    r = Report.of(dataclasses.replace(m, notes=(foretold,)))
    # said above (what happened, and that more epochs would not help): not again below
    assert warnings(r) == [] and "Warnings:" not in to_text(r) and "run more epochs" not in to_text(r)
    # a script that did not end first: the warning is the only one to say it
    going = Report.of(dataclasses.replace(_loop_report({"index": 1}).measurements, notes=(foretold,)))
    assert [w.message for w in warnings(going)] == ["Your script has about 100 batches left, 334 needed: run more "
                                                    "epochs."]


@pytest.mark.parametrize("kind", ["inconclusive", "noisy windows"])
def test_an_inconclusive_reason_says_why_and_its_next_step_once(kind):
    from bisect_pipeline.report.summary import summarize
    r = KINDS["inconclusive"]() if kind == "inconclusive" else planted_report({"device": 950.0, "full": 665.0},
                                                                                 jitter=0.6)
    assert r.bottleneck == "inconclusive"
    s = summarize(r)
    text = " ".join(to_text(r).split())
    # the reason: why (the bound, or too noisy); what to measure next, the summary's Next alone
    assert "--max-seconds" not in r.verdict.reason and "would tell" not in r.verdict.reason
    assert "close other work" not in r.verdict.reason
    assert s.next.startswith("Next: ") and text.count(s.next) == 1 and text.count("--max-seconds") == 1
    assert r.to_dict()["verdict"]["next"] == s.next[len("Next: "):]
    assert demo_report().to_dict()["verdict"]["next"] is None  # settled: nothing to measure next


def test_a_heavy_step_that_left_full_unmeasured_says_the_budget_that_holds_it():
    # the detection reference with 2 workers on a slow machine: 30 s held the ceiling only
    from bisect_pipeline.report.summary import summarize
    m = dataclasses.replace(rounds_report({"device": 5700.0}, 1, {}).measurements, complete=False)
    r = Report.of(m)
    assert r.bottleneck is None
    assert summarize(r).next == "Next: raise --max-seconds: the run ended before a verdict."
    told = Report.of(dataclasses.replace(m, run=dataclasses.replace(m.run, least_verdict_s=50)))
    said = ("rerun with --max-seconds 50 or more: the run ended before a verdict, and about 50 s hold one reading of "
            "each point a verdict needs at its steps.")
    assert summarize(told).next == f"Next: {said}" and told.to_dict()["verdict"]["next"] == said
    assert told.to_dict()["run"]["least_verdict_s"] == 50
    assert Report.from_dict(told.to_dict()).measurements.run.least_verdict_s == 50


def test_a_tie_more_rounds_would_tell_apart_says_how_many_once():
    from bisect_pipeline.report.summary import summarize
    r = rounds_report({"device": 20.0, "augmented": 21.0, "raw": 41.0, "full": 66.0}, 4, {"full": 0.1, "raw": 0.1})
    (lead,) = [lead for lead in r.verdict.leads if lead.rounds_to_tell]
    assert r.bottleneck == "tie" and lead.rounds_to_tell > lead.rounds == 4
    text = " ".join(to_text(r).split())
    said = f"about {lead.rounds_to_tell} rounds would tell load and augment apart (4 so far)"
    assert summarize(r).next.startswith(f"Next: {said}") and text.count(f"{lead.rounds_to_tell} rounds") == 1
    assert "so far" not in r.verdict.reason and text.count("so far") == 1  # the reason says why, not how many



def test_rounds_the_script_s_batches_ended_ask_for_more_epochs_not_more_seconds():
    # issue 59: a 1,316-batch script at --max-seconds 60 whose rounds used their share of
    # its batches in 12 s: a larger --max-seconds would buy nothing
    from bisect_pipeline.report.summary import summarize
    r = rounds_report({"device": 20.0, "augmented": 21.0, "raw": 41.0, "full": 66.0}, 4, {"full": 0.1, "raw": 0.1})
    (lead,) = [lead for lead in r.verdict.leads if lead.rounds_to_tell]
    assert "--max-seconds" in summarize(r).next  # by the time
    run = dataclasses.replace(r.measurements.run, limited_by="batches")
    ended = Report.of(dataclasses.replace(r.measurements, run=run))
    need = -(-lead.rounds_to_tell // 4)
    assert summarize(ended).next == (
        f"Next: about {lead.rounds_to_tell} rounds would tell load and augment apart (4 so far): run your script for "
        f"more epochs or steps (its batches ended the rounds, not --max-seconds; about {need}x as many), or close "
        "other work on this machine.")
    assert ended.to_dict()["run"]["limited_by"] == "batches"


def fast_step_report(in_loop: bool) -> Report:
    """A 3-ms CPU step over token sequences at num_workers=0, six steady rounds: load reads
    0.6 ms a batch; alone, one item after another, its 64 items cost 0.05 ms, and between
    steps, as the loop runs them (isolated.in_loop, when given), 0.6."""
    iso = {"status": "ok", "items_per_batch": 64, "batch_size": 64,
           "load": {"ms_per_sample": 0.0008, "se_ms_per_sample": 0.0001, "samples": 500, "includes": ["load", "augment"]},
           "augment": {"status": "unavailable", "reason": "no per-sample transform was found"},
           "collate": {"ms_per_batch": 0.05, "se_ms_per_batch": 0.005, "batches": 8},
           "workers": {"cores": 2, "step_threads": 2}}
    if in_loop:
        iso["in_loop"] = {"batches": 40, "fetch_ms_per_batch": 0.62, "fetch_se_ms": 0.02, "collate_ms_per_batch": 0.12,
                          "collate_se_ms": 0.01}
    r = rounds_report({"device": 3.0, "augmented": 3.15, "full": 3.75}, 6, {"device": 0.004, "augmented": 0.004,
                                                                          "full": 0.004})
    return Report.of(dataclasses.replace(r.measurements, isolated=Isolated.from_dict(iso)))


def test_a_fast_step_whose_load_reads_above_its_cost_alone_round_after_round_is_not_called_a_drift():
    from bisect_pipeline.report.summary import summarize
    r = fast_step_report(in_loop=False)
    assert r.bottleneck == "inconclusive" and r.verdict.witness == "disagree"
    assert "load reads 0.6 ms per batch in the loop where alone it costs 0.1" in r.verdict.reason  # 0.05, rounded
    assert "so in each of 6 rounds, not a drift of the step" in r.verdict.reason and "drifted" not in r.verdict.reason
    assert summarize(r).next == ("Next: more rounds would not tell: they read the same in each; the stages timed alone "
                                 "miss what your loop pays for them.")
    # timed between steps, as the loop pays it: the witnesses agree, and load is named
    r = fast_step_report(in_loop=True)
    assert r.bottleneck == "load" and r.verdict.witness == "both" and not r.verdict.disagree
    text = " ".join(to_text(r).split())
    assert "between steps, as the loop runs it: fetch 0.62 ms/batch (sampler, load and augment), collate 0.12 ms/batch" \
        in text


def one_round(full_ms: float, device_ms: float, *, load: float, augment: float, step_alone: float, budget: float,
              verdict_s: float, ceiling_alone: bool = False):
    """A run of one round of the ceiling and `full` only (the points between out of time),
    num_workers=0, 2 samples a batch, load and augment alone in ms a sample (issue 59);
    `ceiling_alone`: the ceiling's one reading is the step timed alone (rounds.Rounds._read_alone)."""
    def one(name, ms):
        return PointResult(name, "ok", Throughput((Window(1, ms / 1e3, 0),), 2), first_batch_seconds=ms / 1e3)
    device = (PointResult("device", "ok", Throughput((Window(1, device_ms / 1e3, 0),), 2), visits=0, step_alone=True)
              if ceiling_alone else one("device", device_ms))
    points = [one("full", full_ms), PointResult("raw", "not run", reason="out of time"),
              PointResult("augmented", "not run", reason="out of time"),
              PointResult("collated", "skipped", reason="num_workers=0: nothing hands batches over"),
              PointResult("host", "skipped", reason="no accelerator: host and device coincide"), device]
    iso = {"status": "ok", "items_per_batch": 2, "batch_size": 2,
           "load": {"status": "ok", "ms_per_sample": load, "se_ms_per_sample": load / 40, "samples": 40,
                    "includes": ["load"]},
           "augment": {"status": "ok", "ms_per_sample": augment, "se_ms_per_sample": augment / 40, "samples": 40},
           "collate": {"status": "ok", "ms_per_batch": 0.5, "se_ms_per_batch": 0.01, "batches": 8},
           "step": {"status": "ok", "ms_per_batch": device_ms, "source": "the device point",
                    "alone_ms_per_batch": step_alone},
           "workers": {"status": "ok", "cores": 2, "step_threads": 2}}
    return build(points, 2, "cpu", loader={"num_workers": 0}, isolated=iso, complete=False,
                 run={"max_seconds": budget, "rounds": 1, "verdict_s": verdict_s, "settled": False})


def test_a_heavy_step_s_none_from_one_round_says_the_costs_alone_decided():
    # the torchvision detection reference at 30 s: one round of the ceiling and full, a
    # 2.5-s step timed alone at 2.49 s, load and augment 25 ms a batch alone (issue 59)
    r = one_round(2560.0, 2500.0, load=4.0, augment=8.25, step_alone=2490.0, budget=30.0, verdict_s=27.0)
    assert r.bottleneck == "none" and r.verdict.witness == "isolated costs"
    text = to_text(r)
    head = " ".join(blocks(text)[0])
    assert head.startswith("The input pipeline keeps up, by the stages' costs alone: the training step itself is "
                           "the limit.")
    why = " ".join(ln.strip() for b in blocks(text) for ln in b if b[0].startswith("Why none"))
    assert "under the 5% at which no stage's cost could be real" in why and "(1 round)" in why
    assert "the step read 2500.0 ms in the loop and 2490.0 alone" in why
    assert "step 2500.00 ms/batch (2490.00 timed alone)" in " ".join(text.split())


def test_a_ceiling_read_from_the_step_alone_is_said_so_in_the_reason_the_table_and_the_document():
    # a 6-s step in 30 s: the first round's ceiling is the step timed alone, full its one visit
    r = one_round(6050.0, 6000.0, load=4.0, augment=5.0, step_alone=6000.0, budget=30.0, verdict_s=25.0,
                  ceiling_alone=True)
    assert r.bottleneck == "none" and r.verdict.witness == "isolated costs"
    text = to_text(r)
    why = " ".join(ln.strip() for b in blocks(text) for ln in b if b[0].startswith("Why none"))
    assert "agree: the step read 6000.0 ms alone (the ceiling's reading), the full pipeline 6050.0 ms" in why
    assert "in the loop" not in why and "its faster reading" not in why
    points = " ".join(" ".join(table(text, "Throughput at each point")).split())
    assert "the step timed alone before the points" in points
    assert "the step timed alone before the points" in r.html()
    doc = json.loads(r.to_json())
    device = next(p for p in doc["points"] if p["point"] == "device")
    assert device["step_alone"] is True and device["visits"] == 0 and device["time_to_first_batch_s"] is None
    assert "step_alone" not in next(p for p in doc["points"] if p["point"] == "full")
    again = Report.from_dict(doc)
    assert again.to_dict() == doc and to_text(again) == text


def test_a_stage_named_within_a_row_the_rounds_read_whole_is_reported_with_its_cost_alone():
    # a 500-ms step behind 40 ms of augment a sample at num_workers=0; only the ceiling and
    # full measured: the rounds read load, augment and collate as one row (issue 59)
    r = one_round(590.0, 500.0, load=2.0, augment=40.0, step_alone=498.0, budget=20.0, verdict_s=17.0)
    assert r.bottleneck == "augment" and r.verdict.witness == "isolated costs"
    text = to_text(r)
    head = " ".join(blocks(text)[0])
    assert head.startswith("Bottleneck: augment, named on the stages' costs alone: by them it costs the loop 80.0 ms of "
                           "every 590.0-ms batch, where the rounds read 90.0 ms for load, augment and collate together, "
                           "within their noise; what the loop would gain without it is not measured yet.")
    assert "First change: make augment cheaper" in head
    assert "Measured together with augment" not in text and "Make loading" not in text  # augment was timed apart
    stages = table(text, "What each stage costs")
    assert row(stages, "augment").split()[:3] == ["augment", "-", "80.00"]  # its cost alone, beside the merged mark
    assert row(stages, "load").split()[:3] == ["load", "90.00", "84.50"]  # the row as the rounds read it
    doc = json.loads(r.to_json())
    assert doc["verdict"]["within"] == "load" and doc["bottleneck"] == "augment"
    assert [(s["stage"], s["status"], s["alone_ms_per_batch"]) for s in doc["stages"][:3]] == [
        ("load", "ok", 84.5), ("augment", "merged", 80.0), ("collate", "merged", 0.5)]
    assert Report.from_dict(doc).to_dict()["verdict"] == doc["verdict"]
