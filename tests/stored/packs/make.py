"""Writes the stored packs of this folder: packs as fastpipe's writer made them at commit 01183b3
(format version 1 image packs, format version 2 records, virtual merges, LMDB), and
``expected.npz``, what that commit's readers returned for every sample (the stored bytes or
rows, the labels, the checksums, the source paths), and ``datasets.json``, what its
``H5Dataset``/``LMDBDataset`` said of each pack (length, classes, targets, fields, sources).

Kept for provenance: the packs are committed, and tests/data/sources/test_stored_packs.py reads them
with today's reader and compares with ``expected.npz``. It runs against the fastpipe of commit
01183b3 only (its imports are that commit's modules, which later commits moved or removed; a later
fastpipe writes its own format, which is not what the test guards):

    git worktree add /tmp/fastpipe-01183b3 01183b3
    (cd /tmp/fastpipe-01183b3 && pip install --no-build-isolation -e . &&
     python /path/to/tests/stored/packs/make.py OUT)
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from fastpipe.data._format import open_pack
from PIL import Image

import fastpipe.pack as fp
from fastpipe.data import fields as F  # 01183b3's modules (see above)

N = 6  # samples per pack: two shards of 3 for the merges


def _jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    base = np.linspace(0, 255, 24 * 20 * 3).reshape(20, 24, 3)
    pixels = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=80)
    return out.getvalue()


def _png(i: int) -> bytes:
    rng = np.random.default_rng(100 + i)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 4, (20, 24), dtype=np.uint8), "L").save(out, "PNG")
    return out.getvalue()


class Images:
    """(JPEG bytes, label): an (image, label) pack, format version 1."""

    classes = ["cat", "dog"]

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return _jpeg(i), i % 2


class Arrays:
    """(float32 array, label): array storage of raw arrays."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return np.random.default_rng(200 + i).standard_normal((2, 5)).astype(np.float32), i % 3


class Records:
    """Every field kind of format version 2, fixed and variable."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        rng = np.random.default_rng(300 + i)
        return {
            "image": _jpeg(i),
            "mask": _png(i),
            "mix": rng.standard_normal((2, 8)).astype(np.float32),
            "frames": rng.integers(0, 1000, (i + 1, 3)).astype(np.int16),
            "boxes": rng.uniform(0, 20, (i % 3, 4)).astype(np.float32),
            "label": int(i % 2),
            "score": float(i) / 4,
            "caption": f"sample {i} \u00e9",
            "blob": bytes(range(i, i + 7)),
        }


RECORD_FIELDS = {"frames": F.ArrayField("int16", (None, 3)),
                 "boxes": F.ArrayField("float32", (None, 4))}


def _packs(src: Path, out: Path) -> None:
    images = src / "images"
    for k in range(N):  # an ImageFolder tree: paths stored as the sources
        d = images / ("cat" if k % 2 == 0 else "dog")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{k:03d}.jpg").write_bytes(_jpeg(k))
    common = dict(progress=False, shard_size=3)
    fp.pack(images, out / "v1_bytes_copy.h5", merge="copy", **common)
    fp.pack(images, out / "v1_bytes_virtual.h5", merge="virtual", **common)
    fp.pack(images, out / "v1_bytes.lmdb", **common)
    fp.pack(images, out / "v1_array_chw_copy.h5", storage="array", size=(16, 16),
            merge="copy", **common)
    fp.pack(Images(), out / "v1_dataset_virtual.h5", merge="virtual", resume=False, **common)
    fp.pack(Arrays(), out / "v1_array_raw_virtual.h5", storage="array", merge="virtual",
            resume=False, **common)
    fp.pack(Records(), out / "v2_records_copy.h5", fields=RECORD_FIELDS, merge="copy",
            resume=False, **common)
    fp.pack(Records(), out / "v2_records_virtual.h5", fields=RECORD_FIELDS, merge="virtual",
            resume=False, **common)
    fp.pack(Records(), out / "v2_records.lmdb", fields=RECORD_FIELDS, resume=False, **common)


def _expected(out: Path) -> dict[str, np.ndarray]:
    expected: dict[str, np.ndarray] = {}
    for path in sorted(p for p in out.iterdir() if p.suffix in (".h5", ".lmdb")):
        with open_pack(path) as reader:
            key = path.name
            if hasattr(reader, "fields"):
                for name in reader.order:
                    for i in range(reader.count):
                        expected[f"{key}/{name}/{i}"] = np.asarray(reader.read(i, name))
                    expected[f"{key}/{name}/crc32"] = reader.crc32(name)
            else:
                for i in range(reader.count):
                    expected[f"{key}/data/{i}"] = reader.read(i)
                expected[f"{key}/labels"] = reader.labels
                expected[f"{key}/crc32"] = reader.crc32()
            expected[f"{key}/sources"] = np.array([reader.source(i) for i in range(reader.count)])
    return expected


def _datasets(out: Path) -> dict[str, dict]:
    from fastpipe.data import H5Dataset, LMDBDataset

    described = {}
    for path in sorted(p for p in out.iterdir() if p.suffix in (".h5", ".lmdb")):
        ds = (H5Dataset if path.suffix == ".h5" else LMDBDataset)(path)
        described[path.name] = {
            "len": len(ds), "classes": ds.classes,
            "targets": None if ds.targets is None else [int(t) for t in ds.targets],
            "storage": ds.storage,
            "fields": None if ds.fields is None else {n: f.to_json() for n, f in ds.fields.items()},
            "item0": type(ds[0]).__name__,
            "paths": [ds.path(i) for i in range(len(ds))],
        }
    return described


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _packs(Path(tmp), out)
    np.savez(out / "expected.npz", **_expected(out))
    (out / "datasets.json").write_text(json.dumps(_datasets(out), indent=1, sort_keys=True) + "\n")
    for lock in out.glob("*-lock"):
        lock.unlink()
    # Plans and creation times are part of the stored metadata; paths of the temporary source
    # folder are not (sources are stored relative to the root).
    shutil.rmtree(out / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
