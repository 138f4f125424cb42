"""Hand probes of the stages of pytorch/data's torchdata.nodes ImageNet benchmark
(examples/nodes/imagenet_benchmark.py at 9cbb3e4: IterableWrapper(ImagenetLister) ->
Batcher(16) -> ParallelMapper(ImagenetTransform, 4 threads) -> Prefetcher(2)), to hold
the stage costs `bisect-pipeline run --loader 1` reports for it against (the
bench_public_scripts.py case `nodes-imagenet`).

Each probe is the benchmark's own graph with the stages upstream of one point taken out
by hand, timed the way its loop takes batches (`next(it)`, nothing else), so the
difference of two adjacent probes is one stage's cost per batch:

    full       the graph as the script builds it
    raw        the same graph over the ImagenetLister's dicts cached in a list (no listing)
    collated   a Prefetcher over cached batches (no decode, crop or collate)

    load     = full - raw;  augment (with collate) = raw - collated;  handoff = collated

    python scripts/probe_nodes_imagenet.py --script SRC/examples/nodes/imagenet_benchmark.py \\
        -d DATA/imagefolder/train [--batches 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import statistics
import time


def _module(path: str):
    spec = importlib.util.spec_from_file_location("imagenet_benchmark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def graph(mod, source, batch_size: int, workers: int):
    """The benchmark's graph (its setup(), thread workers, no pinning) over `source`."""
    import torchdata.nodes as tn

    node = tn.Batcher(source, batch_size=batch_size)
    node = tn.ParallelMapper(node, map_fn=mod.ImagenetTransform(), num_workers=workers, method="thread")
    return tn.Loader(tn.Prefetcher(node, prefetch_factor=2))


def ms_per_batch(loader, batches: int, warmup: int = 20) -> float:
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - t0) / batches * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--script", required=True, help="the benchmark script (its classes are imported, not run)")
    ap.add_argument("-d", "--imagenet-dir", required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--num-workers", type=int, default=4)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import torchdata.nodes as tn

    mod = _module(args.script)
    lister = mod.ImagenetLister(args.imagenet_dir)
    dicts = [lister[i] for i in range(len(lister))]
    cached = [b for b, _ in zip(iter(graph(mod, tn.IterableWrapper(dicts), args.batch_size, args.num_workers)),
                                range(8))]

    class Cycle:  # the cached batches, endless, as an iterable the IterableWrapper restarts
        def __iter__(self):
            return itertools.cycle(cached)

    class Listed:  # the lister's dicts, listed once: each a fresh dict (ImagenetTransform adds "img" to it)
        def __iter__(self):
            return (dict(d) for d in itertools.cycle(dicts))

    probes = {
        "full": lambda: graph(mod, tn.IterableWrapper(mod.ImagenetLister(args.imagenet_dir)), args.batch_size,
                              args.num_workers),
        "raw": lambda: graph(mod, tn.IterableWrapper(Listed()), args.batch_size, args.num_workers),
        "collated": lambda: tn.Loader(tn.Prefetcher(tn.IterableWrapper(Cycle()), prefetch_factor=2)),
    }
    times = {name: [] for name in probes}
    for _ in range(args.repeats):  # interleaved: a drifting machine weighs on each alike
        for name, make in probes.items():
            times[name].append(ms_per_batch(make(), args.batches))
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, v in times.items():
        print(f"{name:9s} {med[name]:8.3f} ms/batch  ({', '.join(f'{x:.2f}' for x in v)})")
    print(f"load      {med['full'] - med['raw']:8.3f} ms/batch")
    print(f"augment   {med['raw'] - med['collated']:8.3f} ms/batch (with collate: the batch mapper)")
    print(f"handoff   {med['collated']:8.3f} ms/batch")


if __name__ == "__main__":
    main()
