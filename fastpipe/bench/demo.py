"""A few training steps of a tiny model on the sample dataset, with and without fastpipe."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from fastpipe import DataLoaderX, DataPrefetcher

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class _JpegFolder(Dataset):
    """Decodes with PIL and resizes to a square: the loader most training scripts start from."""

    def __init__(self, root: Path, size: int) -> None:
        self.files = np.array(sorted(str(p) for p in Path(root).glob("*/*.jpg")))
        classes = sorted({Path(f).parent.name for f in self.files})
        self.labels = np.array([classes.index(Path(f).parent.name) for f in self.files])
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        from PIL import Image

        with Image.open(self.files[index]) as image:
            image = image.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
            array = np.array(image)
        return torch.from_numpy(array).permute(2, 0, 1).contiguous(), int(self.labels[index])


def _tiny_model(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


@dataclass
class DemoResult:
    name: str
    images: int
    seconds: float
    wait_seconds: float

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds

    @property
    def wait_share(self) -> float:
        return self.wait_seconds / self.seconds


def _train(name: str, batches: Iterable, model: nn.Module, normalize: bool, steps: int) -> DemoResult:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    images_seen, wait = 0, 0.0
    start = time.perf_counter()
    iterator = iter(batches)
    for _ in range(steps):
        before = time.perf_counter()
        try:
            images, labels = next(iterator)
        except StopIteration:
            iterator = iter(batches)
            images, labels = next(iterator)
        wait += time.perf_counter() - before
        if normalize:
            images = (images.float() / 255 - mean) / std
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        images_seen += len(labels)
    return DemoResult(name, images_seen, time.perf_counter() - start, wait)


def run_demo(root: Path, batch_size: int = 32, num_workers: int = 2, steps: int = 12,
             size: int = 160) -> list[DemoResult]:
    dataset = _JpegFolder(root, size)
    num_classes = int(dataset.labels.max()) + 1
    results = []
    torch.manual_seed(0)
    plain = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers)
    results.append(_train("DataLoader", plain, _tiny_model(num_classes), True, steps))
    torch.manual_seed(0)
    loader = DataLoaderX(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers)
    prefetcher = DataPrefetcher(loader, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    results.append(_train("DataLoaderX + DataPrefetcher", prefetcher, _tiny_model(num_classes),
                          False, steps))
    prefetcher.close()
    return results
