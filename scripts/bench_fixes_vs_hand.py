"""The pipeline's own fixes (issue 58) measured by the tool, against the same moves
written by hand, on public pipelines over generated data, on this machine's CPU.

For each case the tool runs `--runs` times (`bisect()`, `--max-seconds`): the speed-up
its check measured for each fix (the advice item's `verified`: the full pipeline, yours
against the fix, in A B B A visits), or why it did not. The hand, in the same process
before the tool: the pipeline as written against the same move written here by hand,
in A B B A visits (`--blocks` blocks), each visit a fresh loader over the dataset
consumed as the authors' loop consumes it, `--epochs` whole epochs timed after one
untimed (each epoch pays its workers' start, as in their loop and in the tool's check);
the speed-up is the median of the pairs' ratios (visits taken next to each other), which
a visit slowed by other work on the machine does not move (their geometric mean, the
tool's estimator, is printed beside it). Agreed
when the tool's median is within 15% of the hand's.

Cases (the data: bench_public_pipelines.py's generated MNIST and JPEG folder; a fix is
measured by the tool only where its stage is in question, see from-verdict-to-fix.md):

- mnist: pytorch/examples mnist/main.py (`--examples`, a checkout): its Net, Adadelta
  (lr 1.0), nll_loss, batch 64, shuffled, no workers; MNIST idx files of 6,000 random
  digits; transform ToTensor + Normalize((0.1307,), (0.3081,)). By hand (device_tail):
  PILToTensor in the dataset, the batch scaled (/ 255) and normalized in the step.
- tv-classification: torchvision references/classification/presets.py (`--vision`, a
  checkout): ClassificationPresetTrain(crop_size=224) (the reference's defaults: no
  auto-augment, no random erasing) over an ImageFolder of 256 500x375 JPEGs, batch 32,
  2 workers, shuffled, MobileNetV3-small, SGD. By hand: device_tail, the preset's
  Compose without ConvertImageDtype and Normalize, which the step runs on the batch;
  decode, the folder's loader `decode_jpeg(read_file(path), mode=RGB)` and the preset's
  Compose without PILToTensor.
- dcgan: pytorch/examples dcgan/main.py's `--dataset folder` pipeline (bench_public_pipelines'
  case: ImageFolder, Resize(64), CenterCrop(64), ToTensor, Normalize(0.5), batch 64, 2
  workers; its Generator and Discriminator at ngf = ndf = 16, both stepped): load-bound.
  By hand: device_tail, PILToTensor in the dataset and the scaling and Normalize in the
  step; decode, `decode_jpeg` as the loader and the same transforms on the tensor.

    flock /tmp/cpu.lock python scripts/bench_fixes_vs_hand.py --examples EXAMPLES --vision VISION \\
        --only mnist --runs 3 --out /tmp/fixes-mnist.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time

import torch
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

AGREE = 0.15


# --------------------------------------------------------------------------------------
# The cases: the workload as written, and each fix written by hand (dataset, after)
# --------------------------------------------------------------------------------------


def _module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    saved = sys.argv
    sys.argv = [path]
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.argv = saved
    return mod


def case_mnist(args):
    from torchvision import datasets, transforms

    import bench_public_pipelines
    from bench_public_pipelines import mnist_root

    os.environ["EXAMPLES"] = args.examples
    wl = bench_public_pipelines.case_mnist()[0]
    uint8 = datasets.MNIST(mnist_root(), train=True, download=False,
                           transform=transforms.Compose([transforms.PILToTensor()]))
    normalize = transforms.Normalize((0.1307,), (0.3081,))
    return wl, {"device_tail": (uint8, lambda b: [normalize(b[0].float().div(255)), b[1]])}


def decode_file(path):
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def case_tv(args):
    from torchvision import datasets, transforms

    from bench_public_pipelines import _classifier, _mobilenet, jpeg_root

    presets = _module(os.path.join(args.vision, "references", "classification", "presets.py"), "presets")
    ds = datasets.ImageFolder(jpeg_root(), transform=presets.ClassificationPresetTrain(crop_size=224))
    wl = _classifier(ds, 32, _mobilenet())
    head = presets.ClassificationPresetTrain(crop_size=224)
    *kept, convert, normalize = head.transforms.transforms  # ..., PILToTensor, ConvertImageDtype, Normalize
    head.transforms = transforms.Compose(kept)
    tail = datasets.ImageFolder(jpeg_root(), transform=head)
    tensors = presets.ClassificationPresetTrain(crop_size=224)
    tensors.transforms = transforms.Compose([t for t in tensors.transforms.transforms
                                             if not isinstance(t, transforms.PILToTensor)])
    decoded = datasets.ImageFolder(jpeg_root(), transform=tensors, loader=decode_file)
    return wl, {"device_tail": (tail, lambda b: [normalize(convert(b[0])), b[1]]), "decode": (decoded, None)}


def case_dcgan(args):
    from torchvision import datasets, transforms

    import bench_public_pipelines
    from bench_public_pipelines import jpeg_root

    os.environ["EXAMPLES"] = args.examples
    wl = bench_public_pipelines.case_dcgan()[0]
    normalize = transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    tail = datasets.ImageFolder(jpeg_root(), transform=transforms.Compose([
        transforms.Resize(64), transforms.CenterCrop(64), transforms.PILToTensor()]))
    decoded = datasets.ImageFolder(jpeg_root(), loader=decode_file, transform=transforms.Compose([
        transforms.Resize(64), transforms.CenterCrop(64), transforms.ConvertImageDtype(torch.float32), normalize]))
    return wl, {"device_tail": (tail, lambda b: [normalize(b[0].float().div(255)), b[1]]), "decode": (decoded, None)}


CASES = {"mnist": case_mnist, "tv-classification": case_tv, "dcgan": case_dcgan}


# --------------------------------------------------------------------------------------
# The hand
# --------------------------------------------------------------------------------------


def _step(wl):
    if wl.step is not None:
        return wl.step
    loss_fn = wl.loss_fn or F.cross_entropy
    model, opt = wl.model, wl.optimizer
    model.train()

    def step(batch):
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def _visit(loader, step, after, epochs: int) -> float:
    """Seconds per batch of the loop as written over `epochs` whole epochs (each paying
    its workers' start, as the authors' loop does), after one untimed."""
    n, t0 = 0, None
    for epoch in range(1 + epochs):
        if epoch == 1:
            n, t0 = 0, time.perf_counter()
        for batch in loader:
            step(after(batch) if after is not None else batch)
            n += 1
    return (time.perf_counter() - t0) / n


def hand(wl, moved, blocks: int, epochs: int) -> dict:
    """The hand's speed-up of the move (dataset, after) over the pipeline as written."""
    ld = wl.loader
    step = _step(wl)

    def loader(ds):
        return torch.utils.data.DataLoader(ds, batch_size=ld.batch_size, shuffle=True, num_workers=ld.num_workers,
                                           collate_fn=ld.collate_fn, persistent_workers=ld.persistent_workers)
    dataset, after = moved
    sides = {False: [], True: []}
    for _ in range(blocks):
        for side in (False, True, True, False):
            sides[side].append(_visit(loader(dataset if side else ld.dataset), step, after if side else None, epochs))
    ratios = [a / b for a, b in zip(sides[False], sides[True])]
    return {"speedup": round(statistics.median(ratios), 4), "pairs": len(ratios),
            "geometric_mean": round(math.exp(statistics.fmean(math.log(x) for x in ratios)), 4),
            "ms_per_batch": [round(statistics.median(sides[s]) * 1e3, 2) for s in (False, True)],
            "visits_ms": {side: [round(t * 1e3, 2) for t in sides[k]] for side, k in (("yours", False), ("hand", True))}}


# --------------------------------------------------------------------------------------
# The tool
# --------------------------------------------------------------------------------------


def tool(wl, kinds, max_seconds: float, verify_seconds=None, keep=None) -> dict:
    from bisect_pipeline import bisect

    doc = bisect(workload=wl, max_seconds=max_seconds, verify_seconds=verify_seconds).to_dict()
    if keep:
        with open(keep, "w") as f:
            json.dump(doc, f)
    fixes = {f["kind"]: f for f in ((doc.get("verification") or {}).get("fixes") or [])}
    out = {"bottleneck": doc["bottleneck"]}
    for kind in kinds:
        item = next((a for a in doc.get("advice", []) if a["kind"] == kind), None)
        v = (item or {}).get("verified") or {}
        fix = fixes.get(kind, {})
        out[kind] = {"status": v.get("status") if item else "not offered", "speedup": v.get("speedup"),
                     "low": v.get("low"), "high": v.get("high"), "ms_per_batch": v.get("ms_per_batch"),
                     "reason": v.get("reason") or fix.get("reason") or fix.get("mismatch") or (
                         None if item else f"no item: bottleneck {doc['bottleneck']}, fix {fix.get('status')}"),
                     "matches": fix.get("matches"), "max_difference": fix.get("max_difference")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", default=os.environ.get("EXAMPLES", ""))
    ap.add_argument("--vision", default=os.environ.get("VISION", ""))
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--verify-seconds", type=float, default=None,
                    help="the check's own budget (the tool's default: what the bisection leaves)")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1, help="epochs timed per visit of the hand (after one untimed)")
    ap.add_argument("--no-hand", action="store_true")
    ap.add_argument("--no-tool", action="store_true", help="the hand only (--runs 0)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = []
    for name in args.only.split(","):
        wl, moves = CASES[name](args)
        r = {"case": name, "hand": {} if args.no_hand else {k: hand(wl, m, args.blocks, args.epochs)
                                                            for k, m in moves.items()}, "tool": []}
        print(name, "hand", json.dumps(r["hand"]), flush=True)
        for k in range(0 if args.no_tool else args.runs):
            keep = f"{args.out}.{name}.{k}.json" if args.out else None
            r["tool"].append(tool(CASES[name](args)[0], list(moves), args.max_seconds, args.verify_seconds, keep))
            print(name, "tool", json.dumps(r["tool"][-1]), flush=True)
        for kind in moves:
            got = [t[kind]["speedup"] for t in r["tool"] if t[kind]["speedup"] is not None]
            h = r["hand"].get(kind, {}).get("speedup")
            if got and h:
                med = statistics.median(got)
                r.setdefault("agreement", {})[kind] = {"tool_median": med, "hand": h,
                                                       "within": abs(med / h - 1) <= AGREE}
        print(name, "agreement", json.dumps(r.get("agreement")), flush=True)
        results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
