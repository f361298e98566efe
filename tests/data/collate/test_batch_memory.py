"""Memory between batches: fast_collate's kept batches (fastpipe.data.collate.batch), in loader
threads too. glibc's thresholds between images are in tests/test_malloc.py."""

from __future__ import annotations

import threading

import pytest
import torch

from fastpipe.data import fast_collate
from fastpipe.data.collate import batch as collate

pytestmark = pytest.mark.timeout(120)


def test_a_freed_batch_is_reused_for_the_next_batch_of_its_shape():
    kept = collate._KeptBatches()
    first = kept.empty((4, 3, 8, 8), torch.uint8)
    address = first.data_ptr()
    del first
    again = kept.empty((4, 3, 8, 8), torch.uint8)
    assert again.data_ptr() == address


def test_a_batch_is_not_reused_while_any_view_of_it_lives():
    kept = collate._KeptBatches()
    batch = kept.empty((4, 3, 8, 8), torch.uint8)
    address = batch.data_ptr()
    view = batch[1:]
    del batch
    other = kept.empty((4, 3, 8, 8), torch.uint8)
    assert other.data_ptr() != address
    del view, other
    assert kept.empty((4, 3, 8, 8), torch.uint8).data_ptr() == address


def test_free_batches_of_a_shape_no_longer_asked_for_are_dropped():
    kept = collate._KeptBatches()
    kept.empty((4, 3, 8, 8), torch.uint8)  # an epoch's last, short batch: asked for once
    for _ in range(collate._KeptBatches.STALE + 1):
        held = kept.empty((2, 3, 8, 8), torch.uint8)
        del held
    assert [array.shape for array in kept._arrays] == [(2, 3, 8, 8)]


def _served_from_the_pool(kept: collate._KeptBatches, tensor: torch.Tensor) -> bool:
    return any(tensor.data_ptr() == array.ctypes.data for array in kept._arrays)


def test_record_batches_in_flight_reuse_every_field_block():
    """A records loader: each batch a block per field (two shapes), about eight batches in
    flight (the threads' batches ahead, the queue, the loop's): after the first round, every block
    comes from a freed one."""
    kept = collate._KeptBatches()
    in_flight, fresh = [], 0
    for step in range(60):
        batch = [kept.empty((32, 4, 100), torch.float32), kept.empty((32, 100), torch.float32)]
        if step >= 8:
            fresh += sum(not _served_from_the_pool(kept, t) for t in batch)
        in_flight.append(batch)
        if len(in_flight) > 7:
            in_flight.pop(0)  # the loop is done with the oldest batch
    assert fresh == 0


def test_at_most_limit_batches_are_kept_and_more_are_still_served():
    kept = collate._KeptBatches(limit=2)
    held = [kept.empty((2, 3), torch.float32) for _ in range(4)]
    assert len({t.data_ptr() for t in held}) == 4 and len(kept._arrays) == 2
    assert all(t.shape == (2, 3) and t.dtype == torch.float32 for t in held)


def test_dtypes_numpy_lacks_get_plain_tensors():
    kept = collate._KeptBatches()
    out = kept.empty((2, 3), torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3) and kept._arrays == []


def test_batches_held_by_the_loop_are_never_overwritten(no_thread_leak):
    """Two loader threads collating at once while the loop keeps every batch: no two batches
    share memory, and each still holds its own samples."""
    batches, lock = [], threading.Lock()

    def load(value):
        for _ in range(20):
            images, _ = fast_collate([(torch.full((3, 4, 4), value, dtype=torch.uint8), 0)] * 3)
            with lock:
                batches.append((value, images))

    threads = [threading.Thread(target=load, args=(v,)) for v in (1, 2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len({images.data_ptr() for _, images in batches}) == len(batches)
    assert all(images.eq(value).all() for value, images in batches)


def test_fast_collate_in_this_process_reuses_the_freed_batch():
    samples = [(torch.zeros(3, 16, 16, dtype=torch.uint8), 0)] * 4
    images, _ = fast_collate(samples)
    address = images.data_ptr()
    del images
    again, _ = fast_collate(samples)
    assert again.data_ptr() == address and again.eq(0).all()
