"""How the ops move their host-drawn parameters to the GPU (``_functional._to_device``).

No GPU here: torch.Tensor.pin_memory / .to and CUDA-graph capture are replaced by recorders, so
these tests check which calls the real code makes.
"""

from __future__ import annotations

import pytest
import torch

from fastpipe.ops import _functional

CUDA = torch.device("cuda")


@pytest.fixture
def copies(monkeypatch):
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
