"""HDF5 files as the reader engine sees them: h5py opened with errors that name the file, and
where an h5py dataset's rows lie (:class:`~fastpipe.data.sources._engine.Extents`) when they can
be read straight from the file.

A dataset is read directly when its rows are plain bytes in one file: native byte order, no
filters, not virtual, numbers, stored contiguous or chunked along the first axis only (each chunk
whole rows), every chunk allocated. Its file is the one the dataset belongs to, which for an
external link is the linked file. Anything else reads through h5py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe._optional import require
from fastpipe.data.format.layout import (
    ATTR_FORMAT,
    ATTR_VERSION,
    FORMAT,
    IMAGE_VERSION,
    PackFormatError,
)
from fastpipe.data.sources._engine import Extents, resource_error, too_many_open_files

# What h5py raises on a damaged file (a bad signature, a broken B-tree, a truncated object
# header): a PackFormatError naming the file wherever a reader touches it.
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError)


def h5py_module():
    return require("h5py", extra="hdf5", feature="HDF5 files")


def h5_damaged(where: str, exc: BaseException, doing: str = "read its HDF5 structure",
               ) -> Exception:
    """The error for what h5py raised while doing ``doing``: damage to the file, or (never
    reported as damage) a limit of the machine."""
    if resource_error(exc):
        return too_many_open_files(where, exc)
    error = PackFormatError(f"{where}: cannot {doing} ({type(exc).__name__}: {exc}); the file is "
                            "damaged (run fastpipe verify on it)")
    error.__cause__ = exc
    return error


def open_h5(path: str | os.PathLike, **options: Any):
    """``h5py.File(path, "r")``; a missing file is FileNotFoundError, a file HDF5 cannot open a
    PackFormatError naming it (or OSError for a limit of the machine)."""
    h5py = h5py_module()
    try:
        return h5py.File(path, "r", **options)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if resource_error(exc):
            raise too_many_open_files(str(path), exc) from exc
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such file: {path}") from exc
        raise PackFormatError(f"cannot open {path} as HDF5 ({exc}): not an HDF5 file, or "
                              "damaged") from exc


def h5_version(path: str | os.PathLike) -> int | None:
    """The fastpipe format version an HDF5 file is marked with; None for a plain HDF5 file."""
    try:
        with open_h5(path) as f:
            marker = f.attrs.get(ATTR_FORMAT)
            version = f.attrs.get(ATTR_VERSION)
    except (PackFormatError, FileNotFoundError):
        raise
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


def require_dataset(f, name: str, where: str):
    if name not in f:
        raise PackFormatError(
            f"{where} is a fastpipe pack without the dataset '{name}'; the file is damaged or "
            f"incomplete: run fastpipe verify {where}")
    return f[name]


def read_index(f, name: str, where: str, shape: tuple[int, ...], dtype,
               mapped: bool = False) -> np.ndarray:
    """An index dataset (offsets, labels, checksums) of the ``shape`` expected and integer values
    (anything else would be cast), read whole; with ``mapped``, memory-mapped where it is stored
    contiguous in ``dtype`` (the page cache then holds one copy for every process that reads
    the file, and pickling sends where it lies, not the values: :class:`MappedIndex`)."""
    ds = require_dataset(f, name, where)
    if tuple(ds.shape) != shape:
        raise PackFormatError(f"{where}: '{name}' has shape {ds.shape}, expected {shape}; the file "
                              "is damaged")
    if ds.dtype.kind not in "iu":
        raise PackFormatError(f"{where}: '{name}' holds {ds.dtype}, not integers; the file is "
                              "damaged")
    if mapped and ds.dtype == np.dtype(dtype) and plain_layout(ds) and ds.chunks is None:
        offset = ds.id.get_offset()
        size = int(np.prod(shape, dtype=np.int64)) * ds.dtype.itemsize
        if offset is not None and size and offset + size <= os.path.getsize(ds.file.filename):
            return MappedIndex.map(ds.file.filename, int(offset), ds.dtype, shape)
    out = np.empty(shape, dtype)
    if out.size:
        ds.read_direct(out)
    return out


class MappedIndex(np.ndarray):
    """An index array memory-mapped read-only from its file: shared by every process through the
    page cache; pickled as (file, offset, dtype, shape) and mapped again where it is unpickled
    (a spawned DataLoader worker), so no process holds its own copy."""

    @classmethod
    def map(cls, path: str, offset: int, dtype: Any, shape: tuple[int, ...]) -> MappedIndex:
        array = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
        out = np.asarray(array).view(cls)
        out._where = (path, offset, np.dtype(dtype).str, tuple(shape))
        return out

    def __array_finalize__(self, obj: Any) -> None:
        self._where = None  # slices and results are plain views, pickled by value

    def __reduce__(self):
        where = getattr(self, "_where", None)
        if where is None:
            return np.asarray(self).copy().__reduce__()
        return (MappedIndex.map, where)


class FileTable:
    """The files a source reads directly, each given a number once (the ids of its FilePool)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._ids: dict[str, int] = {}

    def id(self, path: str | os.PathLike) -> int:
        key = os.path.realpath(path)
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self.paths)
            self.paths.append(key)
        return found


def plain_layout(ds) -> bool:
    """Whether a dataset's values are plain bytes fastpipe can read at file offsets."""
    return (ds.dtype.kind in "biuf" and ds.dtype.isnative and not ds.is_virtual
            and ds.file.userblock_size == 0 and ds.id.get_create_plist().get_nfilters() == 0
            and ds.ndim >= 1)


def dataset_extents(ds, files: FileTable) -> Extents | None:
    """Where the rows of h5py dataset ``ds`` lie in its file, or None when they cannot be read
    directly (filters, foreign byte order, chunks across rows, unallocated chunks, external raw
    storage, strings). Raises PackFormatError for a file shorter than its data."""
    if not plain_layout(ds):
        return None
    filename = ds.file.filename  # the linked file, for an external link
    rows = ds.shape[0]
    row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
    if ds.chunks is None:
        offset = ds.id.get_offset()
        if offset is None:  # never written (all fill value), or raw data in external files
            return None
        extents = Extents.contiguous(rows, files.id(filename), int(offset), row_bytes)
        end = int(offset) + ds.id.get_storage_size()
    else:
        if tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
            return None  # a chunk holds parts of rows: h5py assembles them
        chunk_rows = ds.chunks[0]
        offsets = _chunk_offsets(ds, chunk_rows, row_bytes)
        if offsets is None:
            return None
        extents = Extents.chunked(rows, chunk_rows, files.id(filename), offsets, row_bytes)
        end = extents.end() if rows else 0
    size = os.path.getsize(filename)
    if end > size:
        raise PackFormatError(f"{filename} is truncated: {ds.name!r} ends at byte {end} but the "
                              f"file holds {size}; run fastpipe verify")
    return extents


def _chunk_offsets(ds, chunk_rows: int, row_bytes: int) -> np.ndarray | None:
    """File offsets of a dataset's chunks along axis 0; None if any is missing or partial.

    The table is sized by the chunks the file has allocated before anything is allocated for the
    declared shape: a small file may declare a huge one (2**40 rows)."""
    count = -(-ds.shape[0] // chunk_rows) if ds.shape[0] else 0
    try:
        allocated = ds.id.get_num_chunks()
    except Exception:  # noqa: BLE001 - an old HDF5 without chunk queries: read through h5py
        return None
    if count == 0 or allocated < count:
        return None  # unallocated chunks read as the fill value, which h5py gives
    offsets = np.full(count, -1, np.int64)
    full = chunk_rows * row_bytes

    def record(info) -> None:
        k = info.chunk_offset[0] // chunk_rows
        if info.byte_offset is not None and info.size == full and 0 <= k < count:
            offsets[k] = info.byte_offset

    try:
        if hasattr(ds.id, "chunk_iter"):
            ds.id.chunk_iter(record)  # one pass over the chunk index (HDF5 >= 1.14)
        else:
            for k in range(allocated):
                record(ds.id.get_chunk_info(k))
    except Exception:  # noqa: BLE001 - chunk queries failed: read through h5py
        return None
    return offsets if (offsets >= 0).all() else None


def check_virtual_sources(ds, where: str) -> None:
    """A user's virtual dataset reads its source files by name, and HDF5 gives the fill value
    (zeros) for a source that is missing, maps a source replaced by one of another size element
    by element (h5py then refuses to read the whole dataset), and reads the fill value where a
    hyperslab of a source (part of it mapped) lies past a source that shrank, or garbage from a
    source of another rank: refuse one whose sources are not all there, not of the size mapped
    whole, or not holding the part mapped, naming each such source file and dataset."""
    if not ds.is_virtual:
        return
    import h5py

    base = Path(ds.file.filename).parent
    missing, changed = [], []
    for source in ds.virtual_sources():
        name = source.file_name
        path = Path(ds.file.filename) if name == "." else (
            Path(name) if os.path.isabs(name) else base / name)
        if not path.exists():
            missing.append(str(path))
            continue
        try:
            with h5py.File(path, "r") as f:
                shape = f[source.dset_name].shape
        except (OSError, KeyError, ValueError, AttributeError):  # AttributeError: a group
            changed.append(f"{path} (no dataset {source.dset_name!r})")
            continue
        problem = _source_problem(source, tuple(shape))
        if problem is not None:
            changed.append(f"{path} ({source.dset_name!r} {problem})")
    if missing:
        raise PackFormatError(
            f"{where}: the virtual dataset {ds.name!r} maps source files that are missing "
            f"({', '.join(sorted(set(missing))[:3])}{' ...' if len(set(missing)) > 3 else ''}); "
            "HDF5 would read their rows as zeros: restore them (HDF5 looks for them relative to "
            "the file, or in HDF5_VDS_PREFIX)")
    if changed:
        raise PackFormatError(
            f"{where}: the virtual dataset {ds.name!r} maps source files that changed since it "
            f"was made ({'; '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}); their "
            "values would land in the wrong rows (h5py refuses to read the dataset whole): "
            "restore the sources, or make the virtual dataset again")


def _source_problem(source, shape: tuple[int, ...]) -> str | None:
    """Why a virtual dataset's ``source`` (h5py's VDSmap) does not map the dataset of ``shape``
    its file now holds as it was made to, or None: a source mapped whole must hold as many
    values as are mapped; a hyperslab (or points) of one must lie inside it, in as many
    dimensions. A selection without an end (an unlimited dataset's) is HDF5's to follow."""
    import h5py

    space = source.src_space
    if space.get_select_type() == h5py.h5s.SEL_ALL:
        held, mapped = int(np.prod(shape)), source.vspace.get_select_npoints()
        return None if held == mapped else f"holds {held} values where {mapped} are mapped"
    rank = space.get_simple_extent_ndims()
    if len(shape) != rank:
        return (f"is {shape} where the mapped selection has {rank} "
                f"dimension{'s' if rank != 1 else ''}")
    if space.is_regular_hyperslab() and h5py.h5s.UNLIMITED in space.get_regular_hyperslab()[2]:
        return None
    reach = tuple(int(end) + 1 for end in space.get_select_bounds()[1])
    if any(r > s for r, s in zip(reach, shape)):
        return f"is {shape} where the mapped selection reaches {reach}"
    return None
