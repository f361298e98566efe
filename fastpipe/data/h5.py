"""HDF5 packs: ``H5Dataset`` (a map-style dataset over an HDF5 pack made by
:func:`fastpipe.pack.pack`) and the per-process reader it opens.

Reads go straight to the file with ``os.preadv`` where the data is plain (contiguous or chunked
along the sample axis, unfiltered), and through h5py with the chunk cache off otherwise; a virtual
pack fastpipe merged is read from its part files. h5py is imported when a pack opens, not with
this module.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe._optional import require
from fastpipe.data._format import (
    ATTR_FORMAT,
    ATTR_VERSION,
    CRC32,
    DATA,
    FORMAT,
    IMAGE_VERSION,
    LABELS,
    META,
    OFFSETS,
    PATH_DATA,
    PATH_OFFSETS,
    R_CRC32,
    R_META,
    R_OFFSETS,
    R_PATH_DATA,
    R_PATH_OFFSETS,
    PackFormatError,
    PackReader,
    Spec,
    check_labels,
    check_offsets,
    damaged,
    parse_meta,
    record_fields,
)
from fastpipe.data._pack_dataset import PackDataset

__all__ = ["H5Dataset"]


class H5Dataset(PackDataset):
    """Reads an HDF5 pack: ``dataset[i] -> (image, label)``; a records pack or a plain HDF5
    file (top-level datasets sharing their first dimension, one row per sample) as records:
    ``dataset[i] -> {"mix": tensor, "zone0": tensor}``, or a tuple with ``fields=[...]`` (see
    docs/your-data.md).

    Bytes storage: ``decoder(data, source)`` turns the stored bytes (uint8 1-D array) into the
    image; the default decodes fully to a uint8 ``(3, H, W)`` tensor. Array storage: the stored
    array as a tensor (images as uint8 ``(3, H, W)``).

    Safe with DataLoader workers under fork and spawn (the file opens lazily in each process) and
    with DistributedSampler. Reads never use h5py fancy indexing: contiguous data (``merge="copy"``)
    is read with ``os.preadv`` at its file offset, chunked data one slice at a time with the chunk
    cache off. ``__getitems__`` reads a batch in storage order.

    ``auto_augment`` and ``transform`` follow, with every random draw of sample ``i`` a pure
    function of ``(seed, epoch, i)`` (``set_epoch``), as in :class:`~fastpipe.data.ImageFolder`.

    Attributes: ``targets`` (int64 numpy array), ``classes``, ``file`` (the pack), ``storage``
    (``"bytes"``/``"array"``), ``meta`` (the pack's JSON metadata), ``skipped`` (inputs left out
    when packing). Raw access: :meth:`encoded` (bytes storage) and :meth:`path`.
    """

    _format = "hdf5"


def h5py_module():
    return require("h5py", extra="hdf5", feature="HDF5 packs")


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
    return parse_meta(f[META][()], where, META)


# What h5py raises on a damaged file (a bad signature, a broken B-tree, a truncated object
# header): turned into a PackFormatError naming the pack wherever a reader touches the file.
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError)


def h5_damaged(where: str, exc: BaseException, doing: str = "read its HDF5 structure",
               ) -> PackFormatError:
    error = PackFormatError(f"{where}: cannot {doing} ({type(exc).__name__}: {exc}); the file is "
                            "damaged (run fastpipe verify on it)")
    error.__cause__ = exc
    return error


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
        # The checksums the merged pack records for this part's samples: a part file swapped
        # with another of the same count and plan holds other ones.
        self.expect_crc32: Any = None  # () -> np.ndarray, or None for a pack's own data
        self.local_byte_stop = 0  # bytes storage: the end of this part's bytes in its file

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
            self._open(f, spec)
        except PackFormatError:
            f.close()
            raise
        except H5_ERRORS as exc:
            f.close()
            raise h5_damaged(str(self.path), exc) from exc
        except BaseException:
            f.close()
            raise

    def _open(self, f, spec: Spec) -> None:
        self._check_part(f)
        where = str(self.path)
        ds = _require_dataset(f, DATA, where)
        local_stop = self.local_start + self.sample_stop - self.sample_start
        if spec.storage == "bytes":
            if ds.ndim != 1 or ds.shape[0] < self.local_byte_stop:
                raise PackFormatError(f"{where}: '{DATA}' has shape {ds.shape}, but the pack "
                                      f"reads its bytes up to {self.local_byte_stop}; the file "
                                      "is damaged")
        elif tuple(ds.shape[1:]) != tuple(spec.sample_shape) or ds.shape[0] < local_stop:
            raise PackFormatError(f"{where}: '{DATA}' has shape {ds.shape}, but the pack reads "
                                  f"rows up to {local_stop} of shape {tuple(spec.sample_shape)}; "
                                  "the file is damaged")
        if ds.dtype.newbyteorder("=") != np.dtype(spec.dtype):
            raise PackFormatError(f"{where}: '{DATA}' holds {ds.dtype}, but the pack's samples are "
                                  f"{spec.dtype}; the file is damaged")
        plain = (ds.dtype.isnative and f.userblock_size == 0
                 and ds.id.get_create_plist().get_nfilters() == 0 and not ds.is_virtual)
        self._row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
        direct = False
        end = 0  # the last byte of the file a direct read may touch
        if plain and ds.chunks is None:
            offset = ds.id.get_offset()
            if offset is not None:
                self._offset, direct = int(offset), True
                end = self._offset + ds.id.get_storage_size()
        elif plain and tuple(ds.chunks[1:]) == tuple(ds.shape[1:]):
            self._chunk_len = ds.chunks[0]
            self._chunks = _chunk_offsets(ds, self._chunk_len)
            direct = self._chunks is not None
            if direct:
                end = int(self._chunks.max()) + self._chunk_len * self._row_bytes if len(
                    self._chunks) else 0
        if direct:
            size = os.path.getsize(self.path)
            if end > size:
                raise PackFormatError(f"{where} is truncated: its '{DATA}' ends at byte {end} "
                                      f"but the file holds {size}; run fastpipe verify")
            self._fd = os.open(self.path, os.O_RDONLY)
            f.close()
        else:
            self._file, self._dataset = f, ds

    def _check_part(self, f) -> None:
        # A part file replaced since the merge (another pack run under the same name, or two
        # parts swapped) would be read at the old offsets: refuse it rather than return another
        # sample's bytes. Count and plan catch another run; the checksums catch a swap.
        if not self.expect and self.expect_crc32 is None:
            return
        meta = read_h5_meta(f, str(self.path))
        found = {key: meta.get(key) for key in self.expect}
        if key_mismatch := [k for k in self.expect if found[k] != self.expect[k]]:
            mismatches = ", ".join(f"{k} {found[k]!r}, expected {self.expect[k]!r}"
                                   for k in key_mismatch)
            raise PackFormatError(
                f"the part file {self.path} of a virtual pack was replaced after the merge "
                f"({mismatches}); pack the output again")
        if self.expect_crc32 is None:
            return
        n = self.sample_stop - self.sample_start
        ds = _require_dataset(f, CRC32, str(self.path))
        if ds.ndim != 1 or ds.shape[0] < self.local_start + n:
            raise PackFormatError(f"{self.path}: '{CRC32}' has shape {ds.shape}, shorter than the "
                                  f"{self.local_start + n} samples the merge recorded; the file is "
                                  "damaged")
        own = np.empty(n, np.uint32)
        if n:
            ds.read_direct(own, np.s_[self.local_start:self.local_start + n])
        if not np.array_equal(own, self.expect_crc32()):
            raise PackFormatError(
                f"the part file {self.path} of a virtual pack does not hold the samples "
                f"{self.sample_start} to {self.sample_stop - 1} the merge recorded (their "
                "checksums differ): part files were swapped or replaced after the merge; restore "
                "them or pack the output again")

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
            self._open(f, where)
        except PackFormatError:
            f.close()
            raise
        except H5_ERRORS as exc:
            f.close()
            raise h5_damaged(where, exc) from exc
        except BaseException:
            f.close()
            raise
        self._bounds = np.array([s.sample_start for s in self._segments], np.int64)

    def _open(self, f, where: str) -> None:
        """Reads and checks the metadata and the index arrays: everything a read slices with is
        validated here, so a damaged index is an error at open, not another sample's bytes."""
        self.meta = read_h5_meta(f, where)
        self.spec = Spec.from_meta(self.meta)
        self.count = int(self.meta["count"])
        self.classes = list(self.meta["classes"])
        self._file = f
        self.labels = _read_index(f, LABELS, where, (self.count,), np.int64)
        check_labels(self.labels, self.classes, where)
        self._path_offsets_array: np.ndarray | None = None  # loaded on first source()
        self._path_data = _require_dataset(f, PATH_DATA, where)
        _require_dataset(f, PATH_OFFSETS, where)
        data = _require_dataset(f, DATA, where)
        if self.spec.storage == "bytes":
            self.offsets = _read_index(f, OFFSETS, where, (self.count + 1,), np.int64)
            if data.ndim != 1:
                raise PackFormatError(f"{where}: '{DATA}' has shape {data.shape}, not the flat "
                                      "bytes of bytes storage; the file is damaged")
            check_offsets(self.offsets, data.shape[0], where, f"'{OFFSETS}'")
        else:
            expected = (self.count, *self.spec.sample_shape)
            if tuple(data.shape) != expected:
                raise PackFormatError(f"{where}: '{DATA}' has shape {data.shape}, expected "
                                      f"{expected}")
        if data.dtype.newbyteorder("=") != np.dtype(self.spec.dtype):
            raise PackFormatError(f"{where}: '{DATA}' holds {data.dtype}, but the metadata value "
                                  f"'dtype' says {self.spec.dtype}; the file is damaged")
        self._segments = self._make_segments(data.is_virtual)

    def _make_segments(self, virtual: bool) -> list[_Segment]:
        # Our virtual merges list their parts, so reads go straight to the part files. A file
        # whose data is physical (even if it was virtual once, e.g. after h5repack) or a virtual
        # dataset we did not write is one segment, read through h5py if need be.
        parts = self.meta.get("parts") if virtual and self.meta.get("merge") == "virtual" else None
        if not parts:
            total = int(self.offsets[-1]) if self.spec.storage == "bytes" else 0
            segment = _Segment(self.path, 0, self.count, 0, 0, 0)
            segment.local_byte_stop = total
            return [segment] if self.count or total else []
        segments = []
        where, bytes_storage = str(self.path), self.spec.storage == "bytes"
        crc_of = self._merged_crc32
        for k, part in enumerate(parts):
            s0, s1, l0, b0, lb0 = _part_ranges(part, k, self, where, bytes_storage,
                                               segments[-1].sample_stop if segments else 0)
            file = (self.path.parent / part["file"]).resolve()
            segment = _Segment(file, s0, s1, l0, b0, lb0)
            segment.local_byte_stop = lb0 + (int(self.offsets[s1]) - b0 if bytes_storage else 0)
            segment.expect = {k: part[f"part_{k}"] for k in ("count", "plan")
                              if f"part_{k}" in part}
            segment.expect_crc32 = (lambda a=s0, b=s1: crc_of(a, b))
            segments.append(segment)
        if (segments[-1].sample_stop if segments else 0) != self.count:
            raise damaged(where, "parts", f"maps samples up to {segments[-1].sample_stop}, but the "
                          f"pack holds {self.count}")
        missing = [str(s.path) for s in segments if not s.path.exists()]
        if missing:
            raise PackFormatError(
                f"{self.path} is a virtual pack whose part files are missing: "
                f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; keep the .shards "
                "folder next to the pack (or pack with merge='copy' for one self-contained file)"
            )
        return segments

    def _merged_crc32(self, start: int, stop: int) -> np.ndarray:
        """The checksums the pack records for samples ``[start, stop)``."""
        if self._file is None:
            raise ValueError(f"{self.path}: the pack reader is closed")
        ds = _require_dataset(self._file, CRC32, str(self.path))
        if tuple(ds.shape) != (self.count,):
            raise PackFormatError(f"{self.path}: '{CRC32}' has shape {ds.shape}, expected "
                                  f"{(self.count,)}; the file is damaged")
        out = np.empty(stop - start, np.uint32)
        if stop > start:
            ds.read_direct(out, np.s_[start:stop])
        return out

    @property
    def _path_offsets(self) -> np.ndarray:
        if self._path_offsets_array is None:
            where = str(self.path)
            try:
                offsets = _read_index(self._file, PATH_OFFSETS, where, (self.count + 1,),
                                      np.int64)
                check_offsets(offsets, self._path_data.shape[0], where, f"'{PATH_OFFSETS}'")
            except PackFormatError:
                raise
            except H5_ERRORS as exc:
                raise h5_damaged(where, exc, f"read '{PATH_OFFSETS}'") from exc
            self._path_offsets_array = offsets
        return self._path_offsets_array

    def _segment(self, index: int) -> _Segment:
        k = int(np.searchsorted(self._bounds, index, side="right")) - 1
        segment = self._segments[k]
        segment.open(self.spec)
        return segment

    def read(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        i = self._check_index(index)
        segment = self._segment(i)
        try:
            if self.spec.storage == "bytes":
                return segment.read_bytes(int(self.offsets[i]), int(self.offsets[i + 1]))
            if out is None:
                out = np.empty(self.spec.sample_shape, self.spec.dtype)
            segment.read_row(i, out)
            return out
        except PackFormatError:
            raise
        except H5_ERRORS as exc:  # a damaged chunk or filter of data read through h5py
            raise h5_damaged(str(segment.path), exc, f"read sample {i}") from exc

    def byte_size(self, index: int) -> int:
        if self.spec.storage == "bytes":
            i = self._check_index(index)
            return int(self.offsets[i + 1] - self.offsets[i])
        return super().byte_size(index)

    def source(self, index: int) -> str:
        i = self._check_index(index)
        return self.sources(i, i + 1)[0]

    def sources(self, start: int, stop: int) -> list[str]:
        a, b = int(self._path_offsets[start]), int(self._path_offsets[stop])
        try:
            blob = bytes(self._path_data[a:b]) if b > a else b""
        except H5_ERRORS as exc:
            raise h5_damaged(str(self.path), exc, f"read '{PATH_DATA}'") from exc
        rel = self._path_offsets[start:stop + 1] - a
        return [blob[rel[j]:rel[j + 1]].decode("utf-8", "replace") for j in range(stop - start)]

    def crc32(self) -> np.ndarray:
        try:
            return _read_index(self._file, CRC32, str(self.path), (self.count,), np.uint32)
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(str(self.path), exc, f"read '{CRC32}'") from exc

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


def _part_ranges(part: dict[str, Any], k: int, reader: H5PackReader, where: str,
                 bytes_storage: bool, start: int) -> tuple[int, int, int, int, int]:
    """(first sample, end sample, first local sample, first byte, first local byte) of part ``k``
    of a virtual merge, checked: the parts run back to back over the samples, and their byte
    ranges agree with the offsets."""
    def bad(what: str) -> PackFormatError:
        return damaged(where, "parts", f"has part {k} {what}")

    def pair(key: str, default: list[int] | None = None) -> list[int]:
        value = part.get(key, default)
        if not (isinstance(value, list) and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
                and value[0] <= value[1]):
            raise bad(f"with {key} {value!r}, not a range")
        return value

    if not isinstance(part.get("file"), str) or not part["file"]:
        raise bad(f"with file {part.get('file')!r}")
    s0, s1 = pair("samples")
    l0, l1 = pair("local_samples", [0, s1 - s0])
    if s0 != start or s1 > reader.count or l1 - l0 != s1 - s0:
        raise bad(f"mapping samples {s0} to {s1} (locally {l0} to {l1}) after sample {start} of "
                  f"{reader.count}")
    if not bytes_storage:
        return s0, s1, l0, 0, 0
    b0, b1 = pair("bytes")
    lb0, lb1 = pair("local_bytes", [0, b1 - b0])
    if [b0, b1] != [int(reader.offsets[s0]), int(reader.offsets[s1])] or lb1 - lb0 != b1 - b0:
        raise bad(f"mapping bytes {b0} to {b1} (locally {lb0} to {lb1}), but the offsets of its "
                  f"samples run from {int(reader.offsets[s0])} to {int(reader.offsets[s1])}")
    return s0, s1, l0, b0, lb0


def _read_index(f, name: str, where: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    ds = _require_dataset(f, name, where)
    if tuple(ds.shape) != shape:
        raise PackFormatError(f"{where}: '{name}' has shape {ds.shape}, expected {shape}; the file "
                              "is damaged")
    if ds.dtype.kind not in "iu":  # integers only: anything else would be cast
        raise PackFormatError(f"{where}: '{name}' holds {ds.dtype}, not integers; the file is "
                              "damaged")
    out = np.empty(shape, dtype)
    if out.size:
        ds.read_direct(out)
    return out


def h5_version(path: str | os.PathLike) -> int | None:
    """The fastpipe format version an HDF5 file is marked with; None for a plain HDF5 file."""
    h5py = h5py_module()
    try:
        with h5py.File(path, "r") as f:
            marker = f.attrs.get(ATTR_FORMAT)
            version = f.attrs.get(ATTR_VERSION)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PackFormatError(f"cannot open {path} as HDF5 ({exc})") from exc
    except H5_ERRORS as exc:
        raise h5_damaged(str(path), exc, "read its root attributes") from exc
    if isinstance(marker, bytes):
        marker = marker.decode("utf-8", "replace")
    if not isinstance(marker, str) or marker != FORMAT:
        return None
    if version is None:
        return IMAGE_VERSION
    if isinstance(version, np.ndarray) and version.shape == ():
        version = version.item()
    if not isinstance(version, (int, np.integer)) or isinstance(version, bool):
        raise PackFormatError(f"{path}: the root attribute '{ATTR_VERSION}' is {version!r}, not "
                              "a format version; the file is damaged")
    return int(version)


class _Column:
    """One field's dataset, read at random: rows ``[a, b)`` along its first axis.

    Plain data (native byte order, no filters, contiguous or chunked along the first axis only,
    not virtual) is read with ``os.preadv`` at its file offsets, with no h5py call on the hot
    path, so threads read in parallel; anything else reads through h5py.
    """

    def __init__(self, ds, fd_of: Any) -> None:
        self.ds = ds
        self.filename = ds.file.filename
        self.row_shape = tuple(ds.shape[1:])
        self.dtype = ds.dtype
        self._fd_of = fd_of  # opens the file's descriptor on first direct read
        self._offset: int | None = None
        self._chunks: np.ndarray | None = None
        self._chunk_len = 0
        self._row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * ds.dtype.itemsize
        plain = (ds.dtype.kind in "biuf" and ds.dtype.isnative and not ds.is_virtual
                 and ds.id.get_create_plist().get_nfilters() == 0 and ds.file.userblock_size == 0)
        if plain and ds.chunks is None:
            offset = ds.id.get_offset()
            self._offset = None if offset is None else int(offset)
        elif plain and tuple(ds.chunks[1:]) == self.row_shape:
            self._chunk_len = ds.chunks[0]
            self._chunks = _chunk_offsets(ds, self._chunk_len)
        self.direct = self._offset is not None or self._chunks is not None
        if self.direct:
            end = (self._offset + ds.id.get_storage_size() if self._chunks is None else
                   int(self._chunks.max()) + self._chunk_len * self._row_bytes
                   if len(self._chunks) else 0)
            size = os.path.getsize(ds.file.filename)
            if end > size:
                raise PackFormatError(f"{ds.file.filename} is truncated: {ds.name!r} ends at byte "
                                      f"{end} but the file holds {size}; run fastpipe verify")

    def rows(self, a: int, b: int) -> np.ndarray:
        out = np.empty((b - a, *self.row_shape), self.dtype)
        if b <= a:
            return out
        if not self.direct:
            self.ds.read_direct(out, np.s_[a:b])
            return out
        return self.read_into(a, b, out)

    def read_into(self, a: int, b: int, out: np.ndarray) -> np.ndarray:
        """Rows ``[a, b)`` into ``out`` (C-contiguous, of their dtype and shape); direct reads
        only (:attr:`direct`)."""
        fd = self._fd_of()
        flat = out.reshape(-1).view(np.uint8)
        if self._chunks is None:
            _pread(fd, flat, self._offset + a * self._row_bytes, self.filename)
            return out
        done, row = 0, a
        while row < b:  # the rows may span chunks: read the piece in each
            chunk, within = divmod(row, self._chunk_len)
            n = min(b - row, self._chunk_len - within)
            size = n * self._row_bytes
            _pread(fd, flat[done:done + size], int(self._chunks[chunk]) + within * self._row_bytes,
                   self.filename)
            done += size
            row += n
        return out


class _PartColumns:
    """A field of fastpipe's own virtual merge, read from its part files directly: the parts'
    rows one after the other (as the merge's virtual layout maps them), each part a
    :class:`_Column` with a descriptor of its own. Used only when every part reads directly."""

    direct = True

    def __init__(self, parts: list[_Column], lengths: list[int]) -> None:
        self.parts = parts
        self.starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        self.row_shape, self.dtype = parts[0].row_shape, parts[0].dtype

    def rows(self, a: int, b: int) -> np.ndarray:
        return self.read_into(a, b, np.empty((max(b - a, 0), *self.row_shape), self.dtype))

    def read_into(self, a: int, b: int, out: np.ndarray) -> np.ndarray:
        k = int(np.searchsorted(self.starts, a, side="right")) - 1
        row = a
        while row < b:
            start, stop = int(self.starts[k]), min(b, int(self.starts[k + 1]))
            if stop > row:
                self.parts[k].read_into(row - start, stop - start, out[row - a:stop - a])
                row = stop
            k += 1
        return out


def _pread(fd: int, out: np.ndarray, offset: int, where: str) -> None:
    if out.nbytes and os.preadv(fd, [out], offset) != out.nbytes:
        raise PackFormatError(f"{where} is truncated (short read); run fastpipe verify")


class H5RecordReader:
    """Reads records (named fields) from one HDF5 file in one process: a fastpipe records pack
    (format version 2), or a plain HDF5 file whose top-level datasets share their first
    dimension (one row per sample), as users write them.

    ``read(i, name)`` returns the stored form of a field (see :mod:`fastpipe.data.fields`);
    :func:`fastpipe.data.records.field_value` turns it into what the dataset returns.
    """

    def __init__(self, path: str | os.PathLike, plain: bool | None = None,
                 names: Sequence[str] | None = None) -> None:
        h5py = h5py_module()
        self.path = Path(path)
        where = str(self.path)
        if plain is None:
            plain = h5_version(self.path) is None
        self.plain = plain
        try:
            # Our packs are read a row at a time: no chunk cache. A user's file may be compressed
            # in chunks of many rows, where h5py's default cache saves decoding a chunk per row.
            f = h5py.File(self.path, "r", **({} if plain else {"rdcc_nbytes": 0}))
        except OSError as exc:
            raise PackFormatError(f"cannot open {where} as HDF5 ({exc})") from exc
        self._file = f
        self._fd: int | None = None
        self._fd_lock = threading.Lock()
        self._part_fds: dict[Path, int] = {}  # a virtual merge's part files, read directly
        self._path_offsets: np.ndarray | None = None  # loaded on first sources()
        self._path_column: _Column | None = None
        try:
            self._open(f, where, plain, names)
        except PackFormatError:
            f.close()
            raise
        except H5_ERRORS as exc:
            f.close()
            raise h5_damaged(where, exc) from exc
        except BaseException:
            f.close()
            raise

    def _open(self, f, where: str, plain: bool, names: Sequence[str] | None) -> None:
        """Reads and checks the metadata, each field's dataset (dtype, row shape, length) and the
        offsets of variable fields, labels within their classes, and the parts of a virtual
        merge."""
        if plain:
            self.meta, self.fields = _plain_fields(f, where, names)
        else:
            self.meta = parse_meta(_require_dataset(f, R_META, where)[()], where, R_META)
            self.fields = record_fields(self.meta, where)
        self.count = int(self.meta["count"])
        self.order: list[str] = list(self.meta["order"])
        self.classes: dict[str, list[str]] = dict(self.meta.get("classes") or {})
        self._columns: dict[str, _Column | None] = {}
        self._offsets: dict[str, np.ndarray] = {}
        for name in self.order:
            ds = _require_dataset(f, name, where)
            field = self.fields[name]
            if not plain:
                stored = np.dtype(field.stored_dtype)
                if (ds.dtype.newbyteorder("=") != stored
                        or tuple(ds.shape[1:]) != tuple(field.row_shape)):
                    raise PackFormatError(
                        f"{where}: field {name!r} is stored as {ds.dtype} rows of shape "
                        f"{tuple(ds.shape[1:])}, but its metadata says {stored} rows of shape "
                        f"{tuple(field.row_shape)}; the file is damaged")
            if not plain and field.variable:
                offsets = _read_index(f, f"{R_OFFSETS}/{name}", where, (self.count + 1,),
                                      np.int64)
                check_offsets(offsets, ds.shape[0], where, f"field {name!r}: its offsets")
                self._offsets[name] = offsets
            elif ds.shape[:1] != (self.count,):
                raise PackFormatError(f"{where}: field {name!r} has shape {ds.shape}, "
                                      f"expected {self.count} rows; the file is damaged")
            self._columns[name] = _Column(ds, self._descriptor) if ds.dtype.kind in "biuf" \
                else None
        if not plain and self.meta.get("merge") == "virtual" and self.meta.get("parts"):
            self._check_parts(f, where)
        for name, names_of in self.classes.items():
            field = self.fields[name]
            if field.kind == "int" and self._columns[name] is not None:
                labels = self._columns[name].rows(0, self.count).astype(np.int64)
                check_labels(labels, names_of, where, name)

    def _check_parts(self, f, where: str) -> None:
        """A virtual merge reads each field from its part files by name, and HDF5 fills a
        missing part with zeros: every part must be there and hold the samples the merge
        recorded (its checksums, one small array per field, against the merged ones)."""
        h5py = h5py_module()
        parts = self.meta["parts"]
        merged = {name: _read_index(f, f"{R_CRC32}/{name}", where, (self.count,), np.uint32)
                  for name in self.order}
        base = 0
        columns: dict[str, list[_Column]] = {n: [] for n in self.order if self._columns[n]}
        lengths: dict[str, list[int]] = {n: [] for n in columns}
        for k, part in enumerate(parts):
            n = part.get("count")
            if not (isinstance(part.get("file"), str) and isinstance(n, int)
                    and not isinstance(n, bool) and 0 <= n <= self.count - base):
                raise damaged(where, "parts", f"has part {k} as {part!r}")
            file = self.path.parent / part["file"]
            if not file.exists():
                raise PackFormatError(
                    f"{where} is a virtual pack whose part file {file} is missing; keep the "
                    ".shards folder next to the pack (or pack with merge='copy' for one "
                    "self-contained file)")
            try:
                with h5py.File(file, "r") as g:
                    for name in self.order:
                        # Equal checksums are the samples the merge recorded, whatever else
                        # about the file changed; a part of another run or a swapped one fails.
                        ds = g[f"{R_CRC32}/{name}"]
                        if ds.shape != (n,) or not np.array_equal(ds[()],
                                                                  merged[name][base:base + n]):
                            raise PackFormatError(
                                f"the part file {file} of a virtual pack does not hold the "
                                f"samples {base} to {base + n - 1} the merge recorded (the "
                                f"checksums of field {name!r} differ): part files were swapped "
                                "or replaced after the merge; restore them or pack the output "
                                "again")
                    for name in columns:
                        ds = g[name]
                        columns[name].append(_Column(ds, functools.partial(self._part_fd, file)))
                        lengths[name].append(ds.shape[0])
            except PackFormatError:
                raise
            except H5_ERRORS as exc:
                raise h5_damaged(str(file), exc) from exc
            base += n
        if base != self.count:
            raise damaged(where, "parts", f"maps {base} samples, but the pack holds {self.count}")
        # The merged datasets are virtual, which h5py reads a row at a time holding the GIL: read
        # the parts directly where every part allows it.
        for name, parts_of in columns.items():
            total = self._columns[name].ds.shape[0]
            if parts_of and all(c.direct for c in parts_of) and sum(lengths[name]) == total:
                for column in parts_of:
                    column.ds = None  # its file is closed; direct reads need only the descriptor
                self._columns[name] = _PartColumns(parts_of, lengths[name])

    def _part_fd(self, file: Path) -> int:
        fd = self._part_fds.get(file)
        if fd is None:  # loader threads may race here: one descriptor is kept, the other closed
            opened = os.open(file, os.O_RDONLY)
            fd = self._part_fds.setdefault(file, opened)
            if fd != opened:
                os.close(opened)
        return fd

    def _descriptor(self) -> int:
        if self._fd is None:
            with self._fd_lock:  # loader threads read from the first batch on
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
        return self._fd

    def _check_index(self, index: int) -> int:
        return PackReader._check_index(self, index)  # type: ignore[arg-type]

    def read(self, index: int, name: str) -> Any:
        """Field ``name`` of sample ``index`` as stored: a fixed field's row, a variable field's
        rows (flat uint8 for images, bytes and strings); a plain file's non-numeric values as
        h5py gives them."""
        column = self._columns[name]
        try:
            if name in self._offsets:
                offsets = self._offsets[name]
                return column.rows(int(offsets[index]), int(offsets[index + 1]))
            if column is None:  # strings, variable-length or compound data of a plain file
                return self._file[name][index]
            return column.rows(index, index + 1)[0]
        except PackFormatError:
            raise
        except H5_ERRORS as exc:  # a damaged chunk or filter, read through h5py
            raise h5_damaged(str(self.path), exc, f"read field {name!r} of sample {index}"
                             ) from exc

    def reads_into(self, name: str) -> bool:
        """Whether :meth:`read_into` takes field ``name``: fixed numeric fields read directly
        (not compressed, not through a virtual dataset fastpipe did not write)."""
        column = self._columns.get(name)
        return name not in self._offsets and column is not None and column.direct

    def read_into(self, index: int, name: str, out: np.ndarray) -> None:
        """Field ``name`` of sample ``index`` into ``out`` (its row's shape and dtype), for the
        fields :meth:`reads_into` takes."""
        column = self._columns[name]
        try:
            column.read_into(index, index + 1, out.reshape(1, *column.row_shape))
        except OSError as exc:
            raise h5_damaged(str(self.path), exc, f"read field {name!r} of sample {index}"
                             ) from exc

    def read_block(self, name: str, start: int, stop: int) -> np.ndarray:
        """The stored rows of samples ``[start, stop)`` of one field, concatenated."""
        try:
            if name in self._offsets:
                offsets = self._offsets[name]
                return self._columns[name].rows(int(offsets[start]), int(offsets[stop]))
            return self._columns[name].rows(start, stop)
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(str(self.path), exc,
                             f"read field {name!r} of samples {start} to {stop - 1}") from exc

    def offsets(self, name: str) -> np.ndarray | None:
        return self._offsets.get(name)

    def crc32(self, name: str) -> np.ndarray:
        try:
            return _read_index(self._file, f"{R_CRC32}/{name}", str(self.path), (self.count,),
                               np.uint32)
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(str(self.path), exc, f"read the checksums of field {name!r}") from exc

    def source(self, index: int) -> str:
        if self.plain:
            return f"{self.path}[{index}]"
        return self.sources(index, index + 1)[0]

    def sources(self, start: int, stop: int) -> list[str]:
        if self.plain:
            return [f"{self.path}[{i}]" for i in range(start, stop)]
        where = str(self.path)
        try:
            if self._path_offsets is None:
                data = _require_dataset(self._file, R_PATH_DATA, where)
                offsets = _read_index(self._file, R_PATH_OFFSETS, where, (self.count + 1,),
                                      np.int64)
                check_offsets(offsets, data.shape[0], where, f"'{R_PATH_OFFSETS}'")
                # Read like a field (os.preadv): error messages name each sample's source, and
                # an h5py slice per sample cost more than reading the sample itself.
                self._path_column = _Column(data, self._descriptor)
                self._path_offsets = offsets
            offsets = self._path_offsets[start:stop + 1]
            blob = (self._path_column.rows(int(offsets[0]), int(offsets[-1])).tobytes()
                    if len(offsets) else b"")
        except PackFormatError:
            raise
        except H5_ERRORS as exc:
            raise h5_damaged(where, exc, "read the source paths") from exc
        rel = offsets - offsets[0]
        return [blob[rel[j]:rel[j + 1]].decode("utf-8", "replace") for j in range(stop - start)]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for fd in getattr(self, "_part_fds", {}).values():
            os.close(fd)
        self._part_fds = {}
        f = getattr(self, "_file", None)
        if f is not None:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - see _Segment.close
                pass
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _plain_fields(f, where: str, names: Sequence[str] | None) -> tuple[dict[str, Any], dict]:
    """The metadata and fields of a plain HDF5 file: its top-level datasets (or ``names``), which
    must share their first dimension."""

    h5py = h5py_module()
    if names is None:
        names = [k for k in f if isinstance(f.get(k, getlink=False), h5py.Dataset)]
        if not names:
            raise PackFormatError(f"{where} has no datasets at its top level; read nested ones "
                                  "with fields=['group/name', ...]")
    lengths = {}
    fields = {}
    for name in names:
        if name not in f or not isinstance(f[name], h5py.Dataset):
            raise PackFormatError(f"{where} has no dataset {name!r} (it has: "
                                  f"{', '.join(sorted(f))})")
        ds = f[name]
        if ds.ndim == 0:
            raise PackFormatError(f"{where}: {name!r} is a scalar dataset, not one row per "
                                  "sample; leave it out with fields=[...]")
        lengths[name] = ds.shape[0]
        fields[name] = _plain_field(ds, f"{where}[{name!r}]")
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{n} {k}" for n, k in lengths.items())
        raise PackFormatError(f"the datasets of {where} have different lengths ({listed}), so they "
                              "are not one row per sample; pick those that are with "
                              "fields=[...]")
    meta = {"format": "hdf5", "count": next(iter(lengths.values())), "order": list(names),
            "fields": {n: fl.to_json() for n, fl in fields.items()}, "plain": True}
    return meta, fields


def _plain_field(ds, where: str):
    from fastpipe.data import fields as F

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
        return (F.FloatField if ds.dtype.kind == "f" else
                F.IntField if ds.dtype.kind in "biu" else
                lambda d: F.ArrayField(d, ()))(ds.dtype.name)
    return F.ArrayField(ds.dtype.name, tuple(ds.shape[1:]))
