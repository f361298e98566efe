"""LMDB packs as a source: one value per field and sample (``f/<field>/<index>``, format version
2), or a format version 1 ``(image, label)`` pack (``data/<index>`` and one labels array), read
as a record of the fields ``image`` and ``label`` as :mod:`fastpipe.data.sources.h5` reads its
HDF5 twin.

The environment opens lazily in each process with ``readonly=True, lock=False,
readahead=False``, shared by the sources of one file in that process (py-lmdb refuses to open an
environment twice), with one long read transaction per thread. A batch fetches each field's
values with one ``getmulti`` call, and a fixed field's values are copied from LMDB's map into
the batch's block in one call without the GIL (the reader engine's ``copy_buffers``). lmdb is
imported when a pack opens, not with this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe._optional import require
from fastpipe.data.format import fields as F
from fastpipe.data.format import layout as fmt
from fastpipe.data.format.layout import PackFormatError, lmdb_crc_key, lmdb_field_key
from fastpipe.data.format.roles import Image, Label
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources._engine import copy_buffers, resource_error, too_many_open_files

__all__ = ["LMDBSource", "lmdb_crc_key", "lmdb_field_key", "lmdb_module"]

IMAGE, LABEL = "image", "label"


def lmdb_module():
    return require("lmdb", extra="lmdb", feature="LMDB packs")


# py-lmdb refuses to open one environment twice in a process (and a forked child inherits that
# bookkeeping), so the readers of one file share one environment per process.
_ENVS: dict[str, list] = {}  # real path -> [environment, users, pid]
_ENVS_LOCK = threading.Lock()


def _new_envs_lock() -> None:
    global _ENVS_LOCK
    _ENVS_LOCK = threading.Lock()  # a fork while another thread held it must not deadlock the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_envs_lock)


def acquire_env(path: Path):
    lmdb = lmdb_module()
    key = os.path.realpath(path)
    pid = os.getpid()
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is not None and entry[2] != pid:
            # Inherited through fork: an LMDB environment must not cross a fork, so close this
            # process's copy (the parent's stays open) and open our own.
            try:
                entry[0].close()
            except Exception:  # noqa: BLE001 - best effort on an inherited handle
                pass
            del _ENVS[key]
            entry = None
        if entry is None:
            try:
                env = lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False,
                                readahead=False, max_readers=1024)
            except lmdb.Error as exc:
                if resource_error(exc):
                    raise too_many_open_files(str(path), exc) from exc
                raise PackFormatError(f"cannot open {path} as LMDB ({exc}): not a fastpipe pack or "
                                      "damaged") from exc
            entry = _ENVS[key] = [env, 0, pid]
        entry[1] += 1
        return entry[0]


def release_env(path: Path, env) -> None:
    key = os.path.realpath(path)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None or entry[0] is not env or entry[2] != os.getpid():
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _ENVS[key]
            env.close()


class _Transactions:
    """One process's environment of a pack and a read transaction per thread (an LMDB
    transaction must not be used by two threads at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = acquire_env(path)
        self._txns: dict[int, Any] = {}
        self._lock = threading.Lock()

    def txn(self):
        txn = self._txns.get(threading.get_ident())
        if txn is None:
            with self._lock:
                if self.env is None:
                    raise ValueError(f"{self.path}: the pack reader is closed")
                # Thread workers start per epoch: end the transactions of threads that ended.
                alive = {thread.ident for thread in threading.enumerate()}
                for ident in [i for i in self._txns if i not in alive]:
                    self._txns.pop(ident).abort()
                txn = self._txns[threading.get_ident()] = self.env.begin(buffers=True)
        return txn

    def get(self, key: bytes):
        lmdb = lmdb_module()
        try:
            return self.txn().get(key)
        except lmdb.Error as exc:  # a damaged page, B-tree or value
            raise PackFormatError(f"{self.path}: cannot read the key {key!r} ({exc}); the file "
                                  "is damaged (run fastpipe verify on it)") from exc

    def get_many(self, keys: list[bytes]) -> list[Any]:
        """The values of ``keys`` (None for a missing one), fetched in one call."""
        lmdb = lmdb_module()
        try:
            with self.txn().cursor() as cursor:
                found = dict(cursor.getmulti(keys))
        except lmdb.Error as exc:
            raise PackFormatError(f"{self.path}: cannot read the keys {keys[0]!r} ... ({exc}); "
                                  "the file is damaged (run fastpipe verify on it)") from exc
        return [found.get(key) for key in keys]

    def close(self) -> None:
        with self._lock:
            txns, self._txns = list(self._txns.values()), {}
            env, self.env = self.env, None
        for txn in txns:
            try:
                txn.abort()
            except Exception:  # noqa: BLE001 - the transaction may already be gone
                pass
        if env is not None:
            release_env(self.path, env)


class LMDBSource(Source):
    """Records of an LMDB pack (format version 1 or 2)."""

    def __init__(self, path: str | os.PathLike, names: Sequence[str] | None = None) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        if not self.path.exists():
            raise FileNotFoundError(f"no such pack: {self.where}")
        self._labels: dict[str, np.ndarray] = {}  # int columns with classes, read at open
        handles = _Transactions(self.path)
        try:
            raw = handles.get(fmt.LMDB_META)
            if raw is None:
                raise PackFormatError(f"{self.where} is an LMDB file but not a fastpipe pack (no "
                                      f"{fmt.LMDB_META!r} key)")
            self.meta = fmt.parse_meta(bytes(raw), self.where, fmt.LMDB_META.decode())
            self.count = int(self.meta["count"])
            self.version = self.meta["version"]
            schema = (self._version1(handles) if self.version == fmt.IMAGE_VERSION
                      else self._version2(handles))
        finally:
            handles.close()
        self.stored_label = schema.label
        self.schema = schema.select(names, self.where) if names is not None else schema

    def _version1(self, handles: _Transactions) -> Schema:
        spec = fmt.Spec.from_meta(self.meta)
        self.spec = spec
        classes = list(self.meta["classes"])
        labels = self._array(handles, fmt.LMDB_LABELS, "<i8").astype(np.int64)
        fmt.check_labels(labels, classes, self.where)
        self._labels[LABEL] = labels
        if self.count and handles.get(fmt.lmdb_data_key(self.count - 1)) is None:
            raise PackFormatError(f"{self.where} has no key for its last sample "
                                  f"{self.count - 1}: the pack was cut short; the file is damaged")
        image = (F.ImageField() if spec.storage == "bytes"
                 else F.ArrayField(spec.dtype, tuple(spec.sample_shape),
                                   role=Image() if spec.layout == "CHW" else None))
        return Schema({IMAGE: image, LABEL: F.IntField("int64", role=Label())}, "pair",
                      {LABEL: classes})

    def _version2(self, handles: _Transactions) -> Schema:
        fields = fmt.record_fields(self.meta, self.where)
        classes = dict(self.meta.get("classes") or {})
        self.schema = Schema(fields, "dict", classes)  # what _read needs below
        for name, names_of in classes.items():
            if fields[name].kind == "int":
                labels = self._column(handles, name).astype(np.int64)
                fmt.check_labels(labels, names_of, self.where, name)
                self._labels[name] = labels
        record = (self.meta.get("record") if self.meta.get("record") in ("tuple", "pair")
                  else "dict")
        return Schema(fields, record, classes)

    def _column(self, handles: _Transactions, name: str) -> np.ndarray:
        """Every sample's value of a fixed field, fetched a block of keys per call."""
        field = self.schema.fields[name]
        out = np.empty((self.count, *field.row_shape), field.stored_dtype)
        block = 1 << 16
        for start in range(0, self.count, block):
            stop = min(self.count, start + block)
            raws = handles.get_many([self._key(name, i) for i in range(start, stop)])
            for i, raw in zip(range(start, stop), raws, strict=True):
                out[i] = self._value(i, name, raw)
        return out

    def _array(self, handles: _Transactions, key: bytes, dtype: str) -> np.ndarray:
        raw = handles.get(key)
        if raw is None:
            raise PackFormatError(f"{self.where} is a fastpipe pack without the key {key!r}; the "
                                  "file is damaged")
        size = np.dtype(dtype).itemsize
        if len(raw) != self.count * size:
            raise PackFormatError(f"{self.where}: {key!r} holds {len(raw)} bytes, expected "
                                  f"{self.count} values of {size} bytes; the file is damaged")
        return np.frombuffer(bytes(raw), dtype)

    def _key(self, name: str, index: int) -> bytes:
        if self.version == fmt.IMAGE_VERSION:
            return fmt.lmdb_data_key(index)
        return lmdb_field_key(name, index)

    def _value(self, index: int, name: str, raw: Any) -> Any:
        """The stored value of field ``name`` of sample ``index`` from its LMDB value (None when
        the key is missing), checked against the field's dtype and row shape."""
        if raw is None:
            raise PackFormatError(f"{self.where}: field {name!r} of sample {index} is missing (no "
                                  f"key {self._key(name, index)!r}); the file is damaged")
        field = self.schema.fields[name]
        dtype = np.dtype(field.stored_dtype)
        row_size = int(np.prod(field.row_shape, dtype=np.int64)) * dtype.itemsize
        if (len(raw) % row_size if field.variable and row_size else len(raw) != row_size):
            raise PackFormatError(
                f"{self.where}: field {name!r} of sample {index} holds {len(raw)} bytes, not "
                f"{'a whole number of' if field.variable else 'one'} {dtype} row of shape "
                f"{field.row_shape} ({row_size} bytes); the file is damaged")
        row = np.frombuffer(raw, dtype).copy()  # the buffer ends with the transaction
        return row.reshape((-1, *field.row_shape)) if field.variable else \
            row.reshape(field.row_shape)

    def _open(self) -> _Transactions:
        return _Transactions(self.path)

    def _close(self, handles: _Transactions) -> None:
        handles.close()

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        handles = self._handles()
        record: dict[str, Any] = {}
        for name in names:
            labels = self._labels.get(name)
            if labels is not None:
                dtype = self.schema.fields[name].stored_dtype
                record[name] = labels[index:index + 1].astype(dtype)[0]
            else:
                record[name] = self._value(index, name, handles.get(self._key(name, index)))
        return record

    def _read_batch(self, indices: np.ndarray, names: Sequence[str],
                    blocks: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        handles = self._handles()
        out: list[dict[str, Any]] = [{} for _ in range(len(indices))]
        for name in names:
            labels = self._labels.get(name)
            block = blocks.get(name)
            if labels is not None:
                values = labels[indices].astype(self.schema.fields[name].stored_dtype)
                if block is not None:
                    block[...] = values.reshape(block.shape)
                    continue
                for record, value in zip(out, values, strict=True):
                    record[name] = value
                continue
            raws = handles.get_many([self._key(name, int(i)) for i in indices])
            if block is not None:  # the values straight from LMDB's map into the block
                wrong = copy_buffers(raws, block)
                if wrong is not None:
                    self._value(int(indices[wrong]), name, raws[wrong])  # raises, naming it
                continue
            for k, (index, raw) in enumerate(zip(indices.tolist(), raws, strict=True)):
                out[k][name] = self._value(index, name, raw)
        return out

    def read_block(self, name: str, start: int, stop: int) -> np.ndarray:
        """The stored rows of samples ``[start, stop)`` of field ``name``, back to back."""
        field = self.schema.fields[name]
        rows = [record[name] for record in self._read_batch(
            np.arange(start, stop, dtype=np.int64), [name], {})]
        if not rows:
            return np.zeros((0, *field.row_shape), field.stored_dtype)
        return np.concatenate(rows) if field.variable else np.stack(rows)

    def crc32(self, name: str) -> np.ndarray | None:
        """The checksums the pack stores of field ``name``, None for a field without."""
        key = fmt.LMDB_CRC32 if self.version == fmt.IMAGE_VERSION else lmdb_crc_key(name)
        if self.version == fmt.IMAGE_VERSION and name != IMAGE:
            return None
        return self._array(self._handles(), key, "<u4").astype(np.uint32)

    def offsets(self, name: str) -> None:
        return None

    def paths(self, start: int, stop: int) -> list[str]:
        handles = self._handles()
        out = []
        for i in range(start, stop):
            raw = handles.get(fmt.lmdb_path_key(i))
            if raw is None:
                raise PackFormatError(f"{self.where} has no key {fmt.lmdb_path_key(i)!r} for "
                                      f"sample {i}; the file is damaged")
            out.append(bytes(raw).decode("utf-8", "replace"))
        return out

    def describe(self, index: int) -> str:
        try:
            return f"{self.where}[{index}] (packed from {self.paths(index, index + 1)[0]})"
        except Exception:  # noqa: BLE001 - a message must not fail on a damaged pack
            return f"{self.where}[{index}]"

    def labels(self) -> np.ndarray | None:
        """The int64 labels of every sample, from the label field (read once), or None."""
        name = self.stored_label
        if name is None:
            return None
        labels = self._labels.get(name)
        if labels is None and self.schema.fields.get(name) is not None:
            labels = self._labels[name] = self._column(self._handles(), name).astype(np.int64)
        return labels

    def fingerprint(self) -> str:
        digest = hashlib.sha256(str(self.meta.get("plan") or self.path).encode())
        if self.version != fmt.IMAGE_VERSION:
            digest.update(f"{self.count}\0{self.meta.get('fields')}".encode())
        labels = self.labels()
        if labels is not None:
            digest.update(labels.tobytes())
        return digest.hexdigest()[:16]


def lmdb_version(path: str | os.PathLike) -> int | None:
    """The format version an LMDB pack's metadata names (None when it has none)."""
    handles = _Transactions(Path(path))
    try:
        raw = handles.get(fmt.LMDB_META)
        meta = json.loads(bytes(raw).decode()) if raw is not None else None
    except (ValueError, RecursionError, PackFormatError):
        meta = None
    finally:
        handles.close()
    version = meta.get("version") if isinstance(meta, dict) else None
    return version if isinstance(version, int) else None
