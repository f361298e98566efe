"""``image_dataset``: ``(image, label)`` samples from whatever a path names, for the loaders that
classify (``image_loader``, the profiler, ``fastpipe tune``/``bench``/``profile``).

The path's kind comes from the one resolver (fastpipe.data.sources.resolve): an image folder
(``ImageFolder``), a list file of ``path label`` lines, an HDF5 or LMDB pack (``H5Dataset``,
``LMDBDataset``), tar shards (``TarDataset``, its image and label members picked from the
first sample's fields) or Parquet files (``ParquetDataset``: its image and label columns).
"""

from __future__ import annotations

import os
from typing import Any

from fastpipe.data.datasets._records import RecordDataset
from fastpipe.data.sources.resolve import kind_of
from fastpipe.recipe import Recipe

__all__ = ["CLASSIFICATION_KINDS", "image_dataset"]

# The kinds of path that hold (image, label) samples.
CLASSIFICATION_KINDS = ("folder", "list", "hdf5", "lmdb", "tar", "parquet")


def image_dataset(path: str | os.PathLike, *, recipe: Recipe | None = None,
                  seed: int | None = None, decode: str = "cpu",
                  remote: Any = None) -> RecordDataset:
    """The ``(uint8 (3, H, W), int label)`` samples of what ``path`` names, with ``recipe``'s
    per-sample part (fastpipe's fast decode; a full decode without one; ``decode="gpu"``: the
    bytes and the draw, for DataPrefetcher to decode). A path that holds no labelled images (a
    folder without class folders, arrays) is a ValueError saying what it holds. A URL is read
    through the node's cache as ``remote`` (a :class:`~fastpipe.data.RemoteOptions`) says."""
    from fastpipe.data.remote.urls import is_url

    kind = kind_of(path, remote)
    if kind not in CLASSIFICATION_KINDS:
        raise ValueError(f"{path} holds {_WHAT[kind]}, not labelled images: image_loader reads an "
                         "image folder (root/<class>/<image>), a list file of 'path label' lines, "
                         "a fastpipe pack of (image, label) samples, tar shards (image and "
                         "label members) or Parquet files (image and label columns)")
    options: dict[str, Any] = {"recipe": recipe, "seed": seed, "decode": decode}
    if is_url(path):
        options["remote"] = remote
    if kind == "folder":
        from fastpipe.data.datasets.folders import ImageFolder

        return ImageFolder(path, **options)
    if kind == "list":
        from fastpipe.data.sources.folder import ListSource

        listed = ListSource(path, remote=options.pop("remote", None))
        return RecordDataset(listed, **options)
    if kind == "hdf5":
        from fastpipe.data.datasets.readers import H5Dataset

        dataset: RecordDataset = H5Dataset(path, **options, fields=_pair_of(path, kind, remote))
    elif kind == "lmdb":
        from fastpipe.data.datasets.readers import LMDBDataset

        dataset = LMDBDataset(path, **options, fields=_pair_of(path, kind, remote))
    elif kind == "parquet":
        from fastpipe.data.datasets.readers import ParquetDataset

        dataset = ParquetDataset(path, **options, fields=_pair_of(path, kind, remote))
    else:
        from fastpipe.data.datasets.readers import TarDataset

        dataset = TarDataset(path, **options, fields=_pair_of(path, kind, remote))
    return dataset


def _pair_of(path: str | os.PathLike, kind: str, remote: Any) -> list[str] | None:
    """The image and label fields of a source that is not already a pair (None for a pair)."""
    from fastpipe.data.sources.resolve import resolve

    with resolve(path, remote=remote) as source:
        schema = source.schema
    if schema.record == "pair":
        return None
    images = [n for n, f in schema.fields.items() if f.kind == "image"]
    label = schema.label or next((n for n, f in schema.fields.items() if f.kind == "int"), None)
    if len(images) != 1 or label is None:
        raise ValueError(f"{path} ({kind}) holds records of the fields {schema.names}; image "
                         "classification reads one image field and one int label field: read it "
                         "with the dataset class and fields=[image, label]")
    return [images[0], label]


_WHAT = {"images": "images without class folders", "arrays": ".npy/.npz arrays",
         "columns": "a list of records (#fields)"}
