"""The reader engine: where a stored array's rows lie in files, and a batch's rows read from
there in one call.

One description serves every layout fastpipe reads directly (an HDF5 dataset stored contiguous,
chunked along its first axis, a virtual dataset fastpipe merged from part files, a user's file
whose dataset is an external link to another file): :class:`Extents`, a table of runs of rows,
each in one file at one offset. A batch's rows (one per sample for a fixed field, a range per
sample for a variable one) become pieces, sorted in storage order, and ``fastpipe._io`` copies
them all from the files' mappings while the GIL is released: each file is mapped once per
process, read-only and shared (the page cache's pages: no process holds a copy, and a copy from a
mapping runs at memory speed, about twice pread's here), and keeps no descriptor open. A single
sample read by index (``dataset[i]``) is one pread instead: for one piece, building a batch's
arrays costs more than the copy saves. Where a
file cannot be mapped, or fastpipe._io was not built, the pieces are read with pread/preadv
(``os.preadv`` from Python without the module), descriptors coming from the process's pool: a
bounded number stay open whatever the number of files. A file is checked against the pieces
asked of it (a piece past its end is a short read naming it); one cut short while it is mapped
and read would end the process with SIGBUS, as with any memory-mapped reader (FFCV's, numpy's
memmap): fastpipe does not read files that change under it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    from fastpipe._io import read_pieces as _read_pieces
except ImportError:  # built without the extension: the same reads from Python
    _read_pieces = None
try:
    from fastpipe._io import copy_buffers as _copy_buffers
except ImportError:  # built without it: the same copies from Python
    _copy_buffers = None
try:
    from fastpipe._io import copy_pieces as _copy_pieces
    from fastpipe._io import map_file as _map_file
    from fastpipe._io import unmap as _unmap
except ImportError:  # an extension without the mapped reads: pread
    _copy_pieces = _map_file = _unmap = None

__all__ = ["Extents", "FilePool", "Pieces", "copy_buffers", "read_pieces", "read_rows",
           "resource_error"]

# Descriptors kept open per process, for every source together: files beyond it are reopened
# when read again.
DEFAULT_OPEN_FILES = 128
# errno values that say the machine ran out of something, not that a file is damaged.
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC}


def resource_error(exc: BaseException) -> bool:
    """Whether ``exc`` reports a limit of the machine (open files, memory), which is never a sign
    of a damaged file (the error must say so, not "damaged")."""
    if isinstance(exc, MemoryError):
        return True
    number = getattr(exc, "errno", None)
    if number in _RESOURCE_ERRNOS:
        return True
    text = str(exc)
    # h5py folds the C library's errno into its message ("errno = 24, error message = 'Too many
    # open files'").
    return any(f"errno = {n}," in text for n in _RESOURCE_ERRNOS) or "Too many open files" in text


def too_many_open_files(path: str, exc: BaseException) -> OSError:
    """The error for a file that could not be opened for want of descriptors or memory."""
    error = OSError(
        getattr(exc, "errno", None) or errno.EMFILE,
        f"cannot open {path}: the process ran out of resources ({exc}); this is not damage to "
        "the file: raise the open-file limit (ulimit -n) or free memory, and try again")
    error.__cause__ = exc
    return error


class _Descriptors:
    """This process's read-only descriptors of the files its sources read, shared by them all:
    at most ``limit`` kept open (the least recently used closed first; one in use by a read is
    never closed under it), so that no number of sources, packs or part files exhausts the
    process's open-file limit. A child of a fork starts with none (its copies of the parent's are
    closed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: OrderedDict[str, int] = OrderedDict()  # real path -> descriptor
        self._pins: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, paths: Sequence[str]) -> np.ndarray:
        fds = np.empty(len(paths), np.int64)
        with self._lock:
            for k, path in enumerate(paths):
                fds[k] = self._pin(path)
        return fds

    def release(self, paths: Sequence[str]) -> None:
        with self._lock:
            for path in paths:
                self._unpin(path)
            self._evict(0)

    def acquire_one(self, path: str) -> int:
        with self._lock:
            return self._pin(path)

    def release_one(self, path: str) -> None:
        with self._lock:
            self._unpin(path)
            self._evict(0)

    def _pin(self, path: str) -> int:
        fd = self._open.get(path)
        if fd is None:
            self._evict(1)
            fd = self._open[path] = _open_file(path)
        else:
            self._open.move_to_end(path)
        self._pins[path] = self._pins.get(path, 0) + 1
        return fd

    def _unpin(self, path: str) -> None:
        left = self._pins[path] - 1
        if left:
            self._pins[path] = left
        else:
            del self._pins[path]

    def forget(self, paths: Sequence[str]) -> None:
        """Closes the descriptors of ``paths`` that no read is using (a source closed)."""
        with self._lock:
            for path in paths:
                if path in self._open and path not in self._pins:
                    _close(self._open.pop(path))

    def _evict(self, room: int) -> None:
        while len(self._open) + room > max(1, self.limit):
            victim = next((p for p in self._open if p not in self._pins), None)
            if victim is None:  # every open file is in use: go over the limit for now
                return
            _close(self._open.pop(victim))

    def after_fork(self) -> None:
        for fd in self._open.values():
            _close(fd)
        self._open.clear()
        self._pins.clear()
        self._lock = threading.Lock()


def _open_file(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if resource_error(exc):
            raise too_many_open_files(path, exc) from exc
        raise


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


DESCRIPTORS = _Descriptors(DEFAULT_OPEN_FILES)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=DESCRIPTORS.after_fork)


class _Mappings:
    """This process's mappings of the files its sources read, shared by them all: at most
    ``limit`` kept (the least recently used unmapped first; one being copied from is never
    unmapped under it). A file that cannot be mapped (a pipe, a file system without mmap) is
    remembered and read with pread. A child of a fork keeps the parent's mappings (they stay
    valid) with a fresh lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._maps: OrderedDict[str, tuple[int, int]] = OrderedDict()  # path -> (address, size)
        self._pins: dict[str, int] = {}
        self._unmappable: set[str] = set()
        self._lock = threading.Lock()

    def acquire(self, paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
        """Addresses and sizes of ``paths``' mappings, pinned until :meth:`release`; None (and
        nothing pinned) when one of them cannot be mapped."""
        if _map_file is None:
            return None
        addresses = np.empty(len(paths), np.int64)
        sizes = np.empty(len(paths), np.int64)
        with self._lock:
            if any(p in self._unmappable for p in paths):
                return None
            for k, path in enumerate(paths):
                found = self._maps.get(path)
                if found is None:
                    self._evict(1)
                    try:
                        found = self._maps[path] = _map_file(path)
                    except OSError as exc:
                        if resource_error(exc):
                            self._unpin(paths[:k])
                            raise too_many_open_files(path, exc) from exc
                        self._unmappable.add(path)
                        self._unpin(paths[:k])
                        return None
                else:
                    self._maps.move_to_end(path)
                self._pins[path] = self._pins.get(path, 0) + 1
                addresses[k], sizes[k] = found
        return addresses, sizes

    def release(self, paths: Sequence[str]) -> None:
        with self._lock:
            self._unpin(paths)
            self._evict(0)

    def forget(self, paths: Sequence[str]) -> None:
        with self._lock:
            for path in paths:
                if path in self._maps and path not in self._pins:
                    _unmap(*self._maps.pop(path))
                self._unmappable.discard(path)

    def _unpin(self, paths: Sequence[str]) -> None:
        for path in paths:
            left = self._pins[path] - 1
            if left:
                self._pins[path] = left
            else:
                del self._pins[path]

    def _evict(self, room: int) -> None:
        while len(self._maps) + room > max(1, self.limit):
            victim = next((p for p in self._maps if p not in self._pins), None)
            if victim is None:
                return
            _unmap(*self._maps.pop(victim))

    def after_fork(self) -> None:
        self._pins.clear()
        self._lock = threading.Lock()


# Mappings kept per process: they hold no descriptor, only address space (and a line each in
# /proc/PID/maps, whose default cap is 65,530).
DEFAULT_MAPPINGS = 4096
MAPPINGS = _Mappings(DEFAULT_MAPPINGS)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=MAPPINGS.after_fork)


class FilePool:
    """A source's files, numbered (the ``files`` of its :class:`Extents`), read through this
    process's shared descriptors (at most ``DESCRIPTORS.limit`` open, whatever the number of
    sources and files). Thread-safe; a source makes one per process."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)

    @property
    def limit(self) -> int:
        return max(1, DESCRIPTORS.limit)

    def acquire(self, ids: np.ndarray) -> np.ndarray:
        """Descriptors of the files ``ids`` (unique), pinned open until :meth:`release`."""
        return DESCRIPTORS.acquire([self.paths[i] for i in ids.tolist()])

    def release(self, ids: np.ndarray) -> None:
        DESCRIPTORS.release([self.paths[i] for i in ids.tolist()])

    def close(self) -> None:
        DESCRIPTORS.forget(self.paths)
        MAPPINGS.forget(self.paths)


@dataclass
class Pieces:
    """Byte ranges of files to read: piece ``i`` is ``sizes[i]`` bytes of file ``files[i]``
    (an id of the source's :class:`FilePool`) at ``offsets[i]``, written at ``dest[i]`` of the
    output buffer."""

    files: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    dest: np.ndarray

    @classmethod
    def join(cls, parts: Sequence[Pieces]) -> Pieces:
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, k) for p in parts])
                     for k in ("files", "offsets", "sizes", "dest")))


@dataclass
class Extents:
    """Where the rows of one stored array lie: run ``k`` holds rows ``[starts[k], starts[k+1])``,
    the first of them at byte ``offsets[k]`` of file ``files[k]``, ``row_bytes`` bytes a row, rows
    back to back within a run (a contiguous dataset is one run, a chunked one a run per chunk, a
    virtual merge its parts' runs one after the other)."""

    starts: np.ndarray  # int64 (runs + 1,): the last entry is the number of rows
    files: np.ndarray  # int64 (runs,)
    offsets: np.ndarray  # int64 (runs,)
    row_bytes: int

    @classmethod
    def contiguous(cls, rows: int, file: int, offset: int, row_bytes: int) -> Extents:
        return cls(np.array([0, rows], np.int64), np.array([file], np.int64),
                   np.array([offset], np.int64), row_bytes)

    @classmethod
    def chunked(cls, rows: int, chunk_rows: int, file: int, offsets: np.ndarray,
                row_bytes: int) -> Extents:
        starts = np.minimum(np.arange(len(offsets) + 1, dtype=np.int64) * chunk_rows, rows)
        return cls(starts, np.full(len(offsets), file, np.int64),
                   np.asarray(offsets, np.int64), row_bytes)

    @property
    def rows(self) -> int:
        return int(self.starts[-1])

    def end(self) -> int:
        """One past the last byte any run reaches, in its own file (for the truncation check of
        a single-file array)."""
        if not len(self.offsets):
            return 0
        return int((self.offsets + np.diff(self.starts) * self.row_bytes).max())

    def window(self, first: int, stop: int, shift: int) -> Extents:
        """Rows ``[first, stop)`` of this array as rows ``[shift, shift + stop - first)`` of
        another (a part of a virtual merge placed in the whole)."""
        if not 0 <= first <= stop <= self.rows:
            raise ValueError(f"rows {first} to {stop} are outside the {self.rows} stored")
        k0 = int(np.searchsorted(self.starts, first, side="right")) - 1
        k1 = int(np.searchsorted(self.starts, stop, side="left"))
        if stop == first:
            return Extents(np.array([shift], np.int64), np.zeros(0, np.int64),
                           np.zeros(0, np.int64), self.row_bytes)
        starts = self.starts[k0:k1 + 1].copy()
        offsets = self.offsets[k0:k1].copy()
        offsets[0] += (first - starts[0]) * self.row_bytes
        starts[0], starts[-1] = first, stop
        return Extents(starts - first + shift, self.files[k0:k1].copy(), offsets, self.row_bytes)

    @classmethod
    def concat(cls, parts: Sequence[Extents], row_bytes: int) -> Extents:
        """Parts placed back to back (each ``window``-ed to its place first)."""
        starts = [p.starts[:-1] for p in parts] + [parts[-1].starts[-1:]] if parts else [[0]]
        return cls(np.concatenate(starts).astype(np.int64),
                   np.concatenate([p.files for p in parts]) if parts else np.zeros(0, np.int64),
                   np.concatenate([p.offsets for p in parts]) if parts else
                   np.zeros(0, np.int64), row_bytes)

    def spans(self, first: int, stop: int) -> list[tuple[int, int, int]]:
        """``(file, byte offset, size)`` of each run's share of rows ``[first, stop)``, in
        order: :meth:`pieces` for one range (a sample's rows: one run, or two where they cross a
        chunk's end), without building arrays."""
        k = 0 if len(self.offsets) == 1 else int(
            np.searchsorted(self.starts, first, side="right")) - 1
        out = []
        while first < stop:
            end = min(stop, int(self.starts[k + 1]))
            out.append((int(self.files[k]),
                        int(self.offsets[k]) + (first - int(self.starts[k])) * self.row_bytes,
                        (end - first) * self.row_bytes))
            first, k = end, k + 1
        return out

    def pieces(self, first: np.ndarray, stop: np.ndarray, dest: np.ndarray) -> Pieces:
        """The pieces of rows ``[first[k], stop[k])`` for every ``k``, range ``k`` written from
        byte ``dest[k]`` of the output on (split where a range crosses from one run into the
        next)."""
        first = np.asarray(first, np.int64)
        stop = np.asarray(stop, np.int64)
        if len(self.offsets) == 1:  # one run: one piece a range
            size = (stop - first) * self.row_bytes
            return Pieces(np.full(len(first), self.files[0], np.int64),
                          self.offsets[0] + first * self.row_bytes, size,
                          np.asarray(dest, np.int64))
        k0 = np.searchsorted(self.starts, first, side="right") - 1
        if len(first) and (stop - first == 1).all():  # a row a range (a batch of fixed rows)
            return Pieces(self.files[k0], self.offsets[k0] + (first - self.starts[k0])
                          * self.row_bytes, np.full(len(first), self.row_bytes, np.int64),
                          np.asarray(dest, np.int64))
        k1 = np.searchsorted(self.starts, np.maximum(stop - 1, first), side="right") - 1
        count = np.where(stop > first, k1 - k0 + 1, 0)
        owner = np.repeat(np.arange(len(first)), count)
        step = np.arange(len(owner)) - np.repeat(np.cumsum(count) - count, count)
        run = k0[owner] + step
        lo = np.maximum(first[owner], self.starts[run])
        hi = np.minimum(stop[owner], self.starts[run + 1])
        return Pieces(self.files[run], self.offsets[run] + (lo - self.starts[run]) * self.row_bytes,
                      (hi - lo) * self.row_bytes,
                      np.asarray(dest, np.int64)[owner] + (lo - first[owner]) * self.row_bytes)


class ShortRead(Exception):
    """A piece could not be read whole: ``path`` ended first (``number`` 0) or the read failed
    with errno ``number``."""

    def __init__(self, path: str, number: int) -> None:
        super().__init__(path, number)
        self.path, self.number = path, number


def read_pieces(pool: FilePool, pieces: Pieces, out: np.ndarray) -> None:
    """Reads ``pieces`` into ``out`` (a writable C-contiguous array: its bytes), in storage
    order, without the GIL. Raises :class:`ShortRead` naming the file of a piece that could not
    be read whole."""
    n = len(pieces.sizes)
    if not n:
        return
    flat = out.reshape(-1).view(np.uint8)
    files = pieces.files
    if n == 1 or not (files != files[0]).any():  # one file (most batches): no grouping
        order = np.argsort(pieces.offsets, kind="stable") if n > 1 else slice(None)
        ids, where = files[:1], np.zeros(n, np.int64)
    else:
        order = np.lexsort((pieces.offsets, files))
        grouped = files[order]
        first = np.empty(n, bool)  # where each file's run of pieces starts
        first[0] = True
        np.not_equal(grouped[1:], grouped[:-1], out=first[1:])
        ids, where = grouped[first], np.cumsum(first) - 1
    offsets, sizes, dest = pieces.offsets[order], pieces.sizes[order], pieces.dest[order]
    paths = [pool.paths[i] for i in ids.tolist()]
    for attempt in range(2):
        mapped = MAPPINGS.acquire(paths)
        if mapped is None:
            break
        addresses, limits = mapped
        try:
            beyond = np.flatnonzero(offsets + sizes > limits[where])
            if not len(beyond):
                _copy_pieces(addresses[where], limits[where], offsets, sizes, flat, dest)
                return
        finally:
            MAPPINGS.release(paths)
        short = paths[int(where[beyond[0]])]
        if attempt:  # the file ends before the piece
            raise ShortRead(short, 0)
        MAPPINGS.forget([short])  # mapped before it grew: map it again, once
    files = ids[where]
    # At most pool.limit files pinned at once: a batch across the thousand parts of a virtual
    # merge is read a group of files at a time, within the pool's bound.
    starts = np.searchsorted(where, np.arange(0, len(ids), pool.limit))
    for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(where)], strict=True):
        group = ids[where[a]:where[b - 1] + 1]
        fds = pool.acquire(group)
        try:
            args = (np.ascontiguousarray(fds[where[a:b] - where[a]]), offsets[a:b], sizes[a:b],
                    flat, dest[a:b])
            failed = (_read_pieces(*args) if _read_pieces is not None
                      else _read_in_python(*args))
        finally:
            pool.release(group)
        if failed is not None:
            piece, number = failed
            raise ShortRead(pool.paths[int(files[a + piece])], number)


def copy_buffers(buffers: Sequence[Any], out: np.ndarray) -> int | None:
    """Copies ``buffers`` (values another library holds in memory it mapped, such as an LMDB
    transaction's: one a row of ``out``, each exactly a row's bytes) into the rows of ``out`` (a
    writable C-contiguous array), in one call without the GIL. Returns the index of the first
    buffer that is None or another size, before anything is copied (the caller names it), else
    None."""
    n = len(buffers)
    if out.ndim == 0 or out.shape[0] != n:
        raise ValueError(f"{n} buffers for an output of shape {out.shape}")
    flat = out.reshape(-1).view(np.uint8)
    size = flat.nbytes // n if n else 0  # a row's bytes
    dest = np.arange(n, dtype=np.int64) * size
    if _copy_buffers is not None:
        return _copy_buffers(buffers, size, flat, dest)
    for k, buffer in enumerate(buffers):
        if buffer is None or memoryview(buffer).nbytes != size:
            return k
    for k, buffer in enumerate(buffers):
        flat[k * size:(k + 1) * size] = np.frombuffer(buffer, np.uint8)
    return None


def read_rows(pool: FilePool, extents: Extents, first: int, stop: int, out: np.ndarray) -> None:
    """Rows ``[first, stop)`` (one sample's) into ``out``, as :func:`read_pieces` reads them,
    with one pread a run: for a single sample, a batch's arrays and the mappings' lock cost more
    than the copy."""
    flat = out.reshape(-1).view(np.uint8)
    at = 0
    for file, offset, size in extents.spans(first, stop):
        path = pool.paths[file]
        fd = DESCRIPTORS.acquire_one(path)
        try:
            number = _pread_all(fd, flat[at:at + size], offset)
        finally:
            DESCRIPTORS.release_one(path)
        if number is not None:
            raise ShortRead(path, number)
        at += size


def _pread_all(fd: int, view: np.ndarray, offset: int) -> int | None:
    """Fills ``view`` from ``offset`` of ``fd``; the errno of a failed read (0: the file ended
    first), None when it was filled."""
    done, size = 0, view.nbytes
    while done < size:
        try:
            got = os.preadv(fd, [view[done:]], offset + done)
        except OSError as exc:
            return exc.errno or errno.EIO
        if got == 0:
            return 0
        done += got
    return None


def _read_in_python(fds, offsets, sizes, out, dest):
    for k in range(len(fds)):
        size = int(sizes[k])
        number = _pread_all(int(fds[k]), out[int(dest[k]):int(dest[k]) + size], int(offsets[k]))
        if number is not None:
            return k, number
    return None
