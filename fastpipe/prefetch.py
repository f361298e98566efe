"""DataPrefetcher: the next batch moves to the device, and is normalized there, while this one trains."""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fastpipe import ops
from fastpipe._background import BackgroundIterator

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _CudaStreams:
    """The CUDA calls of the stream hand-off, in one place so tests can record them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, waiter: Any, event: Any) -> None:
        waiter.wait_event(event)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def to_device(self, tensor: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        # An asynchronous copy needs page-locked host memory; pin what the loader did not.
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(device, non_blocking=non_blocking)


def _stream_ops_for(device: torch.device) -> _CudaStreams | None:
    """The stream operations for ``device``, or None where it has no streams (CPU)."""
    return _CudaStreams(device) if device.type == "cuda" else None


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"unknown device {device!r}; pass 'cpu', 'cuda', 'cuda:N', a torch.device, or None to "
            "pick CUDA when it is available"
        ) from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r} was asked for but CUDA is not available here "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None}); "
                "pass device='cpu' or device=None"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    elif resolved.type != "cpu":
        raise ValueError(
            f"DataPrefetcher supports 'cpu' and 'cuda' devices, got {device!r}; pass one of those"
        )
    return resolved


class DataPrefetcher:
    """Wraps an iterable of batches so that each batch arrives on ``device``, ready to use.

    On CUDA the next batch is copied on one side stream (created once per prefetcher) while the
    training step runs on the current batch; before a batch is handed over, the current stream
    waits for its copy (an event recorded on the side stream after it; with ``depth=1`` the same
    as ``wait_stream``) and every tensor in it is ``record_stream``-ed on the current stream, so the
    caching allocator cannot hand its memory out early. Host tensors that are not pinned are
    pinned first, so the copy can be asynchronous. On CPU a background thread prepares the next
    ``depth`` batches; results are the same.

    Batches may be a tensor, tuple, list, dict, namedtuple or any nesting of them; non-tensor
    leaves (strings, a ``meta`` dict of strings) pass through unchanged.

    Normalization (optional) applies to the images only: the first tensor of a tuple or list, the
    ``image_key`` entry of a dict, or the batch itself when it is a tensor. With ``mean`` and
    ``std`` (in the 0-1 scale, like torchvision's ``Normalize``: ImageNet is
    ``mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)``), uint8 images become
    ``(x / 255 - mean) / std`` in ``dtype`` (float32 by default); float images are taken to be in
    0-1 already. With ``dtype`` alone, uint8 images become floats in 0-1. ``channels_last`` returns
    images in ``torch.channels_last`` memory format (alone, it changes nothing else). Labels and other tensors are moved, never
    normalized.

    Use it as ``for batch in prefetcher:`` (each loop is one epoch) or, as in apex,
    ``batch = prefetcher.next()`` until it returns None; the call after that starts a new epoch.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: str | torch.device | None = None,
        mean: Sequence[float] | torch.Tensor | None = None,
        std: Sequence[float] | torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
        channels_last: bool = False,
        non_blocking: bool = True,
        depth: int = 1,
        image_key: str | int | None = None,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("pass both mean and std to normalize, or neither")
        if dtype is not None and dtype not in _FLOAT_DTYPES:
            raise TypeError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype}")
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be a positive int (batches prepared ahead), got {depth!r}")
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be an iterable of batches, got {type(loader).__name__}")
        self.loader = loader
        self.device = _resolve_device(device)
        self.mean = None if mean is None else torch.as_tensor(mean, dtype=torch.float32).flatten()
        self.std = None if std is None else torch.as_tensor(std, dtype=torch.float32).flatten()
        if self.std is not None and bool(((self.std == 0) | ~self.std.isfinite()).any()):
            raise ValueError(
                f"std must not contain zeros or non-finite values, got {self.std.tolist()}"
            )
        if self.mean is not None and not bool(self.mean.isfinite().all()):
            raise ValueError(f"mean must be finite, got {self.mean.tolist()}")
        self.dtype = dtype
        self.channels_last = channels_last
        self.non_blocking = non_blocking
        self.depth = depth
        self.image_key = image_key
        self._streams = _stream_ops_for(self.device)
        self._side_stream = self._streams.new_stream() if self._streams is not None else None
        self._epoch: weakref.ref[Iterator[Any]] | None = None
        self._next_epoch: Iterator[Any] | None = None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def normalizes(self) -> bool:
        return self.mean is not None or self.dtype is not None or self.channels_last

    def __iter__(self) -> Iterator[Any]:
        # One epoch at a time: the side stream and the loader's iterator are shared.
        self.close()
        if self._streams is None:
            epoch: Iterator[Any] = BackgroundIterator(
                (self._prepare(batch) for batch in self.loader),
                max_prefetch=self.depth,
                name="fastpipe-DataPrefetcher",
            )
        else:
            epoch = self._stream_epoch()
        # Held weakly, so a loop that breaks early lets the epoch (and its thread) go at once.
        self._epoch = weakref.ref(epoch)
        return epoch

    def next(self) -> Any:
        """The next batch, or None at the end of the epoch; the call after None starts a new one."""
        if self._next_epoch is None:
            self._next_epoch = iter(self)
        try:
            return next(self._next_epoch)
        except StopIteration:
            self._next_epoch = None
            return None

    def close(self) -> None:
        """Stops the current epoch's prefetching and releases what it holds."""
        self._next_epoch = None
        epoch = self._epoch() if self._epoch is not None else None
        self._epoch = None
        close = getattr(epoch, "close", None)
        if callable(close):
            close()

    def _stream_epoch(self) -> Iterator[Any]:
        streams, side = self._streams, self._side_stream
        assert streams is not None
        source = iter(self.loader)
        ready: deque[tuple[Any, Any]] = deque()  # (batch on the device, event after its copy)
        failed: list[BaseException] = []

        def load_one() -> bool:
            if failed:
                return False
            try:
                batch = next(source)
            except StopIteration:
                return False
            except Exception as error:  # noqa: BLE001 - raised after the batches before it
                failed.append(error)
                return False
            with streams.use(side):
                prepared = self._prepare(batch)
                ready.append((prepared, streams.record_event(side)))
            return True

        try:
            while len(ready) < self.depth and load_one():
                pass
            while ready:
                batch, copied = ready.popleft()
                current = streams.current_stream()
                # Wait for this batch's copy only, not for the ones queued behind it (depth > 1),
                # and before the next copy is queued.
                streams.wait_event(current, copied)
                for leaf in pytree.tree_leaves(batch):
                    if isinstance(leaf, torch.Tensor):
                        streams.record_stream(leaf, current)
                load_one()
                yield batch
            if failed:
                raise failed[0]
        finally:
            close = getattr(source, "close", None)
            if callable(close):
                close()

    def _prepare(self, batch: Any) -> Any:
        """Moves every tensor of ``batch`` to the device and normalizes its images there."""
        image_path = self._image_path(batch) if self.normalizes else None

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if self._streams is not None:
                return self._streams.to_device(tensor, self.device, self.non_blocking)
            return tensor.to(self.device)

        moved = pytree.tree_map_only(torch.Tensor, move, batch)
        if image_path is None:
            return moved
        return _replace_at(moved, image_path, self._normalize(_get_at(moved, image_path), image_path))

    def _image_path(self, batch: Any) -> tuple[Any, ...]:
        if isinstance(batch, torch.Tensor):
            return ()
        if isinstance(batch, dict):
            key = self.image_key
            if key is None:
                key = next((k for k in ("image", "images", "input", "inputs") if k in batch), None)
            if key is None or key not in batch:
                raise ValueError(
                    f"normalization needs to know which entry of the dict batch holds the images; "
                    f"the batch has keys {sorted(map(str, batch))}. Pass image_key=..."
                )
            return (key,)
        if isinstance(batch, (tuple, list)):
            if self.image_key is not None:
                return (self.image_key,)
            for index, item in enumerate(batch):
                if isinstance(item, torch.Tensor):
                    return (index,)
        raise TypeError(
            f"normalization found no image tensor in a batch of type {type(batch).__name__}; "
            "pass image_key=..., or leave mean, std and dtype unset"
        )

    def _normalize(self, images: Any, where: tuple[Any, ...]) -> torch.Tensor:
        place = "batch" + "".join(f"[{k!r}]" for k in where)
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise TypeError(
                f"DataPrefetcher was asked to normalize {place}, which is {shape}, not a 4-D "
                "(N, C, H, W) image batch; pass image_key=... to point at the images, or leave "
                "mean, std and dtype unset"
            )
        if images.dtype not in (torch.uint8, *_FLOAT_DTYPES):
            raise TypeError(
                f"DataPrefetcher was asked to normalize {place} of dtype {images.dtype}; images "
                "must be uint8 or floating point. Pass image_key=... to point at the images"
            )
        if self.mean is None and self.dtype is None:
            return images.contiguous(memory_format=torch.channels_last)
        channels = images.shape[1]
        mean = self.mean if self.mean is not None else torch.zeros(channels)
        std = self.std if self.std is not None else torch.ones(channels)
        for name, values in (("mean", mean), ("std", std)):
            if values.numel() != channels:
                raise ValueError(
                    f"{name} has {values.numel()} values but {place} has {channels} channels "
                    f"(shape {tuple(images.shape)}); pass one {name} value per channel"
                )
        return ops.normalize(
            images, mean, std, dtype=self.dtype or torch.float32, channels_last=self.channels_last
        )

    def _fastpipe_describe(self) -> dict[str, Any]:
        """Tells ``fastpipe.profile`` what this is: a prefetcher over ``self.loader``."""
        return {"prefetcher": True, "wraps": self.loader}


def _get_at(batch: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        batch = batch[key]
    return batch


def _replace_at(batch: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(batch, dict):
        new = dict(batch)
        new[key] = _replace_at(batch[key], rest, value)
        return type(batch)(new) if type(batch) is not dict else new
    items = list(batch)
    items[key] = _replace_at(batch[key], rest, value)
    if hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*items)
    return type(batch)(items)
