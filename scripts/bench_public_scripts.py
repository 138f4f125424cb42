"""Public training scripts run unchanged under `bisect-pipeline run`, on generated data,
on the CPU: for each, the exit status, the verdict, the named stage's cost, the wall
time, what ../shared/tools/check-report says of the JSON, and how many reports were
printed on stderr (lines starting `bisect-pipeline: device `; must be 1). The
pytorch/examples cases are also run against an entry written for the same pipeline
(`--entry`): same stage named (or none), costs within noise.

No third-party code is in this repository. Give the checkouts (a work tree, or a bare
git directory: then HEAD is used); the files a case needs are copied (or extracted with
`git archive HEAD`) into the output directory and run from there, so data that a script
reads relative to itself is generated beside it and nothing is written into a checkout.

    git clone https://github.com/pytorch/examples
    git clone https://github.com/huggingface/pytorch-image-models      # timm's train.py
    git clone https://github.com/pytorch/vision                        # references/
    git clone https://github.com/Project-MONAI/tutorials
    git clone https://github.com/Lightning-AI/pytorch-lightning        # examples/
    git clone https://github.com/huggingface/diffusers                 # examples/
    git clone https://github.com/pytorch/data                          # examples/nodes (torchdata)
    pip install diffusers tensorboard "jsonargparse[signatures]" pycocotools

    python scripts/bench_public_scripts.py --list
    python scripts/bench_public_scripts.py --examples examples --timm pytorch-image-models \\
        --vision vision --monai tutorials --lightning pytorch-lightning --diffusers diffusers \\
        --out /tmp/bench [--only mnist,timm] [--max-seconds 60]
    python scripts/bench_public_scripts.py --out /tmp/bench --markdown     # the table so far

A case whose repository is not given is skipped. Each script run (and each entry run)
holds the lock file given by `--lock` (default /tmp/cpu.lock, `fcntl.flock`) for its
duration only, so machines shared by several people can loop over `--only NAME`. Each
case's result is saved as OUT/results/NAME.json; `--markdown` renders every saved result.
A run still going `--max-seconds` + the case's allowance after its start is killed (a
hang: reported as such).

The cases (`--list` for their arguments; data sizes are small, written under OUT/data):

- mnist (pytorch/examples mnist/main.py): torchvision MNIST idx files generated (6,000 +
  1,000 random digits), ToTensor + Normalize, batch 64, Adadelta, `--epochs 30`;
  `mnist-keep`: the same with `--keep-training --epochs 15`; vae, siamese, mnist-rnn
  (pytorch/examples vae/, siamese_network/, mnist_rnn/ main.py, `--epochs 30`) over the
  same generated digits;
- dcgan, dcgan-small, imagenet, imagenet-small (pytorch/examples): `--dataset fake` and
  `--dummy` (FakeData), 2 workers; see their entries below;
- timm (timm train.py): an ImageFolder of 300 + 50 JPEGs (10 classes, 160x120),
  resnet18 at 64 px, batch 16, 2 persistent workers (timm's loader), validation every
  epoch; `timm-amp`: `--amp --amp-dtype bfloat16` (autocast on the CPU in its loop);
  `timm-multi-epochs`: `--use-multi-epochs-loader` (timm's MultiEpochsDataLoader, a
  DataLoader subclass); `timm-keep`: `--keep-training --epochs 12`;
- tv-classification, tv-segmentation, tv-detection (torchvision references/*/train.py,
  `--vision`): the same ImageFolder (mobilenet_v3_small); a VOC2012-like tree of 80 + 20
  JPEGs with palette PNG masks (lraspp_mobilenet_v3_large); a COCO-like tree of 80 + 20
  JPEGs with one instances json per split (fasterrcnn_mobilenet_v3_large_320_fpn, needs
  pycocotools); 2 workers, not persistent, in train and test loaders;
- monai-unet2d (MONAI tutorials 2d_segmentation/torch/unet_training_dict.py): makes its
  own synthetic data; `monai.data.DataLoader` (a DataLoader subclass), 4 workers not
  persistent for training and validation; needs tensorboard. Its training is fixed at
  10 epochs of 10 batches: it may end before a verdict (exit 1, said first in the report);
- fabric-mnist (Lightning examples/fabric/image_classifier/train_fabric.py): MNIST idx
  files generated where it reads them (its checkout's ../Datasets); `fabric-mnist-keep`;
- fabric-lm (Lightning examples/fabric/language_model/train.py): Lightning's demo
  Transformer on a generated ./data/wikitext-2.txt (400,000 words from a vocabulary of
  2,000; the demo downloads only when the file is missing), batch 20 of 35 tokens;
- pl-imagenet (Lightning examples/pytorch/domain_templates/imagenet.py, LightningCLI,
  `Trainer.fit`): the ImageFolder above, resnet18, batch 8, 2 workers not persistent,
  validation every epoch; needs jsonargparse;
- diffusers-ddpm (diffusers examples/unconditional_image_generation/train_unconditional.py,
  accelerate, `DataLoaderShard`): a 200-image folder of 48x48 JPEGs through `datasets`'
  imagefolder, a small UNet2DModel config generated with `save_config`, 2 workers not
  persistent; `diffusers-bf16`: `--mixed_precision bf16` (accelerate's autocast on the CPU);
- nodes-imagenet (pytorch/data examples/nodes/imagenet_benchmark.py at 9cbb3e4, `--torchdata`):
  a torchdata.nodes Loader (IterableWrapper -> Batcher -> ParallelMapper of 4 threads ->
  Prefetcher) over the ImageFolder's train split, batch 16; it takes no optimizer step,
  so it runs with `--loader 1`; `nodes-imagenet-silent`: without, it must end within
  --max-seconds with the paragraph naming the Loader (exit 1). Hand probes of its
  stages: scripts/probe_nodes_imagenet.py.

Not cases: Lightning's domain_templates/semantic_segmentation.py (its KITTI dataset calls
`torch.tensor` on a PIL image, which torch 2.x rejects: the script fails on its own);
Lightning's pytorch/basics scripts (they split MNIST 55,000 / 5,000: 60,000 images).

Entries for the pytorch/examples cases (`bisect-pipeline --entry THIS_FILE:NAME`):

- mnist: the example's Net, the same MNIST pipeline, Adadelta, nll_loss;
- dcgan(_small): the loop body of dcgan/main.py as a step (both optimizers);
- imagenet(_small): ResNet-18 / MobileNetV3-small over FakeData with 2 workers.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.abspath(__file__)
CHECK = os.path.join(os.path.dirname(HERE), "..", "..", "shared", "tools", "check-report")
REPORT_LINE = "bisect-pipeline: device "


# --------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------

class Case:
    """One script run: `repo` names the checkout option, `files` what to copy from it,
    `script` the path to run (from the copy), `args` its arguments ({data}, {src}, {out}
    filled in), `data` the generators it needs, `entry` the entry for the same pipeline."""

    def __init__(self, repo, files, script, args, data=(), entry=None, keep=False, workers="",
                 allowance=150.0, cwd=None, what="", rev=None, tool=()):
        self.repo, self.files, self.script, self.args = repo, files, script, args
        self.data, self.entry, self.keep, self.workers = tuple(data), entry, keep, workers
        self.allowance, self.cwd, self.what = allowance, cwd, what
        self.rev, self.tool = rev, tuple(tool)  # a commit of the checkout instead of HEAD; the tool's own options


IMAGEFOLDER = "{data}/imagefolder"
NODES_REV = "9cbb3e4ee94950f6b2e791fee3bdff6384fa7c5c"  # pytorch/data, 2024-12-12 (#1391)
TIMM_ARGS = ["--data-dir", IMAGEFOLDER, "--train-split", "train", "--val-split", "val", "--model", "resnet18",
             "--num-classes", "10", "--input-size", "3", "64", "64", "-b", "16", "-j", "2", "--device", "cpu",
             "--log-interval", "5", "--output", "{out}", "--checkpoint-hist", "1"]
DIFFUSERS_ARGS = ["--train_data_dir", "{data}/pixels", "--resolution", "32", "--model_config_name_or_path",
                  "{data}/unet", "--train_batch_size", "16", "--dataloader_num_workers", "2",
                  "--save_images_epochs", "1000", "--save_model_epochs", "1000", "--ddpm_num_inference_steps", "2",
                  "--output_dir", "{out}", "--random_flip", "--checkpointing_steps", "100000"]

CASES = {
    # pytorch/examples
    "mnist": Case("examples", ["mnist"], "mnist/main.py", ["--epochs", "30"], ["mnist"], entry="mnist",
                  workers="none (train and test loaders in process)"),
    "mnist-keep": Case("examples", ["mnist"], "mnist/main.py", ["--epochs", "15"], ["mnist"], keep=True,
                       allowance=400, workers="none"),
    "vae": Case("examples", ["vae"], "vae/main.py", ["--epochs", "30"], ["mnist"], workers="none",
                what="MNIST, ToTensor only, batch 128"),
    "siamese": Case("examples", ["siamese_network"], "siamese_network/main.py", ["--epochs", "30"], ["mnist"],
                    workers="none", what="a Dataset of MNIST pairs drawn in __getitem__"),
    "mnist-rnn": Case("examples", ["mnist_rnn"], "mnist_rnn/main.py", ["--epochs", "30"], ["mnist"], workers="none",
                      what="an LSTM over MNIST rows"),
    "dcgan": Case("examples", ["dcgan"], "dcgan/main.py",
                  ["--dataset", "fake", "--niter", "1000", "--workers", "2", "--outf", "{out}"], entry="dcgan",
                  workers="2, not persistent (one loader)"),
    "dcgan-small": Case("examples", ["dcgan"], "dcgan/main.py",
                        ["--dataset", "fake", "--niter", "1000", "--workers", "2", "--outf", "{out}",
                         "--ngf", "16", "--ndf", "16"], entry="dcgan_small", workers="2, not persistent"),
    "imagenet": Case("examples", ["imagenet"], "imagenet/main.py",
                     ["--dummy", "-a", "resnet18", "-b", "16", "-j", "2", "--epochs", "30", "--print-freq", "20"],
                     entry="imagenet", workers="2, not persistent (train and val)"),
    "imagenet-small": Case("examples", ["imagenet"], "imagenet/main.py",
                           ["--dummy", "-a", "mobilenet_v3_small", "-b", "32", "-j", "2", "--epochs", "30",
                            "--print-freq", "20"], entry="imagenet_small", workers="2, not persistent"),
    # timm
    "timm": Case("timm", ["train.py"], "train.py", TIMM_ARGS + ["--epochs", "50"], ["imagefolder"],
                 workers="2, persistent (timm's create_loader), train and eval"),
    "timm-amp": Case("timm", ["train.py"], "train.py", TIMM_ARGS + ["--epochs", "50", "--amp", "--amp-dtype",
                                                                   "bfloat16"], ["imagefolder"],
                     workers="2, persistent", what="AMP: bfloat16 autocast in its loop"),
    "timm-multi-epochs": Case("timm", ["train.py"], "train.py", TIMM_ARGS + ["--epochs", "50",
                                                                            "--use-multi-epochs-loader"],
                              ["imagefolder"], workers="2 (timm's MultiEpochsDataLoader)",
                              what="DataLoader subclass"),
    "timm-keep": Case("timm", ["train.py"], "train.py", TIMM_ARGS + ["--epochs", "12"], ["imagefolder"], keep=True,
                      allowance=400, workers="2, persistent"),
    # torchvision references
    "tv-classification": Case("vision", ["references/classification"], "references/classification/train.py",
                              ["--data-path", IMAGEFOLDER, "--model", "mobilenet_v3_small", "--device", "cpu",
                               "-b", "16", "-j", "2", "--epochs", "50", "--print-freq", "5",
                               "--train-crop-size", "96", "--val-resize-size", "112", "--val-crop-size", "96",
                               "--output-dir", "{out}"], ["imagefolder"],
                              workers="2, not persistent (train and test)"),
    "tv-segmentation": Case("vision", ["references/segmentation"], "references/segmentation/train.py",
                            ["--data-path", "{data}/voc", "--dataset", "voc", "--model", "lraspp_mobilenet_v3_large",
                             "--device", "cpu", "-b", "4", "-j", "2", "--epochs", "50", "--print-freq", "5",
                             "--output-dir", "{out}"], ["voc"], workers="2, not persistent (train and test)"),
    "tv-detection": Case("vision", ["references/detection"], "references/detection/train.py",
                         ["--data-path", "{data}/coco", "--dataset", "coco", "--model",
                          "fasterrcnn_mobilenet_v3_large_320_fpn", "--device", "cpu", "-b", "4", "-j", "2",
                          "--epochs", "50", "--print-freq", "5", "--output-dir", "{out}", "--aspect-ratio-group-factor",
                          "-1"], ["coco"], workers="2, not persistent (train and test)"),
    # MONAI
    "monai-unet2d": Case("monai", ["2d_segmentation/torch"], "2d_segmentation/torch/unet_training_dict.py", [],
                         workers="4, not persistent (check, train, val); monai.data.DataLoader",
                         what="DataLoader subclass"),
    # Lightning
    "fabric-mnist": Case("lightning", ["examples/fabric/image_classifier"],
                         "examples/fabric/image_classifier/train_fabric.py", ["--epochs", "30"], ["mnist_lightning"],
                         workers="none"),
    "fabric-mnist-keep": Case("lightning", ["examples/fabric/image_classifier"],
                              "examples/fabric/image_classifier/train_fabric.py", ["--epochs", "12"],
                              ["mnist_lightning"], keep=True, allowance=400, workers="none"),
    "pl-imagenet": Case("lightning", ["examples/pytorch/domain_templates"],
                        "examples/pytorch/domain_templates/imagenet.py",
                        ["fit", "--model.data_path", IMAGEFOLDER, "--model.batch_size", "8", "--model.workers", "2",
                         "--trainer.accelerator", "cpu", "--trainer.max_epochs", "50",
                         "--trainer.default_root_dir", "{out}"], ["imagefolder"],
                        workers="2, not persistent (train and val)", what="Lightning Trainer.fit"),
    "fabric-lm": Case("lightning", ["examples/fabric/language_model"], "examples/fabric/language_model/train.py", [],
                      ["wikitext"], cwd="run", workers="none",
                      what="text: Lightning's demo Transformer on WikiText2's layout (./data/wikitext-2.txt)"),
    # torchdata.nodes: pytorch/data's ImageNet benchmark at the commit whose graph is
    # IterableWrapper -> Batcher -> ParallelMapper(4 threads) -> Prefetcher (HEAD imports spdl). It
    # loads and takes no optimizer step: measured with --loader 1 (its loop the step);
    # without, the tool says what the loop iterates within --max-seconds and exits 1.
    "nodes-imagenet": Case("torchdata", ["examples/nodes"], "examples/nodes/imagenet_benchmark.py",
                           ["-d", IMAGEFOLDER + "/train", "--max-steps", "100000000", "--max-duration", "100000"],
                           ["imagefolder"], workers="4 threads (ParallelMapper), Prefetcher(2)", rev=NODES_REV,
                           tool=["--loader", "1"], what="torchdata.nodes Loader, no optimizer: --loader 1"),
    "nodes-imagenet-silent": Case("torchdata", ["examples/nodes"], "examples/nodes/imagenet_benchmark.py",
                                  ["-d", IMAGEFOLDER + "/train", "--max-steps", "100000000", "--max-duration",
                                   "100000"], ["imagefolder"], workers="4 threads", rev=NODES_REV, allowance=30,
                                  what="never silent: no optimizer step, exit 1 naming the Loader"),
    # Hugging Face diffusers (accelerate)
    "diffusers-ddpm": Case("diffusers", ["examples/unconditional_image_generation"],
                           "examples/unconditional_image_generation/train_unconditional.py",
                           DIFFUSERS_ARGS + ["--num_epochs", "100"], ["pixels", "unet"],
                           workers="2, not persistent; accelerate's DataLoaderShard"),
    "diffusers-bf16": Case("diffusers", ["examples/unconditional_image_generation"],
                           "examples/unconditional_image_generation/train_unconditional.py",
                           DIFFUSERS_ARGS + ["--num_epochs", "100", "--mixed_precision", "bf16"], ["pixels", "unet"],
                           workers="2, not persistent", what="AMP: accelerate bf16 autocast"),
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

    argv, cwd = sys.argv, os.getcwd()
    sys.argv = ["main.py", "--dataset", "fake", "--outf", tempfile.mkdtemp(), *options]
    os.chdir(tempfile.mkdtemp())
    try:  # its networks are defined at module level, beside its training loop: run up to there
        src = open(os.path.join(os.environ["EXAMPLES"], "dcgan/main.py")).read()
        head = src[:src.index("criterion = nn.BCELoss()")]
        ns: dict = {"__name__": "dcgan_entry"}
        exec(compile(head, "dcgan/main.py", "exec"), ns)
    finally:  # the caller's arguments and directory, as they were
        sys.argv = argv
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
# Generated data
# --------------------------------------------------------------------------------------


def write_mnist(root: str, n_train: int = 6000, n_test: int = 1000) -> None:
    """torchvision's MNIST idx files, random digits: what the examples read (ROOT/MNIST/raw)."""
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


def _picture(rng: random.Random, size, mode="RGB"):
    """A smooth random picture (coarse noise scaled up), so that JPEG sizes and decode
    times are those of photographs rather than of noise."""
    import numpy as np
    from PIL import Image

    w, h = size
    channels = 3 if mode == "RGB" else 1
    a = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (max(2, h // 8), max(2, w // 8), channels),
                                                             dtype=np.uint8)
    img = Image.fromarray(a[..., 0] if channels == 1 else a, "L" if channels == 1 else "RGB")
    return img.resize((w, h), Image.BILINEAR)


def write_imagefolder(root: str, classes: int = 10, train: int = 30, val: int = 5, size=(160, 120)) -> None:
    """ROOT/{train,val}/class_K/*.jpg: what ImageFolder, timm and the references read."""
    rng = random.Random(0)
    for split, n in (("train", train), ("val", val)):
        for k in range(classes):
            d = os.path.join(root, split, f"class_{k}")
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                _picture(rng, size).save(os.path.join(d, f"{i:04d}.jpg"), quality=90)


def write_pixels(root: str, n: int = 200, size=(48, 48)) -> None:
    """A flat folder of small JPEGs for `datasets`' imagefolder builder."""
    rng = random.Random(1)
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        _picture(rng, size).save(os.path.join(root, f"{i:04d}.jpg"), quality=90)


def write_unet_config(root: str) -> None:
    """A small UNet2DModel config (diffusers' save_config), for --model_config_name_or_path."""
    from diffusers import UNet2DModel

    UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64, 64),
                down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D")).save_config(root)


def write_voc(root: str, train: int = 80, val: int = 20, size=(200, 150)) -> None:
    """ROOT/VOCdevkit/VOC2012: JPEGImages, SegmentationClass (palette PNGs, 21 classes and
    255 borders), ImageSets/Segmentation/{train,val}.txt: what VOCSegmentation reads."""
    import numpy as np
    from PIL import Image

    base = os.path.join(root, "VOCdevkit", "VOC2012")
    for d in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        os.makedirs(os.path.join(base, d), exist_ok=True)
    rng = random.Random(2)
    palette = [v for i in range(256) for v in ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)]
    names = {"train": [], "val": []}
    for split, n in (("train", train), ("val", val)):
        for i in range(n):
            name = f"2012_{split}_{i:04d}"
            names[split].append(name)
            _picture(rng, size).save(os.path.join(base, "JPEGImages", name + ".jpg"), quality=90)
            mask = np.zeros((size[1], size[0]), np.uint8)
            for _ in range(3):
                x0, y0 = rng.randrange(size[0] - 40), rng.randrange(size[1] - 40)
                w, h = rng.randrange(20, 40), rng.randrange(20, 40)
                mask[y0:y0 + h, x0:x0 + w] = rng.randrange(1, 21)
                mask[y0, x0:x0 + w] = 255
            m = Image.fromarray(mask, "P")
            m.putpalette(palette)
            m.save(os.path.join(base, "SegmentationClass", name + ".png"))
    for split in names:
        with open(os.path.join(base, "ImageSets", "Segmentation", split + ".txt"), "w") as f:
            f.write("\n".join(names[split]) + "\n")


def write_coco(root: str, train: int = 80, val: int = 20, size=(200, 150), categories: int = 5) -> None:
    """ROOT/{train2017,val2017}/*.jpg and ROOT/annotations/instances_{train,val}2017.json:
    a few boxes (with polygon masks) per image, as torchvision's detection reference reads."""
    rng = random.Random(3)
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    cats = [{"id": k + 1, "name": f"thing{k + 1}", "supercategory": "thing"} for k in range(categories)]
    ann_id = 1
    for split, n in (("train2017", train), ("val2017", val)):
        os.makedirs(os.path.join(root, split), exist_ok=True)
        images, anns = [], []
        for i in range(n):
            image_id = i + 1
            name = f"{image_id:012d}.jpg"
            _picture(rng, size).save(os.path.join(root, split, name), quality=90)
            images.append({"id": image_id, "file_name": name, "width": size[0], "height": size[1]})
            for _ in range(rng.randrange(1, 4)):
                w, h = rng.randrange(20, 80), rng.randrange(20, 60)
                x, y = rng.randrange(0, size[0] - w), rng.randrange(0, size[1] - h)
                anns.append({"id": ann_id, "image_id": image_id, "category_id": rng.randrange(1, categories + 1),
                             "bbox": [x, y, w, h], "area": float(w * h), "iscrowd": 0,
                             "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]})
                ann_id += 1
        with open(os.path.join(root, "annotations", f"instances_{split}.json"), "w") as f:
            json.dump({"images": images, "annotations": anns, "categories": cats}, f)


def write_wikitext(root: str, words: int = 400_000, vocabulary: int = 2000) -> None:
    """ROOT/wikitext-2.txt: lines of words drawn from a Zipf-like vocabulary, in the
    place and shape Lightning's WikiText2 demo reads (it downloads only when missing)."""
    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(vocabulary)]
    weights = [1.0 / (i + 1) for i in range(vocabulary)]
    with open(os.path.join(root, "wikitext-2.txt"), "w") as f:
        left = words
        while left > 0:
            n = min(left, rng.randrange(5, 40))
            f.write(" " + " ".join(rng.choices(vocab, weights, k=n)) + " . \n")
            left -= n


def make_data(kind: str, data: str, src: str) -> None:
    """Generate one kind of data once (a marker file says it is there)."""
    where = {"mnist": data, "mnist_lightning": os.path.join(src, "lightning", "Datasets"),
             "imagefolder": os.path.join(data, "imagefolder"), "pixels": os.path.join(data, "pixels"),
             "unet": os.path.join(data, "unet"), "voc": os.path.join(data, "voc"),
             "coco": os.path.join(data, "coco"), "wikitext": data}[kind]
    marker = os.path.join(where, f".generated-{kind}")
    if os.path.exists(marker):
        return
    os.makedirs(where, exist_ok=True)
    {"mnist": write_mnist, "mnist_lightning": write_mnist, "imagefolder": write_imagefolder,
     "pixels": write_pixels, "unet": write_unet_config, "voc": write_voc, "coco": write_coco,
     "wikitext": write_wikitext}[kind](where)
    open(marker, "w").close()


# --------------------------------------------------------------------------------------
# Running them
# --------------------------------------------------------------------------------------


def _git_dir(path: str):
    """`path` as a bare git directory, or None for a work tree."""
    if os.path.isdir(os.path.join(path, "objects")) and os.path.exists(os.path.join(path, "HEAD")):
        return path
    return None


def revision(path: str) -> str:
    git = _git_dir(path)
    cmd = ["git", "--git-dir", git] if git else ["git", "-C", path]
    r = subprocess.run(cmd + ["rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip()[:12] if r.returncode == 0 else "unknown (not a git checkout)"


def copy_files(repo: str, files, dest: str, rev: str = None) -> None:
    """The case's files from a checkout (copied) or a bare git dir (`git archive HEAD`);
    with `rev`, `git archive REV` from either."""
    os.makedirs(dest, exist_ok=True)
    git = _git_dir(repo)
    for f in files:
        if os.path.exists(os.path.join(dest, f)):
            continue
        if git or rev:
            where = ["--git-dir", git] if git else ["-C", repo]
            archive = subprocess.run(["git", *where, "archive", rev or "HEAD", f], capture_output=True)
            subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
            if not os.path.exists(os.path.join(dest, f)):
                raise SystemExit(f"{f} not in {repo}: {archive.stderr.decode()[-400:]}")
        elif os.path.isdir(os.path.join(repo, f)):
            shutil.copytree(os.path.join(repo, f), os.path.join(dest, f))
        else:
            os.makedirs(os.path.dirname(os.path.join(dest, f)) or dest, exist_ok=True)
            shutil.copy(os.path.join(repo, f), os.path.join(dest, f))


@contextlib.contextmanager
def cpu_lock(path: str):
    """Hold the machine's shared lock for one run (nothing when `path` is empty)."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # say so: under `flock PATH` this process would wait on its own parent
            print(f"waiting for {path}, held by another process (pass --lock '' when this run already holds it, "
                  "as under `flock`)", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_process(cmd, cwd, env, limit, lock):
    """Run `cmd` in its own process group under the lock; kill the group at `limit` s.
    Returns (exit status or 'killed', stdout, stderr, wall seconds)."""
    with cpu_lock(lock):
        t0 = time.monotonic()
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
            try:
                rc = p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                rc = f"killed at {limit:.0f} s"
            with contextlib.suppress(ProcessLookupError):  # workers the script left behind
                os.killpg(p.pid, signal.SIGKILL)
            wall = time.monotonic() - t0
            out.seek(0)
            err.seek(0)
            return rc, out.read(), err.read(), wall


def named_cost(doc: dict) -> str:
    """The verdict's stage and its cost; else the costliest stage measured, with whether
    it is real (beyond the noise)."""
    stages = {s["stage"]: s for s in doc.get("stages", []) if s.get("status") == "ok"}
    b = doc.get("bottleneck")
    if b in stages:
        s = stages[b]
        return f"{b} {s['ms_per_batch']:.1f} ± {s.get('noise_ms') or 0:.1f} ms/batch"
    if stages:
        top = max(stages.values(), key=lambda s: s["ms_per_batch"])
        return (f"(largest: {top['stage']} {top['ms_per_batch']:.1f} ± {top.get('noise_ms') or 0:.1f} ms/batch, "
                f"{'real' if top.get('significant') else 'within noise'})")
    return "-"


def last_line(text: str, skip_tool: bool = False) -> str:
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    if skip_tool:
        lines = [ln for ln in lines if not ln.startswith("bisect-pipeline")]
    return lines[-1][:200] if lines else ""


def check_report(path: str) -> str:
    if not os.path.exists(CHECK):
        return "check-report not found"
    r = subprocess.run([sys.executable, CHECK, path], capture_output=True, text=True)
    return r.stdout.strip().split(": ", 1)[-1] if r.returncode == 0 else "INCONSISTENT: " + r.stdout.strip()


def summary(doc: dict) -> str:
    costs = ", ".join(f"{s['stage']} {s['ms_per_batch']:.1f}{'*' if s['significant'] else ''}"
                      for s in doc["stages"] if s["status"] == "ok")
    full = next((p for p in doc["points"] if p["point"] == "full"), {})
    return (f"{doc['bottleneck']}; full {full.get('ms_per_batch')} ms/batch; stages (ms/batch, * real): {costs}; "
            f"settled {doc['run'].get('settled')}")


def run_case(name: str, case: Case, repo: str, args, env) -> dict:
    out = os.path.abspath(args.out)
    src = os.path.join(out, "src", case.repo + (f"@{case.rev[:12]}" if case.rev else ""))
    copy_files(repo, case.files, src, case.rev)
    data = os.path.join(out, "data")
    for kind in case.data:
        make_data(kind, data, os.path.join(out, "src"))
    work = os.path.join(out, "run", name)  # mnist reads ../data: OUT/run/data
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "out"), exist_ok=True)
    os.makedirs(os.path.join(work, "results"), exist_ok=True)  # vae/main.py saves to ./results (its checkout's)
    if not os.path.lexists(os.path.join(out, "run", "data")):  # (a link to a data dir no case made yet: dangling)
        os.symlink(data, os.path.join(out, "run", "data"))
    cwd = os.path.join(out, "run") if case.cwd == "run" else work  # scripts reading ./data
    fill = {"data": data, "out": os.path.join(work, "out"), "src": src}
    script_args = [a.format(**fill) for a in case.args]
    report = os.path.join(out, "results", f"{name}-run.json")
    with contextlib.suppress(FileNotFoundError):
        os.remove(report)
    tool = [sys.executable, "-m", "bisect_pipeline", "run", "--json", report, "--max-seconds",
            str(args.max_seconds), "--device", "cpu"] + (["--keep-training"] if case.keep else []) + list(case.tool)
    cmd = tool + [os.path.join(src, case.script)] + script_args
    print(f"[{name}] {' '.join(cmd[2:])}  (cwd {cwd})", flush=True)
    rc, stdout, stderr, wall = run_process(cmd, cwd, env, args.max_seconds + case.allowance, args.lock)
    with open(os.path.join(out, "results", f"{name}.stderr.txt"), "w") as f:
        f.write(stderr)
    with open(os.path.join(out, "results", f"{name}.stdout.txt"), "w") as f:
        f.write(stdout)
    result = {"name": name, "repo": case.repo, "revision": case.rev[:12] if case.rev else revision(repo),
              "script": case.script,
              "args": script_args, "keep_training": case.keep, "workers": case.workers, "what": case.what,
              "exit": rc, "wall_s": round(wall, 1), "reports": stderr.count(REPORT_LINE),  # also after a tqdm bar's text (no newline)
              "json": os.path.exists(report), "stderr_tail": stderr[-1500:]}
    if result["json"]:
        doc = json.load(open(report))
        loader = doc.get("loader") or {}
        source = doc.get("source") or {}
        result.update(verdict=doc.get("bottleneck"), cost=named_cost(doc), check=check_report(report),
                      elapsed_s=(doc.get("run") or {}).get("elapsed_s"), summary=summary(doc),
                      measured=f"{source.get('dataset')} #{source.get('index')}, batch {loader.get('batch_size')},"
                               f" {loader.get('num_workers')} workers"
                               f"{' (persistent)' if loader.get('persistent_workers') else ''}",
                      loaders=len(source.get("loaders") or []))
    if case.keep:
        result["last_stdout"] = last_line(stdout)
        result["last_stderr"] = last_line(stderr, skip_tool=True)
    if case.entry and not args.no_entry:
        entry_json = os.path.join(out, "results", f"{name}-entry.json")
        e = run_process([sys.executable, "-m", "bisect_pipeline", "--entry", f"{HERE}:{case.entry}", "--json",
                         entry_json, "--max-seconds", str(args.max_seconds), "--device", "cpu", "-q"],
                        cwd, env, args.max_seconds + case.allowance, args.lock)
        if os.path.exists(entry_json):
            result["entry"] = f"exit {e[0]}; {summary(json.load(open(entry_json)))}; {check_report(entry_json)}"
        else:
            result["entry"] = f"exit {e[0]}, no report: {e[2][-400:]}"
    with open(os.path.join(out, "results", f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def show(r: dict) -> None:
    print(f"[{r['name']}] exit {r['exit']}; verdict {r.get('verdict', '-')}; {r.get('cost', '-')}; "
          f"wall {r['wall_s']} s; check-report: {r.get('check', 'no json')}; reports printed: {r['reports']}"
          + (f"; measured {r['measured']}" if r.get("measured") else "")
          + (f"\n    last stdout: {r.get('last_stdout')!r}; last stderr: {r.get('last_stderr')!r}" if r["keep_training"]
             else "")
          + (f"\n    entry: {r['entry']}" if r.get("entry") else ""), flush=True)
    if not r.get("json") or r["reports"] != 1 or r["exit"] != 0:
        print("    stderr tail: " + r["stderr_tail"][-700:].replace("\n", "\n    "), flush=True)


def markdown(results) -> str:
    rows = ["| script | arguments | workers | exit | verdict | named stage cost | wall s | check-report | reports |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        args = " ".join(a if "/" not in a else os.path.basename(a) or a for a in r["args"])
        rows.append(f"| `{r['name']}`: {r['repo']} `{r['script']}` @{r['revision'][:8]}"
                    f"{' (`--keep-training`)' if r['keep_training'] else ''} | `{args}` | {r['workers']} | "
                    f"{r['exit']} | {r.get('verdict', '-')} | {r.get('cost', '-')} | {r['wall_s']} | "
                    f"{r.get('check', 'no JSON')} | {r['reports']} |")
    keep = [r for r in results if r["keep_training"]]
    if keep:
        rows += ["", "`--keep-training`: the script's own last lines after the verdict", ""]
        rows += [f"- `{r['name']}`: stdout `{r.get('last_stdout')}`; stderr `{r.get('last_stderr')}`" for r in keep]
    entries = [r for r in results if r.get("entry")]
    if entries:
        rows += ["", "The same pipelines as entries (`--entry`)", ""]
        rows += [f"- `{r['name']}`: run: {r.get('summary')}; entry: {r['entry']}" for r in entries]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for repo in ("examples", "timm", "vision", "monai", "lightning", "diffusers", "torchdata"):
        ap.add_argument(f"--{repo}", help=f"a checkout (or bare git dir) of the {repo} repository")
    ap.add_argument("--only", default=None, help="comma-separated case names (default: every case whose repo is given)")
    ap.add_argument("--list", action="store_true", help="list the cases and their arguments")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--out", default=None, help="output directory (data, copies, results); default a new temp dir")
    ap.add_argument("--lock", default="/tmp/cpu.lock", help="a lock file held during each run ('' for none)")
    ap.add_argument("--no-entry", action="store_true", help="skip the --entry comparison")
    ap.add_argument("--markdown", action="store_true", help="print the table of every result saved in --out")
    args = ap.parse_args()
    if args.list:
        for name, c in CASES.items():
            print(f"{name}: {c.repo} {c.script} {' '.join(c.args)}{' (--keep-training)' if c.keep else ''}")
        return
    args.out = args.out or tempfile.mkdtemp(prefix="bench_public_")
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    names = args.only.split(",") if args.only else [n for n, c in CASES.items() if getattr(args, c.repo)]
    env = dict(os.environ, MNIST_ROOT=os.path.join(os.path.abspath(args.out), "data"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg",
               HF_HOME=os.path.join(os.path.abspath(args.out), "hf_home"),
               TORCH_HOME=os.path.join(os.path.abspath(args.out), "torch_home"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(HERE)),
                                                      os.environ.get("PYTHONPATH")]))
    if args.examples:
        env["EXAMPLES"] = os.path.join(os.path.abspath(args.out), "src", "examples")
    for name in names:
        case = CASES[name]
        repo = getattr(args, case.repo)
        if not repo:
            print(f"[{name}] skipped: no --{case.repo}")
            continue
        show(run_case(name, case, os.path.abspath(repo), args, env))
    if args.markdown:
        results = []
        for name in CASES:
            path = os.path.join(args.out, "results", f"{name}.json")
            if os.path.exists(path):
                r = json.load(open(path))
                doc = os.path.join(args.out, "results", f"{name}-run.json")
                if os.path.exists(doc):  # the cost as this version words it
                    r["cost"] = named_cost(json.load(open(doc)))
                results.append(r)
        print(markdown(results))


if __name__ == "__main__":
    main()
