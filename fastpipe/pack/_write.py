"""Writing packs: one streamed HDF5 shard, merged HDF5 files (virtual or copied), LMDB files.

Memory stays bounded: samples are buffered up to ``FLUSH_BYTES`` before each write, and merges
copy in blocks of at most ``COPY_BLOCK_BYTES``.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data import _format as fmt
from fastpipe.data._format import PackReader, Spec
from fastpipe.data.h5 import H5PackReader, h5py_module, read_h5_meta
from fastpipe.data.lmdb import lmdb_module
from fastpipe.pack._errors import PackError

FLUSH_BYTES = 8 * 1024 * 1024
FLUSH_SAMPLES = 1024
COPY_BLOCK_BYTES = 64 * 1024 * 1024
LMDB_TXN_BYTES = 64 * 1024 * 1024
LMDB_TXN_RECORDS = 4096

# Chunk sizes, chosen for random access with the chunk cache off (see docs/packing.md):
# a 256 KiB chunk of flat bytes still reads fast if someone opens the file with h5py's defaults.
BYTES_CHUNK = 256 * 1024
INDEX_CHUNK = 64 * 1024  # elements of labels/offsets/crc32
ROW_CHUNK_BYTES = 64 * 1024  # array storage: rows per chunk = max(1, this // row bytes)


def array_chunks(sample_shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    row_bytes = max(1, int(np.prod(sample_shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return (max(1, ROW_CHUNK_BYTES // row_bytes), *sample_shape)


def meta_json(meta: dict[str, Any]) -> str:
    return json.dumps(meta, sort_keys=True, ensure_ascii=False)


def _index_dataset(f, name: str, dtype, chunk: int, initial: np.ndarray | None = None):
    data = np.zeros(0, dtype) if initial is None else initial.astype(dtype)
    return f.create_dataset(name, data=data, maxshape=(None,), chunks=(chunk,))


def _append(ds, values: np.ndarray) -> None:
    n = ds.shape[0]
    if len(values):
        ds.resize((n + len(values), *ds.shape[1:]))
        ds[n:n + len(values)] = values


def _stored_dtype(spec: Spec) -> np.dtype:
    return np.dtype(spec.dtype).newbyteorder("<")


def write_root(f, meta: dict[str, Any], spec: Spec, count: int) -> None:
    h5py = h5py_module()
    f.attrs[fmt.ATTR_FORMAT] = fmt.FORMAT
    f.attrs[fmt.ATTR_VERSION] = fmt.IMAGE_VERSION
    f.attrs["storage"] = spec.storage
    f.attrs["count"] = np.int64(count)
    if fmt.META in f:
        del f[fmt.META]
    f.create_dataset(fmt.META, data=meta_json(meta), dtype=h5py.string_dtype("utf-8"))


class ShardWriter:
    """Streams samples into a new HDF5 pack file (chunked, resizable datasets)."""

    def __init__(self, path: Path, spec: Spec, expected: int = INDEX_CHUNK) -> None:
        h5py = h5py_module()
        # Small shards get small index chunks: HDF5 allocates whole chunks.
        chunk = min(INDEX_CHUNK, max(64, expected + 1))
        self.path = path
        self.spec = spec
        self.f = h5py.File(path, "w")
        self.count = 0
        self._bytes_written = 0
        self._paths_written = 0
        self._labels = _index_dataset(self.f, fmt.LABELS, np.int64, chunk)
        self._crc = _index_dataset(self.f, fmt.CRC32, np.uint32, chunk)
        self._path_offsets = _index_dataset(self.f, fmt.PATH_OFFSETS, np.int64, chunk, np.zeros(1))
        self._path_data = self.f.create_dataset(fmt.PATH_DATA, shape=(0,), dtype=np.uint8,
                                                maxshape=(None,),
                                                chunks=(min(INDEX_CHUNK, 64 * chunk),))
        if spec.storage == "bytes":
            self._offsets = _index_dataset(self.f, fmt.OFFSETS, np.int64, chunk, np.zeros(1))
            self._data = self.f.create_dataset(fmt.DATA, shape=(0,), dtype=np.uint8,
                                               maxshape=(None,), chunks=(BYTES_CHUNK,))
        else:
            shape = tuple(spec.sample_shape)
            self._data = self.f.create_dataset(
                fmt.DATA, shape=(0, *shape), dtype=_stored_dtype(spec), maxshape=(None, *shape),
                chunks=array_chunks(shape, spec.dtype))
        self._buffer: list[np.ndarray] = []
        self._buffer_labels: list[int] = []
        self._buffer_paths: list[bytes] = []
        self._buffer_bytes = 0

    def add(self, sample: np.ndarray, label: int, source: str) -> None:
        self._buffer.append(sample)
        self._buffer_labels.append(label)
        self._buffer_paths.append(source.encode("utf-8", "surrogateescape"))
        self._buffer_bytes += sample.nbytes
        if self._buffer_bytes >= FLUSH_BYTES or len(self._buffer) >= FLUSH_SAMPLES:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        samples = self._buffer
        crcs = np.array([zlib.crc32(s) for s in samples], np.uint32)
        if self.spec.storage == "bytes":
            sizes = np.array([s.nbytes for s in samples], np.int64)
            _append(self._data, np.concatenate(samples))
            _append(self._offsets, self._bytes_written + np.cumsum(sizes))
            self._bytes_written += int(sizes.sum())
        else:
            _append(self._data, np.stack(samples))
        path_sizes = np.array([len(p) for p in self._buffer_paths], np.int64)
        _append(self._path_data, np.frombuffer(b"".join(self._buffer_paths), np.uint8))
        _append(self._path_offsets, self._paths_written + np.cumsum(path_sizes))
        self._paths_written += int(path_sizes.sum())
        _append(self._labels, np.array(self._buffer_labels, np.int64))
        _append(self._crc, crcs)
        self.count += len(samples)
        self._buffer, self._buffer_labels, self._buffer_paths, self._buffer_bytes = [], [], [], 0

    def finish(self, meta: dict[str, Any]) -> None:
        self.flush()
        meta = dict(meta, count=self.count)
        write_root(self.f, meta, self.spec, self.count)
        self.f.close()

    def abort(self) -> None:
        try:
            self.f.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def read_block(reader: PackReader, start: int, stop: int) -> np.ndarray:
    """Samples ``[start, stop)`` of a pack: concatenated bytes, or stacked rows."""
    if reader.spec.storage == "bytes":
        if isinstance(reader, H5PackReader):
            out = []
            i = start
            while i < stop:
                segment = reader._segment(i)
                j = min(stop, segment.sample_stop)
                out.append(segment.read_bytes(int(reader.offsets[i]), int(reader.offsets[j])))
                i = j
            return np.concatenate(out) if out else np.zeros(0, np.uint8)
        parts = [reader.read(i) for i in range(start, stop)]
        return np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    out = np.empty((stop - start, *reader.spec.sample_shape), reader.spec.dtype)
    for j, i in enumerate(range(start, stop)):
        reader.read(i, out[j])
    return out


def sample_sizes(reader: PackReader) -> np.ndarray:
    if reader.spec.storage == "array":
        return np.full(reader.count, reader.byte_size(0) if reader.count else 0, np.int64)
    if isinstance(reader, H5PackReader):
        return np.diff(reader.offsets)
    return np.array([reader.byte_size(i) for i in range(reader.count)], np.int64)


def _blocks(sizes: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Splits samples into runs of at most ``limit`` bytes (at least one sample each)."""
    blocks = []
    ends = np.cumsum(sizes)
    start, base = 0, 0
    n = len(sizes)
    while start < n:
        stop = int(np.searchsorted(ends, base + limit, side="right"))
        stop = max(stop, start + 1)
        blocks.append((start, stop))
        base = int(ends[stop - 1])
        start = stop
    return blocks


def write_merged_h5(readers: Sequence[PackReader], output: Path, meta: dict[str, Any], mode: str,
                    on_samples: Callable[[int], None] | None = None) -> None:
    """Writes ``readers`` (in order) as one HDF5 pack: ``data`` virtual or copied contiguous.

    Index datasets (labels, offsets, crc32, paths) are always physical copies: small, and readers
    load them at open.
    """
    h5py = h5py_module()
    spec = readers[0].spec
    total = sum(r.count for r in readers)
    sizes = [sample_sizes(r) for r in readers]
    total_bytes = int(sum(int(s.sum()) for s in sizes))
    parts: list[dict[str, Any]] = []
    with h5py.File(output, "w") as f:
        labels = f.create_dataset(fmt.LABELS, shape=(total,), dtype=np.int64,
                                  chunks=_chunks1(total))
        crc = f.create_dataset(fmt.CRC32, shape=(total,), dtype=np.uint32, chunks=_chunks1(total))
        path_offsets = f.create_dataset(fmt.PATH_OFFSETS, shape=(total + 1,), dtype=np.int64,
                                        chunks=_chunks1(total + 1))
        path_data = f.create_dataset(fmt.PATH_DATA, shape=(0,), dtype=np.uint8, maxshape=(None,),
                                     chunks=(INDEX_CHUNK,))
        offsets = None
        if spec.storage == "bytes":
            offsets = f.create_dataset(fmt.OFFSETS, shape=(total + 1,), dtype=np.int64,
                                       chunks=_chunks1(total + 1))
            offsets[0:1] = 0
        path_offsets[0:1] = 0
        data = None
        if mode == "copy":
            shape = (total_bytes,) if spec.storage == "bytes" else (total, *spec.sample_shape)
            data = f.create_dataset(fmt.DATA, shape=shape, dtype=_stored_dtype(spec))  # contiguous
        else:
            shape = (total_bytes,) if spec.storage == "bytes" else (total, *spec.sample_shape)
            layout = h5py.VirtualLayout(shape=shape, dtype=_stored_dtype(spec))

        sample_base = byte_base = path_base = 0
        for reader, size in zip(readers, sizes, strict=True):
            n = reader.count
            if n:
                labels[sample_base:sample_base + n] = reader.labels
                crc[sample_base:sample_base + n] = reader.crc32()
            if offsets is not None and n:
                offsets[sample_base + 1:sample_base + n + 1] = byte_base + np.cumsum(size)
            for a, b in _blocks(np.full(n, 256, np.int64), COPY_BLOCK_BYTES):  # paths, in blocks
                names = [s.encode("utf-8", "surrogateescape") for s in reader.sources(a, b)]
                blob = np.frombuffer(b"".join(names), np.uint8)
                _append(path_data, blob)
                path_offsets[sample_base + a + 1:sample_base + b + 1] = (
                    path_base + np.cumsum([len(x) for x in names]))
                path_base += len(blob)
            if mode == "copy":
                position = byte_base
                for a, b in _blocks(size, COPY_BLOCK_BYTES):
                    block = read_block(reader, a, b)
                    if spec.storage == "bytes":
                        data[position:position + len(block)] = block
                        position += len(block)
                    else:
                        data[sample_base + a:sample_base + b] = block
                    if on_samples is not None:
                        on_samples(b - a)
            else:
                parts.extend(_map_virtual(h5py, layout, reader, output.parent, sample_base,
                                          byte_base))
                if on_samples is not None:
                    on_samples(n)
            sample_base += n
            byte_base += int(size.sum())
        if mode != "copy":
            f.create_virtual_dataset(fmt.DATA, layout)
        mapped = parts if mode == "virtual" else None
        write_root(f, dict(meta, count=total, merge=mode, parts=mapped), spec, total)


def _chunks1(n: int) -> tuple[int] | None:
    return (min(INDEX_CHUNK, n),) if n else None


def _map_virtual(h5py, layout, reader: PackReader, root: Path, sample_base: int, byte_base: int):
    if not isinstance(reader, H5PackReader):
        raise PackError(f"{reader.path} is not an HDF5 pack: a virtual merge maps HDF5 "
                        "files; use merge='copy'")
    parts = []
    for segment in reader._segments:
        s0, s1 = segment.sample_start, segment.sample_stop
        if s1 <= s0:
            continue
        with h5py.File(segment.path, "r") as src:
            source_shape = src[fmt.DATA].shape
            part_meta = read_h5_meta(src, str(segment.path))
        relative = os.path.relpath(segment.path, root)
        local0 = segment.local_start
        entry = {"file": relative, "samples": [sample_base + s0, sample_base + s1],
                 "local_samples": [local0, local0 + s1 - s0],
                 # checked when a reader opens the part: a replaced part file is refused
                 "part_count": int(part_meta["count"]), "part_plan": part_meta.get("plan")}
        source = h5py.VirtualSource(relative, fmt.DATA, shape=source_shape)
        if reader.spec.storage == "bytes":
            b0, b1 = int(reader.offsets[s0]), int(reader.offsets[s1])
            lb0 = b0 - segment.byte_start + segment.local_byte_start
            if b1 > b0:
                layout[byte_base + b0:byte_base + b1] = source[lb0:lb0 + b1 - b0]
            entry["bytes"] = [byte_base + b0, byte_base + b1]
            entry["local_bytes"] = [lb0, lb0 + b1 - b0]
        else:
            layout[sample_base + s0:sample_base + s1] = source[local0:local0 + s1 - s0]
        parts.append(entry)
    return parts


def put_growing(env, batch: list[tuple[bytes, bytes]]) -> None:
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


def write_lmdb(readers: Sequence[PackReader], output: Path, meta: dict[str, Any],
               on_samples: Callable[[int], None] | None = None) -> None:
    """Writes ``readers`` (in order) as one LMDB pack file (``subdir=False``)."""
    lmdb = lmdb_module()
    total = sum(r.count for r in readers)
    sizes = [sample_sizes(r) for r in readers]
    payload = int(sum(int(s.sum()) for s in sizes))
    # Values land on 4 KiB pages; leave room for page rounding, keys and the B-tree.
    map_size = int(payload * 1.3) + total * 4096 // 8 + (64 << 20)
    env = lmdb.open(str(output), subdir=False, map_size=map_size, meminit=False, sync=False,
                    map_async=False, max_dbs=0, lock=True, readahead=False)
    try:
        labels = np.empty(total, "<i8")
        crcs = np.empty(total, "<u4")
        batch: list[tuple[bytes, bytes]] = []
        batch_bytes = 0

        def commit() -> None:
            nonlocal batch, batch_bytes
            put_growing(env, batch)
            batch, batch_bytes = [], 0

        base = 0
        for reader, size in zip(readers, sizes, strict=True):
            labels[base:base + reader.count] = reader.labels
            crcs[base:base + reader.count] = reader.crc32()
            for a, b in _blocks(size, COPY_BLOCK_BYTES):
                block = read_block(reader, a, b)
                names = reader.sources(a, b)
                position = 0
                for j, i in enumerate(range(a, b)):
                    if reader.spec.storage == "bytes":
                        value = block[position:position + int(size[i])].tobytes()
                        position += int(size[i])
                    else:
                        value = np.ascontiguousarray(block[j], _stored_dtype(reader.spec)).tobytes()
                    batch.append((fmt.lmdb_data_key(base + i), value))
                    name = names[j].encode("utf-8", "surrogateescape")
                    batch.append((fmt.lmdb_path_key(base + i), name))
                    batch_bytes += len(value)
                    if batch_bytes >= LMDB_TXN_BYTES or len(batch) >= 2 * LMDB_TXN_RECORDS:
                        commit()
                if on_samples is not None:
                    on_samples(b - a)
            base += reader.count
        batch.append((fmt.LMDB_LABELS, labels.tobytes()))
        batch.append((fmt.LMDB_CRC32, crcs.tobytes()))
        final = dict(meta, count=total, merge="copy", parts=None)
        batch.append((fmt.LMDB_META, meta_json(final).encode()))
        commit()
        env.sync(True)
    finally:
        env.close()
    lock = Path(str(output) + "-lock")
    if lock.exists():
        lock.unlink()
