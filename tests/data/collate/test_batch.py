"""fast_collate: one contiguous uint8 batch, shared memory in workers, pinning, clear errors."""

from __future__ import annotations

import platform
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.data import fast_collate
from fastpipe.data.collate import batch as collate

pytestmark = pytest.mark.timeout(60)


def _samples(n=5, shape=(3, 8, 6), dtype=torch.uint8):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, shape, generator=gen).to(dtype), i % 3) for i in range(n)]


def test_stacks_into_contiguous_nchw_without_changing_dtype():
    batch = _samples()
    images, labels = fast_collate(batch)
    assert images.shape == (5, 3, 8, 6) and images.dtype == torch.uint8 and images.is_contiguous()
    assert torch.equal(images, torch.stack([image for image, _ in batch]))
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 1, 2, 0, 1]


def test_accepts_tensor_and_numpy_labels_and_non_contiguous_images():
    batch = [(torch.zeros(8, 6, 3, dtype=torch.uint8).permute(2, 0, 1), torch.tensor(2)),
             (torch.ones(3, 8, 6, dtype=torch.uint8), np.int64(4))]
    images, labels = fast_collate(batch)
    assert images.is_contiguous() and images[1].eq(1).all()
    assert labels.tolist() == [2, 4]


def test_other_dtypes_pass_through_unconverted():
    images, _ = fast_collate(_samples(dtype=torch.float16))
    assert images.dtype == torch.float16


def test_mismatched_shapes_name_both_samples():
    batch = _samples(3)
    batch[2] = (torch.zeros(3, 9, 6, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match=r"sample 2 is \(3, 9, 6\)"):
        fast_collate(batch)


def test_mismatched_dtypes_are_rejected():
    batch = _samples(2)
    batch[1] = (batch[1][0].float(), 0)
    with pytest.raises(ValueError, match="torch.float32"):
        fast_collate(batch)


@pytest.mark.parametrize("batch,error,match", [
    ([], ValueError, "empty"),
    ([(np.zeros((3, 2, 2), np.uint8), 0)], TypeError, "image tensors"),
    ([torch.zeros(3, 2, 2, dtype=torch.uint8)], TypeError, "integer class labels"),
    ([(torch.zeros(3, 2, 2, dtype=torch.uint8), "cat")], TypeError, "integer class labels"),
    ([5], TypeError, r"\(image, label\)"),
])
def test_bad_batches_say_what_was_expected(batch, error, match):
    with pytest.raises(error, match=match):
        fast_collate(batch)


def test_pin_memory_without_cuda_warns_and_returns_unpinned_memory():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the warning is for machines without it")
    with pytest.warns(UserWarning, match="no CUDA device"):
        images, _ = fast_collate(_samples(), pin_memory=True)
    assert images.shape == (5, 3, 8, 6)


def test_pin_memory_allocates_the_batch_in_pinned_memory_recording_stand_in(monkeypatch):
    """GPU-only logic with a recording stand-in: with CUDA present, the batch is written straight
    into one pinned allocation of the batch's shape and dtype (no pin_memory() copy after)."""
    calls = []

    def record(shape, dtype):
        calls.append((shape, dtype))
        return torch.empty(shape, dtype=dtype)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(collate, "_empty_pinned", record)
    batch = _samples()
    images, _ = fast_collate(batch, pin_memory=True)
    assert calls == [((5, 3, 8, 6), torch.uint8)]
    assert torch.equal(images, torch.stack([image for image, _ in batch]))


class _Images(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.full((3, 4, 4), index, dtype=torch.uint8), index


def _pinned_collate(batch):
    return fast_collate(batch, pin_memory=True)


@pytest.mark.timeout(120)
def test_in_a_worker_the_batch_is_built_in_shared_memory(no_thread_leak):
    loader = DataLoader(_Images(), batch_size=4, num_workers=1, collate_fn=fast_collate)
    batches = list(loader)
    assert all(images.is_shared() for images, _ in batches)
    assert torch.cat([images[:, 0, 0, 0] for images, _ in batches]).tolist() == list(range(8))


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_pinning_inside_a_worker_is_refused_with_the_fix(no_thread_leak):
    loader = DataLoader(_Images(), batch_size=4, num_workers=1, collate_fn=_pinned_collate)
    with pytest.raises(ValueError, match=r"DataLoader\(\.\.\., pin_memory=True"):
        next(iter(loader))


def test_shared_allocation_is_shared_and_shaped():
    out = collate._empty_shared((2, 3, 4, 5), torch.uint8)
    assert out.shape == (2, 3, 4, 5) and out.is_shared() and out.is_contiguous()


def _resident_pages(tensor: torch.Tensor) -> tuple[int, int]:
    """(resident, total) pages of ``tensor``'s memory, from mincore(2)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    start = tensor.data_ptr() & ~(mmap.PAGESIZE - 1)
    length = tensor.data_ptr() + tensor.numel() * tensor.element_size() - start
    pages = -(-length // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(start, length, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec), pages


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="MADV_POPULATE_WRITE is Linux-only")
def test_shared_batch_pages_are_mapped_up_front(monkeypatch):
    monkeypatch.setattr(collate, "_populate", lambda tensor: None)
    lazy = collate._empty_shared((8, 3, 224, 224), torch.uint8)
    monkeypatch.undo()
    resident, pages = _resident_pages(lazy)
    assert resident < pages, (
        "a fresh shared allocation was already resident: the test proves nothing")
    out = collate._empty_shared((8, 3, 224, 224), torch.uint8)
    resident, pages = _resident_pages(out)
    if resident < pages and tuple(int(p) for p in platform.release().split(".")[:2]) < (5, 14):
        pytest.skip("MADV_POPULATE_WRITE needs Linux >= 5.14")
    assert resident == pages
    out.fill_(7)
    assert out.is_shared() and int(out.sum()) == 7 * out.numel()
