"""Thread-pool loading: DataLoader's batches in order, errors at their batch, no thread left
behind."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from fastpipe._threads import thread_batches


class Squares(torch.utils.data.Dataset):
    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise KeyError(f"sample {i} is broken")
        return torch.full((2,), i * i), i


def _batches(dataset, batch_size=4, threads=2, in_flight=4):
    sampler = BatchSampler(SequentialSampler(dataset), batch_size, drop_last=False)
    collate = torch.utils.data.default_collate
    return thread_batches(dataset, sampler, collate, num_threads=threads, in_flight=in_flight)


def test_same_batches_in_the_same_order_as_dataloader(no_thread_leak):
    dataset = Squares(37)
    expected = list(DataLoader(dataset, batch_size=4))
    got = list(_batches(dataset))
    assert len(got) == len(expected) == 10
    for (a, la), (b, lb) in zip(got, expected):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_an_error_is_raised_at_its_batch_and_the_threads_stop(no_thread_leak):
    seen = []
    with pytest.raises(KeyError, match="sample 9 is broken"):
        for _, labels in _batches(Squares(40, fail_at=9)):
            seen.append(labels.tolist())
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_threads_stop_after_break(no_thread_leak):
    for _ in _batches(Squares(400), in_flight=8):
        break
    gc.collect()


def test_threads_stop_on_close(no_thread_leak):
    batches = _batches(Squares(400))
    next(batches)
    batches.close()
