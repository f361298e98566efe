"""DALILoader: a DALI pipeline that iterates like a DataLoader.

How it works. One DALI pipeline lives as long as the loader (built at the first ``iter()``) and
reads its input through ``fn.external_source``: a background thread walks an endless plan of
epochs (``shard_indices`` order for this rank, epoch after epoch) and reads each batch's encoded
bytes ahead; DALI pulls one batch per scheduled run. Every batch fed is tagged (generation,
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
"""

from __future__ import annotations

import collections
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.pytorch import feed_ndarray

from fastpipe._background import BackgroundIterator
from fastpipe._compat import shutdown_dali_pipeline
from fastpipe.dali.pipelines import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Transform,
    build_pipeline,
    resolve_device,
)
from fastpipe.dali.sources import EncodedSource, open_source

_TORCH_DTYPES = {
    "FLOAT": torch.float32, "FLOAT16": torch.float16, "UINT8": torch.uint8, "INT64": torch.int64,
}


@dataclass(frozen=True)
class _Tag:
    generation: int
    epoch: int
    batch: int
    indices: np.ndarray = field(compare=False)


def _read_plan(source: EncodedSource, generation: int, epoch: int) -> Iterator[tuple[_Tag, list, np.ndarray]]:
    # A module-level generator holding only the source: the reader thread must not keep the
    # feeder (and through it the loader) alive.
    while True:
        for number, indices in enumerate(source.batches(epoch)):
            data, labels = source.read(indices)
            yield _Tag(generation, epoch, number, indices), data, labels
        epoch += 1


class _Feeder:
    """``fn.external_source``'s callback: the next batch of the plan, with its tag recorded."""

    def __init__(self, source: EncodedSource, read_ahead: int) -> None:
        self.source = source
        self.read_ahead = read_ahead
        self.in_flight: collections.deque[_Tag] = collections.deque()  # fed, not yet output
        self.generation = 0
        self.failed: BaseException | None = None  # what the last call raised, to tell it from DALI's errors
        self._reader: Iterator | None = None

    def restart(self, epoch: int) -> None:
        """Makes the next batch fed the first of ``epoch``; batches fed before are stale."""
        self.close()
        self.generation += 1
        plan = _read_plan(self.source, self.generation, epoch)
        if self.read_ahead > 0:
            plan = BackgroundIterator(plan, max_prefetch=self.read_ahead, name="fastpipe-dali-reader")
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
    kept = [line for line in lines if line and not line.startswith(("Current pipeline object", "Critical error", "C++ context"))]
    return " ".join(kept) or message.strip()


def _to_torch(batch: Any, device: torch.device, zero_copy: bool) -> torch.Tensor:
    dense = batch.as_tensor()
    if zero_copy:
        # CPU outputs of DALI's dynamic executor (its default) stay valid as long as something
        # references them, and the DLPack capsule does: no copy, which saves ~15 ms per batch
        # of 64 float images at 224 on one core.
        return torch.from_dlpack(dense)
    out = torch.empty(dense.shape(), dtype=_TORCH_DTYPES[dense.dtype.name], device=device)
    # Copy the way DALI's own PyTorch iterator does; on the GPU ordered on torch's current
    # stream, so the training step that follows on that stream sees finished data without a
    # host synchronisation.
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(dense, out, cuda_stream=stream)
    return out


class _PipelineFailure(RuntimeError):
    """DALI reported an error while producing a batch; the pipeline is unusable after it."""


class _Runtime:
    """The live pipeline and its feeder; closing it ends DALI's threads and the reader thread."""

    def __init__(self, pipe: Pipeline, feeder: _Feeder, device: torch.device) -> None:
        self.pipe = pipe
        self.feeder = feeder
        self.device = device
        self.zero_copy = device.type == "cpu" and bool(getattr(pipe, "exec_dynamic", False))
        self.started = False
        # The epoch whose first batch comes out next, when the stream is at an epoch start.
        self.aligned_epoch: int | None = None

    def start_epoch(self, epoch: int) -> None:
        if self.aligned_epoch != epoch:
            self.feeder.restart(epoch)
            self.aligned_epoch = epoch
        if not self.started:
            self.pipe.build()
            self.started = True
            self._dali(self.pipe.schedule_run)  # fills DALI's prefetch queue

    def _dali(self, call: Callable[[], Any]) -> Any:
        """Runs a pipeline call; DALI's own errors become _PipelineFailure, the feeder's stay as they are."""
        try:
            return call()
        except RuntimeError as error:
            if error is self.feeder.failed:
                raise
            raise _PipelineFailure(str(error)) from error

    def next_batch(self) -> tuple[_Tag, torch.Tensor, torch.Tensor]:
        self.aligned_epoch = None
        while True:
            outputs = self._dali(self.pipe.share_outputs)
            tag = self.feeder.in_flight.popleft()
            fresh = tag.generation == self.feeder.generation
            if fresh:
                images = _to_torch(outputs[0], self.device, self.zero_copy)
                labels = _to_torch(outputs[1], self.device, self.zero_copy).view(-1)
            del outputs
            self.pipe.release_outputs()
            self._dali(self.pipe.schedule_run)
            if fresh:
                return tag, images, labels

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

    def close(self) -> None:
        runtime, self.runtime = self.runtime, None
        if runtime is not None:
            runtime.close()


def _resolve_shards(shard_id: int | None, num_shards: int | None) -> tuple[int, int]:
    if (shard_id is None) != (num_shards is None):
        raise ValueError("pass both shard_id and num_shards, or neither (then torch.distributed decides)")
    if shard_id is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"need 0 <= shard_id < num_shards, got shard_id={shard_id}, num_shards={num_shards}")
    return int(shard_id), int(num_shards)


def _random_seed() -> int:
    # From torch's generator, like DataLoader's base seed, so torch.manual_seed reproduces it.
    return int(torch.empty((), dtype=torch.int64).random_().item()) % 2**31


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
        train: train transforms (fused decode + random resized crop, flip, optional jitter and
            cutout) or eval (resize the shorter side to ``size / crop_pct``, centre crop).
        size: output side or ``(height, width)``.
        num_threads: DALI CPU threads.
        device: ``"auto"`` (GPU when torch and DALI see one, else DALI's CPU mode), ``"cpu"``,
            ``"gpu"``/``"cuda"``/``"cuda:N"`` (an error without a GPU).
        shuffle: reshuffle every epoch; defaults to ``train``.
        drop_last: drop the last partial batch.
        seed: order and augmentation seed. ``None``: random (drawn from torch's generator), except
            that the order seed is 0 when sharded, so that all ranks agree on the permutation.
        dtype: ``torch.float32``/``torch.float16`` normalized, or ``torch.uint8`` raw pixels.
        layout: ``"NCHW"`` or ``"NHWC"``.
        mean, std: per channel, 0-1 scale.
        shard_id, num_shards: this rank's share; by default from ``torch.distributed`` when it is
            initialized (rank, world size), else the whole dataset. Shards follow
            ``DistributedSampler``: disjoint and covering the dataset when its size divides by
            ``num_shards``, otherwise every rank still gets the same count (``drop_last=False``
            repeats at most ``num_shards - 1`` samples, ``True`` leaves as many out), so all ranks
            run the same number of steps.
        root: base folder for relative paths of a list file.
        scale, ratio, flip, color_jitter, crop_pct, cutout, cutout_size: see
            :func:`fastpipe.dali.image_pipeline`.
        prefetch_queue_depth: batches DALI prepares ahead.
        read_ahead: batches of encoded bytes a background thread reads ahead (0: read in the
            calling thread).
        fetch: ``fetch(index) -> (data, label)`` to read a dataset without ``encoded()``.

    Yields:
        ``images``: ``(N, 3, H, W)`` (or ``(N, H, W, 3)``) of ``dtype`` on :attr:`device`;
        ``labels``: ``(N,)`` int64 on :attr:`device`.

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
        size: int | Sequence[int] = 224,
        num_threads: int = 2,
        device: str | int | torch.device = "auto",
        shuffle: bool | None = None,
        drop_last: bool = False,
        seed: int | None = None,
        dtype: torch.dtype = torch.float32,
        layout: str = "NCHW",
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        shard_id: int | None = None,
        num_shards: int | None = None,
        root: str | os.PathLike | None = None,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        color_jitter: float | Sequence[float] | None = None,
        crop_pct: float = 0.875,
        cutout: float = 0.0,
        cutout_size: float = 0.5,
        prefetch_queue_depth: int = 2,
        read_ahead: int = 2,
        fetch: Callable[[int], tuple[Any, Any]] | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
        if not isinstance(prefetch_queue_depth, int) or prefetch_queue_depth < 1:
            raise ValueError(f"prefetch_queue_depth must be a positive int, got {prefetch_queue_depth!r}")
        if not isinstance(read_ahead, int) or read_ahead < 0:
            raise ValueError(f"read_ahead must be an int >= 0, got {read_ahead!r}")
        self.transform = Transform.create(
            train=train, size=size, scale=scale, ratio=ratio, flip=flip, color_jitter=color_jitter,
            crop_pct=crop_pct, mean=mean, std=std, dtype=dtype, layout=layout, cutout=cutout,
            cutout_size=cutout_size,
        )
        self._device_id = resolve_device(device)
        self.device = torch.device("cpu") if self._device_id is None else torch.device("cuda", self._device_id)

        if isinstance(source, (str, os.PathLike)):
            source = open_source(source, root=root)
        elif root is not None:
            raise ValueError("root= applies to a list file source only")
        self.dataset = source
        self.classes: list[str] | None = getattr(source, "classes", None)
        self.shard_id, self.num_shards = _resolve_shards(shard_id, num_shards)
        self.shuffle = bool(train) if shuffle is None else bool(shuffle)
        self.drop_last = bool(drop_last)
        self.batch_size = batch_size
        if seed is None:
            order_seed = 0 if self.num_shards > 1 else _random_seed()
            augment_seed = _random_seed()
        else:
            order_seed = augment_seed = int(seed)
        self._augment_seed = int(np.random.SeedSequence([augment_seed, self.shard_id]).generate_state(1)[0] % 2**31)
        self._source = EncodedSource(
            source, batch_size=batch_size, shuffle=self.shuffle, seed=order_seed,
            shard_id=self.shard_id, num_shards=self.num_shards, drop_last=self.drop_last, fetch=fetch,
        )
        if len(self._source) == 0:
            raise ValueError(
                f"no batches: this shard has {self._source.num_samples} samples per epoch, fewer than "
                f"batch_size={batch_size}, and drop_last=True drops them"
            )
        self._num_threads = num_threads
        self._prefetch_queue_depth = prefetch_queue_depth
        self._read_ahead = read_ahead
        self._next_epoch = 0
        self._state = _State()
        self._finalizer = weakref.finalize(self, self._state.close)

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
        return self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter()`` run ``epoch`` (to resume a run with the same shuffles)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self._next_epoch = epoch

    def _new_pipeline(self, feeder: Callable, *, decode_device: str | None = None) -> Pipeline:
        """An unbuilt pipeline fed by ``feeder``; ``decode_device`` overrides the device's choice."""
        if decode_device is None:
            decode_device = "cpu" if self._device_id is None else "mixed"
        return build_pipeline(
            feeder, transform=self.transform, batch_size=self.batch_size,
            num_threads=self._num_threads, device_id=self._device_id, decode_device=decode_device,
            seed=self._augment_seed, prefetch_queue_depth=self._prefetch_queue_depth,
        )

    def _runtime(self) -> _Runtime:
        state = self._state
        if state.runtime is None:
            feeder = _Feeder(self._source, self._read_ahead)
            state.runtime = _Runtime(self._new_pipeline(feeder), feeder, self.device)
        return state.runtime

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self._next_epoch
        self._next_epoch += 1
        self._state.token += 1
        runtime = self._runtime()
        try:
            runtime.start_epoch(epoch)
        except BaseException:
            self._state.close()
            raise
        return _EpochIterator(self, epoch, self._state.token)

    def _next_batch(self, token: int) -> tuple[_Tag, torch.Tensor, torch.Tensor]:
        state = self._state
        if token != state.token or state.runtime is None:
            raise RuntimeError(
                "this epoch iterator has ended: a newer iter(loader) started another epoch, or the "
                "loader was closed"
            )
        runtime = state.runtime
        try:
            return runtime.next_batch()
        except _PipelineFailure as error:
            suspects = list(runtime.feeder.in_flight)
            state.close()
            raise self._explain(error, suspects) from error.__cause__
        except BaseException:
            state.close()
            raise

    def _explain(self, error: RuntimeError, suspects: list[_Tag]) -> Exception:
        """Turns a DALI failure into an error naming the sample, found among the batches in flight."""
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
                        f"{bad} (DALI reported: {reason}). Remove or replace this image; for a list "
                        "file, drop its line"
                    )
        return RuntimeError(f"DALI failed in epoch {suspects[0].epoch if suspects else '?'}: {reason}")

    def close(self) -> None:
        """Stops the pipeline and the reader thread now. Iterating again builds a new pipeline."""
        self._state.token += 1
        self._state.close()

    def __enter__(self) -> DALILoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "train" if self.transform.train else "eval"
        return (
            f"DALILoader({self.dataset!r}, {mode}, batch_size={self.batch_size}, {len(self)} batches, "
            f"device={self.device}, shard {self.shard_id}/{self.num_shards})"
        )

    def _fastpipe_describe(self) -> dict[str, Any]:
        """Tells ``fastpipe.profile`` what this is and the settings its advice uses."""
        return {"kind": "DALILoader", "batch_size": self.batch_size,
                "dataset": type(self.dataset).__name__}


class _EpochIterator:
    """One epoch of a :class:`DALILoader`; ``len()`` is the number of batches left."""

    def __init__(self, loader: DALILoader, epoch: int, token: int) -> None:
        self._loader = loader
        self.epoch = epoch
        self._token = token
        self._length = len(loader)
        self._batch = 0

    def __iter__(self) -> _EpochIterator:
        return self

    def __len__(self) -> int:
        return self._length - self._batch

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._batch >= self._length:
            raise StopIteration
        tag, images, labels = self._loader._next_batch(self._token)
        if (tag.epoch, tag.batch) != (self.epoch, self._batch):  # pragma: no cover - invariant
            raise AssertionError(f"expected batch {self._batch} of epoch {self.epoch}, got {tag}")
        self._batch += 1
        if self._batch == self._length:
            # The plan runs on into the next epoch, so its first batches are already in flight.
            runtime = self._loader._state.runtime
            if runtime is not None:
                runtime.aligned_epoch = self.epoch + 1
        return images, labels

