"""Crop geometry for the fused decode path: where to crop, and at which DCT scale to decode.

Everything here is plain integer and float arithmetic on image sizes, so it can be checked against
torchvision without decoding anything.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

# libjpeg-turbo decodes at any M/8 scale, but only 1/2, 1/4 and 1/8 have fast reduced inverse DCTs
# (SIMD 4x4 and 2x2, DC-only 1x1); the others (7/8, 3/4, ...) run plain C, slower than a full-size
# decode (docs/cpu-path.md), so they are never asked for.
DCT_SCALES = (8, 4, 2, 1)


class Box(NamedTuple):
    """A crop in pixel coordinates of the full-size image: rows ``top:top+height``, columns
    ``left:left+width`` (the order of torchvision's ``RandomResizedCrop.get_params``)."""

    top: int
    left: int
    height: int
    width: int


# Uniform numbers one train crop consumes: 10 attempts of (area, log-ratio), then row, column, flip.
UNIFORMS_PER_CROP = 23


def draw_uniforms(generator: torch.Generator | None = None) -> list[float]:
    """The uniform [0, 1) numbers for one train crop, in one call on ``generator`` (torch's
    default generator when None, as torchvision's transforms draw).

    fastpipe's datasets pass a generator seeded from (seed, epoch, index)
    (fastpipe.data._random), so crops do not depend on the worker that draws them.
    """
    return torch.rand(UNIFORMS_PER_CROP, dtype=torch.float64, generator=generator).tolist()


def random_resized_crop_box(
    height: int,
    width: int,
    uniforms: list[float],
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
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


def eval_resize(height: int, width: int, resize_to: int | tuple[int, int]) -> tuple[int, int]:
    """The size torchvision's ``Resize(resize_to)`` gives: for an int, shorter side
    ``resize_to``, the longer scaled and truncated to an int; a ``(height, width)`` as is."""
    if not isinstance(resize_to, int):
        return int(resize_to[0]), int(resize_to[1])
    if height <= width:
        return resize_to, int(resize_to * width / height)
    return int(resize_to * height / width), resize_to


def centre_box(height: int, width: int, size: int | tuple[int, int]) -> Box:
    """torchvision's ``CenterCrop(size)`` (an int, or ``(height, width)``) on an image at least
    that large."""
    out_h, out_w = (size, size) if isinstance(size, int) else size
    return Box(int(round((height - out_h) / 2.0)), int(round((width - out_w) / 2.0)), out_h, out_w)


def dct_scale(height: int, width: int, need_height: float, need_width: float) -> int:
    """The largest reduction ``k`` in 8, 4, 2, 1 at which the image ``height x width``, decoded at
    ``1/k`` of its size, is still at least ``need_height x need_width`` pixels, so the resize after
    the decode only ever shrinks."""
    for k in DCT_SCALES:
        if height / k >= need_height and width / k >= need_width:
            return k
    return 1
