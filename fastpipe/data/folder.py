"""ImageFolder: torchvision's folder layout, read through the fused decode path."""

from __future__ import annotations

import hashlib
import operator
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastpipe._constants import (
    DEFAULT_CROP_PCT,
    DEFAULT_HFLIP,
    DEFAULT_INTERPOLATION,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    DEFAULT_SIZE,
)
from fastpipe.data._augment import PerSample
from fastpipe.data._decode import ImageDecoder
from fastpipe.data._listing import IMG_EXTENSIONS, list_image_folder
from fastpipe.data._random import forked_default_generator, sample_seed
from fastpipe.recipe import Recipe


def _read_file(path: str) -> bytes:
    """The file's bytes, with one open, fstat, read and close: about a third less time than
    ``open().read()`` (docs/cpu-path.md), which also builds a buffered file object. Unless the
    first read returns exactly the size fstat gave, it reads on to the end of the file, as
    ``read()`` does (a file still growing, a short read, or a file system that reports no
    size)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1)
        if len(data) != size:
            chunks = [data]
            while chunk := os.read(fd, max(size, 1 << 16)):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


class ImageFolder(PerSample, torch.utils.data.Dataset):
    """A map-style dataset over ``root/<class>/**/<image>``, giving ``(uint8 (3, H, W), label)``.

    Same classes, order and labels as ``torchvision.datasets.ImageFolder``: class folders sorted by
    name get labels 0, 1, ...; files found recursively, sorted. Each sample follows the
    per-sample part of a :class:`~fastpipe.Recipe` (``recipe=``, or the keywords ``train``,
    ``size``, ``scale``, ``ratio``, ``hflip``, ``crop_pct``, ``interpolation`` and
    ``auto_augment``, which build one): an :class:`~fastpipe.data.ImageDecoder` (with
    ``reducing_gap`` and ``fast_upsample``) random-resized-crops and flips in train mode, resizes
    and centre-crops in eval, in one step after a reduced-scale JPEG decode; then
    ``auto_augment`` (``"ra"``, ``"ta_wide"``, ``"augmix"``, ``"imagenet"`` or timm's
    ``"rand-m9-mstd0.5-inc1"`` style) and ``transform`` (a callable on the uint8 ``(3, H, W)``
    tensor, e.g. torchvision.transforms.v2 ops) run on the result. The recipe's batch part
    (``mean``, ``std``, ``dtype``, ``channels_last``) is the loader's: collate batches with
    :func:`~fastpipe.data.fast_collate` and normalize on the device (``DataPrefetcher``).

    Every random draw of sample ``i`` (crop, flip, auto_augment, torch draws of ``transform``) is
    a pure function of ``(seed, epoch, i)``: the same batches whatever ``num_workers``.
    ``seed=None`` draws one from torch's generator at construction; the epoch is the index's own
    (:class:`~fastpipe.data.SampleIndex`, from fastpipe's samplers) or ``set_epoch``'s.

    Per-sample metadata lives in numpy arrays (one byte buffer of paths plus offsets, and the
    labels), not Python lists, so DataLoader workers do not copy it page by page as reference
    counts change (pytorch#13246).

    Attributes:
        classes: class names, sorted. class_to_idx: name -> label. targets: int64 labels (N,).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        train: bool = True,
        size: int | tuple[int, int] = DEFAULT_SIZE,
        scale: tuple[float, float] = DEFAULT_SCALE,
        ratio: tuple[float, float] = DEFAULT_RATIO,
        hflip: float = DEFAULT_HFLIP,
        crop_pct: float = DEFAULT_CROP_PCT,
        interpolation: str = DEFAULT_INTERPOLATION,
        auto_augment: str | None = None,
        transform: Callable[[torch.Tensor], Any] | None = None,
        seed: int | None = None,
        reducing_gap: float | None = None,
        fast_upsample: bool | None = None,
        extensions: Iterable[str] = IMG_EXTENSIONS,
        *,
        recipe: Recipe | None = None,
    ) -> None:
        self.root = Path(root)
        recipe = Recipe.resolve(
            recipe, ImageFolder.__init__, "ImageFolder", train=train, size=size, scale=scale,
            ratio=ratio, hflip=hflip, crop_pct=crop_pct, interpolation=interpolation,
            auto_augment=auto_augment)
        self._init_per_sample(transform, recipe, seed)
        self.decoder = ImageDecoder(recipe=recipe, reducing_gap=reducing_gap,
                                    fast_upsample=fast_upsample)
        extensions = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"ImageFolder root {str(self.root)!r} is not a folder; pass the folder that holds "
                "one sub-folder per class"
            )
        self.classes, rel_paths, labels = list_image_folder(self.root, extensions)
        if not self.classes:
            raise FileNotFoundError(
                f"ImageFolder root {str(self.root)!r} has no class sub-folders; expected "
                "root/<class>/<image> (e.g. root/cat/001.jpg)"
            )
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        paths = [os.fsencode(p) for p in rel_paths]
        if not paths:
            raise FileNotFoundError(
                f"no images with extensions {', '.join(extensions)} under the class folders of "
                f"{str(self.root)!r}; pass extensions=... if your files use another suffix"
            )
        lengths = np.fromiter((len(p) for p in paths), dtype=np.int64, count=len(paths))
        self._offsets = np.concatenate(([0], np.cumsum(lengths)))
        self._path_bytes = np.frombuffer(b"".join(paths), dtype=np.uint8)
        self.targets = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.targets)

    def fingerprint(self) -> str:
        """A short hash of the root, the files and their labels, which a saved loader state must
        match (fastpipe.data._resume)."""
        digest = hashlib.sha256(os.fsencode(self.root))
        digest.update(self._offsets.tobytes())
        digest.update(self._path_bytes.tobytes())
        digest.update(self.targets.tobytes())
        return digest.hexdigest()[:16]

    def path(self, index: int) -> str:
        """The file of sample ``index``."""
        return self._path(self._check_index(index))

    def _path(self, index: int) -> str:
        start, end = self._offsets[index], self._offsets[index + 1]
        return os.path.join(self.root, os.fsdecode(self._path_bytes[start:end].tobytes()))

    def __getitem__(self, index: int) -> tuple[Any, int]:
        """Sample ``index`` as ``(uint8 tensor (3, H, W), int label)`` (what ``transform``
        returns in place of the tensor, when given)."""
        epoch = self._epoch_of(index)
        index = self._check_index(index)
        path = self._path(index)
        data = _read_file(path)
        image = self.decoder._from_seed(data, path, sample_seed(self.seed, epoch, index))
        if self._needs_fork():
            with forked_default_generator(sample_seed(self.seed, epoch, index, 1)):
                image = self._augmented(image)
        return image, int(self.targets[index])

    def _check_index(self, index: int) -> int:
        index = operator.index(index)
        n = len(self.targets)
        if not -n <= index < n:
            raise IndexError(f"sample index {index} out of range for an ImageFolder of {n} images")
        return index % n

    def __repr__(self) -> str:
        return (f"ImageFolder(root={str(self.root)!r}, {len(self)} images, "
                f"{len(self.classes)} classes, decoder={self.decoder!r}, "
                f"auto_augment={self.auto_augment!r}, transform={self.transform!r}, "
                f"seed={self.seed})")
