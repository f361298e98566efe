"""Pure-PyTorch reference of every fastpipe op: the fallback without the extension, and the oracle."""

from __future__ import annotations

import torch


def normalize(
    images: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    x = images.to(torch.float32)
    if images.dtype == torch.uint8:
        x = x / 255.0
    shape = (1, -1, 1, 1)
    out = (x - mean.to(torch.float32).view(shape)) / std.to(torch.float32).view(shape)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return out.to(dtype=dtype, memory_format=memory_format)
