"""Packing records: samples of named fields, one HDF5 dataset per field (format version 2).

A dataset returning a dict, or a tuple other than ``(image, int label)``, packs as records; so
does any source given ``fields=``. The fields are declared or taken from the first readable
sample (:mod:`fastpipe.data.fields`); every later sample must fit them exactly.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data import _format as fmt
from fastpipe.data import fields as F
from fastpipe.data.h5 import H5RecordReader, h5py_module
from fastpipe.pack._errors import PackError

FLUSH_BYTES = 8 * 1024 * 1024
FLUSH_SAMPLES = 1024
COPY_BLOCK_BYTES = 64 * 1024 * 1024
INDEX_CHUNK = 64 * 1024
ROW_CHUNK_BYTES = 64 * 1024  # one chunk at least a row; rows per chunk up to this many bytes
FLAT_CHUNK_BYTES = 256 * 1024


@dataclass(frozen=True)
class RecordSpec:
    """The fields of a records pack, in the order a reader returns them, and whether samples
    were tuples (read back as tuples) or dicts."""

    fields: dict[str, F.Field]
    order: tuple[str, ...]
    record: str = "dict"  # "dict" or "tuple"
    storage: str = "fields"

    def to_json(self) -> dict[str, Any]:
        return {"fields": {n: self.fields[n].to_json() for n in self.order},
                "order": list(self.order), "record": self.record}


def is_record(item: Any) -> bool:
    """Whether a dataset's sample is a record rather than an ``(image, int label)`` pair."""
    if isinstance(item, Mapping):
        return True
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        return isinstance(item, (tuple, list))
    label = item[1]
    if isinstance(label, (bool, np.bool_)):
        return True
    if isinstance(label, (int, np.integer)):
        return False
    shape = getattr(label, "shape", None)
    return not (shape == () and getattr(label, "dtype", None) is not None
                and np.dtype(str(label.dtype).replace("torch.", "")).kind in "iu")


def as_record(item: Any, names: Sequence[str] | None, where: str) -> dict[str, Any]:
    """A sample as a dict of fields: a dict as it is, a tuple named by ``names`` (or "0",
    "1", ...)."""
    if isinstance(item, Mapping):
        bad = [k for k in item if not isinstance(k, str)]
        if bad:
            raise PackError(f"{where} has the key {bad[0]!r}; field names are strings")
        return dict(item)
    if isinstance(item, (tuple, list)):
        keys = list(names) if names is not None else [str(k) for k in range(len(item))]
        if len(keys) != len(item):
            raise PackError(f"{where} has {len(item)} values but fields names {len(keys)}: "
                            f"{keys}")
        return dict(zip(keys, item, strict=True))
    raise PackError(f"{where} is a {type(item).__name__}; a record is a dict or a tuple of "
                    "fields")


def check_name(name: str) -> str:
    if not name or "/" in name or name.startswith(fmt.INTERNAL) or name in (".", ".."):
        raise PackError(f"field name {name!r} cannot name an HDF5 dataset at the root (no '/', "
                        f"not empty, not starting with {fmt.INTERNAL!r})")
    return name


def make_spec(first: Any, declared: Mapping[str, F.Field] | Sequence[str] | None,
              where: str) -> RecordSpec:
    """The spec of a records pack from its first readable sample and what the user declared
    (a dict of fields, some or all; or the names of a tuple's values)."""
    names = list(declared) if isinstance(declared, Sequence) and not isinstance(
        declared, (str, Mapping)) else None
    record = as_record(first, names, where)
    given = dict(declared) if isinstance(declared, Mapping) else {}
    if unknown := [n for n in given if n not in record]:
        raise PackError(f"fields declares {unknown}, which {where} does not have (it has "
                        f"{list(record)})")
    fields: dict[str, F.Field] = {}
    for name, value in record.items():
        check_name(name)
        field = given.get(name)
        if field is not None and not isinstance(field, F.Field):
            raise PackError(f"fields[{name!r}] is {field!r}; declare a field with ImageField(), "
                            "ArrayField(dtype, shape), IntField(), FloatField(), BytesField() "
                            "or StrField()")
        try:
            fields[name] = field or F.infer_field(value, f"field {name!r} of {where}")
        except F.FieldError as exc:
            raise PackError(str(exc)) from exc
    kind = "tuple" if isinstance(first, (tuple, list)) else "dict"
    return RecordSpec(fields, tuple(record), kind)


@dataclass
class RecordProcessor:
    """Turns a sample into the stored row of each field, refusing what does not fit."""

    spec: RecordSpec
    check: bool = True  # decode every image field, as an image pack checks its inputs
    transcode: bool = False  # image fields rewritten for crops (fastpipe.pack._transcode)

    def __call__(self, item: Any, source: str) -> dict[str, np.ndarray]:
        from fastpipe.pack._sources import SkipInput, _decode

        names = self.spec.order if self.spec.record == "tuple" else None
        record = as_record(item, names, source)
        if set(record) != set(self.spec.order):
            missing = [n for n in self.spec.order if n not in record]
            extra = [n for n in record if n not in self.spec.fields]
            raise PackError(f"{source} has other fields than the first sample: missing "
                            f"{missing}, extra {extra}")
        try:
            rows = {n: self.spec.fields[n].encode(record[n], f"field {n!r} of {source}")
                    for n in self.spec.order}
        except F.FieldError as exc:
            raise PackError(str(exc)) from exc
        images = [n for n in self.spec.order if self.spec.fields[n].kind == "image"]
        if self.check:
            for name in images:
                try:
                    _decode(rows[name].tobytes(), f"{source}[{name!r}]")
                except SkipInput as exc:
                    raise SkipInput(f"field {name!r}: {exc}") from exc
        if self.transcode:
            from fastpipe.pack._transcode import transcoded

            for name in images:
                data = transcoded(rows[name].tobytes(), f"{source}[{name!r}]")
                rows[name] = np.frombuffer(data, np.uint8)
        return rows


def _flat_chunks(field: F.Field) -> tuple[int, ...]:
    row = max(1, int(np.prod(field.row_shape, dtype=np.int64)) * field.stored_dtype.itemsize)
    rows = max(1, (FLAT_CHUNK_BYTES if field.variable else ROW_CHUNK_BYTES) // row)
    return (rows, *field.row_shape)


def _resizable(f, name: str, field: F.Field):
    return f.create_dataset(name, shape=(0, *field.row_shape), dtype=field.stored_dtype,
                            maxshape=(None, *field.row_shape), chunks=_flat_chunks(field))


def _index(f, name: str, dtype, chunk: int, first: np.ndarray | None = None):
    data = np.zeros(0, dtype) if first is None else first.astype(dtype)
    return f.create_dataset(name, data=data, maxshape=(None,), chunks=(chunk,))


def _append(ds, values: np.ndarray) -> None:
    n = ds.shape[0]
    if len(values):
        ds.resize((n + len(values), *ds.shape[1:]))
        ds[n:n + len(values)] = values


def write_root(f, meta: dict[str, Any]) -> None:
    from fastpipe.pack._write import meta_json

    h5py = h5py_module()
    f.attrs[fmt.ATTR_FORMAT] = fmt.FORMAT
    f.attrs[fmt.ATTR_VERSION] = fmt.RECORDS_VERSION
    f.attrs["count"] = np.int64(meta["count"])
    if fmt.R_META in f:
        del f[fmt.R_META]
    f.create_dataset(fmt.R_META, data=meta_json(meta), dtype=h5py.string_dtype("utf-8"))


class RecordShardWriter:
    """Streams records into a new HDF5 file, one resizable dataset per field."""

    def __init__(self, path: Path, spec: RecordSpec, expected: int = INDEX_CHUNK) -> None:
        h5py = h5py_module()
        chunk = min(INDEX_CHUNK, max(64, expected + 1))
        self.path, self.spec = path, spec
        self.f = h5py.File(path, "w")
        self.count = 0
        self._data = {n: _resizable(self.f, n, spec.fields[n]) for n in spec.order}
        self._crc = {n: _index(self.f, f"{fmt.R_CRC32}/{n}", np.uint32, chunk)
                     for n in spec.order}
        self._offsets = {n: _index(self.f, f"{fmt.R_OFFSETS}/{n}", np.int64, chunk, np.zeros(1))
                         for n in spec.order if spec.fields[n].variable}
        self._rows_written = dict.fromkeys(self._offsets, 0)
        self._path_offsets = _index(self.f, fmt.R_PATH_OFFSETS, np.int64, chunk, np.zeros(1))
        self._path_data = self.f.create_dataset(fmt.R_PATH_DATA, shape=(0,), dtype=np.uint8,
                                                maxshape=(None,), chunks=(INDEX_CHUNK,))
        self._paths_written = 0
        self._buffer: list[dict[str, np.ndarray]] = []
        self._buffer_paths: list[bytes] = []
        self._buffer_bytes = 0

    def add(self, sample: dict[str, np.ndarray], label: int, source: str) -> None:
        self._buffer.append(sample)
        self._buffer_paths.append(source.encode("utf-8", "surrogateescape"))
        self._buffer_bytes += sum(v.nbytes for v in sample.values())
        if self._buffer_bytes >= FLUSH_BYTES or len(self._buffer) >= FLUSH_SAMPLES:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        for name in self.spec.order:
            rows = [s[name] for s in self._buffer]
            _append(self._crc[name], np.array([zlib.crc32(r) for r in rows], np.uint32))
            if name in self._offsets:
                sizes = np.array([len(r) for r in rows], np.int64)
                _append(self._data[name], np.concatenate(rows))
                _append(self._offsets[name], self._rows_written[name] + np.cumsum(sizes))
                self._rows_written[name] += int(sizes.sum())
            else:
                _append(self._data[name], np.stack(rows))
        sizes = np.array([len(p) for p in self._buffer_paths], np.int64)
        _append(self._path_data, np.frombuffer(b"".join(self._buffer_paths), np.uint8))
        _append(self._path_offsets, self._paths_written + np.cumsum(sizes))
        self._paths_written += int(sizes.sum())
        self.count += len(self._buffer)
        self._buffer, self._buffer_paths, self._buffer_bytes = [], [], 0

    def finish(self, meta: dict[str, Any]) -> None:
        self.flush()
        write_root(self.f, dict(meta, count=self.count))
        self.f.close()

    def abort(self) -> None:
        try:
            self.f.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def write_merged_records(readers: Sequence[H5RecordReader], output: Path, meta: dict[str, Any],
                         mode: str, on_samples: Callable[[int], None] | None = None) -> None:
    """Writes records packs (in order) as one: per field, a virtual dataset over the parts
    (what the common recipe builds by hand with ``h5py.VirtualLayout``) or a contiguous copy.
    Offsets, checksums and source paths are always copied."""
    import os

    h5py = h5py_module()
    first = readers[0]
    for reader in readers[1:]:
        if reader.meta["fields"] != first.meta["fields"] or reader.order != first.order:
            raise PackError(f"{reader.path} holds other fields than {first.path}: "
                            f"{reader.meta['fields']} vs {first.meta['fields']}")
    total = sum(r.count for r in readers)
    fields = {n: F.field_from_json(first.meta["fields"][n]) for n in first.order}
    with h5py.File(output, "w") as f:
        for name in first.order:
            field = fields[name]
            lengths = [_stored_rows(r, name) for r in readers]
            rows = sum(lengths)
            shape = (rows, *field.row_shape)
            if mode == "copy":
                # Fixed rows contiguous (one read per row); variable rows in chunks.
                chunks = None
                if field.variable and rows:
                    flat = _flat_chunks(field)
                    chunks = (min(flat[0], rows), *flat[1:])
                data = f.create_dataset(name, shape=shape, dtype=field.stored_dtype,
                                        chunks=chunks)
                base = 0
                for reader in readers:
                    for a, b in _blocks(reader, name):
                        block = reader.read_block(name, a, b)
                        data[base:base + len(block)] = block
                        base += len(block)
            else:
                layout = h5py.VirtualLayout(shape=shape, dtype=field.stored_dtype)
                base = 0
                for reader, n in zip(readers, lengths, strict=True):
                    if n:
                        relative = os.path.relpath(reader.path, output.parent)
                        source = h5py.VirtualSource(relative, name,
                                                    shape=(n, *field.row_shape))
                        layout[base:base + n] = source
                    base += n
                f.create_virtual_dataset(name, layout)
            crc = np.concatenate([r.crc32(name) for r in readers]) if total else np.zeros(
                0, np.uint32)
            f.create_dataset(f"{fmt.R_CRC32}/{name}", data=crc.astype(np.uint32))
            if field.variable:
                offsets = [np.zeros(1, np.int64)]
                base = 0
                for reader in readers:
                    offsets.append(reader.offsets(name)[1:] + base)
                    base += int(reader.offsets(name)[-1])
                f.create_dataset(f"{fmt.R_OFFSETS}/{name}", data=np.concatenate(offsets))
        path_offsets, path_blobs, base = [np.zeros(1, np.int64)], [], 0
        for reader in readers:
            names = [s.encode("utf-8", "surrogateescape") for s in reader.sources(0, reader.count)]
            path_blobs.append(b"".join(names))
            path_offsets.append(base + np.cumsum([len(x) for x in names], dtype=np.int64))
            base += len(path_blobs[-1])
            if on_samples is not None:
                on_samples(reader.count)
        f.create_dataset(fmt.R_PATH_OFFSETS, data=np.concatenate(path_offsets))
        f.create_dataset(fmt.R_PATH_DATA, data=np.frombuffer(b"".join(path_blobs), np.uint8))
        parts = None
        if mode == "virtual":
            parts = [{"file": os.path.relpath(r.path, output.parent), "count": r.count,
                      "plan": r.meta.get("plan")} for r in readers]
        write_root(f, dict(meta, count=total, merge=mode, parts=parts))


def _stored_rows(reader: H5RecordReader, name: str) -> int:
    offsets = reader.offsets(name)
    return int(offsets[-1]) if offsets is not None else reader.count


def _blocks(reader: H5RecordReader, name: str) -> list[tuple[int, int]]:
    """Sample ranges of at most ``COPY_BLOCK_BYTES`` of one field (at least one sample each)."""
    offsets = reader.offsets(name)
    field = reader.fields[name]
    row = max(1, int(np.prod(field.row_shape, dtype=np.int64)) * field.stored_dtype.itemsize)
    sizes = (np.diff(offsets) * row) if offsets is not None else np.full(reader.count, row)
    ends = np.cumsum(sizes)
    blocks, start, base = [], 0, 0
    while start < reader.count:
        stop = max(start + 1, int(np.searchsorted(ends, base + COPY_BLOCK_BYTES, side="right")))
        blocks.append((start, stop))
        base = int(ends[stop - 1])
        start = stop
    return blocks


def probe(listing: Any, declared: Mapping[str, F.Field] | Sequence[str] | None
          ) -> RecordSpec | None:
    """The record spec of a dataset source, from its first readable sample; None when the
    samples are ``(image, int label)`` pairs and no fields were declared (the image pack)."""
    from fastpipe.pack._sources import SkipInput, load_input

    if listing.kind == "columns":
        return _columns_spec(listing)
    if listing.kind == "arrays":
        spec = array_file_fields(listing.files, bool((listing.labels >= 0).any()))
        if declared is not None:
            raise PackError("fields= applies to datasets; the fields of array files come from "
                            "the files")
        return spec
    if listing.kind != "dataset":
        if declared is not None:
            raise PackError("fields= applies to datasets returning records; "
                            f"{listing.description} is a {listing.kind} of image files")
        return None
    reasons = []
    for index in range(listing.count):
        try:
            item, _ = load_input(listing, index, raw=True)
        except SkipInput as exc:
            reasons.append(f"dataset[{index}]: {exc}")
            if len(reasons) >= 16:
                break
            continue
        if declared is None and not is_record(item):
            return None
        return make_spec(item, declared, f"dataset[{index}]")
    raise PackError(f"no sample of the dataset could be read to learn its fields: "
                    f"{'; '.join(reasons[:3])}")


# ---------------------------------------------------------------------------------------------
# Folders and list files of .npy / .npz files: one record per file

ARRAY_EXTENSIONS = (".npy", ".npz")


def is_array_file(name: str) -> bool:
    return name.lower().endswith(ARRAY_EXTENSIONS)


def load_array_file(path: str) -> dict[str, np.ndarray]:
    """A ``.npy`` file as ``{"array": ...}``, a ``.npz`` file as its arrays by name; pickled
    objects are refused (``allow_pickle=False``): loading them would run code from the file."""
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
        return {"array": loaded}
    with loaded:
        return {name: loaded[name] for name in loaded.files}


def array_headers(path: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of each array in a ``.npy``/``.npz`` file, from the headers only."""
    import zipfile

    def header(f) -> tuple[tuple[int, ...], np.dtype]:
        major, _ = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if major == 1 else
                np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(f)
        return tuple(shape), np.dtype(dtype)

    if path.lower().endswith(".npy"):
        array = np.load(path, mmap_mode="r", allow_pickle=False)  # maps, reads the header only
        return {"array": (tuple(array.shape), array.dtype)}
    out = {}
    with zipfile.ZipFile(path) as z:
        for member in z.namelist():
            if member.endswith(".npy"):
                with z.open(member) as f:
                    out[member[:-4]] = header(f)
    return out


def array_file_fields(files: Sequence[str], labelled: bool) -> RecordSpec:
    """The fields of an array-file source from every file's headers: an array whose first axis
    differs between files is declared variable along it (its other axes and dtype must agree)."""
    seen: dict[str, tuple[tuple[int, ...], np.dtype, str]] = {}
    variable: set[str] = set()
    for path in files:
        try:
            headers = array_headers(path)
        except (OSError, ValueError, KeyError):
            continue  # unreadable: skipped (and named) when packing
        for name, (shape, dtype) in headers.items():
            if name not in seen:
                seen[name] = (shape, dtype, path)
                continue
            shape0, dtype0, first = seen[name]
            if dtype != dtype0 or len(shape) != len(shape0) or shape[1:] != shape0[1:]:
                raise PackError(
                    f"{path}: {name!r} is {dtype} {shape}, but {first} holds {dtype0} {shape0}; "
                    "the arrays of a pack share their dtype and all axes but the first")
            if shape[:1] != shape0[:1]:
                variable.add(name)
    if not seen:
        raise PackError(f"none of the {len(files)} array files could be read")
    fields: dict[str, F.Field] = {}
    for name, (shape, dtype, _) in seen.items():
        check_name(name)
        if dtype.hasobject or dtype.kind not in "biufc":
            raise PackError(f"{name!r} holds {dtype}; array files must hold numbers or booleans")
        fields[name] = F.ArrayField(dtype.name, ((None,) + shape[1:]) if name in variable
                                    else shape)
    if labelled:
        fields["label"] = F.IntField("int64")
    return RecordSpec(fields, tuple(fields), "dict")


def class_names(listing: Any, spec: RecordSpec) -> dict[str, list[str]]:
    """Class names per int field: a Hugging Face dataset's ``ClassLabel`` names, or a labelled
    source's classes (a dataset's ``classes``, class folders) for its ``label`` field."""
    out: dict[str, list[str]] = {}
    features = getattr(listing.dataset, "features", None)
    if isinstance(features, Mapping):
        for name, feature in features.items():
            if name in spec.fields and type(feature).__name__ == "ClassLabel":
                out[name] = [str(n) for n in feature.names]
    if "label" in spec.fields and "label" not in out and listing.classes:
        out["label"] = list(listing.classes)
    return out


def write_records_lmdb(readers: Sequence[Any], output: Path, meta: dict[str, Any],
                       on_samples: Callable[[int], None] | None = None) -> None:
    """Writes records packs (in order) as one LMDB file: one value per field and sample, the
    same stored rows as the HDF5 datasets, per-field CRC-32 arrays, the metadata."""
    from fastpipe.data.lmdb import lmdb_crc_key, lmdb_field_key, lmdb_module
    from fastpipe.pack._write import LMDB_TXN_BYTES, meta_json, put_growing

    lmdb = lmdb_module()
    first = readers[0]
    total = sum(r.count for r in readers)
    env = lmdb.open(str(output), subdir=False, map_size=64 << 20, meminit=False, sync=False,
                    map_async=False, max_dbs=0, lock=True, readahead=False)
    try:
        batch: list[tuple[bytes, bytes]] = []
        size = 0

        def commit() -> None:
            nonlocal batch, size
            put_growing(env, batch)
            batch, size = [], 0

        base = 0
        for reader in readers:
            for i in range(reader.count):
                for name in first.order:
                    value = np.ascontiguousarray(reader.read(i, name)).tobytes()
                    batch.append((lmdb_field_key(name, base + i), value))
                    size += len(value)
                batch.append((fmt.lmdb_path_key(base + i),
                              reader.source(i).encode("utf-8", "surrogateescape")))
                if size >= LMDB_TXN_BYTES:
                    commit()
            if on_samples is not None:
                on_samples(reader.count)
            base += reader.count
        for name in first.order:
            crc = np.concatenate([r.crc32(name) for r in readers]) if total else np.zeros(0)
            batch.append((lmdb_crc_key(name), crc.astype("<u4").tobytes()))
        batch.append((fmt.LMDB_META, meta_json(dict(meta, count=total, merge="copy",
                                                     parts=None)).encode()))
        commit()
        env.sync(True)
    finally:
        env.close()
    Path(str(output) + "-lock").unlink(missing_ok=True)


def _columns_spec(listing: Any) -> RecordSpec:
    """The fields of a list file of records, from its first readable line."""
    from fastpipe.pack._sources import SkipInput, load_input

    for index in range(min(listing.count, 16)):
        try:
            record, _ = load_input(listing, index)
        except SkipInput:
            continue
        for name, value in record.items():
            if isinstance(value, dict):
                raise PackError(f"column {name!r} of {listing.description} names .npz files of "
                                f"several arrays ({sorted(value)}); a column holds one array")
        if (listing.labels >= 0).any():
            record["label"] = 0
        spec = make_spec(record, None, f"line {index + 1} of {listing.description}")
        return spec
    raise PackError(f"none of the first lines of {listing.description} could be read")
