"""How the ops move their host-drawn parameters to the GPU (``_functional._to_device``).

No GPU here: torch.Tensor.pin_memory / .to and CUDA-graph capture are replaced by recorders, so
these tests check which calls the real code makes.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from fastpipe.ops import _functional

CUDA = torch.device("cuda")


class _Stream:
    """Stands in for torch.cuda.Stream: records its synchronizations."""

    def __init__(self, device=None):
        self.device = device
        self.synchronized = 0

    def synchronize(self):
        self.synchronized += 1


@pytest.fixture
def streams(monkeypatch) -> list:
    """torch.cuda.Stream and torch.cuda.stream stand-ins; the list's last item is the current
    stream (a string for the step's own)."""
    current: list = ["the step's stream"]

    @contextlib.contextmanager
    def stream(s):
        current.append(s)
        yield
        current.pop()

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    return current


@pytest.fixture
def copies(monkeypatch, streams):
    """Records pin_memory and .to calls; tensors stay where they are."""
    log: list[tuple] = []

    def fake_pin(self):
        log.append(("pin", self.device.type))
        return self

    def fake_to(self, device, non_blocking=False):
        log.append(("to", self.device.type, str(device), non_blocking))
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return log


def test_host_parameters_are_pinned_and_copied_without_blocking(copies):
    _functional._to_device(torch.zeros(3), CUDA)
    assert copies == [("pin", "cpu"), ("to", "cpu", "cuda", True)]


def test_a_parameter_already_on_a_device_is_not_pinned(copies):
    # A CUDA mean/std passed to normalize (or to DataPrefetcher): pinning it raised "cannot pin
    # ... only dense CPU tensors can be pinned" on every call. A meta tensor stands in for it.
    on_device = torch.zeros(3, device="meta")
    _functional._to_device(on_device, CUDA)
    assert copies == [("to", "meta", "cuda", False)]


def test_cuda_graph_capture_is_refused_with_the_reason(copies, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA graph cannot capture.*outside torch.cuda.graph"):
        _functional._to_device(torch.zeros(3), CUDA)
    assert copies == []  # nothing was queued for the graph


def test_every_random_op_draws_through_to_device(monkeypatch):
    # The capture check lives in _to_device; each op's parameters must pass through it.
    seen = []
    real = _functional._to_device

    def spy(t, device):
        seen.append(tuple(t.shape))
        return real(t, device)

    monkeypatch.setattr(_functional, "_to_device", spy)
    from fastpipe import ops

    images = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    targets = torch.tensor([0, 1, 2, 1])
    for call in (
        lambda: ops.cutout(images),
        lambda: ops.random_erasing(images, p=1.0),
        lambda: ops.mixup(images, targets, 0.4, 3),
        lambda: ops.cutmix(images, targets, 1.0, 3),
    ):
        seen.clear()
        call()
        assert seen, "the op's random parameters did not go through _to_device"


@pytest.fixture
def capturing(monkeypatch):
    """torch.cuda.is_current_stream_capturing answers True: a CUDA graph is being captured."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)


def _random_calls():
    from fastpipe import ops

    images = torch.rand(4, 3, 8, 8)
    targets = torch.tensor([0, 1, 2, 1])
    no_mix = ops.Mixup(mixup_alpha=1.0, num_classes=3, prob=0.0)  # draws "do not mix"
    off = ops.Mixup(mixup_alpha=1.0, num_classes=3)
    off.mixup_enabled = False
    eraser = ops.RandomErasing(probability=0.0)
    return {
        "cutout": lambda: ops.cutout(images),
        "random_erasing": lambda: ops.random_erasing(images, p=0.0),
        "mixup": lambda: ops.mixup(images, targets, 0.4, 3),
        "cutmix": lambda: ops.cutmix(images, targets, 1.0, 3),
        "Mixup prob=0": lambda: no_mix(images, targets),
        "Mixup mixup_enabled=False": lambda: off(images, targets),
        "Mixup.transform": lambda: off.transform(
            images, targets, ops.Mixup(mixup_alpha=1.0, num_classes=3, prob=0.0).make_params(
                torch.rand(4, 3, 8, 8))),
        "RandomErasing p=0": lambda: eraser(images),
        "RandomErasing.transform": lambda: eraser.transform(
            images, {"boxes": torch.zeros(4, 1, 4, dtype=torch.int64),
                     "fill": torch.zeros(3), "seeds": None}),
    }


@pytest.mark.parametrize("name", list(_random_calls()))
def test_every_random_op_and_batch_transform_refuses_cuda_graph_capture(name, monkeypatch):
    call = _random_calls()[name]
    call()  # not capturing: runs
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    # Even a draw that mixes or erases nothing (which copies nothing to the GPU) is refused: a
    # captured graph would replay it, unmixed, with the capture-time targets.
    with pytest.raises(RuntimeError, match="CUDA graph cannot capture"):
        call()


def test_normalize_with_device_statistics_may_be_captured(copies, monkeypatch):
    # normalize draws nothing: with mean/std already on the device it is capturable; the stand-in
    # meta tensors play CUDA statistics (nothing is pinned or copied from the host for them).
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    _functional._to_device(torch.zeros(3, device="meta"), CUDA)
    with pytest.raises(RuntimeError, match="CUDA graph cannot capture"):
        _functional._to_device(torch.zeros(3), CUDA)


def test_compiled_ops_copy_host_parameters_without_a_blocking_to_and_without_graph_breaks():
    """Under torch.compile the host-drawn parameters reach the GPU through the opaque
    fastpipe::host_to_device (a pinned, non_blocking copy at run time): one graph, no graph
    break, and no traced .to(cuda) (a pageable copy that synchronizes on every call). The graphs
    are recorded by a backend that never runs them (there is no GPU here)."""
    from torch._dynamo.utils import counters

    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: (torch.zeros(3, device="meta"),)

    def draw_and_copy(x):
        return _functional._to_device(torch.rand(x.shape[0], dtype=torch.float64), CUDA)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(draw_and_copy, backend=recording_backend, fullgraph=True,
                             dynamic=True)
    compiled(torch.zeros(5))
    assert len(graphs) == 1 and not counters["graph_break"]
    code = graphs[0].code
    assert "fastpipe.host_to_device" in code
    assert ".to(" not in code and "_to_copy" not in code and "device(type='cuda')" in code
    torch._dynamo.reset()


def test_host_to_device_pins_and_copies_without_blocking(copies, monkeypatch):
    recording_to = torch.Tensor.to

    def to_a_new_tensor(self, device, non_blocking=False):  # as a real copy: no alias
        recording_to(self, device, non_blocking)
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "to", to_a_new_tensor)
    torch.ops.fastpipe.host_to_device(torch.zeros(3), CUDA)
    assert copies == [("pin", "cpu"), ("to", "cpu", "cuda", True)]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA graph cannot capture"):
        torch.ops.fastpipe.host_to_device(torch.zeros(3), CUDA)


def test_normalize_statistics_are_copied_once_per_gpu_and_values(copies, monkeypatch):
    """A training loop passes the same host mean/std at every call: they reach each GPU once
    (a blocking copy, so every stream may read them), then come from the cache."""
    monkeypatch.setattr(_functional, "_STATISTICS", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    mean = torch.tensor([0.5, 0.4, 0.3])
    first = _functional._statistics_on(mean, CUDA)
    assert copies == [("to", "cpu", "cuda:0", False)]
    for _ in range(3):
        assert _functional._statistics_on(mean.clone(), torch.device("cuda", 0)) is first
    assert len(copies) == 1
    _functional._statistics_on(mean, torch.device("cuda", 1))  # another GPU: its own copy
    _functional._statistics_on(torch.tensor([0.5, 0.4, 0.2]), CUDA)  # other values
    assert copies[1:] == [("to", "cpu", "cuda:1", False), ("to", "cpu", "cuda:0", False)]
    # Capturing: host values are refused, even cached ones (a graph must not depend on them).
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA graph cannot capture"):
        _functional._statistics_on(mean, CUDA)


def test_normalize_statistics_past_the_cache_size_are_copied_per_call(copies, monkeypatch):
    monkeypatch.setattr(_functional, "_STATISTICS", {})
    monkeypatch.setattr(_functional, "_MAX_STATISTICS", 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    _functional._statistics_on(torch.tensor([0.1]), CUDA)
    copies.clear()
    _functional._statistics_on(torch.tensor([0.2]), CUDA)
    _functional._statistics_on(torch.tensor([0.2]), CUDA)
    assert copies == [("pin", "cpu"), ("to", "cpu", "cuda", True)] * 2  # nothing evicted
    assert list(_functional._STATISTICS) == [(0, (0.10000000149011612,))]


def test_normalize_statistics_are_copied_on_a_stream_of_their_own(streams, monkeypatch):
    """On an H100, the first normalize with host statistics, called on a stream with 200 ms of
    queued work, blocked until that stream drained: the one blocking copy was queued behind it."""
    monkeypatch.setattr(_functional, "_STATISTICS", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    log = []

    def to(self, device, non_blocking=False):
        synchronized = getattr(streams[-1], "synchronized", 0)
        log.append((streams[-1], str(device), non_blocking, synchronized))
        return self

    monkeypatch.setattr(torch.Tensor, "to", to)
    _functional._statistics_on(torch.tensor([0.5, 0.4, 0.3]), CUDA)
    [(copied_on, device, non_blocking, synchronized_before)] = log
    assert isinstance(copied_on, _Stream) and copied_on.device == 0 and device == "cuda:0"
    assert not non_blocking and synchronized_before == 0 and copied_on.synchronized == 1
