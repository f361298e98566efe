"""Datasets and file surgery for the pack tests (importable by spawned worker processes)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np


class ArrayDataset:
    """Map-style dataset of deterministic arrays: uint8 HxWx3 images by default, or raw arrays."""

    classes = ["a", "b", "c"]

    def __init__(self, n: int = 40, shape: tuple[int, ...] = (24, 32, 3),
                 dtype: str = "uint8") -> None:
        self.n, self.shape, self.dtype = n, tuple(shape), np.dtype(dtype)

    def __len__(self) -> int:
        return self.n

    def array(self, index: int) -> np.ndarray:
        rng = np.random.default_rng(index)
        if self.dtype == np.uint8:
            return rng.integers(0, 256, self.shape, dtype=np.uint8)
        return rng.standard_normal(self.shape).astype(self.dtype)

    def label(self, index: int) -> int:
        return index % 3

    def __getitem__(self, index: int):
        if not 0 <= index < self.n:
            raise IndexError(index)
        return self.array(index), self.label(index)


class KillOnce(ArrayDataset):
    """Kills the process reading ``kill_index`` while ``marker`` exists (removing it first), the way
    an OOM killer or a lost node ends a pack worker mid-shard."""

    def __init__(self, marker: str | os.PathLike, kill_index: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.marker, self.kill_index = str(marker), kill_index

    def __getitem__(self, index: int):
        if index == self.kill_index and os.path.exists(self.marker):
            os.unlink(self.marker)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


def flip_byte(path: str | os.PathLike, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        value = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([value ^ 0xFF]))


def make_corrupt_folder(sample_root: Path, root: Path, good_per_class: int = 2) -> dict[str, str]:
    """An ImageFolder tree with good images plus four bad inputs; returns {relative path: kind}."""
    for class_dir in sorted(p for p in sample_root.iterdir() if p.is_dir()):
        (root / class_dir.name).mkdir(parents=True)
        for image in sorted(class_dir.iterdir())[:good_per_class]:
            (root / class_dir.name / image.name).write_bytes(image.read_bytes())
    first = sorted(sample_root.glob("class_00/*.jpg"))[0].read_bytes()
    bad = {
        "class_00/truncated.jpg": "corrupt",
        "class_01/not_an_image.jpg": "corrupt",
        "class_02/empty.jpg": "empty",
        "class_03/dangling.jpg": "unreadable",
    }
    (root / "class_00/truncated.jpg").write_bytes(first[:300])
    (root / "class_01/not_an_image.jpg").write_bytes(b"this is text, not a JPEG\n" * 10)
    (root / "class_02/empty.jpg").write_bytes(b"")
    os.symlink(root / "does-not-exist.jpg", root / "class_03/dangling.jpg")
    return bad


def hflip(image):
    """A picklable transform: flips a CHW tensor left to right."""
    return image.flip(-1)
