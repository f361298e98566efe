"""``resize_crops``: the CPU image path's antialiased resize, over a batch of images of their own
sizes, on the CPU or the GPU.

The GPU decode (``fastpipe.gpu_decode``) decodes each sample's crop into an image of its own
size; this op resizes all of them into one ``(N, 3, H, W)`` uint8 batch, mirrored where the
recipe drew a flip, with the filters and antialiasing of ``fastpipe._resize`` (PIL's and torch's
antialiased bilinear and bicubic, rounded as fastpipe._resize rounds: the same bits).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastpipe import _validate as check
from fastpipe.ops import _extension, _reference
from fastpipe.recipe import RESIZE_FILTERS

__all__ = ["PLAN_COLUMNS", "input_span", "resize_crops", "resize_planned"]

# What each of a plan row's 9 values is.
PLAN_COLUMNS = ("top", "left", "image_height", "image_width", "out_top", "out_left",
                "resized_height", "resized_width", "flip")
_MAX_SIDE = 1 << 24


def resize_crops(images: Sequence[torch.Tensor], plan: torch.Tensor,
                 size: int | tuple[int, int], interpolation: str = "bilinear") -> torch.Tensor:
    """Resizes each image of ``images`` into one ``(N, 3, height, width)`` uint8 batch.

    ``images[n]`` is ``(h, w, 3)`` uint8, any strides (an HWC decode, or a CHW one permuted), on
    one device for all. ``plan`` is ``(N, 9)`` int64 on the CPU, one row per image
    (:data:`PLAN_COLUMNS`): image n is the ``h x w`` box at ``(top, left)`` of an image of
    ``image_height x image_width``; output n is the ``size`` box at ``(out_top, out_left)`` of that
    image resized to ``resized_height x resized_width``, mirrored left-right when ``flip`` is 1.
    A train crop is an image of its own (``top = left = 0``, its own size, resized to ``size``);
    an eval image is resized whole and the centre crop taken. Every pixel the output reads must
    be in the image (``fastpipe._resize.input_box`` says which).

    ``interpolation``: ``"bilinear"`` or ``"bicubic"``, antialiased: the pixels of the CPU image
    path's resize (``fastpipe._resize``), bit for bit, on every device.
    """
    height, width = check.size_pair("size", size)
    filter_ = RESIZE_FILTERS.get(getattr(interpolation, "value", interpolation))
    if filter_ is None:
        raise ValueError(f"interpolation must be 'bilinear' or 'bicubic', got {interpolation!r}")
    images = list(images)
    _check(images, plan, height, width, filter_)
    device = images[0].device
    if _extension.has_kernel("resize_crops", device):
        return torch.ops.fastpipe.resize_crops(images, plan, height, width, filter_)
    _extension.warn_fallback("resize_crops", device)
    return _reference.resize_crops(images, plan, height, width, filter_)


def resize_planned(images: list[torch.Tensor], plan: torch.Tensor, size: tuple[int, int],
                   filter_: int) -> torch.Tensor:
    """:func:`resize_crops` for plans fastpipe drew itself (GPU decode's, once per batch): the
    compiled kernel checks every image and plan row (csrc/resize_crops.h), so the per-image
    check in Python runs only where the pure-PyTorch reference resizes instead."""
    device = images[0].device
    if _extension.has_kernel("resize_crops", device):
        return torch.ops.fastpipe.resize_crops(images, plan, size[0], size[1], filter_)
    _check(images, plan, size[0], size[1], filter_)
    _extension.warn_fallback("resize_crops", device)
    return _reference.resize_crops(images, plan, size[0], size[1], filter_)


def _check(images: list[torch.Tensor], plan: torch.Tensor, height: int, width: int,
           filter_: int) -> None:
    if not images:
        raise ValueError("resize_crops needs at least one image")
    device = images[0].device
    for n, image in enumerate(images):
        if not isinstance(image, torch.Tensor):
            raise TypeError(f"resize_crops: image {n} is a {type(image).__name__}, not a tensor")
        if image.device != device:
            raise ValueError(f"resize_crops: image {n} is on {image.device}, image 0 on {device}; "
                             "pass images on one device")
        if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[2] != 3 or 0 in (
                image.shape[0], image.shape[1]):
            raise ValueError(f"resize_crops: image {n} must be (h, w, 3) uint8 and not empty, got "
                             f"{tuple(image.shape)} {image.dtype} (a (3, h, w) image: pass "
                             "image.permute(1, 2, 0))")
    if (not isinstance(plan, torch.Tensor) or plan.dtype != torch.int64
            or plan.device.type != "cpu" or tuple(plan.shape) != (len(images), len(PLAN_COLUMNS))):
        got = (f"{plan.dtype} {tuple(plan.shape)} on {plan.device}" if isinstance(
            plan, torch.Tensor) else type(plan).__name__)
        raise ValueError(f"resize_crops: plan must be an ({len(images)}, 9) int64 tensor on the "
                         f"CPU (one row per image: {', '.join(PLAN_COLUMNS)}), got {got}")
    for n, (image, row) in enumerate(zip(images, plan.tolist())):
        problem = _plan_problem(image.shape[0], image.shape[1], row, height, width, filter_)
        if problem:
            raise ValueError(f"resize_crops: plan row {n} {row}: {problem}")


def _plan_problem(h: int, w: int, row: list[int], height: int, width: int,
                  filter_: int) -> str | None:
    top, left, full_h, full_w, out_top, out_left, resized_h, resized_w, flip = row
    if not (all(1 <= v <= _MAX_SIDE for v in (full_h, full_w, resized_h, resized_w))
            and all(0 <= v <= _MAX_SIDE for v in (top, left, out_top, out_left))
            and flip in (0, 1)):
        return "sizes must be 1 to 2**24, offsets 0 to 2**24 and flip 0 or 1"
    if top + h > full_h or left + w > full_w:
        return f"a {h}x{w} image at ({top}, {left}) does not fit an image of {full_h}x{full_w}"
    if out_top + height > resized_h or out_left + width > resized_w:
        return (f"a {height}x{width} output at ({out_top}, {out_left}) does not fit the resized "
                f"image of {resized_h}x{resized_w}")
    for full, resized, first, count, lo, size in ((full_h, resized_h, out_top, height, top, h),
                                                  (full_w, resized_w, out_left, width, left, w)):
        start, length = input_span(full, resized, first, count, filter_)
        if start < lo or start + length > lo + size:
            return ("the image does not hold every input pixel the output reads "
                    "(fastpipe._resize.input_box gives them)")
    return None


def input_span(in_size: int, resized: int, first: int, count: int,
               interpolation: int | str = "bilinear") -> tuple[int, int]:
    """``(start, length)``: the input pixels along one axis that outputs ``first`` to
    ``first + count - 1`` of the axis resized from ``in_size`` to ``resized`` read (what
    ``fastpipe._resize.input_box`` gives per axis). Taps only move forward with the output, so
    the first and last outputs bound them."""
    filter_ = interpolation if isinstance(interpolation, int) else RESIZE_FILTERS[interpolation]
    start = _reference.resize_tap_span(in_size, resized, first, filter_)[0]
    end = _reference.resize_tap_span(in_size, resized, first + count - 1, filter_)[1]
    return start, end - start
