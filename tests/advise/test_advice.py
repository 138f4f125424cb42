"""Advice: each finding rule fires on its measured condition and stays silent otherwise.

Rules are tested on Reports built directly (exact planted stage costs, isolated
costs, syncs, memory): fast, and the only way to test the CUDA-only rules on a CPU
machine. Two end-to-end tests run planted pipelines through bisect().
"""

import json

import pytest

from bisect_pipeline.derive.witness import waits
from bisect_pipeline.advise import context, rules_workers, wording
from bisect_pipeline import bisect
from bisect_pipeline.report import PointResult, Report, build, stage_dict
from bisect_pipeline.core.stats import Throughput, Window
from bisect_pipeline.derive.drops import POINTS
from conftest import FAST_PLAN, PlantedDataset, Sleep, assert_names, make_loader, planted, tiny_model

BS = 16
CPU_SKIP = {"host": "no accelerator: host and device coincide"}


def tp(ms: float, jitter: float = 0.01) -> Throughput:
    """Five windows of 10 steps at `ms` per batch, spread by +-jitter."""
    factors = [1 - jitter, 1 - jitter / 2, 1, 1 + jitter / 2, 1 + jitter]
    return Throughput(tuple(Window(10, 10 * ms / 1e3 * f) for f in factors), BS)


def make_report(ms: dict, *, device: str = "cpu", loader: dict = None, isolated: dict = None, syncs: dict = None,
                cpu_count: int = 8) -> Report:
    """A Report from planted ms per batch at each point (the verdict computed from them)."""
    cuda = device.startswith("cuda")
    skipped = {} if cuda else dict(CPU_SKIP)
    points = []
    for name in POINTS:
        if name in ms:
            points.append(PointResult(name, "ok", tp(ms[name])))
        elif name in skipped:
            points.append(PointResult(name, "skipped", reason=skipped[name]))
        else:
            points.append(PointResult(name, "skipped", reason="not selected"))
    lo = {"num_workers": 0, "pin_memory": False, "collate_fn": "default_collate", "dataset": "ImageFolder"}
    lo.update(loader or {})
    return build(points, BS, device, loader=lo, cache={"raw_transforms": ["dataset.transform (Compose)"]},
                 run={"cpu_count": cpu_count}, isolated=isolated or {}, syncs=syncs or {})


# Planted pipelines (ms per batch at each point, the ceiling 10 ms).
AUGMENT_BOUND = {"device": 10, "collated": 10.5, "augmented": 11, "raw": 60, "full": 61}
LOAD_BOUND = {"device": 10, "collated": 10.5, "augmented": 11, "raw": 11.5, "full": 70}
COLLATE_BOUND = {"device": 10, "collated": 10.5, "augmented": 50, "raw": 50.5, "full": 51}
HANDOFF_BOUND = {"device": 10, "collated": 40, "augmented": 40.5, "raw": 41, "full": 41.5}
MODEL_BOUND = {"device": 40, "collated": 40.2, "augmented": 40.1, "raw": 40.3, "full": 40.4}
TRANSFER_BOUND = {"device": 10, "host": 30, "collated": 30.5, "augmented": 31, "raw": 31.5, "full": 32}


def kinds(r: Report) -> list:
    return [f.kind for f in r.advice]


def finding(r: Report, kind: str) -> dict:
    found = [f for f in r.advice if f.kind == kind]
    assert found, f"no {kind} finding in {kinds(r)}"
    return found[0]


def iso_workers(needed: int, cores: int, work: float = 48.0, step: float = 10.0) -> dict:
    return {"status": "ok", "workers": {"status": "ok", "needed": needed, "worker_ms_per_batch": work,
                                        "step_ms_per_batch": step, "cores": cores, "available": cores - 1,
                                        "fits": needed <= cores - 1}}


# --- num_workers / cores -----------------------------------------------------------------------


def test_num_workers_fires_for_augment_bottleneck_at_zero_workers_with_the_count_that_feeds_the_step():
    r = make_report(AUGMENT_BOUND, isolated=iso_workers(needed=5, cores=8))
    assert r.bottleneck == "augment"
    f = finding(r, "num_workers")
    assert f.stage == "augment"
    assert f.numbers["recommended"] == {"num_workers": 5, "persistent_workers": True}
    assert f.numbers["num_workers"] == 0 and f.numbers["needed"] == 5
    # tied to the measured numbers and the loader's own setting, never generic
    # the action first, then the reasoning
    assert wording.headline(f) == "Set num_workers=5, persistent_workers=True: not measured." and f.message.startswith(wording.headline(f))
    assert "With num_workers=0, augment runs in the training loop's own process." in wording.reasoning(f)
    assert "costs 48.0 ms per batch against a 10.0 ms step" in f.message
    # augment's drop (60 - 11 = 49 ms) and what it holds back are the verdict's, said once in the summary
    assert "49.0 ms per batch" not in f.message and "If augment were free" not in f.message
    assert "It costs 49.0 ms of every 61.0-ms batch" in r.summary and "without it, 1,333 samples/s" in r.summary


def test_workers_for_a_loader_built_anew_every_epoch_come_with_building_it_once():
    import dataclasses
    r = make_report(AUGMENT_BOUND, isolated=iso_workers(needed=5, cores=8))
    assert "anew every epoch" not in finding(r, "num_workers").message
    loop = Report.of(dataclasses.replace(r.measurements, mode="loop", source={
        "index": 1, "created_at": "train.py:21", "rebuilt": 7}))
    f = finding(loop, "num_workers")
    assert f.message.startswith("Set num_workers=5, persistent_workers=True: not measured.")
    assert "builds this DataLoader anew every epoch (at train.py:21): build it once, before the epoch loop" in f.message
    assert "built anew every epoch, 7 times" in str(loop)


def test_num_workers_added_to_persistent_workers_are_not_told_to_be_persistent():
    # workers=1 persistent, augment still bound: more workers, and nothing said about persistence
    r = make_report(AUGMENT_BOUND, loader={"num_workers": 1, "persistent_workers": True},
                    isolated=iso_workers(needed=5, cores=8))
    f = finding(r, "num_workers")
    assert f.numbers["recommended"] == {"num_workers": 5}
    assert "persistent" not in f.message


def test_num_workers_capped_by_this_machines_cores():
    r = make_report(AUGMENT_BOUND, isolated=iso_workers(needed=5, cores=2))
    f = finding(r, "num_workers")
    assert f.numbers["recommended"] == {"num_workers": 1, "persistent_workers": True}
    assert "2 cores" in f.message and "make the augment work cheaper" in f.message


def test_num_workers_on_a_cpu_step_that_uses_every_core_also_gives_the_worker_a_core():
    iso = iso_workers(needed=1, cores=2)
    iso["workers"]["step_threads"] = 2  # torch.get_num_threads() of the CPU step
    f = finding(make_report(AUGMENT_BOUND, isolated=iso), "num_workers")
    assert f.numbers["recommended"] == {"num_workers": 1, "torch_num_threads": 1, "persistent_workers": True}
    assert "torch.get_num_threads()=2 on 2 cores" in f.message and "torch.set_num_threads(1)" in f.message
    assert "--sweep num_workers=0,1" in f.message
    # the same on CUDA (the step does not run on the cores): workers only
    iso["workers"]["step_threads"] = 0
    f = finding(make_report(AUGMENT_BOUND | {"host": 10.2}, device="cuda:0", isolated=iso), "num_workers")
    assert f.numbers["recommended"] == {"num_workers": 1, "persistent_workers": True} and "set_num_threads" not in f.message


def test_num_workers_from_bisection_costs_when_isolation_is_missing():
    # num_workers=0: each stage's drop is its serial cost: load 1 + augment 49 + collate 0.5 ms
    # = 50.5 ms of worker work per batch against a 10 ms step -> ceil(5.05) = 6 workers
    r = make_report(AUGMENT_BOUND, isolated={}, cpu_count=16)
    f = finding(r, "num_workers")
    assert f.numbers["needed"] == 6 and f.numbers["source"].startswith("bisection")
    assert f.numbers["worker_ms_per_batch"] == pytest.approx(50.5, abs=0.01)
    assert f.numbers["recommended"] == {"num_workers": 6, "persistent_workers": True}


def test_num_workers_fires_when_load_and_augment_together_starve_the_step():
    # load 25 ms and augment 24 ms: too close to name one (a tie), but together a 49 ms
    # drop from full to collated, far above the noise: workers parallelize both
    ms = {"device": 10, "collated": 10.5, "augmented": 11, "raw": 35, "full": 60}
    r = make_report(ms, isolated=iso_workers(needed=5, cores=8))
    assert r.bottleneck == "tie" and r.verdict.tied == ("load", "augment")
    f = finding(r, "num_workers")
    assert f.stage == "load" and f.numbers["stages"] == "load + augment + collate together"
    assert f.numbers["stage_ms_per_batch"] == pytest.approx(49.5, abs=0.01)  # 60 - 10.5
    assert "Set num_workers=5" in f.message and "run in the training loop's own process" in f.message
    # if that work were free: 60 - 49.5 = 10.5 ms per batch, the ceiling 10 ms -> 16 / 0.0105
    assert f.numbers["headroom"]["samples_per_sec_if_free"] == pytest.approx(16 / 0.0105, rel=1e-3)
    assert "If that work were free" in f.message


def test_num_workers_silent_when_tied_but_the_worker_side_drop_is_noise():
    # handoff and transfer cost 15 ms each (a tie); load + augment + collate 0.8 ms
    ms = {"device": 10, "host": 25, "collated": 40, "augmented": 40.3, "raw": 40.5, "full": 40.8}
    r = make_report(ms, device="cuda:0", isolated=iso_workers(needed=1, cores=8))
    assert r.bottleneck == "tie" and set(r.verdict.tied) == {"handoff", "transfer"}
    assert "num_workers" not in kinds(r) and "cores" not in kinds(r)


def test_num_workers_silent_when_model_bound():
    r = make_report(MODEL_BOUND, isolated=iso_workers(needed=1, cores=8))
    assert r.bottleneck == "none"
    assert "num_workers" not in kinds(r) and "cores" not in kinds(r)
    assert not r.advice


def test_num_workers_silent_when_the_loader_already_has_enough_workers():
    r = make_report(AUGMENT_BOUND, loader={"num_workers": 6}, isolated=iso_workers(needed=5, cores=8))
    assert "num_workers" not in kinds(r)
    assert "augment" in kinds(r)  # the stage still costs: its own finding says so


def test_cores_finding_when_the_machine_cannot_supply_the_workers():
    r = make_report(AUGMENT_BOUND, loader={"num_workers": 1}, isolated=iso_workers(needed=4, cores=2))
    f = finding(r, "cores")
    assert wording.headline(f) == ("Make augment cheaper: more workers cannot help: about 4 would feed the step, "
                                  "num_workers=1 already uses the 1 core(s) free for them.")
    assert "num_workers" not in kinds(r)


def test_workers_whose_stages_wait_are_advised_past_the_cores():
    # a loader that waits on storage (CPU 10% of its time alone): its workers overlap their
    # waits, so 8 feed the step on 2 cores, where the rule for work that computes says
    # "more workers cannot help" (--tune measured 7.7-14x on such a loader: issue 51)
    def waiting(cpu: float, workers: int = 1) -> Report:
        iso = iso_workers(needed=8, cores=2)
        iso["workers"]["step_threads"] = 2
        iso["load"] = {"status": "ok", "ms_per_sample": 4.0, "cpu_ms_per_sample": cpu}
        return make_report(LOAD_BOUND, loader={"num_workers": workers}, isolated=iso, cpu_count=2)
    f = finding(waiting(0.4), "num_workers")
    assert f.numbers["recommended"] == {"num_workers": 8, "persistent_workers": True}  # no thread taken from the step
    assert "the workers' stages wait: CPU 10% of their time alone, so workers overlap their waits beyond" in f.message
    assert "cores" not in kinds(waiting(0.4))
    assert kinds(waiting(3.9)).count("cores") == 1 and "num_workers" not in kinds(waiting(3.9))  # it computes
    assert finding(waiting(0.4, workers=0), "num_workers").numbers["recommended"]["num_workers"] == 8


# --- pin_memory / non_blocking (transfer) ----------------------------------------------------


def transfer_iso(ms: float = 18.0, nbytes: int = 16 * 3 * 224 * 224 * 4, gbs: float = 0.6) -> dict:
    return {"status": "ok", "transfer": {"status": "ok", "ms_per_batch": ms, "bytes_per_batch": nbytes,
                                         "gb_per_s": gbs, "pinned": False}}


def test_pin_memory_fires_on_cuda_with_a_transfer_cost_and_pin_memory_false():
    r = make_report(TRANSFER_BOUND, device="cuda:0", isolated=transfer_iso())
    assert r.bottleneck == "transfer"
    f = finding(r, "pin_memory")
    assert f.stage == "transfer"
    assert "pin_memory=False" in f.message and "non_blocking=True" in f.message
    assert "20.0 ms" in f.message and "0.6 GB/s" in f.message  # the measured drop host -> device
    assert f.numbers["recommended"] == {"pin_memory": True, "non_blocking": True}
    assert f.numbers["source"].startswith("bisection")


def test_pin_memory_from_the_isolated_copy_when_the_bisection_drop_is_within_noise():
    flat = {"device": 30, "host": 30.1, "collated": 30.5, "augmented": 31, "raw": 31.5, "full": 32}
    r = make_report(flat, device="cuda:0", isolated=transfer_iso(ms=5.0))  # 5 ms >= 5% of 32 ms
    f = finding(r, "pin_memory")
    assert f.numbers["source"] == "isolated copy" and f.numbers["transfer_ms_per_batch"] == 5.0
    r = make_report(flat, device="cuda:0", isolated=transfer_iso(ms=0.5))  # negligible
    assert "pin_memory" not in kinds(r)


@pytest.mark.parametrize("device,loader", [("cuda:0", {"pin_memory": True}), ("cpu", {})])
def test_pin_memory_silent_when_pinned_or_without_cuda(device, loader):
    ms = TRANSFER_BOUND if device != "cpu" else {k: v for k, v in TRANSFER_BOUND.items() if k != "host"}
    r = make_report(ms, device=device, loader=loader, isolated=transfer_iso())
    assert "pin_memory" not in kinds(r)


def test_pin_memory_silent_without_a_transfer_cost():
    r = make_report(MODEL_BOUND | {"host": 40.1}, device="cuda:0", isolated=transfer_iso(ms=0.2))
    assert "pin_memory" not in kinds(r)


# --- uint8 payload -------------------------------------------------------------------------------


def batch_iso(dtype: str = "float32", shape=(16, 3, 224, 224), image: bool = True, **extra) -> dict:
    size = {"float32": 4, "uint8": 1, "float16": 2}[dtype]
    n = 1
    for d in shape:
        n *= d
    tensors = [{"path": "batch[0]", "dtype": dtype, "shape": list(shape), "bytes": n * size, "image": image},
               {"path": "batch[1]", "dtype": "int64", "shape": [shape[0]], "bytes": shape[0] * 8, "image": False}]
    iso = {"status": "ok", "batch": {"status": "ok", "bytes": n * size + shape[0] * 8, "n_tensors": 2,
                                     "tensors": tensors}}
    iso.update(extra)
    return iso


def test_uint8_payload_fires_for_float32_images_crossing_the_bus():
    r = make_report(TRANSFER_BOUND, device="cuda:0", isolated=batch_iso(**transfer_iso()))
    f = finding(r, "uint8_payload")
    nbytes = 16 * 3 * 224 * 224 * 4
    assert f.numbers["bytes"] == nbytes and f.numbers["bytes_saved"] == nbytes * 3 // 4
    assert "float32" in f.message and "[16, 3, 224, 224]" in f.message and "4x less payload" in f.message
    assert "9.2 MB" in f.message  # the batch's own size: 16*3*224*224*4 bytes


def test_uint8_payload_fires_on_the_handoff_without_cuda():
    r = make_report(HANDOFF_BOUND, loader={"num_workers": 4}, isolated=batch_iso())
    assert r.bottleneck == "handoff"
    f = finding(r, "uint8_payload")
    assert f.stage == "handoff" and "hand-off from workers" in f.message


@pytest.mark.parametrize("kw", [{"dtype": "uint8", "image": False}, {"image": False}])
def test_uint8_payload_silent_for_uint8_or_non_image_batches(kw):
    r = make_report(TRANSFER_BOUND, device="cuda:0", isolated=batch_iso(**kw, **transfer_iso()))
    assert "uint8_payload" not in kinds(r)


def test_uint8_payload_silent_when_moving_the_batch_costs_nothing():
    r = make_report(AUGMENT_BOUND, isolated=batch_iso())  # CPU, handoff within noise
    assert "uint8_payload" not in kinds(r)


# --- workers started again every epoch (persistent_workers) -----------------------------------------

# A MONAI-like pipeline (issue 22): 4 workers, 10-batch epochs, a real handoff of 8.3 ms and
# a float image batch, so the payload items fire too. The bisection's points run one
# endless epoch: full is 110 ms a batch there; its first batch (workers started, one batch
# of 300 ms of work, a 100 ms step) took 0.58 s: 180 ms of start, 18 ms a batch over an epoch.
RESTART_BOUND = {"device": 100, "collated": 108.3, "augmented": 108.8, "raw": 109.3, "full": 110}


def restart_report(*, epoch=10, first=0.58, persistent=False, workers=4, mode="entry", trial=None) -> Report:
    import dataclasses

    points = [PointResult(n, "ok", tp(RESTART_BOUND[n]), first_batch_seconds=first if n == "full" else 0.2)
              if n in RESTART_BOUND else PointResult(n, "skipped", reason=CPU_SKIP[n]) for n in POINTS]
    iso = batch_iso(shape=(16, 1, 96, 96), **iso_workers(needed=3, cores=8, work=300.0, step=100.0))
    lo = {"num_workers": workers, "persistent_workers": persistent, "batches_per_epoch": epoch, "pin_memory": False}
    verification = {"status": "ok", "trials": [trial] if trial else []}
    r = build(points, BS, "cpu", loader=lo, run={"cpu_count": 8}, isolated=iso, verification=verification)
    return Report.of(dataclasses.replace(r.measurements, mode=mode)) if mode != "entry" else r


def restart_trial(user_ms: float, candidate_ms: float) -> dict:
    def side(ms):
        return [{"steps": 10, "seconds": round(10 * ms / 1e3 * (1 + 0.01 * (i % 3 - 1)), 6), "visit": i // 3}
                for i in range(12)]
    return {"item": "persistent_workers", "settings": {"persistent_workers": True}, "user_windows": side(user_ms),
            "candidate_windows": side(candidate_ms), "error": None}


def test_workers_started_again_every_short_epoch_are_named_with_the_measured_gain_before_the_payload():
    r = restart_report(trial=restart_trial(128.0, 110.0))
    assert r.bottleneck == "handoff"
    f = finding(r, "persistent_workers")
    assert f.numbers["recommended"] == {"persistent_workers": True} and f.stage == "epoch"
    assert f.numbers["start_ms"] == pytest.approx(180.0) and f.numbers["start_ms_per_batch"] == pytest.approx(18.0)
    assert "every 10 batches" in f.message and "Set persistent_workers=True" in f.message
    assert f.verified.status == "helps" and f.verified.speedup == pytest.approx(128 / 110, rel=1e-3)
    assert wording.headline(f) == "Set persistent_workers=True: measured 1.16\u00d7 (1.16\u20131.16\u00d7)."
    assert "yours against persistent_workers=True: 128 \u2192 110 ms/batch" in wording.reasoning(f)
    # measured 1.16x, more than the payload could give (the handoff free: 110 / 101.7, 1.08x): it comes first
    assert kinds(r).index("persistent_workers") < kinds(r).index("uint8_payload") < kinds(r).index("handoff")
    assert " ".join(str(r).split()).index("persistent_workers=True: 128") < " ".join(str(r).split()).index("uint8")


def test_a_restart_within_the_noise_is_not_presented_as_a_fix_and_comes_after_the_payload():
    r = restart_report(trial=restart_trial(128.0, 127.0))
    f = finding(r, "persistent_workers")
    assert f.verified.status == "no gain" and "\u2192" not in f.message
    assert wording.headline(f).startswith("Set persistent_workers=True: measured no gain beyond the noise")
    assert kinds(r).index("handoff") < kinds(r).index("persistent_workers")
    # and so does one the check could not measure
    r = restart_report()
    assert finding(r, "persistent_workers").verified.status == "not measured"
    assert kinds(r).index("handoff") < kinds(r).index("persistent_workers")


def test_items_measured_to_help_come_first_and_those_without_gain_last_in_their_order():
    from bisect_pipeline.advise.advice import ranked
    from bisect_pipeline.derive.findings import Checked, Finding

    def item(kind, status=None):
        return Finding(kind, "augment", kind, verified=None if status is None else Checked(status=status))
    advice = (item("num_workers", "helps"), item("device_tail", "no gain"), item("augment"),
              item("device_augment", "slower"), item("storage", "not measured"))
    assert [f.kind for f in ranked(advice)] == ["num_workers", "augment", "storage", "device_tail", "device_augment"]
    # a fix measured to help goes before items not measured (the imagenet example with a planted slow PIL: the
    # unmeasured device tail and the load prose stood above decode's 1.52x), and is the summary's first change
    advice = (item("device_tail", "not measured"), item("load"), item("decode", "helps"), item("num_workers", "no gain"))
    assert [f.kind for f in ranked(advice)] == ["decode", "device_tail", "load", "num_workers"]
    # with the restart placed among the payload items first: a restart without gain goes last too
    r = restart_report(trial=restart_trial(128.0, 127.0))
    assert kinds(r)[-1] == "persistent_workers"


@pytest.mark.parametrize("kw", [
    {"epoch": 1000},  # long epochs: 110 s of batches, the restart spread over all of them
    {"persistent": True}, {"workers": 0}, {"epoch": None},
    {"first": 0.45},  # a start of 50 ms, 5 ms a batch: under 5% of the 110 ms batch
])
def test_no_restart_advice_where_the_epochs_are_long_or_the_workers_persistent_or_the_start_cheap(kw):
    assert "persistent_workers" not in kinds(restart_report(**kw))


def test_in_a_users_loop_the_restart_is_not_checked_and_says_why():
    from bisect_pipeline.advise import verify

    r = restart_report(mode="loop")
    f = finding(r, "persistent_workers")
    assert f.verified.status == "not measured" and "cannot measure it in your own loop" in f.message
    assert verify.candidates(f, threads=1, cores=8, on_cpu=True) == []


# --- collate -------------------------------------------------------------------------------------


def collate_iso(own=None, default=None, **structure) -> dict:
    st = {"status": "ok", "tensors": 1, "ndarrays": 0, "numbers": 1, "strings": 0, "images": 0, "longest_list": 0}
    st.update(structure)
    col = {"status": "ok", "ms_per_batch": own, "collate_fn": "pad_collate"}
    if default is not None:
        col["default_collate_ms_per_batch"] = default
    return {"status": "ok", "collate": col, "sample_structure": st,
            "batch": {"status": "ok", "bytes": 4096, "n_tensors": 2, "tensors": []}}


def test_collate_names_a_custom_functions_own_work():
    r = make_report(COLLATE_BOUND, loader={"collate_fn": "pad_collate"}, isolated=collate_iso(own=38.0, default=0.4))
    assert r.bottleneck == "collate"
    f = finding(r, "collate")
    # the split named: the function's own work against the stacking any collate does
    assert "pad_collate's own work is 37.6 of the 38.0 ms per batch it costs alone" in f.message
    assert "stacking (torch's default_collate on the same samples) 0.40" in f.message
    assert f.numbers["own_work_ms_per_batch"] == pytest.approx(37.6) and f.numbers["stacking_ms_per_batch"] == 0.4
    assert f.numbers["collate_ms_per_batch"] == pytest.approx(39.5)  # 50 - 10.5


def test_collate_names_the_batch_structure_that_makes_it_slow():
    r = make_report(COLLATE_BOUND, isolated=collate_iso(own=38.0, numbers=257, longest_list=256, ndarrays=3))
    f = finding(r, "collate")
    assert "257 Python numbers" in f.message and "longest list 256" in f.message
    assert "3 numpy array(s)" in f.message
    assert f.numbers["sample_structure"]["numbers"] == 257


def test_collate_silent_when_collate_is_not_the_bottleneck():
    r = make_report(AUGMENT_BOUND, isolated=collate_iso(own=38.0, default=0.4, numbers=300))
    assert "collate" not in kinds(r)


def test_collate_does_not_blame_the_function_when_stacking_is_most_of_it():
    r = make_report(COLLATE_BOUND, isolated=collate_iso(own=0.7, default=0.4, numbers=300))
    f = finding(r, "collate")
    assert "own work" not in f.message and "own_work_ms_per_batch" not in f.numbers
    assert "300 Python numbers" in f.message


# --- augment, by its parts -----------------------------------------------------------------------


def aug_iso(*rows, whole: float = None) -> dict:
    """Isolated costs whose augment breakdown has `rows`: (name, where, ms per sample or
    None for a row not run, input, output)."""
    out, timed = [], sum(r[2] for r in rows if r[2] is not None)
    for name, where, ms, inp, outp in rows:
        if ms is None:
            out.append({"status": "not run", "reason": "out of time", "name": name, "where": where})
        else:
            out.append({"status": "ok", "name": name, "where": where, "ms_per_sample": ms,
                        "share": round(ms / timed, 4), "input": inp, "output": outp, "samples": 8})
    complete = all(r[2] is not None for r in rows)
    b = {"status": "ok", "rows": out, "samples": 8, "sum_ms_per_sample": timed if complete else None}
    return {"status": "ok", "augment": {"status": "ok", "ms_per_sample": whole or timed, "samples": 8,
                                        "breakdown": b}}


T = "dataset.transform"
SEED = (("RandomResizedCrop", f"{T}[0]", 0.41, "500x375 RGB", "224x224 RGB"),
        ("ColorJitter", f"{T}[1]", 0.22, "224x224 RGB", "224x224 RGB"),
        ("ToTensor", f"{T}[2]", 0.15, "224x224 RGB", "3x224x224 float32"),
        ("Normalize", f"{T}[3]", 0.07, "3x224x224 float32", "3x224x224 float32"))


def test_augment_names_the_costliest_transform_with_its_share_and_remedy():
    r = make_report(AUGMENT_BOUND, isolated=aug_iso(*SEED))
    f = finding(r, "augment")
    msg = " ".join(f.message.split())
    # 0.41 is 48% of 0.85: not yet half, so the next costliest is named too (74%)
    assert ("RandomResizedCrop (dataset.transform[0]) costs 0.41 of 0.85 ms/sample (48%): it shrinks 500x375 RGB to "
            "224x224 RGB, so store the images pre-resized near that size, or decode them at a reduced size") in msg
    assert "ColorJitter (dataset.transform[1]) costs 0.22 of 0.85 ms/sample (26%): " in msg
    assert "ToTensor (" not in msg and "Normalize (" not in msg
    assert msg.index("RandomResizedCrop (") < msg.index("ColorJitter (")  # the costliest first
    assert "Move work that is the same every epoch" not in msg  # a specific remedy replaces the general one
    parts = f.numbers["parts"]
    assert [(p["name"], p["where"], p["ms_per_sample"], p["share"]) for p in parts] == [
        ("RandomResizedCrop", f"{T}[0]", 0.41, pytest.approx(0.4824, abs=1e-4)),
        ("ColorJitter", f"{T}[1]", 0.22, pytest.approx(0.2588, abs=1e-4))]
    assert parts[0]["input"] == "500x375 RGB" and "pre-resized" in parts[0]["remedy"]
    json.dumps(r.to_dict())  # the numbers stay JSON


@pytest.mark.parametrize("row,remedy", [
    (("RandAugment", f"{T}[1]", 3.0, "224x224 RGB", "224x224 RGB"), "fewer ops or a lower magnitude"),
    (("TrivialAugmentWide", f"{T}[1]", 3.0, "224x224 RGB", "224x224 RGB"), "on the device inside the step"),
    (("Normalize", f"{T}[1]", 3.0, "3x224x224 float32", "3x224x224 float32"), "keep the batch uint8"),
    (("ToDtype", f"{T}[1]", 3.0, "3x224x224 uint8", "3x224x224 float32"), "convert and normalize it there"),
    (("ToTensor", f"{T}[1]", 3.0, "224x224 RGB", "3x224x224 float32"), "PILToTensor"),
    # already after the crop: on the device (blur: a smaller kernel too)
    (("ColorJitter", f"{T}[1]", 3.0, "224x224 RGB", "224x224 RGB"), "run it batched on the device"),
    (("GaussianBlur", f"{T}[1]", 3.0, "224x224 RGB", "224x224 RGB"), "use a smaller kernel_size, run it batched"),
    (("RandomRotation", f"{T}[1]", 3.0, "224x224 RGB", "224x224 RGB"), "run it batched on the device"),
])
def test_augment_remedy_by_the_transforms_kind(row, remedy):
    crop = ("RandomResizedCrop", f"{T}[0]", 0.1, "256x256 RGB", "224x224 RGB")  # not a shrink: no remedy of its own
    f = finding(make_report(AUGMENT_BOUND, isolated=aug_iso(crop, row)), "augment")
    assert f.numbers["parts"][0]["name"] == row[0] and remedy in f.numbers["parts"][0]["remedy"]
    assert len(f.numbers["parts"]) == 1  # 97% of the sum: one is enough
    assert remedy in f.message and "move it after" not in f.message


def test_augment_says_to_move_a_pixel_op_after_a_later_crop_only_where_the_move_was_timed():
    blur = ("GaussianBlur", f"{T}[0]", 6.0, "500x375 RGB", "500x375 RGB")
    crop = ("RandomCrop", f"{T}[1]", 0.2, "500x375 RGB", "224x224 RGB")
    f = finding(make_report(AUGMENT_BOUND, isolated=aug_iso(blur, crop)), "augment")
    assert ("GaussianBlur (dataset.transform[0]) costs 6.00 of 6.20 ms/sample (97%): use a smaller kernel_size, "
            "run it batched on the device") in f.message and "move it after" not in f.message  # not timed: not said
    # the move timed (reorder.py): its saving said, or the move not offered when it saved nothing
    for real, said in ((True, "move it after RandomCrop (dataset.transform[1]): on the same inputs that saved 4.10 ms "
                              "per sample; or run it batched"),
                       (False, "run it batched on the device inside the step (torchvision v2 transforms take batched "
                               "tensors; one random draw per batch); moved after RandomCrop it saved nothing beyond the noise.")):
        iso = aug_iso(blur, crop)
        iso["augment"]["breakdown"]["reorders"] = [{
            "transform": "GaussianBlur", "where": f"{T}[0]", "after": "RandomCrop", "after_where": f"{T}[1]",
            "ms_per_sample": 6.0, "reordered_ms_per_sample": 1.9, "saving_ms_per_sample": 4.1, "tolerance_ms": 0.3,
            "real": real}]
        f = finding(make_report(AUGMENT_BOUND, isolated=iso), "augment")
        assert said in f.message and "on the fewer pixels it keeps" not in f.message
    # a warp before a crop is not moved after it (the crop would then show its borders)
    warp = ("RandomRotation", f"{T}[0]", 6.0, "500x375 RGB", "500x375 RGB")
    f = finding(make_report(AUGMENT_BOUND, isolated=aug_iso(warp, crop)), "augment")
    assert "move it after" not in f.message and "run it batched on the device" in f.message


def test_augment_without_a_known_remedy_keeps_the_general_advice():
    rows = (("my_warp", f"{T}[0]", 4.0, "3x64x64 uint8", "3x64x64 uint8"),
            ("Resize", f"{T}[1]", 1.0, "3x64x64 uint8", "3x56x56 uint8"))  # a resize that hardly shrinks
    f = finding(make_report(AUGMENT_BOUND, isolated=aug_iso(*rows)), "augment")
    assert "my_warp (dataset.transform[0]) costs 4.00 of 5.00 ms/sample (80%)." in f.message
    assert f.numbers["parts"][0]["remedy"] is None
    assert "Move work that is the same every epoch" in f.message


def test_augment_with_transforms_not_timed_says_of_what_the_share_is():
    rows = SEED[:2] + (("ToTensor", f"{T}[2]", None, None, None),)
    f = finding(make_report(AUGMENT_BOUND, isolated=aug_iso(*rows)), "augment")
    assert "RandomResizedCrop (dataset.transform[0]) costs 0.41 of 0.63 ms/sample timed (not every transform was) " \
           "(65%)" in f.message
    assert [p["name"] for p in f.numbers["parts"]] == ["RandomResizedCrop"]


def test_augment_names_no_part_without_two_transforms_timed():
    one = (("Compose", "dataset.transform", 3.0, "224x224 RGB", "3x224x224 float32"),)
    for iso in (aug_iso(*one), {}):
        f = finding(make_report(AUGMENT_BOUND, isolated=iso), "augment")
        assert "parts" not in f.numbers and "costs" not in f.message
        assert "Move work that is the same every epoch" in f.message
    # and when augment is not the bottleneck, no augment finding at all
    assert "augment" not in kinds(make_report(LOAD_BOUND, isolated=aug_iso(*SEED)))


# --- storage (load) --------------------------------------------------------------------------------


def test_storage_advice_for_a_load_bottleneck_with_its_numbers():
    iso = {"status": "ok", "load": {"status": "ok", "ms_per_sample": 3.5, "includes": ["load"]}}
    r = make_report(LOAD_BOUND, loader={"num_workers": 2, "dataset": "ImageFolder"}, isolated=iso)
    assert r.bottleneck == "load"
    f = finding(r, "storage")
    assert wording.headline(f) == ("Make loading ImageFolder's samples cheaper: alone a sample takes 3.50 ms to load, "
                                  "so 2 process(es) cap input at 571 samples/s.")
    assert f.numbers["load_cap_samples_per_sec"] == pytest.approx(2 * 1000 / 3.5, abs=0.1)
    # load's cost (58.5 ms) and what it holds back are the verdict's: the summary says them, once
    assert "58.5 ms per batch" not in f.message and "If load were free" not in f.message
    assert "It costs 58.5 ms of every" in r.summary


def _split_iso(bound: str) -> dict:
    split = ({"read_ms_per_sample": 3.0, "decode_ms_per_sample": 0.5, "bytes_per_sample": 150_000.0,
              "read_mb_per_s": 50.0, "files_per_sample": 1.0} if bound == "read" else
             {"read_ms_per_sample": 0.2, "decode_ms_per_sample": 3.3, "bytes_per_sample": 150_000.0,
              "read_mb_per_s": 750.0, "files_per_sample": 1.0})
    split.update(status="ok", samples=8, bound=bound, how="reads timed through open() (8 files)")
    return {"status": "ok", "load": {"status": "ok", "ms_per_sample": 3.5, "includes": ["load"], "split": split}}


def test_storage_advice_names_reading_when_load_is_read_bound():
    r = make_report(LOAD_BOUND, loader={"num_workers": 2, "dataset": "ImageFolder"}, isolated=_split_iso("read"))
    f = finding(r, "storage")
    assert "reading its files takes 3.00 ms (150 KB in 1 file(s) per sample at 50.0 MB/s)" in f.message
    assert "Of a sample's 3.50 ms alone, reading" in f.message
    assert "storage is the larger part" in f.message and "shards" in f.message
    assert "decode_jpeg" not in f.message
    assert f.numbers["split"]["bound"] == "read" and f.numbers["split"]["read_mb_per_s"] == 50.0


def test_storage_advice_names_decoding_when_load_is_decode_bound_and_the_gpu_only_on_cuda():
    r = make_report(LOAD_BOUND, loader={"num_workers": 2, "dataset": "ImageFolder"}, isolated=_split_iso("decode"))
    f = finding(r, "storage")
    assert "decoding and the dataset's other work 3.30 ms" in f.message and "decoding is the larger part" in f.message
    assert "Image.draft" in f.message and "torchvision.io.decode_jpeg" in f.message
    assert "device='cuda'" not in f.message and "shards" not in f.message
    assert f.numbers["split"]["decode_ms_per_sample"] == 3.3
    cuda = make_report(LOAD_BOUND, device="cuda", loader={"num_workers": 2}, isolated=_split_iso("decode"))
    assert "device='cuda'" in finding(cuda, "storage").message


def test_storage_advice_without_a_split_stays_generic():
    iso = _split_iso("read")
    iso["load"]["split"] = {"status": "unavailable", "reason": "no file was read"}
    f = finding(make_report(LOAD_BOUND, isolated=iso), "storage")
    assert "Read fewer, larger files" in f.message and "split" not in f.numbers


def test_storage_silent_when_not_load_bound():
    iso = {"status": "ok", "load": {"status": "ok", "ms_per_sample": 3.5, "includes": ["load"]}}
    for ms in (AUGMENT_BOUND, MODEL_BOUND):
        assert "storage" not in kinds(make_report(ms, isolated=iso))


# --- batch size / memory (CUDA only) ----------------------------------------------------------


def memory_iso(fraction: float, total: int = 80 * 2**30) -> dict:
    return {"status": "ok", "memory": {"status": "ok", "peak_bytes": int(total * fraction), "total_bytes": total,
                                       "fraction": fraction}}


def test_batch_size_fires_when_step_bound_and_memory_mostly_unused():
    r = make_report(MODEL_BOUND | {"host": 40.1}, device="cuda:0", isolated=memory_iso(0.1))
    assert context.input_bound_class(r) == "not"
    f = finding(r, "batch_size")
    assert f.numbers["batch_size_fits_about"] == 80  # 16 * 0.5 / 0.1
    assert "8.00 GB of 80 GB" in f.message and "from 16" in f.message


@pytest.mark.parametrize("ms,device,fraction", [
    (MODEL_BOUND | {"host": 40.1}, "cuda:0", 0.7),  # memory mostly used
    (AUGMENT_BOUND | {"host": 10.2}, "cuda:0", 0.1),  # input-bound: a larger batch does not help
    (MODEL_BOUND, "cpu", 0.1),  # no GPU memory to speak of
])
def test_batch_size_silent_otherwise(ms, device, fraction):
    assert "batch_size" not in kinds(make_report(ms, device=device, isolated=memory_iso(fraction)))


# --- syncs (CUDA only) -------------------------------------------------------------------------


def test_syncs_finding_names_where_the_step_synchronizes():
    syncs = {"status": "ok", "steps": 3, "total": 6, "per_step": 2.0,
             "sites": [{"where": "train.py:42", "count": 3}, {"where": "train.py:57", "count": 3}]}
    r = make_report(AUGMENT_BOUND | {"host": 10.2}, device="cuda:0", syncs=syncs)
    f = finding(r, "syncs")
    assert f.stage == "step" and f.numbers["per_step"] == 2.0
    assert "2 time(s) per step" in f.message and "train.py:42 (3x)" in f.message
    assert "highly input-bound" in f.message  # and why it matters here


@pytest.mark.parametrize("syncs", [{"status": "ok", "steps": 3, "total": 0, "per_step": 0.0, "sites": []},
                                   {"status": "skipped", "reason": "no CUDA device"}, {}])
def test_syncs_silent_without_syncs(syncs):
    assert "syncs" not in kinds(make_report(MODEL_BOUND, syncs=syncs))


# --- headroom and the typed document ---------------------------------------------------------------


def test_headroom_if_a_stage_were_free():
    r = make_report(AUGMENT_BOUND)
    # full 61 ms, augment costs 49 ms: free -> 12 ms per batch -> 16 / 0.012 samples/s
    h = context.headroom(r, "augment")
    assert h["samples_per_sec_if_free"] == pytest.approx(BS / 0.012, rel=1e-3)
    assert h["gain_if_free"] == pytest.approx(61 / 12 - 1, rel=1e-3)
    full = r.points[0].throughput.samples_per_sec
    d = stage_dict(r.stage("augment"), full)
    assert d["samples_per_sec_if_free"] == pytest.approx(BS / 0.012, rel=1e-3)
    assert d["gain_if_free"] == pytest.approx(61 / 12 - 1, rel=1e-3)
    assert context.headroom(r, "transfer") == {}  # skipped on CPU: no headroom to claim
    said = " ".join(str(r).split())
    assert "without it, 1,333 samples/s instead of 262 (+408%)" in said and said.count("1,333 samples/s") == 1


def test_advice_is_typed_data_in_the_json():
    r = make_report(AUGMENT_BOUND, isolated=iso_workers(needed=3, cores=8))
    doc = json.loads(r.to_json())
    assert doc["verdict"]["input_bound_class"] == "highly"
    assert doc["verdict"]["input_bound_thresholds"] == {"moderately": 0.05, "highly": 0.2}
    assert [a["kind"] for a in doc["advice"]] == ["num_workers", "augment"]
    for a in doc["advice"]:
        assert {"kind", "stage", "message", "numbers", "action"} <= set(a) and a["numbers"]
        assert a["message"].startswith(a["action"])  # the action first, the reasoning (`why`) after it
    # the text renders the same findings: the first as the summary's first change
    text = " ".join(str(r).split())
    assert "First change: set num_workers=3, persistent_workers=True: not measured." in text
    assert "What to do, first to last: 1. The first change, above; why: With num_workers=0" in text


# --- end to end through bisect() -------------------------------------------------------------------


@pytest.mark.e2e
def test_end_to_end_augment_bound_at_zero_workers_advises_workers(planted_run):
    # 8 x 5 ms of augment per batch against a ~2 ms step: 20x every other stage, so a busy
    # 2-core machine's noise cannot make another stage look as costly
    r = planted_run("augment", 0)
    assert_names(r, "augment")
    f = finding(r, "num_workers")
    iso = r.isolated.workers
    assert iso.needed >= 2  # 40 ms of worker work against a step of a few ms
    # a planted sleep waits (CPU next to none of its time alone): its workers overlap their
    # waits past the cores
    assert waits(r.isolated)
    most = iso.cores * rules_workers.WAITING_CORES_FACTOR
    assert f.numbers["recommended"]["num_workers"] == max(1, min(iso.needed, most))
    assert f.numbers["num_workers"] == 0 and "num_workers=0" in f.message
    assert context.input_bound_class(r) == "highly"


@pytest.mark.e2e
def test_end_to_end_model_bound_gives_no_worker_advice(planted_run):
    r = planted_run("model", 0)  # 80 ms steps, ~2 ms of input: 40x
    assert_names(r, "none")
    assert not {"num_workers", "cores", "augment", "storage", "collate"} & set(kinds(r)), r.advice
    assert r.isolated.workers.needed == 1  # the 80 ms step outruns ~0 ms of worker work


def allocator_iso(default_ms: float, held_ms: float, real: bool) -> dict:
    return {"status": "ok", "allocator": {"status": "ok", "default_ms_per_batch": default_ms, "held_ms_per_batch": held_ms,
                                          "cost_ms_per_batch": default_ms - held_ms, "noise_ms": 0.3, "real": real}}


def test_allocator_fires_when_the_step_costs_more_as_the_process_runs():
    f = finding(make_report(MODEL_BOUND, isolated=allocator_iso(21.0, 15.0, True)), "allocator")
    assert f.stage == "step"
    assert "21.0 ms" in f.message and "15.0 ms" in f.message and "+40%" in f.message
    assert "MALLOC_TRIM_THRESHOLD_=-1" in f.message and "jemalloc" in f.message
    assert f.numbers["recommended"]["env"]["MALLOC_MMAP_THRESHOLD_"] == "33554432"


@pytest.mark.parametrize("iso", [allocator_iso(15.2, 15.0, False), {"status": "ok"},
                                 {"status": "ok", "allocator": {"status": "skipped", "reason": "not glibc"}}])
def test_allocator_silent_without_a_real_cost(iso):
    assert "allocator" not in kinds(make_report(MODEL_BOUND, isolated=iso))


def test_augment_says_what_the_costliest_transform_costs_the_loop_when_measured_in_the_pipeline():
    iso = aug_iso(*SEED)
    confirmed = {"status": "ok", "transform": "RandomResizedCrop", "where": f"{T}[0]", "predicted_ms_per_batch": 13.1,
                 "measured_ms_per_batch": 12.4, "tolerance_ms": 1.05, "real": True, "with_ms_per_batch": 30.0,
                 "without_ms_per_batch": 17.6, "windows": 12}
    iso["augment"]["breakdown"]["confirmed"] = confirmed
    f = finding(make_report(AUGMENT_BOUND, isolated=iso), "augment")
    # the breakdown says it (text: 'In the pipeline ...'; HTML: its block), the advice keeps its numbers
    assert "costs the loop" not in f.message
    report = make_report(AUGMENT_BOUND, isolated=iso)
    assert " ".join(str(report).split()).count("costs the loop 12.4 ± 1.1 ms per batch") == 1
    assert f.numbers["confirmed"]["measured_ms_per_batch"] == 12.4 and f.numbers["confirmed"]["predicted_ms_per_batch"] == 13.1
    for off in ({"real": False}, {"status": "skipped", "reason": "the check is off"}):
        iso["augment"]["breakdown"]["confirmed"] = {**confirmed, **off}
        f = finding(make_report(AUGMENT_BOUND, isolated=iso), "augment")
        assert "Measured in the pipeline" not in f.message and "confirmed" not in f.numbers


# --- reorder -------------------------------------------------------------------------------------


def reorder_iso(real: bool, saving: float = 3.0) -> dict:
    r = {"transform": "GaussianBlur, ColorJitter", "where": "dataset.transform[0], dataset.transform[1]",
         "after": "RandomCrop", "after_where": "dataset.transform[2]",
         "order": ["RandomCrop", "GaussianBlur", "ColorJitter", "ToTensor"], "pixels_before": 200704,
         "pixels_after": 50176, "ms_per_sample": 4.0, "reordered_ms_per_sample": 4.0 - saving,
         "saving_ms_per_sample": saving, "tolerance_ms": 0.2, "samples": 24, "real": real}
    return {"status": "ok", "items_per_batch": BS,
            "augment": {"status": "ok", "ms_per_sample": 4.0, "samples": 8,
                        "breakdown": {"status": "ok", "rows": [], "samples": 8, "reorders": [r]}}}


def test_a_real_reorder_of_an_augment_bottleneck_is_an_item_with_its_measured_figures():
    r = make_report(AUGMENT_BOUND, isolated=reorder_iso(True))
    f = finding(r, "reorder")
    assert f.stage == "augment" and f.verified is None  # timed alone: not checked in the full pipeline
    assert " ".join(f.message.split()).startswith(
        "Move GaussianBlur, ColorJitter (dataset.transform[0], dataset.transform[1]) after RandomCrop "
        "(dataset.transform[2]): saves 3.00 \u00b1 0.20 ms per sample, 48.0 ms per batch of 16. 4.00 \u2192 1.00 ms "
        "per sample on the same inputs; it then runs on 50,176 pixels instead of 200,704.")
    assert f.numbers["saving_ms_per_batch"] == 48.0 and f.numbers["pixels_after"] == 50176
    assert kinds(r).index("reorder") == kinds(r).index("augment") + 1
    # the document keeps it
    assert json.loads(json.dumps(r.to_dict()))["advice"][kinds(r).index("reorder")]["kind"] == "reorder"


def test_no_reorder_item_when_the_saving_is_within_noise_or_augment_is_not_the_bottleneck():
    assert "reorder" not in kinds(make_report(AUGMENT_BOUND, isolated=reorder_iso(False, saving=0.1)))
    assert "reorder" not in kinds(make_report(LOAD_BOUND, isolated=reorder_iso(True)))


def test_collate_that_mixes_the_batch_is_told_to_mix_on_the_device_not_to_move_into_the_transforms():
    iso = collate_iso(own=6.0, default=1.5)
    iso["collate"]["mixes"] = ["MixUp", "CutMix"]
    f = finding(make_report(COLLATE_BOUND, loader={"collate_fn": "collate_fn"}, isolated=iso), "collate")
    msg = " ".join(f.message.split())
    assert "collate_fn's own work is 4.5 of the 6.0 ms per batch it costs alone" in msg
    assert "it mixes the batch (MixUp, CutMix)" in msg and "on the device inside the step" in msg
    assert "move it into the dataset's transforms" not in msg and f.numbers["mixes"] == ["MixUp", "CutMix"]


def test_a_node_graphs_stage_in_a_mapper_of_its_own_is_told_to_run_it_in_parallel():
    # IterableWrapper -> ParallelMapper(read, 2 threads) -> Mapper(augment) -> Batcher: the
    # check and --tune set the main Mapper's workers (the read's), which cannot help an
    # augment that runs in one thread of its own (it measured 1.00x)
    mappers = [{"node": "ParallelMapper(read, num_workers=2, method='thread', in_order=True)", "stage": "load",
                "num_workers": 2, "main": True},
               {"node": "Mapper(augment)", "stage": "augment", "num_workers": 0, "main": False}]
    loader = {"kind": "torchdata.nodes", "num_workers": 2, "main_mapper": mappers[0]["node"], "mappers": mappers}
    r = make_report(AUGMENT_BOUND, loader=loader, isolated=iso_workers(needed=5, cores=8))
    f = finding(r, "num_workers")
    assert wording.headline(f) == "Run Mapper(augment) as a ParallelMapper."
    assert "in one thread" in f.message and "about 5 workers would feed the step" in f.message  # 49 ms / 10 ms
    assert not f.numbers.get("recommended")  # nothing the check would set: not checked
    main = dict(loader, mappers=[dict(mappers[0], stage="augment", main=True)])
    assert wording.headline(finding(make_report(AUGMENT_BOUND, loader=main, isolated=iso_workers(5, 8)),
                                   "num_workers")).startswith("Set ParallelMapper(num_workers=5)")
