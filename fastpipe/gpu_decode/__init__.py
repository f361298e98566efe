"""Decode on the GPU inside the loader: the encoded images a dataset built with ``decode="gpu"``
hands over (each sample's bytes and the recipe's draw for it), decoded by ``DataPrefetcher`` on
its side stream with nvImageCodec (torchvision's ``decode_jpeg`` where it is absent), resized
with ``fastpipe.ops.resize_crops`` (the CPU path's filters, the same crop and flip), and
normalized as any batch. docs/gpu.md ("GPU decode") has what it does and what has run where.
"""

from __future__ import annotations

from fastpipe.gpu_decode._backends import EXTRA, GpuDecodeUnavailable, available_backends
from fastpipe.gpu_decode._options import GpuDecode

__all__ = ["EXTRA", "GpuDecode", "GpuDecodeUnavailable", "available_backends"]
