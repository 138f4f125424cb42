"""Decode by torchvision written against the user's script (patch_decode.py, through
patch.make).

The pytorch/examples ImageNet script's shape (its train and val ImageFolders, each with a
Compose list, `normalize` bound once and used in both), over JPEGs written here: the diff
applies with `git apply`, gives the train ImageFolder the loader and its list the tensor,
leaves the val one alone, and the patched script's first batch equals the original's
within the check's tolerance (the same random draws; the decoders and the resizes agree
within a grey level). Shapes it cannot rewrite safely say why and write nothing.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from typing import Optional

import pytest
import torch

from bisect_pipeline.advise import change, edits, patch, patch_decode, tune
from bisect_pipeline.core.fixes import Fix
from bisect_pipeline.core.results import Measurements, Trial, Verification
from bisect_pipeline.measure import decode
from test_change import BEST, TAIL_FIX, checked, measured, planted_runs, tail_trial
from test_outcome import BS, side
from test_patch import apply, untouched_lines_kept

KEPT = ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor's scaling", "Normalize")
FIX = {"kind": "decode", "where": "dataset.loader", "moved": ("PIL decode",), "kept": KEPT, "path": "[0]"}
SETTINGS = {"fix": "decode"}

IMAGENET = textwrap.dedent('''\
    import argparse
    import os

    import torch
    import torch.utils.data
    import torchvision.datasets as datasets
    import torchvision.transforms as transforms


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('data')
        parser.add_argument('--out')
        args = parser.parse_args()
        torch.manual_seed(0)
        traindir = os.path.join(args.data, 'train')
        valdir = os.path.join(args.data, 'val')
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406],
                                         std=[0.229, 0.224, 0.225])

        train_dataset = datasets.ImageFolder(
            traindir,
            transforms.Compose([
                transforms.RandomResizedCrop(24),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]))

        val_dataset = datasets.ImageFolder(
            valdir,
            transforms.Compose([
                transforms.Resize(28),
                transforms.CenterCrop(24),
                transforms.ToTensor(),
                normalize,
            ]))
        train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=6, shuffle=False, num_workers=0)
        val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=6, shuffle=False, num_workers=0)
        images, target = next(iter(train_loader))
        val_images, _ = next(iter(val_loader))
        torch.save({"train": images, "val": val_images, "target": target}, args.out)


    if __name__ == '__main__':
        main()
''')


def make(source: str, fix: dict = FIX) -> patch.Patch:
    return patch.make(source, path="main.py", line=None, settings=SETTINGS, fix=fix)


def jpegs(root, n: int = 6) -> None:
    """An ImageFolder tree of smooth JPEGs, train and val, two classes."""
    from PIL import Image

    g = torch.Generator().manual_seed(3)
    for split in ("train", "val"):
        for k in range(n):
            d = root / split / f"c{k % 2}"
            d.mkdir(parents=True, exist_ok=True)
            small = (torch.rand(3, 4, 5, generator=g) * 255).to(torch.uint8)
            big = torch.nn.functional.interpolate(small[None].float(), size=(30, 40), mode="bilinear")[0]
            Image.fromarray(big.round().to(torch.uint8).permute(1, 2, 0).numpy()).save(d / f"{k}.jpg", quality=95)


def batches(tmp_path, name: str, source: str) -> dict:
    (tmp_path / name).write_text(source)
    out = tmp_path / (name + ".pt")
    run = subprocess.run([sys.executable, name, str(tmp_path / "data"), "--out", str(out)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return torch.load(out)


def test_the_imagenet_example_gets_the_loader_on_its_train_folder_and_its_list_takes_the_tensor(tmp_path):
    p = make(IMAGENET)
    (change,) = p.changes
    assert change.how == "lines" and not p.reason
    after = apply(tmp_path, IMAGENET, p, name="main.py")
    untouched_lines_kept(IMAGENET, after, p.diff)
    assert after.count("loader=decode_image_file") == 1 and after.count("transforms.ToTensor()") == 1  # val's
    assert "transforms.ConvertImageDtype(torch.float32),\n            normalize,\n        ]),\n" \
           "        loader=decode_image_file)" in after
    assert "def decode_image_file(path):" in after and after.index("def decode_image_file") > after.index("import")
    assert "ImageFolder at line 21 reads its images with decode_image_file" in change.text
    assert "ToTensor -> ConvertImageDtype(torch.float32)" in change.text


def test_the_patched_script_builds_the_original_s_batch_within_the_check_s_tolerance(tmp_path):
    jpegs(tmp_path / "data")
    after = apply(tmp_path, IMAGENET, make(IMAGENET), name="main.py")
    theirs, mine = batches(tmp_path, "original.py", IMAGENET), batches(tmp_path, "patched.py", after)
    assert mine["train"].shape == theirs["train"].shape and mine["train"].dtype == theirs["train"].dtype
    level = float(theirs["train"].max() - theirs["train"].min()) / 255
    assert (mine["train"] - theirs["train"]).abs().mean() <= decode.MEAN_LEVELS * level
    assert torch.equal(mine["val"], theirs["val"]) and torch.equal(mine["target"], theirs["target"])


def edited(source: str, *pairs: tuple) -> str:
    """`source` with each (old, new) replaced once; each old must be there."""
    for old, new in pairs:
        assert old in source, old
        source = source.replace(old, new, 1)
    return source


TRAIN_LIST = """\
        transforms.Compose([
            transforms.RandomResizedCrop(24),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]))
"""


def test_a_v2_list_loses_its_to_image_and_keeps_to_dtype(tmp_path):
    v2 = edited(IMAGENET, ("import torchvision.transforms as transforms",
                           "from torchvision.transforms import v2 as transforms"),
                (TRAIN_LIST, TRAIN_LIST.replace("            transforms.RandomResizedCrop",
                                                "            transforms.ToImage(),\n            transforms.RandomResizedCrop")
                 .replace("transforms.ToTensor()", "transforms.ToDtype(torch.float32, scale=True)")))
    p = make(v2, dict(FIX, kept=("RandomResizedCrop", "RandomHorizontalFlip", "ToDtype", "Normalize")))
    after = apply(tmp_path, v2, p, name="main.py")
    assert "transforms.Compose([\n            transforms.RandomResizedCrop(24)," in after
    assert "ToImage" not in after and "ToImage dropped" in p.changes[0].text
    jpegs(tmp_path / "data")
    theirs, mine = batches(tmp_path, "original.py", v2), batches(tmp_path, "patched.py", after)
    level = float(theirs["train"].max() - theirs["train"].min()) / 255
    assert (mine["train"] - theirs["train"]).abs().mean() <= decode.MEAN_LEVELS * level


def _named(source: str, call: str) -> str:
    """The train list bound to a name first, `call` the train ImageFolder's line."""
    return edited(source, ("    train_dataset = datasets.ImageFolder(\n        traindir,\n" + TRAIN_LIST,
                           "    train_transform = " + TRAIN_LIST.strip()[:-1] + "\n" + call))


def test_the_transforms_through_a_name_used_there_alone_are_rewritten_where_the_name_is_bound(tmp_path):
    named = _named(IMAGENET, "    train_dataset = datasets.ImageFolder(traindir, transform=train_transform)\n")
    p = make(named)
    after = apply(tmp_path, named, p, name="main.py")
    assert "datasets.ImageFolder(traindir, transform=train_transform, loader=decode_image_file)" in after
    assert after.count("ConvertImageDtype(torch.float32)") == 1


def test_shapes_it_cannot_rewrite_safely_say_why_and_write_nothing():
    both = edited(IMAGENET, ("transforms.Resize(28),\n            transforms.CenterCrop(24),",
                             "transforms.RandomResizedCrop(24),\n            transforms.RandomHorizontalFlip(),"))
    own = edited(IMAGENET, (TRAIN_LIST, TRAIN_LIST.replace("]))", "]), loader=my_loader)")))
    preset = edited(IMAGENET, (TRAIN_LIST, "        presets.ClassificationPresetTrain(crop_size=24))\n"))
    shared = _named(IMAGENET, "    train_dataset = datasets.ImageFolder(traindir, train_transform)\n"
                              "    other = datasets.FakeData(8, transform=train_transform)\n")
    no_torch = edited(IMAGENET, ("import torch\nimport torch.utils.data\n", "from torch.utils import data\n"))
    for source, why in ((both, "2 ImageFolder(...) calls take these transforms"),
                        (own, "ImageFolder(...) at line 21 is given its own loader"),
                        (preset, "at line 21 are not a Compose([...]) list written in the script"),
                        (shared, "at line 27 are not a Compose([...]) list written in the script"),
                        (no_torch, "torch is not imported at the top"),
                        ("import torch\nx = 1\n", "no ImageFolder(...) call in the script")):
        p = make(source)
        assert p.diff == "" and p.changes[0].how == "not applied" and why in p.reason, p.reason
    assert patch_decode.adapted_names(["ToImage", "RandomResizedCrop", "PILToTensor", "ToTensor", "Normalize"]) == (
        "RandomResizedCrop", "ToTensor's scaling", "Normalize")


# --- in the change (change.patched, written.choose) -----------------------------------------

DECODE_FIX = Fix(kind="decode", status="ok", where="dataset.loader", moved=("PIL decode",), kept=KEPT, path="[0]",
                 matches=True)


def decode_trial(rate: float, base: Optional[dict] = None, user: float = 10.0) -> Trial:
    """The advice's check's trial of decode by torchvision (test_change.tail_trial's)."""
    return Trial.from_dict({"item": "decode", "settings": {**(base or {}), "fix": "decode"},
                            "user_windows": side(user), "candidate_windows": side(rate), "base": base})


def with_fixes(path: str, *trials: Trial, rate: Optional[float] = 20.0) -> Measurements:
    """IMAGENET's run: its search's best BEST at `rate` (None: nothing beat yours), the
    check's trials of both fixes `trials`."""
    line = next(i for i, t in enumerate(IMAGENET.splitlines(), 1) if "DataLoader(train_dataset" in t)
    return dataclasses.replace(measured(path, rate=rate or 10.0), source={"created_at": f"{path}:{line}"},
                               verification=Verification(status="ok", trials=trials, fixes=(TAIL_FIX, DECODE_FIX)))


@pytest.fixture
def imagenet(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "main.py").write_text(IMAGENET)
    return str(tmp_path / "main.py")


def test_decode_measured_on_top_of_the_best_goes_with_it_and_is_checked_against_that_figure(imagenet):
    m = with_fixes(imagenet, tail_trial(10.2), decode_trial(12.0), decode_trial(25.0, base=BEST, user=20.0))
    assert change.settings_to_write(m) == dict(BEST, fix="decode")
    p, found = checked(m, 24.5)
    after = edits.applied(IMAGENET, p["diff"])
    assert "loader=decode_image_file" in after and "num_workers=1" in after
    assert [c["setting"] for c in p["changes"]][-1] == "decode"
    assert found.agrees is True and found.whole
    assert "The change adds the images decoded by torchvision, measured on top of these by the advice's check: " \
           "1.25\u00d7" in found.summary


def test_of_two_fixes_that_help_the_faster_is_written(imagenet):
    m = with_fixes(imagenet, tail_trial(11.5), decode_trial(13.0), rate=None)
    assert change.settings_to_write(m) == {"fix": "decode"}
    m = with_fixes(imagenet, tail_trial(14.0), decode_trial(13.0), rate=None)
    assert change.settings_to_write(m) == {"fix": "device_tail"}


def test_a_fix_the_script_cannot_take_gives_way_to_the_other_and_says_why(imagenet):
    # the tail measured faster, but IMAGENET has no list it can split: decode is written
    m = change.patched(with_fixes(imagenet, tail_trial(14.0), decode_trial(13.0)), ["main.py"])
    p = m.tune.patch
    assert "loader=decode_image_file" in p["diff"] and "device_tail" not in p["diff"] and not p.get("reason")
    (tail,) = [c for c in p["changes"] if c["setting"] == "device_tail"]
    assert tail["how"] == "not applied" and tail["text"].startswith(
        "the transforms' tail run batched on the device is not in the diff: no Compose([...]) list")
    done = change.check(m, change.Target("main.py", None, ()), seconds=5.0, run=planted_runs(26.0, []))
    assert done.tune.applied.settings == dict(BEST, fix="decode")
    found = tune.summarize(done.tune, BS, checks=change.checks(done))
    assert not found.whole and "torchvision's decode adds" in found.compared
    # the summary's first change (report/summary) ends with it, the fix's own figure said
    assert found.fix.startswith("The change adds the images decoded by torchvision, which the advice's check measured "
                                "at 1.30\u00d7") and found.fix.endswith("on your settings, not on top of these.")
    # neither can be written: the settings alone, both said
    none = with_fixes(imagenet, tail_trial(14.0), decode_trial(13.0))
    none = change.patched(dataclasses.replace(none, verification=dataclasses.replace(
        none.verification, fixes=(TAIL_FIX, dataclasses.replace(DECODE_FIX, kept=("Resize",))))), ["main.py"])
    p = none.tune.patch
    assert "decode_image_file" not in p["diff"] and "num_workers=1" in p["diff"]
    assert [c["how"] for c in p["changes"] if c["setting"] in ("device_tail", "decode")] == ["not applied"] * 2
