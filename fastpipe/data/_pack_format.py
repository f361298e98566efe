"""The fastpipe pack format (HDF5 and LMDB): names, metadata, validation and per-process readers.

The format is documented in ``docs/packing.md``; keep the two in step. Readers here are plain
objects owned by one process: datasets create them lazily (after a fork or in a spawned worker)
and never pickle them.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe._optional import require

FORMAT = "fastpipe-pack"
VERSION = 1

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

# LMDB keys.
LMDB_META = b"__meta__"
LMDB_LABELS = b"__labels__"  # little-endian int64 array
LMDB_CRC32 = b"__crc32__"  # little-endian uint32 array


def lmdb_data_key(index: int) -> bytes:
    return b"data/%010d" % index


def lmdb_path_key(index: int) -> bytes:
    return b"path/%010d" % index


# Chunk sizes, chosen for random access with the chunk cache off (see docs/packing.md):
# a 256 KiB chunk of flat bytes still reads fast if someone opens the file with h5py's defaults.
BYTES_CHUNK = 256 * 1024
INDEX_CHUNK = 64 * 1024  # elements of labels/offsets/crc32
ROW_CHUNK_BYTES = 64 * 1024  # array storage: rows per chunk = max(1, this // row bytes)

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class PackError(RuntimeError):
    """Packing or merging could not finish; the message says why and what to do."""


class CorruptInputError(PackError):
    """An input could not be read or decoded while packing with ``strict=True``."""


class PackFormatError(ValueError):
    """A file is not a readable fastpipe pack (wrong kind of file, damaged, or a missing key)."""


def h5py_module():
    return require("h5py", extra="hdf5", feature="HDF5 packs")


def lmdb_module():
    return require("lmdb", extra="lmdb", feature="LMDB packs")


def array_chunks(sample_shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    row_bytes = max(1, int(np.prod(sample_shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return (max(1, ROW_CHUNK_BYTES // row_bytes), *sample_shape)


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


def meta_json(meta: dict[str, Any]) -> str:
    return json.dumps(meta, sort_keys=True, ensure_ascii=False)


def check_meta(meta: Any, where: str) -> dict[str, Any]:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PackFormatError(f"{where} has no fastpipe metadata: not a fastpipe pack")
    version = meta.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise PackFormatError(
            f"{where} is a fastpipe pack of format version {version}; this fastpipe reads up to "
            f"version {VERSION}: upgrade fastpipe"
        )
    for key in ("storage", "layout", "count", "classes"):
        if key not in meta:
            raise PackFormatError(f"{where}: metadata lacks the key {key!r}; the file is damaged")
    if meta["storage"] not in ("bytes", "array"):
        raise PackFormatError(f"{where}: unknown storage {meta['storage']!r}")
    return meta


def read_h5_meta(f, where: str) -> dict[str, Any]:
    """Validates the marker of an open h5py File and returns its metadata."""
    marker = f.attrs.get(ATTR_FORMAT)
    if isinstance(marker, bytes):
        marker = marker.decode()
    if marker != FORMAT:
        raise PackFormatError(
            f"{where} is an HDF5 file but not a fastpipe pack (no '{ATTR_FORMAT}' attribute); "
            "make one with: fastpipe pack SOURCE OUTPUT"
        )
    if META not in f:
        raise PackFormatError(f"{where} is a fastpipe pack without its '{META}' dataset; the file "
                              "is damaged")
    raw = f[META][()]
    try:
        meta = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except ValueError as exc:
        raise PackFormatError(f"{where}: the '{META}' dataset is not valid JSON ({exc})") from exc
    return check_meta(meta, where)


def _require_dataset(f, name: str, where: str):
    if name not in f:
        raise PackFormatError(
            f"{where} is a fastpipe pack without the dataset '{name}'; the file is damaged or "
            f"incomplete: run fastpipe verify {where}"
        )
    return f[name]


class _Segment:
    """One physical ``data`` dataset holding a run of samples, opened on first use.

    Uncompressed data is read with ``os.preadv`` at its file offsets, with no h5py call on the hot
    path: a contiguous dataset (``merge="copy"``) has one offset; a chunked one (shards, virtual
    merges) gets a table of chunk offsets built once at open. Anything else (filters, a foreign
    byte order, unallocated chunks) reads through h5py with the chunk cache off, so a read touches
    only the bytes it needs.
    """

    def __init__(self, path: Path, sample_start: int, sample_stop: int, local_start: int,
                 byte_start: int = 0, local_byte_start: int = 0) -> None:
        self.path = path
        self.sample_start, self.sample_stop = sample_start, sample_stop
        self.local_start = local_start
        self.byte_start, self.local_byte_start = byte_start, local_byte_start
        self._file = None
        self._dataset = None
        self._fd: int | None = None
        self._offset = 0  # contiguous: file offset of the data
        self._chunks: np.ndarray | None = None  # chunked: file offset of each chunk along axis 0
        self._chunk_len = 0  # elements (bytes storage) or rows (array storage) per chunk
        self._row_bytes = 0
        self.expect: dict[str, Any] = {}  # the part file's "count" and "plan" as the merge saw them

    def open(self, spec: Spec) -> None:
        if self._dataset is not None or self._fd is not None:
            return
        h5py = h5py_module()
        if not self.path.exists():
            raise PackFormatError(
                f"the part file {self.path} of a virtual pack is missing; keep the .shards folder "
                "next to the pack (or pack with merge='copy' for one self-contained file)"
            )
        try:
            f = h5py.File(self.path, "r", rdcc_nbytes=0)
        except OSError as exc:
            raise PackFormatError(f"cannot open {self.path} as HDF5: {exc}") from exc
        try:
            self._check_part(f)
        except BaseException:
            f.close()
            raise
        ds = _require_dataset(f, DATA, str(self.path))
        plain = (ds.dtype == np.dtype(spec.dtype) and ds.dtype.isnative and f.userblock_size == 0
                 and ds.id.get_create_plist().get_nfilters() == 0 and not ds.is_virtual)
        self._row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
        direct = False
        if plain and ds.chunks is None:
            offset = ds.id.get_offset()
            if offset is not None:
                self._offset, direct = int(offset), True
        elif plain and tuple(ds.chunks[1:]) == tuple(ds.shape[1:]):
            self._chunk_len = ds.chunks[0]
            self._chunks = _chunk_offsets(ds, self._chunk_len)
            direct = self._chunks is not None
        if direct:
            self._fd = os.open(self.path, os.O_RDONLY)
            f.close()
        else:
            self._file, self._dataset = f, ds

    def _check_part(self, f) -> None:
        # A part file replaced since the merge (another pack run under the same name) would be
        # read at the old offsets: refuse it rather than return another sample's bytes.
        if not self.expect:
            return
        meta = read_h5_meta(f, str(self.path))
        found = {key: meta.get(key) for key in self.expect}
        if key_mismatch := [k for k in self.expect if found[k] != self.expect[k]]:
            mismatches = ", ".join(f"{k} {found[k]!r}, expected {self.expect[k]!r}"
                                   for k in key_mismatch)
            raise PackFormatError(
                f"the part file {self.path} of a virtual pack was replaced after the merge "
                f"({mismatches}); pack the output again")

    def _pread(self, out: np.ndarray, offset: int) -> None:
        if os.preadv(self._fd, [out], offset) != out.nbytes:
            raise PackFormatError(f"{self.path} is truncated (short read); run fastpipe verify")

    def read_bytes(self, start: int, stop: int) -> np.ndarray:
        """Global byte range ``[start, stop)`` of the pack's flat ``data``."""
        local = start - self.byte_start + self.local_byte_start
        n = stop - start
        if self._fd is None:
            return self._dataset[local:local + n]
        out = np.empty(n, np.uint8)
        if not n:
            return out
        if self._chunks is None:
            self._pread(out, self._offset + local)
            return out
        done = 0
        while done < n:  # a sample may span chunks: read the piece in each
            chunk, within = divmod(local + done, self._chunk_len)
            piece = min(n - done, self._chunk_len - within)
            self._pread(out[done:done + piece], int(self._chunks[chunk]) + within)
            done += piece
        return out

    def read_row(self, index: int, out: np.ndarray) -> None:
        local = index - self.sample_start + self.local_start
        if self._fd is None:
            out[...] = self._dataset[local]
        elif self._chunks is None:
            self._pread(out, self._offset + local * self._row_bytes)
        else:
            chunk, within = divmod(local, self._chunk_len)
            self._pread(out, int(self._chunks[chunk]) + within * self._row_bytes)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._file is not None:
            try:
                self._file.close()
            except Exception:  # noqa: BLE001 - closing a handle inherited across fork may fail
                pass
            self._file = self._dataset = None


def _chunk_offsets(ds, chunk_len: int) -> np.ndarray | None:
    """File offsets of the chunks of a dataset chunked along axis 0 only; None if any is missing."""
    count = -(-ds.shape[0] // chunk_len) if ds.shape[0] else 0
    offsets = np.full(count, -1, np.int64)
    full = ds.chunks[0] * int(np.prod(ds.chunks[1:], dtype=np.int64)) * ds.dtype.itemsize

    def record(info) -> None:
        if info.byte_offset is not None and info.size == full:
            offsets[info.chunk_offset[0] // chunk_len] = info.byte_offset

    try:
        if hasattr(ds.id, "chunk_iter"):
            ds.id.chunk_iter(record)  # one pass over the chunk index (HDF5 >= 1.14)
        else:
            for k in range(ds.id.get_num_chunks()):
                record(ds.id.get_chunk_info(k))
    except Exception:  # noqa: BLE001 - an old HDF5 without chunk queries: read through h5py
        return None
    return offsets if count and (offsets >= 0).all() else None


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


class H5PackReader(PackReader):
    def __init__(self, path: str | os.PathLike) -> None:
        h5py = h5py_module()
        self.path = Path(path)
        where = str(self.path)
        try:
            f = h5py.File(self.path, "r", rdcc_nbytes=0)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise PackFormatError(f"cannot open {where} as HDF5 ({exc}): not a fastpipe pack or "
                                  "damaged") from exc
        try:
            self.meta = read_h5_meta(f, where)
            self.spec = Spec.from_meta(self.meta)
            self.count = int(self.meta["count"])
            self.classes = list(self.meta["classes"])
            self.labels = _read_index(f, LABELS, where, (self.count,), np.int64)
            self._path_offsets_array: np.ndarray | None = None  # loaded on first source()
            self._path_data = _require_dataset(f, PATH_DATA, where)
            _require_dataset(f, PATH_OFFSETS, where)
            data = _require_dataset(f, DATA, where)
            if self.spec.storage == "bytes":
                self.offsets = _read_index(f, OFFSETS, where, (self.count + 1,), np.int64)
                if data.ndim != 1 or data.shape[0] < self.offsets[-1]:
                    raise PackFormatError(
                        f"{where}: '{DATA}' holds {data.shape} bytes but the offsets end at "
                        f"{int(self.offsets[-1])}; the file is damaged")
            else:
                expected = (self.count, *self.spec.sample_shape)
                if tuple(data.shape) != expected:
                    raise PackFormatError(f"{where}: '{DATA}' has shape {data.shape}, expected "
                                          f"{expected}")
            self._file = f
            self._segments = self._make_segments(data.is_virtual)
        except BaseException:
            f.close()
            raise
        self._bounds = np.array([s.sample_start for s in self._segments], np.int64)

    def _make_segments(self, virtual: bool) -> list[_Segment]:
        # Our virtual merges list their parts, so reads go straight to the part files. A file
        # whose data is physical (even if it was virtual once, e.g. after h5repack) or a virtual
        # dataset we did not write is one segment, read through h5py if need be.
        parts = self.meta.get("parts") if virtual and self.meta.get("merge") == "virtual" else None
        if not parts:
            total = int(self.offsets[-1]) if self.spec.storage == "bytes" else 0
            return [_Segment(self.path, 0, self.count, 0, 0, 0)] if self.count or total else []
        segments = []
        for part in parts:
            file = (self.path.parent / part["file"]).resolve()
            s0, s1 = part["samples"]
            b0 = part["bytes"][0] if self.spec.storage == "bytes" else 0
            lb0 = part.get("local_bytes", [0])[0] if self.spec.storage == "bytes" else 0
            segment = _Segment(file, s0, s1, part.get("local_samples", [0])[0], b0, lb0)
            segment.expect = {k: part[f"part_{k}"] for k in ("count", "plan")
                              if f"part_{k}" in part}
            segments.append(segment)
        missing = [str(s.path) for s in segments if not s.path.exists()]
        if missing:
            raise PackFormatError(
                f"{self.path} is a virtual pack whose part files are missing: "
                f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; keep the .shards "
                "folder next to the pack (or pack with merge='copy' for one self-contained file)"
            )
        return segments

    @property
    def _path_offsets(self) -> np.ndarray:
        if self._path_offsets_array is None:
            self._path_offsets_array = _read_index(self._file, PATH_OFFSETS, str(self.path),
                                                   (self.count + 1,), np.int64)
        return self._path_offsets_array

    def _segment(self, index: int) -> _Segment:
        k = int(np.searchsorted(self._bounds, index, side="right")) - 1
        segment = self._segments[k]
        segment.open(self.spec)
        return segment

    def read(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        i = self._check_index(index)
        segment = self._segment(i)
        if self.spec.storage == "bytes":
            return segment.read_bytes(int(self.offsets[i]), int(self.offsets[i + 1]))
        if out is None:
            out = np.empty(self.spec.sample_shape, self.spec.dtype)
        segment.read_row(i, out)
        return out

    def byte_size(self, index: int) -> int:
        if self.spec.storage == "bytes":
            i = self._check_index(index)
            return int(self.offsets[i + 1] - self.offsets[i])
        return super().byte_size(index)

    def source(self, index: int) -> str:
        i = self._check_index(index)
        a, b = int(self._path_offsets[i]), int(self._path_offsets[i + 1])
        return bytes(self._path_data[a:b]).decode("utf-8", "replace")

    def sources(self, start: int, stop: int) -> list[str]:
        a, b = int(self._path_offsets[start]), int(self._path_offsets[stop])
        blob = bytes(self._path_data[a:b]) if b > a else b""
        rel = self._path_offsets[start:stop + 1] - a
        return [blob[rel[j]:rel[j + 1]].decode("utf-8", "replace") for j in range(stop - start)]

    def crc32(self) -> np.ndarray:
        return _read_index(self._file, CRC32, str(self.path), (self.count,), np.uint32)

    def close(self) -> None:
        for segment in getattr(self, "_segments", []):
            segment.close()
        f = getattr(self, "_file", None)
        if f is not None:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - see _Segment.close
                pass
            self._file = None


def _read_index(f, name: str, where: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    ds = _require_dataset(f, name, where)
    if tuple(ds.shape) != shape:
        raise PackFormatError(f"{where}: '{name}' has shape {ds.shape}, expected {shape}; the file "
                              "is damaged")
    out = np.empty(shape, dtype)
    if out.size:
        ds.read_direct(out)
    return out


# py-lmdb refuses to open one environment twice in a process (and a forked child inherits that
# bookkeeping), so readers of the same file share one environment per process.
_LMDB_ENVS: dict[str, list] = {}  # real path -> [environment, users, pid]
_LMDB_LOCK = threading.Lock()


def _new_lmdb_lock() -> None:
    global _LMDB_LOCK
    _LMDB_LOCK = threading.Lock()  # a fork while another thread held it must not deadlock the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lmdb_lock)


def _lmdb_acquire(path: Path):
    lmdb = lmdb_module()
    key = os.path.realpath(path)
    pid = os.getpid()
    with _LMDB_LOCK:
        entry = _LMDB_ENVS.get(key)
        if entry is not None and entry[2] != pid:
            # Inherited through fork: an LMDB environment must not cross a fork, so close this
            # process's copy (the parent's stays open) and open our own.
            try:
                entry[0].close()
            except Exception:  # noqa: BLE001 - best effort on an inherited handle
                pass
            del _LMDB_ENVS[key]
            entry = None
        if entry is None:
            try:
                env = lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False,
                                readahead=False, max_readers=1024)
            except lmdb.Error as exc:
                raise PackFormatError(f"cannot open {path} as LMDB ({exc}): not a fastpipe pack or "
                                      "damaged") from exc
            entry = _LMDB_ENVS[key] = [env, 0, pid]
        entry[1] += 1
        return entry[0]


def _lmdb_release(path: Path, env) -> None:
    key = os.path.realpath(path)
    with _LMDB_LOCK:
        entry = _LMDB_ENVS.get(key)
        if entry is None or entry[0] is not env or entry[2] != os.getpid():
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _LMDB_ENVS[key]
            env.close()


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
            raw = self._txn.get(LMDB_META)
            if raw is None:
                raise PackFormatError(f"{where} is an LMDB file but not a fastpipe pack (no "
                                      f"{LMDB_META!r} key)")
            try:
                meta = json.loads(bytes(raw).decode())
            except ValueError as exc:
                raise PackFormatError(f"{where}: the metadata is not valid JSON ({exc})") from exc
            self.meta = check_meta(meta, where)
            self.spec = Spec.from_meta(self.meta)
            self.count = int(self.meta["count"])
            self.classes = list(self.meta["classes"])
            self.labels = self._array(LMDB_LABELS, "<i8").astype(np.int64)
        except BaseException:
            self.close()
            raise

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
        raw = self._txn.get(key)
        if raw is None:
            raise PackFormatError(f"{self.path} is a fastpipe pack without the key {key!r}; the "
                                  "file is damaged")
        out = np.frombuffer(bytes(raw), dtype)
        if out.shape != (self.count,):
            raise PackFormatError(f"{self.path}: {key!r} holds {out.shape[0]} values, expected "
                                  f"{self.count}")
        return out

    def _get(self, key: bytes, index: int):
        raw = self._txn.get(key)
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


def open_pack(path: str | os.PathLike, format: str | None = None) -> PackReader:
    """Opens an HDF5 or LMDB pack (format sniffed from the file unless given) in this process."""
    fmt = format or sniff_format(path)
    if fmt == "hdf5":
        return H5PackReader(path)
    if fmt == "lmdb":
        return LMDBPackReader(path)
    raise ValueError(f"format must be 'hdf5' or 'lmdb', got {format!r}")
