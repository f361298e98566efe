"""Gradients of the compiled ops with respect to float images (imported only with the extension).

All four ops are linear in the images, so each backward is cheap and exact: normalize scales the
gradient by 1 / std; erase zeroes it inside the boxes; mixup mixes it back with the same weights;
cutmix sends the gradient of each box to the sample it was copied from. Parameters (mean, std,
boxes, fill, lam) get no gradient: they are constants of the augmentation. uint8 images have no
gradient.
"""

from __future__ import annotations

import torch


def _normalize_setup(ctx, inputs, output):
    images, _mean, std, _dtype, _channels_last = inputs
    ctx.images_dtype = images.dtype
    ctx.save_for_backward(std)


def _normalize_backward(ctx, grad):
    (std,) = ctx.saved_tensors
    scale = torch.reciprocal(std.to(torch.float32)).view(1, -1, 1, 1)
    return (grad.to(torch.float32) * scale).to(ctx.images_dtype), None, None, None, None


def _erase_setup(ctx, inputs, output):
    _images, boxes, fill, _seeds = inputs
    ctx.save_for_backward(boxes)
    # The fill is (C,) or, per box, (N, K, C): the channels are its last dimension.
    ctx.channels = fill.shape[-1]


def _erase_backward(ctx, grad):
    (boxes,) = ctx.saved_tensors
    zeros = torch.zeros(ctx.channels, dtype=grad.dtype, device=grad.device)
    return torch.ops.fastpipe.erase(grad, boxes, zeros, None), None, None, None


def _mixup_setup(ctx, inputs, output):
    images, lam = inputs
    ctx.images_dtype = images.dtype
    ctx.save_for_backward(lam)


def _mixup_backward(ctx, grad):
    # out[m] = x[m] * lam[m] + x[N-1-m] * (1 - lam[m]), so
    # dx[n] = g[n] * lam[n] + g[N-1-n] * (1 - lam[N-1-n]).
    (lam,) = ctx.saved_tensors
    weight = lam.to(torch.float32).view(-1, 1, 1, 1)
    g = grad.to(torch.float32)
    return (g * weight + (g * (1 - weight)).flip(0)).to(ctx.images_dtype), None


def _cutmix_setup(ctx, inputs, output):
    _images, boxes = inputs
    ctx.save_for_backward(boxes)


def _cutmix_backward(ctx, grad):
    # Sample n keeps the gradient outside its own box and receives the gradient inside the box of
    # sample N-1-n, which was copied from it.
    (boxes,) = ctx.saved_tensors
    zeros = torch.zeros(grad.shape[1], dtype=grad.dtype, device=grad.device)
    own = torch.ops.fastpipe.erase(grad, boxes.unsqueeze(1), zeros, None)
    return own + (grad - own).flip(0), None


torch.library.register_autograd(
    "fastpipe::normalize", _normalize_backward, setup_context=_normalize_setup
)
torch.library.register_autograd("fastpipe::erase", _erase_backward, setup_context=_erase_setup)
torch.library.register_autograd("fastpipe::mixup", _mixup_backward, setup_context=_mixup_setup)
torch.library.register_autograd("fastpipe::cutmix", _cutmix_backward, setup_context=_cutmix_setup)
