"""The image classification pipeline, built on DALI's ``pipeline_def``, and device selection."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import nvidia.dali.fn as fn
import nvidia.dali.types as types
import torch
from nvidia.dali import pipeline_def
from nvidia.dali.pipeline import Pipeline

from fastpipe._constants import IMAGENET_MEAN, IMAGENET_STD
from fastpipe.dali.sources import EncodedSource, FileList

_DALI_DTYPES = {torch.float32: types.FLOAT, torch.float16: types.FLOAT16, torch.uint8: types.UINT8}
_DALI_LAYOUTS = {"NCHW": "CHW", "NHWC": "HWC"}

# nvJPEG scratch sizes from DALI's ResNet-50 example: reserving them up front saves the
# reallocations the first ImageNet-sized batches would otherwise trigger. GPU decoding only.
_DEVICE_MEMORY_PADDING = 211025920
_HOST_MEMORY_PADDING = 140544512


def _dali_cuda_device_count() -> int:
    from nvidia.dali import backend

    try:
        return int(backend.GetCUDADeviceCount())
    except Exception:  # noqa: BLE001 - a broken driver means no GPU for DALI
        return 0


_INSTALL_HINT = (
    "install the DALI wheel built for your CUDA major version: pip install 'fastpipe[dali]' "
    "(nvidia-dali-cuda130, CUDA 13) or pip install 'fastpipe[dali-cuda12]' (nvidia-dali-cuda120, "
    "CUDA 12)"
)


def resolve_device(device: str | int | torch.device = "auto") -> int | None:
    """The DALI ``device_id`` for ``device``; ``None`` means DALI's CPU mode.

    ``"auto"`` picks the current CUDA device when torch has CUDA and DALI sees a GPU, else the
    CPU. ``"cpu"`` forces the CPU. ``"gpu"``, ``"cuda"``, ``"cuda:N"``, an int or a
    ``torch.device`` ask for a GPU and raise ``RuntimeError`` saying why when there is none.
    """
    if isinstance(device, torch.device):
        device = str(device)
    if isinstance(device, int) and not isinstance(device, bool):
        index: int | None = device
    elif isinstance(device, str):
        name = device.strip().lower()
        if name == "cpu":
            return None
        if name == "auto":
            if not torch.cuda.is_available():
                return None
            if _dali_cuda_device_count() == 0:
                warnings.warn(
                    f"torch sees a CUDA GPU but DALI does not, so DALI runs on the CPU; to use the GPU, {_INSTALL_HINT}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return None
            return torch.cuda.current_device()
        kind, _, number = name.partition(":")
        if kind not in ("cuda", "gpu") or (number and not number.isdigit()):
            raise ValueError(f"device must be 'auto', 'cpu', 'gpu', 'cuda' or 'cuda:N', got {device!r}")
        index = int(number) if number else None
    else:
        raise TypeError(f"device must be a str, int or torch.device, got {type(device).__name__}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} asks for a GPU, but torch sees no CUDA device here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use device='cpu' for "
            "DALI's CPU mode, or device='auto' to use a GPU only when there is one"
        )
    count = _dali_cuda_device_count()
    if count == 0:
        raise RuntimeError(f"device={device!r}: torch sees a CUDA GPU but DALI does not; {_INSTALL_HINT}")
    if index is None:
        index = torch.cuda.current_device()
    if not 0 <= index < count:
        raise ValueError(f"device={device!r}: DALI sees {count} GPU(s), numbered 0 to {count - 1}")
    return index


def _pair(name: str, value: Sequence[float]) -> tuple[float, float]:
    low, high = (float(v) for v in value)
    if not 0 < low <= high:
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {tuple(value)}")
    return low, high


def _probability(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return value


@dataclass(frozen=True)
class Transform:
    """The train or eval transforms of :func:`image_pipeline`, checked once.

    Train: fused decode + random resized crop (``scale``, ``ratio``) to ``size``, optional colour
    jitter, horizontal flip with probability ``flip``, normalize, optional cutout. Eval: decode,
    resize the shorter side to ``floor(size / crop_pct)``, centre crop ``size``, normalize.
    """

    train: bool = True
    size: tuple[int, int] = (224, 224)
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    color_jitter: tuple[float, float, float, float] | None = None
    crop_pct: float = 0.875
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    dtype: torch.dtype = torch.float32
    layout: str = "NCHW"
    cutout: float = 0.0
    cutout_size: float = 0.5

    @classmethod
    def create(
        cls,
        *,
        train: bool = True,
        size: int | Sequence[int] = 224,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        color_jitter: float | Sequence[float] | None = None,
        crop_pct: float = 0.875,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
        layout: str = "NCHW",
        cutout: float = 0.0,
        cutout_size: float = 0.5,
    ) -> Transform:
        """Validates and normalizes the arguments (see :func:`image_pipeline`)."""
        if isinstance(size, int):
            size = (size, size)
        size = tuple(int(s) for s in size)
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"size must be a positive int or (height, width), got {size}")
        if color_jitter is not None:
            values = [float(color_jitter)] * 3 if isinstance(color_jitter, (int, float)) else [float(v) for v in color_jitter]
            if len(values) == 3:
                values.append(0.0)
            if len(values) != 4 or min(values) < 0 or values[3] > 0.5:
                raise ValueError(
                    "color_jitter must be a strength, or (brightness, contrast, saturation[, hue]) with "
                    f"values >= 0 and hue <= 0.5, like torchvision's ColorJitter; got {color_jitter}"
                )
            color_jitter = tuple(values) if any(values) else None
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct}")
        mean = tuple(float(m) for m in mean)
        std = tuple(float(s) for s in std)
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std need 3 values each (0-1 scale), std > 0; got {mean}, {std}")
        if dtype not in _DALI_DTYPES:
            raise ValueError(f"dtype must be torch.float32, torch.float16 or torch.uint8, got {dtype}")
        layout = str(layout).upper()
        if layout not in _DALI_LAYOUTS:
            raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
        if not 0 < cutout_size <= 1:
            raise ValueError(f"cutout_size is a fraction of the image side in (0, 1], got {cutout_size}")
        return cls(
            train=bool(train), size=size, scale=_pair("scale", scale), ratio=_pair("ratio", ratio),
            flip=_probability("flip", flip), color_jitter=color_jitter, crop_pct=float(crop_pct),
            mean=mean, std=std, dtype=dtype, layout=layout, cutout=_probability("cutout", cutout),
            cutout_size=float(cutout_size),
        )

    @property
    def resize_size(self) -> int:
        """Eval: the shorter side before the centre crop (256 for 224 at the default crop_pct)."""
        return int(math.floor(min(self.size) / self.crop_pct))


def _decode_and_augment(encoded: Any, transform: Transform, decode_device: str) -> Any:
    height, width = transform.size
    # EXIF orientation is ignored, as by torchvision and fastpipe's CPU decoder, so that every
    # loader sees the same pixels (DALI would rotate tagged photos by default).
    extra: dict[str, Any] = {"adjust_orientation": False}
    if decode_device == "mixed":
        extra.update(device_memory_padding=_DEVICE_MEMORY_PADDING, host_memory_padding=_HOST_MEMORY_PADDING)
    if transform.train:
        # One op decodes only the random crop window (DALI's fused ROI decode), so no full-size
        # image is ever materialised; the resize then brings the window to the output size.
        images = fn.decoders.image_random_crop(
            encoded, device=decode_device, output_type=types.RGB,
            random_area=list(transform.scale), random_aspect_ratio=list(transform.ratio),
            num_attempts=10, **extra,
        )
        images = fn.resize(images, resize_x=width, resize_y=height, interp_type=types.INTERP_LINEAR, antialias=True)
        if transform.color_jitter is not None:
            brightness, contrast, saturation, hue = transform.color_jitter
            twist = {}
            for name, strength in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
                if strength > 0:
                    twist[name] = fn.random.uniform(range=[max(0.0, 1.0 - strength), 1.0 + strength])
            if hue > 0:
                twist["hue"] = fn.random.uniform(range=[-360.0 * hue, 360.0 * hue])  # DALI: degrees
            images = fn.color_twist(images, **twist)
        crop: dict[str, Any] = {}
        if transform.flip > 0:
            crop["mirror"] = fn.random.coin_flip(probability=transform.flip)
    else:
        images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB, **extra)
        images = fn.resize(images, resize_shorter=transform.resize_size, interp_type=types.INTERP_LINEAR, antialias=True)
        crop = {"crop": [height, width], "crop_pos_x": 0.5, "crop_pos_y": 0.5}
    if transform.dtype == torch.uint8:
        mean, std = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]  # crop, flip and layout only
    else:
        mean = [255.0 * m for m in transform.mean]
        std = [255.0 * s for s in transform.std]
    images = fn.crop_mirror_normalize(
        images, dtype=_DALI_DTYPES[transform.dtype], output_layout=_DALI_LAYOUTS[transform.layout],
        mean=mean, std=std, **crop,
    )
    if transform.train and transform.cutout > 0:
        # A zero-sized window erases nothing, so the coin flip decides per sample.
        extent = fn.cast(fn.random.coin_flip(probability=transform.cutout), dtype=types.FLOAT) * transform.cutout_size
        images = fn.erase(
            images, anchor=fn.random.uniform(range=[0.0, 1.0], shape=[2]), shape=fn.stack(extent, extent),
            normalized_anchor=True, normalized_shape=True, centered_anchor=True, axis_names="HW",
            fill_value=0.0,
        )
    return images


@pipeline_def
def _classification_graph(source: Any, transform: Transform, decode_device: str, reader: dict[str, Any]):
    if isinstance(source, FileList):
        encoded, labels = fn.readers.file(
            files=source.files, labels=[int(label) for label in source.labels], **reader
        )
        # The reader gives (1,) int32 labels; the external source path gives int64 scalars.
        labels = fn.cast(fn.squeeze(labels, axes=[0]), dtype=types.INT64)
    else:
        encoded, labels = fn.external_source(
            source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64],
            cycle="raise" if isinstance(source, EncodedSource) else None,
        )
    images = _decode_and_augment(encoded, transform, decode_device)
    if decode_device == "mixed":
        labels = labels.gpu()
    return images, labels


def image_pipeline(
    source: Any,
    *,
    batch_size: int,
    train: bool = True,
    size: int | Sequence[int] = 224,
    num_threads: int = 2,
    device: str | int | torch.device = "auto",
    seed: int | None = None,
    shuffle: bool | None = None,
    shard_id: int = 0,
    num_shards: int = 1,
    root: str | os.PathLike | None = None,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    flip: float = 0.5,
    color_jitter: float | Sequence[float] | None = None,
    crop_pct: float = 0.875,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    dtype: torch.dtype = torch.float32,
    layout: str = "NCHW",
    cutout: float = 0.0,
    cutout_size: float = 0.5,
    prefetch_queue_depth: int = 2,
    reader_name: str = "Reader",
    **pipeline_kwargs: Any,
) -> Pipeline:
    """A DALI pipeline for image classification: outputs ``(images, labels)`` per batch.

    Args:
        source: what to read.
            * a folder in ImageFolder layout (``root/<class>/<image>``), a list file of
              ``path label`` lines (relative paths from ``root``, else from the list file's
              folder), or a :class:`~fastpipe.dali.FileList`: read by ``fn.readers.file`` (named
              ``reader_name``) with ``pad_last_batch=True``, so the last batch of an epoch is
              padded with copies of the last sample instead of crossing into the next epoch;
              shuffling is DALI's (a random buffer of ``initial_fill`` samples), sharding is
              DALI's (``shard_id``, ``num_shards``). Use with
              ``DALIGenericIterator(..., reader_name=reader_name,
              last_batch_policy=LastBatchPolicy.PARTIAL)``, or use :class:`~fastpipe.dali.DALILoader`.
            * an :class:`~fastpipe.dali.EncodedSource`, or an encoded dataset (``__len__`` and
              ``encoded(i) -> (uint8 bytes, label)``), which gets wrapped in one with
              ``shuffle``, ``seed``, ``shard_id``, ``num_shards``: fed through
              ``fn.external_source``; the last batch of an epoch is smaller, then the pipeline
              raises ``StopIteration`` and the next epoch starts after ``pipe.reset()``.
            * any other callable: called once per batch, returning ``(list of 1-D uint8
              arrays, int64 labels)`` of at most ``batch_size`` samples.
        batch_size: samples per batch.
        train: train transforms (random resized crop, flip, jitter, cutout) or eval (resize,
            centre crop).
        size: output side, or ``(height, width)``.
        num_threads: DALI CPU worker threads.
        device: ``"auto"``, ``"cpu"`` (DALI's CPU mode, ``device_id=None``) or a GPU (``"gpu"``,
            ``"cuda:N"``); with a GPU the decode is ``device="mixed"`` and every later op and
            both outputs are on the GPU. See :func:`resolve_device`.
        seed: DALI's random seed (augmentations; the reader's shuffle); ``None`` = random.
        shuffle: defaults to ``train``.
        scale, ratio: random resized crop area fraction and aspect ratio ranges (torchvision's).
        flip: probability of a horizontal flip (train).
        color_jitter: ``None``, a strength for brightness, contrast and saturation, or
            ``(brightness, contrast, saturation[, hue])`` as in torchvision's ColorJitter (train).
        crop_pct: eval resizes the shorter side to ``floor(size / crop_pct)`` then centre crops.
        mean, std: per channel, 0-1 scale (ImageNet's by default).
        dtype: ``torch.float32`` or ``torch.float16`` normalized output; ``torch.uint8`` skips
            the normalization (0-255 pixels, to normalize later on the device).
        layout: ``"NCHW"`` or ``"NHWC"`` batches (DALI's ``CHW``/``HWC`` per sample).
        cutout: probability per sample of erasing a square (train); ``cutout_size`` is its side
            as a fraction of the image side. Its centre is uniform over the image and it is
            clipped at the borders; erased pixels become 0 after normalization (the mean colour).
        prefetch_queue_depth: batches DALI prepares ahead.
        pipeline_kwargs: passed on to the DALI ``Pipeline`` (e.g. ``exec_dynamic``).

    Returns:
        An unbuilt ``nvidia.dali.Pipeline``. Outputs: images ``(N, 3, H, W)`` (or ``(N, H, W,
        3)``) of ``dtype``, labels ``(N,)`` int64 scalars per sample.
    """
    transform = Transform.create(
        train=train, size=size, scale=scale, ratio=ratio, flip=flip, color_jitter=color_jitter,
        crop_pct=crop_pct, mean=mean, std=std, dtype=dtype, layout=layout, cutout=cutout,
        cutout_size=cutout_size,
    )
    device_id = resolve_device(device)
    return build_pipeline(
        source, transform=transform, batch_size=batch_size, num_threads=num_threads,
        device_id=device_id, decode_device="cpu" if device_id is None else "mixed", seed=seed,
        shuffle=shuffle, shard_id=shard_id, num_shards=num_shards, root=root,
        prefetch_queue_depth=prefetch_queue_depth, reader_name=reader_name, **pipeline_kwargs,
    )


def build_pipeline(
    source: Any,
    *,
    transform: Transform,
    batch_size: int,
    num_threads: int,
    device_id: int | None,
    decode_device: str,
    seed: int | None = None,
    shuffle: bool | None = None,
    shard_id: int = 0,
    num_shards: int = 1,
    root: str | os.PathLike | None = None,
    prefetch_queue_depth: int = 2,
    reader_name: str = "Reader",
    **pipeline_kwargs: Any,
) -> Pipeline:
    """:func:`image_pipeline` with the device already resolved and the transforms checked.

    ``decode_device`` ("cpu" or "mixed") is separate from ``device_id`` so that the GPU graph can
    be built and serialized on a machine without a GPU (``device_id=None``, ``"mixed"``); such a
    pipeline cannot run there.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
    if decode_device not in ("cpu", "mixed"):
        raise ValueError(f"decode_device must be 'cpu' or 'mixed', got {decode_device!r}")
    reader: dict[str, Any] = {}
    shuffled = transform.train if shuffle is None else bool(shuffle)
    if isinstance(source, (str, os.PathLike)):
        source = FileList.from_path(source, root=root)
    elif root is not None:
        raise ValueError("root= applies to a list file source only")
    if isinstance(source, FileList):
        reader = {
            "name": reader_name, "random_shuffle": shuffled, "shard_id": shard_id,
            "num_shards": num_shards, "pad_last_batch": True,
        }
    elif isinstance(source, EncodedSource):
        if source.batch_size > batch_size:
            raise ValueError(f"the EncodedSource makes batches of {source.batch_size}, more than batch_size={batch_size}")
        if shuffle is not None or num_shards != 1:
            raise ValueError("set shuffle and sharding on the EncodedSource itself, not on the pipeline")
    elif hasattr(source, "encoded") and hasattr(source, "__len__"):
        source = EncodedSource(
            source, batch_size=batch_size, shuffle=shuffled, seed=0 if seed is None else seed,
            shard_id=shard_id, num_shards=num_shards,
        )
    elif not callable(source):
        raise TypeError(
            "source must be a folder, a list file, a FileList, an EncodedSource, an encoded dataset "
            f"(__len__ and encoded(i)) or a batch callable; got {type(source).__name__}"
        )
    return _classification_graph(
        source, transform, decode_device, reader,
        batch_size=batch_size, num_threads=num_threads, device_id=device_id,
        seed=None if seed is None else int(seed), prefetch_queue_depth=prefetch_queue_depth,
        **pipeline_kwargs,
    )
