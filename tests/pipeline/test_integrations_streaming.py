"""Streaming datasets that partition their samples by worker and rank themselves, on
shards written here: MosaicML `StreamingDataset` (a subclass applying `self.transforms`
after `super().__getitem__`) and litdata `StreamingDataset` (its `transform`). Load,
augment and collate each planted in turn and named, `raw` measured through their
per-sample access; `full` in their own partitioning (each worker its own samples).

Both libraries pin an older numpy than the project's test environment, so they are not
test extras: these tests skip with the reason where the library is missing, and run in
a second environment (docs/supported-pipelines.md, "Streaming datasets")."""

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from bisect_pipeline import bisect
from conftest import CLASSES, FAST_PLAN, FEATURES, assert_names, tiny_model

pytestmark = pytest.mark.e2e

# ms planted per sample in loading and in the transform, per batch in collate_fn
PLANTS = {"load": (6.0, 0.3, 0.0), "augment": (0.3, 6.0, 0.0), "collate": (0.3, 0.3, 40.0)}
N = 512


class Augment:
    def __init__(self, ms):
        self.ms = ms

    def __call__(self, sample):
        time.sleep(self.ms / 1e3)
        return torch.from_numpy(np.array(sample["x"], dtype=np.float32)) * 2, int(sample["y"])


class Collate:
    def __init__(self, ms):
        self.ms = ms

    def __call__(self, samples):
        time.sleep(self.ms / 1e3)
        return torch.utils.data.default_collate(samples)


def rows():
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal(FEATURES).astype(np.float32), "y": i % CLASSES} for i in range(N)]


def mosaicml_dataset(root, load_ms, map_ms):
    streaming = pytest.importorskip("streaming", reason="mosaicml-streaming is not installed (it pins numpy<2.2: "
                                                        "pip install 'bisect-pipeline[mosaicml]' in its own env)")

    class Planted(streaming.StreamingDataset):
        def __init__(self, *args, transforms=None, load_ms=0.0, **kw):
            super().__init__(*args, **kw)
            self.transforms, self.load_ms = transforms, load_ms

        def __getitem__(self, i):
            sample = super().__getitem__(i)
            time.sleep(self.load_ms / 1e3)
            return self.transforms(sample)

    if not (root / "index.json").exists():
        with streaming.MDSWriter(out=str(root), columns={"x": "ndarray:float32", "y": "int"},
                                 size_limit=1 << 14) as out:
            for row in rows():
                out.write(row)
    return Planted(local=str(root), batch_size=8, shuffle=False, transforms=Augment(map_ms), load_ms=load_ms)


MAKE_LITDATA = textwrap.dedent("""
    import sys, numpy as np, litdata as ld
    def row(i):
        return {"x": np.random.default_rng(i).standard_normal(%d).astype(np.float32), "y": i %% %d}
    if __name__ == "__main__":
        ld.optimize(fn=row, inputs=list(range(%d)), output_dir=sys.argv[1], chunk_bytes="16KB", num_workers=1,
                    mode="overwrite")
""") % (FEATURES, CLASSES, N)


def litdata_dataset(root, load_ms, map_ms):
    ld = pytest.importorskip("litdata", reason="litdata is not installed: pip install 'bisect-pipeline[litdata]'")

    class Planted(ld.StreamingDataset):
        def __getitem__(self, i):
            time.sleep(self.load_ms / 1e3)
            return super().__getitem__(i)

    if not (root / "index.json").exists():  # optimize() starts processes that import the script
        script = root.parent / "make_litdata.py"
        script.write_text(MAKE_LITDATA)
        subprocess.run([sys.executable, str(script), str(root)], check=True, capture_output=True, timeout=120)
    ds = Planted(str(root), transform=Augment(map_ms))
    ds.load_ms = load_ms
    return ds


MAKERS = {"mosaicml": mosaicml_dataset, "litdata": litdata_dataset}


@pytest.fixture(scope="session")
def planted_streaming(tmp_path_factory):
    """(library, kind) -> the JSON document of bisect() on that library's dataset with that
    stage planted, two workers; made once per session."""
    docs, roots = {}, {}

    def get(lib, kind):
        if (lib, kind) not in docs:
            root = roots.setdefault(lib, tmp_path_factory.mktemp(lib) / "data")
            load_ms, map_ms, collate_ms = PLANTS[kind]
            ds = MAKERS[lib](root, load_ms, map_ms)
            loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=Collate(collate_ms))
            docs[lib, kind] = bisect(tiny_model(2.0), loader, device="cpu", max_seconds=20, plan=FAST_PLAN,
                                     verify_seconds=0).to_dict()
        return docs[lib, kind]
    return get


@pytest.mark.parametrize("lib", ["mosaicml", "litdata"])
@pytest.mark.parametrize("kind", ["load", "augment", "collate"])
def test_planted_stages_are_named_with_raw_measured(planted_streaming, lib, kind, no_leftover_workers):
    doc = planted_streaming(lib, kind)
    status = {p["point"]: p["status"] for p in doc["points"]}
    assert status["raw"] == "ok" and status["full"] == "ok", json.dumps(doc["points"])[:2000]
    assert_names(doc, kind, json.dumps(doc["verdict"]))
    assert doc["isolated"]["augment"]["status"] == "ok"
    assert [t.split(" ")[0] for t in doc["cache"]["raw_transforms"]] == (
        ["dataset.transforms"] if lib == "mosaicml" else ["dataset.transform[0]"])


@pytest.mark.parametrize("lib", ["mosaicml", "litdata"])
def test_full_keeps_their_partitioning(tmp_path, lib, no_leftover_workers):
    """The full point's loader (a copy of the dataset in the user's workers) yields each
    sample once per epoch, as the user's loader does: no worker duplicates another."""
    from bisect_pipeline.measure import sources
    from bisect_pipeline.pipeline.loader import describe

    ds = MAKERS[lib](tmp_path / "data", 0.0, 0.0)
    spec = describe(DataLoader(ds, batch_size=8, num_workers=2))
    with sources.full_loader(spec) as next_batch:
        labels = [next_batch() for _ in range(N // 8)]
    xs = torch.cat([b[0] for b in labels])
    assert len({tuple(x.tolist()) for x in xs}) == N
