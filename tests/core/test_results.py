"""What was measured, as typed records (results.py): each one's JSON form, both ways."""

import pytest

from bisect_pipeline.core.results import (AllocatorHold, AllocatorTiming, BatchShape, CacheInfo, Collate, Isolated,
                                          Note, PerSample, PointResult, RunInfo, SampleStructure, StepTime, SyncSite,
                                          Syncs, TensorInfo, Transfer, Trial, Verification, VisitWindow, Workers)
from bisect_pipeline.core.stats import Throughput, Window

ISOLATED = {
    "status": "ok", "budget_s": 1.5, "batch_size": 8,
    "augment": {"status": "ok", "ms_per_sample": 3.1, "samples": 40},
    "load": {"status": "ok", "ms_per_sample": 0.2, "samples": 41, "getitem_ms_per_sample": 3.3, "includes": ["load"]},
    "collate": {"status": "ok", "ms_per_batch": 0.4, "batches": 7, "collate_fn": "f", "default_collate_ms_per_batch": 0.1},
    "batch": {"status": "ok", "bytes": 1024, "n_tensors": 1,
              "tensors": [{"path": "batch[0]", "dtype": "float32", "shape": [8, 32], "bytes": 1024, "image": False}]},
    "sample_structure": {"status": "ok", "tensors": 1, "ndarrays": 0, "numbers": 1, "strings": 0, "images": 0,
                         "other": 0, "containers": 1, "longest_list": 0, "leaves": 2},
    "transfer": {"status": "skipped", "reason": "no accelerator: host and device coincide", "bytes_per_batch": 1024},
    "step": {"status": "ok", "ms_per_batch": 2.5, "source": "the device point"},
    "workers": {"status": "ok", "worker_ms_per_batch": 26.8, "step_ms_per_batch": 2.5, "needed": 11, "cores": 2,
                "available": 1, "step_threads": 1, "fits": False},
    "elapsed_s": 1.2,
    "allocator": {"status": "ok", "default_ms_per_batch": 3.0, "held_ms_per_batch": 2.5, "cost_ms_per_batch": 0.5,
                  "noise_ms": 0.1, "real": True, "steps": [5, 5], "held": {"mmap_threshold": 1}, "source": "s"},
}


def test_the_isolated_timings_read_back_typed_and_write_the_same_document():
    iso = Isolated.from_dict(ISOLATED)
    assert isinstance(iso.augment, PerSample) and isinstance(iso.collate, Collate)
    assert isinstance(iso.batch, BatchShape) and isinstance(iso.batch.tensors[0], TensorInfo)
    assert iso.batch.tensors[0].shape == (8, 32) and iso.load.includes == ("load",)
    assert isinstance(iso.sample_structure, SampleStructure) and isinstance(iso.workers, Workers)
    assert isinstance(iso.step, StepTime) and isinstance(iso.allocator, AllocatorTiming)
    assert iso.to_dict() == ISOLATED
    assert iso.part("augment") is iso.augment and iso.part("transfer") is None  # skipped: not measured
    assert isinstance(iso.transfer, Transfer) and iso.transfer.bytes_per_batch == 1024


def test_a_part_not_measured_says_why_and_a_document_of_another_version_still_reads():
    assert Isolated.missing("skipped", "torchrun").to_dict() == {"status": "skipped", "reason": "torchrun"}
    assert Isolated.missing("failed", "x").part("augment") is None
    assert Isolated.from_dict({}) is None and Isolated.from_dict(None) is None
    assert Syncs.from_dict({"status": "ok", "per_step": 2.0, "new_key": 1}) == Syncs(per_step=2.0)  # unknown: left out


def test_the_checks_trials_keep_their_windows_visit_by_visit():
    doc = {"status": "ok", "budget_s": 7.5, "elapsed_s": 4.2, "trials": [
        {"item": "num_workers", "settings": {"num_workers": 1},
         "user_windows": [{"steps": 10, "seconds": 0.5, "visit": 0}], "candidate_windows": [], "error": None}]}
    ver = Verification.from_dict(doc)
    (trial,) = ver.trials
    assert isinstance(trial, Trial) and trial.user_windows == (VisitWindow(10, 0.5, 0),)
    assert ver.to_dict() == doc  # "error": None stays, as the document always carries it


def test_the_run_cache_syncs_and_notes_round_trip():
    run = {"max_seconds": 30.0, "cpu_count": 2, "rounds": 2, "settled": True, "remeasured": [["device", "collated"]],
           "allocator": {"controlled": False, "allocator": "musl", "reason": "not glibc"}}
    r = RunInfo.from_dict(run)
    assert isinstance(r.allocator, AllocatorHold) and r.remeasured == (["device", "collated"],)
    assert r.to_dict() == run
    cache = {"batches": 8, "samples": 64, "batch_bytes": 100, "fill_seconds": 0.5, "limited_by": None,
             "raw_transforms": ["dataset.transform (Compose)"]}
    assert CacheInfo.from_dict(cache).to_dict() == cache
    syncs = {"status": "ok", "steps": 3, "total": 6, "per_step": 2.0, "sites": [{"where": "a.py:3", "count": 6}]}
    assert Syncs.from_dict(syncs).sites == (SyncSite("a.py:3", 6),) and Syncs.from_dict(syncs).to_dict() == syncs
    note = Note("cache", "the caches hold 1 batch", derived=True)
    assert Note.from_dict(note.to_dict()) == note and str(note) == note.message


def test_a_point_keeps_the_documents_precision_and_its_wait_per_batch():
    tp = Throughput((Window(10, 0.1), Window(10, 0.1)), 8)
    p = PointResult("full", "ok", tp, first_batch_seconds=0.123456789, wait_seconds=0.0123456789)
    assert p.first_batch_seconds == 0.1235 and p.wait_seconds == 0.012346
    assert p.wait_per_batch == pytest.approx(0.012346 / 20) and p.ok
    assert PointResult("raw", "unavailable").wait_per_batch is None and not PointResult("raw", "unavailable").ok
