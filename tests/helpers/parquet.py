"""Parquet files as users hold them: a Hugging Face Hub image dataset written by the ``datasets``
library itself, in the Hub's layout (``data/train-00000-of-00003.parquet``: an ``image`` column
of ``{"bytes", "path"}`` structs and a ``ClassLabel`` ``label``, row groups of ``row_group``
rows, contiguous shards as ``push_to_hub`` writes them), and plain files written by pyarrow."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

CLASSES = ("cat", "dog", "fish")


def jpeg(i: int, size: tuple[int, int] = (24, 32)) -> bytes:
    """A small JPEG, different for every ``i`` (smooth gradients plus noise, of varying size)."""
    from PIL import Image

    rng = np.random.default_rng(i)
    h, w = size[0] + i % 5, size[1] + i % 7
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (3 + i % 4)) % 256, (y * 5 + i) % 256, (x + y + 7 * i) % 256], -1)
    pixels = np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def hub_rows(rows: int, broken: tuple[int, ...] = (), missing: tuple[int, ...] = (),
             ids: bool = False) -> list[dict[str, Any]]:
    """The rows of an image classification dataset: ``broken`` rows hold bytes that are no
    image, ``missing`` rows no image at all; with ``ids``, an ``id`` column (the row's
    number), which tests use to tell samples apart in batches."""
    out = []
    for i in range(rows):
        data = b"not an image at all" if i in broken else jpeg(i)
        image = None if i in missing else {"bytes": data, "path": f"img_{i:05d}.JPEG"}
        out.append({"image": image, "label": i % len(CLASSES)} | ({"id": i} if ids else {}))
    return out


def hub_dataset(root: Path, *, rows: int = 50, shards: int = 3, row_group: int = 7,
                split: str = "train", broken: tuple[int, ...] = (),
                missing: tuple[int, ...] = (), ids: bool = False) -> list[dict[str, Any]]:
    """Writes ``root/data/{split}-0000k-of-0000n.parquet`` with ``datasets``; returns the rows."""
    import datasets

    records = hub_rows(rows, broken, missing, ids)
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=list(CLASSES))}
                                 | ({"id": datasets.Value("int64")} if ids else {}))
    table = datasets.Dataset.from_list(records, features=features)
    folder = root / "data"
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        part = table.shard(num_shards=shards, index=k, contiguous=True)
        part.to_parquet(str(folder / f"{split}-{k:05d}-of-{shards:05d}.parquet"),
                        batch_size=row_group)
    return records


def plain_file(path: Path, columns: dict[str, Any], row_group: int | None = None) -> Path:
    """``columns`` (name -> pyarrow array or list) written by pyarrow, no Hub metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=row_group)
    return path
