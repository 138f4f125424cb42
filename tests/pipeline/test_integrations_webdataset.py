"""webdataset pipelines split at their stage objects, on tar shards written here: load
(read + decode), augment (the map stages) and collate (batched in the workers) each
planted in turn and named, `raw` measured; a WebLoader's stages in the loop's own
process timed as their own row; the cuts found in the stage list."""

import io
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from bisect_pipeline import bisect
from bisect_pipeline.pipeline.integrations import webdataset as wds_int
import conftest
from conftest import FAST_PLAN, assert_names, tiny_model

wds = pytest.importorskip("webdataset")

# ms planted per sample in decode and in the map stage, per batch in batched's collation:
# the planted stage 8x each other one
PLANTS = {"load": (6.0, 0.3, 1.0), "augment": (0.3, 6.0, 1.0), "collate": (0.3, 0.3, 40.0)}


def write_shards(root, shards=4, per_shard=64):
    return conftest.write_shards(root, shards, per_shard)


class SlowNpy:
    """A decoder handler: .npy files decoded after `ms`."""

    def __init__(self, ms):
        self.ms = ms

    def __call__(self, key, data):
        if not key.endswith(".npy"):
            return None
        time.sleep(self.ms / 1e3)
        return np.load(io.BytesIO(data))


class Augment:
    def __init__(self, ms):
        self.ms = ms

    def __call__(self, sample):
        time.sleep(self.ms / 1e3)
        return torch.from_numpy(sample[0]) * 2, int(sample[1])


class Collation:
    def __init__(self, ms):
        self.ms = ms

    def __call__(self, samples):
        time.sleep(self.ms / 1e3)
        return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])


def pipeline(urls, decode_ms=0.0, map_ms=0.0, collate_ms=0.0, batch=8):
    return (wds.WebDataset(urls, shardshuffle=False, repeat=True).shuffle(16).decode(SlowNpy(decode_ms))
            .to_tuple("x.npy", "cls").map(Augment(map_ms)).batched(batch, collation_fn=Collation(collate_ms)))


def test_the_cuts_fall_after_decode_and_before_batched(tmp_path):
    ds = pipeline(write_shards(tmp_path, shards=1, per_shard=8))
    cuts, why = wds_int.cuts(ds, limit=100)
    assert why is None
    names = [wds_int.stage_name(s) for s in cuts.stages]
    assert names[cuts.raw - 1] == "decode" and names[cuts.augmented] == "batched(8)"
    assert names[cuts.raw:cuts.augmented] == ["to_tuple", "map(Augment)"]
    assert cuts.items_per_output == 8
    assert wds_int.cuts(torch.utils.data.TensorDataset(torch.zeros(2)), 10) == (None, None)


def test_a_map_handed_encoded_bytes_loads(tmp_path):
    """Without a decode stage, a map that gets the tar's bytes decodes them: it stays with
    loading, and with no transform left `raw` is unavailable, saying why."""
    urls = write_shards(tmp_path, shards=1, per_shard=8)

    def decode(sample):
        return torch.from_numpy(np.load(io.BytesIO(sample["x.npy"]))), int(sample["cls"])
    ds = wds.WebDataset(urls, shardshuffle=False).map(decode)
    cuts, _ = wds_int.cuts(ds, limit=100)
    for item in iter(cuts.tapped):
        pass
    assert cuts.settle(8) is not None and not cuts.has_raw
    ds = wds.WebDataset(urls, shardshuffle=False).map(decode).map(lambda s: (s[0] * 2, s[1]))
    cuts, _ = wds_int.cuts(ds, limit=100)
    list(iter(cuts.tapped))
    assert cuts.settle(8) is None and cuts.has_raw and "map(decode)" in cuts.loaded_by


@pytest.fixture(scope="session")
def planted_wds(tmp_path_factory):
    """kind -> the JSON document of bisect() on a webdataset pipeline with that stage
    planted (two workers, batched in the workers), made once per session."""
    urls = write_shards(tmp_path_factory.mktemp("shards"))
    docs = {}

    def get(kind):
        if kind not in docs:
            decode_ms, map_ms, collate_ms = PLANTS[kind]
            loader = DataLoader(pipeline(urls, decode_ms, map_ms, collate_ms), batch_size=None, num_workers=2,
                                multiprocessing_context="fork")
            docs[kind] = bisect(tiny_model(2.0), loader, device="cpu", max_seconds=20, plan=FAST_PLAN,
                                verify_seconds=0).to_dict()
        return docs[kind]
    return get


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["load", "augment", "collate"])
def test_planted_stages_are_named_with_raw_measured(planted_wds, kind, no_leftover_workers):
    doc = planted_wds(kind)
    status = {p["point"]: p["status"] for p in doc["points"]}
    assert status["raw"] == "ok" and status["augmented"] == "ok" and status["collated"] == "ok", status
    assert_names(doc, kind, json.dumps(doc["verdict"]))
    iso = doc["isolated"]
    assert iso["load"]["includes"] == ["load"] and iso["augment"]["status"] == "ok"
    assert iso["items_per_batch"] == 8  # batched in the workers: 8 samples an item
    assert doc["cache"]["raw_transforms"] == ["dataset.pipeline[10] to_tuple", "dataset.pipeline[11] map(Augment)"]


def make_webloader(urls, loop_ms=30.0):
    ds = pipeline(urls)
    return wds.WebLoader(ds, batch_size=None, num_workers=2).unbatched().shuffle(10).batched(
        8, collation_fn=Collation(loop_ms))


LOOP_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
from pipeline.test_integrations_webdataset import make_webloader
from conftest import tiny_model
model, loader = tiny_model(2.0), make_webloader({urls!r})
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(1000):
    for x, y in loader:
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
"""


@pytest.mark.e2e
def test_a_webloaders_loop_stages_are_their_own_row(tmp_path, no_leftover_workers):
    """Under bisect() (the WebLoader unwrapped, its stages through every point) and under
    `run` (the loop runs them itself): timed alone, reported on their own row."""
    urls = write_shards(tmp_path)
    report = bisect(tiny_model(2.0), make_webloader(urls), device="cpu", max_seconds=12, plan=FAST_PLAN,
                    verify_seconds=0)
    loop = report.to_dict()["isolated"]["loop"]
    assert loop["status"] == "ok" and loop["label"] == "WebLoader: unbatched, shuffle, batched(8)"
    assert 25 < loop["ms_per_batch"] < 200, loop
    row = next(line for line in str(report).splitlines() if line.startswith("in your loop"))
    assert "WebLoader" in row
    device = next(line for line in str(report).splitlines() if line.startswith("device "))
    assert "step and your loop's" in device
    page = report._repr_html_()  # the HTML says what the text says
    assert '<tr class="loop"><td>in your loop</td>' in page and "WebLoader: unbatched" in page
    assert "step and your loop&#x27;s stages (the ceiling)" in page
    script = tmp_path / "train.py"
    script.write_text(LOOP_SCRIPT.format(tests=str(__import__("pathlib").Path(__file__).parents[1]), urls=urls))
    out = tmp_path / "r.json"
    ran = subprocess.run([sys.executable, "-m", "bisect_pipeline", "run", "--max-seconds", "12", "--verify-seconds",
                          "0", "--json", str(out), str(script)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    loop = json.loads(out.read_text())["isolated"]["loop"]
    assert loop["status"] == "ok" and 25 < loop["ms_per_batch"] < 200, loop


@pytest.mark.e2e
def test_a_truncated_shard_fails_the_full_point_with_its_name_and_fix(tmp_path, no_leftover_workers):
    # a copy cut short mid-member: what the cached points replay (the first 2 batches) was
    # read before it, and is measured; the full pipeline reads the broken shard in its first
    # visit's third batch and fails, told as such (a run that settles in one round reads no
    # further: cut in the second shard, the break was never reached)
    import tarfile

    urls = write_shards(tmp_path, shards=2, per_shard=64)
    with tarfile.open(urls[0]) as tf:
        member = tf.getmembers()[41]  # a sample's .npy, in the third batch of 8
    data = open(urls[0], "rb").read()
    open(urls[0], "wb").write(data[: member.offset_data + member.size // 2])
    ds = (wds.WebDataset(urls, shardshuffle=False).decode(SlowNpy(0.0)).to_tuple("x.npy", "cls").map(Augment(0.0))
          .batched(8, collation_fn=Collation(0.0)))
    loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
    report = bisect(tiny_model(), loader, device="cpu", max_seconds=15, plan=conftest.TINY_PLAN, verify_seconds=0,
                    cache_batches=2)
    full = report.point("full")
    assert full.status == "failed" and full.failed_stage == "load", full
    assert "shard train-0000.tar is truncated" in full.reason and "handler=wds.warn_and_continue" in full.reason
    assert "BufferedReader" not in full.reason  # the raw repr is not the reason
    assert report.point("raw").status == "ok" and report.point("device").status == "ok"
