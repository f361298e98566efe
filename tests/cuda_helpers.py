"""Helpers of the cuda lane (tests/test_cuda_*.py): known GPU work, and a checksum per batch.

Only the tests marked ``cuda`` call the GPU parts; importing this module needs no GPU.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _cycles_per_second() -> float:
    """The GPU clock as torch.cuda._sleep sees it, measured once with CUDA events."""
    torch.cuda._sleep(1_000_000)  # warm-up: the first launch pays for loading the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000.0)


def gpu_sleep(seconds: float) -> None:
    """Queues ``seconds`` of busy work on the current stream; returns at once."""
    torch.cuda._sleep(max(1, int(seconds * _cycles_per_second())))


def checksum(t: torch.Tensor) -> torch.Tensor:
    """A 0-d float64 GPU tensor summing ``t`` with a position weight, queued on the current stream
    (no synchronization): a batch swapped for another, or a part of it stale, changes it."""
    flat = t.reshape(-1).double()
    weights = torch.arange(1, flat.numel() + 1, device=t.device, dtype=torch.float64) % 251 + 1
    return (flat * weights).sum()


def random_batches(count: int, shape: tuple[int, ...], seed: int, pin: bool) -> list[torch.Tensor]:
    """``count`` uint8 CPU batches of random content (page-locked if ``pin``)."""
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 256, shape, dtype=torch.uint8, generator=g) for _ in range(count)]
    return [b.pin_memory() for b in batches] if pin else batches
