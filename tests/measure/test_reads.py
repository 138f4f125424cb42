"""Load split into read and decode (reads.py, worker_stages.time_load): reads timed through open()
and torchvision.io.read_file on a fake clock, the proxy behaves as a file, everything is
restored, no split where no read was seen; end to end, an ImageFolder over large JPEGs
is told read-bound on a planted slow file system and decode-bound on plain disk."""

from __future__ import annotations

import builtins
import io
import os
import time

import numpy as np
import pytest
import torch
from PIL import Image

from bisect_pipeline.measure import cache, reads, worker_stages
from bisect_pipeline.pipeline import loader as loader_mod
from bisect_pipeline.core.results import Isolated, LoadSplit, PerSample
from bisect_pipeline.testing import SlowFiles
from conftest import FakeClock, PlantedDataset, make_loader


class ClockedOpen:
    """builtins.open wrapped (as a user's slow file system would be): every read of a
    binary file moves the fake clock by `ms`, opening it by `open_ms`."""

    def __init__(self, clock: FakeClock, ms: float, open_ms: float = 0.0, via_io: bool = False) -> None:
        self.clock, self.ms, self.open_ms, self.via_io = clock, ms, open_ms, via_io
        self.original = None

    def __enter__(self):
        self.original = builtins.open
        # via_io: the wrapper opens through io.open, looked up at each call
        original = (lambda *a, **k: io.open(*a, **k)) if self.via_io else builtins.open

        def slow_open(file, mode="r", *args, **kwargs):
            f = original(file, mode, *args, **kwargs)
            if "b" not in mode:
                return f
            self.clock.t += self.open_ms / 1e3
            outer = self

            class Slow:
                def read(self, *a):
                    outer.clock.t += outer.ms / 1e3
                    return f.read(*a)

                def __getattr__(self, name):
                    return getattr(f, name)
            return Slow()
        builtins.open = slow_open
        return self

    def __exit__(self, *exc):
        builtins.open = self.original


@pytest.fixture
def blob(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes
    return path


def test_reads_through_a_slow_open_are_timed_with_their_bytes(blob):
    clock = FakeClock()
    with ClockedOpen(clock, ms=5.0, open_ms=2.0), reads.Reads(clock) as seen:
        with open(blob, "rb") as f:
            head = f.read(100)
            rest = f.read()
    assert head == bytes(range(100)) and len(rest) == 10_140
    assert seen.seconds == pytest.approx(0.012)  # the open (2 ms) and two reads (5 ms each)
    assert seen.bytes == 10_240 and seen.files == 1 and seen.seen == {reads.OPEN: 1}


def test_reads_after_the_warm_up_only_and_nothing_after_the_exit(blob):
    clock = FakeClock()
    with ClockedOpen(clock, ms=5.0), reads.Reads(clock) as seen:
        kept = open(blob, "rb")
        kept.read(10)
        seen.reset()
        kept.read(20)
    kept.read(30)  # after the exit: passes through, not counted
    kept.close()
    assert seen.seconds == pytest.approx(0.005) and seen.bytes == 20 and seen.files == 0


def test_text_opens_and_writes_are_left_alone(tmp_path, blob):
    text = tmp_path / "labels.txt"
    text.write_text("a\nb\n")
    with reads.Reads() as seen:
        with open(text) as f:
            assert not isinstance(f, reads.TimedFile) and f.read() == "a\nb\n"
        with open(tmp_path / "out.bin", "wb") as f:
            assert not isinstance(f, reads.TimedFile)
            f.write(b"x")
        with open(blob, "r+b") as f:
            assert not isinstance(f, reads.TimedFile)
    assert seen.files == 0 and seen.bytes == 0


def test_the_proxy_behaves_as_the_file(blob):
    with reads.Reads() as seen:
        f = open(blob, "rb")
        assert isinstance(f, reads.TimedFile) and isinstance(f, io.IOBase)
        assert f.name == str(blob) and f.tell() == 0 and f.seekable()
        buf = bytearray(16)
        assert f.readinto(buf) == 16 and bytes(buf) == bytes(range(16))
        assert f.peek(1)[:1] == bytes([16]) and f.read1(4) == bytes(range(16, 20))
        f.seek(0)
        lines = list(f)  # iteration: the 40 newlines of the blob end its lines
        assert b"".join(lines) == bytes(range(256)) * 40
        f.close()
        assert f.closed
        raw = open(blob, "rb", buffering=0)  # a raw FileIO: no peek, as the file has none
        assert not hasattr(raw, "peek") and len(raw.readall()) == 10_240
        raw.close()
        assert len(blob.read_bytes()) == 10_240  # pathlib opens through io.open
    assert seen.files == 3 and seen.bytes == 10_240 * 3 + 16 + 4


def test_pil_and_numpy_read_through_the_proxy(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    np.save(tmp_path / "a.npy", rgb)
    with reads.Reads() as seen:
        with Image.open(tmp_path / "a.png") as im:  # PIL opens a path through builtins.open
            decoded = np.asarray(im.convert("RGB"))
        with open(tmp_path / "a.png", "rb") as f:  # torchvision's pil_loader
            again = np.asarray(Image.open(f).convert("RGB"))
        array = np.load(tmp_path / "a.npy")
    assert (decoded == rgb).all() and (again == rgb).all() and (array == rgb).all()
    png, npy = os.path.getsize(tmp_path / "a.png"), os.path.getsize(tmp_path / "a.npy")
    assert seen.files == 3 and seen.bytes >= 2 * png + rgb.nbytes
    assert seen.bytes <= 2 * png + npy + 2 * 4096  # what PIL and numpy read, and no more than the files hold


def test_torchvision_read_file_is_timed_and_counted(tmp_path):
    import torchvision.io as tvio
    import torchvision.io.image as tvimage

    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    size = os.path.getsize(tmp_path / "a.png")
    before = (tvio.read_file, tvimage.read_file)
    with reads.Reads() as seen:
        data = tvio.read_file(str(tmp_path / "a.png"))
        image = tvio.decode_image(str(tmp_path / "a.png"))  # reads through torchvision.io.image.read_file
    assert data.numel() == size and tuple(image.shape) == (3, 32, 32)
    assert seen.files == 2 and seen.bytes == 2 * size and seen.seen == {reads.READ_FILE: 2}
    assert (tvio.read_file, tvimage.read_file) == before


def test_everything_is_restored_also_after_an_exception(blob):
    originals = (builtins.open, io.open)
    with pytest.raises(RuntimeError):
        with reads.Reads():
            assert builtins.open is not originals[0]
            open(blob, "rb").read()
            raise RuntimeError("boom")
    assert (builtins.open, io.open) == originals
    with SlowFiles(blob.parent, ms_per_file=1.0):  # a user's wrapper is wrapped, and comes back
        theirs = builtins.open
        with reads.Reads():
            assert builtins.open is not theirs
        assert builtins.open is theirs
    assert builtins.open is originals[0]


def test_reads_of_other_threads_are_not_counted(blob):
    import threading

    with reads.Reads() as seen:
        t = threading.Thread(target=lambda: open(blob, "rb").read())
        t.start()
        t.join()
    assert seen.files == 0 and seen.bytes == 0


def test_a_nested_timed_read_is_counted_once(blob):
    clock = FakeClock()
    with ClockedOpen(clock, ms=5.0, via_io=True), reads.Reads(clock) as seen:
        # the user's wrapper (builtins.open) reads through io.open, also wrapped
        f = open(blob, "rb")
        inner = io.open(blob, "rb")
        inner.read(10)
        f.read(10)
    assert seen.files == 2 and seen.bytes == 20
    assert seen.seconds == pytest.approx(0.005)  # the slow read; io.open's own read costs nothing on this clock


# --- the split ----------------------------------------------------------------------------------


def _reads(seconds=0.0, nbytes=0, files=0) -> reads.Reads:
    r = reads.Reads()
    r.seconds, r.bytes, r.files, r.seen = seconds, nbytes, files, {reads.OPEN: files}
    return r


def test_the_split_names_the_larger_part_with_its_figures():
    load = PerSample(ms_per_sample=12.0, samples=4, includes=("load",))
    s = reads.split(_reads(0.040, 8_000_000, 4), 4, load)  # 10 ms of 12 read, 2 MB a sample
    assert s.ok and s.bound == "read"
    assert (s.read_ms_per_sample, s.decode_ms_per_sample) == (10.0, 2.0)
    assert s.bytes_per_sample == 2e6 and s.read_mb_per_s == 200.0 and s.files_per_sample == 1.0 and s.samples == 4
    assert "open() (4 files)" in s.how and "page cache" in s.how
    d = reads.split(_reads(0.004, 8_000_000, 4), 4, load)
    assert d.bound == "decode" and d.decode_ms_per_sample == 11.0
    # read timed above the whole (noise in the transforms' subtraction): decode floors at 0
    assert reads.split(_reads(0.080, 1, 4), 4, load).decode_ms_per_sample == 0.0
    merged = PerSample(ms_per_sample=12.0, samples=4, includes=("load", "augment"))
    assert "the transforms" in reads.split(_reads(0.004, 1, 4), 4, merged).how


def test_a_load_timed_through_its_iterator_is_split_on_its_figure_by_index():
    # the reads were seen on the samples by index (0.05 ms of their 0.06): decode is the
    # rest of that figure, and what the iterator adds (3.0 of 3.06 ms) is a part of its own,
    # never decode's (MosaicML's iterator timed in a worker, measure/iterator_alone.py)
    load = PerSample(ms_per_sample=3.06, samples=22, includes=("load",), index_ms_per_sample=0.06)
    s = reads.split(_reads(0.0005, 10_000, 10), 10, load)
    assert (s.read_ms_per_sample, s.decode_ms_per_sample, s.iterator_ms_per_sample) == (0.05, 0.01, 3.0)
    assert s.bound == "iterator"
    # loaded by index alone: no iterator part, as before
    plain = reads.split(_reads(0.0005, 10_000, 10), 10, PerSample(ms_per_sample=3.06, samples=10))
    assert plain.iterator_ms_per_sample is None and plain.decode_ms_per_sample == 3.01 and plain.bound == "decode"


def test_no_read_seen_is_no_split_with_its_reason():
    s = reads.split(_reads(), 4, PerSample(ms_per_sample=3.0, samples=4))
    assert s == LoadSplit.missing("unavailable", reads.NOTHING_READ)
    assert "already in memory" in s.reason


def test_an_in_memory_dataset_gets_no_split():
    spec = loader_mod.describe(make_loader(PlantedDataset(n=16), batch_size=4))
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)
    aug = worker_stages.time_augment(caches, 0.05, time.perf_counter)
    load = worker_stages.time_load(spec, caches, aug, 0.05, time.perf_counter)
    assert load.ok and load.split.status == "unavailable" and "already in memory" in load.split.reason


class FileSamples(torch.utils.data.Dataset):
    """Reads a file per sample through open(); each read moves the fake clock (ClockedOpen)."""

    def __init__(self, paths, clock, decode_ms):
        self.paths, self.clocks, self.decode_ms = paths, [clock], decode_ms  # a callable would be taken for a transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            data = f.read()
        self.clocks[0].t += self.decode_ms / 1e3
        return torch.tensor(len(data))


@pytest.mark.parametrize("read_ms, decode_ms, bound", [(30.0, 5.0, "read"), (3.0, 20.0, "decode")])
def test_load_is_split_on_the_same_timed_calls(tmp_path, read_ms, decode_ms, bound):
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"{i}.bin")
        paths[-1].write_bytes(b"x" * 1000)
    clock = FakeClock()
    spec = loader_mod.describe(make_loader(FileSamples(paths, clock, decode_ms), batch_size=2))
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)
    aug = PerSample.missing("unavailable", "no transform")
    with ClockedOpen(clock, ms=read_ms):
        load = worker_stages.time_load(spec, caches, aug, 10.0, clock)
    s = load.split
    assert load.ms_per_sample == pytest.approx(read_ms + decode_ms)
    assert s.ok and s.bound == bound and s.samples == load.samples == len(caches.samples)  # the warm-up untimed
    assert (s.read_ms_per_sample, s.decode_ms_per_sample) == (pytest.approx(read_ms), pytest.approx(decode_ms))
    assert s.bytes_per_sample == 1000 and s.files_per_sample == 1
    assert s.read_mb_per_s == pytest.approx(1000 / read_ms / 1e3, rel=1e-3)  # 4 significant digits


def test_the_split_round_trips_through_the_document():
    from bisect_pipeline.report import Report
    from test_html import planted_report

    split = reads.split(_reads(0.040, 8_000_000, 4), 4, PerSample(ms_per_sample=12.0, samples=4))
    iso = Isolated(load=PerSample(ms_per_sample=12.0, samples=4, includes=("load",), split=split))
    assert Isolated.from_dict(iso.to_dict()) == iso
    r = planted_report({"device": 950.0, "collated": 930.0, "augmented": 920.0, "raw": 910.0, "full": 320.0},
                       isolated=iso.to_dict())
    doc = r.to_dict()
    assert doc["isolated"]["load"]["split"]["bound"] == "read"
    again = Report.from_dict(doc)
    assert again.measurements.isolated.load.split == split and again.to_dict() == doc


# --- end to end: an ImageFolder over large JPEGs --------------------------------------------------


def _jpegs(root, classes=2, per_class=3, side=1500):
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(root / f"c{c}")
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(root / f"c{c}" / f"{i}.jpg",
                                                                                       quality=90)


@pytest.mark.e2e
def test_an_image_folder_is_read_bound_on_a_slow_file_system_and_decode_bound_on_disk(tmp_path):
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    _jpegs(tmp_path)
    ds = ImageFolder(tmp_path, transform=T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor()]))
    spec = loader_mod.describe(make_loader(ds, batch_size=2))
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)

    def split(slow):
        aug = worker_stages.time_augment(caches, 0.3, time.perf_counter)
        if slow is None:
            return worker_stages.time_load(spec, caches, aug, 1.0, time.perf_counter).split
        with slow:
            return worker_stages.time_load(spec, caches, aug, 1.0, time.perf_counter).split
    # 1500x1500 noise JPEGs: ~2 MB each, decoding tens of ms; the planted file system
    # costs 400 ms a file, several times the decode even on a busy machine
    on_disk, slow = split(None), split(SlowFiles(tmp_path, ms_per_file=400.0))
    assert on_disk.ok and on_disk.bound == "decode", on_disk
    assert slow.ok and slow.bound == "read", slow
    assert slow.read_ms_per_sample >= 400.0 and slow.read_ms_per_sample > 2 * slow.decode_ms_per_sample
    assert on_disk.decode_ms_per_sample > 2 * on_disk.read_ms_per_sample
    for s in (on_disk, slow):
        assert s.files_per_sample == 1 and 1e6 < s.bytes_per_sample < 4e6  # each file read once, whole


@pytest.mark.e2e
def test_a_webdataset_shard_read_while_timed_is_split_into_read_and_decode(tmp_path):
    # load is the stages up to the raw cut, after `decode` (issue 50): the reads and the
    # decoding, no transform (to_tuple is after the cut); before the cut, load held the
    # transforms too ("the transforms" in decode)
    import tarfile

    wds = pytest.importorskip("webdataset")
    rng = np.random.default_rng(0)
    with tarfile.open(tmp_path / "shard-0.tar", "w") as tar:
        for i in range(12):
            b = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(b, format="JPEG")
            for name, data in ((f"{i:04d}.jpg", b.getvalue()), (f"{i:04d}.cls", str(i % 2).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    ds = wds.WebDataset(str(tmp_path / "shard-0.tar"), shardshuffle=False).decode("torchrgb").to_tuple("jpg", "cls")
    spec = loader_mod.describe(torch.utils.data.DataLoader(ds, batch_size=4))
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)
    load = worker_stages.time_load(spec, caches, PerSample.missing("unavailable", "iterable"), 0.5, time.perf_counter)
    s = load.split
    assert caches.stages is not None and caches.has_raw
    assert s.ok and s.bytes_per_sample > 1000 and "the transforms" not in s.how  # the shard, read through open()
    assert s.read_ms_per_sample + s.decode_ms_per_sample == pytest.approx(load.ms_per_sample, abs=1e-3)


@pytest.mark.e2e
def test_hugging_face_images_decoded_from_arrow_bytes_get_no_split():
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(8)]
    hf = datasets.Dataset.from_dict({"image": images, "label": [0] * 8}).cast_column("image", datasets.Image())
    hf.set_transform(lambda b: {"pixel_values": [torch.tensor(np.asarray(im)) for im in b["image"]],
                                "label": b["label"]})
    spec = loader_mod.describe(torch.utils.data.DataLoader(hf, batch_size=2))
    caches = cache.fill(spec, cache_mb=64, max_batches=2, time_budget=10)
    load = worker_stages.time_load(spec, caches, PerSample.missing("unavailable", "x"), 0.2, time.perf_counter)
    assert load.ok and load.split.status == "unavailable" and "already in memory" in load.split.reason
