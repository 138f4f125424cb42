"""Public training scripts of the sharded and streaming loaders (webdataset, MosaicML
`streaming`, `litdata`, `torchdata.nodes`) run unchanged under `bisect-pipeline run`, on
shards generated here, on the CPU; beside each run, a hand probe of the same pipeline's
stages. For each case: the exit status, the verdict, the wall time against
`--max-seconds` + the start-up the report gives (`run.startup_s`) + 10 s, what
../shared/tools/check-report says of the JSON, how many reports were printed (must be 1),
the stages table (each stage `ok`, `merged` or `unavailable`: split or not), and each
stage's cost alone (the report's `isolated` part, per batch) against the hand's probe of
that stage (target: within 25%).

The hand probe (`--probe NAME`, run by the benchmark in a process of its own with the
case's python) builds the script's own pipeline objects (it imports the copied script, or
builds the library's dataset on the same shards with the script's settings) and times each
stage by hand, in this process, without workers, alternating the stages round by round:
reading, decoding, the transforms, batching (and what a WebLoader does in the loop's
process, where the script re-batches). Per batch: the script's batch size in samples. The
report's costs alone are timed the same way (in the tool's process, without workers, on
the workers' one intra-op thread: WORKER_THREADS), so the two are comparable; the stages
table's `ms_per_batch` (what each stage adds to the loop, under the script's workers) is
shown beside them, not compared.

No third-party code is in this repository. Give the checkouts (a work tree, or a bare git
directory, e.g. what the `fetch` tool brings under /work/.mirror: then HEAD is used); the
files a case needs are copied (`git archive HEAD`) into OUT/src and run from there:

    git clone https://github.com/tmbdev-archive/webdataset-imagenet-2       # --wds-imagenet
    git clone https://github.com/tcwalther/bugreport-mosaicml-streaming-lightning-torchrun   # --mosaic-mnist
    git clone https://github.com/Lightning-AI/litdata                       # --litdata
    git clone https://github.com/pytorch/data                               # --torchdata

    python scripts/bench_scale_scripts.py --list
    python scripts/bench_scale_scripts.py --wds-imagenet webdataset-imagenet-2 \\
        --mosaic-mnist bugreport-mosaicml-streaming-lightning-torchrun --litdata litdata --torchdata data \\
        --ray-python /work/venvs/scale-wds/bin/python --streaming-python /work/venvs/streaming/bin/python \\
        --out /tmp/bench_scale [--only wds-imagenet] [--max-seconds 60]
    python scripts/bench_scale_scripts.py --out /tmp/bench_scale --markdown     # the table so far

Pythons: webdataset and torchdata are in the project's environment; MosaicML streaming pins
numpy<2.2, so it and litdata live in an environment of their own (`--streaming-python`,
made with `python -m venv --system-site-packages` and `pip install mosaicml-streaming
litdata`); the webdataset script imports `ray` at its top (for its multi-node command,
unused here): `--ray-python`, an environment with `pip install ray` beside the project's.
Every run imports bisect_pipeline from this checkout (PYTHONPATH); each result records the
file the case's python imported it from.

Each tool run and each probe holds the lock file given by `--lock` (default /tmp/cpu.lock,
`fcntl.flock`) for its duration only. Results: OUT/results/NAME.json (and NAME-run.json,
the report; NAME-probe.json, the hand's). A run still going `--max-seconds` + the case's
allowance after its start is killed (a hang: reported as such).

The cases (data sizes are small, written under OUT/data):

- wds-imagenet (webdataset; tmbdev-archive/webdataset-imagenet-2 imagenet.py, by
  webdataset's author, `train` command): `WebDataset(urls, repeat=True, shardshuffle=1000,
  nodesplitter=...).shuffle(5000).decode("pil").to_tuple("jpg;png;jpeg cls")
  .map_tuple(transform).batched(16, partial=False)` in a `WebLoader(batch_size=None,
  num_workers=2).with_epoch(...)`; RandomResizedCrop(224), flip, ToTensor, Normalize;
  mobilenet_v3_small, SGD; 8 + 2 shards of 100 + 32 JPEGs of 320x240 written with
  webdataset's `ShardWriter`. `--splitshards`: its default (`resampled`) wraps a model that
  is not DDP in `Join`, which raises on one process;
- mosaic-mnist (MosaicML streaming; tcwalther/bugreport-mosaicml-streaming-lightning-torchrun
  train_mnist_streaming.py): a `StreamingDataset` subclass whose `__getitem__` applies
  `self.transforms` (ToTensor) to the MDS sample's PIL image, a DataLoader of 4 workers,
  batch 1000, a small CNN under Lightning's `Trainer.fit` (CPU); 60,000 28x28 images written
  with `MDSWriter` (`{"image": "pil", "label": "int"}`, as its converter does) in
  ./data/streaming_mnist;
- litdata-sine (litdata; Lightning-AI/litdata examples/sine_function_model_prediction):
  its own `01-optimize.py` writes the data (`litdata.optimize`, 1,000 samples in 20
  chunks); `02-model_training.py` trains an MLP on `train_test_split` of a
  `StreamingDataset` through `StreamingDataLoader(batch_size=4, num_workers=7,
  persistent_workers=True)` under `Trainer.fit` (CPU, float64). No transform: `raw` has
  nothing to separate;
- nodes-imagenet (torchdata.nodes; pytorch/data examples/nodes/imagenet_benchmark.py, the
  graph of issue 50): `IterableWrapper(lister) -> Batcher(16) -> ParallelMapper(
  ImagenetTransform, 4 threads) -> Prefetcher(2)` in a `tn.Loader`, iterated with `next()`
  and no model (a loading benchmark); 10 classes x 30 JPEGs of 320x240. Needs the tool's
  torchdata.nodes support. It takes no optimizer step, so the tool finds no training loader
  and says so (exit 1, never silent); nodes-imagenet-loader: the same with `run --loader 1`,
  which the message names, so that the loop's own work between two batches is the step.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
import bench_public_scripts as public  # noqa: E402  (the copying, locking and running of bench_public_scripts)

# ../shared/tools/check-report from the main checkout (/work/main/scripts) as from a
# worktree beside it (/work/wt/NAME/scripts): the first found going up
public.CHECK = next((c for c in (os.path.join(os.path.dirname(HERE), *[".."] * k, "shared", "tools", "check-report")
                                 for k in (2, 3)) if os.path.exists(c)), public.CHECK)
SLACK_S = 10.0  # the bound: --max-seconds + start-up + 10 s
TOLERANCE = 0.25  # each stage's cost alone within 25% of the hand's
# The intra-op threads the hand probe runs its stages on: those of the workers that run
# them in every case here (a DataLoader sets one in each worker process; torchdata.nodes'
# thread workers set one, process-wide), as the tool times its costs alone
# (timed.worker_threads). On the process's default (2 on 2 cores), default_collate of
# 16 uint8 images took 120-320 ms a call beside a neighbour's work, against 0.06 ms on one.
WORKER_THREADS = 1


# --------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------


class Case:
    """One script run: `repo` names the checkout option, `files` what to copy from it,
    `script` the path to run (from the copy), `args` its arguments ({data}, {src}, {out}
    filled in), `data` the generators it needs, `python` which interpreter runs it
    (system, streaming or ray), `cwd` where (`run`: OUT/run, whose ./data is OUT/data;
    else the case's own directory), `links` names made in that directory (to paths with
    {data}), `probe` the hand probe of its stages, `library` what it exercises,
    `tool_args` options of `bisect-pipeline run` (the script's own stay unchanged)."""

    def __init__(self, library, repo, files, script, args, data=(), python="system", cwd=None, links=None,
                 probe=None, workers="", what="", allowance=150.0, tool_args=()):
        self.library, self.repo, self.files, self.script, self.args = library, repo, files, script, args
        self.tool_args = list(tool_args)
        self.data, self.python, self.cwd, self.links = tuple(data), python, cwd, dict(links or {})
        self.probe, self.workers, self.what, self.allowance = probe, workers, what, allowance


WDS_SHARDS, WDS_VAL = 8, 2
WDS_BATCH = 16

CASES = {
    "wds-imagenet": Case(
        "webdataset", "wds_imagenet", ["imagenet.py", "utils.py"], "imagenet.py",
        ["train", "--bucket", "{data}/wds/", "--shards", f"imagenet-train-{{000000..{WDS_SHARDS - 1:06d}}}.tar",
         "--valshards", f"imagenet-val-{{000000..{WDS_VAL - 1:06d}}}.tar", "--batchsize", str(WDS_BATCH),
         "--mname", "mobilenet_v3_small", "--workers", "2", "--device", "cpu", "--ntrain", "100000",
         "--nval", "64", "--splitshards", "--loginterval", "5"],
        data=["wds_imagenet"], python="ray", probe="wds_imagenet",
        workers="2, not persistent (a WebLoader; batched(16) in the workers, batch_size=None)",
        what="decode('pil'), to_tuple, map_tuple(RandomResizedCrop(224) ...), batched(16); mobilenet_v3_small"),
    "mosaic-mnist": Case(
        "mosaicml streaming", "mosaic_mnist", ["train_mnist_streaming.py"], "train_mnist_streaming.py", [],
        data=["mds_mnist"], python="streaming", cwd="run", probe="mosaic_mnist",
        workers="4, not persistent (Lightning Trainer.fit)",
        what="StreamingDataset subclass applying self.transforms (ToTensor); batch 1000"),
    "litdata-sine": Case(
        "litdata", "litdata", ["examples/sine_function_model_prediction"],
        "examples/sine_function_model_prediction/02-model_training.py", [],
        data=["litdata_sine"], python="streaming",
        links={"example_optimize_dataset": "{data}/litdata_sine/example_optimize_dataset"}, probe="litdata_sine",
        workers="7, persistent (StreamingDataLoader; train and val)",
        what="litdata StreamingDataset (train_test_split), no transform; batch 4, float64 MLP"),
    "nodes-imagenet": Case(
        "torchdata.nodes", "torchdata", ["examples/nodes/imagenet_benchmark.py"], "examples/nodes/imagenet_benchmark.py",
        ["--loader", "thread", "--num-workers", "4", "--batch-size", "16", "-d", "{data}/nodes_images/train",
         "--max-steps", "1000000", "--max-duration", "100000"],
        data=["nodes_images"], probe="nodes_imagenet",
        workers="ParallelMapper: 4 threads, Prefetcher(2)",
        what="IterableWrapper -> Batcher(16) -> ParallelMapper(decode + crop + collate) -> Prefetcher; no model"),
    "nodes-imagenet-loader": Case(
        "torchdata.nodes", "torchdata", ["examples/nodes/imagenet_benchmark.py"], "examples/nodes/imagenet_benchmark.py",
        ["--loader", "thread", "--num-workers", "4", "--batch-size", "16", "-d", "{data}/nodes_images/train",
         "--max-steps", "1000000", "--max-duration", "100000"],
        data=["nodes_images"], probe="nodes_imagenet", tool_args=["--loader", "1"],
        workers="ParallelMapper: 4 threads, Prefetcher(2)",
        what="the same, with `run --loader 1` (as the tool's message says): the loop's own work is the step"),
}

REPOS = {"wds_imagenet": "tmbdev-archive/webdataset-imagenet-2",
         "mosaic_mnist": "tcwalther/bugreport-mosaicml-streaming-lightning-torchrun",
         "litdata": "Lightning-AI/litdata", "torchdata": "pytorch/data"}


# --------------------------------------------------------------------------------------
# Data (each generator runs in the case's python: `--generate KIND`)
# --------------------------------------------------------------------------------------


def write_wds_imagenet(root: str) -> None:
    """ROOT/imagenet-{train,val}-NNNNNN.tar: samples {jpg, cls} (webdataset's ShardWriter)."""
    import webdataset as wds

    rng = random.Random(2)
    for split, shards, per in (("train", WDS_SHARDS, 100), ("val", WDS_VAL, 32)):
        with wds.ShardWriter(os.path.join(root, f"imagenet-{split}-%06d.tar"), maxcount=per, verbose=0) as sink:
            for i in range(shards * per):
                sink.write({"__key__": f"{split}{i:06d}", "jpg": public._picture(rng, (320, 240)),
                            "cls": rng.randrange(1000)})


def write_mds_mnist(root: str, n: int = 60_000) -> None:
    """ROOT/streaming_mnist: MNIST-sized L images and int labels in MDS (MDSWriter), the
    columns train_mnist_streaming.py's converter writes."""
    import numpy as np
    from PIL import Image
    from streaming import MDSWriter

    out = os.path.join(root, "streaming_mnist")
    shutil.rmtree(out, ignore_errors=True)
    g = np.random.default_rng(0)
    images = g.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = g.integers(0, 10, n)
    with MDSWriter(out=out, columns={"image": "pil", "label": "int"}) as w:
        for i in range(n):
            w.write({"image": Image.fromarray(images[i], "L"), "label": int(labels[i])})


def write_litdata_sine(root: str) -> None:
    """ROOT/example_optimize_dataset, written by the example's own 01-optimize.py (run
    here, from the copy of the checkout)."""
    script = os.path.join(os.environ["BENCH_SRC"], "litdata", "examples", "sine_function_model_prediction",
                          "01-optimize.py")
    subprocess.run([sys.executable, script], cwd=root, check=True)


def write_nodes_images(root: str) -> None:
    public.write_imagefolder(root, classes=10, train=30, val=2, size=(320, 240))


GENERATORS = {"wds_imagenet": ("wds", write_wds_imagenet), "mds_mnist": ("", write_mds_mnist),
              "litdata_sine": ("litdata_sine", write_litdata_sine), "nodes_images": ("nodes_images",
                                                                                     write_nodes_images)}


# --------------------------------------------------------------------------------------
# Hand probes (each runs in the case's python: `--probe NAME`)
# --------------------------------------------------------------------------------------


class InPlaceReads:
    """While open, in this thread: a file opened for reading in binary mode through
    builtins.open returns a wrapper that adds the wall time of the open and of its read,
    readinto, read1, readinto1, readall, readline, seek and peek calls to `seconds`. The
    reads a pipeline makes, timed where it makes them (interleaved with its decoding), as
    the tool's read figure means them; written here apart from the tool's reads.py."""

    CALLS = ("read", "readinto", "read1", "readinto1", "readall", "readline", "seek", "peek")

    def __init__(self) -> None:
        self.seconds, self.thread = 0.0, None

    def __enter__(self) -> "InPlaceReads":
        import builtins
        import threading
        self.thread, self._open = threading.get_ident(), builtins.open
        probe = self

        class File:
            def __init__(self, f):
                self._f = f

            def __getattr__(self, name):
                attr = getattr(self._f, name)
                if name not in InPlaceReads.CALLS:
                    return attr

                def timed(*a):
                    t = time.perf_counter()
                    try:
                        return attr(*a)
                    finally:
                        probe.seconds += time.perf_counter() - t
                return timed

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self._f.__exit__(*exc)

            def __iter__(self):
                return iter(self._f)

        def opener(file, mode="r", *a, **k):
            if threading.get_ident() != self.thread or "b" not in mode or set(mode) & set("wax+"):
                return self._open(file, mode, *a, **k)
            t = time.perf_counter()
            f = self._open(file, mode, *a, **k)
            self.seconds += time.perf_counter() - t
            return File(f)
        builtins.open = opener
        return self

    def __exit__(self, *exc) -> None:
        import builtins
        builtins.open = self._open


def _module(path: str, name: str):
    """The copied script as a module (its `if __name__ == "__main__"` not run)."""
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _alternate(stages: dict, rounds: int) -> dict:
    """Time each stage (a function returning the seconds of one batch's worth) in turn,
    the order rotated every round. Per stage: the median over the rounds (the figure
    compared: a machine shared with other work bursts now and then, and a burst inflates
    one round's mean), the mean, the standard error of the mean, and the rounds' values."""
    names = list(stages)
    per = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            per[n].append(stages[n]() * 1e3)
    return {n: _summary(v) for n, v in per.items()}


def _summary(values: list, **extra) -> dict:
    return dict({"ms_per_batch": round(statistics.median(values), 4), "mean_ms": round(statistics.fmean(values), 4),
                 "se_ms": round(statistics.stdev(values) / len(values) ** 0.5, 4) if len(values) > 1 else None,
                 "rounds": [round(x, 4) for x in values]}, **extra)


def _fn_name(stage) -> str:
    f = getattr(stage, "f", stage)
    return getattr(f, "__name__", type(f).__name__)


def _drain(stages: list, items) -> list:
    source = iter(items)
    for stage in stages:
        source = stage(source)
    return list(source)


def probe_wds_imagenet(src: str, data: str, rounds: int, k: int = 4) -> dict:
    """The script's own make_loader (mode train, as --splitshards builds it): its dataset's
    stage list, cut by hand before decode and at batched; each round times K batches of
    each stage in turn (K = 4):

    - load: a fresh iterator over the stages before decode (shard list, splitters, tar
      reading and grouping, the shuffle buffer), its first sample not timed (as the tool's
      first), then K batches' worth of samples, then the decode stage on them;
    - read (I/O): the reads the reading stages make of the shard files for those K
      batches (tarfile's, through open()), timed where they make them (InPlaceReads), on
      a fresh iterator of their own; decode: load less that (tar parsing, grouping, the
      shuffle, decoding), as the tool splits it; `read whole`, for information: a shard
      file read whole in tarfile's 10 KiB records in a loop of its own, per sample, times
      the samples the reading stages read per sample handed on (a shuffle buffer filling
      reads two): the earlier hand figure, which the reads in place exceed (0.52 against
      0.61 ms a batch on 2026-11-29); `read stages`: the stages before decode, whole;
    - augment: to_tuple and map_tuple on the decoded samples;
    - collate: batched(16) and the DataLoader's conversion (batch_size=None: default_convert)."""
    mod = _module(os.path.join(src, "imagenet.py"), "imagenet")
    urls = os.path.join(data, "wds", f"imagenet-train-{{000000..{WDS_SHARDS - 1:06d}}}.tar")
    loader = mod.make_loader(urls, mode="train", batch_size=WDS_BATCH, num_workers=2, resampled=False)
    dataloader = loader.pipeline[0]
    ds = dataloader.dataset
    stages = list(ds.pipeline)
    names = [_fn_name(s) for s in stages]
    # `.decode("pil")` is `_map(Decoder)` in webdataset 1.0, `_decode` before
    d = next(i for i, s in enumerate(stages) if names[i] == "_decode" or (
        names[i] == "_map" and type((getattr(s, "args", None) or [None])[0]).__name__ == "Decoder"))
    b = names.index("_batched")
    grouped = names.index("group_by_keys") + 1
    count = {"n": 0}

    def counter(src):
        for sample in src:
            count["n"] += 1
            yield sample

    reading = copy.copy(ds)
    reading.pipeline = stages[:grouped] + [counter] + stages[grouped:d]
    shard = os.path.join(data, "wds", "imagenet-train-000000.tar")
    per_shard = 100
    held = {"reads_per_sample": 1.0}
    n = k * WDS_BATCH

    def read_stages():
        it = iter(reading)
        next(it)
        before = count["n"]
        t = time.perf_counter()
        held["raw"] = [next(it) for _ in range(n)]
        took = time.perf_counter() - t
        held["reads_per_sample"] = (count["n"] - before) / n
        return took / k

    def in_place():
        it = iter(reading)
        next(it)
        with InPlaceReads() as reads:
            [next(it) for _ in range(n)]
        return reads.seconds / k

    def decode_stage():
        t = time.perf_counter()
        held["decoded"] = _drain([stages[d]], held["raw"])
        return (time.perf_counter() - t) / k

    def io():
        t = time.perf_counter()
        with open(shard, "rb") as f:
            while f.read(10240):
                pass
        return (time.perf_counter() - t) / per_shard * WDS_BATCH * held["reads_per_sample"]

    def transform():
        t = time.perf_counter()
        held["augmented"] = _drain(stages[d + 1:b], held["decoded"])
        return (time.perf_counter() - t) / k

    def batch():
        t = time.perf_counter()
        [dataloader.collate_fn(x) for x in _drain(stages[b:], held["augmented"])]
        return (time.perf_counter() - t) / k

    for f in (read_stages, decode_stage, io, in_place, transform, batch):  # warm-up, and every stage has its input
        f()
    out = _alternate({"read stages": read_stages, "decode stage": decode_stage, "read whole": io, "read": in_place,
                      "augment": transform, "collate": batch}, rounds)
    out["load"] = _sum(out, "read stages", "decode stage")
    out["decode"] = _less(out, "load", "read")
    return {"batch": WDS_BATCH, "stages": out, "names": names, "reads_per_sample": held["reads_per_sample"],
}


def probe_mosaic_mnist(src: str, data: str, rounds: int) -> dict:
    """The script's MNISTDataset on the same shards (batch_size 1000), a batch of 1000
    indices in the dataset's order each round, built as a worker builds it: load,
    `get_item(i)` (what its __getitem__ calls through super(): the shard lookup, the MDS
    sample's bytes, the columns decoded: a PIL image and an int), and augment,
    self.transforms on that image, timed apart sample by sample, one after the other
    (timed in two loops of their own, the thousand ToTensor calls on 28x28 images read 27
    us each where, after each get_item, they take about 60); read, the reads get_item
    makes (MDSReader's open, seek and read), timed where it makes them (InPlaceReads);
    collate, default_collate of the 1000 (image, label) pairs right after they were built
    (in a loop over batches built before, 0.8 ms a batch where right after its samples it
    took 1.0: 2026-11-29); decode, load less read; `read whole`, the same samples' bytes
    read alone in a loop (get_sample_data), and `getitem`, `dataset[i]` whole (load and
    augment), for information."""
    from torch.utils.data import default_collate

    mod = _module(os.path.join(src, "train_mnist_streaming.py"), "train_mnist_streaming")
    ds = mod.MNISTDataset(local=os.path.join(data, "streaming_mnist"), batch_size=1000)
    n, per = ds.num_samples, 1000
    pos = {"i": 0}
    held = {}

    def batch_indices():
        start = pos["i"]
        pos["i"] = (start + per) % (n - per)
        held["indices"] = range(start, start + per)

    def load():
        batch_indices()
        objs, samples, loading, augmenting = [], [], 0.0, 0.0
        with InPlaceReads() as reads:
            for i in held["indices"]:
                t0 = time.perf_counter()
                o = ds.get_item(i)
                t1 = time.perf_counter()
                samples.append((ds.transforms(o["image"]), o["label"]))
                t2 = time.perf_counter()
                objs.append(o)
                loading += t1 - t0
                augmenting += t2 - t1
        t = time.perf_counter()
        default_collate(samples)  # as a worker does, right after building the batch
        held.update(objs=objs, samples=samples, augment_s=augmenting, collate_s=time.perf_counter() - t,
                    read_s=reads.seconds)
        return loading

    def read_alone():
        where = [ds.spanner[i] for i in held["indices"]]
        t = time.perf_counter()
        [ds.shards[s].get_sample_data(j) for s, j in where]
        return time.perf_counter() - t

    def read():  # timed in load(), the reads get_item makes
        return held["read_s"]

    def augment():  # timed in load(), sample by sample after each get_item
        return held["augment_s"]

    def collate():  # timed in load(), right after the batch's samples were built
        return held["collate_s"]

    def getitem():
        t = time.perf_counter()
        [ds[i] for i in held["indices"]]
        return time.perf_counter() - t

    for f in (load, read, read_alone, augment, collate, getitem):
        f()
    # load first in every round: it picks the round's indices, which the others reuse
    out = {}
    timed = {"read": read, "read whole": read_alone, "augment": augment, "collate": collate, "getitem": getitem}
    per_round = {n: [] for n in ["load", *timed]}
    others = ["read whole", "getitem"]
    for r in range(rounds):
        per_round["load"].append(load() * 1e3)
        for name in ["read", "augment", "collate"] + others[r % 2:] + others[:r % 2]:
            per_round[name].append(timed[name]() * 1e3)
    out = {name: _summary(v) for name, v in per_round.items()}
    out["decode"] = _less(out, "load", "read")
    return {"batch": per, "stages": out}


def probe_litdata_sine(src: str, data: str, rounds: int, k: int = 25) -> dict:
    """The example's dataset (StreamingDataset("example_optimize_dataset"), its 70%
    train split, as setup() makes it): load, the next 4 samples of an iterator over it
    (as the DataLoader's workers take them: litdata reads the chunk and deserializes each
    sample), the iterator's first sample not timed; collate, the collate_fn of the
    script's StreamingDataLoader (litdata's StreamingDataLoaderCollateFn, default_collate
    inside) on the 4 dicts right after they were taken, as a worker does (timed apart, in
    each load round); `by index`, `dataset[i]` for 4 indices, for information. A batch is
    tens of microseconds: each round times K = 25 batches and divides."""
    import litdata as ld

    def split():
        ds = ld.StreamingDataset(os.path.join(data, "litdata_sine", "example_optimize_dataset"))
        return ld.train_test_split(ds, splits=[0.7, 0.1, 0.1])[0]

    train, indexed = split(), split()  # by index on a dataset of its own: not the iterator's
    per, n = 4, len(train)
    collate_fn = ld.StreamingDataLoader(split(), batch_size=per, num_workers=0).collate_fn  # as the script builds it
    state = {"it": None, "left": 0, "i": 0}
    held = {"collates": []}

    def take():
        if state["left"] < per:  # a new epoch: its first sample not timed
            state["it"] = iter(train)
            next(state["it"])
            state["left"] = n - 1
        state["left"] -= per
        return [next(state["it"]) for _ in range(per)]

    def load():  # each batch collated right after its samples, as a worker does (timed apart)
        loading, collating = 0.0, 0.0
        for _ in range(k):
            t0 = time.perf_counter()
            samples = take()
            t1 = time.perf_counter()
            collate_fn(samples)
            collating += time.perf_counter() - t1
            loading += t1 - t0
        held["collates"].append(collating / k * 1e3)
        return loading / k

    def by_index():
        start = state["i"]
        state["i"] = (start + per * k) % (n - per * k)
        t = time.perf_counter()
        [indexed[i] for i in range(start, start + per * k)]
        return (time.perf_counter() - t) / k

    for f in (load, by_index):
        f()
    held["collates"] = []  # one figure per load round, the warm-up's left out
    out = _alternate({"load": load, "by index": by_index}, rounds)
    return {"batch": per, "stages": dict(out, collate=_summary(held["collates"]))}


def probe_nodes_imagenet(src: str, data: str, rounds: int) -> dict:
    """The example's ImagenetLister and ImagenetTransform on the same folder, a batch of
    16 paths in the lister's order: read, the reads PIL makes of the 16 files (open, then
    some 38 reads a file: the JPEG markers, then the data) while the Mapper's function runs
    on them, timed where it makes them (InPlaceReads); `read whole`, each file's bytes
    read at once (for information, and what decode starts from); decode, PIL open +
    convert on those bytes in memory; augment, pil_to_tensor + center_crop(224); collate, default_collate of the 16
    dicts; map (whole), the transform as the ParallelMapper calls it on the Batcher's list
    of 16 (it opens the files itself: read + decode + augment + collate)."""
    import torchvision.transforms.functional as F
    from PIL import Image
    from torch.utils.data import default_collate

    mod = _module(os.path.join(src, "examples", "nodes", "imagenet_benchmark.py"), "imagenet_benchmark")
    lister = mod.ImagenetLister(os.path.join(data, "nodes_images", "train"))
    tx = mod.ImagenetTransform()
    per, n = 16, len(lister)
    pos = {"i": 0}
    held = {}

    def batch_of_paths():
        start = pos["i"]
        pos["i"] = (start + per) % (n - per)
        return [lister[i] for i in range(start, start + per)]

    def read_whole():
        items = batch_of_paths()
        t = time.perf_counter()
        held["bytes"] = [(d, open(d["img_path"], "rb").read()) for d in items]
        return time.perf_counter() - t

    def read():  # the reads PIL makes of the same 16 files in the Mapper's function
        items = [{"img_path": d["img_path"]} for d, _ in held["bytes"]]
        with InPlaceReads() as reads:
            tx(items)
        return reads.seconds

    def decode():
        t = time.perf_counter()
        held["images"] = [(d, Image.open(io.BytesIO(b)).convert("RGB")) for d, b in held["bytes"]]
        return time.perf_counter() - t

    def augment():
        t = time.perf_counter()
        held["samples"] = [dict(d, img=F.center_crop(F.pil_to_tensor(im), [224, 224])) for d, im in held["images"]]
        return time.perf_counter() - t

    def collate():
        t = time.perf_counter()
        default_collate(held["samples"])
        return time.perf_counter() - t

    def whole():
        items = [dict(d) for d in batch_of_paths()]
        t = time.perf_counter()
        tx(items)
        return time.perf_counter() - t

    for f in (read_whole, read, decode, augment, collate, whole):
        f()
    out = _alternate({"read whole": read_whole, "read": read, "decode": decode, "augment": augment,
                      "collate": collate, "map": whole}, rounds)
    out["load"] = _sum(out, "read whole", "decode")
    return {"batch": per, "stages": out}


def _sum(out: dict, *names: str) -> dict:
    """Stages timed in turn, added up round by round."""
    return _summary([sum(v) for v in zip(*(out[n]["rounds"] for n in names))], of=list(names))


def _less(out: dict, whole: str, part: str) -> dict:
    """A stage timed whole less a part of it, round by round."""
    return _summary([a - b for a, b in zip(out[whole]["rounds"], out[part]["rounds"])], of=[whole, "-" + part])


PROBES = {"wds_imagenet": probe_wds_imagenet, "mosaic_mnist": probe_mosaic_mnist,
          "litdata_sine": probe_litdata_sine, "nodes_imagenet": probe_nodes_imagenet}


# --------------------------------------------------------------------------------------
# The tool's costs alone, per batch, against the hand's
# --------------------------------------------------------------------------------------


def tool_costs(doc: dict) -> dict:
    """The report's costs alone (`isolated`) per batch: load (and its read / decode
    split; by index where it was timed through a streaming iterator, whose excess is
    `iterator`, shown), augment, collate, the loop's own stages; per-sample costs times the items in
    a batch. `load` covers augment too where the report says so (`includes`)."""
    iso = doc.get("isolated") or {}
    if iso.get("status") != "ok":
        return {}
    items = iso.get("items_per_batch") or iso.get("batch_size") or doc.get("batch_size") or 1
    out = {}
    load = iso.get("load") or {}
    if load.get("ms_per_sample") is not None:
        # a streaming dataset's load timed through its iterator: the hand probes by index,
        # so the figure by index is the one compared, and the iterator's part is shown
        index = load.get("index_ms_per_sample")
        out["load"] = {"ms_per_batch": (load["ms_per_sample"] if index is None else index) * items,
                       "includes": load.get("includes") or ["load"],
                       "se_ms": (load.get("se_ms_per_sample") or 0.0) * items or None if index is None else None}
        if index is not None:
            out["iterator"] = {"ms_per_batch": (load["ms_per_sample"] - index) * items}
        split = load.get("split") or {}
        if split.get("status", "ok") == "ok" and split.get("read_ms_per_sample") is not None:
            out["read"] = {"ms_per_batch": split["read_ms_per_sample"] * items}
            out["decode"] = {"ms_per_batch": split["decode_ms_per_sample"] * items}
    aug = iso.get("augment") or {}
    if aug.get("ms_per_sample") is not None:
        out["augment"] = {"ms_per_batch": aug["ms_per_sample"] * items,
                          "se_ms": (aug.get("se_ms_per_sample") or 0.0) * items or None}
    col = iso.get("collate") or {}
    if col.get("ms_per_batch") is not None:
        out["collate"] = {"ms_per_batch": col["ms_per_batch"], "se_ms": col.get("se_ms_per_batch"),
                          "in_place": bool(col.get("in_place"))}
    loop = iso.get("loop") or {}
    if loop.get("ms_per_batch") is not None:
        out["loop"] = {"ms_per_batch": loop["ms_per_batch"]}
    return {k: dict(v, ms_per_batch=round(v["ms_per_batch"], 3),
                    **({"se_ms": round(v["se_ms"], 4)} if v.get("se_ms") else {})) for k, v in out.items()}


def compare(tool: dict, hand: dict) -> list:
    """Per stage the tool timed alone: its cost, the hand's, the ratio and whether it is
    within 25%. Where the report's load includes other stages (`includes`: augment where
    the transforms could not be split; augment and collate where a node graph's Mapper
    builds whole batches), its load and decode rows are held against the hand's same
    stages together (the hand's whole `map` where it has one), and its collate row (what
    is left after the Mapper: nothing) is shown, not compared."""
    merged = [x for x in (tool.get("load") or {}).get("includes", ["load"]) if x != "load"]
    whole, whole_parts = None, []
    if merged and "collate" in merged and "map" in hand:
        whole_parts = ["map"]
    elif merged and "load" in hand:
        whole_parts = ["load"] + [x for x in merged if x in hand]
    if whole_parts:
        whole = sum(hand[x]["ms_per_batch"] for x in whole_parts)
    rows = []
    for name, t in tool.items():
        label, h, parts = name, (hand[name]["ms_per_batch"] if name in hand else None), [name]
        if merged and name == "load":
            label, h, parts = f"load (with {', '.join(merged)})", whole, whole_parts
        elif merged and name == "decode":
            label, parts = f"decode (with {', '.join(merged)})", []
            h = whole - hand["read"]["ms_per_batch"] if whole is not None and "read" in hand else None
        elif name in merged:
            label, h = f"{name} (in load)", None
        ratio = t["ms_per_batch"] / h if h else None
        # the two figures' noise: the tool's standard error and the hand's (of its rounds)
        hand_se = [(hand.get(x) or {}).get("se_ms") for x in parts]
        noise = (None if h is None or not t.get("se_ms") or not parts or not all(hand_se)
                 else round(2 * (t["se_ms"] ** 2 + sum(x ** 2 for x in hand_se)) ** 0.5, 4))
        rows.append({"stage": label, "tool_ms": t["ms_per_batch"], "hand_ms": None if h is None else round(h, 3),
                     "ratio": round(ratio, 3) if ratio is not None else None,
                     "within": None if h is None else ratio is not None and abs(ratio - 1) <= TOLERANCE,
                     "noise_ms": noise,
                     "within_noise": None if noise is None else abs(t["ms_per_batch"] - h) <= noise})
    return rows


def stages_table(doc: dict) -> list:
    return [{"stage": s["stage"], "status": s["status"], "ms_per_batch": s.get("ms_per_batch"),
             "includes": s.get("includes"), "reason": s.get("reason")} for s in doc.get("stages", [])]


def split(stages: list) -> str:
    """Whether load, augment and collate are each costed on their own (`ok`), or which
    are merged or unavailable."""
    off = [f"{s['stage']} {s['status']}" for s in stages if s["stage"] in ("load", "augment", "collate")
           and s["status"] != "ok"]
    return "yes" if not off else "no: " + ", ".join(off)


# --------------------------------------------------------------------------------------
# Running them
# --------------------------------------------------------------------------------------


def python_of(case: Case, args) -> str:
    return {"system": sys.executable, "streaming": args.streaming_python, "ray": args.ray_python}[case.python]


def generate(kind: str, python: str, out: str, env: dict) -> None:
    sub, _ = GENERATORS[kind]
    where = os.path.join(out, "data", sub) if sub else os.path.join(out, "data")
    marker = os.path.join(where, f".generated-{kind}")
    if os.path.exists(marker):
        return
    os.makedirs(where, exist_ok=True)
    print(f"  generating {kind} in {where}", flush=True)
    subprocess.run([python, HERE, "--generate", kind, "--where", where], env=env, check=True)
    open(marker, "w").close()


def _fill(text: str, fill: dict) -> str:
    """{data}, {out}, {src} filled in; other braces (shard patterns) kept."""
    for key, value in fill.items():
        text = text.replace("{" + key + "}", value)
    return text


def _held(env: dict, report: str) -> dict:
    """The environment of the hand probe: glibc's malloc held as the tool held it during
    the run (the report's run.allocator.during, as MALLOC_*_ variables), so that the costs
    alone and the hand's are timed under the same allocator: without, a batch of large
    tensors allocated afresh reads up to 3x the reused one (page faults)."""
    try:
        during = json.load(open(report))["run"]["allocator"]["during"]
    except (OSError, ValueError, KeyError, TypeError):
        return env
    trim = during.get("trim_threshold")
    return dict(env, MALLOC_MMAP_THRESHOLD_=str(during["mmap_threshold"]), MALLOC_TOP_PAD_=str(during["top_pad"]),
                MALLOC_TRIM_THRESHOLD_=str(trim if trim is not None and trim >= 0 else 2**62))


def run_probe(name: str, case: Case, python: str, src: str, cwd: str, env: dict, args) -> dict | None:
    """The case's hand probe in a process of its own (the lock already held): {"hand": ...}
    or {"hand_error": ...}; None without one."""
    if not case.probe or args.no_probe:
        return None
    out = os.path.abspath(args.out)
    probe_json = os.path.join(out, "results", f"{name}-probe.json")
    with contextlib.suppress(FileNotFoundError):
        os.remove(probe_json)
    rc, _, err, _ = public.run_process([python, HERE, "--probe", case.probe, "--src", src, "--data",
                                        os.path.join(out, "data"), "--json", probe_json, "--rounds", str(args.rounds)],
                                       cwd, env, 600, "")
    if not os.path.exists(probe_json):
        return {"hand_error": f"exit {rc}: {err[-800:]}"}
    return {"hand": json.load(open(probe_json))}


def run_case(name: str, case: Case, repo: str, args, env: dict) -> dict:
    out = os.path.abspath(args.out)
    python = python_of(case, args)
    src = os.path.join(out, "src", case.repo)
    public.copy_files(repo, case.files, src)
    env = dict(env, BENCH_SRC=os.path.join(out, "src"))
    for kind in case.data:
        generate(kind, python, out, env)
    data = os.path.join(out, "data")
    work = os.path.join(out, "run", name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "out"), exist_ok=True)
    if not os.path.exists(os.path.join(out, "run", "data")):
        os.symlink(data, os.path.join(out, "run", "data"))
    fill = {"data": data, "out": os.path.join(work, "out"), "src": src}
    for link, target in case.links.items():
        os.symlink(_fill(target, fill), os.path.join(work, link))
    cwd = os.path.join(out, "run") if case.cwd == "run" else work
    script_args = [_fill(a, fill) for a in case.args]
    report = os.path.join(out, "results", f"{name}-run.json")
    with contextlib.suppress(FileNotFoundError):
        os.remove(report)
    tool_from = subprocess.run([python, "-c", "import bisect_pipeline; print(bisect_pipeline.__file__)"], env=env,
                               capture_output=True, text=True, cwd=cwd).stdout.strip()
    cmd = [python, "-m", "bisect_pipeline", "run", "--json", report, "--max-seconds", str(args.max_seconds),
           "--device", "cpu", *case.tool_args, os.path.join(src, case.script)] + script_args
    print(f"[{name}] {' '.join(cmd[1:])}  (cwd {cwd}; bisect_pipeline from {tool_from})", flush=True)
    with public.cpu_lock(args.lock):  # the run and its probe in one hold: the same machine for both
        rc, stdout, stderr, wall = public.run_process(cmd, cwd, env, args.max_seconds + case.allowance, "")
        probe = run_probe(name, case, python, src, cwd, _held(env, report), args)
    for stream, text in (("stderr", stderr), ("stdout", stdout)):
        with open(os.path.join(out, "results", f"{name}.{stream}.txt"), "w") as f:
            f.write(text)
    result = {"name": name, "library": case.library, "repo": REPOS[case.repo], "revision": public.revision(repo),
              "script": case.script, "args": script_args, "tool_args": case.tool_args, "python": python, "tool_from": tool_from,
              "workers": case.workers, "what": case.what, "exit": rc, "wall_s": round(wall, 1),
              "reports": stderr.count(public.REPORT_LINE), "json": os.path.exists(report),
              "stderr_tail": stderr[-2500:]}
    doc = None
    if result["json"]:
        doc = json.load(open(report))
        run = doc.get("run") or {}
        startup = run.get("startup_s") or 0.0
        result.update(verdict=doc.get("bottleneck"), cost=public.named_cost(doc), check=public.check_report(report),
                      startup_s=startup, bound_s=round(args.max_seconds + startup + SLACK_S, 1),
                      stages=stages_table(doc), split=split(stages_table(doc)), tool=tool_costs(doc),
                      raw=next((p.get("status") for p in doc.get("points", []) if p.get("point") == "raw"), None))
        result["within_bound"] = isinstance(rc, int) and wall <= result["bound_s"]
    if probe is not None:
        result.update(probe)
        if "hand" in probe:
            result["compare"] = compare(result.get("tool") or {}, probe["hand"]["stages"])
    with open(os.path.join(out, "results", f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def show(r: dict) -> None:
    print(f"[{r['name']}] exit {r['exit']}; verdict {r.get('verdict', '-')}; {r.get('cost', '-')}; "
          f"wall {r['wall_s']} s (bound {r.get('bound_s', '-')}: {'kept' if r.get('within_bound') else 'NOT kept'});"
          f" check-report: {r.get('check', 'no json')}; reports printed: {r['reports']}; "
          f"stages split: {r.get('split', '-')}", flush=True)
    for c in r.get("compare", []):
        print(f"    {c['stage']:<20s} tool {c['tool_ms']} ms/batch, hand {c['hand_ms']}: ratio {c['ratio']} "
              f"({'within 25%' if c['within'] else 'NOT within 25%' if c['within'] is False else 'no hand probe'}"
              f"{_noise_note(c)})", flush=True)
    if r.get("hand_error"):
        print("    hand probe failed: " + r["hand_error"], flush=True)
    if not r.get("json") or r["reports"] != 1 or r["exit"] != 0:
        print("    stderr tail: " + r["stderr_tail"][-900:].replace("\n", "\n    "), flush=True)


def _cost_cell(c: dict) -> str:
    """`augment 41.2 vs 39.8 (1.04x, ok)`."""
    if c["hand_ms"] is None:
        return f"{c['stage']} {c['tool_ms']:.3g} (no hand probe)"
    verdict = "ok" if c["within"] else "OUT"
    return f"{c['stage']} {c['tool_ms']:.3g} vs {c['hand_ms']:.3g} ({c['ratio']:.2f}x, {verdict}{_noise_note(c)})"


def _noise_note(c: dict) -> str:
    """Where a cost is outside 25%: whether the difference is within two combined standard
    errors of the tool's figure and the hand's rounds (then the two measurements cannot
    tell the difference from noise)."""
    if c.get("within") is not False or c.get("within_noise") is None:
        return ""
    return f"; within the two figures' noise, +-{c['noise_ms']:.3g}" if c["within_noise"] else \
        f"; beyond the two figures' noise, +-{c['noise_ms']:.3g}"


def markdown(results) -> str:
    rows = ["| case | script @commit | exit | verdict | wall / bound s | check-report | reports | stages split "
            "(loop ms/batch) | cost alone: tool vs hand, ms/batch |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        stages = ", ".join(f"{s['stage']} {s['status']}"
                           + (f" {s['ms_per_batch']:.3g}" if s["status"] == "ok" and s["ms_per_batch"] is not None
                              else "") for s in r.get("stages", []) if s["status"] != "skipped") or "-"
        costs = "; ".join(_cost_cell(c) for c in r.get("compare", [])) or r.get("hand_error", "-")[:80]
        rows.append(f"| `{r['name']}` ({r['library']}) | {r['repo']} `{r['script']}` @{r['revision'][:8]} | {r['exit']} "
                    f"| {r.get('verdict', '-')} | {r['wall_s']} / {r.get('bound_s', '-')} | {r.get('check', 'no JSON')} "
                    f"| {r['reports']} | {r.get('split', '-')} ({stages}) | {costs} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for repo, full in REPOS.items():
        ap.add_argument(f"--{repo.replace('_', '-')}", dest=repo, help=f"a checkout (or bare git dir) of {full}")
    ap.add_argument("--streaming-python", default="/work/venvs/streaming/bin/python",
                    help="a python with mosaicml-streaming and litdata (and this project's requirements)")
    ap.add_argument("--ray-python", default=sys.executable, help="a python that can import ray (wds-imagenet)")
    ap.add_argument("--only", default=None, help="comma-separated case names (default: every case whose repo is given)")
    ap.add_argument("--list", action="store_true", help="list the cases and their arguments")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=20, help="rounds of the hand probe (each times every stage)")
    ap.add_argument("--out", default=None, help="output directory (data, copies, results); default a new temp dir")
    ap.add_argument("--lock", default="/tmp/cpu.lock", help="a lock file held during each run ('' for none)")
    ap.add_argument("--no-probe", action="store_true", help="skip the hand probes")
    ap.add_argument("--markdown", action="store_true", help="print the table of every result saved in --out")
    # internal: run in the case's python
    ap.add_argument("--generate", help=argparse.SUPPRESS)
    ap.add_argument("--where", help=argparse.SUPPRESS)
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        GENERATORS[args.generate][1](args.where)
        return
    if args.probe:
        import torch
        torch.set_num_threads(WORKER_THREADS)
        result = dict(PROBES[args.probe](args.src, args.data, args.rounds), torch_threads=torch.get_num_threads())
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        return
    if args.list:
        for name, c in CASES.items():
            print(f"{name} ({c.library}, {c.python} python): {REPOS[c.repo]} {c.script} {' '.join(c.args)}")
        return
    args.out = args.out or tempfile.mkdtemp(prefix="bench_scale_")
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    names = args.only.split(",") if args.only else [n for n, c in CASES.items() if getattr(args, c.repo)]
    env = dict(os.environ, MPLBACKEND="Agg", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    for name in names:
        case = CASES[name]
        repo = getattr(args, case.repo)
        if not repo:
            print(f"[{name}] skipped: no --{case.repo.replace('_', '-')}")
            continue
        show(run_case(name, case, os.path.abspath(repo), args, env))
    if args.markdown:
        results = [json.load(open(p)) for p in (os.path.join(args.out, "results", f"{n}.json") for n in CASES)
                   if os.path.exists(p)]
        print(markdown(results))


if __name__ == "__main__":
    main()
