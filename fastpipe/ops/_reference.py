"""Pure-PyTorch reference of every fastpipe operator: the fallback without the extension, and the
oracle.

Each function has the signature and semantics of the operator ``torch.ops.fastpipe.<name>`` (see
fastpipe/csrc/fastpipe.cpp) and computes the same bits as the C++ and CUDA kernels: the same float
operations in the same order (fastpipe/csrc/kernels.h), the same rounding, and the same
counter-based noise, computed exactly in int64.
"""

from __future__ import annotations

import math

import numpy as np
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


# ---- resize_crops: fastpipe._resize's antialiased resize (kernels.h's resize_* functions) ----

_RESIZE_BITS = 14
_RESIZE_MAX_FIXED_TAPS = 17


def _resize_filter(bicubic: bool, x: float) -> float:
    x = -x if x < 0.0 else x
    if bicubic:
        a = -0.5
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        if x < 2.0:
            return (((x - 5.0) * x + 8.0) * x - 4.0) * a
        return 0.0
    return 1.0 - x if x < 1.0 else 0.0


def _round_away(value: float) -> int:
    """lround: half away from zero (exact for a float32 value held in a double)."""
    r = math.floor(abs(value) + 0.5)
    return -r if value < 0 else r


def resize_max_taps(in_size: int, out_size: int, filter: int) -> int:
    scale = in_size / out_size
    support = (2.0 if filter == 1 else 1.0) * (scale if scale >= 1.0 else 1.0)
    return math.ceil(support) * 2 + 1


def resize_tap_span(in_size: int, out_size: int, index: int, filter: int) -> tuple[int, int]:
    """``(first, end)``: the inputs output ``index`` reads (resize_taps' without the weights)."""
    scale = in_size / out_size
    support = (2.0 if filter == 1 else 1.0) * (scale if scale >= 1.0 else 1.0)
    center = scale * (index + 0.5)
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), in_size)
    return lo, lo + min(hi - lo, math.ceil(support) * 2 + 1)


def resize_taps(in_size: int, out_size: int, index: int, filter: int
                ) -> tuple[int, list[float], list[int] | None]:
    """The taps of output ``index`` of an axis resized from ``in_size`` to ``out_size``: the first
    input, the float32 weights (as Python floats), and the 14-bit fixed-point weights (None past
    17 taps); the double arithmetic of kernels.h's resize_taps, operation for operation."""
    bicubic = filter == 1
    scale = in_size / out_size
    support = (2.0 if bicubic else 1.0) * (scale if scale >= 1.0 else 1.0)
    inv_scale = 1.0 / scale if scale >= 1.0 else 1.0
    max_taps = math.ceil(support) * 2 + 1
    center = scale * (index + 0.5)
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), in_size)
    count = min(hi - lo, max_taps)
    raw = [_resize_filter(bicubic, (float(k + lo) - center + 0.5) * inv_scale)
           for k in range(count)]
    total = 0.0
    for value in raw:  # in order (Python's sum() compensates, the kernels do not)
        total += value
    weights = [float(np.float32(r / total if total != 0.0 else 0.0)) for r in raw]
    fixed = None
    if count <= _RESIZE_MAX_FIXED_TAPS:
        fixed = [_round_away(float(np.float32(w) * np.float32(1 << _RESIZE_BITS)))
                 for w in weights]
        largest = 0
        for k in range(count):
            largest = k if fixed[k] > fixed[largest] else largest
        if count:
            fixed[largest] += (1 << _RESIZE_BITS) - sum(fixed)
    return lo, weights, fixed


def resize_integer(full: tuple[int, int], resized: tuple[int, int], filter: int) -> bool:
    """Whether the integer forms apply: both axes within 17 taps (columns: the most any output
    column has)."""
    if resize_max_taps(full[0], resized[0], filter) > _RESIZE_MAX_FIXED_TAPS:
        return False
    if resize_max_taps(full[1], resized[1], filter) <= _RESIZE_MAX_FIXED_TAPS:
        return True
    longest = max(len(resize_taps(full[1], resized[1], i, filter)[1]) for i in range(resized[1]))
    return max(longest, 1) <= _RESIZE_MAX_FIXED_TAPS


def resize_crops(images: list[torch.Tensor], plan: torch.Tensor, height: int, width: int,
                 filter: int) -> torch.Tensor:
    """``(N, 3, height, width)`` uint8: image n (``(h, w, 3)`` uint8, the box at ``plan[n][0:2]``
    of an image of ``plan[n][2:4]``) resized as that image to ``plan[n][6:8]``, the box at
    ``plan[n][4:6]`` of it, mirrored when ``plan[n][8]``. The bits of fastpipe._resize: integer
    sums in float64 (exact: every partial sum is an integer below 2^53), float32 sums in the
    kernels' order where more than 17 taps make them float."""
    out = torch.empty((len(images), 3, height, width), dtype=torch.uint8, device=images[0].device)
    for n, (image, row) in enumerate(zip(images, plan.tolist())):
        out[n] = _resize_one(image, row, height, width, filter)
    return out


def _tap_matrix(taps: list[tuple[int, list[float], list[int] | None]], offset: int, size: int,
                fixed: bool, device: torch.device) -> torch.Tensor:
    """(outputs, size) float64: each output's weights at its inputs' positions in the pixels."""
    matrix = torch.zeros((len(taps), size), dtype=torch.float64)
    for i, (start, weights, fixed_weights) in enumerate(taps):
        values = fixed_weights if fixed else weights
        for k, value in enumerate(values):
            matrix[i, start - offset + k] = value
    return matrix.to(device)


def _resize_one(image: torch.Tensor, row: list[int], height: int, width: int,
                filter: int) -> torch.Tensor:
    top, left, full_h, full_w, out_top, out_left, resized_h, resized_w, flip = row
    h, w = image.shape[0], image.shape[1]
    columns = [out_left + (width - 1 - x if flip else x) for x in range(width)]
    row_taps = [resize_taps(full_h, resized_h, out_top + y, filter) for y in range(height)]
    col_taps = [resize_taps(full_w, resized_w, c, filter) for c in columns]
    pixels = image.to(torch.float64).reshape(h, w * 3)
    device = image.device
    fixed_rows = resize_max_taps(full_h, resized_h, filter) <= _RESIZE_MAX_FIXED_TAPS
    if resize_integer((full_h, full_w), (resized_h, resized_w), filter):
        sums = _tap_matrix(row_taps, top, h, True, device) @ pixels
        rows = torch.floor((sums + (1 << 7)) / (1 << 8)).view(height, w, 3)
        cols = _tap_matrix(col_taps, left, w, True, device)
        total = torch.einsum("xj,yjc->cyx", cols, rows)
        values = torch.floor((total + (1 << 19)) / (1 << 20))
        return values.clamp(0, 255).to(torch.uint8)
    if fixed_rows:
        sums = _tap_matrix(row_taps, top, h, True, device) @ pixels
        rows = (sums.to(torch.float32) * (1.0 / (1 << _RESIZE_BITS))).view(height, w, 3)
    else:
        rows = _float_taps(row_taps, top, pixels.to(torch.float32).view(h, w, 3), 0)
    total = _float_taps(col_taps, left, rows, 1, start=0.5)
    total = total.clamp(0.0, 255.0).to(torch.int32)  # truncated, as the kernels convert
    return total.permute(2, 0, 1).clamp(0, 255).to(torch.uint8)


def _float_taps(taps: list[tuple[int, list[float], list[int] | None]], offset: int,
                values: torch.Tensor, axis: int, start: float | None = None) -> torch.Tensor:
    """Float32 weighted sums of ``values`` (float32, rows or columns along ``axis``) in the
    kernels' order: the first term (or ``start`` plus it), then each next term added."""
    device = values.device
    longest = max(len(weights) for _, weights, _ in taps)
    outputs = len(taps)
    index = torch.zeros((outputs, longest), dtype=torch.int64)
    weight = torch.zeros((outputs, longest), dtype=torch.float32)
    used = torch.zeros((outputs, longest), dtype=torch.bool)
    for i, (first, weights, _) in enumerate(taps):
        for k, value in enumerate(weights):
            index[i, k], weight[i, k], used[i, k] = first - offset + k, value, True
    index, weight, used = index.to(device), weight.to(device), used.to(device)
    shape = [1, 1, 1]
    shape[axis] = outputs
    total = None
    for k in range(longest):
        term = weight[:, k].view(shape) * values.index_select(axis, index[:, k])
        if total is None:
            total = term if start is None else torch.full_like(term, start) + term
        else:
            total = torch.where(used[:, k].view(shape), total + term, total)
    return total
