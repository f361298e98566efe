"""LMDB packs: ``LMDBDataset`` (a map-style dataset over an LMDB pack, made with
``fastpipe pack --format lmdb``) and the per-process reader it opens.

lmdb is imported when a pack opens, not with this module.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe._optional import require
from fastpipe.data._format import (
    LMDB_CRC32,
    LMDB_LABELS,
    LMDB_META,
    PackFormatError,
    PackReader,
    Spec,
    check_labels,
    lmdb_data_key,
    lmdb_path_key,
    parse_meta,
    record_fields,
)
from fastpipe.data._pack_dataset import PackDataset

__all__ = ["LMDBDataset"]


class LMDBDataset(PackDataset):
    """Reads an LMDB pack, with the same interface as :class:`fastpipe.data.H5Dataset`.

    The environment opens lazily in each process with ``readonly=True, lock=False,
    readahead=False`` and one long read transaction, so DataLoader workers under fork or spawn
    each hold their own handle.
    """

    _format = "lmdb"


def lmdb_module():
    return require("lmdb", extra="lmdb", feature="LMDB packs")


from fastpipe.data.sources.lmdb import acquire_env as _lmdb_acquire  # noqa: E402
from fastpipe.data.sources.lmdb import release_env as _lmdb_release  # noqa: E402


class LMDBPackReader(PackReader):
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        where = str(self.path)
        if not self.path.exists():
            raise FileNotFoundError(f"no such pack: {where}")
        self._env = _lmdb_acquire(self.path)
        # One read transaction per thread: an LMDB transaction must not be used by two threads at
        # once, and DataLoaderX(worker_method="thread") reads from several.
        self._txns: dict[int, Any] = {}  # thread ident -> its transaction
        self._txns_lock = threading.Lock()
        try:
            self.meta = self._meta(where)
            self.spec = Spec.from_meta(self.meta)
            self.count = int(self.meta["count"])
            self.classes = list(self.meta["classes"])
            self.labels = self._array(LMDB_LABELS, "<i8").astype(np.int64)
            check_labels(self.labels, self.classes, where)
            if self.count:  # the last sample is there: the pack was not cut short
                self._get(lmdb_data_key(self.count - 1), self.count - 1)
        except BaseException:
            self.close()
            raise

    def _meta(self, where: str) -> dict[str, Any]:
        raw = self._lookup(LMDB_META)
        if raw is None:
            raise PackFormatError(f"{where} is an LMDB file but not a fastpipe pack (no "
                                  f"{LMDB_META!r} key)")
        return parse_meta(bytes(raw), where, LMDB_META.decode())

    def _lookup(self, key: bytes):
        lmdb = lmdb_module()
        try:
            return self._txn.get(key)
        except lmdb.Error as exc:  # a damaged page, B-tree or value
            raise PackFormatError(f"{self.path}: cannot read the key {key!r} ({exc}); the file "
                                  "is damaged (run fastpipe verify on it)") from exc

    @property
    def _txn(self):
        txn = self._txns.get(threading.get_ident())
        if txn is None:
            txn = self._begin()
        return txn

    def _begin(self):
        with self._txns_lock:
            if self._env is None:
                raise ValueError(f"{self.path}: the pack reader is closed")
            # Thread workers start per epoch: end the transactions of threads that have ended.
            alive = {thread.ident for thread in threading.enumerate()}
            for ident in [i for i in self._txns if i not in alive]:
                self._txns.pop(ident).abort()
            txn = self._txns[threading.get_ident()] = self._env.begin(buffers=True)
        return txn

    def _array(self, key: bytes, dtype: str) -> np.ndarray:
        raw = self._lookup(key)
        if raw is None:
            raise PackFormatError(f"{self.path} is a fastpipe pack without the key {key!r}; the "
                                  "file is damaged")
        size = np.dtype(dtype).itemsize
        if len(raw) != self.count * size:
            raise PackFormatError(f"{self.path}: {key!r} holds {len(raw)} bytes, expected "
                                  f"{self.count} values of {size} bytes; the file is damaged")
        return np.frombuffer(bytes(raw), dtype)

    def _get(self, key: bytes, index: int):
        raw = self._lookup(key)
        if raw is None:
            raise PackFormatError(f"{self.path} has no key {bytes(key)!r} for sample {index}; the "
                                  "file is damaged")
        return raw

    def read(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        i = self._check_index(index)
        raw = self._get(lmdb_data_key(i), i)
        if self.spec.storage == "bytes":
            return np.frombuffer(raw, np.uint8).copy()
        if out is None:
            out = np.empty(self.spec.sample_shape, self.spec.dtype)
        flat = out.reshape(-1).view(np.uint8)
        if len(raw) != flat.size:
            raise PackFormatError(f"{self.path}: sample {i} holds {len(raw)} bytes, expected "
                                  f"{flat.size}")
        flat[...] = np.frombuffer(raw, np.uint8)
        return out

    def byte_size(self, index: int) -> int:
        i = self._check_index(index)
        return len(self._get(lmdb_data_key(i), i))

    def source(self, index: int) -> str:
        i = self._check_index(index)
        return bytes(self._get(lmdb_path_key(i), i)).decode("utf-8", "replace")

    def sources(self, start: int, stop: int) -> list[str]:
        return [self.source(i) for i in range(start, stop)]

    def crc32(self) -> np.ndarray:
        return self._array(LMDB_CRC32, "<u4").astype(np.uint32)

    def close(self) -> None:
        env = getattr(self, "_env", None)
        if env is not None:
            with self._txns_lock:
                txns, self._txns = list(self._txns.values()), {}
                self._env = None
            for txn in txns:
                try:
                    txn.abort()
                except Exception:  # noqa: BLE001 - the transaction may already be gone
                    pass
            _lmdb_release(self.path, env)


def lmdb_field_key(name: str, index: int) -> bytes:
    return b"f/%s/%010d" % (name.encode(), index)


def lmdb_crc_key(name: str) -> bytes:
    return b"__crc32__/" + name.encode()


def open_lmdb(path: str | os.PathLike) -> LMDBPackReader:
    """The reader of an LMDB pack: records (format version 2) or (image, label)."""
    from fastpipe.data._format import RECORDS_VERSION

    probe = LMDBPackReader.__new__(LMDBPackReader)
    probe.path = Path(path)
    if not probe.path.exists():
        raise FileNotFoundError(f"no such pack: {path}")
    probe._env = _lmdb_acquire(probe.path)
    probe._txns, probe._txns_lock = {}, threading.Lock()
    try:
        raw = probe._lookup(LMDB_META)
        meta = json.loads(bytes(raw).decode()) if raw is not None else None
        version = meta.get("version") if isinstance(meta, dict) else None
    except (ValueError, RecursionError):  # PackFormatError too: the reader explains it
        version = None
    finally:
        probe.close()
    return LMDBRecordReader(path) if version == RECORDS_VERSION else LMDBPackReader(path)


class LMDBRecordReader(LMDBPackReader):
    """Reads a records pack from LMDB: one value per field and sample (``f/<field>/<index>``),
    the stored rows of :mod:`fastpipe.data.fields`; the same interface as the HDF5 records
    reader."""

    plain = False

    def __init__(self, path: str | os.PathLike) -> None:

        self.path = Path(path)
        where = str(self.path)
        self._env = _lmdb_acquire(self.path)
        self._txns: dict[int, Any] = {}
        self._txns_lock = threading.Lock()
        self._labels: dict[str, np.ndarray] = {}  # the columns checked at open, by field
        try:
            self.meta = self._meta(where)
            self.count = int(self.meta["count"])
            self.order = list(self.meta["order"])
            self.fields = record_fields(self.meta, where)
            self.classes = dict(self.meta.get("classes") or {})
            for name, names_of in self.classes.items():
                if self.fields[name].kind == "int":
                    labels = self._column(name).astype(np.int64)
                    check_labels(labels, names_of, where, name)
                    self._labels[name] = labels
        except BaseException:
            self.close()
            raise

    def _column(self, name: str) -> np.ndarray:
        rows = [self.read(i, name) for i in range(self.count)]
        return np.stack(rows) if rows else np.zeros((0, *self.fields[name].row_shape),
                                                    self.fields[name].stored_dtype)

    def read(self, index: int, name: str) -> np.ndarray:
        field = self.fields[name]
        raw = self._lookup(lmdb_field_key(name, index))
        if raw is None:
            raise PackFormatError(f"{self.path}: field {name!r} of sample {index} is missing (no "
                                  f"key {lmdb_field_key(name, index)!r}); the file is damaged")
        dtype = np.dtype(field.stored_dtype)
        row_size = int(np.prod(field.row_shape, dtype=np.int64)) * dtype.itemsize
        if (len(raw) % row_size if field.variable and row_size else len(raw) != row_size):
            raise PackFormatError(
                f"{self.path}: field {name!r} of sample {index} holds {len(raw)} bytes, not "
                f"{'a whole number of' if field.variable else 'one'} {dtype} row of shape "
                f"{field.row_shape} ({row_size} bytes); the file is damaged")
        row = np.frombuffer(raw, dtype).copy()  # the buffer ends with the txn
        if field.variable:
            return row.reshape((-1, *field.row_shape))
        return row.reshape(field.row_shape)

    def read_block(self, name: str, start: int, stop: int) -> np.ndarray:
        if name in self._labels:
            return self._labels[name][start:stop].astype(self.fields[name].stored_dtype)
        rows = [self.read(i, name) for i in range(start, stop)]
        if self.fields[name].variable:
            return np.concatenate(rows) if rows else np.zeros((0, *self.fields[name].row_shape))
        return np.stack(rows) if rows else np.zeros((0, *self.fields[name].row_shape))

    def offsets(self, name: str) -> None:
        return None

    def crc32(self, name: str) -> np.ndarray:  # type: ignore[override]
        return self._array(lmdb_crc_key(name), "<u4").astype(np.uint32)
