"""The built-in demo workload: a small image classifier whose augmentation starves it.

It is what `bisect-pipeline demo` runs, and a template for an entry function: images
are made in memory (nothing to download), the transforms are torchvision's own, the
loader runs with num_workers=0 as many first pipelines do.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from .pipeline.workload import Workload

IMAGE_SIZE = 64
NUM_CLASSES = 10


class SyntheticImages(Dataset):
    """uint8 CHW images held in memory: loading is a cheap slice, like a warm page cache."""

    def __init__(self, n: int = 512, size: int = IMAGE_SIZE, transform=None, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
        self.targets = torch.randint(0, NUM_CLASSES, (n,), generator=g).tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image, target = self.images[index], self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, target


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(32 * 16, NUM_CLASSES),
    )


def make() -> Workload:
    """The demo's entry function (`bisect-pipeline --entry bisect_pipeline.demo:make`)."""
    transform = v2.Compose([
        v2.RandomResizedCrop(IMAGE_SIZE, antialias=True),
        v2.GaussianBlur(kernel_size=11, sigma=(1.0, 2.0)),
        v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25]),
    ])
    dataset = SyntheticImages(transform=transform)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=0)
    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return Workload(model=model, loader=loader, optimizer=optimizer)
