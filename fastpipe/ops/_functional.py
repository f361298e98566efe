"""The public batch ops: argument checks, random parameters, and dispatch to the compiled kernels.

Each op validates its arguments (clear errors, never a crash in C++), draws its random parameters
on the CPU (``_params``), and calls ``torch.ops.fastpipe.<op>`` when the extension has a kernel for
the images' device, or the pure-PyTorch reference otherwise (``_reference``, same results).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

from fastpipe import _validate as check
from fastpipe.ops import _extension, _params, _reference

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CPU = _params.CPU
_IMAGE_DTYPES = (torch.uint8, *_FLOAT_DTYPES)

Fill = float | Sequence[float]


def extension_available(device: str | torch.device = "cpu") -> bool:
    """Whether the compiled kernels (fastpipe._C) serve ``device``; otherwise the ops fall back to
    their pure-PyTorch reference, with a one-time warning."""
    device = torch.device(device)
    return all(_extension.has_kernel(name, device) for name in _extension.OP_NAMES)


def _run(name: str, images: torch.Tensor, *args):
    if _extension.has_kernel(name, images.device):
        return getattr(torch.ops.fastpipe, name)(images, *args)
    _extension.warn_fallback(name, images.device)
    return getattr(_reference, name)(images, *args)


def _apply(op: str, kernel: str, images: torch.Tensor, *args, inplace: bool) -> torch.Tensor:
    """Runs ``kernel`` into a new tensor, or its in-place variant ``kernel_`` on ``images``."""
    if not inplace:
        return _run(kernel, images, *args)
    if images.requires_grad:
        raise ValueError(
            f"{op}(inplace=True) does not support autograd (the images require grad); "
            "use inplace=False, which is differentiable"
        )
    if _eager() and not _elements_apart(images):
        raise ValueError(
            f"{op}(inplace=True): the images' strides {tuple(images.stride())} let elements "
            "share memory (an expanded or overlapping view), so writing one would change "
            "another; pass images.clone() (or .contiguous()), or use inplace=False"
        )
    _run(f"{kernel}_", images, *args)
    return images


def _elements_apart(images: torch.Tensor) -> bool:
    """Whether every element has its own memory: with the dimensions sorted by stride, each
    stride passes the farthest element the smaller ones reach. (A sufficient test; the one the
    kernels apply too, fastpipe/csrc/common.h.)"""
    reach = 0
    for stride, size in sorted(zip(images.stride(), images.shape)):
        if size > 1:
            if stride <= reach:
                return False
            reach += stride * (size - 1)
    return True


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Moves a small CPU parameter tensor to ``device`` without making the host wait for the GPU.

    A copy from pageable host memory synchronizes the stream first, which would stall the host
    once per op call until the GPU has finished all the work queued before it; a copy from pinned
    memory with non_blocking=True is queued like a kernel (PyTorch's pinned-memory cache keeps the
    buffer alive until the copy has run). Under torch.compile the same copy runs as the opaque op
    ``fastpipe::host_to_device``: Dynamo cannot trace ``pin_memory`` (no fake kernel), and a
    traced ``.to(device)`` would be the blocking pageable copy on every call of the compiled code.
    """
    on_host = not isinstance(t, torch.Tensor) or t.device.type == "cpu"
    if device.type != "cuda" or not on_host:
        # Only host tensors are pinned: a tensor already on a GPU cannot be, and needs no copy.
        return t.to(device)
    if torch.compiler.is_compiling():
        return torch.ops.fastpipe.host_to_device(t, device)
    return _pinned_copy(t, device)


def _pinned_copy(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if _capturing():
        # A captured graph would replay this copy from a host buffer the allocator has reused,
        # with the parameters drawn at capture time: no new randomness, possibly garbage.
        raise RuntimeError(
            "fastpipe.ops draw their parameters on the host and copy them to the GPU, which a "
            "CUDA graph cannot capture (replays would reuse the captured values). Call the op "
            "outside torch.cuda.graph / CUDA-graph capture (e.g. in DataPrefetcher's "
            "batch_transform); for normalize, pass mean and std as CUDA tensors"
        )
    return t.contiguous().pin_memory().to(device, non_blocking=True)


@torch.library.custom_op("fastpipe::host_to_device", mutates_args=())
def _host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """_pinned_copy as an op torch.compile keeps whole in its graph (see _to_device)."""
    return _pinned_copy(t, device)


@_host_to_device.register_fake
def _(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=device)


def refuse_capture(op: str, images: torch.Tensor) -> None:
    """Raises when a random op or batch transform is called while a CUDA graph is captured.

    Checked at the entry of each, not only where a parameter is copied: a call that draws
    "do not mix" (Mixup with prob < 1, or mixup_enabled=False) copies nothing, so a capture would
    succeed and every replay return the unmixed images with the capture-time targets.
    """
    if torch.compiler.is_compiling():
        return  # compiled code copies through fastpipe::host_to_device, which checks at run time
    if _capturing():  # on this thread's current stream, whatever the images' device
        raise RuntimeError(
            f"{op} draws its random parameters on the host at every call, which a CUDA graph "
            "cannot capture (every replay would repeat the capture-time draw). Call it outside "
            "torch.cuda.graph / CUDA-graph capture (e.g. in DataPrefetcher's batch_transform)"
        )


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a CUDA graph."""
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # no usable CUDA driver: nothing can be capturing
        return False


def _eager() -> bool:
    """False while torch.compile traces: checks that read tensor values are skipped then."""
    return not torch.compiler.is_compiling()


def _check_images(op: str, images: torch.Tensor, random_boxes: bool = False) -> None:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"{op} expects a torch.Tensor image batch, got {type(images).__name__}")
    if images.dim() != 4:
        raise ValueError(
            f"{op} expects a 4-D (N, C, H, W) image batch, got shape {tuple(images.shape)}; "
            "for a single image use images.unsqueeze(0)"
        )
    if images.dtype not in _IMAGE_DTYPES:
        raise TypeError(
            f"{op} supports uint8, float32, float16 and bfloat16 images, got {images.dtype}; "
            "convert with images.float() or images.to(torch.uint8)"
        )
    if random_boxes and (images.shape[2] == 0 or images.shape[3] == 0):
        raise ValueError(
            f"{op} needs images with a height and width, got shape {tuple(images.shape)}"
        )


def _check_generator(op: str, generator: torch.Generator | None) -> None:
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{op}: generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    if generator.device.type != "cpu":
        raise ValueError(
            f"{op}: generator must be a CPU torch.Generator (got one on {generator.device}): the "
            "random parameters are drawn on the CPU so that a seed gives the same result on every "
            "device; use torch.Generator().manual_seed(seed)"
        )


def _check_range(op: str, name: str, value: object, low: float, high: float) -> tuple[float, float]:
    if (
        not isinstance(value, Sequence)
        or len(value) != 2
        or not all(isinstance(v, numbers.Real) for v in value)
        or not low <= value[0] <= value[1] <= high
    ):
        raise ValueError(
            f"{op}: {name} must be a (min, max) pair with {low} <= min <= max <= {high}, got "
            f"{value!r}"
        )
    return float(value[0]), float(value[1])


def _fill_values(op: str, name: str, value: object, images: torch.Tensor) -> torch.Tensor:
    """A number or C numbers -> ``(C,)`` tensor of the images' dtype on their device.

    Values are in the images' own scale: 0-255 for uint8 (rounded to the nearest integer), the
    float values themselves otherwise (0-1, or normalized units after normalize).
    """
    channels = images.shape[1]
    if isinstance(value, torch.Tensor):
        value = value.flatten().tolist()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        values = [float(value)] * channels
    elif isinstance(value, Sequence) and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value
    ):
        values = [float(v) for v in value]
        if len(values) == 1:
            values = values * channels
    else:
        raise TypeError(f"{op}: {name} must be a number or a sequence of numbers, got {value!r}")
    if len(values) != channels:
        raise ValueError(
            f"{op}: {name} has {len(values)} values but the images have {channels} channels; "
            f"pass one number, or one per channel"
        )
    if images.dtype == torch.uint8:
        values = [round(v) for v in values]
        if not all(0 <= v <= 255 for v in values):
            raise ValueError(
                f"{op}: {name} {values} is outside 0-255, the range of uint8 images; pass pixel "
                "values in 0-255 (or normalize the images first and pass normalized values)"
            )
    return _to_device(torch.tensor(values, dtype=images.dtype, device=_CPU), images.device)


def normalize(
    images: torch.Tensor,
    mean: Sequence[float] | torch.Tensor,
    std: Sequence[float] | torch.Tensor,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    """Converts an image batch to normalized floats in one pass: ``(x / 255 - mean) / std``.

    Args:
        images: ``(N, C, H, W)`` uint8 (0-255) or float (0-1), any memory layout.
        mean, std: ``C`` values each, in the 0-1 scale (torchvision's ImageNet numbers, e.g.
            ``(0.485, 0.456, 0.406)``), whatever the input dtype.
        dtype: float32, float16 or bfloat16.
        channels_last: return the result in ``torch.channels_last`` memory format.

    Returns:
        ``(N, C, H, W)`` tensor of ``dtype`` on the device of ``images``. Differentiable with
        respect to float images (the gradient is scaled by ``1 / std``).
    """
    _check_images("normalize", images)
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"normalize outputs float32, float16 or bfloat16, got dtype={dtype}")
    channels = images.shape[1]
    vectors = []
    for name, values in (("mean", mean), ("std", std)):
        if isinstance(values, torch.Tensor):
            vector = values.to(torch.float32).flatten()
        else:  # numbers: a host tensor, whatever torch's default device
            vector = torch.tensor(values, dtype=torch.float32, device=_CPU).flatten()
        if vector.numel() != channels:
            raise ValueError(
                f"{name} has {vector.numel()} values but the images have {channels} channels; "
                f"pass one {name} value per channel"
            )
        vectors.append(vector)
    mean_t, std_t = vectors
    if _eager() and std_t.device.type == "cpu" and bool(((std_t == 0) | ~std_t.isfinite()).any()):
        raise ValueError(f"std must not contain zeros or non-finite values, got {std_t.tolist()}")
    if _eager() and mean_t.device.type == "cpu" and not bool(mean_t.isfinite().all()):
        raise ValueError(f"mean must be finite, got {mean_t.tolist()}")
    mean_t, std_t = _statistics_on(mean_t, images.device), _statistics_on(std_t, images.device)
    return _run("normalize", images, mean_t, std_t, dtype, bool(channels_last))


# normalize's host statistics on each GPU, copied once per (GPU, values): a training loop passes
# the same mean and std at every call. Never evicted (a block freed while a kernel on another
# stream still reads it could be rewritten); past _MAX_STATISTICS entries, new values are
# copied per call instead.
_STATISTICS: dict[tuple[int, tuple[float, ...]], torch.Tensor] = {}
_MAX_STATISTICS = 64


def _statistics_on(vector: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A float32 mean or std vector on ``device``: host values on a GPU come from the cache."""
    if device.type != "cuda" or vector.device.type != "cpu" or torch.compiler.is_compiling():
        return _to_device(vector, device)
    if _capturing():
        return _to_device(vector, device)  # raises: host values cannot be captured
    index = torch.cuda.current_device() if device.index is None else device.index
    key = (index, tuple(vector.tolist()))
    cached = _STATISTICS.get(key)
    if cached is None:
        if len(_STATISTICS) >= _MAX_STATISTICS:
            return _to_device(vector, device)
        # Copied once, finished before any stream can read it, so every stream may use the
        # cached tensor without waiting. The copy runs on a stream of its own: a pageable copy
        # waits for its stream to drain, and the current one may hold a step's queued work.
        stream = torch.cuda.Stream(device=index)
        with torch.cuda.stream(stream):
            copy = vector.to(torch.device("cuda", index))
        stream.synchronize()
        cached = _STATISTICS.setdefault(key, copy)
    return cached


def cutout(
    images: torch.Tensor,
    num_holes: int = 1,
    size: int = 16,
    fill: Fill = 0,
    generator: torch.Generator | None = None,
    inplace: bool = False,
) -> torch.Tensor:
    """Cuts ``num_holes`` square holes into every sample, at random places (Cutout).

    Each hole is ``size`` x ``size`` pixels around a centre drawn uniformly over the image's
    pixels, independently per hole and per sample, and clipped at the border, so holes near an
    edge are smaller (DeVries & Taylor, 2017; their code makes odd sizes one pixel smaller).

    Args:
        images: ``(N, C, H, W)`` uint8, float32, float16 or bfloat16, any memory layout.
        num_holes: holes per sample (0 returns a copy).
        size: side of a hole in pixels.
        fill: a number or ``C`` numbers, in the images' scale (0-255 for uint8).
        generator: a CPU ``torch.Generator`` for the hole positions (default: torch's global one).
        inplace: write the holes into ``images`` and return it (no copy of the batch; no
            autograd). Otherwise a new tensor is returned and ``images`` is left as it is.

    Returns:
        ``(N, C, H, W)`` like ``images`` (channels_last stays channels_last). Differentiable with
        respect to float images when not in place (zero gradient in the holes).
    """
    _check_images("cutout", images, random_boxes=True)
    refuse_capture("cutout", images)
    num_holes = check.non_negative_int("num_holes", num_holes, where="cutout")
    size = check.positive_int("size", size, where="cutout")
    _check_generator("cutout", generator)
    fill_t = _fill_values("cutout", "fill", fill, images)
    n, _, h, w = images.shape
    boxes = _to_device(_params.cutout_boxes(n, h, w, num_holes, size, generator), images.device)
    return _apply("cutout", "erase", images, boxes, fill_t, None, inplace=inplace)


# The value strings of random_erasing: per-pixel noise (torchvision's 'random', timm's mode
# 'pixel') and one colour per box and channel (timm's mode 'rand').
_PIXEL_NOISE = ("random", "pixel")
_BOX_COLOUR = "rand"


def random_erasing(
    images: torch.Tensor,
    p: float = 0.5,
    scale: tuple[float, float] = (0.02, 1 / 3),
    ratio: tuple[float, float] = (0.3, 3.3),
    value: Fill | str = 0,
    max_count: int = 1,
    generator: torch.Generator | None = None,
    inplace: bool = False,
    min_count: int = 1,
) -> torch.Tensor:
    """Random Erasing (Zhong et al., 2017) of every sample, as torchvision's and timm's
    RandomErasing.

    Each sample is erased with probability ``p``, in ``count`` rectangles (``count`` uniform in
    ``min_count..max_count``, timm's ``count``). A rectangle has an area of ``uniform(scale)``
    times the image area divided by ``count``, an aspect ratio ``h / w`` log-uniform in
    ``ratio``, and a uniformly random position where it fits; ten attempts, else nothing is
    erased. Rectangles are filled in order (where they overlap, the later one's value wins).

    Args:
        images: ``(N, C, H, W)`` uint8, float32, float16 or bfloat16, any memory layout; usually
            after normalize (random values are in normalized units).
        p: probability that a sample is erased.
        scale: (min, max) erased fraction of the image area.
        ratio: (min, max) aspect ratio of the rectangle.
        value: what fills the rectangles (timm's ``mode`` names in brackets):

            - a number or ``C`` numbers, in the images' scale (``0``: timm's ``'const'``);
            - ``'random'`` or ``'pixel'``: per-pixel noise (torchvision's ``value='random'``,
              timm's ``'pixel'``), approximately N(0, 1) for float images (an Irwin-Hall sum of
              12 uniforms, exact on every device) and uniform 0-255 for uint8 images;
            - ``'rand'``: one colour per rectangle and channel (timm's ``'rand'``), N(0, 1) for
              float images and uniform 0-255 for uint8 images.
        max_count: the largest number of rectangles per sample.
        generator: a CPU ``torch.Generator`` for all random draws, noise included.
        inplace: erase ``images`` itself and return it (as timm's RandomErasing does; no autograd).
        min_count: the smallest number of rectangles per sample (timm's ``min_count``).

    Returns:
        ``(N, C, H, W)`` like ``images``; differentiable with respect to float images when not in
        place (zero gradient in the erased rectangles).
    """
    boxes, fill_t, seeds = erasing_params(
        "random_erasing", images, p, scale, ratio, value, min_count, max_count, generator
    )
    return _apply("random_erasing", "erase", images, boxes, fill_t, seeds, inplace=inplace)


def erasing_params(
    op: str,
    images: torch.Tensor,
    p: float,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    value: Fill | str,
    min_count: int,
    max_count: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Checks random_erasing's arguments and draws its parameters, on the images' device: the
    ``(N, max_count, 4)`` boxes, the fill (``(C,)``, or ``(N, max_count, C)`` for ``'rand'``) and
    the ``(N,)`` noise seeds for per-pixel noise (else None)."""
    _check_images(op, images, random_boxes=True)
    refuse_capture(op, images)
    p = check.probability("p", p, where=op)
    scale = _check_range(op, "scale", scale, 0.0, 1.0)
    ratio_range = _check_range(op, "ratio", ratio, 0.0, float("inf"))
    if ratio_range[0] <= 0:
        raise ValueError(f"{op}: ratio must be positive, got {ratio!r}")
    max_count = check.positive_int("max_count", max_count, where=op)
    min_count = check.positive_int("min_count", min_count, where=op)
    if min_count > max_count:
        raise ValueError(
            f"{op}: min_count ({min_count}) must not exceed max_count ({max_count})"
        )
    _check_generator(op, generator)
    mode = value if isinstance(value, str) else None
    if mode is not None and mode not in (*_PIXEL_NOISE, _BOX_COLOUR):
        raise ValueError(
            f"{op}: value must be a number, C numbers, 'random' or 'pixel' (noise per pixel) or "
            f"'rand' (one colour per rectangle), got {value!r}"
        )
    n, c, h, w = images.shape
    boxes = _params.erasing_boxes(
        n, h, w, float(p), scale, ratio_range, max_count, generator, min_count=min_count
    )
    seeds = None
    if mode in _PIXEL_NOISE:
        fill_t = _fill_values(op, "value", 0, images)
        draw = _params.generator_kwargs(generator)
        seeds = _to_device(torch.randint(0, 2**32, (n,), device=_CPU, **draw), images.device)
    elif mode == _BOX_COLOUR:
        draw = _params.generator_kwargs(generator)
        if images.dtype == torch.uint8:
            colours = torch.randint(0, 256, (n, max_count, c), device=_CPU, **draw)
        else:
            colours = torch.randn(n, max_count, c, device=_CPU, **draw)
        fill_t = _to_device(colours.to(images.dtype), images.device)
    else:
        fill_t = _fill_values(op, "value", value, images)
    return _to_device(boxes, images.device), fill_t, seeds


def _check_mix_args(op, images, targets, alpha, num_classes, label_smoothing, generator) -> None:
    _check_images(op, images, random_boxes=op == "cutmix")
    check.positive_float("alpha", alpha, where=op)
    check.positive_int("num_classes", num_classes, where=op)
    if not isinstance(label_smoothing, numbers.Real) or not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1), got {label_smoothing!r}")
    _check_generator(op, generator)
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"{op}: targets must be a tensor, got {type(targets).__name__}")
    n = images.shape[0]
    if targets.dtype.is_floating_point:
        if tuple(targets.shape) != (n, num_classes):
            raise ValueError(
                f"{op}: soft targets must have shape (N, num_classes) = {(n, num_classes)}, "
                f"got {tuple(targets.shape)}"
            )
    elif targets.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        if tuple(targets.shape) != (n,):
            raise ValueError(
                f"{op}: class-index targets must have shape (N,) = ({n},), got "
                f"{tuple(targets.shape)}"
            )
        # Checked on the CPU only: reading a CUDA tensor's values would wait for the GPU.
        if (
            _eager()
            and targets.device.type == "cpu"
            and targets.numel()
            and bool(((targets < 0) | (targets >= num_classes)).any())
        ):
            raise ValueError(
                f"{op}: targets must be class indices in [0, {num_classes}), got values from "
                f"{int(targets.min())} to {int(targets.max())}"
            )
    else:
        raise TypeError(
            f"{op}: targets must be integer class indices or float soft targets, got "
            f"{targets.dtype}"
        )


def _soft_targets(
    targets: torch.Tensor, num_classes: int, lam: torch.Tensor, label_smoothing: float
) -> torch.Tensor:
    """timm's mixup_target: smoothed one-hot (or smoothed soft) targets mixed with the flipped
    batch.

    ``y * lam + y.flip(0) * (1 - lam)`` in float32, with ``y`` the smoothed targets and ``lam`` a
    0-d float32 tensor on the CPU.
    """
    off = label_smoothing / num_classes
    on = 1.0 - label_smoothing + off
    if targets.dtype.is_floating_point or not _eager():
        if targets.dtype.is_floating_point:
            y = targets.to(torch.float32) * (1.0 - label_smoothing) + off
        else:
            y = torch.full(
                (targets.shape[0], num_classes), off, dtype=torch.float32, device=targets.device
            )
            y = y.scatter(1, targets.long().view(-1, 1), on)
        weight = _to_device(lam.to(torch.float32), targets.device)
        return y * weight + y.flip(0) * (1 - weight)
    # Class indices: every entry of that sum is one of four float32 numbers, computed here with
    # the same float32 roundings, so the result is the same bits from one fill and two scatters
    # instead of six passes over (N, K), which cost more than the mix itself on small images
    # (timed in docs/ops.md, "Less Python per call").
    weight = np.float32(lam.item())
    rest = np.float32(1) - weight
    off32, on32 = np.float32(off), np.float32(on)

    def mix(own: np.float32, other: np.float32) -> float:
        return float(np.float32(own * weight) + np.float32(other * rest))

    own_class = targets.long().view(-1, 1)
    partner_class = own_class.flip(0)
    soft = torch.full(
        (targets.shape[0], num_classes), mix(off32, off32), dtype=torch.float32,
        device=targets.device,
    )
    soft.scatter_(1, partner_class, mix(off32, on32))
    own_value = torch.full(
        own_class.shape, mix(on32, off32), dtype=torch.float32, device=targets.device
    ).masked_fill_(own_class == partner_class, mix(on32, on32))
    return soft.scatter_(1, own_class, own_value)


def mixup(
    images: torch.Tensor,
    targets: torch.Tensor,
    alpha: float,
    num_classes: int,
    label_smoothing: float = 0.0,
    generator: torch.Generator | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup (Zhang et al., 2018) of a batch with its reverse, as timm's Mixup in 'batch' mode.

    One weight ``lam ~ Beta(alpha, alpha)`` per call; sample n becomes
    ``lam * x[n] + (1 - lam) * x[N - 1 - n]`` (in float32, rounded half to even for uint8) and its
    target ``lam * y[n] + (1 - lam) * y[N - 1 - n]`` with ``y`` the label-smoothed one-hot targets.
    With an odd batch the middle sample is mixed with itself.

    Args:
        images: ``(N, C, H, W)`` uint8, float32, float16 or bfloat16, any memory layout.
        targets: ``(N,)`` integer class indices, or ``(N, num_classes)`` float soft targets (for
            example from an earlier mix; smoothing then applies to them as ``y * (1 - s) + s / K``).
        alpha: Beta distribution parameter, > 0.
        num_classes: number of classes ``K``.
        label_smoothing: ``s``: on-value ``1 - s + s / K``, off-value ``s / K``.
        generator: a CPU ``torch.Generator`` for ``lam``.
        inplace: mix ``images`` itself and return it, as timm's Mixup does (no autograd; with
            the compiled kernels and a dense NCHW or channels_last batch, no new batch is
            allocated). Otherwise a new tensor is returned and ``images`` is left as it is.

    Returns:
        ``(images, targets)``: mixed ``(N, C, H, W)`` images like the input, and ``(N, K)``
        float32 soft targets on the targets' device. Differentiable with respect to float images
        when not in place.
    """
    _check_mix_args("mixup", images, targets, alpha, num_classes, label_smoothing, generator)
    refuse_capture("mixup", images)
    lam = _params.beta(alpha, generator).to(torch.float32)
    weights = _to_device(lam.reshape(1).expand(images.shape[0]), images.device)
    mixed = _apply("mixup", "mixup", images, weights, inplace=inplace)
    return mixed, _soft_targets(targets, num_classes, lam, label_smoothing)


def cutmix(
    images: torch.Tensor,
    targets: torch.Tensor,
    alpha: float,
    num_classes: int,
    label_smoothing: float = 0.0,
    generator: torch.Generator | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CutMix (Yun et al., 2019) of a batch with its reverse, as timm's Mixup in 'batch' mode.

    One ``lam ~ Beta(alpha, alpha)`` per call gives one box for the whole batch, timm 1.0's
    ``rand_bbox``: side ``cut = int(H * sqrt(1 - lam))``, rows ``cy - cut // 2`` to
    ``cy + (cut + 1) // 2`` around a centre uniform over the pixels (columns alike), clipped at
    the border. Sample n gets that box from sample ``N - 1 - n``; targets are mixed with the
    corrected weight ``1 - box area / (H * W)`` (timm's ``correct_lam=True``).

    Args:
        images: ``(N, C, H, W)`` uint8, float32, float16 or bfloat16, any memory layout.
        targets, alpha, num_classes, label_smoothing, generator, inplace: as in :func:`mixup`
            (in place, only the box of each sample and of its partner is written).

    Returns:
        ``(images, targets)``: mixed images like the input and ``(N, K)`` float32 soft targets.
    """
    _check_mix_args("cutmix", images, targets, alpha, num_classes, label_smoothing, generator)
    refuse_capture("cutmix", images)
    _, _, h, w = images.shape
    lam = _params.beta(alpha, generator)
    box, corrected = _params.cutmix_box(h, w, lam, generator)
    boxes = _to_device(box.view(1, 4).expand(images.shape[0], 4), images.device)
    mixed = _apply("cutmix", "cutmix", images, boxes, inplace=inplace)
    return mixed, _soft_targets(targets, num_classes, corrected.to(torch.float32), label_smoothing)
