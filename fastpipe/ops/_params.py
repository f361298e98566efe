"""Random parameters of the batch ops, drawn with torch's CPU generator into small tensors.

Drawing on the CPU, whatever the images' device and torch's default device (every tensor made
here names ``device=CPU``), is what makes a seed give the same result on CPU and CUDA: the kernels
are deterministic functions of the images and these tensors. Every draw is vectorized over the
batch (no Python loop per sample), and nothing here reads a tensor's value back into Python, so
the wrappers stay traceable by torch.compile.

Boxes are int64 rows of (top, left, bottom, right), bottom and right exclusive; an empty box
(bottom <= top) erases nothing.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fastpipe._compat import standard_gamma
from fastpipe.ops import _extension

# torchvision's RandomErasing and timm's make ten attempts at a box that fits, then give up.
ERASING_ATTEMPTS = 10

# Every tensor the ops make on the host names this device: torch's default device (for example
# torch.set_default_device("cuda")) must not move a parameter draw or a fill off the CPU.
CPU = torch.device("cpu")


def generator_kwargs(generator: torch.Generator | None) -> dict:
    """``{"generator": generator}``, or nothing for the global generator.

    torch.compile with dynamic shapes fails on ``generator=None`` passed explicitly to
    ``torch.rand``/``torch.randint`` with a symbolic size; leaving the keyword out compiles.
    """
    return {} if generator is None else {"generator": generator}


def cutout_boxes(
    batch: int,
    height: int,
    width: int,
    num_holes: int,
    size: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``(batch, num_holes, 4)`` boxes of ``size`` x ``size`` whose centres are uniform over the
    pixels, clipped at the border (Cutout, DeVries & Taylor 2017)."""
    draw = generator_kwargs(generator)
    cy = torch.randint(0, height, (batch, num_holes), device=CPU, **draw)
    cx = torch.randint(0, width, (batch, num_holes), device=CPU, **draw)
    if not torch.compiler.is_compiling():
        # The same integer arithmetic in NumPy, with less overhead per op (see erasing_boxes).
        boxes = np.empty((batch, num_holes, 4), dtype=np.int64)
        boxes[..., 0] = cy.numpy() - size // 2
        boxes[..., 1] = cx.numpy() - size // 2
        boxes[..., 2:] = boxes[..., :2] + size
        np.maximum(boxes, 0, out=boxes)
        return torch.from_numpy(np.minimum(boxes, (height, width, height, width), out=boxes))
    top, left = cy - size // 2, cx - size // 2
    boxes = torch.stack(
        (
            top.clamp(0, height),
            left.clamp(0, width),
            (top + size).clamp(0, height),
            (left + size).clamp(0, width),
        ),
        dim=-1,
    )
    return boxes


def erasing_boxes(
    batch: int,
    height: int,
    width: int,
    p: float,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    max_count: int,
    generator: torch.Generator | None = None,
    min_count: int = 1,
) -> torch.Tensor:
    """``(batch, max_count, 4)`` boxes with torchvision's and timm's RandomErasing semantics.

    A sample is erased with probability ``p``, with ``count`` boxes (uniform in
    ``min_count..max_count``, timm's ``count``). Each box tries up to ten times: area
    ``uniform(scale) * H * W / count``, aspect ratio ``exp(uniform(log ratio))``,
    ``h = round(sqrt(area * aspect))``, ``w = round(sqrt(area / aspect))``, accepted when
    ``h < H`` and ``w < W``; its top-left corner is then uniform over the positions where it
    fits. A box with no accepted attempt is empty (the sample is left as is, as in torchvision).
    """
    # One draw of all the uniforms: per sample apply and count, per box 10 areas, 10 ratios and a
    # position. Their geometry costs less than the overhead of the ~50 small ops below (timed in
    # docs/ops.md, "Less Python per call"), so eager calls use the compiled
    # fastpipe::erasing_boxes, one call doing the same float64 operations in the same order;
    # torch.compile, and a build without the extension, run the torch version.
    k, a = max_count, ERASING_ATTEMPTS
    u = torch.rand(
        batch, 2 + k * (2 * a + 2), dtype=torch.float64, device=CPU,
        **generator_kwargs(generator),
    )
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    if not torch.compiler.is_compiling() and _extension.has_kernel("erasing_boxes", CPU):
        return torch.ops.fastpipe.erasing_boxes(
            u, height, width, max_count, p, scale[0], scale[1], log_lo, log_hi, min_count
        )
    apply = u[:, 0] < p
    # uniform in min_count..max_count
    count = torch.floor(u[:, 1] * (max_count - min_count + 1)) + min_count
    boxes_u = u[:, 2:].view(batch, k, 2 * a + 2)
    area = (boxes_u[..., :a] * (scale[1] - scale[0]) + scale[0]) * (
        (height * width) / count.view(-1, 1, 1)
    )
    log_ratio = boxes_u[..., a : 2 * a] * (log_hi - log_lo) + log_lo
    # (h, w) = round(sqrt(area * aspect)), round(sqrt(area / aspect)) for every attempt.
    hw = torch.round(
        torch.sqrt(area.unsqueeze(-1) * torch.exp(torch.stack((log_ratio, -log_ratio), -1)))
    )
    limit = torch.tensor([height, width], dtype=torch.float64, device=CPU)
    fits = (hw < limit).all(-1)
    first = fits.to(torch.int8).argmax(dim=-1)  # the first attempt that fits
    hw = hw.gather(2, first.view(batch, k, 1, 1).expand(batch, k, 1, 2)).squeeze(2)
    # The top-left corner is uniform over the (H - h + 1) x (W - w + 1) positions that fit.
    corner = torch.minimum(torch.floor(boxes_u[..., 2 * a :] * (limit - hw + 1)), limit - hw)
    box_index = torch.arange(k, device=CPU).view(1, -1)
    active = apply.view(-1, 1) & fits.any(dim=-1) & (box_index < count.view(-1, 1))
    boxes = torch.cat((corner, corner + hw), dim=-1).to(torch.int64)
    return boxes * active.unsqueeze(-1)


def beta(alpha: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw of Beta(alpha, alpha) as a 0-d float64 tensor: ``X / (X + Y)`` for ``X, Y``
    independent Gamma(alpha), computed in log space so that it is never 0 / 0.

    Each Gamma(alpha) draw is ``Gamma(alpha + 1) * U ** (1 / alpha)`` with ``U`` uniform on (0, 1]
    (the identity torch's own sampler uses for alpha < 1). For small alpha ``U ** (1 / alpha)``
    underflows (below alpha ~0.005 both draws are often exactly 0, and their ratio NaN), so the
    weight is taken as ``sigmoid(log X - log Y)`` instead: the same distribution, for any alpha.
    """
    alpha = float(alpha)
    gammas = standard_gamma(
        torch.full((2,), alpha + 1.0, dtype=torch.float64, device=CPU), generator=generator
    )
    # (0, 1]: log is finite
    uniforms = 1.0 - torch.rand(
        2, dtype=torch.float64, device=CPU, **generator_kwargs(generator)
    )
    log_draws = gammas.log() + uniforms.log() / alpha
    return torch.sigmoid(log_draws[0] - log_draws[1])


def cutmix_box(
    height: int, width: int, lam: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's CutMix box for a mixing weight ``lam``: ``(4,)`` int64 and the corrected weight.

    The box is timm 1.0's ``rand_bbox``: sides ``cut = int(H * sqrt(1 - lam))`` and
    ``int(W * sqrt(1 - lam))``, rows ``cy - cut // 2`` to ``cy + (cut + 1) // 2`` (columns alike)
    around a centre uniform over the pixels, clipped at the border; the corrected weight is
    ``1 - box area / (H * W)``, the share of each sample that stays its own.
    """
    if not torch.compiler.is_compiling():
        # The same float64 and integer arithmetic on Python numbers: the overhead of the ~15 small
        # torch ops below is most of a small batch's cutmix (docs/ops.md, "Less Python per call").
        cut = math.sqrt(1.0 - float(lam))
        cut_h, cut_w = int(height * cut), int(width * cut)
        cy = int(torch.randint(0, height, (), device=CPU, generator=generator))
        cx = int(torch.randint(0, width, (), device=CPU, generator=generator))
        top, bottom = min(max(cy - cut_h // 2, 0), height), min(cy + (cut_h + 1) // 2, height)
        left, right = min(max(cx - cut_w // 2, 0), width), min(cx + (cut_w + 1) // 2, width)
        corrected = 1.0 - ((bottom - top) * (right - left)) / (height * width)
        return (
            torch.tensor((top, left, bottom, right), dtype=torch.int64, device=CPU),
            torch.tensor(corrected, dtype=torch.float64, device=CPU),
        )
    cut = torch.sqrt(1.0 - lam)
    cut_h = (height * cut).to(torch.int64)
    cut_w = (width * cut).to(torch.int64)
    cy = torch.randint(0, height, (), device=CPU, **generator_kwargs(generator))
    cx = torch.randint(0, width, (), device=CPU, **generator_kwargs(generator))
    top, bottom = (cy - cut_h // 2).clamp(0, height), (cy + (cut_h + 1) // 2).clamp(0, height)
    left, right = (cx - cut_w // 2).clamp(0, width), (cx + (cut_w + 1) // 2).clamp(0, width)
    box = torch.stack((top, left, bottom, right))
    corrected = 1.0 - ((bottom - top) * (right - left)).to(torch.float64) / (height * width)
    return box, corrected
