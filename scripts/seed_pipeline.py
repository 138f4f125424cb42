"""The seed pipeline of performance-analysis-part1.md, scaled down to a small CPU.

The seed trains a torchvision ResNet-18 on FakeCIFAR images through PIL Resize(224),
ToTensor and Normalize, batch 32, num_workers=0, and finds the loader starves the GPU.
Here, for a 2-core CPU with no accelerator:

- torchvision's FakeData: PIL images generated per sample (3x224x224, its default), which stands in
  for reading and decoding (the `load` stage);
- transforms Resize(32), ToTensor, Normalize: the seed's, at CIFAR's own 32x32, which a CPU step
  can afford (the `augment` stage);
- mobilenet_v3_small (10 classes), SGD with momentum, cross-entropy, batch 16.

Entries for `bisect-pipeline --entry scripts/seed_pipeline.py:FUNC`:

    make_w0       num_workers=0, as the seed starts
    make_advised  the settings the advice recommends: SEED_NUM_WORKERS (default 1),
                  SEED_TORCH_THREADS (default 1: on a 2-core CPU the advice gives the
                  worker a core, torch.set_num_threads(1)) and SEED_PIN_MEMORY (0/1)
    make(num_workers=0, pin_memory=False)
"""

from __future__ import annotations

import os

import torch
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets import FakeData

from bisect_pipeline import Workload

BATCH_SIZE = 16
RESOLUTION = 32
SAMPLES = 2048
IMAGE_SIZE = (3, 224, 224)  # torchvision FakeData's default


def make(num_workers: int = 0, pin_memory: bool = False) -> Workload:
    transform = T.Compose([T.Resize(RESOLUTION), T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
    dataset = FakeData(size=SAMPLES, image_size=IMAGE_SIZE, num_classes=10, transform=transform)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=num_workers, pin_memory=pin_memory)
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    return Workload(model=model, loader=loader, optimizer=optimizer, loss_fn=torch.nn.CrossEntropyLoss())


def make_w0() -> Workload:
    return make(num_workers=0)


def make_advised() -> Workload:
    workers = int(os.environ.get("SEED_NUM_WORKERS", "1"))
    threads = int(os.environ.get("SEED_TORCH_THREADS", "1"))
    if threads > 0:
        torch.set_num_threads(threads)  # the step's intra-op threads, as the advice recommends
    pin = os.environ.get("SEED_PIN_MEMORY", "0").strip().lower() in ("1", "true", "yes")
    return make(num_workers=workers, pin_memory=pin)
