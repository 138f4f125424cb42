"""Pipelines for checking the verified advice (predicted vs measured) on real code.

Entries for `bisect-pipeline --entry scripts/verify_evidence.py:FUNC --json out.json`:

    imagefolder  ImageFolder over 256 real JPEG files (320x240, written once to
                 $TMPDIR/bisect-evidence-jpegs) with the transforms of torchvision's
                 classification reference (references/classification/presets.py,
                 ClassificationPresetTrain: RandomResizedCrop, RandomHorizontalFlip,
                 PILToTensor, ConvertImageDtype, Normalize) at crop 64, ResNet-18,
                 batch 16, num_workers=0
    mnist        the PyTorch MNIST example (pytorch/examples mnist/main.py: its Net,
                 ToTensor + Normalize((0.1307,), (0.3081,)), Adadelta, nll_loss) on
                 torchvision FakeData at 1x28x28, batch 64, num_workers=0

Then read each advice item's `verified` block (status, speedup, spread, predicted):

    python scripts/verify_evidence.py out.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from torch import nn
from torch.utils.data import DataLoader

from bisect_pipeline import Workload

JPEGS = os.path.join(tempfile.gettempdir(), "bisect-evidence-jpegs")


def _write_jpegs(root: str, n: int = 256, classes: int = 4) -> None:
    from PIL import Image

    if os.path.isdir(root) and sum(len(f) for _, _, f in os.walk(root)) >= n:
        return
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        d = os.path.join(root, f"class{i % classes}")
        os.makedirs(d, exist_ok=True)
        pixels = torch.randint(0, 256, (240, 320, 3), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(os.path.join(d, f"{i:04d}.jpg"), quality=90)


def imagefolder() -> Workload:
    _write_jpegs(JPEGS)
    transform = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(0.5), T.PILToTensor(),
                           T.ConvertImageDtype(torch.float), T.Normalize(mean=(0.485, 0.456, 0.406),
                                                                         std=(0.229, 0.224, 0.225))])
    dataset = torchvision.datasets.ImageFolder(JPEGS, transform=transform)
    model = torchvision.models.resnet18(num_classes=4)
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    return Workload(model=model, loader=loader, optimizer=opt)


class Net(nn.Module):
    """pytorch/examples mnist/main.py's Net."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def mnist() -> Workload:
    transform = T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))])
    dataset = torchvision.datasets.FakeData(2048, (1, 28, 28), 10, transform=transform)
    model = Net()
    return Workload(model=model, loader=DataLoader(dataset, batch_size=64, shuffle=True),
                    optimizer=torch.optim.Adadelta(model.parameters(), lr=1.0), loss_fn=F.nll_loss)


def summarize(path: str) -> None:
    doc = json.load(open(path))
    print(f"{path}: bottleneck {doc['bottleneck']}, verification {doc['verification'].get('status')} "
          f"({doc['verification'].get('elapsed_s')} s)")
    for a in doc["advice"]:
        v = a.get("verified")
        if not v:
            continue
        tried = "; ".join(f"{t['settings']}: {t.get('speedup')} (+-{t.get('spread')}) {t['status']}"
                          for t in v.get("tried", []))
        print(f"  {a['kind']}: {v['status']}, measured {v.get('speedup')} (+-{v.get('spread')}), "
              f"predicted {v.get('predicted')}; tried: {tried or '-'}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarize(p)
