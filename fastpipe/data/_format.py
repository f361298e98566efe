"""The fastpipe pack format (HDF5 and LMDB): its names, version, sample spec and metadata checks.

The format is documented in ``docs/packing.md``; keep the two in step. The readers live beside
their datasets (:mod:`fastpipe.data.h5`, :mod:`fastpipe.data.lmdb`) and are imported by
:func:`open_pack` only when a pack of their kind opens, so h5py and lmdb load with the first pack,
not with ``fastpipe.data``. Readers are plain objects owned by one process: datasets create them
lazily (after a fork or in a spawned worker) and never pickle them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "fastpipe-pack"
VERSION = 2  # the newest version this fastpipe reads
IMAGE_VERSION = 1  # (image, label) packs: the names below, one "data" and one "labels" dataset
RECORDS_VERSION = 2  # records: one dataset per field (the names after them)

# HDF5 names. Root attributes mark the file; everything else lives in these datasets.
ATTR_FORMAT = "fastpipe_format"
ATTR_VERSION = "fastpipe_format_version"
META = "meta"  # scalar UTF-8 string dataset holding the JSON metadata (attributes cap at 64 KiB)
LABELS = "labels"  # int64 (N,)
CRC32 = "crc32"  # uint32 (N,): zlib.crc32 of each stored sample's bytes
OFFSETS = "offsets"  # int64 (N+1,), bytes storage only: sample i is data[offsets[i]:offsets[i+1]]
DATA = "data"  # uint8 (total_bytes,) for bytes storage; (N, *sample_shape) for array storage
PATH_OFFSETS = "path_offsets"  # int64 (N+1,)
PATH_DATA = "path_data"  # uint8 UTF-8 source paths, concatenated

# Version 2 (records). Each field is a dataset at the root named after it, so that plain h5py
# reads ``f[field][i]``: fixed-shape fields ``(N, *shape)``, variable ones (encoded images, bytes,
# strings, arrays with a variable first axis) the rows of all samples, sample i being rows
# ``offsets[i]:offsets[i+1]``. fastpipe's own datasets live in one group beside them.
INTERNAL = "_fastpipe"
R_META = INTERNAL + "/meta"  # scalar UTF-8 JSON: count, fields, order, classes, plan, ...
R_OFFSETS = INTERNAL + "/offsets"  # group: int64 (N+1,) per variable field
R_CRC32 = INTERNAL + "/crc32"  # group: uint32 (N,) per field, zlib.crc32 of each stored row
R_PATH_OFFSETS = INTERNAL + "/path_offsets"
R_PATH_DATA = INTERNAL + "/path_data"

# LMDB keys.
LMDB_META = b"__meta__"
LMDB_LABELS = b"__labels__"  # little-endian int64 array
LMDB_CRC32 = b"__crc32__"  # little-endian uint32 array


def lmdb_data_key(index: int) -> bytes:
    return b"data/%010d" % index


def lmdb_path_key(index: int) -> bytes:
    return b"path/%010d" % index


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class PackFormatError(ValueError):
    """A file is not a readable fastpipe pack (wrong kind of file, damaged, or a missing key)."""


@dataclass
class Spec:
    """What one sample looks like in a pack."""

    storage: str  # "bytes" or "array"
    layout: str  # "encoded" (bytes), "CHW" (uint8 RGB image, array) or "raw" (any array)
    sample_shape: tuple[int, ...] | None = None
    dtype: str = "uint8"

    def to_json(self) -> dict[str, Any]:
        return {"storage": self.storage, "layout": self.layout,
                "sample_shape": None if self.sample_shape is None else list(self.sample_shape),
                "dtype": self.dtype}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Spec:
        shape = meta.get("sample_shape")
        return cls(meta["storage"], meta["layout"], None if shape is None else tuple(shape),
                   meta.get("dtype", "uint8"))


def sniff_format(path: str | os.PathLike) -> str:
    """``"hdf5"`` or ``"lmdb"`` from the file's content; raises :class:`PackFormatError`
    otherwise."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such pack: {path}")
    if path.is_dir():
        if (path / "data.mdb").is_file():
            return "lmdb"
        raise PackFormatError(f"{path} is a folder without data.mdb: not a fastpipe pack")
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(_HDF5_SIGNATURE):
        return "hdf5"
    # An LMDB data file starts with two meta pages holding the magic 0xBEEFC0DE.
    if len(head) >= 24 and np.frombuffer(head[16:20], "<u4")[0] == 0xBEEFC0DE:
        return "lmdb"
    raise PackFormatError(
        f"{path} is neither an HDF5 nor an LMDB file, so not a fastpipe pack "
        "(make one with: fastpipe pack SOURCE OUTPUT)"
    )


def check_meta(meta: Any, where: str) -> dict[str, Any]:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PackFormatError(f"{where} has no fastpipe metadata: not a fastpipe pack")
    version = meta.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise PackFormatError(
            f"{where} is a fastpipe pack of format version {version}; this fastpipe reads up to "
            f"version {VERSION}: upgrade fastpipe"
        )
    required = ("count", "fields", "order") if version == RECORDS_VERSION else (
        "storage", "layout", "count", "classes")
    for key in required:
        if key not in meta:
            raise PackFormatError(f"{where}: metadata lacks the key {key!r}; the file is damaged")
    if version != RECORDS_VERSION and meta["storage"] not in ("bytes", "array"):
        raise PackFormatError(f"{where}: unknown storage {meta['storage']!r}")
    return meta


def is_record_reader(reader: Any) -> bool:
    """Whether an open reader reads records (named fields) rather than (image, label) pairs."""
    return hasattr(reader, "fields")


def is_records(meta: dict[str, Any]) -> bool:
    """Whether checked metadata describes a records pack (format version 2)."""
    return meta.get("version") == RECORDS_VERSION


class PackReader:
    """Reads one pack in one process. Index arrays are loaded at open; samples on demand."""

    path: Path
    meta: dict[str, Any]
    spec: Spec
    count: int
    labels: np.ndarray
    classes: list[str]

    def read(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """Sample ``index``: flat uint8 bytes (bytes storage) or the sample array (array
        storage)."""
        raise NotImplementedError

    def source(self, index: int) -> str:
        raise NotImplementedError

    def crc32(self) -> np.ndarray:
        raise NotImplementedError

    def byte_size(self, index: int) -> int:
        return int(np.prod(self.spec.sample_shape)) * np.dtype(self.spec.dtype).itemsize

    def close(self) -> None:
        pass

    def _check_index(self, index: int) -> int:
        n = self.count
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"pack index must be an int, got {type(index).__name__}")
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {index} is out of range for {self.path} with {n} samples")
        return i

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_pack(path: str | os.PathLike, format: str | None = None) -> Any:
    """Opens an HDF5 or LMDB pack (format sniffed from the file unless given) in this process:
    a :class:`PackReader` for an (image, label) pack, a records reader for a records pack."""
    fmt = format or sniff_format(path)
    if fmt == "hdf5":
        from fastpipe.data.h5 import H5PackReader, H5RecordReader, h5_version

        if h5_version(path) == RECORDS_VERSION:
            return H5RecordReader(path, plain=False)
        return H5PackReader(path)
    if fmt == "lmdb":
        from fastpipe.data.lmdb import open_lmdb

        return open_lmdb(path)
    raise ValueError(f"format must be 'hdf5' or 'lmdb', got {format!r}")
