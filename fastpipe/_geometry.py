"""Where an image is cropped: the geometry of :class:`fastpipe.Recipe`, for every backend.

Plain integer and float arithmetic on image sizes, so it can be checked against torchvision
without decoding anything; fastpipe/csrc/jpeg/train_plan.h repeats the train crop's arithmetic
in C++, operation for operation, and DALI's eval graph (fastpipe/dali/pipelines.py) the eval
geometry in DALI's integer arithmetic.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fastpipe._constants import DEFAULT_RATIO, DEFAULT_SCALE


class Box(NamedTuple):
    """A crop in pixel coordinates of the full-size image: rows ``top:top+height``, columns
    ``left:left+width`` (the order of torchvision's ``RandomResizedCrop.get_params``)."""

    top: int
    left: int
    height: int
    width: int


# Uniform numbers one train crop consumes: 10 attempts of (area, log-ratio), then row, column, flip.
UNIFORMS_PER_CROP = 23
# The flip's: the last of them.
FLIP_UNIFORM = 22


def draw_uniforms(generator: torch.Generator | None = None) -> list[float]:
    """The uniform [0, 1) numbers for one train crop, in one call on ``generator`` (torch's
    default generator when None, as torchvision's transforms draw).

    fastpipe's datasets pass a generator seeded from (seed, epoch, index)
    (fastpipe.data.sampling.seeds), so crops do not depend on the worker that draws them.
    """
    return torch.rand(UNIFORMS_PER_CROP, dtype=torch.float64, generator=generator).tolist()


def random_resized_crop_box(
    height: int,
    width: int,
    uniforms: list[float],
    scale: tuple[float, float] = DEFAULT_SCALE,
    ratio: tuple[float, float] = DEFAULT_RATIO,
) -> Box:
    """A crop of an image ``height x width`` drawn as torchvision's RandomResizedCrop draws it.

    Up to 10 attempts: area fraction uniform in ``scale``, log aspect ratio (width / height)
    uniform in ``log(ratio)``, sides rounded to the nearest pixel; the first crop that fits is
    placed uniformly over the positions where it fits. When none fits, the centre crop of the
    whole image clamped to ``ratio``. ``uniforms`` are :data:`UNIFORMS_PER_CROP` numbers in [0, 1)
    (from :func:`draw_uniforms`).
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(10):
        u_area, u_ratio = uniforms[2 * attempt], uniforms[2 * attempt + 1]
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u_area)
        aspect = math.exp(log_lo + (log_hi - log_lo) * u_ratio)
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(uniforms[20] * (height - h + 1))
            left = int(uniforms[21] * (width - w + 1))
            return Box(top, left, h, w)
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return Box((height - h) // 2, (width - w) // 2, h, w)


def eval_resize_to(size: tuple[int, int], crop_pct: float) -> int | tuple[int, int]:
    """What eval resizes an image to before the centre crop of ``size``, as the argument of
    torchvision's ``Resize``. A square ``size``: the shorter side to ``size / crop_pct`` (256 for
    224 at 0.875; torchvision's and timm's eval). ``(height, width)``: each side to
    ``side / crop_pct``, the aspect ratio not kept (timm's ``crop_mode="squash"``), so the crop
    always fits. The small epsilon keeps a quotient that is an integer in exact arithmetic from
    rounding down (``190 / 0.95``)."""
    height, width = size
    if height == width:
        return int(height / crop_pct + 1e-9)
    return int(height / crop_pct + 1e-9), int(width / crop_pct + 1e-9)


def eval_resize(height: int, width: int, resize_to: int | tuple[int, int]) -> tuple[int, int]:
    """The size torchvision's ``Resize(resize_to)`` gives an image ``height x width``: for an int,
    the shorter side ``resize_to`` and the longer scaled and truncated (``floor(resize_to * long /
    short)``, which integer division computes exactly); a ``(height, width)`` as it is."""
    if not isinstance(resize_to, int):
        return int(resize_to[0]), int(resize_to[1])
    if height <= width:
        return resize_to, resize_to * width // height
    return resize_to * height // width, resize_to


def centre_offset(extra: int) -> int:
    """Where a centre crop starts when the image has ``extra`` more pixels than the crop along an
    axis: torchvision's ``int(round(extra / 2))``, halves rounded to even, in integers."""
    half = extra // 2
    return half + (extra - 2 * half) * (half % 2)


def centre_box(height: int, width: int, size: int | tuple[int, int]) -> Box:
    """torchvision's ``CenterCrop(size)`` (an int, or ``(height, width)``) on an image at least
    that large."""
    out_h, out_w = (size, size) if isinstance(size, int) else size
    return Box(centre_offset(height - out_h), centre_offset(width - out_w), out_h, out_w)
