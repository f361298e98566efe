"""Batch ops for image tensors, on CPU and CUDA: normalize, cutout, random_erasing, mixup, cutmix,
resize_crops (the CPU image path's resize over images of their own sizes), and the timm-style
batch transforms Mixup and RandomErasing.

The ops run as PyTorch custom operators (``torch.ops.fastpipe.*``) from the compiled extension
``fastpipe._C`` when it is built, and fall back to a pure-PyTorch reference with the same results
otherwise (with a one-time warning). Random parameters are drawn on the CPU with torch's generator,
so a seed gives the same result on every device. See docs/ops.md.
"""

from __future__ import annotations

from fastpipe.ops import _extension
from fastpipe.ops._erasing import RandomErasing
from fastpipe.ops._functional import (
    cutmix,
    cutout,
    extension_available,
    mixup,
    normalize,
    random_erasing,
)
from fastpipe.ops._mixup import Mixup
from fastpipe.ops._resize import resize_crops

if _extension.LOADED:
    from fastpipe.ops import _autograd, _fake  # noqa: F401  (register on torch.ops.fastpipe)

__all__ = [
    "Mixup",
    "RandomErasing",
    "cutmix",
    "cutout",
    "extension_available",
    "mixup",
    "normalize",
    "random_erasing",
    "resize_crops",
]
