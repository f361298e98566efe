"""The profiler's CUDA events: across streams (a recording stand-in, on the CPU) and on a real GPU.

When the loop changes the current stream between marks, a step's events complete apart: its end
can be done while its begin, queued behind other work, is not, and ``elapsed_time`` raises on an
event that has not completed. The profiler must query every event before it reads a time. The
stand-in below behaves like that (per-stream queues, ``seconds_between`` raising on an
incomplete event); the real one is checked in the cuda lane with ``torch.cuda._sleep`` as the
known GPU work and known host waits.
"""

from __future__ import annotations

import time

import pytest
import torch

import fastpipe.profiling.profiler as profile_module
from fastpipe.profiling import profile


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StreamEvent:
    def __init__(self, stream: str, gpu_time: float) -> None:
        self.stream, self.gpu_time = stream, gpu_time


class MultiStreamGpu:
    """The _CudaEvents interface over several streams, each running its queued work in order;
    like CUDA, reading the time between two events raises unless both have completed."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.busy_until: dict[str, float] = {}
        self.current = "default"
        self.calls: list[str] = []

    def launch(self, seconds: float, stream: str | None = None) -> None:
        stream = stream or self.current
        self.busy_until[stream] = max(self.busy_until.get(stream, 0.0), self.clock.now) + seconds

    def mark(self) -> StreamEvent:
        self.calls.append("mark")
        ready = max(self.busy_until.get(self.current, 0.0), self.clock.now)
        return StreamEvent(self.current, ready)

    def done(self, event: StreamEvent) -> bool:
        self.calls.append("query")
        return event.gpu_time <= self.clock.now

    def wait(self, event: StreamEvent) -> None:
        self.calls.append("wait")
        self.clock.now = max(self.clock.now, event.gpu_time)

    def seconds_between(self, start: StreamEvent, end: StreamEvent) -> float:
        for event in (start, end):
            if event.gpu_time > self.clock.now:
                raise RuntimeError("CUDA error: device not ready (event not completed)")
        return end.gpu_time - start.gpu_time

    def synchronize(self) -> None:
        self.calls.append("synchronize")
        self.clock.now = max([self.clock.now, *self.busy_until.values()])


@pytest.fixture
def gpu(monkeypatch):
    clock = Clock()
    device = MultiStreamGpu(clock)
    monkeypatch.setattr(profile_module, "_now", clock)
    monkeypatch.setattr(
        profile_module, "resolve_device", lambda device, where: torch.device("cuda")
    )
    monkeypatch.setattr(profile_module, "_device_clock_for", lambda _device: device)
    return device


def _batches(clock: Clock, waits: list[float]):
    for i, wait in enumerate(waits):
        clock.now += wait
        yield torch.full((4, 3), i)


def test_events_on_a_busy_other_stream_are_waited_for_not_read_early(gpu):
    # Each step ends on the idle default stream, but the next step begins while a side stream
    # with a second of queued work is current: that step's begin completes long after its end.
    prof = profile(warmup=0, report=False)
    for i, _batch in enumerate(prof.wrap(_batches(gpu.clock, [0.01] * 6))):
        gpu.launch(0.005)
        gpu.clock.now += 0.001
        gpu.current = "side" if i % 2 == 0 else "default"
        if gpu.current == "side":
            gpu.launch(1.0)
    summary = prof.summary()  # the old code read the side-stream events before they completed
    assert len(summary.steps) == 6
    assert all(s.device_step is not None for s in summary.steps)


def test_events_read_while_the_loop_runs_only_once_every_one_completed(gpu):
    # The same loop read back without blocking: a step whose end is done but whose begin (on
    # the busy side stream) is not must stay pending, not raise.
    prof = profile(warmup=0, report=False)
    for i, _batch in enumerate(prof.wrap(_batches(gpu.clock, [0.01] * 8))):
        gpu.current = "side" if i == 2 else "default"
        if i == 2:
            gpu.launch(5.0)
        gpu.launch(0.002)
        gpu.clock.now += 0.001
    assert "wait" not in gpu.calls and "synchronize" not in gpu.calls  # nothing blocked
    assert prof._pending, "the step begun on the busy stream was read before it completed"
    summary = prof.summary()
    assert len(summary.steps) == 8 and all(s.device_step is not None for s in summary.steps)


def test_one_stream_still_costs_one_wait_at_the_summary(gpu):
    prof = profile(warmup=0, report=False)
    for _batch in prof.wrap(_batches(gpu.clock, [0.01] * 10)):
        gpu.launch(0.03)
        gpu.clock.now += 0.001
    prof.summary()
    assert gpu.calls.count("wait") == 1 and "synchronize" not in gpu.calls


# --- cuda lane ---------------------------------------------------------------------------------

def _host_batches(count: int, host_wait: float):
    for i in range(count):
        time.sleep(host_wait)
        yield torch.full((8, 3), i)


def _loop(prof, count, host_wait, gpu_work, streams=None):
    from tests.helpers.cuda import gpu_sleep

    for i, _batch in enumerate(prof.wrap(_host_batches(count, host_wait))):
        if streams is not None:
            torch.cuda.set_stream(streams[i % len(streams)])
        gpu_sleep(gpu_work)


@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_cuda_events_give_the_device_wait_share_without_synchronizing(monkeypatch):
    from tests.helpers.cuda import gpu_sleep

    gpu_sleep(0.001)  # calibrate outside the loop
    torch.cuda.synchronize()
    synchronized = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: synchronized.append(1))
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: synchronized.append(1))
    monkeypatch.setattr(torch.cuda.Event, "wait", lambda self, s=None: synchronized.append(1))

    # 30 ms of GPU work per step, 10 ms to get each batch: the GPU never idles after the first.
    busy = profile(warmup=1, report=False)
    _loop(busy, 25, host_wait=0.010, gpu_work=0.030)
    assert synchronized == [], "the profiler synchronized inside the loop"
    monkeypatch.undo()
    summary = busy.summary()
    assert summary.clock == "cuda events"
    assert summary.wait_share == pytest.approx(0.0, abs=0.05)
    assert summary.step_p50 == pytest.approx(0.030, rel=0.15)

    # 5 ms of GPU work, 20 ms to get each batch: the GPU idles about 15 of every 20 ms.
    torch.cuda.synchronize()
    starved = profile(warmup=1, report=False)
    _loop(starved, 25, host_wait=0.020, gpu_work=0.005)
    summary = starved.summary()
    assert summary.wait_share == pytest.approx(0.75, abs=0.1)


@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_cuda_events_when_the_loop_switches_the_current_stream():
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    previous = torch.cuda.current_stream()
    try:
        prof = profile(warmup=1, report=False)
        _loop(prof, 12, host_wait=0.005, gpu_work=0.020, streams=[first, second])
        summary = prof.summary()  # raised "device not ready" before every event was queried
    finally:
        torch.cuda.set_stream(previous)
    assert summary.clock == "cuda events" and len(summary.steps) == 12
    assert all(s.device_step is not None and s.device_step >= 0 for s in summary.steps)
