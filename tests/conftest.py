"""Fixtures shared by the tests; the planted fakes come from bisect_pipeline.testing (the
same module the benchmark scripts use), re-exported here for the tests' imports.

Tests marked `e2e` run the tool end to end on real loaders (seconds each); the rest run
on planted numbers or a fake clock: `pytest -m "not e2e"` is the fast subset.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import Dataset

from bisect_pipeline import Plan
from bisect_pipeline.testing import (CLASSES, FEATURES, PlantedDataset, PlantedIterable, Sleep, SleepLayer,
                                     SlowCollate, make_loader, planted, tiny_model)

# The tests mirror the package's folders (tests/test_layout.py); a test imports another's
# helpers by module name (`from test_outcome import side`) from whichever folder holds it.
_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_TESTS, d) for d in sorted(os.listdir(_TESTS))
                if os.path.isdir(os.path.join(_TESTS, d)) and d[0] not in "._"]

# Short windows keep each end-to-end run to a few seconds; the verdict margins below
# do not need more.
FAST_PLAN = Plan(window_seconds=0.15)
# A run whose test asserts what was measured and how (statuses, reasons, batch sizes,
# warnings, files), not a verdict: one round of one short window a point, under a second
# without workers where FAST_PLAN's three rounds or more take 5-8 s. A verdict needs
# FAST_PLAN (and assert_names).
TINY_PLAN = Plan(window_seconds=0.05, windows_per_visit=1, max_warmup_windows=0, min_warmup_steps=1, min_rounds=1,
                 max_rounds=1)
# Samples enough that an epoch of a loader with workers lasts longer than
# plan.EPOCH_WINDOW_S: its epoch start is then estimated from the full point's first
# batch, not timed in a visit of its own (3-5 s a run), where a test's subject is not
# the epoch start (test_epoch_start.py, test_verify.py's short epochs time it).
LONG_EPOCHS = 2048


class FakeClock:
    """A clock that stands still until a test moves `t`."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

# The planted pipeline of the scripts that e2e tests write and run in processes of their
# own (torchrun ranks, `bisect-pipeline run SCRIPT`, Lightning and Hugging Face scripts):
# `Data(n, ms, dicts=False)` holds n samples of 16 features and a class of 4, each through
# its `transform`, a `Slow(ms)` sleep; `dicts`: {"x", "labels"} samples instead of pairs.
PLANTED_DATA = textwrap.dedent('''
    import time
    import torch
    from torch.utils.data import Dataset

    class Slow:
        def __init__(self, ms):
            self.ms = ms
        def __call__(self, x):
            if self.ms:
                time.sleep(self.ms / 1e3)
            return x

    class Data(Dataset):
        def __init__(self, n, ms, dicts=False):
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(n, 16, generator=g)
            self.y = torch.randint(0, 4, (n,), generator=g)
            self.transform = Slow(ms)
            self.dicts = dicts
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            x = self.transform(self.x[i].clone())
            return {"x": x, "labels": self.y[i]} if self.dicts else (x, self.y[i])
''')

class Preset:
    """torchvision's references' ClassificationPresetTrain: an object keeping a Compose
    (RandomResizedCrop to `size`, flip, PILToTensor, ConvertImageDtype, Normalize)."""

    def __init__(self, size: int):
        from torchvision import transforms as T

        self.transforms = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor(),
                                     T.ConvertImageDtype(torch.float), T.Normalize((0.5,) * 3, (0.2,) * 3)])

    def __call__(self, img):
        return self.transforms(img)


# The shapes of public detection and segmentation datasets whose transforms the raw split
# must see (issue 22, test_split.py): each loads a sample (`load_ms`, planted) and hands
# it to a transform (`ms`, planted) in its own way. Deterministic, so that a replayed
# sample equals the dataset's own.


class _Costs:
    """A transform that first costs `ms`."""

    def __init__(self, ms: float = 0.0) -> None:
        self.sleep = Sleep(ms)


class JointFlip(_Costs):
    """A joint (image, target) transform, as the detection references compose them: flips
    the image and moves the boxes."""

    def __call__(self, img, target):
        self.sleep(None)
        return img.flip(0), dict(target, boxes=target["boxes"].flip(-1))


class KeywordFlip(_Costs):
    """An albumentations-style transform: called with keywords, returns a dict."""

    def __call__(self, *, image, mask):
        self.sleep(None)
        return {"image": image.flip(0) * 2, "mask": mask.flip(0)}


class DictFlip(_Costs):
    """A dictionary transform (MONAI's, torchvision v2 on a dict): a dict in, a new dict out."""

    def __call__(self, data):
        self.sleep(None)
        return dict(data, image=data["image"].flip(0) + 1)


class _Loads(Dataset):
    """n images of FEATURES values; loading one costs `load_ms`."""

    def __init__(self, n: int, load_ms: float) -> None:
        self.images = torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(0))
        self.load_ms = load_ms

    def __len__(self):
        return len(self.images)

    def load(self, i):
        Sleep(self.load_ms)(None)
        return self.images[i].clone()


class DetectionRef(_Loads):
    """torchvision's detection references: `img, target = self._transforms(img, target)`
    after loading, the joint transforms under a private name; the VisionDataset's public
    transform, target_transform and transforms stay None."""

    def __init__(self, transforms=None, n: int = 64, load_ms: float = 0.0) -> None:
        super().__init__(n, load_ms)
        self.transform = self.target_transform = self.transforms = None
        self._transforms = transforms

    def __getitem__(self, i):
        img = self.load(i)
        target = {"boxes": torch.tensor([[0.0, 1.0, 2.0, 3.0]]) + i, "labels": torch.tensor([i % CLASSES])}
        if self._transforms is not None:
            img, target = self._transforms(img, target)
        return img, target


def detection_collate(samples):
    """Images stacked, the targets' labels concatenated: (inputs, targets) for the default step."""
    return torch.stack([s[0] for s in samples]), torch.cat([s[1]["labels"] for s in samples])


class Segmentation(_Loads):
    """Segmentation code: `out = self.transform(image=image, mask=mask)`, then
    `image, mask = out["image"], out["mask"]` (a uint8 mask); `long_mask`: then
    `mask = mask.long()`, a change after the transform."""

    def __init__(self, transform, n: int = 64, load_ms: float = 0.0, long_mask: bool = False) -> None:
        super().__init__(n, load_ms)
        self.transform = transform
        self.long_mask = long_mask

    def __getitem__(self, i):
        image = self.load(i)
        mask = ((torch.arange(FEATURES) + i) % CLASSES).to(torch.uint8)
        out = self.transform(image=image, mask=mask)
        image, mask = out["image"], out["mask"]
        if self.long_mask:
            mask = mask.long()
        return image, mask


class DictSamples(_Loads):
    """`data = self.transform({"image": image, "label": label})`, returned as
    `data["image"], data["label"]`."""

    def __init__(self, transform, n: int = 64, load_ms: float = 0.0) -> None:
        super().__init__(n, load_ms)
        self.labels = torch.arange(n) % CLASSES
        self.transform = transform

    def __getitem__(self, i):
        data = self.transform({"image": self.load(i), "label": self.labels[i]})
        return data["image"], data["label"]


# --- under pytest -n (pytest-xdist: the README's test command) ----------------------------------
# Tests marked `alone` need the machine to themselves (a planted contention that another
# test's processes would change): under pytest -n each takes a lock that waits for the
# tests running in the other processes to end and holds theirs back until it has run
# (a readers-writer lock with a turnstile, so that it is not starved). End-to-end tests
# are handed out first, one at a time, so that the quick ones fill the processes' tails;
# those marked `alone` last, when the other processes' tests left are quick ones.


def pytest_configure(config):
    if getattr(config.option, "maxschedchunk", "absent") is None:  # pytest -n, --dist load, not set by hand
        config.option.maxschedchunk = 1  # one test at a time (pytest-xdist 3.3): a slow one never queues quick ones


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # end-to-end, then quick, then alone; stable: file order kept
        def rank(item) -> int:
            return 2 if item.get_closest_marker("alone") else 0 if item.get_closest_marker("e2e") else 1
        items.sort(key=rank)


class _MachineLock:
    """Shared for every test, exclusive for one marked `alone`, across the processes of
    one pytest -n run (flock on two files in the run's temporary folder, which its
    processes share)."""

    def __init__(self, folder) -> None:
        self.turnstile = open(os.path.join(folder, "machine-lock.turnstile"), "a")
        self.machine = open(os.path.join(folder, "machine-lock"), "a")

    def hold(self, alone: bool):
        import contextlib
        import fcntl

        @contextlib.contextmanager
        def held():
            fcntl.flock(self.turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(self.machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            finally:
                if not alone:
                    fcntl.flock(self.turnstile, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(self.machine, fcntl.LOCK_UN)
                if alone:
                    fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        return held()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not hasattr(item.config, "workerinput") or sys.platform == "win32":
        yield  # one test at a time: the machine is this test's
        return
    if not hasattr(item.config, "_machine_lock"):  # popen-gwN's parent: the run's folder
        item.config._machine_lock = _MachineLock(item.config._tmp_path_factory.getbasetemp().parent)
    with item.config._machine_lock.hold(item.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Steps use one thread: on a 2-core CI machine torch's intra-op threads and the
    loader's workers would otherwise fight for the cores and spike step times 10x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def planted_run(tmp_path_factory):
    """`planted_run(kind, num_workers)`: the report of bisect() on testing.planted(kind,
    num_workers) with the tests' plan and no advice check, made once per session, so that
    several tests assert on one real run. With workers, epochs of LONG_EPOCHS samples
    (the verdict is these runs' subject, not the epoch start). Under pytest -n, once for
    all the run's processes: the first that needs it measures it, the others read it
    (pickled in the run's shared temporary folder)."""
    import fcntl
    import pickle

    from bisect_pipeline import bisect

    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None
    reports: dict = {}

    def measure(kind: str, num_workers: int) -> tuple:
        model, loader = planted(kind, num_workers, n=LONG_EPOCHS if num_workers else 64)
        events: list = []
        report = bisect(model, loader, device="cpu", max_seconds=20, plan=FAST_PLAN, verify_seconds=0,
                        progress=events.append)
        return report, events

    def get(kind: str, num_workers: int = 0):
        key = (kind, num_workers)
        if key not in reports:
            if shared is None:
                reports[key], get.events[key] = measure(kind, num_workers)
            else:
                path = shared / f"planted-run-{kind}-{num_workers}.pickle"
                with open(f"{path}.lock", "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)  # another process measuring it: wait for its report
                    if not path.exists():
                        path.write_bytes(pickle.dumps(measure(kind, num_workers)))
                reports[key], get.events[key] = pickle.loads(path.read_bytes())
        return reports[key]
    get.events = {}  # (kind, num_workers) -> the progress events of that run
    return get


class Ran:
    """A command's exit status and output, as subprocess.run gives them."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli_in_process(*args: str, cwd) -> Ran:
    """`bisect-pipeline ARGS` in this process (click's runner), from `cwd`: what a user
    sees, without starting an interpreter and importing torch for each command. stderr is
    not a terminal there, as in a pipe. (A test that sends signals runs a real process.)"""
    import os
    import sys

    from click.testing import CliRunner

    from bisect_pipeline import api
    from bisect_pipeline.cli import main

    before, path, age = os.getcwd(), list(sys.path), api._process_age
    os.chdir(cwd)
    api._process_age = lambda: 0.0  # no start-up of its own: this process started long before
    try:
        r = CliRunner().invoke(main, list(args))
    finally:
        os.chdir(before)
        sys.path[:] = path
        api._process_age = age
    return Ran(r.exit_code, r.stdout, r.stderr)


@pytest.fixture
def no_leftover_workers():
    """Fails the test if a worker process outlives it."""
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []


def expected_statuses(loader_settings: dict, device: str = "cpu") -> dict:
    """Every point measured but those that do not apply: host without an accelerator,
    collated at num_workers=0 with nothing pinning in the loop (it coincides with device)."""
    accelerator = not str(device).startswith("cpu")
    no_handoff = loader_settings.get("num_workers") == 0 and not (loader_settings.get("pin_memory") and accelerator)
    return {"full": "ok", "raw": "ok", "augmented": "ok", "collated": "skipped" if no_handoff else "ok",
            "host": "ok" if accelerator else "skipped", "device": "ok"}


def all_measured(report) -> dict:
    """expected_statuses for a Report (compare with {point: status})."""
    return expected_statuses(report.loader, report.device)


def assert_names(report, stage: str, shown: str = "") -> None:
    """The run names `stage`; or, where the time ran out before the verdict settled (a busy
    2-core machine spreads visits +-20-90%), says `tie` led by `stage`, the only stage whose
    cost is real (its lead over a noisy runner-up not yet established), or, for `none`,
    inconclusive with no stage real. Also the stage it is merged into when the point
    between them was left out as inconsistent (a busy machine slowed that point beyond
    the noise; the report says "load (with augment)" and why): the planted stage is still
    the one named, with the stage upstream of it it could not be told from. A wrong
    stage, no verdict, a settled tie or inconclusive, or another real stage all fail.
    `report`: a Report or its JSON document."""
    doc = report if isinstance(report, dict) else report.to_dict()
    shown = shown or (str(report) if not isinstance(report, dict) else json.dumps(doc["verdict"]))
    if doc["bottleneck"] == stage:
        return
    named = next((s for s in doc["stages"] if s["stage"] == doc["bottleneck"]), None)
    mine = next((s for s in doc["stages"] if s["stage"] == stage), None)
    if (named is not None and stage in (named.get("includes") or ()) and mine is not None
            and mine["status"] == "merged" and "inconsistent" in (mine.get("reason") or "")):
        return
    real = [s["stage"] for s in doc["stages"] if s["status"] == "ok" and s["significant"]]
    if stage == "none":
        ok = doc["bottleneck"] == "inconclusive" and not real
    else:
        ok = doc["bottleneck"] == "tie" and (doc["verdict"].get("tied") or [None])[0] == stage and real == [stage]
    assert ok and not doc["run"].get("settled"), (
        f"expected {stage} (or, unsettled, a tie led by it with only it real; for none, inconclusive with no stage "
        f"real; real: {real}):\n{shown}")


class PILImages(torch.utils.data.Dataset):
    """Image files opened with PIL and converted to RGB in __getitem__, then `transform`:
    the shape of torchvision's ImageFolder with a path list (labels i % 3)."""

    def __init__(self, paths, transform):
        self.paths, self.transform = paths, transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        from PIL import Image
        with Image.open(self.paths[i]) as im:
            image = im.convert("RGB")
        return self.transform(image), i % 3


def write_shards(root, shards: int = 4, per_shard: int = 32) -> list:
    """webdataset tar shards under `root`: each sample a FEATURES-long float32 .npy and a
    class; the shards' paths."""
    import io

    import numpy as np
    import webdataset as wds

    rng = np.random.default_rng(0)
    urls = []
    for s in range(shards):
        path = str(root / f"train-{s:04d}.tar")
        with wds.TarWriter(path) as sink:
            for i in range(per_shard):
                buf = io.BytesIO()
                np.save(buf, rng.standard_normal(FEATURES).astype(np.float32))
                sink.write({"__key__": f"s{s}_{i:04d}", "x.npy": buf.getvalue(), "cls": str(i % CLASSES).encode()})
        urls.append(path)
    return urls
