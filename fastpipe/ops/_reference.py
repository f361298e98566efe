"""Pure-PyTorch reference of every fastpipe operator: the fallback without the extension, and the
oracle.

Each function has the signature and semantics of the operator ``torch.ops.fastpipe.<name>`` (see
fastpipe/csrc/fastpipe.cpp) and computes the same bits as the C++ and CUDA kernels: the same float
operations in the same order (fastpipe/csrc/kernels.h), the same rounding, and the same
counter-based noise, computed exactly in int64.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B9
# Elements of erase's noise made at once (int64 temporaries of 32 MiB each).
_NOISE_ELEMENTS = 1 << 22


def output_format(images: torch.Tensor) -> torch.memory_format:
    """channels_last for a channels_last input (that is not also plain contiguous), else
    contiguous."""
    if images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def normalize(
    images: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    """``(N, C, H, W)`` uint8 (0-255) or float (0-1) -> ``(x / range - mean) / std`` in ``dtype``.

    Computed as ``x * scale + shift`` with ``scale = 1 / (std * range)`` and ``shift = -mean / std``
    (range 255 for uint8, 1 for float), as the kernels do.
    """
    std = std.to(torch.float32)
    scale = torch.reciprocal(std * (255.0 if images.dtype == torch.uint8 else 1.0))
    shift = torch.neg(mean.to(torch.float32)) / std
    out = images.to(torch.float32) * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    # (.to(memory_format=...) keeps some non-dense layouts, .contiguous() does not.)
    return out.to(dtype).contiguous(memory_format=memory_format)


def _box_mask(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``(N, K, 4)`` boxes (top, left, bottom, right; exclusive) -> ``(N, 1, H, W)`` bool, any
    box."""
    device = boxes.device
    ys = torch.arange(height, device=device).view(1, 1, height, 1)
    xs = torch.arange(width, device=device).view(1, 1, 1, width)
    top, left, bottom, right = (b.unsqueeze(-1).unsqueeze(-1) for b in boxes.unbind(-1))
    inside = (ys >= top) & (ys < bottom) & (xs >= left) & (xs < right)
    return inside.any(dim=1, keepdim=True)


def hash32(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit hash of kernels.h on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _MASK32
    return x ^ (x >> 15)


def noise_state(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    return hash32((hash32(counter & _MASK32) + (seed & _MASK32)) & _MASK32)


def noise_normal(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Approximately N(0, 1) float32: Irwin-Hall sum of 12 uniform 16-bit integers, exact."""
    state = noise_state(seed, counter)
    total = torch.zeros_like(state)
    for k in range(6):
        h = hash32((state + ((k * _GOLDEN32) & _MASK32)) & _MASK32)
        total = total + (h & 0xFFFF) + (h >> 16)
    return (2 * total - 786420).to(torch.float32) * (1.0 / 131072.0)


def noise_byte(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Uniform uint8 noise."""
    return (noise_state(seed, counter) >> 24).to(torch.uint8)


def erase(
    images: torch.Tensor,
    boxes: torch.Tensor,
    fill: torch.Tensor,
    seeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Copies ``images`` and fills each sample's ``(N, K, 4)`` boxes with ``fill`` (C values for
    every box, or ``(N, K, C)``: C per box, the later box's where boxes overlap), or with noise
    keyed by ``seeds`` (``(N,)`` int64): normal for float images, uniform bytes for uint8."""
    n, c, h, w = images.shape
    memory_format = output_format(images)
    if images.numel() == 0 or boxes.shape[1] == 0:
        return images.clone(memory_format=memory_format)
    if seeds is None and fill.dim() == 3:
        out = images
        for k in range(boxes.shape[1]):  # in order: the later box's fill wins
            inside = _box_mask(boxes[:, k : k + 1], h, w)
            out = torch.where(inside, fill[:, k].view(n, c, 1, 1), out)
        return out.contiguous(memory_format=memory_format)
    inside = _box_mask(boxes, h, w)
    if seeds is None:
        out = torch.where(inside, fill.view(1, c, 1, 1), images)
        return out.contiguous(memory_format=memory_format)
    # Noise for every element, kept where a box lands: selecting only the erased elements
    # (nonzero) would give a shape that depends on the data, for which the host waits for the
    # GPU. A few samples at a time, so that the int64 temporaries stay small.
    noise = noise_byte if images.dtype == torch.uint8 else noise_normal
    counter = torch.arange(c * h * w, device=images.device).view(1, c, h, w)
    step = max(1, _NOISE_ELEMENTS // max(1, c * h * w))
    parts = []
    for start in range(0, n, step):
        rows = slice(start, start + step)
        values = noise(seeds[rows].view(-1, 1, 1, 1), counter).to(images.dtype)
        parts.append(torch.where(inside[rows], values, images[rows]))
    return torch.cat(parts).contiguous(memory_format=memory_format)


def erase_(
    images: torch.Tensor,
    boxes: torch.Tensor,
    fill: torch.Tensor,
    seeds: torch.Tensor | None = None,
) -> None:
    """:func:`erase`, in place."""
    if images.numel() and boxes.shape[1]:
        images.copy_(erase(images, boxes, fill, seeds))


def mixup(images: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``out[n] = images[n] * lam[n] + images[N - 1 - n] * (1 - lam[n])`` in float32, then rounded
    half to even and saturated for uint8, or rounded to the images' float dtype."""
    memory_format = output_format(images)
    x = images.to(torch.float32)
    weight = lam.to(torch.float32).view(-1, 1, 1, 1)
    out = x * weight + x.flip(0) * (1 - weight)
    if images.dtype == torch.uint8:
        out = out.round().clamp(0, 255)
    return out.to(images.dtype).contiguous(memory_format=memory_format)


def cutmix(images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """``out[n] = images[n]`` with the ``(N, 4)`` box of sample n copied from
    ``images[N - 1 - n]``."""
    memory_format = output_format(images)
    inside = _box_mask(boxes.unsqueeze(1), images.shape[2], images.shape[3])
    out = torch.where(inside, images.flip(0), images)
    return out.contiguous(memory_format=memory_format)


def mixup_(images: torch.Tensor, lam: torch.Tensor) -> None:
    """:func:`mixup`, in place."""
    if images.numel():
        images.copy_(mixup(images, lam))


def cutmix_(images: torch.Tensor, boxes: torch.Tensor) -> None:
    """:func:`cutmix`, in place."""
    if images.numel():
        images.copy_(cutmix(images, boxes))
