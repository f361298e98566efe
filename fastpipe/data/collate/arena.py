"""Batches from DataLoader worker processes in memory that is reused, not made anew per batch.

DataLoader hands a worker's batch to the training process in shared memory: a fresh segment per
tensor, whose pages the kernel allocates, zeroes and maps as the worker writes the batch, and
frees when the training process drops it. For batches that take little work to make (records of
fixed-shape arrays, read at memory speed) that page traffic is most of the cost.

Here each worker gets an *arena*: a memory file (``memfd``) the training process creates before
the workers start, mapped by both, its pages allocated once and reused. A worker allocates its
batch blocks there (:func:`fastpipe.data.collate.batch.batch_empty` and fast_collate's outputs),
and the batch crosses to the training process as an :class:`ArenaBatch` of :class:`ArenaRef` s
(where each tensor lies in the arena, its shape and dtype) instead of tensors. DataLoaderX turns
them back into tensors over its own mapping of the arena; when every tensor over an allocation is
gone, it tells the worker through a pipe, and the worker reuses the memory. Nothing a batch holds is
ever written to before it is released: a batch the training loop keeps stays as it was.

What an arena cannot take (it is full: the training loop holds more batches than it has room for;
a tensor of a type numpy lacks) goes through shared memory as before. An arena's pages are taken
as batches are written and kept for reuse, at most :data:`KEEP_BATCHES` times the largest
allocation (freed ranges above that are given back to the kernel). Linux only (memfd); fork,
spawn and forkserver workers (the arena's descriptors go to spawned workers as multiprocessing
passes descriptors).
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import mmap
import os
import struct
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastpipe._compat import tree_map_only

__all__ = ["ArenaBatch", "ArenaCollate", "ArenaRef", "ArenaSet", "ArenaWorkerInit",
           "materialize", "worker_arena"]

# Address space per worker, not memory: pages are taken as batches are written.
CAPACITY = 2 << 30
# Freed memory above this many times the largest allocation goes back to the kernel.
KEEP_BATCHES = 8
_ALIGN = mmap.PAGESIZE
_MADV_REMOVE = 9
MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_RELEASE = struct.Struct("q")

_serial = itertools.count()
_ARENAS: weakref.WeakValueDictionary[tuple[int, int], ArenaSet] = weakref.WeakValueDictionary()


def available() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(
        os, "pipe2")


_madvise_fn: Any = None


def madvise(address: int, length: int, advice: int) -> None:
    """madvise(2), best effort: an older kernel answers EINVAL (the pages then fault in as usual,
    or stay), another system has none."""
    global _madvise_fn
    if _madvise_fn is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = False
        _madvise_fn = fn
    if _madvise_fn and length > 0:
        _madvise_fn(address, length, advice)


class _Lease:
    """The owner of one allocation's memory as numpy and torch see it: every array and tensor over
    the allocation keeps it alive, and its finalizer runs when the last of them is gone (numpy
    collapses views of views onto one base, so the base must be an object of its own)."""

    __slots__ = ("__array_interface__", "_mapping", "__weakref__")


def _lease_array(mapping: Any, address: int, offset: int, nbytes: int,
                 on_free: Callable[[int], None]) -> np.ndarray:
    lease = _Lease()
    lease.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                 "data": (address + offset, False), "version": 3}
    lease._mapping = mapping  # the mapping outlives every array over it
    weakref.finalize(lease, on_free, offset).atexit = False
    return np.asarray(lease)


def _tensor(array: np.ndarray, dtype: torch.dtype, size: tuple[int, ...],
            stride: tuple[int, ...], storage_offset: int) -> torch.Tensor:
    return torch.from_numpy(array).view(dtype).as_strided(size, stride, storage_offset)


@dataclass(frozen=True)
class ArenaRef:
    """A tensor a worker wrote in its arena, as it crosses to the training process."""

    arena: tuple[tuple[int, int], int]  # (the ArenaSet's key, the worker)
    offset: int  # the allocation's, in the arena
    nbytes: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int


class ArenaBatch:
    """A worker's batch whose tensors in its arena are :class:`ArenaRef` s. The training process
    turns it back into the batch all at once (:func:`materialize`), so that the tensors over one
    allocation share one lease: released when the last of them is gone, never before."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def pin_memory(self, device: Any = None) -> Any:
        """DataLoader's pinning thread meets the batch before DataLoaderX does."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(materialize(self), device)


@dataclass
class _Block:
    """One allocation of a worker's arena."""

    nbytes: int
    sent_in: int = -1  # the batch it crossed in (-1: not sent)
    worker_done: bool = False  # the worker's arrays over it are gone
    released: bool = False  # the training process's are


class _Worker:
    """The worker's side of its arena: the allocator."""

    def __init__(self, fd: int, release_fd: int, capacity: int) -> None:
        self.capacity = capacity
        self.release_fd = release_fd
        self.mapping = mmap.mmap(fd, capacity)
        self.view = np.frombuffer(self.mapping, np.uint8)
        self.address = self.view.ctypes.data
        self.free: list[tuple[int, int]] = [(0, capacity)]  # (start, end), sorted, merged
        self.live: dict[int, _Block] = {}  # by offset
        self.batch = 0  # the serial of the batch being sent
        self.touched = 0  # pages below are populated
        self.largest = 0
        # A finalizer can run in any thread, and in this one while it allocates.
        self.lock = threading.RLock()

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        numel = 1
        for n in shape:
            numel *= n
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        offset = self._allocate(max(nbytes, 1))
        if offset is None:
            return None
        array = _lease_array(self.mapping, self.address, offset, nbytes, self._worker_done)
        strides, step = [], 1
        for n in reversed(shape):
            strides.append(step)
            step *= max(n, 1)
        return _tensor(array, dtype, tuple(shape), tuple(reversed(strides)), 0)

    def holds(self, tensor: torch.Tensor) -> bool:
        with self.lock:
            return self._allocation_of(tensor) is not None

    def reference(self, tensor: torch.Tensor, key: tuple[tuple[int, int], int]
                  ) -> ArenaRef | None:
        """The tensor as a reference, its allocation now the training process's to release
        (other tensors of the same batch may refer to it too)."""
        with self.lock:
            offset = self._allocation_of(tensor, self.batch)
            if offset is None:
                return None
            block = self.live[offset]
            block.sent_in = self.batch
        return ArenaRef(key, offset, block.nbytes, tensor.dtype, tuple(tensor.shape),
                        tuple(tensor.stride()), tensor.storage_offset())

    def _allocation_of(self, tensor: torch.Tensor, batch: int = -2) -> int | None:
        """The allocation ``tensor`` lies in, if not sent in an earlier batch (lock held)."""
        if tensor.device.type != "cpu":
            return None
        offset = tensor.untyped_storage().data_ptr() - self.address
        block = self.live.get(offset)
        if block is None or block.sent_in not in (-1, batch):
            return None
        return offset

    def _allocate(self, nbytes: int) -> int | None:
        with self.lock:
            self._drain()
            size = -(-nbytes // _ALIGN) * _ALIGN
            k = next((k for k, (a, b) in enumerate(self.free) if b - a >= size), None)
            if k is None:
                return None
            start, end = self.free[k]
            if end - start == size:
                del self.free[k]
            else:
                self.free[k] = (start + size, end)
            self.live[start] = _Block(nbytes)
            self.largest = max(self.largest, size)
            if start + size > self.touched:  # populate fresh pages in one call, not a fault each
                first = max(start, self.touched)
                madvise(self.address + first, start + size - first, MADV_POPULATE_WRITE)
                self.touched = start + size
            return start

    def _worker_done(self, offset: int) -> None:
        with self.lock:
            block = self.live.get(offset)
            if block is not None:
                block.worker_done = True
                if block.sent_in == -1 or block.released:
                    self._release(offset)

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.release_fd, _RELEASE.size * 512)
            except OSError:  # nothing to read (BlockingIOError), or the pipe is gone
                return
            if not data:
                return
            for (offset,) in _RELEASE.iter_unpack(data):
                block = self.live.get(offset)
                if block is not None and block.sent_in != -1:
                    block.released = True
                    if block.worker_done:
                        self._release(offset)

    def _release(self, offset: int) -> None:
        size = -(-self.live.pop(offset).nbytes // _ALIGN) * _ALIGN
        start, end = offset, offset + size
        k = bisect.bisect_left(self.free, (start, end))
        if k > 0 and self.free[k - 1][1] == start:
            k -= 1
            start = self.free[k][0]
            del self.free[k]
        if k < len(self.free) and self.free[k][0] == end:
            end = self.free[k][1]
            del self.free[k]
        self.free.insert(k, (start, end))
        keep = KEEP_BATCHES * self.largest
        if self.touched > keep and end > keep:  # give the pages above back to the kernel
            cut = max(start, keep)
            top = min(end, self.touched)
            if top > cut:
                madvise(self.address + cut, top - cut, _MADV_REMOVE)
                if top == self.touched:
                    self.touched = cut


class _Main:
    """The training process's side of one worker's arena: its mapping, made at the first batch,
    and the pipe releases go through."""

    def __init__(self, fd: int, release_fd: int, capacity: int) -> None:
        self.fd, self.release_fd, self.capacity = fd, release_fd, capacity
        self.mapping: mmap.mmap | None = None
        self.address = 0
        self.pending: list[int] = []
        self.lock = threading.RLock()  # finalizers run in whichever thread drops a batch
        # Its descriptors live as long as anything can still release through it.
        weakref.finalize(self, _close_all, [fd, release_fd]).atexit = False

    def array(self, ref: ArenaRef) -> np.ndarray:
        with self.lock:
            if self.mapping is None:
                self.mapping = mmap.mmap(self.fd, self.capacity)
                self.address = np.frombuffer(self.mapping, np.uint8).ctypes.data
            mapping, address = self.mapping, self.address
        return _lease_array(mapping, address, ref.offset, ref.nbytes, self.release)

    def release(self, offset: int) -> None:
        with self.lock:
            self.pending.append(offset)
            while self.pending:
                # At most PIPE_BUF (4096) bytes a write: written whole or not at all.
                chunk = self.pending[:512]
                try:
                    os.write(self.release_fd, b"".join(_RELEASE.pack(o) for o in chunk))
                except BlockingIOError:  # the worker has not read its pipe lately: next time
                    return
                except OSError:  # the worker is gone, and the arena with it
                    self.pending.clear()
                    return
                del self.pending[:len(chunk)]


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class ArenaSet:
    """The arenas of one DataLoader iterator's workers, made in the training process before they
    start. Picklable for spawned workers (its descriptors passed to them as multiprocessing
    passes descriptors); in any other copy it is off and the batches go through shared memory."""

    def __init__(self, workers: int, capacity: int | None = None) -> None:
        self.key = (os.getpid(), next(_serial))
        self.capacity = capacity = CAPACITY if capacity is None else capacity
        self.fds: list[tuple[int, int, int]] = []  # (memfd, release read end, release write end)
        try:
            for _ in range(workers):
                fd = os.memfd_create("fastpipe-batches", os.MFD_CLOEXEC)
                self.fds.append((fd, -1, -1))
                os.ftruncate(fd, capacity)
                read, write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                self.fds[-1] = (fd, read, write)
        except BaseException:
            _close_all([f for fds in self.fds for f in fds if f >= 0])
            raise
        self.mains = [_Main(fd, write, capacity) for fd, _, write in self.fds]
        # The read ends are the workers' (each has its own copy once started); the memfds and
        # write ends belong to self.mains.
        weakref.finalize(self, _close_all, [read for _, read, _ in self.fds]).atexit = False
        self.enabled = True
        _ARENAS[self.key] = self

    def __getstate__(self) -> dict[str, Any]:
        from multiprocessing import context, reduction

        if context.get_spawning_popen() is None:
            return {"key": self.key, "capacity": self.capacity, "fds": [], "enabled": False}
        return {"key": self.key, "capacity": self.capacity, "enabled": True,
                "fds": [(reduction.DupFd(fd), reduction.DupFd(read), None)
                        for fd, read, _ in self.fds]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.key, self.capacity, self.enabled = state["key"], state["capacity"], state["enabled"]
        self.fds = [(fd.detach(), read.detach(), -1) for fd, read, _ in state["fds"]]
        self.mains = []

    def attach(self, worker: int) -> None:
        """In worker ``worker``: its batches go to its arena from now on."""
        global _WORKER
        if not self.enabled or worker >= len(self.fds):
            return
        fd, read, _ = self.fds[worker]
        try:
            _WORKER = (_Worker(fd, read, self.capacity), (self.key, worker))
        except (OSError, ValueError):  # no room for the mapping: shared memory as before
            _WORKER = None


# The arena of this worker process (None in the training process, or without one).
_WORKER: tuple[_Worker, tuple[tuple[int, int], int]] | None = None


def worker_arena() -> _Worker | None:
    return _WORKER[0] if _WORKER is not None else None


class ArenaWorkerInit:
    """The worker_init_fn DataLoaderX gives a DataLoader: attaches the worker to its arena, then
    runs the user's."""

    def __init__(self, arenas: ArenaSet, user: Callable[[int], Any] | None) -> None:
        self.arenas, self.user = arenas, user

    def __call__(self, worker_id: int) -> None:
        self.arenas.attach(worker_id)
        if self.user is not None:
            self.user(worker_id)


class ArenaCollate:
    """The collate_fn DataLoaderX gives a DataLoader: the user's, then, when tensors it returns lie
    in the worker's arena, the batch as an :class:`ArenaBatch` of references."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: Any) -> Any:
        out = self.collate_fn(batch)
        if _WORKER is None:
            return out
        arena, key = _WORKER
        arena.batch += 1
        sent = []

        def reference(tensor: torch.Tensor) -> Any:
            ref = arena.reference(tensor, key)
            if ref is None:
                return tensor
            sent.append(ref)
            return ref

        out = tree_map_only(torch.Tensor, reference, out)
        return ArenaBatch(out) if sent else out


def materialize(batch: Any) -> Any:
    """In the training process: an :class:`ArenaBatch` as the batch, each reference a tensor over
    this process's mapping of the arena; anything else as it is."""
    if not isinstance(batch, ArenaBatch):
        return batch
    leases: dict[tuple[tuple[tuple[int, int], int], int], np.ndarray] = {}

    def tensor(ref: ArenaRef) -> torch.Tensor:
        found = leases.get((ref.arena, ref.offset))
        if found is None:
            arenas = _ARENAS.get(ref.arena[0])
            if arenas is None:
                raise RuntimeError("a batch from a DataLoader worker refers to an arena this "
                                   "process no longer has")
            found = leases[(ref.arena, ref.offset)] = arenas.mains[ref.arena[1]].array(ref)
        return _tensor(found, ref.dtype, ref.size, ref.stride, ref.storage_offset)

    return tree_map_only(ArenaRef, tensor, batch.batch)
