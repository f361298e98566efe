"""Per-sample randomness: the index a sampler hands to a dataset, with the epoch it belongs to."""

from __future__ import annotations

from typing import Any


class SampleIndex(int):
    """A sample index (its value) that carries the epoch it was drawn for (``.epoch``).

    fastpipe's samplers yield these, so the epoch reaches the dataset in every worker process with
    the index itself (a dataset copied into persistent workers never sees ``set_epoch`` called on
    the main process's copy). Anything that takes an ``int`` takes it; arithmetic gives plain ints.
    """

    epoch: int

    def __new__(cls, index: int, epoch: int) -> SampleIndex:
        value = super().__new__(cls, index)
        value.epoch = int(epoch)
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        return (SampleIndex, (int(self), self.epoch))

    def __repr__(self) -> str:
        return f"SampleIndex({int(self)}, epoch={self.epoch})"

    def __str__(self) -> str:
        return str(int(self))

    def __format__(self, spec: str) -> str:
        return format(int(self), spec)
