"""Writing packs of the current format (version 3, fastpipe.data.format.layout): one streamed HDF5
shard writer, one merger of packs into one HDF5 file (virtual or copied), one LMDB writer.

Every pack is a record of fields: one HDF5 dataset per field at the root (fixed fields
``(N, *row)``, variable fields their rows back to back with offsets), fastpipe's own datasets
under ``_fastpipe/`` (offsets, per-field CRC-32, source paths, the JSON metadata). The merger and
the LMDB writer read their parts through the sources (fastpipe.data.sources), so parts of any
format version merge by copy; they open one part at a time, so merging a thousand parts never
holds a thousand files open.

Memory stays bounded: a shard buffers up to ``FLUSH_BYTES`` before each write, and merges copy in
blocks of at most ``COPY_BLOCK_BYTES``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.format import layout as fmt
from fastpipe.data.format.layout import PackFormatError
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources._hdf5 import H5_ERRORS, h5_damaged, h5py_module, open_h5
from fastpipe.data.sources.lmdb import lmdb_module
from fastpipe.pack._errors import PackError

FLUSH_BYTES = 8 * 1024 * 1024
FLUSH_SAMPLES = 1024
COPY_BLOCK_BYTES = 64 * 1024 * 1024
LMDB_TXN_BYTES = 64 * 1024 * 1024
LMDB_TXN_RECORDS = 4096
# Chunk sizes, chosen for random access with the chunk cache off (see docs/packing.md): a
# variable field's rows in chunks of up to 256 KiB (a sample spans at most two; still fast for
# someone who opens the file with h5py's defaults), a fixed field's rows in chunks of up to
# 64 KiB (at least one row), index datasets in chunks of up to 64 Ki elements.
FLAT_CHUNK_BYTES = 256 * 1024
ROW_CHUNK_BYTES = 64 * 1024
INDEX_CHUNK = 64 * 1024


def row_bytes(field: Any) -> int:
    """Bytes of one stored row of ``field`` (a fixed field's sample; a variable field's row)."""
    return int(np.prod(field.row_shape, dtype=np.int64)) * np.dtype(field.stored_dtype).itemsize


def write_root(f, meta: dict[str, Any]) -> None:
    """The root attributes that mark a pack of the current version, and its metadata, sealed
    with its checksum (fastpipe.data.format.layout.sealed)."""
    h5py = h5py_module()
    f.attrs[fmt.ATTR_FORMAT] = fmt.FORMAT
    f.attrs[fmt.ATTR_VERSION] = fmt.VERSION
    f.attrs["count"] = np.int64(meta["count"])
    if fmt.R_META in f:
        del f[fmt.R_META]
    f.create_dataset(fmt.R_META, data=fmt.meta_json(fmt.sealed(meta)),
                     dtype=h5py.string_dtype("utf-8"))


def read_meta(path: Path) -> dict[str, Any]:
    """The checked metadata of a pack of any version (HDF5 or LMDB), without opening its
    samples: what resuming, merging and reporting need."""
    if fmt.sniff_format(path) == "lmdb":
        from fastpipe.data.sources.lmdb import _Transactions

        handles = _Transactions(Path(path))
        try:
            raw = handles.get(fmt.LMDB_META)
            raw = None if raw is None else bytes(raw)  # the buffer ends with the transaction
        finally:
            handles.close()
        if raw is None:
            raise PackFormatError(f"{path} is an LMDB file but not a fastpipe pack (no "
                                  f"{fmt.LMDB_META!r} key)")
        return fmt.parse_meta(raw, str(path), fmt.LMDB_META.decode())
    with open_h5(path, rdcc_nbytes=0) as f:
        try:
            for name in (fmt.R_META, fmt.META):
                if name in f:
                    return fmt.parse_meta(f[name][()], str(path), name)
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(str(path), exc, "read its metadata") from exc
    raise PackFormatError(f"{path} is not a fastpipe pack (no metadata)")


def open_pack(path: Path) -> Source:
    """A pack (HDF5 or LMDB, any format version) as a source; a plain HDF5 file is refused."""
    if fmt.sniff_format(path) == "lmdb":
        from fastpipe.data.sources.lmdb import LMDBSource

        return LMDBSource(path)
    from fastpipe.data.sources.h5 import H5Source

    source = H5Source(path)
    if source.version is None:
        raise PackFormatError(f"{path} is an HDF5 file but not a fastpipe pack (no "
                              f"'{fmt.ATTR_FORMAT}' marker)")
    return source


def _chunks(field: Any) -> tuple[int, ...]:
    rows = max(1, (FLAT_CHUNK_BYTES if field.variable else ROW_CHUNK_BYTES)
               // max(1, row_bytes(field)))
    return (rows, *field.row_shape)


def _index(f, name: str, dtype, chunk: int, first: np.ndarray | None = None):
    data = np.zeros(0, dtype) if first is None else first.astype(dtype)
    return f.create_dataset(name, data=data, maxshape=(None,), chunks=(chunk,))


def _append(ds, values: np.ndarray) -> None:
    n = ds.shape[0]
    if len(values):
        ds.resize((n + len(values), *ds.shape[1:]))
        ds[n:n + len(values)] = values


class ShardWriter:
    """Streams records into a new HDF5 pack file: one resizable dataset per field."""

    def __init__(self, path: Path, schema: Schema, expected: int = INDEX_CHUNK) -> None:
        h5py = h5py_module()
        # Small shards get small index chunks: HDF5 allocates whole chunks.
        chunk = min(INDEX_CHUNK, max(64, expected + 1))
        self.path, self.schema = path, schema
        self.names = schema.names
        self.f = h5py.File(path, "w")
        self.count = 0
        fields = schema.fields
        self._data = {n: self.f.create_dataset(
            n, shape=(0, *fields[n].row_shape), dtype=fields[n].stored_dtype,
            maxshape=(None, *fields[n].row_shape), chunks=_chunks(fields[n]))
            for n in self.names}
        self._crc = {n: _index(self.f, f"{fmt.R_CRC32}/{n}", np.uint32, chunk)
                     for n in self.names}
        self._offsets = {n: _index(self.f, f"{fmt.R_OFFSETS}/{n}", np.int64, chunk, np.zeros(1))
                         for n in self.names if fields[n].variable}
        self._rows = dict.fromkeys(self._offsets, 0)
        self._path_offsets = _index(self.f, fmt.R_PATH_OFFSETS, np.int64, chunk, np.zeros(1))
        self._path_data = self.f.create_dataset(fmt.R_PATH_DATA, shape=(0,), dtype=np.uint8,
                                                maxshape=(None,),
                                                chunks=(min(INDEX_CHUNK, 64 * chunk),))
        self._path_bytes = 0
        self._buffer: list[dict[str, np.ndarray]] = []
        self._buffer_paths: list[bytes] = []
        self._buffer_bytes = 0

    def add(self, rows: dict[str, np.ndarray], source: str) -> None:
        """One sample: the stored rows of each field, and where it was packed from."""
        self._buffer.append(rows)
        self._buffer_paths.append(source.encode("utf-8", "surrogateescape"))
        self._buffer_bytes += sum(v.nbytes for v in rows.values())
        if self._buffer_bytes >= FLUSH_BYTES or len(self._buffer) >= FLUSH_SAMPLES:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        for name in self.names:
            rows = [s[name] for s in self._buffer]
            _append(self._crc[name], np.array([zlib.crc32(r) for r in rows], np.uint32))
            if name in self._offsets:
                sizes = np.array([len(r) for r in rows], np.int64)
                _append(self._data[name], np.concatenate(rows))
                _append(self._offsets[name], self._rows[name] + np.cumsum(sizes))
                self._rows[name] += int(sizes.sum())
            else:
                _append(self._data[name], np.stack(rows))
        sizes = np.array([len(p) for p in self._buffer_paths], np.int64)
        _append(self._path_data, np.frombuffer(b"".join(self._buffer_paths), np.uint8))
        _append(self._path_offsets, self._path_bytes + np.cumsum(sizes))
        self._path_bytes += int(sizes.sum())
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


# ---------------------------------------------------------------------------------------------
# Merging


@dataclass
class _Leaf:
    """A file a virtual merge maps: a pack that is not itself virtual, with its sample count,
    plan, and stored rows per field."""

    path: Path
    count: int
    plan: str | None
    rows: dict[str, int]


@dataclass
class _Part:
    """What the first pass of a merge learns of a part, opened on its own."""

    path: Path
    count: int
    rows: dict[str, int]  # stored rows per field
    path_bytes: int
    leaves: list[_Leaf] = field(default_factory=list)  # virtual merges only


def _blocks(sizes: np.ndarray, limit: int = COPY_BLOCK_BYTES) -> list[tuple[int, int]]:
    """Splits samples of ``sizes`` bytes into runs of at most ``limit`` bytes (at least one sample
    each)."""
    blocks, start, base = [], 0, 0
    ends = np.cumsum(sizes)
    while start < len(sizes):
        stop = max(start + 1, int(np.searchsorted(ends, base + limit, side="right")))
        blocks.append((start, stop))
        base = int(ends[stop - 1])
        start = stop
    return blocks


def _offsets(source: Source, name: str) -> np.ndarray | None:
    """A variable field's offsets (sample ``i`` is stored rows ``o[i]:o[i+1]``), read from the
    values where the pack keeps none (LMDB); None for a fixed field."""
    f = source.schema.fields[name]
    if not f.variable:
        return None
    offsets = source.offsets(name)
    if offsets is not None:
        return np.asarray(offsets, np.int64)
    lengths = np.zeros(source.count + 1, np.int64)
    for a in range(0, source.count, 256):
        b = min(source.count, a + 256)
        values = source.read_batch(range(a, b), names=[name])
        lengths[a + 1:b + 1] = [len(v[name]) for v in values]
    return np.cumsum(lengths)


def _sample_bytes(source: Source, offsets: dict[str, np.ndarray | None]) -> np.ndarray:
    """Stored bytes of each sample, all fields together (to cut copies into blocks)."""
    total = np.zeros(source.count, np.int64)
    for name, o in offsets.items():
        row = max(1, row_bytes(source.schema.fields[name]))
        total += (np.diff(o) if o is not None else 1) * row
    return total


def _estimated_bytes(source: Source, path: Path) -> np.ndarray:
    """Stored bytes of each sample where the pack keeps offsets (HDF5), else the average of the
    file (LMDB, whose values would have to be read to know)."""
    every = {n: source.offsets(n) for n, f in source.schema.fields.items() if f.variable}
    if all(o is not None for o in every.values()):
        return _sample_bytes(source, {n: _offsets(source, n) for n in source.schema.names})
    return np.full(source.count, max(1, os.path.getsize(path) // max(1, source.count)))


def _crc32(source: Source, name: str, a: int, b: int, rows: np.ndarray,
           offsets: np.ndarray | None) -> np.ndarray:
    """The checksums of samples ``[a, b)`` of a field: the stored ones, or (a version 1 pack's
    labels, which had none) computed from the rows read."""
    stored = source.crc32(name)
    if stored is not None:
        return np.asarray(stored[a:b], np.uint32)
    if offsets is None:
        return np.array([zlib.crc32(np.ascontiguousarray(r)) for r in rows], np.uint32)
    o = offsets[a:b + 1] - offsets[a]
    return np.array([zlib.crc32(np.ascontiguousarray(rows[o[k]:o[k + 1]]))
                     for k in range(b - a)], np.uint32)


def _paths(source: Source, a: int, b: int) -> list[bytes]:
    return [p.encode("utf-8", "surrogateescape") for p in source.paths(a, b)]


def _path_bytes(source: Source) -> int:
    return sum(len(p) for a, b in _blocks(np.full(source.count, 1), 65536)
               for p in _paths(source, a, b))


def _leaves(path: Path, names: Sequence[str], seen: frozenset = frozenset()) -> list[_Leaf]:
    """The files a virtual merge maps for the pack ``path``: its part files (recursively) for a
    virtual pack, itself otherwise. Each is opened on its own, and only for its metadata and
    shapes."""
    real = path.resolve()
    if real in seen:
        raise PackFormatError(f"{path}: the parts of a virtual pack lead back to it")
    with open_h5(path, rdcc_nbytes=0) as f:
        meta = fmt.parse_meta(f[fmt.R_META][()], str(path), fmt.R_META) if fmt.R_META in f \
            else None
        if meta is None:
            raise PackError(f"{path} is a pack of format version 1, whose samples a virtual "
                            "merge of the current format cannot map: merge with merge='copy' "
                            "(or upgrade it first: fastpipe pack --upgrade OLD NEW)")
        virtual = meta.get("merge") == "virtual" and meta.get("parts")
        if not virtual:
            rows = {}
            for name in names:
                if name not in f or f[name].is_virtual:
                    raise PackFormatError(f"{path}: field {name!r} is missing or not stored in "
                                          "the file; run fastpipe verify on it")
                rows[name] = int(f[name].shape[0])
            # A file without samples maps nothing (its empty datasets have no rows to read).
            count = int(meta["count"])
            return [_Leaf(path, count, meta.get("plan"), rows)] if count else []
    out: list[_Leaf] = []
    for part in meta["parts"]:
        file = part.get("file") if isinstance(part, dict) else None
        if not isinstance(file, str):
            raise fmt.damaged(str(path), "parts", f"has the part {part!r}")
        out.extend(_leaves(path.parent / file, names, seen | {real}))
    return out


def _survey(path: Path, names: Sequence[str], mode: str) -> _Part:
    """A part's counts, opened on its own: samples, stored rows per field, bytes of source paths,
    and for a virtual merge the files it maps."""
    with open_pack(path) as source:
        rows = {}
        for name in names:
            offsets = _offsets(source, name)
            rows[name] = int(offsets[-1]) if offsets is not None else source.count
        part = _Part(path, source.count, rows, _path_bytes(source))
        if mode == "virtual":
            if fmt.sniff_format(path) != "hdf5":
                raise PackError(f"{path} is an LMDB pack: a virtual merge maps HDF5 files; use "
                                "merge='copy'")
            if source.version == fmt.IMAGE_VERSION:
                raise PackError(f"{path} is a pack of format version 1, whose samples a virtual "
                                "merge of the current format cannot map: merge with "
                                "merge='copy' (or upgrade it first: fastpipe pack --upgrade OLD "
                                "NEW)")
    if mode == "virtual":
        part.leaves = _leaves(path, names)
        for name in names:
            mapped = sum(leaf.rows[name] for leaf in part.leaves)
            if mapped != rows[name]:
                raise PackFormatError(f"{path}: its part files hold {mapped} rows of field "
                                      f"{name!r}, the pack {rows[name]}; run fastpipe verify on "
                                      "it")
    return part


def merge_hdf5(files: Sequence[Path], output: Path, meta: dict[str, Any], schema: Schema,
               mode: str, on_samples: Callable[[int], None] | None = None) -> None:
    """Writes the packs ``files`` (in order, any format version) as one HDF5 pack at ``output``:
    each field a virtual dataset over the parts' field datasets (``mode="virtual"``, what the
    common recipe builds by hand with ``h5py.VirtualLayout``; parts that are themselves virtual
    map straight to their part files) or a contiguous copy (``"copy"``). Offsets, checksums and
    source paths are always copied, contiguous."""
    h5py = h5py_module()
    names = schema.names
    parts = [_survey(p, names, mode) for p in files]
    total = sum(p.count for p in parts)
    with h5py.File(output, "w") as f:
        data = {}
        for name in names:
            fld = schema.fields[name]
            shape = (sum(p.rows[name] for p in parts), *fld.row_shape)
            if mode == "virtual" and shape[0]:
                layout = h5py.VirtualLayout(shape=shape, dtype=fld.stored_dtype)
                base = 0
                for leaf in (leaf for p in parts for leaf in p.leaves):
                    n = leaf.rows[name]
                    if n:
                        relative = os.path.relpath(leaf.path, output.parent)
                        layout[base:base + n] = h5py.VirtualSource(
                            relative, name, shape=(n, *fld.row_shape))
                    base += n
                f.create_virtual_dataset(name, layout)
            else:  # contiguous: a copy, or an empty field
                data[name] = f.create_dataset(name, shape=shape, dtype=fld.stored_dtype)
            f.create_dataset(f"{fmt.R_CRC32}/{name}", shape=(total,), dtype=np.uint32)
            if fld.variable:
                f.create_dataset(f"{fmt.R_OFFSETS}/{name}", shape=(total + 1,), dtype=np.int64)
        path_offsets = f.create_dataset(fmt.R_PATH_OFFSETS, shape=(total + 1,), dtype=np.int64)
        path_data = f.create_dataset(fmt.R_PATH_DATA, shape=(sum(p.path_bytes for p in parts),),
                                     dtype=np.uint8)
        path_offsets[0:1] = 0
        for name in names:
            if schema.fields[name].variable:
                f[f"{fmt.R_OFFSETS}/{name}"][0:1] = 0
        first = 0
        rows_base = dict.fromkeys(names, 0)
        path_base = 0
        for part in parts:  # one part open at a time
            with open_pack(part.path) as source:
                every = {name: _offsets(source, name) for name in names}
                sizes = _sample_bytes(source, every)
                for name in names:
                    offsets = every[name]
                    n = source.count
                    for a, b in _blocks(sizes):
                        rows = source.read_block(name, a, b) if name in data or \
                            source.crc32(name) is None else None
                        if name in data:
                            lo = int(offsets[a]) if offsets is not None else a
                            data[name][rows_base[name] + lo:rows_base[name] + lo + len(rows)] = \
                                rows
                        f[f"{fmt.R_CRC32}/{name}"][first + a:first + b] = _crc32(
                            source, name, a, b, rows, offsets)
                    if offsets is not None and n:
                        f[f"{fmt.R_OFFSETS}/{name}"][first + 1:first + n + 1] = \
                            rows_base[name] + offsets[1:]
                    rows_base[name] += part.rows[name]
                for a, b in _blocks(np.full(source.count, 1), 65536):
                    paths = _paths(source, a, b)
                    blob = np.frombuffer(b"".join(paths), np.uint8)
                    path_data[path_base:path_base + len(blob)] = blob
                    path_offsets[first + a + 1:first + b + 1] = path_base + np.cumsum(
                        [len(p) for p in paths], dtype=np.int64)
                    path_base += len(blob)
                first += source.count
            if on_samples is not None:
                on_samples(part.count)
        mapped = None
        if mode == "virtual":
            mapped = [{"file": os.path.relpath(leaf.path, output.parent), "count": leaf.count,
                       "plan": leaf.plan} for p in parts for leaf in p.leaves]
        write_root(f, dict(meta, count=total, merge=mode, parts=mapped))


def _put(env, batch: list[tuple[bytes, bytes]]) -> None:
    """Writes ``batch`` in one LMDB transaction, doubling the map size until it fits."""
    lmdb = lmdb_module()
    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in batch:
                    txn.put(key, value)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)


def write_lmdb(files: Sequence[Path], output: Path, meta: dict[str, Any], schema: Schema,
               on_samples: Callable[[int], None] | None = None) -> None:
    """Writes the packs ``files`` (in order, any format version) as one LMDB pack file
    (``subdir=False``): one value per field and sample (its stored rows), the checksums of each
    field, the source paths, the metadata."""
    lmdb = lmdb_module()
    names = schema.names
    payload = sum(os.path.getsize(p) for p in files if os.path.isfile(p))
    # Values land on 4 KiB pages; leave room for page rounding, keys and the B-tree (the map
    # grows when this is short: virtual parts' data lies in their part files).
    env = lmdb.open(str(output), subdir=False, map_size=int(payload * 1.3) + (64 << 20),
                    meminit=False, sync=False, map_async=False, max_dbs=0, lock=True,
                    readahead=False)
    try:
        crcs: dict[str, list[np.ndarray]] = {n: [] for n in names}
        batch: list[tuple[bytes, bytes]] = []
        size, base = 0, 0
        for path in files:  # one part open at a time
            with open_pack(path) as source:
                for a, b in _blocks(_estimated_bytes(source, path), LMDB_TXN_BYTES // 4):
                    records = source.read_batch(range(a, b), names=names)
                    paths = _paths(source, a, b)
                    for name in names:
                        values = [np.ascontiguousarray(r[name]) for r in records]
                        stored = source.crc32(name)
                        crcs[name].append(np.asarray(stored[a:b], np.uint32) if stored is not None
                                          else np.array([zlib.crc32(v) for v in values],
                                                        np.uint32))
                        for k, value in enumerate(values):
                            raw = value.tobytes()
                            batch.append((fmt.lmdb_field_key(name, base + a + k), raw))
                            size += len(raw)
                    for k, p in enumerate(paths):
                        batch.append((fmt.lmdb_path_key(base + a + k), p))
                    if size >= LMDB_TXN_BYTES or len(batch) >= LMDB_TXN_RECORDS * len(names):
                        _put(env, batch)
                        batch, size = [], 0
                    if on_samples is not None:
                        on_samples(b - a)
                base += source.count
        for name in names:
            crc = np.concatenate(crcs[name]) if crcs[name] else np.zeros(0, np.uint32)
            batch.append((fmt.lmdb_crc_key(name), crc.astype("<u4").tobytes()))
        batch.append((fmt.LMDB_META, fmt.meta_json(fmt.sealed(dict(meta, count=base,
                                                                    merge="copy",
                                                                    parts=None))).encode()))
        _put(env, batch)
        env.sync(True)
    finally:
        env.close()
    Path(str(output) + "-lock").unlink(missing_ok=True)
