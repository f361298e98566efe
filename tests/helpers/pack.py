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


class SpeechRecords:
    """The speech-feature recipe's samples: ``mix`` float32 (4, T) and ``zone0`` float32 (T,),
    plus ``frames`` int64 of a length that varies per sample and a ``label``. ``kind="tuple"``
    returns ``(mix, zone0)`` only (two arrays of the same dtype)."""

    def __init__(self, n: int = 24, t: int = 160, kind: str = "dict",
                 marker: str | os.PathLike | None = None, kill_index: int = -1) -> None:
        self.n, self.t, self.kind = n, t, kind
        self.marker, self.kill_index = (None if marker is None else str(marker)), kill_index

    def __len__(self) -> int:
        return self.n

    def record(self, index: int) -> dict:
        rng = np.random.default_rng(1000 + index)
        return {"mix": rng.standard_normal((4, self.t)).astype(np.float32),
                "zone0": rng.standard_normal(self.t).astype(np.float32),
                "frames": rng.integers(-2**40, 2**40, 3 + index % 5, dtype=np.int64),
                "label": index % 4}

    def __getitem__(self, index: int):
        if not 0 <= index < self.n:
            raise IndexError(index)
        if index == self.kill_index and self.marker and os.path.exists(self.marker):
            os.unlink(self.marker)
            os.kill(os.getpid(), signal.SIGKILL)
        record = self.record(index)
        if self.kind == "tuple":
            return record["mix"][0], record["zone0"]
        return record


def write_shards(root: Path, shards: int = 3, per_shard: int = 10) -> list[bytes]:
    """WebDataset shards: ``xxxxx.jpg`` + ``xxxxx.cls`` + ``xxxxx.txt`` per sample."""
    import io
    import tarfile

    from PIL import Image

    root.mkdir(exist_ok=True)
    jpegs = []
    for s in range(shards):
        with tarfile.open(root / f"{s:06d}.tar", "w") as tar:
            for i in range(per_shard):
                k = s * per_shard + i
                buffer = io.BytesIO()
                Image.new("RGB", (24 + k, 20), (k * 7 % 256, 40, 90)).save(buffer, format="JPEG")
                jpegs.append(buffer.getvalue())
                for name, data in ((f"{k:05d}.jpg", jpegs[-1]), (f"{k:05d}.cls", b"%d" % (k % 3)),
                                   (f"{k:05d}.txt", f"sample {k}".encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return jpegs
