"""Fake (meta) kernels of the compiled ops: output shapes, dtypes and layouts, for torch.compile.

Imported by fastpipe.ops only when the extension is loaded (the ops must exist to register).
"""

from __future__ import annotations

import torch

from fastpipe.ops._reference import output_format


def _register_fake(name: str):
    """torch.library.register_fake for fastpipe::<name>, skipped when the loaded extension is an
    older build without that op (calls of the op then fall back to the reference)."""

    def decorate(fn):
        if hasattr(torch.ops.fastpipe, name):
            torch.library.register_fake(f"fastpipe::{name}")(fn)
        return fn

    return decorate


def _check_images(images: torch.Tensor, op: str) -> None:
    torch._check(images.dim() == 4, lambda: f"fastpipe::{op} expects a 4-D (N, C, H, W) batch")


@_register_fake("normalize")
def _normalize_fake(images, mean, std, dtype, channels_last):
    _check_images(images, "normalize")
    torch._check(mean.shape == (images.shape[1],), lambda: "mean must have C values")
    torch._check(std.shape == (images.shape[1],), lambda: "std must have C values")
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(images.shape, dtype=dtype, device=images.device, memory_format=memory_format)


def _like_input(images: torch.Tensor) -> torch.Tensor:
    return torch.empty(
        images.shape, dtype=images.dtype, device=images.device, memory_format=output_format(images)
    )


def _check_fill(images: torch.Tensor, boxes: torch.Tensor, fill: torch.Tensor) -> None:
    n, c = images.shape[0], images.shape[1]
    torch._check(
        fill.shape == (c,) or fill.shape == (n, boxes.shape[1], c),
        lambda: "fill must have C values, or (N, K, C): C per box",
    )


@_register_fake("erase")
def _erase_fake(images, boxes, fill, seeds):
    _check_images(images, "erase")
    torch._check(
        boxes.dim() == 3 and boxes.shape[0] == images.shape[0], lambda: "boxes must be (N, K, 4)"
    )
    _check_fill(images, boxes, fill)
    return _like_input(images)


@_register_fake("erase_")
def _erase_inplace_fake(images, boxes, fill, seeds):
    _check_images(images, "erase_")
    torch._check(
        boxes.dim() == 3 and boxes.shape[0] == images.shape[0], lambda: "boxes must be (N, K, 4)"
    )
    _check_fill(images, boxes, fill)
    return None


@_register_fake("mixup")
def _mixup_fake(images, lam):
    _check_images(images, "mixup")
    torch._check(lam.shape == (images.shape[0],), lambda: "lam must have N values")
    return _like_input(images)


@_register_fake("cutmix")
def _cutmix_fake(images, boxes):
    _check_images(images, "cutmix")
    torch._check(boxes.shape == (images.shape[0], 4), lambda: "boxes must be (N, 4)")
    return _like_input(images)


@_register_fake("erasing_boxes")
def _erasing_boxes_fake(
    uniforms,
    height,
    width,
    max_count,
    p,
    scale_low,
    scale_high,
    log_ratio_low,
    log_ratio_high,
    min_count=1,
):
    torch._check(uniforms.dim() == 2, lambda: "uniforms must be (N, 2 + max_count * 22)")
    return uniforms.new_empty((uniforms.shape[0], max_count, 4), dtype=torch.int64)


@_register_fake("mixup_")
def _mixup_inplace_fake(images, lam):
    _check_images(images, "mixup_")
    torch._check(lam.shape == (images.shape[0],), lambda: "lam must have N values")
    return None


@_register_fake("cutmix_")
def _cutmix_inplace_fake(images, boxes):
    _check_images(images, "cutmix_")
    torch._check(boxes.shape == (images.shape[0], 4), lambda: "boxes must be (N, 4)")
    return None


@_register_fake("resize_crops")
def _resize_crops_fake(images, plan, height, width, filter):
    torch._check(len(images) > 0, lambda: "resize_crops needs at least one image")
    torch._check(plan.shape == (len(images), 9), lambda: "plan must be (N, 9)")
    return images[0].new_empty((len(images), 3, height, width), dtype=torch.uint8)
