"""A synthetic dataset whose best loader settings are known, for `fastpipe tune` tests.

Every sample costs ``item_seconds`` and every batch ``batch_seconds`` of sleep (through
``__getitems__``, which DataLoader calls once per batch). Sleeping uses no CPU, so more worker
processes are faster even on a 2-core machine, and bigger batches are faster because the fixed
per-batch cost is shared by more samples: the best setting is the most workers and the biggest
batch, by a wide margin (4 workers load about twice as fast as 2).
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset


class SleepyDataset(Dataset):
    def __init__(self, length: int = 256, item_seconds: float = 0.008,
                 batch_seconds: float = 0.06) -> None:
        self.length = length
        self.item_seconds = item_seconds
        self.batch_seconds = batch_seconds

    def __len__(self) -> int:
        return self.length

    def _sample(self, index: int):
        return torch.full((3, 8, 8), index % 256, dtype=torch.uint8), index % 4

    def __getitem__(self, index: int):
        time.sleep(self.item_seconds + self.batch_seconds)  # a batch of one pays both
        return self._sample(index)

    def __getitems__(self, indices: list[int]):
        time.sleep(self.batch_seconds + self.item_seconds * len(indices))
        return [self._sample(i) for i in indices]


def sleepy_dataset() -> SleepyDataset:
    return SleepyDataset()


def tiny_sleepy_dataset() -> SleepyDataset:
    """For end-to-end CLI runs: fast enough that a short budget measures every trial."""
    return SleepyDataset(length=64, item_seconds=0.001, batch_seconds=0.002)


def empty_dataset() -> SleepyDataset:
    return SleepyDataset(length=0)


def not_a_dataset():
    return 42


def clear_winner_dataset() -> SleepyDataset:
    """For the tuner's end-to-end test: margins no load on a 2-core machine can hide, and long
    enough that no trial reaches the end of an epoch (where worker processes restart). A batch
    of 4 costs 0.108 s (27 ms a sample) and one of 16 costs 0.132 s (8 ms a sample: 3.3x
    faster); sleeping workers scale with their count (4 workers 2x faster than 2)."""
    return SleepyDataset(length=100_000, item_seconds=0.002, batch_seconds=0.1)
