"""GpuDecode: the options of GPU decode, checked once."""

from __future__ import annotations

from dataclasses import dataclass

from fastpipe import _validate as check

__all__ = ["BACKENDS", "DEFAULT_MEMORY_CAP", "GpuDecode"]

BACKENDS = ("auto", "nvimgcodec", "torchvision")
# Decode buffers kept between batches: a batch of 256 train crops of ImageNet-sized photos needs
# about 150 MiB; eval regions of whole photos about twice that.
DEFAULT_MEMORY_CAP = 1 << 30


@dataclass(frozen=True)
class GpuDecode:
    """How ``DataPrefetcher`` decodes the batches of a dataset built with ``decode="gpu"``.

    ``backend``: ``"auto"`` (nvImageCodec, else torchvision's batched ``decode_jpeg`` on CUDA),
    ``"nvimgcodec"`` or ``"torchvision"``; a missing one is an error naming the extra
    (``pip install 'fastpipe[gpu-decode]'``). ``hardware``: let nvImageCodec use the GPU's
    hardware JPEG engine where it has one (A100, H100, ... ; ``fastpipe doctor`` says).
    ``memory_cap``: bytes of decode buffers kept between batches for reuse; past it they are
    let go (and allocated again by the next batch), counted in the prefetcher's
    ``gpu_decode_stats``.
    """

    backend: str = "auto"
    hardware: bool = True
    memory_cap: int = DEFAULT_MEMORY_CAP

    def __post_init__(self) -> None:
        check.choice("backend", self.backend, BACKENDS, where="GpuDecode")
        if not isinstance(self.hardware, bool):
            raise check.ArgumentTypeError(
                f"GpuDecode: hardware must be True or False, got {self.hardware!r}")
        check.non_negative_int("memory_cap", self.memory_cap, where="GpuDecode")
