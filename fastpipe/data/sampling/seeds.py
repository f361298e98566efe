"""Per-sample randomness as a pure function of ``(seed, epoch, index)``.

DataLoader seeds each worker's generators from a base seed and the worker id, so which crop a
sample gets depends on which worker ran it and on how many workers there are. fastpipe's datasets
instead derive every draw for sample ``i`` from ``(seed, epoch, i)``: the same batches whatever
``num_workers``, and a run resumed mid-epoch (on any number of workers) draws what the
uninterrupted run drew.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["SampleIndex", "forked_default_generator", "sample_generator", "sample_seed"]

_MASK64 = (1 << 64) - 1


class SampleIndex(int):
    """A dataset index that carries its epoch: ``int(SampleIndex(5, epoch=2)) == 5``.

    fastpipe's samplers yield these, so a dataset in a persistent DataLoader worker (which never
    sees the main process's ``set_epoch``) still knows the epoch of every sample it loads.
    Picklable: it crosses DataLoader's index queues.
    """

    epoch: int

    def __new__(cls, index: int, epoch: int = 0) -> SampleIndex:
        value = super().__new__(cls, index)
        value.epoch = int(epoch)
        return value

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:
        return SampleIndex, (int(self), self.epoch)

    def __repr__(self) -> str:
        return f"SampleIndex({int(self)}, epoch={self.epoch})"

    def __str__(self) -> str:
        return str(int(self))

    def __format__(self, spec: str) -> str:
        return format(int(self), spec)


def sample_seed(seed: int, epoch: int, index: int, stream: int = 0) -> int:
    """A 63-bit seed for the draws of sample ``index`` in ``epoch`` of a run seeded ``seed``.

    ``stream`` separates independent uses for one sample (crop and flip, augmentation), so their
    generators do not replay one another's numbers. A chain of splitmix64 steps (each a bijection
    of 64-bit ints whose output bits depend on every input bit), one per argument: a couple of
    microseconds, where numpy's SeedSequence costs tens.
    """
    x = 0
    for part in (seed, epoch, index, stream):
        x = ((x ^ (part & _MASK64)) + 0x9E3779B97F4A7C15) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x >> 1


def sample_generator(seed: int, epoch: int, index: int, stream: int = 0) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded for sample ``index`` of ``epoch`` (see
    :func:`sample_seed`): pass it as ``generator=`` to torch's random functions."""
    generator = torch.Generator()
    generator.manual_seed(sample_seed(seed, epoch, index, stream))
    return generator


_local = threading.local()


def reseeded(seed: int) -> torch.Generator:
    """This thread's reusable CPU generator, seeded with ``seed``: a fresh ``torch.Generator``
    per sample costs more than reseeding one."""
    generator = getattr(_local, "generator", None)
    if generator is None:
        generator = _local.generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


# One sample at a time in torch's global generator: thread workers (DataLoaderX's
# worker_method="thread") would otherwise draw from one another's seeded streams.
_global_generator_lock = threading.Lock()


class forked_default_generator:  # noqa: N801 - used like a function, as torch.random.fork_rng
    """Context manager: torch's default CPU generator seeded with ``seed`` inside, its state
    restored on exit, for code that draws from the global generator (torchvision transforms).

    Like ``torch.random.fork_rng(devices=[])`` + ``torch.manual_seed``, without their cost
    (``torch.manual_seed`` also seeds every CUDA device). fastpipe's own threads take turns inside
    it, so thread workers draw the same numbers as processes; code outside fastpipe drawing from
    the global generator in another thread meanwhile (a CPU training step with ``num_workers=0``)
    would still draw these numbers, so run such transforms in workers.
    """

    __slots__ = ("seed", "_state")

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        _global_generator_lock.acquire()
        generator = torch.default_generator
        self._state = generator.get_state()
        generator.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        try:
            torch.default_generator.set_state(self._state)
        finally:
            _global_generator_lock.release()
