"""DataPrefetcher: the next batch moves to the device, and is normalized there, while this one
trains."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fastpipe import _validate as check
from fastpipe import ops
from fastpipe._background import BackgroundIterator
from fastpipe.data.sampler import STATE_VERSION

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Float images a hair outside [0, 1] (rounding in a resize) are still 0-1 images.
_RANGE_SLACK = 1e-3


class _CudaStreams:
    """The CUDA calls of the stream hand-off, in one place so tests can record them."""

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


def _stream_ops_for(device: torch.device) -> _CudaStreams | None:
    """The stream operations for ``device``, or None where it has no streams (CPU)."""
    return _CudaStreams() if device.type == "cuda" else None


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

    On CUDA the next batch is copied on a side stream (one per device, created at the first epoch
    on that device) while the training step runs on the current batch; before a batch is handed
    over, the current stream waits for its copy (an event recorded on the side stream after it;
    with ``prefetch_depth=1`` the same as ``wait_stream``) and every tensor in it is
    ``record_stream``-ed on the current stream, so the caching allocator cannot hand its memory
    out early. Tensors that arrive already on the GPU (DALI, a loader that moved them) are read
    on the side stream only after it waits for the stream that was current when they arrived,
    and are ``record_stream``-ed on the side stream. Host tensors should come pinned
    (``pin_memory=True`` on the DataLoader): unpinned ones are copied as they are, which blocks
    the training thread, with a one-time warning. ``device="cuda"`` (or None) means the device
    current when an epoch starts, so the prefetcher may be built before
    ``torch.cuda.set_device``. On CPU a background thread prepares the next ``prefetch_depth``
    batches; results are the same.

    Batches may be a tensor, tuple, list, dict, namedtuple or any nesting of them; non-tensor
    leaves (strings, a ``meta`` dict of strings) pass through unchanged.

    Normalization (optional) applies to the images only: the first tensor of a tuple or list, the
    ``image_key`` entry of a dict, or the batch itself when it is a tensor. With ``mean`` and
    ``std`` (in the 0-1 scale, like torchvision's ``Normalize``: ImageNet is
    ``mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)``), uint8 images become
    ``(x / 255 - mean) / std`` in ``dtype`` (float32 by default); float images are taken to be in
    0-1 already, and the first batch of each epoch is checked for that (one ``aminmax``): a float
    batch outside [0, 1] warns that it looks normalized already. With ``dtype`` alone, uint8
    images become floats in 0-1. ``channels_last`` returns images in ``torch.channels_last``
    memory format (alone, it changes nothing else). Labels and other tensors are moved, never
    normalized.

    ``batch_transform(images, targets) -> (images, targets)`` (for example
    ``fastpipe.ops.Mixup``) runs once per batch after normalization, on the side stream on CUDA,
    so it overlaps the training step. The targets are the first tensor after the images of a
    tuple or list, or the ``"target"``, ``"targets"``, ``"label"`` or ``"labels"`` entry of a dict.

    It reads like the loader it wraps: ``dataset``, ``sampler``, ``batch_sampler``,
    ``batch_size``, ``drop_last``, ``num_workers`` and ``len()`` are the loader's, and
    ``set_epoch`` passes through (Lightning calls it on ``sampler``). In a distributed run
    (``torch.distributed`` initialized, world size > 1) a wrapped loader whose sampler is not
    sharded (torch's ``RandomSampler``) is refused with the fix, since Lightning and accelerate
    shard only loaders handed to them directly. Wrapping accelerate's prepared loader keeps its
    end-of-data state on exactly the last batch. It pickles and deep-copies without its running
    epoch.

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
        prefetch_depth: int = 1,
        image_key: str | int | None = None,
        batch_transform: Callable[[Any, Any], tuple[Any, Any]] | None = None,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("pass both mean and std to normalize, or neither")
        if dtype is not None and dtype not in _FLOAT_DTYPES:
            raise TypeError(f"dtype must be torch.float32, float16 or bfloat16, got {dtype}")
        prefetch_depth = check.positive_int("prefetch_depth", prefetch_depth)
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be an iterable of batches, got {type(loader).__name__}")
        if batch_transform is not None and not callable(batch_transform):
            raise TypeError(
                "batch_transform must be a callable (images, targets) -> (images, targets), "
                f"got {type(batch_transform).__name__}"
            )
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
        self.prefetch_depth = prefetch_depth
        self.image_key = image_key
        self.batch_transform = batch_transform
        self._streams = _stream_ops_for(self.device)
        # One side stream per device, made at the first epoch there (never per epoch).
        self._side_streams: dict[torch.device, Any] = {}
        self._range_checked = False
        self._epoch: weakref.ref[Iterator[Any]] | None = None
        self._next_epoch: Iterator[Any] | None = None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def _loader_attribute(self, name: str) -> Any:
        try:
            return getattr(self.loader, name)
        except AttributeError:
            raise AttributeError(
                f"DataPrefetcher has no {name!r}: the loader it wraps "
                f"({type(self.loader).__name__}) has none"
            ) from None

    @property
    def dataset(self) -> Any:
        """The wrapped loader's ``dataset``."""
        return self._loader_attribute("dataset")

    @property
    def sampler(self) -> Any:
        """The wrapped loader's ``sampler`` (Lightning calls ``set_epoch`` on it)."""
        return self._loader_attribute("sampler")

    @property
    def batch_sampler(self) -> Any:
        """The wrapped loader's ``batch_sampler``."""
        return self._loader_attribute("batch_sampler")

    @property
    def batch_size(self) -> int | None:
        """The wrapped loader's ``batch_size``."""
        return self._loader_attribute("batch_size")

    @property
    def drop_last(self) -> bool:
        """The wrapped loader's ``drop_last``."""
        return self._loader_attribute("drop_last")

    @property
    def num_workers(self) -> int:
        """The wrapped loader's ``num_workers``."""
        return self._loader_attribute("num_workers")

    def set_epoch(self, epoch: int) -> None:
        """Passes ``epoch`` to the loader's ``set_epoch``, or else to its samplers' and
        dataset's."""
        set_epoch = getattr(self.loader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return
        batch_sampler = getattr(self.loader, "batch_sampler", None)
        targets = (
            getattr(self.loader, "sampler", None),
            batch_sampler,
            getattr(batch_sampler, "sampler", None),
            getattr(self.loader, "dataset", None),
        )
        seen: set[int] = set()
        for target in targets:
            method = getattr(target, "set_epoch", None)
            if target is not None and callable(method) and id(target) not in seen:
                seen.add(id(target))
                method(epoch)

    @property
    def normalizes(self) -> bool:
        return self.mean is not None or self.dtype is not None or self.channels_last

    def __getstate__(self) -> dict[str, Any]:
        # The running epoch (generators, a thread) and CUDA streams are not part of the state.
        state = dict(self.__dict__)
        state["_epoch"] = None
        state["_next_epoch"] = None
        state["_side_streams"] = {}
        return state

    def __iter__(self) -> Iterator[Any]:
        # One epoch at a time: the side stream and the loader's iterator are shared.
        self._close_epoch()
        _check_sharded(self.loader)
        self._range_checked = False
        self._handed_out = _Handed(self.loader, self.batch_transform)
        tracked = _accelerate_loader(self.loader)
        if self._streams is None and tracked is None:
            epoch: Iterator[Any] = BackgroundIterator(
                (self._prepare(batch, self.device)
                 for batch in self._handed_out.source(self.loader)),
                prefetch_depth=self.prefetch_depth,
                name="fastpipe-DataPrefetcher",
            )
        else:
            # accelerate's loaders keep their end-of-data state in the loader, set as they read
            # ahead; reading ahead here in the training thread keeps that in step (see _hand_over).
            epoch = self._ahead_epoch(tracked)
        # Held weakly, so a loop that breaks early lets the epoch (and its thread) go at once.
        self._epoch = weakref.ref(epoch)
        return self._handed_out.count(epoch)

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
        """Stops the current epoch's prefetching, releases what it holds, and closes the wrapped
        loader when it can be closed (DataLoaderX: its thread and persistent workers)."""
        self._close_epoch()
        close = getattr(self.loader, "close", None)
        if callable(close):
            close()

    def _close_epoch(self) -> None:
        self._next_epoch = None
        epoch = self._epoch() if self._epoch is not None else None
        self._epoch = None
        close = getattr(epoch, "close", None)
        if callable(close):
            close()

    # Resume (issue 15): the wrapped loader's state at the last batch handed to the training
    # loop; the batches prepared ahead (on the side stream, or in the queue) come again.

    _handed_out: _Handed | None = None

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's state after the last batch the training loop received.

        ``{"version": 1, "loader": loader.state_dict() as it was then}``. The loader must have
        ``state_dict()`` / ``load_state_dict()`` (DataLoaderX, torchdata's StatefulDataLoader).
        With a ``batch_transform`` that has ``state_dict()`` (``fastpipe.ops.Mixup``,
        ``RandomErasing`` with a generator), its state after that batch too, under
        ``"batch_transform"``: the batches transformed ahead come again with the same draws.
        """
        handed = self._handed_out
        loader_state = handed.state() if handed is not None else None
        if loader_state is None:
            loader_state = _loader_state(self.loader)
        state = {"version": STATE_VERSION, "loader": loader_state}
        if callable(getattr(self.batch_transform, "state_dict", None)):
            transform_state = handed.transform_state() if handed is not None else None
            if transform_state is None:
                transform_state = self.batch_transform.state_dict()
            state["batch_transform"] = transform_state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict` into the wrapped loader; the next epoch continues it."""
        if not isinstance(state, dict) or "loader" not in state:
            got = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise TypeError(
                "DataPrefetcher.load_state_dict() takes a dict from DataPrefetcher.state_dict(), "
                f"got {got}"
            )
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"this DataPrefetcher state has version {state.get('version')!r}; this fastpipe "
                f"reads version {STATE_VERSION}"
            )
        if "batch_transform" in state and not callable(
            getattr(self.batch_transform, "load_state_dict", None)
        ):
            raise ValueError(
                "this DataPrefetcher state holds a batch_transform's state, and this prefetcher's "
                f"batch_transform ({type(self.batch_transform).__name__}) has no "
                "load_state_dict(): build it with the same batch_transform"
            )
        _loader_method(self.loader, "load_state_dict")(state["loader"])
        if "batch_transform" in state:
            self.batch_transform.load_state_dict(state["batch_transform"])
        self._close_epoch()
        self._handed_out = None

    def _ahead_epoch(self, tracked: Any) -> Iterator[Any]:
        """Reads ``prefetch_depth`` batches ahead in the consumer's thread (CUDA streams, or
        accelerate's loaders)."""
        streams = self._streams
        device, side = self.device, None
        if streams is not None:
            device = streams.concrete_device(self.device)
            side = self._side_streams.get(device)
            if side is None:
                side = self._side_streams[device] = streams.new_stream(device)
        source = iter(self._handed_out.source(self.loader))
        ready: deque[tuple[Any, Any]] = deque()  # (batch on the device, event after its copy)
        failed: list[BaseException] = []
        exhausted: list[bool] = []

        def load_one() -> bool:
            if failed or exhausted:
                return False
            try:
                batch = next(source)
            except StopIteration:
                exhausted.append(True)
                return False
            except Exception as error:  # noqa: BLE001 - raised after the batches before it
                failed.append(error)
                return False
            if streams is None:
                ready.append((self._prepare(batch, device), None))
                return True
            # Tensors already on the GPU were written on the stream current when they arrived
            # (DALI's, or a loader's own copy): the side stream waits for it before reading them,
            # and they are recorded on it so their memory is not reused while it reads.
            inputs = [
                leaf
                for leaf in pytree.tree_leaves(batch)
                if isinstance(leaf, torch.Tensor) and streams.on_device(leaf)
            ]
            if inputs:
                streams.wait_event(side, streams.record_event(streams.current_stream(device)))
            with streams.use(side):
                for leaf in inputs:
                    streams.record_stream(leaf, side)
                prepared = self._prepare(batch, device)
                ready.append((prepared, streams.record_event(side)))
            return True

        readded = False
        try:
            while len(ready) < self.prefetch_depth and load_one():
                pass
            while ready:
                batch, copied = ready.popleft()
                if streams is not None:
                    current = streams.current_stream(device)
                    # Wait for this batch's copy only, not for the ones queued behind it
                    # (prefetch_depth > 1), and before the next copy is queued.
                    streams.wait_event(current, copied)
                    for leaf in pytree.tree_leaves(batch):
                        if isinstance(leaf, torch.Tensor):
                            streams.record_stream(leaf, current)
                load_one()
                if tracked is not None:
                    readded = _hand_over(tracked, last=not ready and bool(exhausted)) or readded
                yield batch
            if failed:
                raise failed[0]
        finally:
            if readded:
                tracked.gradient_state._remove_dataloader(tracked)
            close = getattr(source, "close", None)
            if callable(close):
                close()

    def _prepare(self, batch: Any, device: torch.device) -> Any:
        """Moves every tensor of ``batch`` to ``device``, normalizes its images there and runs
        ``batch_transform``."""
        needs_images = self.normalizes or self.batch_transform is not None
        image_path = self._image_path(batch) if needs_images else None

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if self._streams is not None:
                return self._streams.to_device(tensor, device, self.non_blocking)
            return tensor.to(device)

        moved = pytree.tree_map_only(torch.Tensor, move, batch)
        if image_path is None:
            return moved
        if self.normalizes:
            images = self._normalize(_get_at(moved, image_path), image_path)
            moved = _replace_at(moved, image_path, images)
        if self.batch_transform is not None:
            moved = self._transform(moved, image_path)
        return moved

    def _transform(self, batch: Any, image_path: tuple[Any, ...]) -> Any:
        target_path = self._target_path(batch, image_path)
        out = self.batch_transform(_get_at(batch, image_path), _get_at(batch, target_path))
        if self._handed_out is not None:
            self._handed_out.transformed()
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(
                "batch_transform must return a pair (images, targets), got "
                f"{type(out).__name__}"
            )
        batch = _replace_at(batch, image_path, out[0])
        return _replace_at(batch, target_path, out[1])

    def _target_path(self, batch: Any, image_path: tuple[Any, ...]) -> tuple[Any, ...]:
        if isinstance(batch, dict):
            key = next((k for k in ("target", "targets", "label", "labels") if k in batch), None)
            if key is not None:
                return (key,)
        elif isinstance(batch, (tuple, list)):
            for index, item in enumerate(batch):
                if (index,) != image_path and isinstance(item, torch.Tensor):
                    return (index,)
        raise TypeError(
            "batch_transform needs (images, targets) batches: a tuple or list with a target "
            "tensor after the images, or a dict with a 'target', 'targets', 'label' or 'labels' "
            f"entry; got a batch of type {type(batch).__name__}"
        )

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
            shape = (tuple(images.shape) if isinstance(images, torch.Tensor)
                     else type(images).__name__)
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
        if self.mean is not None and images.dtype != torch.uint8 and not self._range_checked:
            self._check_unit_range(images, place)
        return ops.normalize(
            images, mean, std, dtype=self.dtype or torch.float32, channels_last=self.channels_last
        )

    def _fastpipe_describe(self) -> dict[str, Any]:
        """Tells ``fastpipe.profile`` what this is: a prefetcher over ``self.loader``."""
        return {"prefetcher": True, "wraps": self.loader}

    def _check_unit_range(self, images: torch.Tensor, place: str) -> None:
        # Once per epoch (the first batch): reading the values back waits for the device.
        self._range_checked = True
        if images.numel() == 0:
            return
        low, high = (float(v) for v in torch.aminmax(images.detach()))
        if low < -_RANGE_SLACK or high > 1 + _RANGE_SLACK:
            warnings.warn(
                f"DataPrefetcher: the float images in {place} range from {low:.3g} to {high:.3g}, "
                "outside [0, 1], and mean/std were given: they look normalized already (e.g. by "
                "transforms.Normalize in the dataset), and would be normalized twice. Either drop "
                "Normalize (and ToTensor: PILToTensor gives uint8, cheaper to move) from the "
                "dataset's transforms, or leave mean and std unset here",
                UserWarning,
                stacklevel=2,
            )


def _check_sharded(loader: Any) -> None:
    """Refuses an unsharded shuffled loader in a distributed run: every rank would train on the
    whole dataset, silently."""
    import torch.distributed as dist
    from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    dataset = getattr(loader, "dataset", None)
    if dataset is None or isinstance(dataset, IterableDataset):
        return
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", sampler)
    for candidate in (sampler, batch_sampler, inner):
        for name in ("num_replicas", "world_size", "num_processes"):
            value = getattr(candidate, name, None)
            if isinstance(value, int) and value > 1:
                return
    if not isinstance(inner, (RandomSampler, SequentialSampler)):  # fastpipe's are subclasses
        return  # a sampler of the user's own: trust it
    world = dist.get_world_size()
    what = (
        f"DataPrefetcher wraps a {type(loader).__name__} whose sampler, a "
        f"{type(inner).__name__}, is not sharded, in a distributed run of {world} processes: "
        "every process would "
        "iterate the whole dataset. Lightning and accelerate shard only the DataLoaders they are "
        "given directly, not one inside a DataPrefetcher. Fix: with Lightning, return the "
        "DataLoader(X) itself from *_dataloader() and move/normalize the batch in "
        "on_after_batch_transfer (fastpipe.ops.normalize), or shard it yourself with "
        "sampler=DistributedSampler(dataset) (Lightning then calls set_epoch through "
        "DataPrefetcher.sampler); with accelerate, wrap the prepared loader: "
        "DataPrefetcher(accelerator.prepare(loader)); with torchrun, pass "
        "sampler=DistributedSampler(dataset) and call prefetcher.set_epoch(epoch) every epoch"
    )
    if isinstance(inner, RandomSampler):
        raise RuntimeError(what)
    warnings.warn(what + " (if every process should see every sample, ignore this warning)",
                  UserWarning, stacklevel=3)


def _accelerate_loader(loader: Any) -> Any:
    """``loader`` when it is one of accelerate's prepared loaders (they track the end of the
    data for gradient accumulation and gather_for_metrics), else None."""
    if hasattr(loader, "end_of_dataloader") and hasattr(loader, "gradient_state"):
        return loader
    return None


def _hand_over(loader: Any, last: bool) -> bool:
    """Makes accelerate's state describe the batch being handed over, not the one read ahead.

    accelerate's loader reads one batch ahead itself and sets ``end_of_dataloader`` when that
    read finds the end, then leaves the gradient state when it is exhausted; reading further
    ahead here would move both earlier by ``prefetch_depth`` batches. Returns True when the
    loader had to be registered again (the caller removes it at the end of the epoch).
    """
    state = loader.gradient_state
    readded = False
    if not any(ref is loader for ref in state.dataloader_references):
        state._add_dataloader(loader)
        readded = True
    loader.end_of_dataloader = last
    return readded


def _loader_method(loader: Any, name: str) -> Any:
    method = getattr(loader, name, None)
    if not callable(method):
        raise TypeError(
            f"DataPrefetcher.{name}() needs a loader with state_dict() and load_state_dict(), "
            f"and {type(loader).__name__} has no {name}(); wrap a fastpipe.DataLoaderX (or "
            "torchdata's StatefulDataLoader)"
        )
    return method


def _loader_state(loader: Any) -> Any:
    return _loader_method(loader, "state_dict")()


class _Handed:
    """Pairs each batch taken from the loader with the loader's state right after it.

    ``source`` runs wherever batches are taken (the background thread on the CPU); ``count``
    wraps what the training loop iterates and makes the state of each batch it receives current.
    """

    def __init__(self, loader: Any, transform: Any = None) -> None:
        self._loader = loader
        self._stateful = callable(getattr(loader, "state_dict", None))
        self._current: Any = None
        if self._stateful:
            try:
                self._current = _loader_state(loader)
            except Exception:  # noqa: BLE001 - a loader whose state_dict() cannot answer (accelerate's
                # DataLoaderShard has the method but raises without a stateful DataLoader inside):
                # the prefetcher's state_dict() asks it again and raises there, where it was asked.
                self._stateful = False
        self._states: deque[Any] = deque()
        # A batch_transform with randomness of its own (Mixup): its state after each batch.
        self._transform = transform if callable(getattr(transform, "state_dict", None)) else None
        self._transform_current = self._transform.state_dict() if self._transform else None
        self._transform_states: deque[Any] = deque()

    def transformed(self) -> None:
        """Called right after ``batch_transform`` ran on the batch taken last."""
        if self._transform is not None:
            self._transform_states.append(self._transform.state_dict())

    def transform_state(self) -> Any:
        return self._transform_current

    def source(self, loader: Iterable[Any]) -> Iterator[Any]:
        batches = iter(loader)
        try:
            for batch in batches:
                if self._stateful:
                    self._states.append(_loader_state(loader))
                yield batch
        finally:
            # Closed with the epoch, so the loader's own thread (DataLoaderX) stops with it.
            close = getattr(batches, "close", None)
            if callable(close):
                close()

    def count(self, epoch: Iterator[Any]) -> Iterator[Any]:
        return _Counted(epoch, self)

    def handed(self) -> None:
        if self._stateful:
            self._current = self._states.popleft()
        if self._transform_states:
            self._transform_current = self._transform_states.popleft()

    def ended(self) -> None:
        # The loader saw the end of its epoch before the loop did; its state now says so.
        if self._stateful and not self._states:
            self._current = _loader_state(self._loader)

    def state(self) -> Any:
        return self._current


class _Counted:
    """The epoch's iterator, telling ``_Handed`` of each batch the training loop receives."""

    def __init__(self, batches: Iterator[Any], handed: _Handed) -> None:
        self._batches, self._handed = batches, handed

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._batches)
        except StopIteration:
            self._handed.ended()
            raise
        self._handed.handed()
        return batch

    def __getattr__(self, name: str) -> Any:
        if name in ("_batches", "_handed"):
            raise AttributeError(name)
        return getattr(self._batches, name)


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
