"""cuda lane: DataPrefetcher's stream hand-off on a real GPU, under races built to break it.

Every batch gets a checksum computed on the current stream right after it arrives, without any
synchronization in the loop; the checksums are compared, after the loop, with those of the same
batches moved and normalized synchronously. The races:

- a step that reads the batch at once, while the copy of a large batch may still be running on
  the side stream: a missing wait of the current stream on the side stream reads a partial copy;
- a step whose stream is busy (torch.cuda._sleep) before it reads the batch, which it then frees,
  while the next batch is prepared: without ``record_stream`` on the current stream, the caching
  allocator gives the freed memory to the side stream, which overwrites it before the read;
- batches already on the GPU, written by the current stream after a sleep: the side stream must
  wait for that write before it normalizes, and keep the input alive while it reads it.

The control tests take the waits or the ``record_stream`` calls away (at torch's level, so they
do not depend on DataPrefetcher's internals) and assert that the same check then fails: the check
can fail. One of them takes away only ``record_stream(input, side)``, with GPU inputs that their
producer frees and rewrites as soon as they are handed over. Pinned and unpageable host memory,
``prefetch_depth`` 1 and 2, tuple, dict and nested batches, mean/std given as CUDA tensors, a
``batch_transform`` (run on the side stream), and the second GPU (``cuda:1``; skipped with one
GPU). Skipped without a GPU; FASTPIPE_REQUIRE_CUDA=1 makes that a failure (docs/gpu.md).
"""

from __future__ import annotations

import pytest
import torch

from fastpipe import DataPrefetcher, ops
from tests.helpers.cuda import checksum, gpu_sleep, random_batches

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BIG = (64, 3, 448, 448)  # 38.5 MB of uint8: a copy of milliseconds
COUNT = 12


def _structure(images: torch.Tensor, index: int, kind: str):
    labels = torch.full((images.shape[0],), index, dtype=torch.int64)
    if kind == "tuple":
        return images, labels
    if kind == "dict":
        return {"image": images, "label": labels, "name": f"batch{index}"}
    # Nested: the images stay where normalization finds them, the other tensors are deeper.
    return {"image": images, "targets": {"label": labels, "more": [labels * 2]},
            "meta": {"index": index}}


def _images(batch, kind: str) -> torch.Tensor:
    return batch[0] if kind == "tuple" else batch["image"]


def _labels(batch, kind: str) -> torch.Tensor:
    if kind == "tuple":
        return batch[1]
    if kind == "dict":
        return batch["label"]
    assert batch["targets"]["more"][0].device.type == "cuda"
    assert isinstance(batch["meta"]["index"], int)  # non-tensor leaves pass through
    return batch["targets"]["label"]


def _expected(batches: list[torch.Tensor], normalize: bool) -> list[float]:
    """Checksums of the batches moved and normalized with a synchronization at every step."""
    sums = []
    for cpu in batches:
        x = cpu.cuda()
        torch.cuda.synchronize()
        if normalize:
            x = ops.normalize(x, MEAN, STD)  # what DataPrefetcher(mean=, std=) computes
        sums.append(checksum(x).item())
    torch.cuda.synchronize()
    return sums


def _run(prefetcher, kind: str, busy_step: float, pressure: bool) -> tuple[list, list]:
    """Checksums of the images and labels of every batch, queued on the current stream."""
    sums, labels = [], []
    for batch in prefetcher:
        images = _images(batch, kind)
        if busy_step:
            gpu_sleep(busy_step)  # the step's stream is busy; the batch must stay ours
        sums.append(checksum(images))
        labels.append(_labels(batch, kind).sum())
        del batch, images
        if pressure:
            # Memory reuse pressure: allocate and free batch-sized blocks on the current stream.
            junk = torch.full(BIG, 255, dtype=torch.uint8, device="cuda")
            del junk
    torch.cuda.synchronize()
    return [s.item() for s in sums], [s.item() for s in labels]


def _check(batches, sums, labels, normalize: bool) -> list[int]:
    """Indices of the batches whose images or labels are wrong (a batch read from memory
    another batch reused shows in either)."""
    expected = _expected(batches, normalize)
    assert len(sums) == len(labels) == len(batches)
    return [i for i, (got, want, label) in enumerate(zip(sums, expected, labels))
            if got != want or label != i * batches[i].shape[0]]


def _prefetcher(batches, kind, depth, normalize, on_gpu=False):
    def source():
        for i, cpu in enumerate(batches):
            if on_gpu:
                # A GPU-resident batch (DALI's, or a GPU decoder's), written by the current
                # stream after a busy spell: the side stream must wait for it.
                x = torch.empty(cpu.shape, dtype=cpu.dtype, device="cuda")
                gpu_sleep(0.05)
                x.copy_(cpu, non_blocking=True)
                yield _structure(x, i, kind)
            else:
                yield _structure(cpu, i, kind)

    options = {"mean": MEAN, "std": STD} if normalize else {}
    return DataPrefetcher(source(), device="cuda", prefetch_depth=depth, **options)


@pytest.mark.parametrize("kind", ("tuple", "dict", "nested"))
@pytest.mark.parametrize("depth", (1, 2))
@pytest.mark.parametrize("pinned", (True, False))
@pytest.mark.parametrize("normalize", (False, True))
def test_a_step_that_reads_the_batch_at_once_sees_all_of_it(normalize, pinned, depth, kind):
    batches = random_batches(COUNT, BIG, seed=depth, pin=pinned)
    sums, labels = _run(_prefetcher(batches, kind, depth, normalize), kind, 0.0, pressure=True)
    assert _check(batches, sums, labels, normalize) == []


@pytest.mark.parametrize("depth", (1, 2))
@pytest.mark.parametrize("normalize", (False, True))
def test_a_busy_step_keeps_its_batch_while_the_next_ones_are_prepared(normalize, depth):
    batches = random_batches(COUNT, BIG, seed=10 + depth, pin=True)
    prefetcher = _prefetcher(batches, "tuple", depth, normalize)
    sums, labels = _run(prefetcher, "tuple", 0.05, pressure=True)
    assert _check(batches, sums, labels, normalize) == []


@pytest.mark.parametrize("depth", (1, 2))
@pytest.mark.parametrize("normalize", (False, True))
def test_batches_already_on_the_gpu_are_read_after_their_producer(normalize, depth):
    batches = random_batches(COUNT, BIG, seed=20 + depth, pin=True)
    prefetcher = _prefetcher(batches, "dict", depth, normalize, on_gpu=True)
    sums, labels = _run(prefetcher, "dict", 0.0, pressure=True)
    assert _check(batches, sums, labels, normalize) == []


# --- the controls: without the synchronization, the same checks fail --------------------------

def _without_waits(monkeypatch):
    for cls, name in ((torch.cuda.Stream, "wait_event"), (torch.cuda.Stream, "wait_stream"),
                      (torch.cuda.Event, "wait")):
        monkeypatch.setattr(cls, name, lambda *args, **kwargs: None)


def _slow_host_copies(monkeypatch, main: torch.cuda.Stream, seconds: float = 0.05) -> None:
    """Every copy of a host tensor queued on a stream other than ``main`` starts after
    ``seconds`` of busy work on that stream: the copy then ends well after the step's read is
    queued. (On an H100 a batch's copy takes about a millisecond and ended before the unordered
    read began, so without this the control could not fail.)"""
    gpu_sleep(0.001)  # measures the clock once, before Tensor.to is patched
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if self.device.type == "cpu" and torch.cuda.current_stream() != main:
            gpu_sleep(seconds)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)


def test_copies_that_end_late_are_still_waited_for(monkeypatch):
    """The control below, with the waits in place: the same late copies are read intact."""
    batches = random_batches(COUNT, BIG, seed=30, pin=True)
    _expected(batches, True)
    _slow_host_copies(monkeypatch, torch.cuda.current_stream())
    sums, labels = _run(_prefetcher(batches, "tuple", 1, True), "tuple", 0.0, pressure=False)
    monkeypatch.undo()
    assert _check(batches, sums, labels, True) == []


def test_control_without_the_waits_the_immediate_read_sees_partial_copies(monkeypatch):
    batches = random_batches(COUNT, BIG, seed=30, pin=True)
    _expected(batches, True)  # warm the kernels up outside the patched region
    _without_waits(monkeypatch)
    _slow_host_copies(monkeypatch, torch.cuda.current_stream())
    sums, labels = _run(_prefetcher(batches, "tuple", 1, True), "tuple", 0.0, pressure=False)
    monkeypatch.undo()
    assert _check(batches, sums, labels, True), "no batch was wrong without any wait"


def test_control_without_record_stream_the_busy_step_reads_reused_memory(monkeypatch):
    batches = random_batches(COUNT, BIG, seed=31, pin=True)
    _expected(batches, False)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    sums, labels = _run(_prefetcher(batches, "tuple", 1, False), "tuple", 0.1, pressure=False)
    monkeypatch.undo()
    assert _check(batches, sums, labels, False), (
        "no batch was wrong without record_stream: the memory was not reused"
    )


def test_control_without_the_waits_gpu_resident_batches_are_read_too_early(monkeypatch):
    batches = random_batches(COUNT, BIG, seed=32, pin=True)
    _expected(batches, True)
    _without_waits(monkeypatch)
    prefetcher = _prefetcher(batches, "dict", 1, True, on_gpu=True)
    sums, labels = _run(prefetcher, "dict", 0.0, pressure=False)
    monkeypatch.undo()
    assert _check(batches, sums, labels, True), "no batch was wrong without any wait"


# --- GPU inputs freed by their producer right after they are handed over ----------------------

def _slow_side_stream(monkeypatch, main: torch.cuda.Stream, seconds: float = 0.05) -> None:
    """Every wait a stream other than ``main`` queues is followed by ``seconds`` of busy work on
    it: the side stream then reads each batch well after the current stream moved on, so a block
    freed and rewritten on the current stream is rewritten before the side stream's read."""
    gpu_sleep(0.001)  # measures the clock once, before any stream is patched
    real_wait_event, real_wait_stream = torch.cuda.Stream.wait_event, torch.cuda.Stream.wait_stream

    def busy(stream) -> None:
        if stream != main:
            with torch.cuda.stream(stream):
                gpu_sleep(seconds)

    def wait_event(self, event):
        real_wait_event(self, event)
        busy(self)

    def wait_stream(self, other):
        real_wait_stream(self, other)
        busy(self)

    monkeypatch.setattr(torch.cuda.Stream, "wait_event", wait_event)
    monkeypatch.setattr(torch.cuda.Stream, "wait_stream", wait_stream)


def _freed_inputs_prefetcher(batches, depth: int = 2):
    """GPU-resident dict batches whose producer takes its tensor back as soon as the prefetcher
    asks for the next batch (as a loader reusing its output buffers would), and at once writes
    255 into a new block of the same size on the current stream: the block the allocator hands
    out first is the one just freed, unless the side stream is recorded on it. With
    ``prefetch_depth=2`` the next batch is asked for before the step's stream waits for this one,
    so nothing else orders the rewrite after the side stream's read."""
    def source():
        for i, cpu in enumerate(batches):
            x = torch.empty(cpu.shape, dtype=cpu.dtype, device="cuda")
            x.copy_(cpu, non_blocking=True)
            batch = _structure(x, i, "dict")
            yield batch
            # The reader's frame still holds the dict: emptying it drops the last reference.
            batch["image"] = None
            del x
            junk = torch.full(cpu.shape, 255, dtype=cpu.dtype, device="cuda")
            del junk

    return DataPrefetcher(source(), device="cuda", prefetch_depth=depth, mean=MEAN, std=STD)


def test_gpu_inputs_freed_and_rewritten_by_their_producer_are_read_intact(monkeypatch):
    batches = random_batches(COUNT, BIG, seed=33, pin=True)
    _expected(batches, True)
    _slow_side_stream(monkeypatch, torch.cuda.current_stream())
    sums, labels = _run(_freed_inputs_prefetcher(batches), "dict", 0.0, pressure=False)
    monkeypatch.undo()
    assert _check(batches, sums, labels, True) == []


def test_control_without_record_stream_on_the_side_stream_freed_inputs_are_overwritten(
    monkeypatch,
):
    """Only ``record_stream(input, side)`` is taken away (the records on the current stream
    stay): the same check then fails, so it holds that call to account."""
    batches = random_batches(COUNT, BIG, seed=34, pin=True)
    _expected(batches, True)
    main = torch.cuda.current_stream()
    real_record = torch.Tensor.record_stream
    monkeypatch.setattr(torch.Tensor, "record_stream",
                        lambda self, stream: real_record(self, stream) if stream == main else None)
    _slow_side_stream(monkeypatch, main)
    sums, labels = _run(_freed_inputs_prefetcher(batches), "dict", 0.0, pressure=False)
    monkeypatch.undo()
    assert _check(batches, sums, labels, True), (
        "no batch was wrong without record_stream(input, side): the freed input was not reused"
    )


# --- CUDA mean/std, batch_transform, a second GPU ---------------------------------------------

@pytest.mark.parametrize("depth", (1, 2))
def test_mean_and_std_given_as_cuda_tensors(depth):
    batches = random_batches(COUNT, BIG, seed=40 + depth, pin=True)
    mean = torch.tensor(MEAN, device="cuda")
    std = torch.tensor(STD, device="cuda")
    prefetcher = DataPrefetcher(iter([(b, torch.full((b.shape[0],), i)) for i, b in
                                      enumerate(batches)]),
                                device="cuda", prefetch_depth=depth, mean=mean, std=std)
    sums, labels = _run(prefetcher, "tuple", 0.05, pressure=True)
    assert _check(batches, sums, labels, True) == []


def test_batch_transform_runs_on_the_side_stream_and_its_output_is_handed_over():
    batches = random_batches(COUNT, BIG, seed=50, pin=True)
    main = torch.cuda.current_stream()
    streams = []
    generator = torch.Generator().manual_seed(5)

    def transform(images, targets):
        streams.append(torch.cuda.current_stream())
        return ops.cutout(images, num_holes=2, size=64, fill=7, generator=generator), targets

    prefetcher = DataPrefetcher(iter([(b, torch.full((b.shape[0],), i)) for i, b in
                                      enumerate(batches)]),
                                device="cuda", prefetch_depth=2, batch_transform=transform)
    sums, labels = _run(prefetcher, "tuple", 0.05, pressure=True)
    assert len(streams) == COUNT and all(s != main for s in streams), "not on a side stream"
    assert len({s.cuda_stream for s in streams}) == 1
    replay = torch.Generator().manual_seed(5)
    expected = []
    for b in batches:
        x = ops.cutout(b.cuda(), num_holes=2, size=64, fill=7, generator=replay)
        expected.append(checksum(x).item())
    torch.cuda.synchronize()
    assert labels == [i * batches[i].shape[0] for i in range(COUNT)]
    assert sums == expected


def test_a_batch_transform_may_hand_over_host_tensors():
    # A weight made on the host travels with the batch: record_stream refuses host memory, so
    # only the GPU tensors are recorded on the step's stream.
    batches = random_batches(3, (8, 3, 32, 32), seed=51, pin=True)

    def transform(images, targets):
        return images.float(), (targets, torch.tensor(0.5))

    out = list(DataPrefetcher(iter([(b, torch.arange(8)) for b in batches]), device="cuda",
                              batch_transform=transform))
    assert len(out) == 3
    for (images, (labels, weight)), batch in zip(out, batches):
        assert images.is_cuda and labels.is_cuda and weight.device.type == "cpu"
        assert torch.equal(images.cpu(), batch.float())


@pytest.fixture
def second_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU here: the cuda:1 tests need a second")
    return torch.device("cuda", 1)


def test_prefetcher_on_the_second_gpu(second_gpu):
    batches = random_batches(COUNT, BIG, seed=60, pin=True)
    assert torch.cuda.current_device() == 0
    sums = []
    with torch.cuda.device(second_gpu):
        for images, _ in DataPrefetcher(iter([(b, torch.zeros(1)) for b in batches]),
                                        device=second_gpu, prefetch_depth=2):
            assert images.device == second_gpu
            gpu_sleep(0.02)
            sums.append(checksum(images))
        torch.cuda.synchronize(second_gpu)
    # Integer checksums (uint8 times small weights, below 2^53): exact on any GPU.
    assert [s.item() for s in sums] == _expected(batches, False)
