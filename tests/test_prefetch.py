"""DataPrefetcher: real CPU runs, and the CUDA stream hand-off through a recording stand-in."""

from __future__ import annotations

import gc
import threading
from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastpipe._streams as streams_module
import fastpipe.prefetch as prefetch_module
from fastpipe import DataLoaderX, DataPrefetcher
from tests.helpers.cuda import RecordingStreams

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
            out.append(
                {"inputs": [image, {"mask": label > 1}], "names": ("a", "b"), "label": label})
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


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict", "namedtuple", "nested"])
def test_same_batches_in_the_same_order_as_a_plain_loop(kind, no_thread_leak):
    batches = _batches(kind)
    prefetcher = DataPrefetcher(batches, device="cpu", prefetch_depth=2)
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
@pytest.mark.slow
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


@pytest.mark.slow
def test_early_break_and_training_exception_leak_no_thread(no_thread_leak):
    loader = DataLoaderX(_Images(200), batch_size=2, num_workers=2)
    prefetcher = DataPrefetcher(loader, device="cpu", mean=MEAN, std=STD, prefetch_depth=3)
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
        (dict(mean=(0.5, 0.5), std=(0.5, 0.5)), ValueError,
         "mean has 2 values but batch\\[0\\] has 3 channels"),
        (dict(mean=MEAN, std=(0.5,)), ValueError, "std has 1 values"),
        (dict(mean=MEAN), ValueError, "pass both mean and std"),
        (dict(mean=MEAN, std=(0.2, 0.0, 0.1)), ValueError, "std must not contain zeros"),
        (dict(mean=MEAN, std=(0.2, float("nan"), 0.1)), ValueError, "non-finite values"),
        (dict(mean=(0.5, float("inf"), 0.5), std=STD), ValueError, "mean must be finite"),
        (dict(dtype=torch.int32), TypeError, "dtype must be torch.float32"),
        (dict(prefetch_depth=0), ValueError, "prefetch_depth must be a positive int"),
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


@pytest.fixture
def recording(monkeypatch):
    streams = RecordingStreams()
    monkeypatch.setattr(prefetch_module, "streams_for", lambda device: streams)
    return streams


def _cuda_unindexed(monkeypatch):
    """Makes DataPrefetcher(device="cuda") construct here, as on a machine with CUDA."""
    monkeypatch.setattr(
        prefetch_module, "resolve_device", lambda device, where: torch.device("cuda")
    )


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
    prefetcher = DataPrefetcher(_numbered(3), device="cpu", prefetch_depth=1)
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
    prefetcher = DataPrefetcher(_numbered(4), device="cpu", prefetch_depth=3)
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
        for _images, labels in DataPrefetcher(failing(), device="cpu", prefetch_depth=2):
            got.append(int(labels[0]))
    assert got == [0, 1]


def test_every_handed_over_tensor_is_recorded_on_the_consumer_stream(recording):
    prefetcher = DataPrefetcher(_numbered(2), device="cpu", mean=MEAN, std=STD)
    for _images, labels in prefetcher:
        records = [e for e in recording.log if e[0] == "record"]
        # The normalized images (float32, made on the side stream) and the labels.
        assert ("record", int(labels[0]), torch.int64, "default") in records
        assert any(dtype == torch.float32 and stream == "default"
                   for _, _, dtype, stream in records)
    assert len([e for e in recording.log if e[0] == "record"]) == 4


def test_host_tensors_a_batch_transform_returns_are_handed_over_without_record_stream(
        recording):
    # A mixing weight made on the host (a CPU tensor in the batch): record_stream refuses host
    # memory, so recording it crashed the hand-over ('aten::record_stream' ... 'CPU' backend).
    weights = []

    def transform(images, targets):
        weight = torch.tensor(0.25)
        weights.append(weight)
        return images * 2, (targets, weight)

    out = list(DataPrefetcher(_numbered(2), device="cpu", mean=MEAN, std=STD,
                              batch_transform=transform))
    assert [batch[1][1] for batch in out] == weights
    recorded = {id(tensor) for tensor, _ in recording.recorded}
    assert not recorded & {id(weight) for weight in weights}
    # The GPU tensors are recorded on the consumer's stream: images and labels of each batch.
    handed = [t for images, (labels, _) in out for t in (images, labels)]
    on_consumer = {id(t) for t, stream in recording.recorded if stream == "default"}
    assert all(id(t) in on_consumer for t in handed) and len(on_consumer) == 4


def test_the_real_hand_over_calls_record_stream_only_on_gpu_tensors():
    # fastpipe's own CudaStreams with streams that exist without a GPU: record_stream is
    # torch's, which raises NotImplementedError for host memory.
    class HostStreams(streams_module.CudaStreams):
        def current_stream(self, device):
            return torch.Stream("cpu")

        def wait_event(self, waiter, event):
            pass

    batch = (torch.zeros(2, 3), {"lam": torch.tensor(0.5)})
    streams_module.hand_to_current(HostStreams(), torch.device("cuda", 0), batch, None)


def test_depth_keeps_that_many_batches_copied_ahead(recording):
    prefetcher = DataPrefetcher(_numbered(5), device="cpu", prefetch_depth=3)
    iterator = iter(prefetcher)
    next(iterator)
    copied = {e[1] for e in recording.log if e[0] == "copy"}
    assert copied == {0, 100, 200, 300, 1, 2, 3}


def _fake_cuda_copies(monkeypatch):
    """Records pin_memory calls; .to() stays on the CPU. Returns the list of pinned shapes."""
    pinned = []
    real_to = torch.Tensor.to

    def fake_pin(self):
        pinned.append(tuple(self.shape))
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: False)
    monkeypatch.setattr(
        torch.Tensor, "to", lambda self, device, non_blocking=False: real_to(self, "cpu")
    )
    return pinned


def test_real_cuda_streams_never_pin_on_the_training_thread_and_warn_once(monkeypatch):
    pinned = _fake_cuda_copies(monkeypatch)
    streams = streams_module.CudaStreams()
    with pytest.warns(RuntimeWarning, match="pin_memory=True"):
        streams.to_device(torch.zeros(2, 3), torch.device("cuda"), True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        streams.to_device(torch.zeros(2, 3), torch.device("cuda"), True)  # warned once only
        # A blocking copy neither pins nor warns: it waits for the copy anyway.
        streams_module.CudaStreams().to_device(torch.zeros(2, 3), torch.device("cuda"), False)
    assert pinned == []


def test_channels_last_alone_changes_only_the_memory_format(no_thread_leak):
    batch = torch.randint(0, 256, (2, 3, 4, 5), dtype=torch.uint8)
    ((out, _labels),) = list(DataPrefetcher([(batch, torch.zeros(2))], device="cpu",
                                            channels_last=True))
    assert out.dtype == torch.uint8
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, batch)


# --- Tensors already on the GPU (DALI, a loader that moved them): the producer's stream. ---


def _guarded_inputs_problems(log: list[tuple], input_values: set[int]) -> list[str]:
    """What is wrong with how the side stream treats inputs already on the device.

    The side stream must wait for an event recorded on the producer's (current) stream before
    its first use of the inputs, and record each input on the side stream.
    """
    problems = []
    waits = [i for i, e in enumerate(log) if e[0] == "wait" and e[1].startswith("side")]
    producer_events = {e[1] for e in log if e[0] == "event" and e[2] == "default"}
    if not any(log[i][2] in producer_events for i in waits):
        problems.append("the side stream never waits for the producer's stream")
    recorded = {e[1] for e in log if e[0] == "record" and e[3].startswith("side")}
    if not input_values <= recorded:
        problems.append(f"inputs {sorted(input_values - recorded)} not recorded on the side stream")
    first_side_event = next(i for i, e in enumerate(log) if e[0] == "event" and e[2] != "default")
    if waits and waits[0] > first_side_event:
        problems.append("the side stream waits only after it has used the inputs")
    return problems


def _gpu_batches(recording, n: int = 2):
    batches = [(torch.full((2, 3, 2, 2), 10 + k, dtype=torch.uint8),
                torch.tensor([k, k])) for k in range(n)]
    for images, labels in batches:
        recording.on_gpu.update({id(images), id(labels)})
    return batches


def test_batches_already_on_the_gpu_are_waited_for_and_recorded_on_the_side_stream(recording):
    batches = _gpu_batches(recording)
    out = list(DataPrefetcher(batches, device="cpu", mean=MEAN, std=STD))
    assert len(out) == 2
    assert _guarded_inputs_problems(recording.log, {10, 11, 0, 1}) == []


@pytest.mark.parametrize("removed", ["wait_event", "record_stream"])
def test_the_gpu_input_check_fails_without_the_wait_or_the_record(recording, monkeypatch, removed):
    # The check above can fail: with the side stream's wait or record_stream taken out, it does.
    real = getattr(recording, removed)

    def without_side(*args):
        stream = args[0] if removed == "wait_event" else args[1]
        if not str(stream).startswith("side"):
            real(*args)

    monkeypatch.setattr(recording, removed, without_side)
    list(DataPrefetcher(_gpu_batches(recording), device="cpu", mean=MEAN, std=STD))
    assert _guarded_inputs_problems(recording.log, {10, 11, 0, 1}) != []


def test_host_batches_need_no_wait_for_a_producer(recording):
    list(DataPrefetcher(_numbered(2), device="cpu"))
    assert not any(e[0] == "wait" and e[1].startswith("side") for e in recording.log)


# --- The device is resolved when an epoch starts, the side stream made per device. ---


def test_a_prefetcher_built_before_set_device_serves_the_device_current_at_iteration(
    recording, monkeypatch
):
    _cuda_unindexed(monkeypatch)
    targets = []
    real_to_device = recording.to_device

    def to_device(tensor, device, non_blocking):
        targets.append(device)
        return real_to_device(tensor, device, non_blocking)

    monkeypatch.setattr(recording, "to_device", to_device)
    prefetcher = DataPrefetcher(_numbered(2), device="cuda")  # rank 1, before set_device(1)
    assert recording.created == 0, "no stream may be made before the device is known"
    recording.current_device = 1  # torch.cuda.set_device(local_rank)
    for _ in range(2):
        list(prefetcher)
    assert set(targets) == {torch.device("cuda", 1)}
    assert [e for e in recording.log if e[0] == "stream"] == [
        ("stream", "side1", torch.device("cuda", 1))
    ]


# --- batch_transform ---


def test_batch_transform_runs_once_per_batch_after_normalization(no_thread_leak):
    calls = []

    def transform(images, targets):
        calls.append((images.dtype, float(images.min()), targets.tolist()))
        return images * 0 + 7, targets + 100

    batches = [(torch.full((2, 3, 2, 2), 255, dtype=torch.uint8), torch.tensor([k, k]))
               for k in range(3)]
    prefetcher = DataPrefetcher(batches, device="cpu", mean=(0.5,) * 3, std=(0.25,) * 3,
                                batch_transform=transform)
    out = list(prefetcher)
    # Normalized before: (1 - 0.5) / 0.25 = 2.
    assert calls == [(torch.float32, 2.0, [k, k]) for k in range(3)]
    assert all(torch.equal(images, torch.full((2, 3, 2, 2), 7.0)) for images, _ in out)
    assert [labels.tolist() for _, labels in out] == [[100, 100], [101, 101], [102, 102]]


def test_batch_transform_finds_dict_targets(no_thread_leak):
    batch = {"image": torch.zeros(2, 3, 2, 2), "label": torch.tensor([1, 2]), "meta": "x"}
    (out,) = list(DataPrefetcher([batch], device="cpu",
                                 batch_transform=lambda x, y: (x + 1, y * 2)))
    assert torch.equal(out["image"], torch.ones(2, 3, 2, 2))
    assert out["label"].tolist() == [2, 4] and out["meta"] == "x"


def test_batch_transform_runs_on_the_side_stream_before_the_batch_is_ready(recording):
    seen = []

    def transform(images, targets):
        seen.append((recording.active, len([e for e in recording.log if e[0] == "event"])))
        return images, targets

    list(DataPrefetcher(_numbered(2), device="cpu", mean=MEAN, std=STD,
                        batch_transform=transform))
    # On the side stream, and before the event that the training step waits on is recorded.
    assert seen == [("side1", 0), ("side1", 1)]


def test_batch_transform_needs_targets_and_must_return_a_pair(no_thread_leak):
    with pytest.raises(TypeError, match="batch_transform needs \\(images, targets\\)"):
        list(DataPrefetcher([torch.zeros(1, 3, 2, 2)], device="cpu",
                            batch_transform=lambda x, y: (x, y)))
    with pytest.raises(TypeError, match="must return a pair"):
        list(DataPrefetcher(_batches("tuple", n=1), device="cpu",
                            batch_transform=lambda x, y: x))
    with pytest.raises(TypeError, match="batch_transform must be a callable"):
        DataPrefetcher([], device="cpu", batch_transform=3)


# --- Double normalization ---


def test_already_normalized_float_batches_warn_about_double_normalization(no_thread_leak):
    normalized = torch.randn(4, 3, 5, 5) * 1.2  # what transforms.Normalize gives
    with pytest.warns(UserWarning, match="normalized twice.*drop.*Normalize"):
        list(DataPrefetcher([(normalized, torch.zeros(4))], device="cpu", mean=MEAN, std=STD))


def test_unit_range_float_batches_do_not_warn_and_only_the_first_batch_is_checked(
    monkeypatch, no_thread_leak
):
    import warnings

    calls = []
    real = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda x: calls.append(1) or real(x))
    batches = [(torch.rand(2, 3, 4, 4), torch.zeros(2)) for _ in range(4)]
    prefetcher = DataPrefetcher(batches, device="cpu", mean=MEAN, std=STD)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            assert len(list(prefetcher)) == 4
    assert len(calls) == 2, "one check per epoch, on its first batch"


# --- Reads like a loader ---


def test_exposes_the_loader_attributes_that_training_code_reads(no_thread_leak):
    dataset = _Images(20)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=0, seed=1)
    loader = DataLoaderX(dataset, batch_size=4, sampler=sampler, drop_last=True)
    prefetcher = DataPrefetcher(loader, device="cpu")
    assert prefetcher.dataset is dataset  # torchvision's evaluate() reads loader.dataset
    assert prefetcher.sampler is sampler
    assert prefetcher.batch_sampler is loader.batch_sampler
    assert (prefetcher.batch_size, prefetcher.drop_last, prefetcher.num_workers) == (4, True, 0)
    assert len(prefetcher) == 2
    orders = []
    for epoch in range(2):
        prefetcher.set_epoch(epoch)
        orders.append(torch.cat([labels for _, labels in prefetcher]).tolist())
    assert orders[0] != orders[1], "set_epoch must reach the DistributedSampler"


def test_a_missing_loader_attribute_names_the_wrapped_loader():
    prefetcher = DataPrefetcher([torch.zeros(1)], device="cpu")
    with pytest.raises(AttributeError, match="wraps \\(list\\) has none"):
        prefetcher.dataset  # noqa: B018
    assert getattr(prefetcher, "sampler", None) is None  # how Lightning looks
    prefetcher.set_epoch(3)  # nothing to pass it to: no error


# --- Pickling ---


@pytest.mark.slow
@pytest.mark.parametrize("state", ["fresh", "iterated", "mid_epoch", "closed"])
def test_pickles_and_deep_copies_in_every_state(state, no_thread_leak):
    import copy
    import pickle

    loader = DataLoaderX(_Images(12), batch_size=4)
    prefetcher = DataPrefetcher(loader, device="cpu", mean=MEAN, std=STD)
    if state == "iterated":
        list(prefetcher)
    elif state in ("mid_epoch", "closed"):
        prefetcher.next()
        if state == "closed":
            prefetcher.close()
    for clone in (pickle.loads(pickle.dumps(prefetcher)), copy.deepcopy(prefetcher)):
        assert [labels.tolist() for _, labels in clone] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                            [8, 9, 10, 11]]
    prefetcher.close()


# --- Distributed runs: an unsharded loader is refused ---


@pytest.fixture
def two_processes(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)


def test_an_unsharded_shuffled_loader_is_refused_in_a_distributed_run(two_processes):
    prefetcher = DataPrefetcher(DataLoader(_Images(), batch_size=4, shuffle=True), device="cpu")
    with pytest.raises(RuntimeError, match="every process would iterate the whole dataset.*"
                                           "DistributedSampler"):
        iter(prefetcher)


def test_an_unsharded_sequential_loader_warns_in_a_distributed_run(two_processes):
    prefetcher = DataPrefetcher(DataLoader(_Images(), batch_size=4), device="cpu")
    with pytest.warns(UserWarning, match="every process would iterate the whole dataset"):
        assert len(list(prefetcher)) == 5


def test_a_sharded_loader_is_accepted_in_a_distributed_run(two_processes, no_thread_leak):
    dataset = _Images()
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1)
    prefetcher = DataPrefetcher(DataLoaderX(dataset, batch_size=4, sampler=sampler), device="cpu")
    assert sum(len(labels) for _, labels in prefetcher) == 10


@pytest.fixture
def process_starts(monkeypatch):
    """The names of the threads that start a process (a DataLoader worker's fork), in order."""
    import multiprocessing.process

    started: list[str] = []
    start = multiprocessing.process.BaseProcess.start

    def recording_start(self):
        started.append(threading.current_thread().name)
        return start(self)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", recording_start)
    return started


@pytest.mark.slow
@pytest.mark.parametrize("wrapped", ["DataLoader", "DataLoaderX"])
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_processes_start_in_the_thread_that_iterates_not_the_background_one(
    wrapped, persistent, process_starts, no_thread_leak
):
    # A fork from the background thread inherits the locks other threads hold at that moment
    # (logging's, the import lock): with Ctrl-C at the wrong time the child or the fork hangs.
    cls = DataLoaderX if wrapped == "DataLoaderX" else DataLoader
    loader = cls(_Images(), batch_size=6, num_workers=2, persistent_workers=persistent)
    prefetcher = DataPrefetcher(loader, device="cpu")
    for _ in range(2):
        assert len(list(prefetcher)) == 4
    prefetcher.close()
    del prefetcher, loader
    gc.collect()
    assert process_starts and set(process_starts) == {threading.current_thread().name}


def test_mean_and_std_are_copied_once_per_device_non_blocking_from_pinned_memory(
    recording, monkeypatch
):
    # A copy per batch would be two more transfers each step, blocking ones from pageable memory.
    _cuda_unindexed(monkeypatch)
    pinned = []

    def recording_pinned(values):
        pinned.append(values.tolist())
        return values

    monkeypatch.setattr(prefetch_module, "_pinned", recording_pinned)
    batches = [(torch.full((2, 3, 2, 2), 7, dtype=torch.uint8), torch.tensor([100 + k] * 2))
               for k in range(4)]
    prefetcher = DataPrefetcher(batches, device="cuda", mean=(3.0,) * 3, std=(2.0,) * 3)
    for device in (0, 0, 1, 1):  # two epochs on cuda:0, then two on cuda:1
        recording.current_device = device
        for images, _ in prefetcher:
            assert torch.allclose(images, torch.full_like(images, (7 / 255 - 3.0) / 2.0))
    stats = [entry for entry in recording.log if entry[0] == "copy" and entry[1] in (3, 2)]
    side_streams = [entry[1] for entry in recording.log if entry[0] == "stream"]
    assert [(value, stream) for _, value, stream, _ in stats] == [
        (3, side_streams[0]), (2, side_streams[0]), (3, side_streams[1]), (2, side_streams[1])]
    assert all(non_blocking for *_, non_blocking in stats)
    assert pinned == [[3.0] * 3, [2.0] * 3] * 2
    # The images of every batch were copied, each once.
    assert sum(1 for entry in recording.log if entry[0] == "copy" and entry[1] == 7) == 16
