"""Batches from worker processes through their arenas (fastpipe/data/collate/arena.py): the same
batches as without, a batch the loop holds never written to, the memory reused, fork and spawn,
skips and pinning, and everything released when the loader and its batches are gone."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from fastpipe import DataLoaderX
from fastpipe.data import fast_collate
from fastpipe.data.collate import arena
from fastpipe.data.collate.batch import batch_empty
from fastpipe.data.collate.records import Rows

pytestmark = [
    pytest.mark.skipif(not arena.available(), reason="arenas need Linux's memfd"),
    pytest.mark.timeout(240),
]

SHAPE = (4, 300)


class Blocks(Dataset):
    """Records read a batch at a time into one block per field, as fastpipe's readers do."""

    def __len__(self) -> int:
        return 100

    @staticmethod
    def row(i: int) -> np.ndarray:
        return (np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) + 1000 * i)

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.from_numpy(self.row(i)), "i": i}

    def __getitems__(self, indices: list[int]) -> Rows:
        block = batch_empty((len(indices), *SHAPE), torch.float32)
        for k, i in enumerate(indices):
            block[k] = torch.from_numpy(self.row(i))
        samples = [{"x": row, "i": i} for row, i in zip(block.unbind(0), indices, strict=True)]
        return Rows(samples, {"x": block}, {"x": block.unbind(0)})


class Images(Dataset):
    def __len__(self) -> int:
        return 37

    def __getitem__(self, i: int):
        return torch.full((3, 16, 12), i % 256, dtype=torch.uint8), i


def _expected_x(indices) -> torch.Tensor:
    return torch.from_numpy(np.stack([Blocks.row(i) for i in indices]))


@pytest.fixture
def refs(monkeypatch):
    """Every reference the training process received, recorded on the way."""
    seen: list[arena.ArenaRef] = []
    real = arena.materialize

    def recording(batch):
        if isinstance(batch, arena.ArenaBatch):
            torch.utils._pytree.tree_map_only(arena.ArenaRef, seen.append, batch.batch)
        return real(batch)

    monkeypatch.setattr(arena, "materialize", recording)
    return seen


def test_batches_are_the_same_as_without_workers_and_come_through_the_arenas(refs):
    kwargs = dict(batch_size=16, collate_fn=fast_collate)
    for dataset in (Blocks(), Images()):
        want = list(DataLoaderX(dataset, **kwargs))
        got = list(DataLoaderX(dataset, **kwargs, num_workers=2))
        assert len(got) == len(want) and len(got[-1][next(iter(got[-1]))]
                                             if isinstance(got[-1], dict) else got[-1][0]) < 16
        for a, b in zip(got, want, strict=True):
            for x, y in zip(a.values() if isinstance(a, dict) else a,
                            b.values() if isinstance(b, dict) else b, strict=True):
                assert x.dtype == y.dtype and torch.equal(x, y)
    # Both datasets' big tensors crossed as references; the labels (made by torch.tensor in
    # the worker) through shared memory as before.
    assert {r.dtype for r in refs} == {torch.float32, torch.uint8}


def test_a_batch_the_loop_holds_is_never_written_over():
    loader = DataLoaderX(Blocks(), batch_size=8, num_workers=2, collate_fn=fast_collate,
                         persistent_workers=True, shuffle=True, seed=3)
    held = []
    for _ in range(3):
        for batch in loader:
            held.append((batch["i"].clone(), batch["x"]))
    for indices, x in held:  # every batch as it was when it came, after all the others
        assert torch.equal(x, _expected_x(indices.tolist()))


def test_more_batches_held_than_the_arena_has_room_for_go_through_shared_memory(monkeypatch,
                                                                                refs):
    monkeypatch.setattr(arena, "CAPACITY", 3 * 8 * int(np.prod(SHAPE)) * 4)  # three batches
    loader = DataLoaderX(Blocks(), batch_size=8, num_workers=1, collate_fn=fast_collate)
    held = list(loader)
    assert 3 <= len(refs) < len(held)  # the arena filled up, the rest came as before
    for batch in held:
        assert torch.equal(batch["x"], _expected_x(batch["i"].tolist()))


def test_the_arena_memory_is_reused(refs):
    loader = DataLoaderX(Blocks(), batch_size=8, num_workers=1, collate_fn=fast_collate,
                         persistent_workers=True)
    for _ in range(4):
        for batch in loader:
            del batch  # the loop keeps nothing
    nbytes = 8 * int(np.prod(SHAPE)) * 4
    assert len(refs) == 4 * 13
    # In flight at once: the worker's prefetch, DataLoaderX's queue, the one the loop has.
    assert max(r.offset for r in refs) < 8 * nbytes
    assert len({r.offset for r in refs}) <= 8


def test_views_of_an_arena_block_keep_their_shape_and_values():
    def first_rows(samples):
        batch = fast_collate(samples)
        return batch["x"][1:, :, 10:20], batch["x"][::2]

    loader = DataLoaderX(Blocks(), batch_size=8, num_workers=1, collate_fn=first_rows)
    for k, (tail, even) in enumerate(loader):
        rows = _expected_x(range(8 * k, min(8 * k + 8, 100)))
        assert torch.equal(tail, rows[1:, :, 10:20]) and torch.equal(even, rows[::2])


@pytest.mark.slow
def test_spawned_workers_get_their_arenas(refs):
    loader = DataLoaderX(Blocks(), batch_size=16, num_workers=2, collate_fn=fast_collate,
                         multiprocessing_context="spawn")
    got = list(loader)
    assert refs  # the descriptors crossed to the spawned workers
    for batch in got:
        assert torch.equal(batch["x"], _expected_x(batch["i"].tolist()))


class Corrupt(Blocks):
    def __getitems__(self, indices):
        from fastpipe.data import CorruptImageError

        if 13 in indices:
            raise CorruptImageError("sample 13 is damaged")
        return super().__getitems__(indices)

    def __getitem__(self, i):
        from fastpipe.data import CorruptImageError

        if i == 13:
            raise CorruptImageError("sample 13 is damaged")
        return super().__getitem__(i)


def test_skipping_sees_tensors(refs):
    loader = DataLoaderX(Corrupt(), batch_size=8, num_workers=1, collate_fn=fast_collate,
                         on_error="skip")
    with pytest.warns(RuntimeWarning, match="sample 13"):
        batches = list(loader)
    assert refs and sum(len(b["i"]) for b in batches) == 99
    for batch in batches:
        assert torch.equal(batch["x"], _expected_x(batch["i"].tolist()))


def _in_process_worker(monkeypatch, capacity: int):
    """This process playing a worker of a one-worker ArenaSet."""
    arenas = arena.ArenaSet(1, capacity=capacity)
    monkeypatch.setattr(arena, "_WORKER", None)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    arenas.attach(0)
    worker, key = arena._WORKER
    return arenas, worker, key


def test_the_pinning_thread_pins_the_batch_as_tensors(monkeypatch):
    from torch.utils.data._utils.pin_memory import pin_memory

    from fastpipe.data.sampling.skip import Outcome

    arenas, worker, key = _in_process_worker(monkeypatch, 16 * arena._ALIGN)
    collate = arena.ArenaCollate(lambda samples: fast_collate(samples))
    want = [torch.arange(6, dtype=torch.int32).view(2, 3) + k for k in range(2)]
    pinned = []  # recording stand-in: pinning needs CUDA
    monkeypatch.setattr(torch.Tensor, "pin_memory",
                        lambda self, *a: pinned.append(self) or self.clone())
    for wrap in (lambda b: b, lambda b: Outcome(b, [])):  # on_error="raise" and "skip"
        batch = collate([{"x": w, "y": w[0]} for w in want])
        assert isinstance(batch, arena.ArenaBatch)
        got = pin_memory(wrap(batch))  # DataLoader's pinning thread
        got = got.batch if isinstance(got, Outcome) else got
        assert torch.equal(got["x"], torch.stack(want)) and torch.equal(
            got["y"], torch.stack([w[0] for w in want]))
    assert len(pinned) == 4


def test_tensors_of_one_allocation_in_a_batch_share_their_release(monkeypatch):
    arenas, worker, key = _in_process_worker(monkeypatch, 16 * arena._ALIGN)
    collate = arena.ArenaCollate(lambda samples: (lambda b: (b["x"], b["x"][1:]))(
        fast_collate(samples)))
    batch = collate([{"x": torch.full((1000,), k, dtype=torch.float32)} for k in range(3)])
    gc.collect()
    whole, tail = arena.materialize(batch)
    del batch
    gc.collect()
    del whole  # the view still needs the allocation: not released, not reused
    gc.collect()
    worker._drain()
    again = worker.empty((3, 1000), torch.float32)
    assert again.untyped_storage().data_ptr() != tail.untyped_storage().data_ptr() - 4000
    assert torch.equal(tail, torch.tensor([[1.0] * 1000, [2.0] * 1000]))
    del tail, again
    gc.collect()
    worker._drain()
    assert worker.live == {}


def _arena_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("fastpipe-batches" in line for line in f)


def test_the_arenas_are_released_with_the_loader_and_its_batches():
    gc.collect()
    fds, maps = len(os.listdir("/proc/self/fd")), _arena_maps()
    loader = DataLoaderX(Blocks(), batch_size=8, num_workers=2, collate_fn=fast_collate)
    kept = [batch for batch in loader][:3]
    assert _arena_maps() > maps
    del loader
    gc.collect()
    assert all(torch.equal(b["x"], _expected_x(b["i"].tolist())) for b in kept)
    del kept
    gc.collect()
    assert _arena_maps() == maps and len(os.listdir("/proc/self/fd")) == fds


def test_the_allocator_frees_an_allocation_once_both_sides_are_done(monkeypatch):
    arenas, worker, key = _in_process_worker(monkeypatch, 64 * arena._ALIGN)
    a = worker.empty((arena._ALIGN // 4,), torch.float32)
    b = worker.empty((10,), torch.int64)
    assert worker.holds(a) and worker.holds(b) and not worker.holds(torch.zeros(3))
    worker.batch += 1
    ref = worker.reference(a, key)
    assert ref.offset == 0 and not worker.holds(a)  # sent: the training process's now
    del a, b
    gc.collect()
    assert list(worker.live) == [0]  # b was never sent: free at once; a waits for its release
    tensor = arena.materialize(arena.ArenaBatch(ref))
    c = worker.empty((arena._ALIGN // 4,), torch.float32)
    assert c.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()
    view = tensor[10:]
    del tensor
    gc.collect()
    worker._drain()
    assert 0 in worker.live  # a view still holds it
    del view, c
    gc.collect()
    worker._drain()
    assert worker.live == {} and worker.free == [(0, 64 * arena._ALIGN)]  # merged back whole
