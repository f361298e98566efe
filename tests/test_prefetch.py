"""DataPrefetcher: real CPU runs, and the CUDA stream hand-off through a recording stand-in."""

from __future__ import annotations

import contextlib
import gc
from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastpipe.prefetch as prefetch_module
from fastpipe import DataLoaderX, DataPrefetcher

pytestmark = pytest.mark.timeout(60)

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
Pair = namedtuple("Pair", ["image", "label"])


class _Images(Dataset):
    def __init__(self, n: int = 20, channels: int = 3) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, channels, 8, 6), dtype=torch.uint8, generator=g)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], i


def _batches(kind: str, n: int = 5):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        image = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8, generator=g)
        label = torch.arange(4) + 4 * i
        if kind == "tensor":
            out.append(image)
        elif kind == "tuple":
            out.append((image, label))
        elif kind == "list":
            out.append([image, label])
        elif kind == "dict":
            out.append({"image": image, "label": label, "meta": {"path": f"b{i}.jpg", "ok": "yes"}})
        elif kind == "namedtuple":
            out.append(Pair(image, label))
        elif kind == "nested":
            out.append({"inputs": [image, {"mask": label > 1}], "names": ("a", "b"), "label": label})
    return out


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict", "namedtuple", "nested"])
def test_same_batches_in_the_same_order_as_a_plain_loop(kind, no_thread_leak):
    batches = _batches(kind)
    prefetcher = DataPrefetcher(batches, device="cpu", depth=2)
    for _ in range(2):
        got = list(prefetcher)
        assert len(got) == len(batches)
        for expected, actual in zip(batches, got):
            _same(expected, actual)


def test_wraps_dataloaderx_over_three_epochs_without_leaks(no_thread_leak):
    loader = DataLoaderX(_Images(), batch_size=6, num_workers=2, shuffle=False)
    prefetcher = DataPrefetcher(loader, device="cpu")
    assert len(prefetcher) == len(loader) == 4
    for _ in range(3):
        labels = torch.cat([labels for _, labels in prefetcher])
        assert labels.tolist() == list(range(20))


def test_dict_batch_normalizes_image_and_keeps_meta(no_thread_leak):
    batches = _batches("dict")
    out = list(DataPrefetcher(batches, device="cpu", mean=MEAN, std=STD))
    for raw, got in zip(batches, out):
        assert got["meta"] == raw["meta"]
        assert got["label"].dtype == torch.int64 and torch.equal(got["label"], raw["label"])
        assert got["image"].dtype == torch.float32


@pytest.mark.parametrize(
    "dtype, atol",
    [(torch.float32, 1e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)],
)
@pytest.mark.parametrize("channels_last", [False, True])
def test_normalization_matches_a_float64_reference(dtype, atol, channels_last, no_thread_leak):
    loader = DataLoader(_Images(), batch_size=7)
    prefetcher = DataPrefetcher(loader, device="cpu", mean=MEAN, std=STD, dtype=dtype,
                                channels_last=channels_last)
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    for (raw, labels), (images, moved_labels) in zip(loader, prefetcher):
        expected = (raw.double() / 255 - mean) / std
        assert images.dtype == dtype
        assert images.is_contiguous(memory_format=torch.channels_last) == channels_last
        # The tolerance is the output dtype's rounding of values up to |2.7|.
        torch.testing.assert_close(images.double(), expected, atol=atol, rtol=0)
        assert torch.equal(moved_labels, labels)


def test_dtype_alone_scales_uint8_to_unit_range(no_thread_leak):
    batch = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1)
    (out,) = list(DataPrefetcher([batch], device="cpu", dtype=torch.float16))
    assert out.dtype == torch.float16
    assert out.flatten().tolist() == pytest.approx([0.0, 0.2, 1.0], abs=1e-3)


def test_float_images_are_taken_as_unit_range(no_thread_leak):
    batch = torch.full((1, 3, 2, 2), 0.5)
    (out,) = list(DataPrefetcher([(batch, torch.zeros(1))], device="cpu", mean=(0.5,) * 3,
                                 std=(0.25,) * 3))
    assert torch.equal(out[0], torch.zeros(1, 3, 2, 2))


def test_next_returns_none_at_the_end_and_then_starts_a_new_epoch(no_thread_leak):
    prefetcher = DataPrefetcher(_batches("tuple", n=3), device="cpu")
    labels = []
    batch = prefetcher.next()
    while batch is not None:
        labels.append(batch[1][0].item())
        batch = prefetcher.next()
    assert labels == [0, 4, 8]
    assert prefetcher.next()[1][0].item() == 0
    prefetcher.close()


def test_loader_exception_reaches_the_loop(no_thread_leak):
    def failing():
        yield torch.zeros(1, 3, 2, 2)
        raise OSError("disk went away")

    prefetcher = DataPrefetcher(failing(), device="cpu")
    got = []
    with pytest.raises(OSError, match="disk went away"):
        for batch in prefetcher:
            got.append(batch)
    assert len(got) == 1


def test_early_break_and_training_exception_leak_no_thread(no_thread_leak):
    loader = DataLoaderX(_Images(200), batch_size=2, num_workers=2)
    prefetcher = DataPrefetcher(loader, device="cpu", mean=MEAN, std=STD, depth=3)
    for _ in range(3):
        for i, _batch in enumerate(prefetcher):
            if i == 2:
                break
    with pytest.raises(ZeroDivisionError):
        for _batch in prefetcher:
            1 / 0  # noqa: B018 - the training step fails
    gc.collect()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(mean=(0.5, 0.5), std=(0.5, 0.5)), ValueError, "mean has 2 values but batch\\[0\\] has 3 channels"),
        (dict(mean=MEAN, std=(0.5,)), ValueError, "std has 1 values"),
        (dict(mean=MEAN), ValueError, "pass both mean and std"),
        (dict(mean=MEAN, std=(0.2, 0.0, 0.1)), ValueError, "std must not contain zeros"),
        (dict(mean=MEAN, std=(0.2, float("nan"), 0.1)), ValueError, "non-finite values"),
        (dict(mean=(0.5, float("inf"), 0.5), std=STD), ValueError, "mean must be finite"),
        (dict(dtype=torch.int32), TypeError, "dtype must be torch.float32"),
        (dict(depth=0), ValueError, "depth must be a positive int"),
        (dict(device="tpu"), ValueError, "unknown device 'tpu'"),
        (dict(device="cuda"), ValueError, "CUDA is not available"),
        (dict(device="meta"), ValueError, "supports 'cpu' and 'cuda'"),
    ],
)
def test_bad_arguments_raise_errors_that_name_the_fix(kwargs, error, message):
    if kwargs.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(error, match=message):
        list(DataPrefetcher(_batches("tuple", n=1), **{"device": "cpu", **kwargs}))


def test_normalizing_a_label_tensor_is_refused_with_the_fix(no_thread_leak):
    batches = [(torch.arange(4), torch.zeros(4, 3, 2, 2, dtype=torch.uint8))]
    with pytest.raises(TypeError, match=r"normalize batch\[0\], which is \(4,\).*image_key"):
        list(DataPrefetcher(batches, device="cpu", mean=MEAN, std=STD))
    # Pointing at the images fixes it.
    (out,) = list(DataPrefetcher(batches, device="cpu", mean=MEAN, std=STD, image_key=1))
    assert out[1].dtype == torch.float32 and out[0].dtype == torch.int64


def test_dict_without_an_image_key_is_refused(no_thread_leak):
    batches = [{"pixels": torch.zeros(1, 3, 2, 2, dtype=torch.uint8)}]
    with pytest.raises(ValueError, match="Pass image_key"):
        list(DataPrefetcher(batches, device="cpu", dtype=torch.float32))
    (out,) = list(DataPrefetcher(batches, device="cpu", dtype=torch.float32, image_key="pixels"))
    assert out["pixels"].dtype == torch.float32


# --- CUDA stream hand-off, through a stand-in that records the calls the real path makes. ---


class _RecordingStreams:
    """Stands in for fastpipe.prefetch._CudaStreams: same calls, logged, tensors stay on CPU."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.created = 0
        self.active = "default"

    def new_stream(self):
        self.created += 1
        return f"side{self.created}"

    def current_stream(self):
        return "default"

    @contextlib.contextmanager
    def use(self, stream):
        previous, self.active = self.active, stream
        try:
            yield
        finally:
            self.active = previous

    def record_event(self, stream):
        name = f"event{sum(1 for e in self.log if e[0] == 'event') + 1}"
        self.log.append(("event", name, stream))
        return name

    def wait_event(self, waiter, event):
        self.log.append(("wait", waiter, event))

    def record_stream(self, tensor, stream):
        self.log.append(("record", int(tensor.flatten()[0]), tensor.dtype, stream))

    def to_device(self, tensor, device, non_blocking):
        self.log.append(("copy", int(tensor.flatten()[0]), self.active, non_blocking))
        return tensor.clone()


@pytest.fixture
def recording(monkeypatch):
    streams = _RecordingStreams()
    monkeypatch.setattr(prefetch_module, "_stream_ops_for", lambda device: streams)
    return streams


def _numbered(n: int):
    """Batches whose image tensor starts with 100*k and label with k, so the log names them."""
    return [(torch.full((2, 3, 2, 2), 100.0 * k), torch.tensor([k, k])) for k in range(n)]


def test_side_stream_is_created_once_per_prefetcher_not_per_epoch(recording):
    prefetcher = DataPrefetcher(_numbered(3), device="cpu")
    for _ in range(3):
        assert len(list(prefetcher)) == 3
    assert recording.created == 1


def test_copies_run_on_the_side_stream_and_are_non_blocking(recording):
    list(DataPrefetcher(_numbered(3), device="cpu", non_blocking=True))
    copies = [entry for entry in recording.log if entry[0] == "copy"]
    assert len(copies) == 6
    assert all(stream == "side1" and non_blocking for _, _, stream, non_blocking in copies)


def test_consumer_waits_for_a_batch_before_it_is_handed_over_and_before_the_next_copy(recording):
    prefetcher = DataPrefetcher(_numbered(3), device="cpu", depth=1)
    for k, _batch in enumerate(prefetcher):
        log = recording.log
        waits = [i for i, entry in enumerate(log) if entry[0] == "wait"]
        assert len(waits) == k + 1, "one wait per handed-over batch"
        assert log[waits[-1]] == ("wait", "default", f"event{k + 1}")
        # The event waited on is recorded on the side stream right after batch k's copies.
        recorded = log.index(("event", f"event{k + 1}", "side1"))
        copied_before_event = {e[1] for e in log[:recorded] if e[0] == "copy"}
        assert {100 * k, k} <= copied_before_event
        # The next batch's copy is queued only after the wait, so the step waits for batch k only.
        copied_before_wait = {e[1] for e in log[: waits[-1]] if e[0] == "copy"}
        copied_after_wait = {e[1] for e in log[waits[-1]:] if e[0] == "copy"}
        assert 100 * (k + 1) not in copied_before_wait
        if k < 2:
            assert 100 * (k + 1) in copied_after_wait


def test_with_depth_the_step_waits_for_its_own_batch_not_the_ones_queued_behind(recording):
    prefetcher = DataPrefetcher(_numbered(4), device="cpu", depth=3)
    next(iter(prefetcher))
    log = recording.log
    wait = next(e for e in log if e[0] == "wait")
    recorded = log.index(("event", wait[2], "side1"))
    # Batches 1 and 2 were copied before the first hand-over, but after the event waited on.
    assert {e[1] for e in log[:recorded] if e[0] == "copy"} == {0}  # batch 0: images and labels
    assert {100, 200} <= {e[1] for e in log[recorded:] if e[0] == "copy"}


def test_loader_error_on_the_stream_path_arrives_after_the_batches_before_it(recording):
    def failing():
        yield from _numbered(2)
        raise OSError("disk went away")

    got = []
    with pytest.raises(OSError, match="disk went away"):
        for _images, labels in DataPrefetcher(failing(), device="cpu", depth=2):
            got.append(int(labels[0]))
    assert got == [0, 1]


def test_every_handed_over_tensor_is_recorded_on_the_consumer_stream(recording):
    prefetcher = DataPrefetcher(_numbered(2), device="cpu", mean=MEAN, std=STD)
    for _images, labels in prefetcher:
        records = [e for e in recording.log if e[0] == "record"]
        # The normalized images (float32, made on the side stream) and the labels.
        assert ("record", int(labels[0]), torch.int64, "default") in records
        assert any(dtype == torch.float32 and stream == "default" for _, _, dtype, stream in records)
    assert len([e for e in recording.log if e[0] == "record"]) == 4


def test_depth_keeps_that_many_batches_copied_ahead(recording):
    prefetcher = DataPrefetcher(_numbered(5), device="cpu", depth=3)
    iterator = iter(prefetcher)
    next(iterator)
    copied = {e[1] for e in recording.log if e[0] == "copy"}
    assert copied == {0, 100, 200, 300, 1, 2, 3}


def test_real_cuda_streams_pin_host_tensors_before_an_async_copy(monkeypatch):
    """The real _CudaStreams.to_device pins unpinned host memory; checked by recording pin_memory."""
    pinned = []
    real_to = torch.Tensor.to

    def fake_pin(self):
        pinned.append(self.shape)
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: False)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, device, non_blocking: real_to(self, "cpu"))
    streams = prefetch_module._CudaStreams(torch.device("cuda"))
    streams.to_device(torch.zeros(2, 3), torch.device("cuda"), True)
    assert pinned == [torch.Size([2, 3])]


def test_channels_last_alone_changes_only_the_memory_format(no_thread_leak):
    batch = torch.randint(0, 256, (2, 3, 4, 5), dtype=torch.uint8)
    ((out, _labels),) = list(DataPrefetcher([(batch, torch.zeros(2))], device="cpu",
                                            channels_last=True))
    assert out.dtype == torch.uint8
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, batch)
