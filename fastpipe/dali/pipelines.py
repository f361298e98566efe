"""The image classification pipeline, built on DALI's ``pipeline_def`` from a
:class:`~fastpipe.Recipe`, and device selection."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
import torch
from nvidia.dali import pipeline_def
from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment
from nvidia.dali.pipeline import Pipeline

from fastpipe import _validate as check
from fastpipe._constants import (
    DEFAULT_CROP_PCT,
    DEFAULT_CUTOUT_SIZE,
    DEFAULT_HFLIP,
    DEFAULT_INTERPOLATION,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    DEFAULT_SIZE,
)
from fastpipe._geometry import centre_offset
from fastpipe._hardware import DeviceUnavailableError, as_device
from fastpipe.dali.sources import EncodedSource, FileList
from fastpipe.recipe import Policy, Recipe

_DALI_DTYPES = {torch.float32: types.FLOAT, torch.float16: types.FLOAT16, torch.uint8: types.UINT8}

# nvJPEG scratch memory reserved up front saves the reallocations the first ImageNet-sized batches
# would otherwise trigger (GPU decoding only). DALI reserves device_memory_padding once and
# host_memory_padding twice (double buffering) per decoder thread, so the sizes of DALI's ResNet-50
# example (201 MB, 134 MB) are budgets for the whole pipeline, shared by its threads: per thread,
# never below DALI's own defaults (16 MB, 8 MB). With the 16 threads of a large node that is 256 MB
# of GPU memory and 256 MB of pinned memory, where the per-thread sizes would reserve 3.2 GB and
# 4.3 GB.
_DEVICE_MEMORY_BUDGET = 211025920
_HOST_MEMORY_BUDGET = 140544512
_DEVICE_MEMORY_FLOOR = 16 * 2**20
_HOST_MEMORY_FLOOR = 8 * 2**20


def memory_padding(num_workers: int) -> dict[str, int]:
    """The nvJPEG paddings per DALI thread for a pipeline of ``num_workers`` threads."""
    check.positive_int("num_workers", num_workers)
    return {
        "device_memory_padding": max(_DEVICE_MEMORY_FLOOR, _DEVICE_MEMORY_BUDGET // num_workers),
        "host_memory_padding": max(_HOST_MEMORY_FLOOR, _HOST_MEMORY_BUDGET // (2 * num_workers)),
    }


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


def dali_device_id(device: str | int | torch.device | None = None) -> int | None:
    """The DALI ``device_id`` for ``device``; ``None`` means DALI's CPU mode.

    ``None`` picks a GPU when torch has CUDA and DALI sees one, else the CPU. ``"cpu"`` forces
    the CPU. ``"gpu"``, ``"cuda"``, ``"cuda:N"``, an int (DALI's ``device_id``) or a
    ``torch.device`` ask for a GPU and raise ``RuntimeError`` saying why when there is none.
    Without an index the GPU is torch's current device, or ``LOCAL_RANK``'s when the script left
    the current device at 0 (with a warning to call ``torch.cuda.set_device``).
    """
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
        device = torch.device("cuda", device)
    elif isinstance(device, str) and device.strip().lower().partition(":")[0] == "gpu":
        device = "cuda" + device.strip().lower()[3:]  # DALI's own spelling of a GPU
    elif not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device must be {_DEVICE_KINDS}, an int or a torch.device; got {type(device).__name__}"
        )
    try:
        resolved = as_device(device, where="DALI")
    except ValueError:
        raise ValueError(f"device must be {_DEVICE_KINDS}, got {device!r}") from None
    if resolved.type == "cpu":
        return None
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device={device!r} asks for a GPU, but torch sees no CUDA device here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use device='cpu' for "
            "DALI's CPU mode, or device=None to use a GPU only when there is one"
        )
    count = _dali_cuda_device_count()
    if count == 0:
        raise DeviceUnavailableError(
            f"device={device!r}: torch sees a CUDA GPU but DALI does not; {_INSTALL_HINT}"
        )
    index = _current_cuda_device(count) if resolved.index is None else resolved.index
    if not 0 <= index < count:
        raise ValueError(f"device={device!r}: DALI sees {count} GPU(s), numbered 0 to {count - 1}")
    return index


_INTERPOLATIONS = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}


def _apply_policy(policy: Policy, images: Any, size: tuple[int, int], seed: int | None) -> Any:
    """The recipe's ``auto_augment`` policy (already refused by ``Recipe.check("dali")`` when DALI
    has no counterpart) on a batch of uint8 ``HWC`` images of ``size``, through
    ``nvidia.dali.auto_aug``; needs a pipeline with conditionals."""
    common: dict[str, Any] = {"seed": seed}
    if policy.kind == "timm_rand":
        # timm's magnitudes run 0-10 (m9 is 90 % of the range): 11 bins; inc1 is DALI's monotonic
        # suite; fill 128 and translations up to 45 % of the side, as timm does.
        return rand_augment.rand_augment(
            images, n=policy.num_ops, m=int(policy.magnitude), num_magnitude_bins=11,
            monotonic_mag=policy.increasing, fill_value=128, shape=list(size),
            max_translate_rel=0.45, **common)
    # torchvision's references: RandAugment(2, 9, 31 bins), TrivialAugmentWide (31 bins,
    # translations up to 32 pixels), AutoAugment(IMAGENET); fill 0 like torchvision.
    if policy.kind == "ra":
        return rand_augment.rand_augment(
            images, n=2, m=9, num_magnitude_bins=31, fill_value=0, shape=list(size),
            max_translate_rel=150 / 331, **common)
    if policy.kind == "ta_wide":
        return trivial_augment.trivial_augment_wide(
            images, num_magnitude_bins=31, fill_value=0, max_translate_abs=32, **common)
    return auto_augment.auto_augment(
        images, policy_name="image_net", fill_value=0, shape=list(size),
        max_translate_rel=150 / 331, **common)


def _eval_geometry(encoded: Any, images: Any, recipe: Recipe, interp: dict[str, Any]) -> Any:
    """The recipe's eval resize and centre crop, in DALI's integer arithmetic: the same sizes and
    the same crop rectangle as fastpipe._geometry gives the CPU decoder."""
    height, width = recipe.size
    resize_to = recipe.resize_to
    if isinstance(resize_to, int):
        # torchvision's Resize(int): the shorter side to resize_to, the longer floor(resize_to
        # * long / short); from the header, as the decoder sees it (EXIF orientation ignored).
        shape = fn.peek_image_shape(encoded, adjust_orientation=False, dtype=types.INT64)
        image_h, image_w = shape[0], shape[1]
        shorter = dmath.min(image_h, image_w)
        resized_h = resize_to * image_h // shorter
        resized_w = resize_to * image_w // shorter
        top, left = _centre_offset(resized_h - height), _centre_offset(resized_w - width)
    else:
        resized_h, resized_w = resize_to
        top = centre_offset(resized_h - height)
        left = centre_offset(resized_w - width)
    images = fn.resize(images, resize_y=fn.cast(resized_h, dtype=types.FLOAT),
                       resize_x=fn.cast(resized_w, dtype=types.FLOAT), **interp)
    start = [top, left] if isinstance(top, int) else fn.cast(fn.stack(top, left),
                                                             dtype=types.INT32)
    return fn.slice(images, start=start, shape=[height, width], axis_names="HW")


def _centre_offset(extra: Any) -> Any:
    """fastpipe._geometry.centre_offset on a DALI integer node: halves rounded to even."""
    half = extra // 2
    return half + (extra - 2 * half) * (half - 2 * (half // 2))


def _decode_and_augment(
    encoded: Any, recipe: Recipe, decode_device: str, seed: int | None = None,
    num_workers: int = 1, crop_decode: bool = True,
) -> Any:
    # No annotated locals in here: DALI's AutoGraph (needed by the automatic augmentations)
    # cannot convert a function that has them.
    height, width = recipe.size
    interp = {"interp_type": _INTERPOLATIONS[recipe.interpolation], "antialias": True}
    # EXIF orientation is ignored, as by torchvision and fastpipe's CPU decoder, so that every
    # loader sees the same pixels (DALI would rotate tagged photos by default).
    extra = {"adjust_orientation": False}
    if decode_device == "mixed":
        extra.update(memory_padding(num_workers))
    mirror = {}
    if recipe.train and crop_decode:
        # One op decodes only the random crop window (DALI's fused ROI decode), so no full-size
        # image is ever materialised; the resize then brings the window to the output size.
        images = fn.decoders.image_random_crop(
            encoded, device=decode_device, output_type=types.RGB,
            random_area=list(recipe.scale), random_aspect_ratio=list(recipe.ratio),
            num_attempts=10, **extra,
        )
        images = fn.resize(images, resize_x=width, resize_y=height, **interp)
    elif recipe.train:
        # crop_decode=False: the whole image is decoded, then cropped and resized on the decode's
        # device (the GPU after a mixed decode). Slower, but it avoids the ROI decode that
        # NVIDIA/nvImageCodec#55 reports failing with nvImageCodec 0.9 (DALI 2.4's).
        images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB, **extra)
        images = fn.random_resized_crop(
            images, size=[height, width], random_area=list(recipe.scale),
            random_aspect_ratio=list(recipe.ratio), num_attempts=10, **interp,
        )
    if recipe.train:
        if recipe.policy is not None:
            images = _apply_policy(recipe.policy, images, recipe.size, seed)
        if recipe.color_jitter is not None:
            brightness, contrast, saturation, hue = recipe.color_jitter
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
        if recipe.hflip > 0:
            mirror["mirror"] = fn.random.coin_flip(probability=recipe.hflip)
    else:
        images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB, **extra)
        images = _eval_geometry(encoded, images, recipe, interp)
    if recipe.dtype == torch.uint8:
        mean, std = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]  # flip and layout only
    elif recipe.mean is None:
        mean, std = [0.0, 0.0, 0.0], [255.0, 255.0, 255.0]  # 0-1 floats
    else:
        mean = [255.0 * m for m in recipe.mean]
        std = [255.0 * s for s in recipe.std]
    images = fn.crop_mirror_normalize(
        images, dtype=_DALI_DTYPES[recipe.dtype],
        output_layout="HWC" if recipe.channels_last else "CHW", mean=mean, std=std, **mirror,
    )
    if recipe.train and recipe.cutout_holes > 0:
        # Like fastpipe.ops.cutout: square holes of cutout_size pixels, centres uniform over the
        # image, clipped at the borders, filled with 0 (the mean colour when normalized).
        holes = recipe.cutout_holes
        images = fn.erase(
            images, anchor=fn.random.uniform(range=[0.0, 1.0], shape=[2 * holes]),
            shape=[float(recipe.cutout_size)] * (2 * holes), normalized_anchor=True,
            normalized_shape=False, centered_anchor=True, axis_names="HW", fill_value=0.0,
        )
    return images


def _classification_graph(
    source: Any, recipe: Recipe, decode_device: str, reader: dict[str, Any],
    decode: dict[str, Any],
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
    images = _decode_and_augment(encoded, recipe, decode_device, **decode)
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
    size: int | Sequence[int] = DEFAULT_SIZE,
    num_workers: int = 2,
    device: str | int | torch.device | None = None,
    seed: int | None = None,
    shuffle: bool | None = None,
    rank: int = 0,
    world_size: int = 1,
    root: str | os.PathLike | None = None,
    scale: Sequence[float] = DEFAULT_SCALE,
    ratio: Sequence[float] = DEFAULT_RATIO,
    hflip: float = DEFAULT_HFLIP,
    color_jitter: float | Sequence[float] | None = None,
    crop_pct: float = DEFAULT_CROP_PCT,
    interpolation: Any = DEFAULT_INTERPOLATION,
    auto_augment: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    cutout_holes: int = 0,
    cutout_size: int = DEFAULT_CUTOUT_SIZE,
    prefetch_depth: int = 2,
    reader_name: str = "Reader",
    recipe: Recipe | None = None,
    crop_decode: bool = True,
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
        num_workers: DALI CPU worker threads. With a GPU, nvJPEG's scratch memory is reserved
            per thread: fastpipe shares a budget of 201 MB of GPU memory and 134 MB of pinned
            memory between them (at least DALI's defaults, 16 MB and 2 x 8 MB, per thread).
        device: ``None`` (a GPU when torch and DALI see one, else the CPU), ``"cpu"`` (DALI's
            CPU mode, ``device_id=None``) or a GPU (``"gpu"``, ``"cuda"``, ``"cuda:N"``); with a
            GPU the decode is ``device="mixed"`` and every later op and both outputs are on the
            GPU. See :func:`dali_device_id`.
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
        recipe: a :class:`~fastpipe.Recipe` instead of the image keywords (``train`` to
            ``cutout_size``); not both.
        crop_decode: train: decode only the random crop window (DALI's fused
            ``decoders.image_random_crop``, the fastest). ``False`` decodes whole images, then
            crops and resizes them with ``fn.random_resized_crop`` on the same device: the
            workaround when the fused GPU decode fails (NVIDIA/nvImageCodec#55, nvImageCodec 0.9:
            ``INTERNAL_ERROR`` or a crash). The same crop distribution, other random draws. No
            effect on eval.
        pipeline_kwargs: passed on to the DALI ``Pipeline`` (e.g. ``exec_dynamic``).

    Returns:
        An unbuilt ``nvidia.dali.Pipeline``. Outputs: images ``(N, 3, H, W)`` (``(N, H, W, 3)``
        with ``channels_last``) of ``dtype``, labels ``(N,)`` int64 scalars per sample.
    """
    recipe = dali_recipe(
        recipe, image_pipeline, "image_pipeline", train=train, size=size, scale=scale,
        ratio=ratio, hflip=hflip, color_jitter=color_jitter, crop_pct=crop_pct,
        interpolation=interpolation, auto_augment=auto_augment, mean=mean, std=std, dtype=dtype,
        channels_last=channels_last, cutout_holes=cutout_holes, cutout_size=cutout_size,
    )
    device_id = dali_device_id(device)
    return build_pipeline(
        source, recipe=recipe, batch_size=batch_size, num_workers=num_workers,
        device_id=device_id, decode_device="cpu" if device_id is None else "mixed", seed=seed,
        shuffle=shuffle, rank=rank, world_size=world_size, root=root,
        prefetch_depth=prefetch_depth, reader_name=reader_name, crop_decode=crop_decode,
        **pipeline_kwargs,
    )


def build_pipeline(
    source: Any,
    *,
    recipe: Recipe,
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
    crop_decode: bool = True,
    **pipeline_kwargs: Any,
) -> Pipeline:
    """:func:`image_pipeline` with the device already resolved and the recipe checked.

    ``decode_device`` ("cpu" or "mixed") is separate from ``device_id`` so that the GPU graph can
    be built and serialized on a machine without a GPU (``device_id=None``, ``"mixed"``); such a
    pipeline cannot run there.
    """
    check.positive_int("batch_size", batch_size)
    check.positive_int("num_workers", num_workers)
    check.positive_int("prefetch_depth", prefetch_depth)
    if not isinstance(crop_decode, bool):
        raise TypeError(f"crop_decode must be True or False, got {crop_decode!r}")
    if decode_device not in ("cpu", "mixed"):
        raise ValueError(f"decode_device must be 'cpu' or 'mixed', got {decode_device!r}")
    reader: dict[str, Any] = {}
    shuffled = recipe.train if shuffle is None else bool(shuffle)
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
    # DALI's automatic augmentations are written with ``if``: they need conditionals.
    make = _classification_pipeline if recipe.policy is None else _conditional_pipeline
    decode = {"num_workers": num_workers, "crop_decode": crop_decode}
    return make(
        source, recipe, decode_device, reader, decode,
        batch_size=batch_size, num_threads=num_workers, device_id=device_id,
        seed=None if seed is None else int(seed), prefetch_queue_depth=prefetch_depth,
        **pipeline_kwargs,
    )


def dali_recipe(recipe: Recipe | None, owner: Any, where: str, **keywords: Any) -> Recipe:
    """The recipe of a DALI pipeline or loader (given, or built from its image keywords), refused
    here when DALI cannot run it (``Recipe.check``)."""
    recipe = Recipe.resolve(recipe, owner, where, **keywords)
    recipe.check("dali")
    return recipe
