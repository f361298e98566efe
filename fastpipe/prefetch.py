"""DataPrefetcher: the next batch moves to the device, and is normalized there, while this one
trains.

Its parts live beside it: the batch structures in ``fastpipe._batch``, the CUDA stream hand-off in
``fastpipe._streams``, GPU decode in ``fastpipe.gpu_decode``, Lightning and accelerate in
``fastpipe._frameworks``, and what resume shares with the other loaders in
``fastpipe.data.sampling.resume``.
"""

from __future__ import annotations

import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

import torch

from fastpipe import _validate as check
from fastpipe._background import BackgroundIterator
from fastpipe._batch import (
    get_at,
    image_paths,
    is_image_sequence,
    map_tensors,
    place,
    replace_at,
    suggest_image_key,
    target_paths,
)
from fastpipe._frameworks import (
    AccelerateTracking,
    LoaderAttributes,
    accelerate_tracking,
    check_sharded,
)
from fastpipe._hardware import resolve_device
from fastpipe._streams import copy_on_side, hand_to_current, streams_for
from fastpipe.data.sampling.resume import STATE_VERSION, WrappedHandOff
from fastpipe.data.sampling.skip import Skipped, SkipRecord
from fastpipe.gpu_decode import GpuDecode
from fastpipe.gpu_decode._batches import encoded_paths, index_on, without_rows
from fastpipe.gpu_decode._decoder import GpuDecoder
from fastpipe.ops import normalize

__all__ = ["DataPrefetcher"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Float images a hair outside [0, 1] (rounding in a resize) are still 0-1 images.
_RANGE_SLACK = 1e-3
# What _prepare returns for a batch whose every sample a GPU decode left out (on_error="skip").
_NOTHING = object()


class DataPrefetcher(LoaderAttributes):
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

    Batches may be a tensor, or any nesting of dicts, lists, tuples, namedtuples and dataclasses
    around tensors: every tensor moves, each container keeps its type (a dataclass is rebuilt
    with ``dataclasses.replace``, frozen ones too), and non-tensor leaves (strings, a ``meta``
    dict of strings) pass through as the same objects. A batch whose tensors cannot be reached (a
    set, an object keeping tensors in its attributes) is a ``TypeError`` naming its type.

    Normalization (optional) applies to the images only: by default the batch itself when it is a
    tensor, the ``"image"``, ``"images"``, ``"input"`` or ``"inputs"`` entry of a dict, dataclass
    or namedtuple, else the first tensor of a tuple, list, dataclass or namedtuple, else its first
    tuple or list of tensors. ``image_key`` names them instead: a dict key, a sequence index or an
    attribute name, or a tuple or list of these for several image entries (each normalized the
    same way). An entry that is a tuple or list of images (variable sizes, as torchvision's
    detection batches) is normalized image by image, each ``(C, H, W)`` or ``(N, C, H, W)``.
    With ``mean`` and ``std`` (in the 0-1 scale, like torchvision's ``Normalize``: ImageNet is
    ``mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)``), uint8 images become
    ``(x / 255 - mean) / std`` in ``dtype`` (float32 by default); float images are taken to be in
    0-1 already, and the first batch of each epoch is checked for that (one ``aminmax``): a float
    batch outside [0, 1] warns that it looks normalized already. With ``dtype`` alone, uint8
    images become floats in 0-1. ``channels_last`` returns images in ``torch.channels_last``
    memory format (alone, it changes nothing else). Labels and other tensors are moved, never
    normalized.

    ``batch_transform(images, targets) -> (images, targets)`` (for example
    ``fastpipe.ops.Mixup``) runs once per batch after normalization, on the side stream on CUDA,
    so it overlaps the training step. The images are the entry ``image_key`` names (the default
    above); the targets are the entry ``target_key`` names (in the same forms; e.g. the mask of
    a segmentation batch, for CutMix on image and mask together), by default the ``"target"``,
    ``"targets"``, ``"label"`` or ``"labels"`` entry of a dict, dataclass or namedtuple, else the
    first other tensor of a tuple, list, dataclass or namedtuple, else its first other entry with
    tensors. Where ``image_key`` (or ``target_key``) is a tuple or list, that argument is a tuple
    of the entries in its order, and the transform returns a tuple of as many.

    It reads like the loader it wraps: ``dataset``, ``sampler``, ``batch_sampler``,
    ``batch_size``, ``drop_last``, ``num_workers`` and ``len()`` are the loader's, and
    ``set_epoch`` passes through (Lightning calls it on ``sampler``). In a distributed run
    (``torch.distributed`` initialized, world size > 1) a wrapped loader whose sampler is not
    sharded (torch's ``RandomSampler``) is refused with the fix, since Lightning and accelerate
    shard only loaders handed to them directly. Wrapping accelerate's prepared loader keeps its
    end-of-data state on exactly the last batch. It pickles and deep-copies without its running
    epoch.

    GPU decode: batches of a dataset built with ``decode="gpu"`` hold encoded images (each
    sample's bytes and the recipe's draw for it: the CPU path's crop box and flip) where the
    images would be. They are decoded here, on the side stream, before the batch is normalized
    and handed over: one batched decode (nvImageCodec; only each crop's region where it can),
    one resize of every crop (``fastpipe.ops.resize_crops``, the CPU path's filters), the flips.
    ``gpu_decode`` (a :class:`~fastpipe.gpu_decode.GpuDecode`) sets the decoder, the hardware
    engine and the cap on the buffers kept between batches. An image the GPU decoder does not
    decode is decoded by the CPU path's decoder (the CPU path's pixels), counted in
    :attr:`gpu_decode_stats` and reported once; one that the CPU decoder refuses too is corrupt:
    raised, or, when the wrapped loader has ``on_error="skip"``, left out of its batch, counted
    and reported at the end of the epoch, and listed in :attr:`skipped`, as the loader does.
    :meth:`close` lets go of the decoder and its buffers.

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
        image_key: Any = None,
        batch_transform: Callable[[Any, Any], tuple[Any, Any]] | None = None,
        target_key: Any = None,
        gpu_decode: GpuDecode | None = None,
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
        for option, key in (("image_key", image_key), ("target_key", target_key)):
            if isinstance(key, (tuple, list)) and not key:
                raise ValueError(f"{option} must name at least one entry, got {key!r}")
        if target_key is not None and batch_transform is None:
            raise ValueError(
                "target_key names the entry passed to batch_transform as its targets, and no "
                "batch_transform was given; pass batch_transform=..., or leave target_key unset"
            )
        if gpu_decode is not None and not isinstance(gpu_decode, GpuDecode):
            raise TypeError(f"gpu_decode must be a fastpipe.gpu_decode.GpuDecode or None, got "
                            f"{type(gpu_decode).__name__}")
        self.loader = loader
        self.gpu_decode = gpu_decode or GpuDecode()
        self._gpu_decode_asked = gpu_decode is not None
        self._warned_nothing_encoded = False
        self.device = resolve_device(device, where="DataPrefetcher")
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
        self.target_key = target_key
        self.batch_transform = batch_transform
        self._streams = streams_for(self.device)
        # One side stream per device, made at the first epoch there (never per epoch).
        self._side_streams: dict[torch.device, Any] = {}
        # mean and std on each device they were used on (CUDA), copied once (see _stats_on).
        self._device_stats: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        self._unit_stats: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._range_checked = False
        self._epoch: weakref.ref[Iterator[Any]] | None = None
        self._next_epoch: Iterator[Any] | None = None
        # GPU decode: one decoder per device, made at the first encoded batch there.
        self._decoders: dict[torch.device, GpuDecoder] = {}
        self._decode_skips = SkipRecord()
        self._warned_fallback = False

    @property
    def normalizes(self) -> bool:
        return self.mean is not None or self.dtype is not None or self.channels_last

    def __getstate__(self) -> dict[str, Any]:
        # The running epoch (generators, a thread) and CUDA streams are not part of the state.
        state = dict(self.__dict__)
        state["_epoch"] = None
        state["_next_epoch"] = None
        state["_side_streams"] = {}
        state["_device_stats"] = {}
        state["_decoders"] = {}
        return state

    def __iter__(self) -> Iterator[Any]:
        # One epoch at a time: the side stream and the loader's iterator are shared.
        self._close_epoch()
        check_sharded(self.loader)
        self._range_checked = False
        self._decode_skips = self._restored_decode_skips or SkipRecord()
        self._restored_decode_skips = None
        self._handed_out = WrappedHandOff(self.loader, self.batch_transform)
        tracked = accelerate_tracking(self.loader)
        if self._streams is None and tracked is None:
            epoch: Iterator[Any] = BackgroundIterator(
                self._prepared_epoch(self._handed_out.read()),
                prefetch_depth=self.prefetch_depth,
                name="fastpipe-DataPrefetcher",
            )
        else:
            # accelerate's loaders keep their end-of-data state in the loader, set as they read
            # ahead; reading ahead here in the training thread keeps that in step.
            epoch = self._ahead_epoch(tracked)
        # Held weakly, so a loop that breaks early lets the epoch (and its thread) go at once.
        self._epoch = weakref.ref(epoch)
        return self._handed_out.counted(epoch)

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
        """Stops the current epoch's prefetching, releases what it holds (the GPU decoder and its
        buffers included), and closes the wrapped loader when it can be closed (DataLoaderX: its
        thread and persistent workers)."""
        self._close_epoch()
        decoders, self._decoders = self._decoders, {}
        for decoder in decoders.values():
            decoder.close()
        _close(self.loader)

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The samples left out in the current (or last) epoch with ``on_error="skip"``: the
        wrapped loader's, then those the GPU decode found corrupt."""
        if not self._decode_skips.entries:
            return self._loader_attribute("skipped")
        skipped = getattr(self.loader, "skipped", None)
        return list(skipped or []) + self._decode_skips.state()

    @property
    def gpu_decode_stats(self) -> dict[str, Any] | None:
        """What GPU decode did (None before any encoded batch): batches, images decoded on the
        GPU and on the CPU instead (with the reasons counted), corrupt images skipped, buffer
        releases at the cap, the decoder used, and the buffer bytes it keeps now."""
        if not self._decoders:
            return None
        decoder = next(iter(self._decoders.values()))
        return {**decoder.stats.to_dict(), "backend": decoder.backend_name,
                "kept_bytes": decoder.kept_bytes()}

    def _close_epoch(self) -> None:
        self._next_epoch = None
        epoch = self._epoch() if self._epoch is not None else None
        self._epoch = None
        _close(epoch)

    def _ahead_epoch(self, tracked: AccelerateTracking | None) -> Iterator[Any]:
        """Reads ``prefetch_depth`` batches ahead in the consumer's thread (CUDA streams, or
        accelerate's loaders); GPU decode's batches in a thread of their own."""
        streams = self._streams
        device, side = self.device, None
        if streams is not None:
            device = streams.concrete_device(self.device)
            side = self._side_streams.get(device)
            if side is None:
                side = self._side_streams[device] = streams.new_stream(device)
        source = loader_batches = iter(self._handed_out.read())
        if streams is not None and tracked is None:
            # The first batch is read here, in the consumer's thread, where the loader's workers
            # start (they are forked from it).
            try:
                first = _first(loader_batches)
            except BaseException:
                _close(loader_batches)
                raise
            decoding = first is not _NOTHING and bool(encoded_paths(first))
            # Not held here for the epoch: the batch (and its bytes) goes when it has been used.
            source = chain(iter([first]), loader_batches) if first is not _NOTHING else iter(())
            del first
            if decoding:
                yield from self._decoding_ahead(source, loader_batches, streams, device, side)
                return
        ready: deque[tuple[Any, Any]] = deque()  # (batch on the device, event after its copy)
        failed: list[BaseException] = []
        exhausted: list[bool] = []
        # The encoded images of the batches decoded on the side stream, with the event after
        # each: the decoder may still read their bytes (host memory) after its call returns, so
        # they are let go only once the event has passed.
        encoded: deque[tuple[Any, list[Any]]] = deque()

        def load_one() -> bool:
            if failed or exhausted:
                return False
            # An error of the loader, or of the decode or the move of a batch, is raised after
            # the batches before it.
            try:
                batch = next(source)
            except StopIteration:
                exhausted.append(True)
                return False
            except Exception as error:  # noqa: BLE001 - raised after the batches before it
                failed.append(error)
                return False
            try:
                if streams is None:
                    ready.append((self._prepare(batch, device), None))
                else:
                    images = [get_at(batch, path) for path in encoded_paths(batch)]
                    try:
                        ready.append(copy_on_side(streams, side, device, batch, self._prepare))
                    except BaseException:
                        # The decode may have queued work that reads the bytes before it failed.
                        if images:
                            encoded.append((streams.record_event(side), images))
                        raise
                    if images:
                        encoded.append((ready[-1][1], images))
            except Exception as error:  # noqa: BLE001 - raised after the batches before it
                failed.append(error)
                return False
            while encoded and streams.query(encoded[0][0]):
                encoded.popleft()
            return True

        try:
            while len(ready) < self.prefetch_depth and load_one():
                pass
            while ready:
                batch, copied = ready.popleft()
                if batch is _NOTHING:  # every sample of it left out by the GPU decode
                    load_one()
                    continue
                if streams is not None:
                    # Before the next copy is queued, so the step waits for this batch only.
                    hand_to_current(streams, device, batch, copied)
                load_one()
                if tracked is not None:
                    tracked.hand_over(last=not ready and bool(exhausted))
                yield batch
            if failed:
                raise failed[0]
            self._end_of_decode_epoch()
        finally:
            while encoded:
                streams.synchronize(encoded.popleft()[0])
            if tracked is not None:
                tracked.close()
            _close(loader_batches)

    def _decoding_ahead(self, batches: Iterator[Any], loader_batches: Iterator[Any],
                        streams: Any, device: torch.device, side: Any) -> Iterator[Any]:
        """GPU decode's epoch on CUDA: each batch decoded and prepared on the side stream by a
        thread of its own, ``prefetch_depth`` ahead, and handed over as in :meth:`_ahead_epoch`.
        nvImageCodec's decode call returns only once its batch is decoded: in the consumer's
        thread it would hold the next step back, and a loop that waits for each step (GradScaler
        does) would leave the GPU idle while the next batch decodes."""
        writer = streams.current_stream(device)  # the stream that wrote GPU tensors of a batch
        # The encoded images of the batches decoded (handed over or waiting), with the event
        # after each: the decoder may still read their bytes (host memory) after its call
        # returned. The thread appends, this one lets go of those whose event has passed.
        encoded: deque[tuple[Any, list[Any]]] = deque()

        def prepared() -> Iterator[tuple[Any, Any]]:
            try:
                for batch in batches:
                    images = [get_at(batch, path) for path in encoded_paths(batch)]
                    try:
                        ready, copied = copy_on_side(streams, side, device, batch, self._prepare,
                                                     writer)
                    except BaseException:
                        # The decode may have queued work that reads the bytes before it failed.
                        encoded.append((streams.record_event(side), images))
                        raise
                    encoded.append((copied, images))
                    del batch, images
                    yield ready, copied
            finally:
                _close(loader_batches)

        background = BackgroundIterator(prepared(), prefetch_depth=self.prefetch_depth,
                                        name="fastpipe-DataPrefetcher-decode")
        try:
            for batch, copied in background:
                while encoded and streams.query(encoded[0][0]):
                    encoded.popleft()
                if batch is _NOTHING:  # every sample of it left out by the GPU decode
                    continue
                hand_to_current(streams, device, batch, copied)
                yield batch
            self._end_of_decode_epoch()
        finally:
            background.close()
            while encoded:
                streams.synchronize(encoded.popleft()[0])

    def _prepared_epoch(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The epoch's batches prepared on the device (the CPU path's background thread), those
        whose every sample the GPU decode left out passed over."""
        for batch in batches:
            prepared = self._prepare(batch, self.device)
            if prepared is not _NOTHING:
                yield prepared
        self._end_of_decode_epoch()

    def _prepare(self, batch: Any, device: torch.device) -> Any:
        """Decodes the batch's encoded images (GPU decode), moves every tensor of ``batch`` to
        ``device``, normalizes its images there and runs ``batch_transform``."""
        paths = encoded_paths(batch)
        if paths:
            batch = self._decoded(batch, paths, device)
            if batch is _NOTHING:
                return _NOTHING
        elif self._gpu_decode_asked and not self._decoders and not self._warned_nothing_encoded:
            self._warned_nothing_encoded = True
            warnings.warn(
                "DataPrefetcher(gpu_decode=...) was given, and the batches hold no encoded "
                "images, so nothing decodes on the GPU: build the dataset with decode='gpu' (and "
                "collate with fastpipe.data.fast_collate), or leave gpu_decode out",
                UserWarning, stacklevel=2)

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if self._streams is not None:
                return self._streams.to_device(tensor, device, self.non_blocking)
            return tensor.to(device)

        moved = map_tensors(move, batch)
        if not (self.normalizes or self.batch_transform is not None):
            return moved
        images = image_paths(moved, self.image_key)
        if self.normalizes:
            unchecked: list[tuple[torch.Tensor, str]] = []
            for where in images:
                normalized = self._normalize_entry(moved, where, device, unchecked)
                moved = replace_at(moved, where, normalized)
            if unchecked:
                self._check_unit_range(unchecked)
        if self.batch_transform is not None:
            moved = self._transform(moved, images)
        return moved

    def _transform(self, batch: Any, images: list[tuple[Any, ...]]) -> Any:
        targets = target_paths(batch, images, self.target_key)
        several_images = isinstance(self.image_key, (tuple, list))
        several_targets = isinstance(self.target_key, (tuple, list))

        def argument(paths: list[tuple[Any, ...]], several: bool) -> Any:
            values = tuple(get_at(batch, where) for where in paths)
            return values if several else values[0]

        out = self.batch_transform(argument(images, several_images),
                                   argument(targets, several_targets))
        if self._handed_out is not None:
            self._handed_out.transformed()
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(
                "batch_transform must return a pair (images, targets), got "
                f"{type(out).__name__}"
            )
        for what, paths, several, value in (("images", images, several_images, out[0]),
                                            ("targets", targets, several_targets, out[1])):
            if several:
                if not isinstance(value, (tuple, list)) or len(value) != len(paths):
                    raise TypeError(
                        f"batch_transform was given {len(paths)} {what} entries as a tuple "
                        f"({', '.join(place(where) for where in paths)}) and must return "
                        f"{what} as a tuple of as many, got {type(value).__name__}"
                        + (f" of {len(value)}" if isinstance(value, (tuple, list)) else "")
                    )
                values = list(value)
            else:
                values = [value]
            for where, new in zip(paths, values):
                batch = replace_at(batch, where, new)
        return batch

    # GPU decode: the encoded images of a dataset built with decode="gpu".

    _restored_decode_skips: SkipRecord | None = None
    #: Where ``image_loader(decode="auto")`` chose to decode, and why
    #: (a ``fastpipe.profiling.decode_choice.DecodeChoice``); None otherwise.
    decode_choice: Any = None

    def _decoded(self, batch: Any, paths: list[tuple[Any, ...]], device: torch.device) -> Any:
        """``batch`` with each encoded entry decoded on ``device`` (on the stream current here:
        the side stream on CUDA), and without the rows a corrupt image left out (``on_error=
        "skip"`` of the wrapped loader); :data:`_NOTHING` when no row is left."""
        decoder = self._decoders.get(device)
        if decoder is None:
            decoder = self._decoders[device] = GpuDecoder(self.gpu_decode, device)
        stream = self._streams.current_stream(device) if self._streams is not None else None
        on_error = getattr(self.loader, "on_error", "raise")
        count = len(get_at(batch, paths[0]))
        results = [decoder.decode(get_at(batch, path), stream, on_error) for path in paths]
        self._record_decode_skips([s for result in results for s in result.skipped])
        keep: list[int] | None = None
        for result in results:  # rows every encoded entry kept (several image fields: all)
            if result.kept is not None:
                kept = set(result.kept)
                keep = [i for i in (keep if keep is not None else range(count)) if i in kept]
        if keep is not None and not keep:
            return _NOTHING
        for path, result in zip(paths, results):
            images = result.images
            if keep is not None:
                rows = result.kept if result.kept is not None else list(range(count))
                if rows != keep:
                    where = {row: k for k, row in enumerate(rows)}
                    images = images.index_select(0, index_on([where[i] for i in keep],
                                                             images.device))
            batch = replace_at(batch, path, images)
        if keep is not None:
            batch = without_rows(batch, keep, count, paths)
        self._report_fallbacks(decoder)
        return batch

    def _record_decode_skips(self, skipped: list[Skipped]) -> None:
        # A batch decoded again after a restore does not count its skips twice.
        seen = {entry.index for entry in self._decode_skips.entries}
        self._decode_skips.entries.extend(s for s in skipped if s.index not in seen)

    def _report_fallbacks(self, decoder: GpuDecoder) -> None:
        if self._warned_fallback or not decoder.stats.cpu:
            return
        self._warned_fallback = True
        reasons = "; ".join(f"{count}: {reason}" for reason, count in
                            decoder.stats.fallback_reasons.most_common(3))
        warnings.warn(
            f"DataPrefetcher: GPU decode decoded {decoder.stats.cpu} image(s) on the CPU instead "
            f"of the GPU so far ({reasons}); their pixels are the CPU path's. "
            "prefetcher.gpu_decode_stats counts them; this warning is shown once",
            RuntimeWarning, stacklevel=2)

    def _end_of_decode_epoch(self) -> None:
        """Warns, once at the end of the epoch, about the samples GPU decode left out."""
        self._decode_skips.report("DataPrefetcher")

    def _normalize_entry(self, batch: Any, where: tuple[Any, ...], device: torch.device,
                         unchecked: list[tuple[torch.Tensor, str]]) -> Any:
        """The images at ``where`` normalized: a 4-D batch, or a tuple or list of images (each
        ``(C, H, W)`` or ``(N, C, H, W)``: variable sizes) one by one."""
        images = get_at(batch, where)
        if is_image_sequence(images):
            out = []
            for index, image in enumerate(images):
                at = (*where, index)
                if isinstance(image, torch.Tensor) and image.dim() == 3:
                    out.append(self._normalize(image.unsqueeze(0), at, device, batch,
                                               unchecked).squeeze(0))
                else:
                    out.append(self._normalize(image, at, device, batch, unchecked,
                                               dims="3-D (C, H, W) or 4-D (N, C, H, W)"))
            return type(images)(out)
        return self._normalize(images, where, device, batch, unchecked)

    def _normalize(self, images: Any, where: tuple[Any, ...], device: torch.device,
                   batch: Any, unchecked: list[tuple[torch.Tensor, str]],
                   dims: str = "4-D (N, C, H, W) image batch") -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = (tuple(images.shape) if isinstance(images, torch.Tensor)
                     else type(images).__name__)
            raise TypeError(
                f"DataPrefetcher was asked to normalize {place(where)}, which is {shape}, not a "
                f"{dims}; {suggest_image_key(batch, exclude=[where])} to point at the images, "
                "or leave mean, std and dtype unset"
            )
        if images.dtype not in (torch.uint8, *_FLOAT_DTYPES):
            raise TypeError(
                f"DataPrefetcher was asked to normalize {place(where)} of dtype {images.dtype}; "
                f"images must be uint8 or floating point. "
                f"{suggest_image_key(batch, exclude=[where])} to point at the images"
            )
        if self.mean is None and self.dtype is None:
            return images.contiguous(memory_format=torch.channels_last)
        channels = images.shape[1]
        mean, std = self._host_stats(channels)
        for name, values in (("mean", mean), ("std", std)):
            if values.numel() != channels:
                raise ValueError(
                    f"{name} has {values.numel()} values but {place(where)} has {channels} "
                    f"channels (shape {tuple(images.shape)}); pass one {name} value per channel"
                )
        if self.mean is not None and images.dtype != torch.uint8 and not self._range_checked:
            unchecked.append((images, place(where)))
        mean, std = self._stats_on(device, mean, std)
        return normalize(
            images, mean, std, dtype=self.dtype or torch.float32, channels_last=self.channels_last
        )

    def _stats_on(self, device: torch.device, mean: torch.Tensor,
                  std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``mean`` and ``std`` on ``device``, copied there once per device and kept: a copy per
        batch would be two more host-to-device transfers each step, and one from pageable memory
        blocks the host until the stream has caught up. The copy is queued non-blocking from
        pinned memory, on the stream current here (the side stream on CUDA), before the kernel
        that reads it; the kept tensors are never freed, so no other stream can see their memory
        reused."""
        if self._streams is None or (mean.device == device and std.device == device):
            return mean, std
        cached = self._device_stats.get(device)
        if cached is None or cached[0] is not mean or cached[1] is not std:
            moved = tuple(
                self._streams.to_device(_pinned(values), device, non_blocking=True)
                for values in (mean, std)
            )
            cached = self._device_stats[device] = (mean, std, *moved)
        return cached[2], cached[3]

    def _host_stats(self, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
        # With dtype alone, zeros and ones made once per channel count (the device copies are
        # kept per pair of these tensors).
        if self.mean is not None:
            return self.mean, self.std
        cached = self._unit_stats.get(channels)
        if cached is None:
            cached = self._unit_stats[channels] = (torch.zeros(channels), torch.ones(channels))
        return cached

    def _check_unit_range(self, unchecked: list[tuple[torch.Tensor, str]]) -> None:
        # Once per epoch (the first batch with float images): reading the values back waits for
        # the device.
        self._range_checked = True
        for images, where in unchecked:
            if images.numel() == 0:
                continue
            low, high = (float(v) for v in torch.aminmax(images.detach()))
            if low < -_RANGE_SLACK or high > 1 + _RANGE_SLACK:
                warnings.warn(
                    f"DataPrefetcher: the float images in {where} range from {low:.3g} to "
                    f"{high:.3g}, outside [0, 1], and mean/std were given: they look normalized "
                    "already (e.g. by transforms.Normalize in the dataset), and would be "
                    "normalized twice. Either drop Normalize (and ToTensor: PILToTensor gives "
                    "uint8, cheaper to move) from the dataset's transforms, or leave mean and std "
                    "unset here",
                    UserWarning,
                    stacklevel=2,
                )
                return

    def _fastpipe_describe(self) -> dict[str, Any]:
        """Tells ``fastpipe.profile`` what this is: a prefetcher over ``self.loader``."""
        return {"prefetcher": True, "wraps": self.loader}

    # Resume: the wrapped loader's state at the last batch handed to the training loop; the
    # batches prepared ahead (on the side stream, or in the queue) come again.

    _handed_out: WrappedHandOff | None = None

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's state after the last batch the training loop received.

        ``{"version": 1, "loader": loader.state_dict() as it was then}``. The loader must have
        ``state_dict()`` / ``load_state_dict()`` (DataLoaderX, torchdata's StatefulDataLoader).
        With a ``batch_transform`` that has ``state_dict()`` (``fastpipe.ops.Mixup``,
        ``RandomErasing`` with a generator), its state after that batch too, under
        ``"batch_transform"``: the batches transformed ahead come again with the same draws.
        """
        handed = self._handed_out
        loader_state = handed.loader_state() if handed is not None else None
        if loader_state is None:
            loader_state = _loader_method(self.loader, "state_dict")()
        state = {"version": STATE_VERSION, "loader": loader_state}
        if self._decode_skips.entries:
            state["gpu_decode_skipped"] = self._decode_skips.state()
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
        skipped = state.get("gpu_decode_skipped")
        self._restored_decode_skips = SkipRecord.from_state(skipped) if skipped else None
        self._close_epoch()
        self._handed_out = None


def _first(batches: Iterator[Any]) -> Any:
    """The first item of ``batches``, or :data:`_NOTHING` when there is none."""
    try:
        return next(batches)
    except StopIteration:
        return _NOTHING


def _close(closable: Any) -> None:
    """Closes ``closable`` where it can be closed (a loader or its iterator: their workers shut
    down; an epoch: its thread)."""
    close = getattr(closable, "close", None)
    if callable(close):
        close()


def _pinned(values: torch.Tensor) -> torch.Tensor:
    """A page-locked copy of a host tensor, so its copy to the GPU is queued without a sync;
    as it is where nothing can pin (a tensor on a device; no CUDA driver)."""
    if values.device.type != "cpu" or not torch.cuda.is_available():
        return values
    return values.contiguous().pin_memory()


def _loader_method(loader: Any, name: str) -> Any:
    method = getattr(loader, name, None)
    if not callable(method):
        raise TypeError(
            f"DataPrefetcher.{name}() needs a loader with state_dict() and load_state_dict(), "
            f"and {type(loader).__name__} has no {name}(); wrap a fastpipe.DataLoaderX (or "
            "torchdata's StatefulDataLoader)"
        )
    return method
