"""DALILoader: a DALI pipeline that iterates like a DataLoader.

How it works. One DALI pipeline lives as long as the loader (built at the first ``iter()``) and
reads its input through ``fn.external_source``: a background thread walks an endless plan of
epochs (``fastpipe.data.shard_order`` for this rank, epoch after epoch) and reads each batch's
encoded bytes ahead; DALI pulls one batch per scheduled run. Every batch fed is tagged (generation,
epoch, batch number), and the tags come back out in the same order as DALI's outputs. So:

* an epoch ends exactly where its samples end: the last batch is partial (or dropped), never
  padded with copies or topped up with next-epoch samples (the trap of DALI#4686), and the next
  epoch's first batches are already prefetched;
* ``break`` costs nothing: the next ``iter()`` restarts the plan at the new epoch (a new
  generation) and throws away the few batches already inside DALI; no draining of the rest of
  the epoch, no rebuild;
* shuffling and sharding are ours, so each epoch is a fresh permutation of the whole dataset,
  split across ranks like ``DistributedSampler``.

DALI's own reader (``fn.readers.file``) cannot do the last two: it can't restart mid-epoch, and
its per-epoch shuffling is a bounded buffer over contiguous shards. It is still what
:func:`fastpipe.dali.image_pipeline` uses for a folder when you drive the pipeline yourself.

Resuming. The order and the position are ours (epoch, batches delivered); the augmentation
randomness is DALI's, restored with DALI's own checkpointing (``enable_checkpointing=True``,
``pipe.checkpoint()`` is the state after the last output taken out of the pipeline, so the
batches still in DALI's prefetch queue are produced again, with the same draws, after a restore).
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import os
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import nvidia.dali
import torch
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.pytorch import feed_ndarray

from fastpipe import _validate as check
from fastpipe._background import BackgroundIterator
from fastpipe._compat import shutdown_dali_pipeline
from fastpipe._constants import (
    DEFAULT_CROP_PCT,
    DEFAULT_CUTOUT_SIZE,
    DEFAULT_HFLIP,
    DEFAULT_INTERPOLATION,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    DEFAULT_SIZE,
)
from fastpipe._seed import checked_seed, draw_seed, order_seed
from fastpipe.dali.pipelines import build_pipeline, dali_device_id, dali_recipe
from fastpipe.dali.sources import EncodedSource, open_source
from fastpipe.data.sampling.resume import STATE_VERSION, check_loader_state, dataset_fingerprint
from fastpipe.recipe import Recipe

_TORCH_DTYPES = {
    "FLOAT": torch.float32, "FLOAT16": torch.float16, "UINT8": torch.uint8, "INT64": torch.int64,
}


@dataclass(frozen=True)
class _Tag:
    generation: int
    epoch: int
    batch: int
    indices: np.ndarray = field(compare=False)


def _read_plan(
    source: EncodedSource, generation: int, epoch: int, start: int
) -> Iterator[tuple[_Tag, list, np.ndarray]]:
    # A module-level generator holding only the source: the reader thread must not keep the
    # feeder (and through it the loader) alive.
    while True:
        for number, indices in enumerate(source.batches(epoch)):
            if number < start:
                continue
            data, labels = source.read(indices)
            yield _Tag(generation, epoch, number, indices), data, labels
        epoch += 1
        start = 0


class _Feeder:
    """``fn.external_source``'s callback: the next batch of the plan, with its tag recorded."""

    def __init__(self, source: EncodedSource, read_ahead: int) -> None:
        self.source = source
        self.read_ahead = read_ahead
        self.in_flight: collections.deque[_Tag] = collections.deque()  # fed, not yet output
        self.generation = 0
        # What the last call raised, to tell it from DALI's own errors.
        self.failed: BaseException | None = None
        self._reader: Iterator | None = None

    def restart(self, epoch: int, start: int = 0) -> None:
        """Makes the next batch fed batch ``start`` of ``epoch``; batches fed before are stale."""
        self.close()
        self.generation += 1
        plan = _read_plan(self.source, self.generation, epoch, start)
        if self.read_ahead > 0:
            plan = BackgroundIterator(
                plan, prefetch_depth=self.read_ahead, name="fastpipe-dali-reader"
            )
        self._reader = plan

    def __call__(self) -> tuple[list[np.ndarray], np.ndarray]:
        try:
            tag, data, labels = next(self._reader)
        except BaseException as error:
            self.failed = error
            raise
        self.in_flight.append(tag)
        return data, labels

    def close(self) -> None:
        close = getattr(self._reader, "close", None)
        if close is not None:
            close()
        self._reader = None


def _dali_reason(message: str) -> str:
    """The part of a DALI pipeline error that says what went wrong, without the boilerplate."""
    lines = [line.strip() for line in message.splitlines()]
    if "encountered:" in lines:
        lines = lines[lines.index("encountered:") + 1:]
    boilerplate = ("Current pipeline object", "Critical error", "C++ context")
    kept = [line for line in lines if line and not line.startswith(boilerplate)]
    return " ".join(kept) or message.strip()


def _to_torch(
    batch: Any, device: torch.device, zero_copy: bool, stream: Any = None
) -> torch.Tensor:
    """A DALI output as a torch tensor on ``device``.

    ``zero_copy`` (CPU): through DLPack. Outputs of DALI's dynamic executor (its default) stay
    valid as long as something references them, and the capsule does.
    Otherwise a copy into memory of torch's allocator. On the GPU it is queued, non-blocking,
    on ``stream`` (torch's current stream, to which the outputs were bound): no host
    synchronisation; DALI frees its buffer in that stream's order, so after the copy; and the
    result is an ordinary torch CUDA tensor, so ``record_stream`` works on it (a DLPack view of
    DALI's memory would ignore ``record_stream``, and a consumer on another stream, such as
    DataPrefetcher's side stream, could read a buffer DALI had reused).
    """
    dense = batch.as_tensor()
    if zero_copy and device.type == "cpu":
        return torch.from_dlpack(dense)
    out = torch.empty(dense.shape(), dtype=_TORCH_DTYPES[dense.dtype.name], device=device)
    if device.type == "cuda":
        if stream is None:
            stream = torch.cuda.current_stream(device)
        # The argument types of DALI's own feed_ndarray: raw pointers as ctypes.c_void_p.
        dense.copy_to_external(
            ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(stream.cuda_stream),
            non_blocking=True,
        )
    else:
        feed_ndarray(dense, out)
    return out


class _PipelineFailure(RuntimeError):
    """DALI reported an error while producing a batch; the pipeline is unusable after it."""


_SOURCE_WARNING = "Checkpointing enabled in a pipeline with external source"


class _Runtime:
    """The live pipeline and its feeder; closing it ends DALI's threads and the reader thread."""

    def __init__(self, pipe: Pipeline, feeder: _Feeder, device: torch.device) -> None:
        self.pipe = pipe
        self.feeder = feeder
        self.device = device
        self.dynamic = bool(getattr(pipe, "exec_dynamic", False))
        # The legacy executor's copies run on a stream of their own (see _copied_apart).
        self.copy_stream: Any = None
        self.started = False
        # (epoch, batch) that comes out next, when the stream is at an epoch start.
        self.aligned: tuple[int, int] | None = None

    def start_epoch(self, epoch: int, start: int = 0) -> None:
        if self.aligned != (epoch, start):
            self.feeder.restart(epoch, start)
            self.aligned = (epoch, start)
        if not self.started:
            with warnings.catch_warnings():
                # The source is ours: the loader restores its position itself.
                warnings.filterwarnings("ignore", message=_SOURCE_WARNING)
                self.pipe.build()
            self.started = True
            self._dali(self.pipe.schedule_run)  # fills DALI's prefetch queue

    def _dali(self, call: Callable[[], Any]) -> Any:
        """Runs a pipeline call; DALI's errors become _PipelineFailure, the feeder's stay."""
        try:
            return call()
        except RuntimeError as error:
            if error is self.feeder.failed:
                raise
            raise _PipelineFailure(str(error)) from error

    def _share_outputs(self, stream: Any) -> Any:
        if stream is not None and self.dynamic:
            # Outputs bound to torch's current stream: no host synchronisation; the copy and
            # the training step queued on that stream run after DALI's work.
            return self._dali(lambda: self.pipe.share_outputs(cuda_stream=stream))
        return self._dali(self.pipe.share_outputs)

    def next_batch(self) -> tuple[_Tag, torch.Tensor, torch.Tensor]:
        self.aligned = None
        cuda = self.device.type == "cuda"
        while True:
            # Looked up per batch: the caller may switch streams between steps.
            stream = torch.cuda.current_stream(self.device) if cuda else None
            outputs = self._share_outputs(stream)
            tag = self.feeder.in_flight.popleft()
            fresh = tag.generation == self.feeder.generation
            if fresh and cuda and not self.dynamic:
                images, labels = self._copied_apart(outputs, stream)
            elif fresh:
                images = _to_torch(outputs[0], self.device, self.dynamic, stream)
                labels = _to_torch(outputs[1], self.device, self.dynamic, stream).view(-1)
            del outputs
            self.pipe.release_outputs()
            self._dali(self.pipe.schedule_run)
            if fresh:
                return tag, images, labels

    def _copied_apart(self, outputs: Any, current: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The legacy executor's GPU outputs, copied before DALI gets its buffers back.

        Its outputs are bound to no stream: release_outputs lets DALI write into them again at
        once, so the copies must have run by then. A copy queued on the current stream would run
        only after the step's work queued there; on a stream of the loader's own, the host waits
        for the copies alone. They are allocated on that stream and recorded on the current one,
        which reads them, so the allocator hands their memory out again only after that read.
        """
        if self.copy_stream is None:
            self.copy_stream = torch.cuda.Stream(device=self.device)
        with torch.cuda.stream(self.copy_stream):
            images = _to_torch(outputs[0], self.device, False, self.copy_stream)
            labels = _to_torch(outputs[1], self.device, False, self.copy_stream).view(-1)
        self.copy_stream.synchronize()
        for tensor in (images, labels):
            tensor.record_stream(current)
        return images, labels

    def checkpoint(self) -> bytes | None:
        """DALI's state after the last output taken out (None before the first build)."""
        if not self.started or self.pipe is None:
            return None
        return bytes(self.pipe.checkpoint())

    def close(self) -> None:
        self.feeder.close()
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            # Joins DALI's worker threads now rather than whenever the Pipeline is collected.
            shutdown_dali_pipeline(pipe)


class _State:
    # Held by the loader's finalizer, so it must not refer back to the loader.
    def __init__(self) -> None:
        self.runtime: _Runtime | None = None
        self.token = 0
        # DALI's state for the next pipeline built: from load_state_dict, or saved at close().
        self.checkpoint: bytes | None = None

    def close(self, keep_checkpoint: bool = True) -> None:
        runtime, self.runtime = self.runtime, None
        if runtime is not None:
            if keep_checkpoint:
                try:
                    saved = runtime.checkpoint()
                except Exception:  # noqa: BLE001 - a failed pipeline has no state worth keeping
                    saved = None
                if saved is not None:
                    self.checkpoint = saved
            runtime.close()


def _launched_world_size() -> int:
    # torchrun, Lightning and accelerate launchers set WORLD_SIZE in every process.
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else 1


class EpochSampler:
    """What a :class:`DALILoader` reads, described the way a ``DataLoader``'s sampler is.

    DALILoader draws its order itself (like ``DistributedSampler``: a permutation per epoch
    from ``seed`` and the epoch, this rank's share of it); this object exposes that to code
    that looks for ``loader.sampler``: ``len()`` is the samples per epoch on this rank,
    iterating gives the indices of the epoch the loader runs next, in order, and
    ``set_epoch(epoch)`` (which Lightning calls) sets the loader's next epoch.
    """

    def __init__(self, loader: DALILoader) -> None:
        self._loader = weakref.ref(loader)

    def _get(self) -> DALILoader:
        loader = self._loader()
        if loader is None:
            raise RuntimeError("the DALILoader of this sampler is gone")
        return loader

    @property
    def shuffle(self) -> bool:
        return self._get().shuffle

    @property
    def rank(self) -> int:
        return self._get().rank

    @property
    def world_size(self) -> int:
        return self._get().world_size

    @property
    def seed(self) -> int:
        return self._get()._source.seed

    @property
    def epoch(self) -> int:
        return self._get().epoch

    def set_epoch(self, epoch: int) -> None:
        self._get().set_epoch(epoch)

    def __len__(self) -> int:
        return self._get().num_samples

    def __iter__(self) -> Iterator[int]:
        loader = self._get()
        return iter(loader._source.indices(loader.epoch).tolist())

    def __repr__(self) -> str:
        loader = self._loader()
        if loader is None:
            return "EpochSampler(<loader gone>)"
        return (
            f"EpochSampler(shuffle={loader.shuffle}, rank {loader.rank}/{loader.world_size}, "
            f"{loader.num_samples} samples per epoch)"
        )


# What a state holds besides the loader's identity and its dataset.
_POSITION_KEYS = ("dali_version", "epoch", "batches_yielded", "exact", "order_seed",
                  "augment_seed", "dali_checkpoint")


def _bytes_tensor(data: bytes | None) -> torch.Tensor:
    # Bytes as a uint8 tensor: the state stays a dict of numbers, strings and tensors.
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


class DALILoader:
    """Image batches from a DALI pipeline, iterated like a ``DataLoader``.

    ``for images, labels in loader:`` runs one epoch, every time, with no ``reset()``: each
    sample of this rank's share exactly once, the last batch partial unless ``drop_last``.
    ``break`` is fine; the next ``iter()`` starts a fresh epoch. Each epoch is reshuffled.

    Args:
        source: an image folder (``root/<class>/<image>``), a list file of ``path label`` lines
            (relative paths from ``root``, else from the list file's folder), a
            :class:`~fastpipe.dali.FileList`, or an encoded dataset (``__len__`` and
            ``encoded(i) -> (1-D uint8 array of encoded bytes, int label)``, or any dataset with
            ``fetch=``).
        batch_size: samples per batch.
        train: train transforms (fused decode + random resized crop, optional auto-augment,
            jitter, flip and cutout) or eval (resize the shorter side to ``size / crop_pct``,
            centre crop).
        size: output side or ``(height, width)``.
        num_workers: DALI CPU threads.
        device: ``None`` (a GPU when torch and DALI see one, else DALI's CPU mode), ``"cpu"``,
            ``"gpu"``/``"cuda"``/``"cuda:N"`` (an error without a GPU). Without an index: torch's
            current device, or ``LOCAL_RANK``'s when the script left it at 0 (with a warning).
        shuffle: reshuffle every epoch; defaults to ``train``.
        drop_last: drop the last partial batch.
        seed: order and augmentation seed. ``None``: random (drawn from torch's generator), except
            that the order seed is 0 when sharded, so that all ranks agree on the permutation.
        dtype: ``torch.float32``/``torch.float16``, or ``torch.uint8`` raw 0-255 pixels.
        channels_last: ``(N, 3, H, W)`` batches with ``torch.channels_last`` strides (DALI's
            ``HWC`` output viewed as ``NCHW``, no copy).
        mean, std: per channel, 0-1 scale; ``None`` (default): no normalization, float outputs
            are 0-1. ``fastpipe.IMAGENET_MEAN``/``IMAGENET_STD`` for ImageNet's.
        rank, world_size: this rank's share; by default from ``torch.distributed`` when it is
            initialized, else the whole dataset. Shards follow ``DistributedSampler``: disjoint
            and covering the dataset when its size divides by ``world_size``, otherwise every
            rank still gets the same count (``drop_last=False`` repeats at most
            ``world_size - 1`` samples, ``True`` leaves as many out), so all ranks run the same
            number of steps.
        root: base folder for relative paths of a list file.
        scale, ratio, hflip, color_jitter, crop_pct, interpolation, auto_augment, cutout_holes,
            cutout_size: see :func:`fastpipe.dali.image_pipeline`. ``auto_augment="augmix"`` is
            refused here (DALI has no AugMix; the fast CPU path runs it).
        prefetch_depth: batches DALI prepares ahead; a reader thread reads as many batches of
            encoded bytes ahead of DALI.
        fetch: ``fetch(index) -> (data, label)`` to read a dataset without ``encoded()``.
        recipe: a :class:`~fastpipe.Recipe` instead of the image keywords (``train``, ``size``,
            ``scale`` ... ``cutout_size``, ``mean``, ``std``, ``dtype``, ``channels_last``); not
            both. What DALI cannot run (AugMix, timm's mstd) is refused here.
        crop_decode: train: decode only the random crop window (DALI's fused
            ``decoders.image_random_crop``, the default and the fastest). ``False``: decode whole
            images, then crop and resize them with ``fn.random_resized_crop`` on the GPU (on the
            CPU in DALI's CPU mode): the workaround when the fused GPU decode fails with
            nvImageCodec 0.9 (NVIDIA/nvImageCodec#55: ``INTERNAL_ERROR`` or a crash). The same
            crop distribution, other random draws. No effect on eval.

    Yields:
        ``images``: ``(N, 3, H, W)`` of ``dtype`` on :attr:`device`; ``labels``: ``(N,)`` int64
        on :attr:`device`.

    Like a ``DataLoader`` it has ``dataset``, ``sampler`` (an :class:`EpochSampler` describing
    the order), ``batch_sampler`` (``None``: DALI forms the batches), ``batch_size``,
    ``drop_last``, ``num_workers``, ``len()`` and ``set_epoch``; and ``state_dict()`` /
    ``load_state_dict()`` to resume mid-epoch with the same batches.

    The pipeline and its threads live until :meth:`close` (or ``with``, or garbage collection),
    so the next epoch's first batches are ready when it starts. A new ``iter()`` ends the epoch
    iterator before it.
    """

    def __init__(
        self,
        source: Any,
        *,
        batch_size: int,
        train: bool = True,
        size: int | Sequence[int] = DEFAULT_SIZE,
        num_workers: int = 2,
        device: str | int | torch.device | None = None,
        shuffle: bool | None = None,
        drop_last: bool = False,
        seed: int | None = None,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        root: str | os.PathLike | None = None,
        scale: Sequence[float] = DEFAULT_SCALE,
        ratio: Sequence[float] = DEFAULT_RATIO,
        hflip: float = DEFAULT_HFLIP,
        color_jitter: float | Sequence[float] | None = None,
        crop_pct: float = DEFAULT_CROP_PCT,
        interpolation: Any = DEFAULT_INTERPOLATION,
        auto_augment: str | None = None,
        cutout_holes: int = 0,
        cutout_size: int = DEFAULT_CUTOUT_SIZE,
        prefetch_depth: int = 2,
        fetch: Callable[[int], tuple[Any, Any]] | None = None,
        recipe: Recipe | None = None,
        crop_decode: bool = True,
    ) -> None:
        batch_size = check.positive_int("batch_size", batch_size)
        num_workers = check.positive_int("num_workers", num_workers)
        prefetch_depth = check.positive_int("prefetch_depth", prefetch_depth)
        self.recipe = dali_recipe(
            recipe, DALILoader.__init__, "DALILoader", train=train, size=size, scale=scale,
            ratio=ratio, hflip=hflip, color_jitter=color_jitter, crop_pct=crop_pct,
            interpolation=interpolation, auto_augment=auto_augment, mean=mean, std=std,
            dtype=dtype, channels_last=channels_last, cutout_holes=cutout_holes,
            cutout_size=cutout_size,
        )
        self._device_id = dali_device_id(device)
        if self._device_id is None:
            self.device = torch.device("cpu")
        else:
            self.device = torch.device("cuda", self._device_id)

        if isinstance(source, (str, os.PathLike)):
            source = open_source(source, root=root)
        elif root is not None:
            raise ValueError("root= applies to a list file source only")
        self.dataset = source
        self.classes: list[str] | None = getattr(source, "classes", None)
        self.rank, self.world_size = check.rank_and_world_size(rank, world_size)
        self._shards_from_group = rank is None
        if self._shards_from_group and self.world_size == 1 and _launched_world_size() > 1:
            warnings.warn(
                f"WORLD_SIZE={_launched_world_size()} but torch.distributed is not initialized "
                "yet, so this DALILoader reads the whole dataset on every rank; build it after "
                "init_process_group (in Lightning: in train_dataloader()) or pass rank= and "
                "world_size=",
                RuntimeWarning,
                stacklevel=2,
            )
        self.shuffle = self.recipe.train if shuffle is None else bool(shuffle)
        self.drop_last = bool(drop_last)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.prefetch_depth = prefetch_depth
        if not isinstance(crop_decode, bool):
            raise TypeError(f"crop_decode must be True or False, got {crop_decode!r}")
        self.crop_decode = crop_decode
        seed = checked_seed(seed, where="DALILoader")
        augment_seed = draw_seed() if seed is None else seed
        # Each rank draws its own augmentations; DALI takes seeds below 2**31.
        self._augment_seed = int(
            np.random.SeedSequence([augment_seed, self.rank]).generate_state(1)[0] % 2**31
        )
        self._source = EncodedSource(
            source, batch_size=batch_size, shuffle=self.shuffle,
            seed=order_seed(seed, self.world_size),
            rank=self.rank, world_size=self.world_size, drop_last=self.drop_last, fetch=fetch,
        )
        if len(self._source) == 0:
            raise ValueError(
                f"no batches: this shard has {self._source.num_samples} samples per epoch, "
                f"fewer than batch_size={batch_size}, and drop_last=True drops them"
            )
        self.sampler = EpochSampler(self)
        self.batch_sampler = None
        self._fingerprint: str | None = None
        self._next_epoch = 0
        # (epoch, batch) where the next iter() resumes, set by load_state_dict.
        self._resume: tuple[int, int] | None = None
        # [epoch, batches delivered] of the latest epoch iterator.
        self._progress: list[int] | None = None
        self._state = _State()
        # A collected loader has no one to resume it: no checkpoint to save.
        self._finalizer = weakref.finalize(self, self._state.close, False)

    @property
    def num_samples(self) -> int:
        """Samples this rank reads per epoch (before ``drop_last``)."""
        return self._source.num_samples

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self._source)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs (0 at the start)."""
        return self._resume[0] if self._resume is not None else self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter()`` run ``epoch`` from its start (``DistributedSampler``'s
        name; Lightning calls it through :attr:`sampler`)."""
        epoch = check.non_negative_int("epoch", epoch)
        if self._resume is not None and self._resume[0] == epoch:
            return  # a resumed epoch continues where it stopped
        self._resume = None
        self._progress = None
        self._next_epoch = epoch

    def _new_pipeline(
        self, feeder: Callable, *, decode_device: str | None = None,
        checkpoint: bytes | None = None,
    ) -> Pipeline:
        """An unbuilt pipeline fed by ``feeder``; ``decode_device`` overrides the device's."""
        if decode_device is None:
            decode_device = "cpu" if self._device_id is None else "mixed"
        extra: dict[str, Any] = {"enable_checkpointing": True}
        if checkpoint is not None:
            extra["checkpoint"] = checkpoint
        return build_pipeline(
            feeder, recipe=self.recipe, batch_size=self.batch_size,
            num_workers=self.num_workers, device_id=self._device_id,
            decode_device=decode_device, seed=self._augment_seed,
            prefetch_depth=self.prefetch_depth, crop_decode=self.crop_decode, **extra,
        )

    def _runtime(self) -> _Runtime:
        state = self._state
        if state.runtime is None:
            feeder = _Feeder(self._source, self.prefetch_depth)
            pipe = self._new_pipeline(feeder, checkpoint=state.checkpoint)
            state.checkpoint = None  # the live pipeline carries the state from here on
            state.runtime = _Runtime(pipe, feeder, self.device)
        return state.runtime

    def _check_shards(self) -> None:
        """Refuses to run unsharded when the process group appeared after construction."""
        if not self._shards_from_group:
            return
        now = check.rank_and_world_size(None, None)
        if now != (self.rank, self.world_size):
            raise RuntimeError(
                f"this DALILoader was built as rank {self.rank} of {self.world_size}, but "
                f"torch.distributed now says rank {now[0]} of {now[1]}: it was built before "
                "init_process_group and would give every rank the wrong share. Build it after "
                "init_process_group (in Lightning: in train_dataloader()), or pass rank= and "
                "world_size="
            )

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._check_shards()
        if self._resume is not None:
            epoch, start = self._resume
            self._resume = None
            self._next_epoch = epoch
        else:
            epoch, start = self._next_epoch, 0
        self._next_epoch = epoch + 1
        self._state.token += 1
        self._progress = [epoch, start]
        runtime = self._runtime()
        try:
            runtime.start_epoch(epoch, start)
        except BaseException:
            self._state.close(keep_checkpoint=False)
            raise
        return _EpochIterator(self, epoch, self._state.token, start)

    def _next_batch(self, token: int) -> tuple[_Tag, torch.Tensor, torch.Tensor]:
        state = self._state
        if token != state.token or state.runtime is None:
            raise RuntimeError(
                "this epoch iterator has ended: a newer iter(loader) started another epoch, or "
                "the loader was closed"
            )
        runtime = state.runtime
        try:
            return runtime.next_batch()
        except _PipelineFailure as error:
            suspects = list(runtime.feeder.in_flight)
            state.close(keep_checkpoint=False)
            raise self._explain(error, suspects) from error.__cause__
        except BaseException:
            state.close(keep_checkpoint=False)
            raise

    def _explain(self, error: RuntimeError, suspects: list[_Tag]) -> Exception:
        """A DALI failure as an error naming the sample, found among the batches in flight."""
        from fastpipe.data import CorruptImageError, decode_rgb

        reason = _dali_reason(str(error))
        for tag in suspects:
            for index in tag.indices:
                name = self._source.describe(int(index))
                try:
                    (data,), _ = self._source.read(np.asarray([index]))
                    decode_rgb(data, name)
                except (CorruptImageError, FileNotFoundError, TypeError) as bad:
                    return type(bad)(
                        f"{bad} (DALI reported: {reason}). Remove or replace this image; for a "
                        "list file, drop its line"
                    )
        epoch = suspects[0].epoch if suspects else "?"
        return RuntimeError(f"DALI failed in epoch {epoch}: {reason}")

    # ---- resume ------------------------------------------------------------------------------

    def _dataset_fingerprint(self) -> dict[str, Any]:
        # Once per loader: a fingerprint may hash every path.
        if self._fingerprint is None:
            self._fingerprint = dataset_fingerprint(self.dataset)
        return dict(self._fingerprint)

    def _identity(self) -> dict[str, Any]:
        """What a state must agree on, besides its dataset, to apply to this loader."""
        return {
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "rank": self.rank,
            "world_size": self.world_size,
            "decode_device": "cpu" if self._device_id is None else "mixed",
            "recipe": hashlib.sha256(repr(self.recipe).encode()).hexdigest()[:16],
        }

    def _position(self) -> tuple[int, int]:
        if self._resume is not None:
            return self._resume
        if self._progress is not None and self._progress[1] < len(self):
            return self._progress[0], self._progress[1]
        return self._next_epoch, 0

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is, as a plain dict (``torch.save`` and DCP take it).

        Taken after the training loop received batch ``k`` of an epoch, the restored loader's
        next ``iter()`` yields batch ``k + 1`` of that epoch, and every later batch, exactly as
        this loader would have (``torch.equal``), including the batches that were already in
        DALI's prefetch queue. Between epochs it points at the next epoch's first batch.
        """
        epoch, done = self._position()
        runtime = self._state.runtime
        exact = True
        try:
            checkpoint = runtime.checkpoint() if runtime is not None else None
        except Exception as error:  # noqa: BLE001 - any DALI failure: resume the order only
            warnings.warn(
                f"DALI could not save its state ({_dali_reason(str(error))}); a loader restored "
                "from this state reads the same samples in the same order, but its augmentation "
                "draws will differ from this run's",
                RuntimeWarning,
                stacklevel=2,
            )
            checkpoint, exact = None, False
        if checkpoint is None and exact:
            checkpoint = self._state.checkpoint
        return {
            "version": STATE_VERSION,
            "dataset": self._dataset_fingerprint(),
            **self._identity(),
            "dali_version": nvidia.dali.__version__,
            "epoch": epoch,
            "batches_yielded": done,
            "exact": exact,
            "order_seed": self._source.seed,
            "augment_seed": self._augment_seed,
            "dali_checkpoint": _bytes_tensor(checkpoint),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict`: the next ``iter()`` continues where it was taken.

        Refuses (``ValueError``; ``TypeError`` for what is not such a dict) a state of another
        version, of another dataset (length, or the fingerprint of its paths and labels), or of a
        loader that would produce other batches: batch size, ``drop_last``, ``shuffle``, the
        recipe, CPU vs GPU decoding, ``rank`` and ``world_size``, the checks every fastpipe
        loader shares (fastpipe.data.sampling.resume). The pipeline is rebuilt at the next
        ``iter()``.
        """
        mine = self._identity()
        check_loader_state(state, self.dataset, "DALILoader",
                           entries=(*mine, *_POSITION_KEYS))
        for key, value in mine.items():
            theirs = state.get(key)
            if theirs != value:
                hint = ""
                if key == "world_size":
                    hint = (
                        "; DALILoader resumes only with the same world size (each rank's share "
                        "and position differ otherwise): restart the epoch with set_epoch"
                    )
                raise ValueError(
                    f"cannot load this DALILoader state: its {key} is {theirs!r}, this loader's "
                    f"is {value!r}{hint}"
                )
        epoch, done = int(state["epoch"]), int(state["batches_yielded"])
        if epoch < 0 or not 0 <= done <= len(self):
            raise ValueError(f"bad position in the state: epoch {epoch}, batch {done}")
        if state.get("dali_version") != nvidia.dali.__version__:
            warnings.warn(
                f"this state was saved with DALI {state.get('dali_version')}, this is DALI "
                f"{nvidia.dali.__version__}: the order resumes exactly, the augmentation draws "
                "may differ from the interrupted run",
                RuntimeWarning,
                stacklevel=2,
            )
        if not state.get("exact", True):
            warnings.warn(
                "this state has no DALI checkpoint (DALI could not save one): the order resumes "
                "exactly, the augmentation draws differ from the interrupted run",
                RuntimeWarning,
                stacklevel=2,
            )
        checkpoint = state["dali_checkpoint"]
        self._state.token += 1
        self._state.close(keep_checkpoint=False)
        self._state.checkpoint = bytes(checkpoint.numpy().tobytes()) if checkpoint.numel() else None
        self._source.seed = int(state["order_seed"])
        self._augment_seed = int(state["augment_seed"])
        self._progress = None
        self._resume = (epoch, done) if done < len(self) else (epoch + 1, 0)
        self._next_epoch = self._resume[0]

    def close(self) -> None:
        """Stops the pipeline and the reader thread now. Iterating again builds a new pipeline
        (which continues the augmentation randomness where this one stopped)."""
        self._state.token += 1
        self._state.close()

    def __enter__(self) -> DALILoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "train" if self.recipe.train else "eval"
        return (
            f"DALILoader({self.dataset!r}, {mode}, batch_size={self.batch_size}, {len(self)} "
            f"batches, device={self.device}, rank {self.rank}/{self.world_size})"
        )

    def _fastpipe_describe(self) -> dict[str, Any]:
        """Tells ``fastpipe.profile`` what this is and the settings its advice uses."""
        return {"kind": "DALILoader", "batch_size": self.batch_size,
                "dataset": type(self.dataset).__name__}


class _EpochIterator:
    """One epoch of a :class:`DALILoader`; ``len()`` is the number of batches left."""

    def __init__(self, loader: DALILoader, epoch: int, token: int, start: int = 0) -> None:
        self._loader = loader
        self.epoch = epoch
        self._token = token
        self._length = len(loader)
        self._batch = start

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return self._length - self._batch

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._batch >= self._length:
            raise StopIteration
        loader = self._loader
        tag, images, labels = loader._next_batch(self._token)
        if (tag.epoch, tag.batch) != (self.epoch, self._batch):  # pragma: no cover - invariant
            raise AssertionError(f"expected batch {self._batch} of epoch {self.epoch}, got {tag}")
        self._batch += 1
        if self._token == loader._state.token and loader._progress is not None:
            loader._progress[1] = self._batch
        if self._batch == self._length:
            # The plan runs on into the next epoch, so its first batches are already in flight.
            runtime = loader._state.runtime
            if runtime is not None:
                runtime.aligned = (self.epoch + 1, 0)
        if loader.recipe.channels_last:
            # DALI's HWC samples viewed as NCHW: torch.channels_last strides, no copy.
            images = images.permute(0, 3, 1, 2)
        return images, labels
