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
from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment
from nvidia.dali.pipeline import Pipeline

from fastpipe import _validate as check
from fastpipe.dali.sources import EncodedSource, FileList

_DALI_DTYPES = {torch.float32: types.FLOAT, torch.float16: types.FLOAT16, torch.uint8: types.UINT8}

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


_DEVICE_KINDS = "None (a GPU when there is one), 'cpu', 'gpu', 'cuda' or 'cuda:N'"


def _current_cuda_device(count: int) -> int:
    """torch's current device, or ``LOCAL_RANK``'s when the script never chose one.

    Under torchrun every rank starts with cuda:0 current; a script that forgot
    ``torch.cuda.set_device(local_rank)`` would make every rank decode on GPU 0 and hold
    nvJPEG's buffers there. torch cannot tell "set to 0" from "never set", so a ``LOCAL_RANK``
    other than 0 while the current device is 0 is taken as "never set", when that GPU exists
    (with one visible GPU per process, ``LOCAL_RANK`` does not number the visible GPUs).
    """
    current = torch.cuda.current_device()
    local_rank = os.environ.get("LOCAL_RANK", "")
    if current == 0 and local_rank.isdigit() and 0 < int(local_rank) < count:
        warnings.warn(
            f"LOCAL_RANK={local_rank} but torch's current CUDA device is 0, so DALI decodes on "
            f"cuda:{local_rank}; call torch.cuda.set_device({local_rank}) (or pass "
            "device=f'cuda:{local_rank}') before building the loader so that your model and "
            "DataPrefetcher use the same GPU",
            RuntimeWarning,
            stacklevel=3,
        )
        return int(local_rank)
    return current


def resolve_device(device: str | int | torch.device | None = None) -> int | None:
    """The DALI ``device_id`` for ``device``; ``None`` means DALI's CPU mode.

    ``None`` picks a GPU when torch has CUDA and DALI sees one, else the CPU. ``"cpu"`` forces
    the CPU. ``"gpu"``, ``"cuda"``, ``"cuda:N"``, an int or a ``torch.device`` ask for a GPU and
    raise ``RuntimeError`` saying why when there is none. Without an index the GPU is torch's
    current device, or ``LOCAL_RANK``'s when the script left the current device at 0 (with a
    warning to call ``torch.cuda.set_device``).
    """
    if isinstance(device, torch.device):
        device = str(device)
    if device is None:
        if not torch.cuda.is_available():
            return None
        count = _dali_cuda_device_count()
        if count == 0:
            warnings.warn(
                "torch sees a CUDA GPU but DALI does not, so DALI runs on the CPU; to use the "
                f"GPU, {_INSTALL_HINT}",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        return _current_cuda_device(count)
    if isinstance(device, int) and not isinstance(device, bool):
        index: int | None = device
    elif isinstance(device, str):
        name = device.strip().lower()
        if name == "cpu":
            return None
        kind, _, number = name.partition(":")
        if kind not in ("cuda", "gpu") or (number and not number.isdigit()):
            raise ValueError(f"device must be {_DEVICE_KINDS}, got {device!r}")
        index = int(number) if number else None
    else:
        raise TypeError(
            f"device must be {_DEVICE_KINDS}, an int or a torch.device; got {type(device).__name__}"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} asks for a GPU, but torch sees no CUDA device here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use device='cpu' for "
            "DALI's CPU mode, or device=None to use a GPU only when there is one"
        )
    count = _dali_cuda_device_count()
    if count == 0:
        raise RuntimeError(
            f"device={device!r}: torch sees a CUDA GPU but DALI does not; {_INSTALL_HINT}"
        )
    if index is None:
        index = _current_cuda_device(count)
    if not 0 <= index < count:
        raise ValueError(f"device={device!r}: DALI sees {count} GPU(s), numbered 0 to {count - 1}")
    return index



_INTERPOLATIONS = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}
_CPU_ONLY_POLICIES = {
    "augmix": "AugMix is not in nvidia.dali.auto_aug; run it on the fast CPU path "
    "(fastpipe.data.ImageFolder(auto_augment='augmix'))",
}
_POLICY_NAMES = "'ra', 'ta_wide', 'imagenet', timm's 'rand-m9-n2-inc1' style, or None"


@dataclass(frozen=True)
class AutoAugment:
    """An automatic augmentation policy as DALI runs it (``nvidia.dali.auto_aug``).

    Built by :meth:`parse` from the names of torchvision's reference scripts and timm's
    RandAugment strings; runs on uint8 ``HWC`` images after the crop and resize.
    """

    kind: str  # "rand", "trivial" or "auto"
    name: str  # as the user spelled it
    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    monotonic: bool = True
    fill_value: int = 0
    max_translate_rel: float | None = 150 / 331
    max_translate_abs: int | None = None

    @classmethod
    def parse(cls, name: str | None) -> AutoAugment | None:
        """``None`` for no policy; a clear ``ValueError`` for a policy DALI cannot run."""
        if name is None:
            return None
        if not isinstance(name, str):
            raise TypeError(f"auto_augment must be {_POLICY_NAMES}; got {type(name).__name__}")
        key = name.strip().lower()
        base = key.split("-")[0]
        if base in _CPU_ONLY_POLICIES:
            raise ValueError(f"auto_augment={name!r}: {_CPU_ONLY_POLICIES[base]}")
        # torchvision's references: RandAugment(2, 9, 31 bins), TrivialAugmentWide (31 bins,
        # translations up to 32 pixels), AutoAugment(IMAGENET); fill 0 like torchvision.
        if key == "ra":
            return cls("rand", name)
        if key == "ta_wide":
            return cls("trivial", name, max_translate_rel=None, max_translate_abs=32)
        if key == "imagenet":
            return cls("auto", name)
        if base == "rand":
            return cls._parse_timm(name, key)
        raise ValueError(
            f"auto_augment={name!r} is not a policy DALI can run; use {_POLICY_NAMES}. timm's "
            "AutoAugment names ('original', 'v0', ...) differ from DALI's ImageNet policy: use "
            "'imagenet' here, or the CPU path"
        )

    @classmethod
    def _parse_timm(cls, name: str, key: str) -> AutoAugment:
        # timm's magnitudes run 0-10 (m9 is 90 % of the range): 11 bins. Without "inc1" timm
        # uses the original, partly decreasing magnitude ranges: DALI's non-monotonic suite.
        # Fill 128 and translations up to 45 % of the side, as timm does.
        fields = {"m": 9, "n": 2, "inc": 0, "mstd": 0.0}
        for part in key.split("-")[1:]:
            head = part.rstrip("0123456789.")
            value = part[len(head):]
            if head not in fields or not value:
                raise ValueError(
                    f"auto_augment={name!r}: DALI's RandAugment takes m (0-10), n and inc of "
                    f"timm's options, not {part!r}; drop it or use the CPU path"
                )
            fields[head] = float(value)
        if fields["mstd"] != 0:
            raise ValueError(
                f"auto_augment={name!r}: DALI's RandAugment applies a fixed magnitude and has no "
                "per-operation magnitude noise (timm's mstd); drop 'mstd' (or write mstd0) to run "
                "it in DALI, or use the CPU path for mstd"
            )
        magnitude, num_ops = fields["m"], fields["n"]
        if magnitude != int(magnitude) or not 0 <= magnitude <= 10 or num_ops != int(num_ops):
            raise ValueError(f"auto_augment={name!r}: m must be an int in 0-10 and n an int")
        if num_ops < 1:
            raise ValueError(f"auto_augment={name!r}: n must be at least 1")
        return cls(
            "rand", name, num_ops=int(num_ops), magnitude=int(magnitude), num_magnitude_bins=11,
            monotonic=bool(fields["inc"]), fill_value=128, max_translate_rel=0.45,
        )

    def apply(self, images: Any, size: tuple[int, int], seed: int | None) -> Any:
        """The policy on a batch of uint8 ``HWC`` images of ``size``; needs conditionals."""
        translate = {}
        if self.max_translate_rel is not None:
            translate = {"shape": list(size), "max_translate_rel": self.max_translate_rel}
        elif self.max_translate_abs is not None:
            translate = {"max_translate_abs": self.max_translate_abs}
        common = {"fill_value": self.fill_value, "seed": seed, **translate}
        if self.kind == "rand":
            return rand_augment.rand_augment(
                images, n=self.num_ops, m=self.magnitude,
                num_magnitude_bins=self.num_magnitude_bins, monotonic_mag=self.monotonic, **common,
            )
        if self.kind == "trivial":
            return trivial_augment.trivial_augment_wide(
                images, num_magnitude_bins=self.num_magnitude_bins, **common
            )
        return auto_augment.auto_augment(images, policy_name="image_net", **common)


def _interpolation(value: Any) -> str:
    # torchvision's InterpolationMode is a str Enum whose value is the name.
    name = str(getattr(value, "value", value)).lower()
    if name not in _INTERPOLATIONS:
        raise ValueError(f"interpolation must be 'bilinear' or 'bicubic', got {value!r}")
    return name


@dataclass(frozen=True)
class Transform:
    """The train or eval transforms of :func:`image_pipeline`, checked once.

    Train: fused decode + random resized crop (``scale``, ``ratio``) to ``size``, optional
    ``auto_augment`` policy, optional colour jitter, horizontal flip with probability ``hflip``,
    optional normalization, optional cutout. Eval: decode, resize the shorter side to
    ``floor(size / crop_pct)``, centre crop ``size``, optional normalization.
    """

    train: bool = True
    size: tuple[int, int] = (224, 224)
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    color_jitter: tuple[float, float, float, float] | None = None
    crop_pct: float = 0.875
    interpolation: str = "bilinear"
    auto_augment: AutoAugment | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    cutout_holes: int = 0
    cutout_size: int = 16

    @classmethod
    def create(
        cls,
        *,
        train: bool = True,
        size: int | Sequence[int] = 224,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        hflip: float = 0.5,
        color_jitter: float | Sequence[float] | None = None,
        crop_pct: float = 0.875,
        interpolation: Any = "bilinear",
        auto_augment: str | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        cutout_holes: int = 0,
        cutout_size: int = 16,
    ) -> Transform:
        """Validates and normalizes the arguments (see :func:`image_pipeline`)."""
        size = check.size_pair("size", size)
        if color_jitter is not None:
            if isinstance(color_jitter, (int, float)):
                values = [float(color_jitter)] * 3
            else:
                values = [float(v) for v in color_jitter]
            if len(values) == 3:
                values.append(0.0)
            if len(values) != 4 or min(values) < 0 or values[3] > 0.5:
                raise ValueError(
                    "color_jitter must be a strength, or (brightness, contrast, saturation[, hue]) "
                    f"with values >= 0 and hue <= 0.5, like torchvision's ColorJitter; got "
                    f"{color_jitter}"
                )
            color_jitter = tuple(values) if any(values) else None
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct}")
        if (mean is None) != (std is None):
            raise ValueError("pass both mean and std (0-1 scale), or neither (no normalization)")
        if mean is not None:
            mean = tuple(float(m) for m in mean)
            std = tuple(float(s) for s in std)
            if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
                raise ValueError(
                    f"mean and std need 3 values each (0-1 scale), std > 0; got {mean}, {std}"
                )
        if dtype not in _DALI_DTYPES:
            raise ValueError(
                f"dtype must be torch.float32, torch.float16 or torch.uint8, got {dtype}"
            )
        if dtype == torch.uint8 and mean is not None:
            raise ValueError(
                "mean/std normalize to floats, but dtype=torch.uint8 keeps 0-255 pixels; pass a "
                "float dtype, or drop mean/std and normalize on the device "
                "(fastpipe.ops.normalize or DataPrefetcher(mean=, std=))"
            )
        if not isinstance(channels_last, bool):
            raise ValueError(f"channels_last must be True or False, got {channels_last!r}")
        policy = AutoAugment.parse(auto_augment)
        if policy is not None and not train:
            raise ValueError(
                f"auto_augment={auto_augment!r} is a train augmentation; pass train=True or drop it"
            )
        return cls(
            train=bool(train), size=size, scale=check.pair("scale", scale),
            ratio=check.pair("ratio", ratio), hflip=check.probability("hflip", hflip),
            color_jitter=color_jitter,
            crop_pct=float(crop_pct), interpolation=_interpolation(interpolation),
            auto_augment=policy, mean=mean, std=std, dtype=dtype, channels_last=channels_last,
            cutout_holes=check.non_negative_int("cutout_holes", cutout_holes),
            cutout_size=check.positive_int("cutout_size", cutout_size),
        )

    @property
    def resize_size(self) -> int:
        """Eval: the shorter side before the centre crop (256 for 224 at the default crop_pct)."""
        return int(math.floor(min(self.size) / self.crop_pct))

    @property
    def needs_conditionals(self) -> bool:
        """DALI's automatic augmentations are written with ``if``: the pipeline needs
        ``enable_conditionals=True``."""
        return self.auto_augment is not None


def _decode_and_augment(
    encoded: Any, transform: Transform, decode_device: str, seed: int | None = None
) -> Any:
    # No annotated locals in here: DALI's AutoGraph (needed by the automatic augmentations)
    # cannot convert a function that has them.
    height, width = transform.size
    interp = {"interp_type": _INTERPOLATIONS[transform.interpolation], "antialias": True}
    # EXIF orientation is ignored, as by torchvision and fastpipe's CPU decoder, so that every
    # loader sees the same pixels (DALI would rotate tagged photos by default).
    extra = {"adjust_orientation": False}
    if decode_device == "mixed":
        extra.update(
            device_memory_padding=_DEVICE_MEMORY_PADDING, host_memory_padding=_HOST_MEMORY_PADDING
        )
    if transform.train:
        # One op decodes only the random crop window (DALI's fused ROI decode), so no full-size
        # image is ever materialised; the resize then brings the window to the output size.
        images = fn.decoders.image_random_crop(
            encoded, device=decode_device, output_type=types.RGB,
            random_area=list(transform.scale), random_aspect_ratio=list(transform.ratio),
            num_attempts=10, **extra,
        )
        images = fn.resize(images, resize_x=width, resize_y=height, **interp)
        if transform.auto_augment is not None:
            images = transform.auto_augment.apply(images, transform.size, seed)
        if transform.color_jitter is not None:
            brightness, contrast, saturation, hue = transform.color_jitter
            twist = {}
            for name, strength in (
                ("brightness", brightness), ("contrast", contrast), ("saturation", saturation)
            ):
                if strength > 0:
                    low = max(0.0, 1.0 - strength)
                    twist[name] = fn.random.uniform(range=[low, 1.0 + strength])
            if hue > 0:
                twist["hue"] = fn.random.uniform(range=[-360.0 * hue, 360.0 * hue])  # DALI: degrees
            images = fn.color_twist(images, **twist)
        crop = {}
        if transform.hflip > 0:
            crop["mirror"] = fn.random.coin_flip(probability=transform.hflip)
    else:
        images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB, **extra)
        images = fn.resize(images, resize_shorter=transform.resize_size, **interp)
        crop = {"crop": [height, width], "crop_pos_x": 0.5, "crop_pos_y": 0.5}
    if transform.dtype == torch.uint8:
        mean, std = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]  # crop, flip and layout only
    elif transform.mean is None:
        mean, std = [0.0, 0.0, 0.0], [255.0, 255.0, 255.0]  # 0-1 floats
    else:
        mean = [255.0 * m for m in transform.mean]
        std = [255.0 * s for s in transform.std]
    images = fn.crop_mirror_normalize(
        images, dtype=_DALI_DTYPES[transform.dtype],
        output_layout="HWC" if transform.channels_last else "CHW", mean=mean, std=std, **crop,
    )
    if transform.train and transform.cutout_holes > 0:
        # Like fastpipe.ops.cutout: square holes of cutout_size pixels, centres uniform over the
        # image, clipped at the borders, filled with 0 (the mean colour when normalized).
        holes = transform.cutout_holes
        images = fn.erase(
            images, anchor=fn.random.uniform(range=[0.0, 1.0], shape=[2 * holes]),
            shape=[float(transform.cutout_size)] * (2 * holes), normalized_anchor=True,
            normalized_shape=False, centered_anchor=True, axis_names="HW", fill_value=0.0,
        )
    return images


def _classification_graph(
    source: Any, transform: Transform, decode_device: str, reader: dict[str, Any]
) -> tuple[Any, Any]:
    if isinstance(source, FileList):
        encoded, labels = fn.readers.file(
            files=source.files, labels=[int(label) for label in source.targets], **reader
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


_classification_pipeline = pipeline_def(_classification_graph)
_conditional_pipeline = pipeline_def(_classification_graph, enable_conditionals=True)


def image_pipeline(
    source: Any,
    *,
    batch_size: int,
    train: bool = True,
    size: int | Sequence[int] = 224,
    num_workers: int = 2,
    device: str | int | torch.device | None = None,
    seed: int | None = None,
    shuffle: bool | None = None,
    rank: int = 0,
    world_size: int = 1,
    root: str | os.PathLike | None = None,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    color_jitter: float | Sequence[float] | None = None,
    crop_pct: float = 0.875,
    interpolation: Any = "bilinear",
    auto_augment: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    cutout_holes: int = 0,
    cutout_size: int = 16,
    prefetch_depth: int = 2,
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
              DALI's (``rank``, ``world_size``). Use with
              ``DALIGenericIterator(..., reader_name=reader_name,
              last_batch_policy=LastBatchPolicy.PARTIAL)``, or use
              :class:`~fastpipe.dali.DALILoader`.
            * an :class:`~fastpipe.dali.EncodedSource`, or an encoded dataset (``__len__`` and
              ``encoded(i) -> (uint8 bytes, label)``), which gets wrapped in one with
              ``shuffle``, ``seed``, ``rank``, ``world_size``: fed through
              ``fn.external_source``; the last batch of an epoch is smaller, then the pipeline
              raises ``StopIteration`` and the next epoch starts after ``pipe.reset()``.
            * any other callable: called once per batch, returning ``(list of 1-D uint8
              arrays, int64 labels)`` of at most ``batch_size`` samples.
        batch_size: samples per batch.
        train: train transforms (random resized crop, auto-augment, jitter, flip, cutout) or
            eval (resize, centre crop).
        size: output side, or ``(height, width)``.
        num_workers: DALI CPU worker threads.
        device: ``None`` (a GPU when torch and DALI see one, else the CPU), ``"cpu"`` (DALI's
            CPU mode, ``device_id=None``) or a GPU (``"gpu"``, ``"cuda"``, ``"cuda:N"``); with a
            GPU the decode is ``device="mixed"`` and every later op and both outputs are on the
            GPU. See :func:`resolve_device`.
        seed: DALI's random seed (augmentations; the reader's shuffle); ``None`` = random.
        shuffle: defaults to ``train``.
        rank, world_size: this process's share of the dataset (DDP).
        scale, ratio: random resized crop area fraction and aspect ratio ranges (torchvision's).
        hflip: probability of a horizontal flip (train).
        color_jitter: ``None``, a strength for brightness, contrast and saturation, or
            ``(brightness, contrast, saturation[, hue])`` as in torchvision's ColorJitter (train).
        crop_pct: eval resizes the shorter side to ``floor(size / crop_pct)`` then centre crops.
        interpolation: ``"bilinear"`` or ``"bicubic"`` (antialiased) for the resize.
        auto_augment: ``"ra"`` (RandAugment 2 ops, magnitude 9 of 31 bins, torchvision's
            reference), ``"ta_wide"`` (TrivialAugmentWide), ``"imagenet"`` (AutoAugment's
            ImageNet policy), timm's ``"rand-m9-n2-inc1"`` style (``mstd`` must be 0), or
            ``None``; train only, from ``nvidia.dali.auto_aug``. ``"augmix"`` is refused (the
            CPU path runs it).
        mean, std: per channel, 0-1 scale; ``None`` (default): no normalization, float outputs
            are 0-1.
        dtype: ``torch.float32`` or ``torch.float16``; ``torch.uint8`` keeps 0-255 pixels (to
            normalize later on the device; no mean/std then).
        channels_last: DALI's ``HWC`` samples, ``(N, H, W, 3)`` batches; :class:`DALILoader`
            views them as ``(N, 3, H, W)`` with ``torch.channels_last`` strides.
        cutout_holes: square holes erased per image (train); 0 = off. ``cutout_size`` is their
            side in pixels. Centres are uniform over the image, holes are clipped at the borders;
            erased pixels become 0 (the mean colour when normalized).
        prefetch_depth: batches DALI prepares ahead.
        pipeline_kwargs: passed on to the DALI ``Pipeline`` (e.g. ``exec_dynamic``).

    Returns:
        An unbuilt ``nvidia.dali.Pipeline``. Outputs: images ``(N, 3, H, W)`` (``(N, H, W, 3)``
        with ``channels_last``) of ``dtype``, labels ``(N,)`` int64 scalars per sample.
    """
    transform = Transform.create(
        train=train, size=size, scale=scale, ratio=ratio, hflip=hflip, color_jitter=color_jitter,
        crop_pct=crop_pct, interpolation=interpolation, auto_augment=auto_augment, mean=mean,
        std=std, dtype=dtype, channels_last=channels_last, cutout_holes=cutout_holes,
        cutout_size=cutout_size,
    )
    device_id = resolve_device(device)
    return build_pipeline(
        source, transform=transform, batch_size=batch_size, num_workers=num_workers,
        device_id=device_id, decode_device="cpu" if device_id is None else "mixed", seed=seed,
        shuffle=shuffle, rank=rank, world_size=world_size, root=root,
        prefetch_depth=prefetch_depth, reader_name=reader_name, **pipeline_kwargs,
    )


def build_pipeline(
    source: Any,
    *,
    transform: Transform,
    batch_size: int,
    num_workers: int,
    device_id: int | None,
    decode_device: str,
    seed: int | None = None,
    shuffle: bool | None = None,
    rank: int = 0,
    world_size: int = 1,
    root: str | os.PathLike | None = None,
    prefetch_depth: int = 2,
    reader_name: str = "Reader",
    **pipeline_kwargs: Any,
) -> Pipeline:
    """:func:`image_pipeline` with the device already resolved and the transforms checked.

    ``decode_device`` ("cpu" or "mixed") is separate from ``device_id`` so that the GPU graph can
    be built and serialized on a machine without a GPU (``device_id=None``, ``"mixed"``); such a
    pipeline cannot run there.
    """
    check.positive_int("batch_size", batch_size)
    check.positive_int("num_workers", num_workers)
    check.positive_int("prefetch_depth", prefetch_depth)
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
            "name": reader_name, "random_shuffle": shuffled, "shard_id": rank,
            "num_shards": world_size, "pad_last_batch": True,
        }
    elif isinstance(source, EncodedSource):
        if source.batch_size > batch_size:
            raise ValueError(
                f"the EncodedSource makes batches of {source.batch_size}, more than "
                f"batch_size={batch_size}"
            )
        if shuffle is not None or world_size != 1:
            raise ValueError(
                "set shuffle and sharding on the EncodedSource itself, not on the pipeline"
            )
    elif hasattr(source, "encoded") and hasattr(source, "__len__"):
        source = EncodedSource(
            source, batch_size=batch_size, shuffle=shuffled, seed=0 if seed is None else seed,
            rank=rank, world_size=world_size,
        )
    elif not callable(source):
        raise TypeError(
            "source must be a folder, a list file, a FileList, an EncodedSource, an encoded "
            f"dataset (__len__ and encoded(i)) or a batch callable; got {type(source).__name__}"
        )
    make = _conditional_pipeline if transform.needs_conditionals else _classification_pipeline
    return make(
        source, transform, decode_device, reader,
        batch_size=batch_size, num_threads=num_workers, device_id=device_id,
        seed=None if seed is None else int(seed), prefetch_queue_depth=prefetch_depth,
        **pipeline_kwargs,
    )
