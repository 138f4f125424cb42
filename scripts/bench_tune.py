"""--tune against a hand measurement, and on public training scripts.

`planted`: a pipeline whose augment is CPU work several times the step's (both spin on
a thread's CPU time, so they compete for the cores as real compute does), from
num_workers=0. Its best num_workers is measured by hand beside the tool's run: a plain
training loop (a new DataLoader, shuffle, persistent workers, the same step, timed by
the tool's own window rule, visit.time_steps) for each count from 0 to the cores + 1,
in rounds before and after `bisect(tune=True)` on the same pipeline, the order of the
counts alternating; the hand's best is the fewest workers within 5% of the fastest (the
tool's rule for its best: the same speed for fewer resources). The tool's best must be
within one worker of it. The load average before and after is printed: on a shared
machine, a core taken by another program makes every count look alike.

    python scripts/bench_tune.py planted [--max-seconds 90] [--aug-times 3]

`public`: public training scripts on generated data (bench_public_scripts.py's cases
and data, and `imagenet-jpeg`: the ImageNet example over an ImageFolder of noise JPEGs
of 500x375, 2 classes of 256, decoded and augmented as the example does, from `-j 0`),
each run unchanged under

    bisect-pipeline run --tune --patch p.diff --json r.json SCRIPT ARGS

from 0 workers where the case sets them (`-j`, `--workers`), printing the settings
tried, the best with its speed-up, the change (the flag or the diff) and the patched
script measured against the original beside the search's figure.

The `*-photo` cases read an ImageFolder of camera-sized JPEGs (1600x1200, smooth
images with grain, about 550 KB; PIL decodes one in about 24 ms on this CPU), 8
classes of 64, with a small step: decoding is most of the work, so on 2 cores a worker
has something to overlap (on ImageNet-sized images with a CPU step, no setting beat the
scripts' own: the step is the work). Expectation, written before running (hand
figures: 16 decodes ~380 ms a batch against a step of ~100-200 ms): the search finds
1-2 workers at 1.3-2x, and the script's own `-j` is what it says to change.

- `imagenet-photo`: pytorch/examples imagenet/main.py, `-a shufflenet_v2_x0_5 -b 16 -j 0`;
- `tv-photo`: torchvision references/classification/train.py, mobilenet_v3_small, crop
  96, `-b 16 -j 0` (`--vision`);
- `timm-photo`: timm train.py, resnet18 at 64x64, `-b 16 -j 0` (`--timm`);
- `dcgan-photo`: pytorch/examples dcgan/main.py, `--dataset folder`, 64x64, 16 filters,
  `--batchSize 16 --workers 0` (added after timm-photo's search found nothing beyond its
  noise: a third script whose workers come from its flag).

    python scripts/bench_tune.py public --examples /path/to/pytorch/examples --timm /path/to/pytorch-image-models
        [--vision /path/to/vision] [--only imagenet-jpeg,mnist,timm,imagenet-photo,tv-photo,timm-photo,dcgan-photo]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bisect_pipeline import bisect  # noqa: E402
from bisect_pipeline.measure.plan import Plan  # noqa: E402
from bisect_pipeline.testing import Spin  # noqa: E402
from bisect_pipeline.measure.visit import time_steps  # noqa: E402

BATCH = 8
STEP_MS = 12.0


class SpinStep(nn.Module):
    """A model whose forward costs `ms` of this thread's CPU time, then a linear layer."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.spin = Spin(ms)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.spin(x))


class Data(Dataset):
    """256 samples of 16 features; `transform` spins `ms` per sample."""

    def __init__(self, ms: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g)
        self.transform = Spin(ms)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.transform(self.x[i].clone()), self.y[i]


def hand(model: nn.Module, ds: Dataset, workers: int, seconds: float) -> float:
    """ms per batch of a plain loop with `workers` (persistent), timed by the tool's window rule."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                        multiprocessing_context="fork" if workers else None)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def epochs():
        while True:
            yield from loader
    it = epochs()
    m = time_steps(lambda: next(it), step, plan=Plan().for_workers(workers), deadline=time.perf_counter() + seconds,
                   clock=time.perf_counter, prefetch_depth=2 * workers)
    del it, loader
    return 1e3 * sum(w.seconds for w in m.windows) / max(1, sum(w.steps for w in m.windows))


def planted(args) -> None:
    torch.set_num_threads(1)
    cores = len(os.sched_getaffinity(0))
    aug_ms = args.aug_times * STEP_MS / BATCH
    ds, model = Data(aug_ms), SpinStep(STEP_MS)
    counts = list(range(0, cores + 2))
    print(f"{cores} cores; step {STEP_MS:.0f} ms a batch, augment {aug_ms:.2f} ms a sample ({aug_ms * BATCH:.0f} ms a "
          f"batch, {args.aug_times:g}x the step), batch {BATCH}")
    print(f"load average before: {open('/proc/loadavg').read().strip()}")
    measured: dict = {w: [] for w in counts}

    def hand_round(r: int) -> None:
        for w in (counts if r % 2 == 0 else reversed(counts)):
            measured[w].append(hand(model, ds, w, args.hand_seconds))
    for r in range(args.rounds // 2):
        hand_round(r)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=0)
    t0 = time.perf_counter()
    report = bisect(model, loader, device="cpu", max_seconds=args.max_seconds, tune=True)
    took = time.perf_counter() - t0
    for r in range(args.rounds // 2, args.rounds):
        hand_round(r)
    print(f"load average after: {open('/proc/loadavg').read().strip()}")
    ms = {w: statistics.median(v) for w, v in measured.items()}
    fastest = min(ms.values())
    hand_best = min(w for w in counts if ms[w] <= fastest * 1.05)
    print("hand, ms per batch (median of the rounds before and after): "
          + ", ".join(f"w{w} {ms[w]:.1f} ({', '.join(f'{x:.1f}' for x in measured[w])})" for w in counts))
    print(f"hand best: num_workers={hand_best} (fewest within 5% of the fastest, {fastest:.1f} ms)")
    f = report.tune
    print(f"tool: verdict {report.bottleneck}; {len(f.tried)} setting(s) tried in {report.measurements.tune.elapsed_s} s "
          f"(run {took:.0f} s); stopped: {report.measurements.tune.stopped}")
    for x in f.tried:
        o = x.outcome
        print(f"  {x.settings}: {o.status}, {o.speedup}x (+-{(o.spread or 0) * 100:.0f}%), ms {o.ms_per_batch}")
    best = f.best.full["num_workers"] if f.best is not None else 0
    print(f"tool best: num_workers={best}; {f.summary}")
    print(f"within one worker of the hand's best: {'yes' if abs(best - hand_best) <= 1 else 'NO'} "
          f"(tool {best}, hand {hand_best})")


def write_jpegs(root: str, per_class: int = 256, val: int = 16, photo: bool = False, classes: int = 2) -> None:
    """An ImageFolder, train/ and val/: what the ImageNet example reads from DIR. Noise
    JPEGs of 500x375 (what ImageNet's average image is), or with `photo` camera-sized
    ones of 1600x1200: a smooth image (random colours at 1/40 of the size, upscaled) with
    grain, so the file and its decode are a photo's, not noise's."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("val", val)):
        for c in "abcdefghij"[:classes]:
            d = os.path.join(root, split, c)
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                if photo:
                    w, h = 1600, 1200
                    base = Image.fromarray(rng.integers(0, 256, (h // 40, w // 40, 3), dtype=np.uint8))
                    grain = rng.integers(-12, 13, (h, w, 3))
                    pixels = (np.asarray(base.resize((w, h), Image.BICUBIC)).astype(np.int16) + grain).clip(0, 255)
                    image = Image.fromarray(pixels.astype(np.uint8))
                else:
                    image = Image.fromarray(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8))
                image.save(os.path.join(d, f"{i}.jpg"), quality=90)


def public(args) -> None:
    import bench_public_scripts as pub

    roots = {"examples": os.path.abspath(args.examples), "timm": os.path.abspath(args.timm) if args.timm else None,
             "vision": os.path.abspath(args.vision) if args.vision else None}
    out = args.out or tempfile.mkdtemp(prefix="bench_tune_")
    data = os.path.join(out, "data")
    photos = "{data}/photos"
    timm_photo = [photos if prev == "--data-dir" else a for prev, a in zip([None] + pub.TIMM_ARGS, pub.TIMM_ARGS)]
    cases = dict(pub.CASES, **{
        "imagenet-jpeg": pub.Case("examples", ["imagenet"], "imagenet/main.py",
                                  ["{data}/jpegs", "-a", "mobilenet_v3_small", "-b", "16", "-j", "0", "--epochs", "30",
                                   "--print-freq", "100"]),
        "imagenet-photo": pub.Case("examples", ["imagenet"], "imagenet/main.py",
                                   [photos, "-a", "shufflenet_v2_x0_5", "-b", "16", "-j", "0", "--epochs", "30",
                                    "--print-freq", "100"]),
        "tv-photo": pub.Case("vision", ["references/classification"], "references/classification/train.py",
                             ["--data-path", photos, "--model", "mobilenet_v3_small", "--device", "cpu", "-b", "16",
                              "-j", "0", "--epochs", "30", "--print-freq", "100", "--train-crop-size", "96",
                              "--val-resize-size", "112", "--val-crop-size", "96", "--output-dir", "{out}"]),
        "timm-photo": pub.Case("timm", ["train.py"], "train.py", timm_photo + ["--epochs", "30"]),
        "dcgan-photo": pub.Case("examples", ["dcgan"], "dcgan/main.py",
                                ["--dataset", "folder", "--dataroot", photos + "/train", "--workers", "0",
                                 "--batchSize", "16", "--ngf", "16", "--ndf", "16", "--niter", "1000", "--outf",
                                 "{out}"]),
    })
    for name in args.only.split(","):
        case = cases[name]
        if roots.get(case.repo) is None:
            print(f"== {name}: needs --{case.repo}")
            continue
        for kind in case.data:
            pub.make_data(kind, data, roots[case.repo])
        if name == "imagenet-jpeg" and not os.path.isdir(os.path.join(data, "jpegs")):
            write_jpegs(os.path.join(data, "jpegs"))
        if name.endswith("-photo") and not os.path.isfile(os.path.join(data, "photos", ".generated")):
            # 8 classes: the torchvision reference reports top-5 accuracy over the classes found
            write_jpegs(os.path.join(data, "photos"), per_class=64, val=2, photo=True, classes=8)
            open(os.path.join(data, "photos", ".generated"), "w").close()
        cwd = os.path.join(out, name)  # mnist reads ../data
        os.makedirs(os.path.join(cwd, "out"), exist_ok=True)
        script_args = [a.format(data=data, out=os.path.join(cwd, "out"), src=roots[case.repo]) for a in case.args]
        # from 0 workers (-j, --workers): the search has somewhere to go
        script_args = [a if prev not in ("-j", "--workers") else "0" for prev, a in zip([None] + script_args,
                                                                                          script_args)]
        env = dict(os.environ)
        js, diff = os.path.join(cwd, "r.json"), os.path.join(cwd, "p.diff")
        cmd = [sys.executable, "-m", "bisect_pipeline", "run", "--tune", "--patch", diff, "--json", js,
               "--max-seconds", str(args.max_seconds), "--device", "cpu", os.path.join(roots[case.repo], case.script),
               *script_args]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        took = time.perf_counter() - t0
        print(f"== {name}: {' '.join(cmd[3:])}\n   exit {r.returncode} in {took:.0f} s", flush=True)
        if not os.path.exists(js):
            print(r.stderr[-2000:])
            continue
        doc = json.load(open(js))
        t = doc.get("tune") or {}
        print(f"   verdict {doc['bottleneck']}; {t.get('summary')}")
        print(f"   searched: {t.get('why')}; stopped: {t.get('stopped')}")
        for x in t.get("tried", []):
            print(f"   tried {x['settings']}: {x['status']}, {x.get('speedup')}x (+-{(x.get('spread') or 0) * 100:.0f}%)"
                  f", ms {x.get('ms_per_batch')}{', ' + x['reason'] if x.get('reason') else ''}")
        p = t.get("patch") or {}
        print(f"   change: flags {p.get('flags')}, command {p.get('command')}, reason {p.get('reason')}")
        for c in p.get("changes") or ():
            print(f"     - {c['how']}: {c['text']}")
        if p.get("diff"):
            print("     " + p["diff"].replace("\n", "\n     "))
        a = t.get("applied_outcome")
        print(f"   checked after the change: {a}; agrees with the search: {t.get('agrees')}"
              + (f"; not checked: {t.get('applied_reason')}" if t.get("applied_reason") else ""), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("planted")
    p.add_argument("--max-seconds", type=float, default=90.0)
    p.add_argument("--aug-times", type=float, default=3.0, help="augment's CPU time a batch over the step's")
    p.add_argument("--hand-seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2)
    q = sub.add_parser("public")
    q.add_argument("--examples", required=True, help="a checkout of github.com/pytorch/examples")
    q.add_argument("--timm", default=None, help="a checkout of github.com/huggingface/pytorch-image-models (train.py)")
    q.add_argument("--vision", default=None, help="a checkout of github.com/pytorch/vision (references/classification)")
    q.add_argument("--only", default="imagenet-jpeg,mnist,timm")
    q.add_argument("--max-seconds", type=float, default=120.0)
    q.add_argument("--out", default=None)
    args = ap.parse_args()
    planted(args) if args.what == "planted" else public(args)


if __name__ == "__main__":
    main()
