"""How a batch crosses from DataPrefetcher's CUDA side stream to the training step's stream.

The order of the calls is what keeps the data intact: the side stream waits for the stream that
wrote tensors already on the GPU before reading them; the current stream waits for the event
after a batch's copy (that batch's only) before the step reads it; and every GPU tensor is
``record_stream``-ed on each stream that uses it, so the caching allocator does not hand its
memory out while that stream may still read it. The CUDA calls themselves are the methods of
:class:`CudaStreams`, in one place so that tests can record them with a stand-in.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fastpipe._batch import replace_at, tensors
from fastpipe.gpu_decode._batches import encoded_paths

__all__ = ["CudaStreams", "copy_on_side", "hand_to_current", "streams_for"]


class CudaStreams:
    """The CUDA calls of the stream hand-off."""

    def __init__(self) -> None:
        self.warned_unpinned = False

    def concrete_device(self, device: torch.device) -> torch.device:
        # "cuda" without an index means the device current when an epoch starts, so a prefetcher
        # built before torch.cuda.set_device(local_rank) still serves its rank's GPU.
        if device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return device

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device=device)

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, waiter: Any, event: Any) -> None:
        waiter.wait_event(event)

    def query(self, event: Any) -> bool:
        """Whether the work before ``event`` has run (without waiting)."""
        return event.query()

    def synchronize(self, event: Any) -> None:
        """Waits (this thread) until the work before ``event`` has run."""
        event.synchronize()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def on_device(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cuda"

    def to_device(
        self, tensor: torch.Tensor, device: torch.device, non_blocking: bool
    ) -> torch.Tensor:
        # Pinning here would be a host copy of the whole batch on the training thread; the
        # DataLoader's pinning thread does it off that thread.
        if non_blocking and tensor.device.type == "cpu" and not tensor.is_pinned():
            if not self.warned_unpinned:
                self.warned_unpinned = True
                warnings.warn(
                    "DataPrefetcher: the batches are not in pinned (page-locked) memory, so each "
                    "copy to the GPU blocks the training thread instead of overlapping with the "
                    "step. Pass pin_memory=True to the DataLoader (or DataLoaderX); fastpipe's "
                    "fast_collate output is pinned by it too",
                    RuntimeWarning,
                    stacklevel=6,
                )
        return tensor.to(device, non_blocking=non_blocking)


def streams_for(device: torch.device) -> CudaStreams | None:
    """The stream calls for ``device``, or None where it has no streams (CPU)."""
    return CudaStreams() if device.type == "cuda" else None


def copy_on_side(
    streams: CudaStreams, side: Any, device: torch.device, batch: Any,
    prepare: Callable[[Any, torch.device], Any], writer: Any = None,
) -> tuple[Any, Any]:
    """``prepare(batch, device)`` (the copy, and the work after it) queued on the ``side`` stream,
    and the event recorded on it right after. ``writer``: the stream that wrote the batch's GPU
    tensors (default: the current stream; a thread other than the consumer's names the
    consumer's, as the current stream is a thread's own)."""
    # Tensors already on the GPU were written on the stream current when they arrived (DALI's,
    # or a loader's own copy): the side stream waits for it before reading them, and they are
    # recorded on it so their memory is not reused while it reads.
    inputs = [tensor for tensor in tensors(_without_encoded(batch)) if streams.on_device(tensor)]
    if inputs:
        if writer is None:
            writer = streams.current_stream(device)
        streams.wait_event(side, streams.record_event(writer))
    with streams.use(side):
        for tensor in inputs:
            streams.record_stream(tensor, side)
        prepared = prepare(batch, device)
        return prepared, streams.record_event(side)


def hand_to_current(streams: CudaStreams, device: torch.device, batch: Any, copied: Any) -> None:
    """Makes the current stream wait for ``copied`` (the event after this batch's copy only, not
    the copies queued behind it), and records every GPU tensor of ``batch`` on it."""
    current = streams.current_stream(device)
    streams.wait_event(current, copied)
    for tensor in tensors(batch):
        # Host memory has no stream to be recorded on (record_stream refuses it): a host tensor
        # in the batch, such as a weight or a target a batch_transform returns, is left as is.
        if streams.on_device(tensor):
            streams.record_stream(tensor, current)


def _without_encoded(batch: Any) -> Any:
    """``batch`` with its encoded images (GPU decode's bytes, on the host, decoded by ``prepare``)
    left out of the walk for tensors already on the GPU."""
    for path in encoded_paths(batch):
        batch = replace_at(batch, path, None)
    return batch
