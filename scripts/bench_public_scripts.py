"""Public training scripts run unchanged under `bisect-pipeline run`, each against an
entry written for the same pipeline (`--entry`): same stage named (or none), costs
within noise, and a report that agrees with itself (../shared/tools/check-report).

The scripts come from a checkout of pytorch/examples (not in this repository): pass its
path. On generated data, on the CPU:

- mnist/main.py: torchvision MNIST (its idx files generated here, 6,000 + 1,000 images)
  with ToTensor + Normalize, batch 64, Adadelta; `--epochs 30`;
- dcgan/main.py: `--dataset fake` (FakeData 64x64, ToTensor + Normalize), two
  optimizers stepped per batch, module-level code (no main function);
- imagenet/main.py: `--dummy` (FakeData 224x224, ToTensor), ResNet-18, batch 16,
  2 workers: a heavy step (about a second on 2 cores);
- the same two with lighter steps (`dcgan-small`: `--ngf 16 --ndf 16`; `imagenet-small`:
  MobileNetV3-small, batch 32), which a 90 s budget can decide.

    python scripts/bench_public_scripts.py --examples /path/to/pytorch/examples
    python scripts/bench_public_scripts.py --examples ... --only mnist --max-seconds 60
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch

HERE = os.path.abspath(__file__)
CHECK = os.path.join(os.path.dirname(HERE), "..", "..", "shared", "tools", "check-report")

CASES = {  # name: the script, its arguments, the entry for the same pipeline (a function below)
    "mnist": ("mnist/main.py", ["--epochs", "30"], "mnist"),
    "dcgan": ("dcgan/main.py", ["--dataset", "fake", "--niter", "1000", "--workers", "2", "--outf", "out"], "dcgan"),
    "dcgan-small": ("dcgan/main.py", ["--dataset", "fake", "--niter", "1000", "--workers", "2", "--outf", "out",
                                      "--ngf", "16", "--ndf", "16"], "dcgan_small"),
    "imagenet": ("imagenet/main.py", ["--dummy", "-a", "resnet18", "-b", "16", "-j", "2", "--epochs", "30",
                                      "--print-freq", "20"], "imagenet"),
    "imagenet-small": ("imagenet/main.py", ["--dummy", "-a", "mobilenet_v3_small", "-b", "32", "-j", "2",
                                            "--epochs", "30", "--print-freq", "20"], "imagenet_small"),
}


# --------------------------------------------------------------------------------------
# Entries for the same pipelines (bisect-pipeline --entry THIS_FILE:NAME)
# --------------------------------------------------------------------------------------


def _example(path: str, name: str):
    """A module of the examples checkout, imported without running its main."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.environ["EXAMPLES"], path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def mnist():
    from torchvision import datasets, transforms

    from bisect_pipeline import Workload

    net = _example("mnist/main.py", "mnist_main").Net
    torch.manual_seed(1)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    dataset = datasets.MNIST(os.environ["MNIST_ROOT"], train=True, download=False, transform=transform)
    model = net()
    return Workload(model=model, loader=torch.utils.data.DataLoader(dataset, batch_size=64),
                    optimizer=torch.optim.Adadelta(model.parameters(), lr=1.0),
                    loss_fn=torch.nn.functional.nll_loss)


def imagenet(arch: str = "resnet18", batch_size: int = 16):
    import torchvision
    from torchvision import datasets, transforms

    from bisect_pipeline import Workload

    torch.manual_seed(0)
    model = torchvision.models.__dict__[arch]()
    dataset = datasets.FakeData(1281167, (3, 224, 224), 1000, transforms.ToTensor())
    return Workload(model=model, loader=torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                                                     num_workers=2),
                    optimizer=torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4))


def imagenet_small():
    return imagenet("mobilenet_v3_small", 32)


def dcgan(*options: str):
    """The loop body of dcgan/main.py as a step: the discriminator's update on real and
    fake images, then the generator's, with the example's own networks (`options`: the
    script's own, e.g. their widths)."""
    import torchvision.datasets as dset
    import torchvision.transforms as transforms
    from torch import nn

    from bisect_pipeline import Workload

    sys.argv = ["main.py", "--dataset", "fake", "--outf", tempfile.mkdtemp(), *options]
    cwd = os.getcwd()
    os.chdir(tempfile.mkdtemp())
    try:  # its networks are defined at module level, beside its training loop: run up to there
        src = open(os.path.join(os.environ["EXAMPLES"], "dcgan/main.py")).read()
        head = src[:src.index("criterion = nn.BCELoss()")]
        ns: dict = {"__name__": "dcgan_entry"}
        exec(compile(head, "dcgan/main.py", "exec"), ns)
    finally:
        os.chdir(cwd)
    net_g, net_d, nz = ns["netG"], ns["netD"], ns["nz"]
    criterion = nn.BCELoss()
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(net_g.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def step(batch):
        real = batch[0]
        b = real.size(0)
        net_d.zero_grad()
        label = torch.full((b,), 1.0)
        criterion(net_d(real), label).backward()
        fake = net_g(torch.randn(b, nz, 1, 1))
        label.fill_(0.0)
        criterion(net_d(fake.detach()), label).backward()
        opt_d.step()
        net_g.zero_grad()
        label.fill_(1.0)
        criterion(net_d(fake), label).backward()
        opt_g.step()

    dataset = dset.FakeData(image_size=(3, 64, 64), transform=transforms.Compose([
        transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]))
    return Workload(model=nn.ModuleList([net_g, net_d]),
                    loader=torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2),
                    step=step)


def dcgan_small():
    return dcgan("--ngf", "16", "--ndf", "16")


# --------------------------------------------------------------------------------------
# Running them
# --------------------------------------------------------------------------------------


def write_mnist(root: str, n_train: int = 6000, n_test: int = 1000) -> None:
    """torchvision's MNIST idx files, random digits: what the example reads from ../data."""
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g)
        labels = torch.randint(0, 10, (n,), dtype=torch.uint8, generator=g)
        with open(os.path.join(raw, f"{prefix}-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.numpy().tobytes())
        with open(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 2049, n) + labels.numpy().tobytes())


def summary(doc: dict) -> str:
    costs = ", ".join(f"{s['stage']} {s['ms_per_batch']:.1f}{'*' if s['significant'] else ''}"
                      for s in doc["stages"] if s["status"] == "ok")
    full = next(p for p in doc["points"] if p["point"] == "full")
    return (f"{doc['bottleneck']}; full {full['ms_per_batch']} ms/batch; stages (ms/batch, * real): {costs}; "
            f"settled {doc['run'].get('settled')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", required=True, help="a checkout of github.com/pytorch/examples")
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--max-seconds", type=float, default=90.0)
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="bench_public_"))
    args = ap.parse_args()
    examples = os.path.abspath(args.examples)
    data = os.path.join(args.out, "data")
    write_mnist(data)
    env = dict(os.environ, EXAMPLES=examples, MNIST_ROOT=data)
    for name in args.only.split(","):
        path, script_args, entry = CASES[name]
        cwd = os.path.join(args.out, name)  # mnist reads ../data
        os.makedirs(os.path.join(cwd, "out"), exist_ok=True)
        loop_json, entry_json = os.path.join(args.out, f"{name}-run.json"), os.path.join(args.out, f"{name}-entry.json")
        common = ["--max-seconds", str(args.max_seconds), "--device", "cpu", "-q"]
        r = subprocess.run([sys.executable, "-m", "bisect_pipeline", "run", "--json", loop_json, *common,
                            os.path.join(examples, path), *script_args], cwd=cwd, env=env, capture_output=True,
                           text=True)
        e = subprocess.run([sys.executable, "-m", "bisect_pipeline", "--entry", f"{HERE}:{entry}", "--json", entry_json,
                            *common], cwd=cwd, env=env, capture_output=True, text=True)
        for label, proc, out in (("run  ", r, loop_json), ("entry", e, entry_json)):
            if not os.path.exists(out):
                print(f"{name} {label}: exit {proc.returncode}, no report: {proc.stderr[-800:]}")
                continue
            doc = json.load(open(out))
            check = subprocess.run([CHECK, out], capture_output=True, text=True) if os.path.exists(CHECK) else None
            print(f"{name} {label}: exit {proc.returncode}; {summary(doc)}; "
                  f"{'check-report: ' + check.stdout.strip() if check else ''}", flush=True)


if __name__ == "__main__":
    main()
