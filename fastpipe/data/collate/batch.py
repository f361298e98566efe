"""fast_collate: one contiguous uint8 batch, no float conversion on the CPU."""

from __future__ import annotations

import mmap
import sys
import threading
import warnings
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from fastpipe.data.collate.arena import MADV_POPULATE_WRITE, madvise, worker_arena
from fastpipe.data.collate.encoded import EncodedImage, collate_encoded
from fastpipe.data.collate.records import (
    Memory,
    collate_records,
    is_record_batch,
    rows_block,
    stack_into,
)


def _empty_pinned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Page-locked host memory (needs a CUDA driver); one function so tests can record the call."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def _empty_shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor in shared memory, as default_collate allocates in a worker: the batch then goes to
    the main process without the extra copy ``share_memory_()`` would make."""
    numel = 1
    for n in shape:
        numel *= n
    try:
        storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
    except AttributeError:  # private API moved: fall back to a plain allocation
        return torch.empty(shape, dtype=dtype)
    out = torch.empty(0, dtype=dtype).set_(storage).view(shape)
    _populate(out)
    return out


def _populate(tensor: torch.Tensor) -> None:
    """Maps all pages of a fresh shared-memory tensor in one ``madvise(MADV_POPULATE_WRITE)``
    call instead of one page fault per 4 KiB page while the batch is written (the collate's time
    is in docs/cpu-path.md, "Batches"). Best effort: other systems just fault as usual."""
    if not sys.platform.startswith("linux") or tensor.numel() == 0:
        return
    start = tensor.data_ptr() & ~(mmap.PAGESIZE - 1)
    end = tensor.data_ptr() + tensor.numel() * tensor.element_size()
    madvise(start, end - start, MADV_POPULATE_WRITE)


class _KeptBatches:
    """Batches in this process (loader threads, ``num_workers=0``) in the memory of earlier
    batches of the same shape, once every tensor using it is gone. A fresh batch above glibc's
    mmap threshold (a 256x3x224x224 uint8 batch is 37 MiB) gets new pages from the kernel,
    one page fault per 4 KiB as it is written, every batch (docs/cpu-path.md, "Batches").

    Each batch is a tensor over a numpy array kept here; the tensor, and every view of it, holds a
    reference to the array, so an array whose only references are this pool's is free. At most
    ``limit`` arrays are kept: a batch of records is a block per field, and a thread loader has
    about eight batches in flight (the threads' batches ahead, its queue, the one the training
    loop holds). A free array of a shape not asked for in the last :attr:`STALE` batches (an
    epoch's short last batch, a change of batch size) is dropped, so an old shape does not keep
    its memory; when the pool is full, the free array asked for least recently makes room.
    """

    STALE = 64

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self._arrays: list[np.ndarray] = []
        self._asked: dict[tuple[tuple[int, ...], np.dtype], int] = {}  # shape -> when, last
        self._clock = 0
        self._unused = 0
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        np_dtype = _numpy_dtype(dtype)
        if np_dtype is None:  # bfloat16 and other dtypes numpy lacks
            return torch.empty(shape, dtype=dtype)
        shape = tuple(shape)
        with self._lock:
            self._clock += 1
            self._asked[(shape, np_dtype)] = self._clock
            free = [k for k in range(len(self._arrays)) if self._refs(k) == self._unused]
            last = {k: self._asked.get((self._arrays[k].shape, self._arrays[k].dtype), 0)
                    for k in free}
            stale = [k for k in free if last[k] < self._clock - self.STALE]
            for k in reversed(stale):
                del self._arrays[k]
            if stale:
                self._asked = {key: when for key, when in self._asked.items()
                               if when >= self._clock - self.STALE}
                free = [k for k in range(len(self._arrays)) if self._refs(k) == self._unused]
                last = {k: self._asked.get((self._arrays[k].shape, self._arrays[k].dtype), 0)
                        for k in free}
            for k in free:
                array = self._arrays[k]
                if array.shape == shape and array.dtype == np_dtype:
                    return torch.from_numpy(array)
            if len(self._arrays) >= self.limit and free:  # full: the least recently asked goes
                del self._arrays[min(free, key=last.__getitem__)]
            if len(self._arrays) >= self.limit:
                return torch.empty(shape, dtype=dtype)
            self._arrays.append(np.empty(shape, np_dtype))
            # What an array nobody else holds counts (the interpreter's own temporary references
            # differ between Python versions), measured the same way before any tensor exists.
            self._unused = self._refs(len(self._arrays) - 1)
            return torch.from_numpy(self._arrays[-1])

    def _refs(self, k: int) -> int:
        return sys.getrefcount(self._arrays[k])


_kept = _KeptBatches()
_NUMPY_DTYPE_OF: dict[torch.dtype, np.dtype | None] = {}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """numpy's dtype for ``dtype`` (None where numpy has none), looked up once."""
    found = _NUMPY_DTYPE_OF.get(dtype, False)
    if found is False:
        try:
            found = torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError:
            found = None
        _NUMPY_DTYPE_OF[dtype] = found
    return found


def fast_collate(
    batch: Sequence[Any], pin_memory: bool = False, pad: bool | Collection[Any] = False
) -> Any:
    """Stacks ``(image, label)`` samples into ``(uint8 (N, C, H, W), int64 (N,))``, and records
    (dicts, or tuples other than ``(image, label)``) field by field.

    Images keep their dtype (uint8 from :class:`~fastpipe.data.ImageFolder`): no float conversion
    on the CPU, a quarter of the bytes of a float batch to move between processes and to the GPU.
    Normalize on the device with ``DataPrefetcher(mean=..., std=...)``, or on the CPU with
    ``fastpipe.ops.normalize``. Use it as ``DataLoader(..., collate_fn=fast_collate)``.

    In a DataLoader worker the batch is written straight into shared memory. ``pin_memory=True``
    writes it into page-locked memory for asynchronous copies to the GPU; that is for the main
    process (``num_workers=0`` or a background thread): pinned memory cannot be handed across
    processes, so in a worker pass ``pin_memory=True`` to the DataLoader instead. Without a CUDA
    device it warns and returns unpinned memory, as the DataLoader does.

    Records come back as a dict (or tuple) of batches: tensors and arrays of one shape stacked in
    their dtype, into the same memory as images; numbers as tensors of their dtype (Python int:
    int64, float: float64); strings and bytes as lists. A field whose first axis varies within
    the batch is an error unless ``pad`` is True (or names it: field names, or positions of a
    tuple): it is then padded with zeros to the longest and its lengths (int64) come as
    ``<name>_lengths`` (a tuple's position holds ``(padded, lengths)``). Pass options with
    ``functools.partial(fast_collate, pad=True)``.
    """
    if len(batch) == 0:
        raise ValueError("fast_collate got an empty batch")
    if is_record_batch(batch):
        return collate_records(batch, pad, _memory(pin_memory))
    try:
        images = [sample[0] for sample in batch]
        labels = [sample[1] for sample in batch]
    except (TypeError, IndexError, KeyError) as exc:
        raise TypeError(
            "fast_collate expects a sequence of (image, label) samples, got elements of type "
            f"{type(batch[0]).__name__}"
        ) from exc
    first = images[0]
    if isinstance(first, EncodedImage):  # decode="gpu": DataPrefetcher decodes the batch
        return collate_encoded(images, _memory(pin_memory).empty), _labels_tensor(labels)
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"fast_collate expects image tensors, got {type(first).__name__}")
    for i, image in enumerate(images):
        if (not isinstance(image, torch.Tensor) or image.shape != first.shape
                or image.dtype != first.dtype):
            what = (f"{tuple(image.shape)} {image.dtype}" if isinstance(image, torch.Tensor)
                    else type(image).__name__)
            raise ValueError(
                f"fast_collate needs images of one shape and dtype: sample 0 is "
                f"{tuple(first.shape)} {first.dtype}, sample {i} is {what}; "
                "give the dataset a fixed output size"
            )
    memory = _memory(pin_memory)
    block = rows_block(images, getattr(batch, "blocks", {}).get(0),
                       getattr(batch, "rows", {}).get(0))
    if block is not None and memory.holds(block):
        return block, _labels_tensor(labels)
    out = memory.empty((len(images), *first.shape), first.dtype)
    return stack_into(images, out), _labels_tensor(labels)


def batch_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A block for a batch's rows: fastpipe's readers read a batch's rows into one and return
    the samples in a :class:`~fastpipe.data.collate.records.Rows` naming it, which
    :func:`fast_collate` returns as the batch without a copy where the block is in the memory it
    puts a batch in (a worker's arena, memory kept from earlier batches in this process).

    In a worker of torch's DataLoader (no arena) the block is memory kept from earlier batches,
    not shared memory: the collate function makes the batch's shared memory there, and torch's
    default_collate stacks into a new segment whatever the rows are in, so a block in shared
    memory would be a second segment (its allocation and page faults) every batch; fast_collate
    copies the block into shared memory once."""
    memory = _memory(False)
    return _kept.empty(shape, dtype) if memory is _SHARED else memory.empty(shape, dtype)


_PINNED = Memory(lambda shape, dtype: _empty_pinned(shape, dtype), torch.Tensor.is_pinned)
_SHARED = Memory(lambda shape, dtype: _empty_shared(shape, dtype), torch.Tensor.is_shared)
_KEPT = Memory(lambda shape, dtype: _kept.empty(shape, dtype), lambda tensor: True)


def _memory(pin_memory: bool) -> Memory:
    """Where a batch's tensors go: pinned memory (asked for, in the main process), the worker's
    arena or shared memory (in a DataLoader worker), or memory kept from earlier batches (in this
    process)."""
    in_worker = torch.utils.data.get_worker_info() is not None
    if pin_memory and in_worker:
        raise ValueError(
            "fast_collate(pin_memory=True) in a DataLoader worker: pinned memory cannot be passed "
            "between processes. Use DataLoader(..., pin_memory=True, collate_fn=fast_collate), "
            "which pins in the main process"
        )
    if pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "fast_collate(pin_memory=True) but no CUDA device is available: returning unpinned "
            "memory", stacklevel=3,
        )
        pin_memory = False
    if pin_memory:
        return _PINNED
    if in_worker:
        arena = worker_arena()
        return _SHARED if arena is None else _arena_memory(arena)
    return _KEPT


_ARENA_MEMORY: tuple[Any, Memory] | None = None


def _arena_memory(arena: Any) -> Memory:
    """A worker's batches in its arena (fastpipe.data.collate.arena), in shared memory where the
    arena has no room."""
    global _ARENA_MEMORY
    if _ARENA_MEMORY is None or _ARENA_MEMORY[0] is not arena:
        def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            tensor = arena.empty(shape, dtype)
            return tensor if tensor is not None else _empty_shared(shape, dtype)

        _ARENA_MEMORY = (arena, Memory(empty, lambda t: arena.holds(t) or t.is_shared()))
    return _ARENA_MEMORY[1]


def _labels_tensor(labels: list[Any]) -> torch.Tensor:
    try:
        return torch.tensor([int(label) for label in labels], dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(
            f"fast_collate expects integer class labels, got {labels[:4]!r}"
            f"{' ...' if len(labels) > 4 else ''}"
        ) from exc
