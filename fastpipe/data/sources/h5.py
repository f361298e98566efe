"""HDF5 as a source: fastpipe's packs (format versions 1 and 2, their virtual merges) and the plain
HDF5 files users write (top-level datasets sharing their first dimension, one row per sample).

Every field is a column: its rows read straight from the file through the reader engine
(fastpipe.data.sources._engine) where they are plain, through h5py otherwise (filters, strings,
variable-length or compound data of a user's file). A format version 1 pack (an ``(image,
label)`` pack) reads as a record of two fields, ``image`` and ``label``, through the same columns:
the compatibility mapping is :meth:`H5Source._version1` alone. Everything a read slices with
(offsets, labels, where each chunk lies, the parts of a virtual merge) is read and checked once,
when the source is built, and kept in the object: a damaged index is an error then, not another
sample's bytes later, and worker processes do not read it again.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.format import fields as F
from fastpipe.data.format import layout as fmt
from fastpipe.data.format.layout import PackFormatError
from fastpipe.data.format.roles import Image, Label
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources._engine import (
    Extents,
    FilePool,
    ShortRead,
    read_pieces,
    read_rows,
)
from fastpipe.data.sources._hdf5 import (
    H5_ERRORS,
    FileTable,
    check_virtual_sources,
    dataset_extents,
    h5_damaged,
    h5_version,
    h5py_module,
    open_h5,
    read_index,
    require_dataset,
)

__all__ = ["H5Source"]

# The name of the image and label fields of a format version 1 pack, read as records.
IMAGE, LABEL = "image", "label"


@dataclass
class _Column:
    """How one field's stored rows are read: ``extents`` (straight from the files), ``memory``
    (rows held here: labels, read at construction), or ``dataset`` (through h5py, in ``file``).
    A variable field's sample ``i`` is rows ``offsets[i]:offsets[i + 1]``."""

    field: Any
    offsets: np.ndarray | None = None
    extents: Extents | None = None
    memory: np.ndarray | None = None
    dataset: str | None = None
    file: str = ""
    crc32: str | None = None  # the checksum dataset of a pack's field


class H5Source(Source):
    """Records of one HDF5 file: a fastpipe pack or a plain HDF5 file.

    ``names`` picks the fields (the datasets of a plain file; nested ones as ``"group/name"``).
    """

    def __init__(self, path: str | os.PathLike, names: Sequence[str] | None = None) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.version = h5_version(self.path)
        self.plain = self.version is None
        self._files = FileTable()
        self._columns: dict[str, _Column] = {}
        # Our packs are read a row at a time: no chunk cache. A user's file may be compressed in
        # chunks of many rows, where h5py's default cache saves decoding a chunk per row.
        f = open_h5(self.path, **({} if self.plain else {"rdcc_nbytes": 0}))
        try:
            if self.plain:
                schema = self._plain(f, names)
            elif self.version == fmt.IMAGE_VERSION:
                schema = self._version1(f)
            else:
                schema = self._version2(f)
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(self.where, exc) from exc
        finally:
            f.close()
        # Labels come from every stored field, whichever fields= picks.
        self.stored_label = schema.label
        if names is not None and not self.plain:
            schema = schema.select(names, self.where)
        self.schema = schema
        self._path_offsets: np.ndarray | None = None

    # ------------------------------------------------------------------------ what a file holds

    def _version1(self, f) -> Schema:
        """An ``(image, label)`` pack: ``data`` (flat encoded bytes with ``offsets``, or rows of
        decoded arrays) is the field ``image``, ``labels`` the field ``label``."""
        where = self.where
        meta = _pack_meta(f, fmt.META, where)
        spec = fmt.Spec.from_meta(meta)
        self.meta, self.count = meta, int(meta["count"])
        classes = list(meta["classes"])
        labels = read_index(f, fmt.LABELS, where, (self.count,), np.int64, mapped=True)
        fmt.check_labels(labels, classes, where)
        require_dataset(f, fmt.PATH_DATA, where)
        require_dataset(f, fmt.PATH_OFFSETS, where)
        data = require_dataset(f, fmt.DATA, where)
        offsets = None
        if spec.storage == "bytes":
            image: Any = F.ImageField()
            if data.ndim != 1:
                raise PackFormatError(f"{where}: '{fmt.DATA}' has shape {data.shape}, not the flat "
                                      "bytes of bytes storage; the file is damaged")
            offsets = read_index(f, fmt.OFFSETS, where, (self.count + 1,), np.int64, mapped=True)
            fmt.check_offsets(offsets, data.shape[0], where, f"'{fmt.OFFSETS}'")
        else:
            image = F.ArrayField(spec.dtype, tuple(spec.sample_shape),
                                 role=Image() if spec.layout == "CHW" else None)
            if tuple(data.shape) != (self.count, *spec.sample_shape):
                raise PackFormatError(f"{where}: '{fmt.DATA}' has shape {data.shape}, expected "
                                      f"{(self.count, *spec.sample_shape)}")
        if data.dtype.newbyteorder("=") != np.dtype(spec.dtype):
            raise PackFormatError(f"{where}: '{fmt.DATA}' holds {data.dtype}, but the metadata "
                                  f"value 'dtype' says {spec.dtype}; the file is damaged")
        column = _Column(image, offsets, file=where, dataset=fmt.DATA, crc32=fmt.CRC32)
        if data.is_virtual and meta.get("merge") == "virtual" and meta.get("parts"):
            column.extents = self._version1_parts(f, meta, spec, offsets)
        else:
            column.extents = dataset_extents(data, self._files)
        self._columns[IMAGE] = column
        self._columns[LABEL] = _Column(F.IntField("int64"), memory=labels)
        self._paths = (fmt.PATH_OFFSETS, fmt.PATH_DATA)
        return Schema({IMAGE: image, LABEL: F.IntField("int64", role=Label())}, "pair",
                      {LABEL: classes})

    def _version1_parts(self, f, meta: dict[str, Any], spec: fmt.Spec,
                        offsets: np.ndarray | None) -> Extents | None:
        """The extents of a version 1 virtual merge, from its part files (each checked: the
        count and plan the merge recorded, and the checksums of its samples)."""
        where = self.where
        merged_crc = read_index(f, fmt.CRC32, where, (self.count,), np.uint32)
        bytes_storage = spec.storage == "bytes"
        windows = []
        stop = 0
        for k, part in enumerate(meta["parts"]):
            s0, s1, l0, b0, lb0 = _version1_ranges(part, k, self.count, offsets, where,
                                                   bytes_storage, stop)
            stop = s1
            file = (self.path.parent / part["file"]).resolve()
            _require_part(file, where)
            with open_h5(file, rdcc_nbytes=0) as g:
                try:
                    part_meta = _pack_meta(g, fmt.META, str(file))
                    expect = {key: part[f"part_{key}"] for key in ("count", "plan")
                              if f"part_{key}" in part}
                    if mismatch := [key for key in expect if part_meta.get(key) != expect[key]]:
                        found = ", ".join(f"{key} {part_meta.get(key)!r}, expected "
                                          f"{expect[key]!r}" for key in mismatch)
                        raise PackFormatError(
                            f"the part file {file} of a virtual pack was replaced after the merge "
                            f"({found}); pack the output again")
                    own = read_index(g, fmt.CRC32, str(file), (int(part_meta["count"]),),
                                     np.uint32)
                    if l0 + s1 - s0 > len(own) or not np.array_equal(own[l0:l0 + s1 - s0],
                                                                     merged_crc[s0:s1]):
                        raise PackFormatError(
                            f"the part file {file} of a virtual pack does not hold the samples "
                            f"{s0} to {s1 - 1} the merge recorded (their checksums differ): part "
                            "files were swapped or replaced after the merge; restore them or pack "
                            "the output again")
                    extents = dataset_extents(require_dataset(g, fmt.DATA, str(file)),
                                              self._files)
                except PackFormatError:
                    raise
                except H5_ERRORS as exc:
                    raise h5_damaged(str(file), exc) from exc
            if extents is None:
                return None  # a part h5py must read: read the merged virtual dataset
            if bytes_storage:
                n = int(offsets[s1]) - b0
                windows.append(extents.window(lb0, lb0 + n, b0))
            else:
                windows.append(extents.window(l0, l0 + s1 - s0, s0))
        if stop != self.count:
            raise fmt.damaged(where, "parts", f"maps samples up to {stop}, but the pack holds "
                              f"{self.count}")
        return Extents.concat(windows, windows[0].row_bytes if windows else 1)

    def _version2(self, f) -> Schema:
        """A records pack: one dataset per field at the root, fastpipe's own under
        ``_fastpipe/``."""
        where = self.where
        meta = _pack_meta(f, fmt.R_META, where)
        self.meta, self.count = meta, int(meta["count"])
        fields = fmt.record_fields(meta, where)
        classes = dict(meta.get("classes") or {})
        for name, field in fields.items():
            ds = require_dataset(f, name, where)
            stored = np.dtype(field.stored_dtype)
            if (ds.dtype.newbyteorder("=") != stored
                    or tuple(ds.shape[1:]) != tuple(field.row_shape)):
                raise PackFormatError(
                    f"{where}: field {name!r} is stored as {ds.dtype} rows of shape "
                    f"{tuple(ds.shape[1:])}, but its metadata says {stored} rows of shape "
                    f"{tuple(field.row_shape)}; the file is damaged")
            column = _Column(field, file=where, dataset=name, crc32=f"{fmt.R_CRC32}/{name}")
            if field.variable:
                column.offsets = read_index(f, f"{fmt.R_OFFSETS}/{name}", where,
                                            (self.count + 1,), np.int64, mapped=True)
                fmt.check_offsets(column.offsets, ds.shape[0], where,
                                  f"field {name!r}: its offsets")
            elif ds.shape[:1] != (self.count,):
                raise PackFormatError(f"{where}: field {name!r} has shape {ds.shape}, expected "
                                      f"{self.count} rows; the file is damaged")
            if not ds.is_virtual:
                column.extents = dataset_extents(ds, self._files)
            self._columns[name] = column
        if meta.get("merge") == "virtual" and meta.get("parts"):
            self._version2_parts(f, meta)
        for name, names_of in classes.items():
            column = self._columns[name]
            if column.field.kind == "int":
                labels = self._read_rows(column, 0, self.count).astype(np.int64)
                fmt.check_labels(labels, names_of, where, name)
                column.memory = labels.astype(column.field.stored_dtype)
        self._paths = (fmt.R_PATH_OFFSETS, fmt.R_PATH_DATA)
        record = meta.get("record") if meta.get("record") in ("tuple", "pair") else "dict"
        return Schema(fields, record, classes)

    def _version2_parts(self, f, meta: dict[str, Any]) -> None:
        """A virtual merge reads each field from its part files, and HDF5 fills a missing part
        with zeros: every part must be there and hold the samples the merge recorded (its
        checksums, one small array per field, against the merged ones)."""
        where = self.where
        names = list(self._columns)
        merged = {n: read_index(f, f"{fmt.R_CRC32}/{n}", where, (self.count,), np.uint32)
                  for n in names}
        windows: dict[str, list[Extents] | None] = {n: [] for n in names}
        base, rows = 0, dict.fromkeys(names, 0)
        for k, part in enumerate(meta["parts"]):
            n = part.get("count")
            if not (isinstance(part.get("file"), str) and isinstance(n, int)
                    and not isinstance(n, bool) and 0 <= n <= self.count - base):
                raise fmt.damaged(where, "parts", f"has part {k} as {part!r}")
            file = self.path.parent / part["file"]
            _require_part(file, where)
            with open_h5(file, rdcc_nbytes=0) as g:
                try:
                    for name in names:
                        ds = g[f"{fmt.R_CRC32}/{name}"]
                        if ds.shape != (n,) or not np.array_equal(ds[()],
                                                                  merged[name][base:base + n]):
                            raise PackFormatError(
                                f"the part file {file} of a virtual pack does not hold the "
                                f"samples {base} to {base + n - 1} the merge recorded (the "
                                f"checksums of field {name!r} differ): part files were swapped "
                                "or replaced after the merge; restore them or pack the output "
                                "again")
                    for name in names:
                        ds = g[name]
                        length = ds.shape[0]
                        extents = dataset_extents(ds, self._files) if windows[name] is not None \
                            else None
                        if extents is None:
                            windows[name] = None  # h5py reads the merged virtual dataset
                        else:
                            windows[name].append(extents.window(0, length, rows[name]))
                        rows[name] += length
                except PackFormatError:
                    raise
                except H5_ERRORS as exc:
                    raise h5_damaged(str(file), exc) from exc
            base += n
        if base != self.count:
            raise fmt.damaged(where, "parts", f"maps {base} samples, but the pack holds "
                              f"{self.count}")
        for name, parts in windows.items():
            column = self._columns[name]
            total = self.count if column.offsets is None else int(column.offsets[-1])
            if parts is not None and rows[name] == total:
                column.extents = Extents.concat(parts, parts[0].row_bytes if parts else 1)

    def _plain(self, f, names: Sequence[str] | None) -> Schema:
        """A user's file: its top-level datasets (or ``names``), which must share their first
        dimension."""
        where = self.where
        fields = _plain_fields(f, where, names)
        counts = {n: f[n].shape[0] for n in fields}
        if len(set(counts.values())) > 1:
            listed = ", ".join(f"{n} {k}" for n, k in counts.items())
            raise PackFormatError(f"the datasets of {where} have different lengths ({listed}), "
                                  "so they are not one row per sample; pick those that are with "
                                  "fields=[...]")
        self.count = next(iter(counts.values()))
        self.meta = {"format": "hdf5", "count": self.count, "order": list(fields),
                     "fields": {n: fl.to_json() for n, fl in fields.items()}, "plain": True}
        for name, field in fields.items():
            ds = f[name]
            check_virtual_sources(ds, where)
            column = _Column(field, file=where, dataset=name)
            if isinstance(field, (F.ArrayField, F.IntField, F.FloatField)):
                column.extents = dataset_extents(ds, self._files)
            self._columns[name] = column
        self._paths = None
        return Schema(fields, "dict")

    # --------------------------------------------------------------------------------- reading

    def _open(self) -> Any:
        return _Handles(FilePool(self._files.paths))

    def _close(self, handles: Any) -> None:
        handles.close()

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        record: dict[str, Any] = {}
        for name in names:
            column = self._columns[name]
            try:
                record[name] = self._value(column, index)
            except Exception as exc:  # noqa: BLE001 - told apart in _failed
                _failed(exc, column, f"field {name!r} of sample {index}")
        return record

    def _read_batch(self, indices: np.ndarray, names: Sequence[str],
                    blocks: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{} for _ in range(len(indices))]
        for name in names:
            column = self._columns[name]
            try:
                values = self._column_values(column, indices, blocks.get(name))
            except Exception as exc:  # noqa: BLE001 - told apart in _failed
                _failed(exc, column, f"field {name!r} of samples {_few(indices)}")
            if values is not None:
                for record, value in zip(out, values, strict=True):
                    record[name] = value
        return out

    def _value(self, column: _Column, index: int) -> Any:
        """The stored value of sample ``index``, as :meth:`_column_values` gives it (a value of
        its own, never a view of memory another read shares), in one read of the file."""
        if column.offsets is None:
            if column.memory is not None:
                value = column.memory[index]
                return value.copy() if isinstance(value, np.ndarray) else value
            first, stop = index, index + 1
        else:
            first, stop = int(column.offsets[index]), int(column.offsets[index + 1])
        if column.extents is None:
            return self._column_values(column, np.array([index], np.int64), None)[0]
        field = column.field
        rows = np.empty((stop - first, *field.row_shape), field.stored_dtype)
        read_rows(self._handles().pool, column.extents, first, stop, rows)
        return rows[0] if column.offsets is None else rows

    def _column_values(self, column: _Column, indices: np.ndarray,
                       block: np.ndarray | None) -> list[Any] | None:
        """The stored values of ``indices`` (None when they went into ``block``)."""
        field = column.field
        if column.offsets is None:  # one row a sample
            if column.memory is not None:
                rows = column.memory[indices]
            elif column.extents is not None:
                rows = block if block is not None else np.empty(
                    (len(indices), *field.row_shape), field.stored_dtype)
                pieces = column.extents.pieces(indices, indices + 1,
                                               np.arange(len(indices)) * column.extents.row_bytes)
                read_pieces(self._handles().pool, pieces, rows)
                if block is not None:
                    return None
            else:
                ds = self._h5py(column)
                rows = [_stored(field, ds[int(i)]) for i in indices]
                if block is not None:
                    for k, row in enumerate(rows):
                        block[k] = row
                    return None
                return rows
            if block is not None:
                block[...] = rows
                return None
            return list(rows)
        first = column.offsets[indices]
        stop = column.offsets[indices + 1]
        if column.extents is None:
            ds = self._h5py(column)
            return [_stored(field, ds[int(a):int(b)]) for a, b in zip(first, stop, strict=True)]
        row_bytes = column.extents.row_bytes
        sizes = (stop - first) * row_bytes
        ends = np.cumsum(sizes)
        flat = np.empty(int(ends[-1]) if len(ends) else 0, np.uint8)
        read_pieces(self._handles().pool, column.extents.pieces(first, stop, ends - sizes), flat)
        dtype, shape = np.dtype(field.stored_dtype), tuple(field.row_shape)
        values = []
        for a, b in zip((ends - sizes).tolist(), ends.tolist(), strict=True):
            piece = flat[a:b]
            values.append(piece if dtype == np.uint8 and not shape
                          else piece.view(dtype).reshape((-1, *shape)))
        return values

    def _read_rows(self, column: _Column, start: int, stop: int) -> np.ndarray:
        """Stored rows ``[start, stop)`` of a fixed field (at construction: no handles yet)."""
        indices = np.arange(start, stop, dtype=np.int64)
        out = np.empty((len(indices), *column.field.row_shape), column.field.stored_dtype)
        if column.extents is not None:
            pool = FilePool(self._files.paths)
            try:
                read_pieces(pool, column.extents.pieces(
                    indices, indices + 1, np.arange(len(indices)) * column.extents.row_bytes), out)
            except ShortRead as exc:
                raise _short_read(exc, f"field {column.dataset!r}") from None
            finally:
                pool.close()
            return out
        with open_h5(column.file) as f:
            if len(out):
                f[column.dataset].read_direct(out, np.s_[start:stop])
        return out

    def _h5py(self, column: _Column):
        """This process's h5py dataset of a column read through h5py."""
        return self._handles().dataset(column.file, column.dataset, self.plain)

    # ------------------------------------------------------------------- what packs add

    def read_block(self, name: str, start: int, stop: int) -> np.ndarray:
        """The stored rows of samples ``[start, stop)`` of field ``name``, back to back: a
        variable field's rows ``offsets[start]:offsets[stop]``, a fixed field's ``(n, *row)``
        (what a merge copies, a block at a time)."""
        column = self._columns[name]
        field = column.field
        if column.offsets is not None:
            a, b = int(column.offsets[start]), int(column.offsets[stop])
        else:
            a, b = start, stop
        if column.memory is not None and column.offsets is None:
            return np.asarray(column.memory[a:b], field.stored_dtype)
        out = np.empty((b - a, *field.row_shape), field.stored_dtype)
        try:
            if column.extents is not None:
                pieces = column.extents.pieces(np.array([a]), np.array([b]), np.array([0]))
                read_pieces(self._handles().pool, pieces, out)
            elif b > a:
                self._h5py(column).read_direct(out, np.s_[a:b])
        except ShortRead as exc:
            raise _short_read(exc, f"field {name!r} of samples {start} to {stop - 1}") from None
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(column.file, exc,
                             f"read field {name!r} of samples {start} to {stop - 1}") from exc
        return out

    def crc32(self, name: str) -> np.ndarray | None:
        """The checksums a pack stores of field ``name`` (zlib.crc32 of each sample's stored
        rows), or None for a field without (a format version 1 pack's labels, a plain file)."""
        column = self._columns[name]
        if column.crc32 is None:
            return None
        try:
            with open_h5(self.path, rdcc_nbytes=0) as f:
                return read_index(f, column.crc32, self.where, (self.count,), np.uint32)
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(self.where, exc, f"read the checksums of field {name!r}") from exc

    def offsets(self, name: str) -> np.ndarray | None:
        """A variable field's offsets (sample ``i`` is stored rows ``offsets[i]:offsets[i+1]``),
        None for a fixed one."""
        return self._columns[name].offsets

    def paths(self, start: int, stop: int) -> list[str]:
        """Where samples ``[start, stop)`` were packed from (the source paths a pack stores)."""
        if self._paths is None:
            return [f"{self.where}[{i}]" for i in range(start, stop)]
        where = self.where
        try:
            handles = self._handles()
            f = handles.file(self.where, False)
            offsets = self._path_offsets
            if offsets is None:
                offsets = read_index(f, self._paths[0], where, (self.count + 1,), np.int64)
                fmt.check_offsets(offsets, require_dataset(f, self._paths[1], where).shape[0],
                                  where, f"'{self._paths[0]}'")
                self._path_offsets = offsets
            a, b = int(offsets[start]), int(offsets[stop])
            blob = f[self._paths[1]][a:b].tobytes() if b > a else b""
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(where, exc, "read the source paths") from exc
        rel = offsets[start:stop + 1] - a
        return [blob[rel[j]:rel[j + 1]].decode("utf-8", "replace") for j in range(stop - start)]

    def describe(self, index: int) -> str:
        if self._paths is None:
            return f"{self.where}[{index}]"
        try:
            return f"{self.where}[{index}] (packed from {self.paths(index, index + 1)[0]})"
        except Exception:  # noqa: BLE001 - a message must not fail on a damaged path index
            return f"{self.where}[{index}]"

    def fingerprint(self) -> str:
        digest = hashlib.sha256(str(self.meta.get("plan") or self.path).encode())
        if self.version != fmt.IMAGE_VERSION:
            digest.update(f"{self.count}\0{self.meta.get('fields')}".encode())
        labels = self.labels()
        if labels is not None:
            digest.update(labels.tobytes())
        return digest.hexdigest()[:16]

    def labels(self) -> np.ndarray | None:
        """The int64 labels of every sample, from the schema's label field (read once), or
        None."""
        name = self.stored_label
        column = self._columns.get(name) if name is not None else None
        if column is None or column.field.kind != "int":
            return None
        if column.memory is None:
            column.memory = self._read_rows(column, 0, self.count)
        return np.asarray(column.memory, np.int64)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_path_offsets"] = None  # read again where needed
        return state


class _Handles:
    """One process's handles of an :class:`H5Source`: its descriptors, and h5py files opened
    for the columns read through h5py."""

    def __init__(self, pool: FilePool) -> None:
        self.pool = pool
        self._files: dict[str, Any] = {}
        self._lock = threading.Lock()

    def file(self, path: str, plain: bool):
        f = self._files.get(path)
        if f is None:
            with self._lock:
                f = self._files.get(path)
                if f is None:
                    f = self._files[path] = open_h5(path, **({} if plain else
                                                            {"rdcc_nbytes": 0}))
        return f

    def dataset(self, path: str, name: str, plain: bool):
        return self.file(path, plain)[name]

    def close(self) -> None:
        self.pool.close()
        for f in self._files.values():
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a handle inherited across fork may fail
                pass
        self._files.clear()


def _pack_meta(f, name: str, where: str) -> dict[str, Any]:
    """The checked metadata of a fastpipe pack, stored in dataset ``name``."""
    if name not in f:
        raise PackFormatError(f"{where} is a fastpipe pack without its '{name}' dataset; the file "
                              "is damaged")
    return fmt.parse_meta(f[name][()], where, name)


def _require_part(file: Path, where: str) -> None:
    if file.exists():
        return
    # What is gone: the part file, or the folder it lived in (the pack's own <pack>.shards, or,
    # for packs merge_packs combined, the .shards folder of the pack it came from).
    gone = file
    while not gone.parent.exists() and gone.parent != gone.parent.parent:
        gone = gone.parent
    what = f"the folder {gone}" if gone != file else f"the part file {file}"
    raise PackFormatError(
        f"{where} is a virtual pack whose part file {file} is missing: put {what} back where it "
        "was (a pack reads its part files where it recorded them), or pack again with "
        "merge='copy' for one self-contained file")


def _version1_ranges(part: dict[str, Any], k: int, count: int, offsets: np.ndarray | None,
                     where: str, bytes_storage: bool, start: int
                     ) -> tuple[int, int, int, int, int]:
    """(first sample, end sample, first local sample, first byte, first local byte) of part
    ``k`` of a version 1 virtual merge, checked: the parts run back to back over the samples,
    and their byte ranges agree with the offsets."""
    def bad(what: str) -> PackFormatError:
        return fmt.damaged(where, "parts", f"has part {k} {what}")

    def pair(key: str, default: list[int] | None = None) -> list[int]:
        value = part.get(key, default)
        if not (isinstance(value, list) and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
                and value[0] <= value[1]):
            raise bad(f"with {key} {value!r}, not a range")
        return value

    if not isinstance(part, dict) or not isinstance(part.get("file"), str) or not part["file"]:
        raise bad(f"with file {part.get('file') if isinstance(part, dict) else part!r}")
    s0, s1 = pair("samples")
    l0, l1 = pair("local_samples", [0, s1 - s0])
    if s0 != start or s1 > count or l1 - l0 != s1 - s0:
        raise bad(f"mapping samples {s0} to {s1} (locally {l0} to {l1}) after sample {start} of "
                  f"{count}")
    if not bytes_storage:
        return s0, s1, l0, 0, 0
    b0, b1 = pair("bytes")
    lb0, lb1 = pair("local_bytes", [0, b1 - b0])
    if [b0, b1] != [int(offsets[s0]), int(offsets[s1])] or lb1 - lb0 != b1 - b0:
        raise bad(f"mapping bytes {b0} to {b1} (locally {lb0} to {lb1}), but the offsets of its "
                  f"samples run from {int(offsets[s0])} to {int(offsets[s1])}")
    return s0, s1, l0, b0, lb0


def _plain_fields(f, where: str, names: Sequence[str] | None) -> dict[str, Any]:
    """The fields of a plain HDF5 file: its top-level datasets, or ``names``."""
    h5py = h5py_module()
    if names is None:
        names = [k for k in f if isinstance(f.get(k, getlink=False), h5py.Dataset)]
        if not names:
            raise PackFormatError(f"{where} has no datasets at its top level; read nested ones "
                                  "with fields=['group/name', ...]")
    elif isinstance(names, str):
        raise TypeError(f"fields must be a list of field names, got the string {names!r}")
    fields = {}
    for name in names:
        if name not in f or not isinstance(f[name], h5py.Dataset):
            raise PackFormatError(f"{where} has no dataset {name!r} (it has: "
                                  f"{', '.join(sorted(f))})")
        ds = f[name]
        if ds.ndim == 0:
            raise PackFormatError(f"{where}: {name!r} is a scalar dataset, not one row per "
                                  "sample; leave it out with fields=[...]")
        fields[name] = _plain_field(ds, f"{where}[{name!r}]")
    return fields


def _plain_field(ds, where: str) -> Any:
    h5py = h5py_module()
    if h5py.check_string_dtype(ds.dtype) is not None:
        return F.StrField()
    vlen = h5py.check_vlen_dtype(ds.dtype)
    if vlen is not None:
        if np.dtype(vlen).kind in "biuf":
            return F.ArrayField(np.dtype(vlen).name, (None,))
        return F.BytesField()
    if ds.dtype.kind == "V" and ds.dtype.names is None:
        return F.BytesField()  # opaque: raw bytes
    if ds.dtype.kind not in "biufc":
        raise PackFormatError(f"{where} holds {ds.dtype} values, which fastpipe does not read "
                              "(numbers, booleans, strings and variable-length data); leave it "
                              "out with fields=[...]")
    if ds.ndim == 1:
        if ds.dtype.kind == "f":
            return F.FloatField(ds.dtype.name)
        if ds.dtype.kind in "biu":
            return F.IntField(ds.dtype.name)
        return F.ArrayField(ds.dtype.name, ())
    return F.ArrayField(ds.dtype.name, tuple(ds.shape[1:]))


def _stored(field: Any, value: Any) -> Any:
    """The stored form of a value h5py gives: numbers in the field's stored dtype (a user's file
    may hold another byte order), strings and opaque values (bytes, str, np.void) as their bytes,
    flat uint8."""
    if field.kind not in ("str", "bytes"):
        return np.asarray(value, field.stored_dtype)
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    elif isinstance(value, (np.void, np.ndarray)):
        value = value.tobytes()
    return np.frombuffer(bytes(value), np.uint8)


def _failed(exc: Exception, column: _Column, what: str) -> None:
    """Raises the error for a read of ``what`` that raised ``exc``: a short read as truncation
    (or the OS error), h5py's errors as damage to the column's file, anything else as it is."""
    if isinstance(exc, ShortRead):
        raise _short_read(exc, what) from None
    if isinstance(exc, H5_ERRORS) and not isinstance(exc, PackFormatError):
        raise h5_damaged(column.file, exc, f"read {what}") from exc
    raise exc


def _short_read(exc: ShortRead, what: str) -> Exception:
    if exc.number == 0:
        return PackFormatError(f"{exc.path} is truncated: reading {what} ran past its end (short "
                               "read); run fastpipe verify")
    return OSError(exc.number, f"cannot read {what} from {exc.path}: {os.strerror(exc.number)}")


def _few(indices: np.ndarray) -> str:
    shown = ", ".join(str(int(i)) for i in indices[:4])
    return shown + (" ..." if len(indices) > 4 else "")
