"""``H5Dataset``, ``LMDBDataset``, ``TarDataset`` and ``ParquetDataset``: a :class:`RecordDataset`
over one kind of source each, built from a path."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.datasets._records import RecordDataset
from fastpipe.data.format.layout import PackFormatError, sniff_format
from fastpipe.data.joint.crop import JointCrop
from fastpipe.recipe import Recipe

__all__ = ["H5Dataset", "LMDBDataset", "ParquetDataset", "TarDataset"]

_KINDS = {"hdf5": ("HDF5", "H5Dataset"), "lmdb": ("LMDB", "LMDBDataset")}


def _local(path: str | os.PathLike, kind: str, remote: Any) -> tuple[Path, Any, str | Path]:
    """(the pack's local file, what holds a remote pack's copy in the node's cache or None, how
    the dataset names the pack)."""
    from fastpipe.data.remote.options import RemoteOptions
    from fastpipe.data.remote.urls import is_url, redact

    if not is_url(path):
        if remote is not None:
            raise ValueError("remote= says how URLs are read; this is a local path (give a URL, "
                             "or leave remote=None)")
        return Path(path), None, Path(path)
    from fastpipe.data.sources.cached import pack_copy

    local, files = pack_copy(str(path), kind, RemoteOptions.of(remote))
    return Path(local), files, redact(str(path))


def _check_kind(path: Path, wanted: str, owner: str) -> None:
    """Refuses a pack of the other kind with the class that reads it."""
    try:
        found = sniff_format(path)
    except PackFormatError:
        return  # the source explains what the file is not
    if found != wanted:
        name, reader = _KINDS[found]
        raise PackFormatError(f"{path} is an {name} file, but {owner} reads "
                              f"{_KINDS[wanted][0]} packs: open it with fastpipe.data.{reader}")


class H5Dataset(RecordDataset):
    """Reads an HDF5 pack: ``dataset[i] -> (image, label)``; a records pack or a plain HDF5
    file (top-level datasets sharing their first dimension, one row per sample) as records:
    ``dataset[i] -> {"mix": tensor, "zone0": tensor}``, or a tuple with ``fields=[...]`` (see
    docs/your-data.md).

    Bytes storage: ``decoder(data, source)`` turns the stored bytes (uint8 1-D array) into the
    image; the default decodes fully to a uint8 ``(3, H, W)`` tensor; with ``recipe=`` and
    ``decode="gpu"`` the image fields stay encoded, for ``DataPrefetcher`` to decode on the GPU
    (the same crop and flip per sample; see
    :class:`~fastpipe.data.datasets._records.RecordDataset`). Array storage: the stored
    array as a tensor (images as uint8 ``(3, H, W)``).

    Safe with DataLoader workers under fork and spawn (the file opens lazily in each process) and
    with DistributedSampler. Plain data (contiguous or chunked along the sample axis,
    uncompressed) is read straight from the file, a batch's rows in one call without the GIL;
    anything else through h5py with the chunk cache off.

    A pack in object storage is named by URL (``"s3://bucket/train.h5"``, ``"https://..."``;
    ``remote=``: a :class:`~fastpipe.data.RemoteOptions`): it is downloaded whole into the
    node's cache once per node, every field of every sample checked against the checksums the
    pack stores before it is used, and read from there (docs/object-storage.md).

    ``auto_augment`` and ``transform`` follow, with every random draw of sample ``i`` a pure
    function of ``(seed, epoch, i)`` (``set_epoch``), as in :class:`~fastpipe.data.ImageFolder`.

    Attributes: ``targets`` (int64 numpy array), ``classes``, ``fields`` (name -> field),
    ``file`` (the pack), ``storage`` (``"bytes"``/``"array"`` for an ``(image, label)`` pack,
    ``"fields"`` for records), ``meta`` (the pack's JSON metadata), ``skipped`` (inputs left out
    when packing). Raw access: :meth:`encoded` (bytes storage) and :meth:`path`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        decoder: Callable[[np.ndarray, str], Any] | None = None,
        transform: Callable[[Any], Any] | None = None,
        auto_augment: str | None = None,
        seed: int | None = None,
        *,
        recipe: Recipe | None = None,
        fields: Sequence[str] | None = None,
        joint: JointCrop | None = None,
        decode: str = "cpu",
        remote: Any = None,
    ) -> None:
        from fastpipe.data.sources.h5 import H5Source

        local, held, self.file = _local(path, "hdf5", remote)
        _check_kind(local, "hdf5", "H5Dataset")
        source = H5Source(local, fields)
        if held is not None:
            source.where, source.remote = str(self.file), held
        super().__init__(source, decoder, transform, auto_augment, seed,
                         recipe=recipe, fields=fields, joint=joint, decode=decode)


class LMDBDataset(RecordDataset):
    """Reads an LMDB pack, with the same interface as :class:`fastpipe.data.H5Dataset`.

    The environment opens lazily in each process with ``readonly=True, lock=False,
    readahead=False`` and one long read transaction per thread, so DataLoader workers under fork
    or spawn each hold their own handle. A pack in object storage (its URL, or an LMDB folder's
    with its ``data.mdb``; ``remote=``) is read as an HDF5 one is: downloaded whole into the
    node's cache and checked once per node.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        decoder: Callable[[np.ndarray, str], Any] | None = None,
        transform: Callable[[Any], Any] | None = None,
        auto_augment: str | None = None,
        seed: int | None = None,
        *,
        recipe: Recipe | None = None,
        fields: Sequence[str] | None = None,
        joint: JointCrop | None = None,
        decode: str = "cpu",
        remote: Any = None,
    ) -> None:
        from fastpipe.data.sources.lmdb import LMDBSource

        local, held, self.file = _local(path, "lmdb", remote)
        _check_kind(local, "lmdb", "LMDBDataset")
        source = LMDBSource(local)
        if held is not None:
            source.where, source.remote = str(self.file), held
        super().__init__(source, decoder, transform, auto_augment, seed,
                         recipe=recipe, fields=fields, joint=joint, decode=decode)


class TarDataset(RecordDataset):
    """Reads WebDataset tar shards in place: ``dataset[i] -> {"jpg": image, "cls": label, ...}``.

    ``shards``: a folder (its ``*.tar`` files), a glob (``"train/shard-*.tar"``), a shard, or a
    list of shards. Fields are named by the members' extensions: images (``jpg``, ``png``, ...)
    decode like :class:`~fastpipe.data.H5Dataset`'s (``recipe=`` for fastpipe's fast path),
    ``cls``/``index``/``id`` are ints, ``txt``/``json`` strings, ``npy`` arrays, the rest bytes;
    pickles are refused. ``fields=["jpg", "cls"]`` picks and orders them and returns a tuple;
    ``joint=`` crops the image fields together, as in :class:`~fastpipe.data.H5Dataset`.

    The index is built once per shard and cached beside it (in the cache folder where the
    shards' folder is read-only); workers (fork, spawn, threads) open their own file
    descriptors.

    Shards in object storage are named by URL: ``"s3://bucket/train/"`` (its ``*.tar``),
    ``"s3://bucket/train/shard-{000000..000099}.tar"``, ``"gs://..."``, ``"https://..."``,
    ``"hf://datasets/..."`` or a list of URLs; ``remote=`` (a
    :class:`~fastpipe.data.RemoteOptions`: credentials and endpoint, the cache's folder and
    size, retries) says how they are read: through a cache on the node's disk that every rank and
    worker of the node shares, each shard downloaded once per node (docs/object-storage.md).

    ``shards`` may also be a shard list (``"s3://bucket/train/shards.json"``, or a local one):
    webdataset's JSON of the shards and their sample counts, as
    :func:`~fastpipe.data.write_shard_list` writes it. The dataset is then built from the first
    shard alone, and each shard indexed (for a remote one: downloaded) when it is first read.
    """

    def __init__(
        self,
        shards: str | os.PathLike | Sequence[str | os.PathLike],
        decoder: Any = None,
        transform: Any = None,
        auto_augment: str | None = None,
        seed: int | None = None,
        *,
        recipe: Any = None,
        fields: Sequence[str] | None = None,
        joint: Any = None,
        remote: Any = None,
        decode: str = "cpu",
    ) -> None:
        from fastpipe.data.sources.tar import TarSource

        source = TarSource(shards, fields, remote)
        if source.remote is not None:
            self.file = source.where
        else:
            self.file = Path(shards) if isinstance(shards, (str, os.PathLike)) \
                else source.shards[0]
        self._shards = source.shards
        super().__init__(source, decoder, transform, auto_augment, seed, recipe=recipe,
                         fields=fields, joint=joint, decode=decode)

    def __repr__(self) -> str:
        return (f"TarDataset({len(self._shards)} shards, samples={len(self)}, "
                f"fields={self._names})")


class ParquetDataset(RecordDataset):
    """Reads Parquet files in place, a Hugging Face Hub image dataset included:
    ``dataset[i] -> {"image": image, "label": 3, ...}``, a field per column.

    ``path``: a Parquet file, a list of them, a glob, or a folder (its ``.parquet`` files at any
    depth): a Hub dataset's folder as downloaded (``data/train-00000-of-00294.parquet``, ...)
    opens whole, one split at a time (``split="train"``; needed when it holds several, and a
    split with files missing is refused, naming them). Image columns (the Hub's
    ``{"bytes", "path"}`` struct, or binary columns of encoded images) decode like
    :class:`~fastpipe.data.H5Dataset`'s (``recipe=`` for fastpipe's fast path, ``joint=`` to crop
    image fields together); a ``ClassLabel`` column is the label (``targets``, ``classes``);
    numbers are scalars, lists arrays, strings str. ``fields=["image", "label"]`` picks and
    orders them and returns a tuple.

    Files in object storage are named by URL (``"hf://datasets/ORG/NAME"`` as the Hub holds it,
    ``"s3://bucket/train/"``, a pattern, a list of URLs); ``remote=`` (a
    :class:`~fastpipe.data.RemoteOptions`) says how they are read: their footers by ranges when
    the dataset is built, then each file through the node's cache, downloaded once per node,
    fetched ahead in the order fastpipe's samplers read them (docs/object-storage.md).

    Rows are read a row group at a time (Parquet's smallest readable part); each process keeps
    the row groups it decoded up to ``row_group_cache`` bytes. Read it in a shard-aware order
    (``window=`` of fastpipe's samplers, docs/object-storage.md), so that a row group is read
    once for many samples; a uniform shuffle over many row groups reads one per sample (warned).
    Workers (fork, spawn, threads) open their own files; ``pip install 'fastpipe[parquet]'``.
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        decoder: Any = None,
        transform: Any = None,
        auto_augment: str | None = None,
        seed: int | None = None,
        *,
        recipe: Any = None,
        fields: Sequence[str] | None = None,
        joint: Any = None,
        split: str | None = None,
        row_group_cache: int | None = None,
        remote: Any = None,
        decode: str = "cpu",
    ) -> None:
        from fastpipe.data.sources.parquet import ROW_GROUP_CACHE, ParquetSource

        source = ParquetSource(path, fields, split=split, cache_bytes=ROW_GROUP_CACHE
                               if row_group_cache is None else row_group_cache, remote=remote)
        self.file = source.root if source.root is not None else (
            source.where if source.remote is not None else source.files[0])
        self.files = list(source.files)
        super().__init__(source, decoder, transform, auto_augment, seed, recipe=recipe,
                         fields=fields, joint=joint, decode=decode)

    def shard_sizes(self) -> np.ndarray:
        """Samples per file, in index order (the shards of ``window=``)."""
        return self.source.shard_sizes()

    def __repr__(self) -> str:
        return (f"ParquetDataset({len(self.files)} files, samples={len(self)}, "
                f"fields={self._names})")
