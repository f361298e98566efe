"""Helpers of the cuda lane (tests/cuda/): the check for a GPU part a test needs, known GPU work,
and a checksum per batch; and the recording stand-in for DataPrefetcher's CUDA calls, with which
the CPU lane tests the stream path.

Only the tests marked ``cuda`` call the GPU parts; importing this module needs no GPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

REQUIRE_CUDA = "FASTPIPE_REQUIRE_CUDA"


def require_cuda_part(available: bool, what: str) -> None:
    """Skips (or fails with FASTPIPE_REQUIRE_CUDA=1) a cuda-lane test whose GPU part is missing:
    the CUDA kernels of fastpipe._C, DALI, a second GPU, ..."""
    if available:
        return
    if os.environ.get(REQUIRE_CUDA) == "1":
        pytest.fail(f"{what} ({REQUIRE_CUDA}=1 requires it)", pytrace=False)
    pytest.skip(what)


@functools.cache
def _cycles_per_second() -> float:
    """The GPU clock as torch.cuda._sleep sees it, measured once with CUDA events."""
    torch.cuda._sleep(1_000_000)  # warm-up: the first launch pays for loading the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000.0)


def gpu_sleep(seconds: float) -> None:
    """Queues ``seconds`` of busy work on the current stream; returns at once."""
    torch.cuda._sleep(max(1, int(seconds * _cycles_per_second())))


def checksum(t: torch.Tensor) -> torch.Tensor:
    """A 0-d float64 GPU tensor summing ``t`` with a position weight, queued on the current stream
    (no synchronization): a batch swapped for another, or a part of it stale, changes it."""
    flat = t.reshape(-1).double()
    weights = torch.arange(1, flat.numel() + 1, device=t.device, dtype=torch.float64) % 251 + 1
    return (flat * weights).sum()


def random_batches(count: int, shape: tuple[int, ...], seed: int, pin: bool) -> list[torch.Tensor]:
    """``count`` uint8 CPU batches of random content (page-locked if ``pin``)."""
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, 256, shape, dtype=torch.uint8, generator=g) for _ in range(count)]
    return [b.pin_memory() for b in batches] if pin else batches


class RecordingStreams:
    """Stands in for fastpipe._streams.CudaStreams: same calls, logged, tensors stay on CPU.

    Patched in as ``fastpipe.prefetch.streams_for`` by the CPU lane's tests of the stream path
    (tests/test_prefetch.py, tests/data/sampling/test_resume.py); ``log`` lists the calls in order.

    Which tensors stand for GPU tensors (``on_device``) follows CUDA's rules: those a test marks
    in ``on_gpu`` (batches already on the GPU), the copies ``to_device`` makes, and what torch
    computes from either on a stream (``use``); a tensor made from host values alone (a weight a
    batch_transform returns) stays a host tensor.
    """

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.created = 0
        self._local = threading.local()  # the current stream is a thread's own, as in torch
        self.current_device = 0  # what torch.cuda.set_device would change
        self.on_gpu: set[int] = set()  # ids of tensors that stand for tensors on the GPU
        self._device_tensors: list[torch.Tensor] = []  # kept alive, so their ids stay theirs
        self.copied: list[torch.Tensor] = []  # every tensor to_device copied, in order
        self.recorded: list[tuple[torch.Tensor, object]] = []  # (tensor, stream) of record_stream

    @property
    def active(self):
        return getattr(self._local, "stream", "default")

    @active.setter
    def active(self, stream) -> None:
        self._local.stream = stream

    def mark_on_gpu(self, tensor: torch.Tensor) -> None:
        self.on_gpu.add(id(tensor))
        self._device_tensors.append(tensor)

    def concrete_device(self, device):
        return torch.device("cuda", self.current_device) if device.index is None else device

    def new_stream(self, device):
        self.created += 1
        name = f"side{self.created}"
        self.log.append(("stream", name, device))
        return name

    def current_stream(self, device):
        return self.active  # as torch.cuda.current_stream: the stream of the enclosing use()

    def on_device(self, tensor):
        return id(tensor) in self.on_gpu

    @contextlib.contextmanager
    def use(self, stream):
        previous, self.active = self.active, stream
        try:
            with _DeviceResults(self):
                yield
        finally:
            self.active = previous

    def record_event(self, stream):
        name = f"event{sum(1 for e in self.log if e[0] == 'event') + 1}"
        self.log.append(("event", name, stream))
        return name

    def wait_event(self, waiter, event):
        self.log.append(("wait", waiter, event))

    # Events pass at once, unless a test keeps them pending: with ``pending`` a set, the events in
    # it have not run until synchronize() (or the test) takes them out.
    pending: set | None = None

    def query(self, event):
        self.log.append(("query", event))
        return self.pending is None or event not in self.pending

    def synchronize(self, event):
        self.log.append(("synchronize", event))
        if self.pending is not None:
            self.pending.discard(event)

    def record_stream(self, tensor, stream):
        self.recorded.append((tensor, stream))
        self.log.append(("record", _first(tensor), tensor.dtype, stream))

    def to_device(self, tensor, device, non_blocking):
        if id(tensor) in self.on_gpu:
            return tensor  # .to() leaves a tensor already on the device as it is
        self.copied.append(tensor)
        self.log.append(("copy", _first(tensor), self.active, non_blocking))
        copy = tensor.clone()
        self.mark_on_gpu(copy)
        return copy


class _DeviceResults(TorchFunctionMode):
    """Marks what torch computes from tensors standing for GPU tensors as GPU tensors too."""

    def __init__(self, streams: RecordingStreams) -> None:
        super().__init__()
        self.streams = streams

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        on_gpu = self.streams.on_gpu
        inputs = tree_leaves((args, kwargs))
        if any(isinstance(t, torch.Tensor) and id(t) in on_gpu for t in inputs):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and id(t) not in on_gpu:
                    self.streams.mark_on_gpu(t)
        return out


def _first(tensor: torch.Tensor) -> int | None:
    """The first value of ``tensor`` (what the log names it by), None when it is empty."""
    return int(tensor.flatten()[0]) if tensor.numel() else None
