"""The loaders `fastpipe bench` compares. Each gives the same thing to the training loop:
normalized float32 images ``(N, 3, size, size)`` and int64 labels, on the device (the CPU here),
from the same JPEG folder with the same train-time augmentation (random resized crop and flip).

A variant whose parts are not installed (or not built yet) raises ImportError or :class:`Skip`;
the suite lists it as skipped with the reason.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastpipe._constants import IMAGENET_MEAN, IMAGENET_STD
from fastpipe._optional import require


class Skip(Exception):
    """This variant cannot run here; the message says why."""


@dataclass
class BenchConfig:
    root: Path
    batch_size: int
    num_workers: int
    size: int
    pack_dir: Path
    # Where the batches end: None picks CUDA when available (the prefetching loaders).
    device: str | None = None


@dataclass(frozen=True)
class Variant:
    key: str
    name: str
    description: str
    build: Callable[[BenchConfig], Any]


def _torchvision_folder(config: BenchConfig, uint8: bool) -> Any:
    require("torchvision", extra="bench", feature="the DataLoader baselines of fastpipe bench")
    from torchvision import datasets, transforms

    ops = [transforms.RandomResizedCrop(config.size), transforms.RandomHorizontalFlip()]
    if uint8:
        ops.append(transforms.PILToTensor())
    else:
        ops += [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return datasets.ImageFolder(str(config.root), transform=transforms.Compose(ops))


def _loader_kwargs(config: BenchConfig) -> dict[str, Any]:
    # Persistent workers in every variant: with a small dataset, restarting workers each epoch
    # would be most of what is measured.
    return {"batch_size": config.batch_size, "shuffle": True, "num_workers": config.num_workers,
            "persistent_workers": config.num_workers > 0,
            "pin_memory": config.device == "cuda"}


def build_dataloader(config: BenchConfig) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(_torchvision_folder(config, uint8=False), **_loader_kwargs(config))


def build_dataloaderx(config: BenchConfig) -> Any:
    from fastpipe.loader import DataLoaderX

    return DataLoaderX(_torchvision_folder(config, uint8=False), **_loader_kwargs(config))


def build_prefetcher(config: BenchConfig) -> Any:
    from fastpipe.loader import DataLoaderX
    from fastpipe.prefetch import DataPrefetcher

    loader = DataLoaderX(_torchvision_folder(config, uint8=True), **_loader_kwargs(config))
    return DataPrefetcher(loader, device=config.device, mean=IMAGENET_MEAN, std=IMAGENET_STD)


def build_fast_cpu(config: BenchConfig) -> Any:
    from fastpipe.data import ImageFolder, fast_collate
    from fastpipe.loader import DataLoaderX
    from fastpipe.prefetch import DataPrefetcher

    dataset = ImageFolder(str(config.root), train=True, size=config.size)
    loader = DataLoaderX(dataset, collate_fn=fast_collate, **_loader_kwargs(config))
    return DataPrefetcher(loader, device=config.device, mean=IMAGENET_MEAN, std=IMAGENET_STD)


def pack_path(config: BenchConfig) -> Path:
    """The pack of the benchmark's folder, made on first use (not timed)."""
    from fastpipe._version import __version__
    from fastpipe.pack import pack

    require("h5py", extra="hdf5", feature="the HDF5 variant of fastpipe bench")
    path = config.pack_dir / f"{config.root.name}-bytes-v{__version__}.h5"
    if not path.is_file():
        config.pack_dir.mkdir(parents=True, exist_ok=True)
        # Written under a temporary name, so an interrupted run never leaves half a pack.
        fd, staging = tempfile.mkstemp(suffix=".h5", prefix=f".{path.stem}.", dir=config.pack_dir)
        os.close(fd)
        os.unlink(staging)
        try:
            pack(str(config.root), staging, storage="bytes", num_workers=1, progress=False)
            os.replace(staging, path)
        finally:
            if os.path.exists(staging):
                os.unlink(staging)
    return path


def build_hdf5(config: BenchConfig) -> Any:
    from fastpipe.data import H5Dataset, ImageDecoder, fast_collate
    from fastpipe.loader import DataLoaderX
    from fastpipe.prefetch import DataPrefetcher

    dataset = H5Dataset(str(pack_path(config)), decoder=ImageDecoder(train=True, size=config.size))
    loader = DataLoaderX(dataset, collate_fn=fast_collate, **_loader_kwargs(config))
    return DataPrefetcher(loader, device=config.device, mean=IMAGENET_MEAN, std=IMAGENET_STD)


def build_dali(config: BenchConfig) -> Any:
    from fastpipe.dali import DALILoader

    return DALILoader(str(config.root), batch_size=config.batch_size, train=True, size=config.size,
                      num_workers=max(1, config.num_workers), device="cpu",
                      mean=IMAGENET_MEAN, std=IMAGENET_STD)


def build_factory(config: BenchConfig) -> Any:
    from fastpipe.factory import image_loader

    return image_loader(config.root, config.batch_size, train=True, size=config.size,
                        num_workers=config.num_workers)


VARIANTS: tuple[Variant, ...] = (
    Variant("dataloader", "DataLoader",
            "torchvision ImageFolder + transforms (ToTensor, Normalize in the workers), "
            "torch DataLoader: the baseline", build_dataloader),
    Variant("dataloaderx", "DataLoaderX",
            "the same dataset, fastpipe.DataLoaderX (background thread)", build_dataloaderx),
    Variant("prefetcher", "DataLoaderX + DataPrefetcher",
            "the same transforms ending in uint8 (PILToTensor); DataPrefetcher normalizes on the "
            "device", build_prefetcher),
    Variant("fast-cpu", "fast CPU path",
            "fastpipe.data.ImageFolder + fast_collate (uint8), DataLoaderX + DataPrefetcher",
            build_fast_cpu),
    Variant("hdf5", "HDF5 pack",
            "the folder packed once into HDF5 (encoded bytes), fastpipe.data.H5Dataset + "
            "fast_collate, DataLoaderX + DataPrefetcher", build_hdf5),
    Variant("dali", "DALI (CPU)",
            "fastpipe.dali.DALILoader(device='cpu'), num_workers = workers", build_dali),
    Variant("factory", "image_loader",
            "fastpipe.image_loader(root, train=True): the path it picks on this machine (DALI "
            "with GPU decode on CUDA, else the fast CPU path)", build_factory),
)
