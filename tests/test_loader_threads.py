"""DataLoaderX(worker_method="thread"): DataLoader's batches from threads, nothing left running."""

from __future__ import annotations

import _thread
import pickle
import threading
import time

import pytest
import torch
from torch.utils.data import IterableDataset

from fastpipe import DataLoaderX
from fastpipe.data import ImageFolder, fast_collate


class Numbers(torch.utils.data.Dataset):
    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise KeyError(f"sample {i} is broken")
        return torch.full((3,), float(i)), int(i)


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_thread_workers_give_the_process_workers_batches(sample_root, no_thread_leak):
    dataset = ImageFolder(sample_root, train=True, size=32, seed=5)
    kwargs = dict(batch_size=8, shuffle=True, seed=3, collate_fn=fast_collate, num_workers=2)
    processes = list(DataLoaderX(dataset, **kwargs))
    threads = list(DataLoaderX(dataset, worker_method="thread", **kwargs))
    assert len(threads) == len(processes) == 6
    for a, b in zip(threads, processes, strict=True):
        assert _equal(a, b)


def test_an_error_reaches_the_loop_at_its_batch_and_the_threads_end(no_thread_leak):
    loader = DataLoaderX(Numbers(40, fail_at=13), batch_size=4, num_workers=2,
                         worker_method="thread")
    seen = []
    with pytest.raises(KeyError, match="sample 13 is broken"):
        for _, labels in loader:
            seen.append(labels.tolist())
    assert len(seen) == 3


@pytest.mark.parametrize("stop", ["break", "close"])
def test_threads_end_after_an_early_stop(stop, no_thread_leak):
    loader = DataLoaderX(Numbers(4000), batch_size=4, num_workers=2, worker_method="thread")
    for _ in loader:
        break
    if stop == "close":
        loader.close()


class Slow(Numbers):
    """Samples that take ``seconds`` each (a slow read, a store that answers late)."""

    def __init__(self, n: int, seconds: float) -> None:
        super().__init__(n)
        self.seconds = seconds

    def __getitem__(self, i: int):
        time.sleep(self.seconds)
        return super().__getitem__(i)


def _running(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def test_each_batch_goes_from_the_thread_that_loaded_it_to_the_loop(no_thread_leak):
    # No background thread between the workers and the loop: a batch handed through one more
    # thread wakes it and takes the GIL once more, per batch.
    loader = DataLoaderX(Numbers(400), batch_size=4, num_workers=2, worker_method="thread")
    seen = 0
    for _, labels in loader:
        assert _running("fastpipe-") == _running("fastpipe-DataLoaderX-worker")
        assert len(_running("fastpipe-")) <= 2
        seen += len(labels)
    assert seen == 400


def test_close_from_another_thread_ends_the_loops_wait_for_a_batch(no_thread_leak):
    loader = DataLoaderX(Slow(40, seconds=0.75), batch_size=4, num_workers=2,
                         worker_method="thread")
    batches = iter(loader)
    ended = []

    def loop() -> None:
        ended.append(list(batches))  # waits for the first batch, 3 s away

    consumer = threading.Thread(target=loop)
    consumer.start()
    time.sleep(0.3)
    start = time.monotonic()
    loader.close()
    consumer.join(5)
    assert not consumer.is_alive() and ended == [[]]
    assert time.monotonic() - start < 1.5  # the threads end after their batches (no leak)


def test_ctrl_c_while_waiting_for_a_batch_does_not_wait_for_the_batches_being_loaded(
        no_thread_leak):
    loader = DataLoaderX(Slow(8, seconds=1.0), batch_size=4, num_workers=2,
                         worker_method="thread")
    timer = threading.Timer(0.5, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    # The two batches being loaded take 4 s; the interrupt reached the loop at 0.5 s.
    assert time.monotonic() - start < 1.5
    timer.join()


def test_after_a_ctrl_c_the_threads_end_after_the_sample_they_are_reading(no_thread_leak):
    # A sample takes 0.5 s, a batch 4 s: the threads stop between samples, not between batches.
    loader = DataLoaderX(Slow(64, seconds=0.5), batch_size=8, num_workers=2,
                         worker_method="thread")
    timer = threading.Timer(1.2, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    interrupted = time.monotonic()
    while _running("fastpipe-DataLoaderX-worker") and time.monotonic() - interrupted < 5:
        time.sleep(0.02)
    assert time.monotonic() - interrupted < 1.0
    timer.join()


def test_resume_with_thread_workers(no_thread_leak):
    kwargs = dict(batch_size=4, shuffle=True, seed=1, num_workers=2, worker_method="thread")
    whole = list(DataLoaderX(Numbers(30), **kwargs))
    loader = DataLoaderX(Numbers(30), **kwargs)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    del batches
    resumed = DataLoaderX(Numbers(30), **kwargs)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 3
    for a, b in zip(rest, whole[3:], strict=True):
        assert _equal(a, b)
    assert pickle.loads(pickle.dumps(resumed)).worker_method == "thread"


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


@pytest.mark.parametrize("kwargs, match", [
    (dict(dataset=Numbers(4), worker_method="threads"), "worker_method must be 'process'"),
    (dict(dataset=Stream(), worker_method="thread"), "needs a map-style dataset"),
    (dict(dataset=Numbers(4), batch_size=None, worker_method="thread"), "pass batch_size="),
    (dict(dataset=Numbers(4), worker_method="thread", worker_init_fn=print), "worker_init_fn"),
])
def test_what_threads_cannot_do_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoaderX(num_workers=2, **kwargs)


def test_thread_workers_collate_straight_into_pinned_memory_without_a_second_copy(
    monkeypatch, no_thread_leak
):
    # Recording stand-ins for the GPU-only steps: the pinned allocation of fast_collate and the
    # pin step after a collate. Pinning after fast_collate would be a second batch-sized copy.
    import torch.utils.data._utils.pin_memory as torch_pinning

    from fastpipe.data.collate import batch as collate

    allocated, pinned_after = [], []

    def empty_pinned(shape, dtype):
        out = torch.empty(shape, dtype=dtype)
        allocated.append(out.data_ptr())
        return out

    def pin_step(data, *args, **kwargs):
        pinned_after.append(data)
        return data

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(collate, "_empty_pinned", empty_pinned)
    monkeypatch.setattr(torch_pinning, "pin_memory", pin_step)
    dataset = [(torch.full((3, 4, 4), i, dtype=torch.uint8), i) for i in range(12)]
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, worker_method="thread",
                         pin_memory=True, collate_fn=fast_collate)
    batches = list(loader)
    # (The threads allocate in the order they finish; the batches come in sampler order.)
    assert sorted(images.data_ptr() for images, _ in batches) == sorted(allocated)
    assert len(allocated) == 3
    assert torch.cat([labels for _, labels in batches]).tolist() == list(range(12))
    assert pinned_after == []
    # Any other collate_fn is pinned after it, as DataLoader's pinning does.
    assert len(list(DataLoaderX(dataset, batch_size=4, num_workers=2, worker_method="thread",
                                pin_memory=True))) == 3
    assert len(pinned_after) == 3


def test_thread_workers_without_cuda_skip_pinning_as_process_workers_do(no_thread_leak):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the check is for machines without it")
    dataset = [(torch.full((3, 4, 4), i, dtype=torch.uint8), i) for i in range(8)]
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, worker_method="thread",
                         pin_memory=True, collate_fn=fast_collate)
    with pytest.warns(UserWarning, match="no CUDA device"):
        labels = [labels.tolist() for _, labels in loader]
    assert labels == [[0, 1, 2, 3], [4, 5, 6, 7]]
