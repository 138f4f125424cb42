"""The pipeline's own fixes in the advice: each speaks where a stage it can make cheaper
is in question, says what its check compared, is measured as loader settings are, and
is refused with the difference said where its batches differ. Reports built directly
(exact planted stage costs, fixes and trials as a run stores them)."""

import pytest

from bisect_pipeline.advise import wording
from bisect_pipeline.report import PointResult, build
from bisect_pipeline.report.summary import first_item
from bisect_pipeline.derive.drops import POINTS
from test_advice import AUGMENT_BOUND, BS, CPU_SKIP, HANDOFF_BOUND, LOAD_BOUND, MODEL_BOUND, batch_iso, kinds, tp

TAIL = {"status": "ok", "kind": "device_tail", "where": "dataset.transform", "moved": ["ToTensor's scaling", "Normalize"],
        "kept": ["RandomResizedCrop", "PILToTensor"], "random": [], "path": "[0]", "batches": 2, "samples": 32,
        "matches": True, "max_difference": 0.0, "mean_difference": 0.0, "tolerance": 3.3e-06,
        "before": {"dtype": "float32", "bytes": 9633792, "shape": [16, 3, 224, 224]},
        "after": {"dtype": "uint8", "bytes": 2408448, "shape": [16, 3, 224, 224]},
        "code": "dataset.transform = Compose([RandomResizedCrop(224), PILToTensor()])  # in the workers\n"
                "tail = Compose([ConvertImageDtype(torch.float32), Normalize()])  # in the step\n"
                "batch[0] = tail(batch[0].to(device, non_blocking=True))"}
AUGMENT = dict(TAIL, kind="device_augment", moved=["RandomHorizontalFlip", "ToTensor's scaling", "Normalize"],
               random=["RandomHorizontalFlip"], max_difference=None, mean_difference=None, tolerance=None)
DECODE = {"status": "ok", "kind": "decode", "where": "dataset.loader", "moved": ["PIL decode"],
          "kept": ["RandomResizedCrop", "ToTensor's scaling", "Normalize"], "path": "[0]", "batches": 1, "samples": 8,
          "matches": True, "max_difference": 0.0175, "mean_difference": 0.0018, "tolerance": 0.0175, "level": 0.0175,
          "code": "dataset.loader = decode\ndataset.transform = Compose([...])"}


def trial(kind: str, user_ms: float, fix_ms: float) -> dict:
    def side(ms):
        return [{"steps": 10, "seconds": round(10 * ms / 1e3 * (1 + 0.01 * (i % 3 - 1)), 6), "visit": i // 3}
                for i in range(12)]
    return {"item": kind, "settings": {"fix": kind}, "user_windows": side(user_ms), "candidate_windows": side(fix_ms),
            "error": None}


def report(ms: dict, fixes: list, trials: list = (), device: str = "cpu"):
    points = [PointResult(n, "ok", tp(ms[n])) if n in ms else PointResult(n, "skipped", reason=CPU_SKIP[n])
              for n in POINTS]
    return build(points, BS, device, loader={"num_workers": 2, "persistent_workers": True, "pin_memory": False},
                 run={"cpu_count": 2}, isolated=batch_iso(),
                 verification={"status": "ok", "trials": list(trials), "fixes": list(fixes)})


def item(r, kind):
    return next(f for f in r.advice if f.kind == kind)


def test_a_float32_handoff_gets_the_device_tail_which_measured_helping_is_the_first_change():
    r = report(HANDOFF_BOUND, [TAIL], [trial("device_tail", 41.5, 20.0)])
    assert r.bottleneck == "handoff"
    f = item(r, "device_tail")
    assert "uint8_payload" not in kinds(r)  # the same move, now measured: said once
    assert f.numbers["recommended"] == {"fix": "device_tail"} and f.stage == "handoff"
    assert f.verified.status == "helps" and f.verified.speedup == pytest.approx(41.5 / 20, rel=1e-3)
    assert wording.headline(f).startswith("Run ToTensor's scaling and Normalize batched on the device inside the step, "
                                         "not in the workers: measured 2.08\u00d7")
    text = " ".join(f.message.split())
    assert "the largest difference 0 (tolerance 3.3e-06)" in text and "uint8 [16, 3, 224, 224] (2.4 MB)" in text
    assert "yours against the transforms' tail run batched on the device: 41.5 \u2192 20 ms/batch" in text
    assert "In code: dataset.transform = Compose([RandomResizedCrop(224), PILToTensor()]); tail =" in text
    assert first_item(r) is f and "First change: run ToTensor's scaling and Normalize" in str(r)


def test_before_its_check_the_tail_says_the_payload_it_saves():
    r = report(HANDOFF_BOUND, [TAIL])
    f = item(r, "device_tail")
    assert wording.headline(f).endswith("not in the workers: 4x less payload (7.2 MB less per batch).")


def test_a_cheap_tail_within_the_noise_is_not_presented_as_a_fix_nor_first():
    r = report(AUGMENT_BOUND, [TAIL], [trial("device_tail", 61.0, 60.5)])
    f = item(r, "device_tail")
    assert f.verified.status == "no gain" and first_item(r) is not f


def test_a_tail_whose_batched_output_differs_is_refused_with_the_difference_said():
    refused = dict(TAIL, matches=False, max_difference=15.7, mismatch="values differ by up to 15.7 (tolerance 1.2e-05)")
    r = report(HANDOFF_BOUND, [refused])
    f = item(r, "device_tail")
    assert f.numbers["refused"] and "recommended" not in f.numbers and f.verified is None
    assert " ".join(f.message.split()) == (
        "Moving ToTensor's scaling and Normalize to the device was checked and is not offered. Before any timing, "
        "built both ways on 32 cached samples, the batches differ: values differ by up to 15.7 (tolerance 1.2e-05).")
    assert "uint8_payload" in kinds(r)  # the move by hand stays advised (it is the user's to check)
    assert first_item(r) is not f
    failed = dict(TAIL, status="failed", matches=None, reason="the moved pipeline raised TypeError: boom")
    assert "the moved pipeline raised TypeError: boom" in item(report(HANDOFF_BOUND, [failed]), "device_tail").message


def test_random_transforms_on_the_device_are_offered_with_their_one_draw_per_batch_and_never_first():
    r = report(AUGMENT_BOUND, [TAIL, AUGMENT], [trial("device_augment", 61.0, 20.0)])
    f = item(r, "device_augment")
    assert f.numbers["changes_augmentation"] and f.verified.status == "helps"
    text = " ".join(f.message.split())
    assert wording.headline(f).startswith("Run RandomHorizontalFlip batched on the device inside the step, with "
                                         "ToTensor's scaling and Normalize after them, one random draw per batch "
                                         "instead of per sample: measured 3.05\u00d7")
    assert "This changes your augmentation" in text and "never the first change on its own" in text
    assert first_item(r) is not f


def test_a_pil_decoded_folder_gets_the_decode_fix_where_load_is_in_question():
    r = report(LOAD_BOUND, [TAIL, DECODE])
    f = item(r, "decode")
    assert f.stage == "load" and f.numbers["recommended"] == {"fix": "decode"}
    text = " ".join(f.message.split())
    assert "within 0.10 grey levels on average (the largest difference 1.0" in text
    assert "Your transforms become RandomResizedCrop, ToTensor's scaling and Normalize." in text
    assert "decode" not in kinds(report(AUGMENT_BOUND, [TAIL, DECODE]))  # load not in question


def test_no_fix_speaks_where_the_step_is_the_limit_or_none_was_built():
    assert not {"device_tail", "decode", "device_augment"} & set(kinds(report(MODEL_BOUND, [TAIL, DECODE, AUGMENT])))
    unavailable = {"status": "unavailable", "kind": "device_tail", "reason": "no transform was recorded"}
    assert "device_tail" not in kinds(report(HANDOFF_BOUND, [unavailable]))


def test_the_fixes_go_to_json_and_back_unchanged():
    import json

    from bisect_pipeline.report import Report, document
    r = report(HANDOFF_BOUND, [TAIL, DECODE], [trial("device_tail", 41.5, 20.0)])
    doc = json.loads(json.dumps(r.to_dict()))
    assert [f["kind"] for f in doc["verification"]["fixes"]] == ["device_tail", "decode"]
    again = Report.of(document.measurements_of(doc))
    assert again.to_dict() == doc and str(again) == str(r)


def test_on_cuda_the_syncs_the_tail_adds_are_said():
    synced = dict(TAIL, syncs={"status": "ok", "steps": 3, "total": 3, "per_step": 1.0,
                               "sites": [{"where": "torchvision/transforms/v2/_misc.py:123", "count": 3}]})
    r = report(HANDOFF_BOUND, [synced], device="cuda")
    text = " ".join(item(r, "device_tail").message.split())
    assert ("synchronize host and device 1 time(s) per batch (at torchvision/transforms/v2/_misc.py:123 (3x))"
            in text and "and the transfer carries that" in text)
    assert "synchronize" not in item(report(HANDOFF_BOUND, [TAIL]), "device_tail").message
