"""Batch ops for image tensors, on CPU and CUDA."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastpipe.ops import _reference

__all__ = ["normalize"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_IMAGE_DTYPES = (torch.uint8, *_FLOAT_DTYPES)


def _channel_vector(name: str, values: Sequence[float] | torch.Tensor, channels: int) -> torch.Tensor:
    vector = torch.as_tensor(values, dtype=torch.float32).flatten()
    if vector.numel() != channels:
        raise ValueError(
            f"{name} has {vector.numel()} values but the images have {channels} channels; "
            f"pass one {name} value per channel"
        )
    return vector


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
        ``(N, C, H, W)`` tensor of ``dtype`` on the device of ``images``.
    """
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"normalize expects a 4-D (N, C, H, W) image batch, got {shape}")
    if images.dtype not in _IMAGE_DTYPES:
        raise TypeError(
            f"normalize supports uint8, float32, float16 and bfloat16 images, got {images.dtype}"
        )
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"normalize outputs float32, float16 or bfloat16, got dtype={dtype}")
    channels = images.shape[1]
    mean_t = _channel_vector("mean", mean, channels).to(images.device)
    std_t = _channel_vector("std", std, channels).to(images.device)
    if bool((std_t == 0).any()):
        raise ValueError(f"std must not contain zeros, got {std_t.tolist()}")
    return _reference.normalize(images, mean_t, std_t, dtype, channels_last)
