"""fastpipe.profile: the wait share it reports, its bookkeeping, device timing, outputs, advice."""

from __future__ import annotations

import contextlib
import csv
import gc
import io
import json
import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastpipe.profiling.profiler as profile_module
from fastpipe import DataLoaderX, DataPrefetcher
from fastpipe.profiling import profile

CORES = len(os.sched_getaffinity(0))


def sleepy_batches(count: int, load_seconds: float, batch: int = 8, log: list | None = None):
    """Batches that each take ``load_seconds`` to arrive; ``log`` gets the time each really took
    (on a loaded machine a sleep overshoots), measured apart from the profiler: the whole making
    of the batch, whose tensors are part of the wait the profiler sees."""
    for i in range(count):
        started = time.perf_counter()
        time.sleep(load_seconds)
        made = torch.full((batch, 3), i), torch.arange(batch)
        if log is not None:
            log.append(time.perf_counter() - started)
        yield made


def sleep_logged(seconds: float, log: list) -> None:
    started = time.perf_counter()
    time.sleep(seconds)
    log.append(time.perf_counter() - started)


@contextlib.contextmanager
def collections_held():
    """No automatic garbage collection in the block: in a process that has run the whole suite,
    one takes longer than the wait these tests measure, in whichever code allocated last."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def true_share(loads: list, works: list, warmup: int = 1) -> float:
    load, work = sum(loads[warmup:]), sum(works[warmup:])
    return load / (load + work)


# --- the wait share of a loop whose wait is known ---------------------------------------------

@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("load", "work", "verdict"),
    [(0.060, 0.040, "input-bound"), (0.015, 0.105, "partly input-bound"),
     (0.0, 0.050, "compute-bound")],
)
@pytest.mark.slow
def test_wait_share_of_sleep_based_loop_is_within_a_few_percent(load, work, verdict):
    loads, works = [], []
    prof = profile(sleepy_batches(16, load, log=loads), report=False)
    # A collection of the whole suite's heap (0.2-0.6 s) would land on either side unlogged.
    with collections_held():
        for _images, _labels in prof:
            sleep_logged(work, works)
    summary = prof.summary()
    # Against the sleeps as they really ran (they overshoot on a busy machine), and against the
    # nominal share with room for that overshoot.
    assert summary.wait_share == pytest.approx(true_share(loads, works), abs=0.02)
    assert summary.wait_share == pytest.approx(load / (load + work), abs=0.05)
    assert summary.verdict.startswith(verdict)
    assert summary.steps_counted == 15  # the first step is warm-up
    assert summary.samples_per_second == pytest.approx(8 * summary.steps_per_second)
    assert summary.wait_p50 == pytest.approx(sorted(loads[1:])[7], abs=0.003)
    assert summary.wait_p50 <= summary.wait_p95


@pytest.mark.timeout(30)
@pytest.mark.slow
def test_context_manager_forms_measure_the_same_wait():
    loads, works = {}, {}
    for form in ("wrapped", "fetched", "stopped"):
        loads[form], works[form] = [], []
    with profile(report=False) as wrapped:
        for _batch in wrapped.wrap(sleepy_batches(12, 0.03, log=loads["wrapped"])):
            sleep_logged(0.01, works["wrapped"])
    source = sleepy_batches(12, 0.03, log=loads["fetched"])
    with profile(report=False) as fetched:
        while (_batch := fetched.fetch(next, source, None)) is not None:
            sleep_logged(0.01, works["fetched"])
    source = sleepy_batches(12, 0.03, log=loads["stopped"])
    with profile(report=False) as stopped, pytest.raises(StopIteration):
        while True:
            stopped.fetch(next, source)
            sleep_logged(0.01, works["stopped"])
    for form, prof in (("wrapped", wrapped), ("fetched", fetched), ("stopped", stopped)):
        summary = prof.summary()
        assert summary.steps_counted == 11
        assert summary.wait_share == pytest.approx(true_share(loads[form], works[form]), abs=0.02)
        assert summary.wait_share == pytest.approx(0.75, abs=0.08)
        assert summary.samples_per_second == pytest.approx(8 * summary.steps_per_second)


@pytest.mark.timeout(30)
def test_wait_left_by_a_background_loader_is_what_its_thread_could_not_hide(no_thread_leak):
    # Loading takes 30 ms and the step 20 ms: with DataLoaderX loading during the step, each step
    # still waits the remaining 10 ms, a third of the 30 ms step.
    class Sleepy(Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, index):
            time.sleep(0.03)
            return index

    prof = profile(DataLoaderX(Sleepy(), batch_size=1, num_workers=0, prefetch_depth=2),
                   report=False)
    for _batch in prof:
        time.sleep(0.02)
    assert prof.summary().wait_share == pytest.approx(1 / 3, abs=0.06)


# --- exact bookkeeping, on a clock the test drives ----------------------------------------------

class DrivenClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def batches_on(clock: DrivenClock, waits: list[float]):
    for wait in waits:
        clock.advance(wait)
        yield torch.zeros(4, 2)


def test_steps_run_from_one_ask_to_the_next(monkeypatch):
    clock = DrivenClock()
    monkeypatch.setattr(profile_module, "_now", clock)
    prof = profile(batches_on(clock, [1.0, 0.2, 0.3, 0.1]), warmup=1, report=False)
    for _batch in prof:
        clock.advance(0.5)
    clock.advance(7.0)  # after the loop: belongs to no step
    steps = prof.summary().steps
    assert [(s.wait, s.step, s.warmup) for s in steps] == [
        (1.0, 1.5, True), (pytest.approx(0.2), pytest.approx(0.7), False),
        (pytest.approx(0.3), pytest.approx(0.8), False),
        (pytest.approx(0.1), pytest.approx(0.6), False),
    ]
    assert [s.start for s in steps] == pytest.approx([0.0, 1.5, 2.2, 3.0])
    summary = prof.summary()
    assert summary.seconds == pytest.approx(2.1)
    assert summary.wait_share == pytest.approx(0.6 / 2.1)
    assert summary.warmup_seconds == pytest.approx(1.5)
    assert summary.samples_per_second == pytest.approx(12 / 2.1)


def test_break_ends_the_last_step_and_later_loops_continue_the_timeline(monkeypatch):
    clock = DrivenClock()
    monkeypatch.setattr(profile_module, "_now", clock)
    prof = profile(warmup=0, report=False)
    for i, _batch in enumerate(prof.wrap(batches_on(clock, [0.1] * 10))):
        clock.advance(0.4)
        if i == 2:
            break
    clock.advance(5.0)
    for _batch in prof.wrap(batches_on(clock, [0.3, 0.3])):
        clock.advance(0.2)
    steps = prof.summary().steps
    assert len(steps) == 5
    assert [s.step for s in steps] == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.5])
    assert [s.wait for s in steps] == pytest.approx([0.1, 0.1, 0.1, 0.3, 0.3])
    assert prof.summary().seconds == pytest.approx(2.5)  # the 5 s between the loops is not a step


# --- CUDA: events, no synchronization in the loop -------------------------------------------

class Event:
    def __init__(self, gpu_time: float) -> None:
        self.gpu_time = gpu_time


class RecordingGpu:
    """Stands in for the CUDA event calls: a device that runs queued work in order, on the driven
    clock, and records every call so the test can see which ones block."""

    def __init__(self, clock: DrivenClock) -> None:
        self.clock = clock
        self.busy_until = clock.now
        self.calls: list[str] = []

    def launch(self, seconds: float) -> None:
        self.busy_until = max(self.busy_until, self.clock.now) + seconds

    # the _CudaEvents interface
    def mark(self) -> Event:
        self.calls.append("mark")
        return Event(max(self.busy_until, self.clock.now))

    def done(self, event: Event) -> bool:
        self.calls.append("query")
        return event.gpu_time <= self.clock.now

    def wait(self, event: Event) -> None:
        self.calls.append("wait")
        self.clock.now = max(self.clock.now, event.gpu_time)

    def seconds_between(self, start: Event, end: Event) -> float:
        return end.gpu_time - start.gpu_time

    def synchronize(self) -> None:
        self.calls.append("synchronize")
        self.clock.now = max(self.clock.now, self.busy_until)


@pytest.fixture
def fake_cuda(monkeypatch):
    clock = DrivenClock()
    gpu = RecordingGpu(clock)
    monkeypatch.setattr(profile_module, "_now", clock)
    monkeypatch.setattr(
        profile_module, "resolve_device", lambda device, where: torch.device("cuda")
    )
    monkeypatch.setattr(profile_module, "_device_clock_for", lambda device: gpu)
    return clock, gpu


def run_gpu_loop(prof, clock, gpu, steps, host_wait, gpu_work, launch_cost=0.001):
    for _batch in prof.wrap(batches_on(clock, [host_wait] * steps)):
        gpu.launch(gpu_work)  # the step queues its kernels and returns
        clock.advance(launch_cost)


def test_cuda_profile_adds_no_synchronization_inside_the_loop(fake_cuda):
    clock, gpu = fake_cuda
    prof = profile(warmup=0, report=False)
    run_gpu_loop(prof, clock, gpu, steps=20, host_wait=0.010, gpu_work=0.030)
    assert "wait" not in gpu.calls and "synchronize" not in gpu.calls
    assert gpu.calls.count("mark") == 2 * 20 + 1  # ask and arrival per step, and the last ask
    prof.summary()
    assert gpu.calls.count("wait") == 1 and "synchronize" not in gpu.calls


def test_cuda_wait_share_is_the_device_idle_time_not_the_host_wait(fake_cuda):
    clock, gpu = fake_cuda
    # The GPU has 30 ms of work per step and the host only waits 10 ms for data: the host runs
    # ahead, the device never idles, although the host spends most of its time waiting.
    busy = profile(warmup=1, report=False)  # the first batch finds the GPU idle: not counted
    run_gpu_loop(busy, clock, gpu, steps=20, host_wait=0.010, gpu_work=0.030)
    summary = busy.summary()
    assert summary.clock == "cuda events"
    host_share = sum(s.wait for s in summary.steps) / sum(s.step for s in summary.steps)
    assert host_share > 0.85
    assert summary.wait_share == pytest.approx(0.0, abs=1e-9)
    assert summary.step_p50 == pytest.approx(0.030)
    assert summary.verdict.startswith("compute-bound")

    # 5 ms of GPU work per step and 20 ms to get the data: a step takes 21 ms on the host (with
    # 1 ms to launch), and the GPU, busy for the first 5 ms of it, idles for the other 16.
    clock.now = gpu.busy_until  # the backlog of the first loop has run
    starved = profile(warmup=1, report=False)
    run_gpu_loop(starved, clock, gpu, steps=20, host_wait=0.020, gpu_work=0.005)
    summary = starved.summary()
    assert summary.wait_share == pytest.approx(16 / 21)
    assert summary.step_p50 == pytest.approx(0.021)
    assert [s.device_wait for s in summary.steps[1:]] == pytest.approx([0.016] * 19)
    # The first batch found the GPU idle: all of its 20 ms wait is device idle time.
    assert summary.steps[0].device_wait == pytest.approx(0.020)


def test_cuda_events_are_read_back_while_the_loop_runs_without_blocking(fake_cuda):
    clock, gpu = fake_cuda
    prof = profile(warmup=0, report=False)
    run_gpu_loop(prof, clock, gpu, steps=50, host_wait=0.020, gpu_work=0.005)
    # The device keeps up here, so finished steps' events were read and dropped as the loop ran.
    assert "query" in gpu.calls and len(prof._pending) <= 1


def test_cuda_sync_true_synchronizes_at_every_step_boundary(fake_cuda):
    clock, gpu = fake_cuda
    prof = profile(warmup=0, sync=True, report=False)
    run_gpu_loop(prof, clock, gpu, steps=10, host_wait=0.010, gpu_work=0.030)
    assert gpu.calls.count("synchronize") == 2 * 10 + 1
    assert "mark" not in gpu.calls  # host clock only, made exact by the synchronization
    summary = prof.summary()
    assert summary.clock == "host, synchronized"
    # Synchronizing exposes the GPU work in the host clock: 30 of every 40 ms is work.
    assert summary.wait_share == pytest.approx(10 / 41, abs=0.01)


# --- outputs -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_csv_json_and_plot_hold_the_timeline(tmp_path, monkeypatch):
    clock = DrivenClock()
    monkeypatch.setattr(profile_module, "_now", clock)
    prof = profile(batches_on(clock, [0.5, 0.1, 0.2]), report=False)
    for _batch in prof:
        clock.advance(0.3)
    summary = prof.summary()

    rows = list(csv.DictReader(io.StringIO(summary.to_csv(tmp_path / "steps.csv"))))
    assert (tmp_path / "steps.csv").read_text() == summary.to_csv()
    assert [float(r["wait"]) for r in rows] == pytest.approx([0.5, 0.1, 0.2])
    assert [float(r["compute"]) for r in rows] == pytest.approx([0.3, 0.3, 0.3])
    assert [r["warmup"] for r in rows] == ["1", "0", "0"]
    assert rows[0]["device_wait"] == ""

    data = json.loads(summary.to_json(tmp_path / "profile.json"))
    assert json.loads((tmp_path / "profile.json").read_text()) == data
    assert data["wait_share"] == pytest.approx(0.3 / 0.9)
    assert data["verdict"] == summary.verdict and data["advice"] == summary.advice
    assert len(data["steps"]) == 3 and data["steps"][1]["samples"] == 4

    png = summary.plot(tmp_path / "profile.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_summary_is_printed_when_the_loop_ends():
    out = io.StringIO()
    for _batch in profile(sleepy_batches(4, 0.0), report=out):
        pass
    text = out.getvalue()
    assert text.startswith("fastpipe.profile: 3 steps") and "verdict:" in text
    silent = io.StringIO()
    for _batch in profile(sleepy_batches(4, 0.0), report=False):
        pass
    assert silent.getvalue() == ""


# --- advice --------------------------------------------------------------------------------------

class Sleepy(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.zeros(3, 4, 4, dtype=torch.uint8), index


@pytest.mark.timeout(30)
def test_advice_names_the_settings_the_loader_lacks(no_thread_leak):
    prof = profile(DataLoader(Sleepy(), batch_size=2), report=False)
    for _batch in prof:
        pass
    summary = prof.summary()
    assert summary.verdict.startswith("input-bound")
    assert summary.loader.kind == "DataLoader" and summary.loader.num_workers == 0
    advice = "\n".join(summary.advice)
    assert "num_workers=0" in advice and "fastpipe tune" in advice
    assert "fastpipe.DataLoaderX" in advice and "fastpipe pack" in advice
    assert ("DataPrefetcher" in advice) == torch.cuda.is_available()


@pytest.mark.timeout(60)
def test_advice_does_not_repeat_what_the_loader_already_does(no_thread_leak):
    loader = DataLoaderX(Sleepy(), batch_size=2, num_workers=CORES, persistent_workers=True)
    prefetcher = DataPrefetcher(loader)
    prof = profile(prefetcher, report=False)
    for _batch in prof:
        pass
    prefetcher.close()
    loader.close()
    summary = prof.summary()
    assert summary.loader.kind == "DataLoaderX" and summary.loader.prefetcher
    advice = "\n".join(summary.advice)
    assert "num_workers" not in advice.split("If the workers")[0]
    assert "Use fastpipe.DataLoaderX" not in advice
    assert "Wrap the loader in fastpipe.DataPrefetcher" not in advice
    assert "persistent_workers=True" not in advice
    del loader, prefetcher


def test_compute_bound_advice_points_at_the_step(monkeypatch):
    clock = DrivenClock()
    monkeypatch.setattr(profile_module, "_now", clock)
    prof = profile(batches_on(clock, [0.001] * 5), report=False)
    for _batch in prof:
        clock.advance(0.1)
    summary = prof.summary()
    assert summary.verdict == "compute-bound: only 1% of each step waits for data"
    assert len(summary.advice) == 1 and "torch.profiler" in summary.advice[0]


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="iterable of batches"):
        profile(5)
    with pytest.raises(ValueError, match="warmup"):
        profile(warmup=-1)
    with pytest.raises(ValueError, match="batch_size"):
        profile(batch_size=0)
    with pytest.raises(TypeError, match="wrap"):
        iter(profile())


@pytest.mark.timeout(60)
def test_advice_tells_epoch_restarts_apart_from_a_slow_loader(no_thread_leak):
    class Quick(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            time.sleep(0.002)
            return torch.zeros(2), index

    advice = {}
    for persistent in (False, True):
        loader = DataLoader(Quick(), batch_size=2, num_workers=1, persistent_workers=persistent)
        prof = profile(loader, report=False)
        for _epoch in range(4):
            for _batch in prof:
                time.sleep(0.005)
        advice[persistent] = "\n".join(prof.summary().advice)
        del loader, prof
    # Starting a worker process takes tens of milliseconds; a batch here takes 4.
    assert "Each epoch begins with a" in advice[False]
    assert "persistent_workers=True" in advice[False]
    assert "persistent_workers" not in advice[True]


def test_wrap_leaves_an_iterator_it_was_given_open_after_break():
    def numbers():
        yield from range(5)

    source = numbers()
    with profile_module.profile(device="cpu", report=False) as prof:
        for batch in prof.wrap(source):
            if batch == 1:
                break
    # Like a plain for loop, the profiler does not close an iterator it did not make.
    assert list(source) == [2, 3, 4]


class _NamedLikeDALI:
    """An iterable that only shares DALILoader's class name: it must not be taken for one."""

    def __iter__(self):
        yield torch.zeros(2, 3)


_NamedLikeDALI.__name__ = "DALILoader"


class _DescribesItself:
    """A loader from outside fastpipe that speaks the describe protocol."""

    def __len__(self) -> int:
        return 7

    def __iter__(self):
        yield torch.zeros(4, 3)

    def _fastpipe_describe(self) -> dict:
        return {"kind": "DALILoader", "batch_size": 4, "not_a_field": 1}


def test_loaders_are_known_by_what_they_describe_not_by_their_class_name():
    LoaderInfo = profile_module.LoaderInfo
    assert LoaderInfo.of(_NamedLikeDALI()).kind == "iterable"
    info = LoaderInfo.of(_DescribesItself())
    assert (info.kind, info.batch_size, info.batches_per_epoch, info.prefetcher) == (
        "DALILoader", 4, 7, False)
    # A DataPrefetcher describes itself as a prefetcher over the loader it wraps.
    wrapped = LoaderInfo.of(DataPrefetcher(_DescribesItself(), device="cpu"))
    assert (wrapped.kind, wrapped.batch_size, wrapped.prefetcher) == ("DALILoader", 4, True)
    loader = DataLoaderX(list(range(6)), batch_size=3, num_workers=0)
    info = LoaderInfo.of(DataPrefetcher(loader, device="cpu"))
    assert (info.kind, info.num_workers, info.batch_size, info.prefetcher) == (
        "DataLoaderX", 0, 3, True)
    assert LoaderInfo.of(torch.utils.data.DataLoader(list(range(6)))).kind == "DataLoader"


# --- advice that fits the loader it profiles ----------------------------------------------------

def summary_of(info, waits, per_epoch=None, step=0.01):
    """A summary (and its advice) for ``info`` over steps with these waits; the first is the
    warm-up. Epoch starts fall every ``per_epoch`` steps."""
    info.batches_per_epoch = per_epoch
    steps, start = [], 0.0
    for index, wait in enumerate(waits):
        steps.append(profile_module.Step(index, start, wait, wait + step, 8, index == 0))
        start += wait + step
    counted = steps[1:]
    counted_waits = [s.wait for s in counted]
    seconds = sum(s.step for s in counted)
    summary = profile_module.ProfileSummary(
        steps_counted=len(counted), seconds=seconds, steps_per_second=len(counted) / seconds,
        samples_per_second=8 * len(counted) / seconds, wait_share=sum(counted_waits) / seconds,
        wait_p50=profile_module._percentile(counted_waits, 50),
        wait_p95=profile_module._percentile(counted_waits, 95),
        step_p50=0.0, step_p95=0.0, warmup_seconds=steps[0].step, clock="host", verdict="",
        advice=[], loader=info, steps=steps)
    summary.verdict, summary.advice = profile_module.diagnose(summary, cuda=False)
    return summary


def image_loader_waits():
    # 24 steps, epochs of 8: the epoch starts wait 128 ms, the others 2 ms but 50 ms at times.
    return [0.2] + [0.128 if i % 8 == 0 else (0.05 if i % 5 == 0 else 0.002)
                    for i in range(1, 24)]


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_advice_on_an_image_loader_names_only_what_image_loader_takes(sample_root):
    from fastpipe.factory import image_loader

    loader = image_loader(sample_root, batch_size=8, train=True, size=32, num_workers=2,
                          device="cpu")
    info = profile_module.LoaderInfo.of(loader)
    assert (info.kind, info.prefetcher, info.worker_method, info.num_workers) == (
        "DataLoaderX", True, "thread", 2)
    assert info.fast_path and not info.pack and info.prefetch_depth is not None
    advice = "\n".join(summary_of(info, image_loader_waits(), per_epoch=8).advice)
    assert "worker process" not in advice and "persistent_workers" not in advice
    assert "prefetch_factor" not in advice
    assert f"prefetch_depth (now {info.prefetch_depth}) (DataLoaderX or image_loader)" in advice
    assert "the fast CPU path (" not in advice and "it already reads the fast CPU path" in advice
    assert "a pack file (`fastpipe pack`" in advice and "DALI" in advice


def test_advice_on_a_pack_does_not_recommend_a_pack(tmp_path):
    class H5Dataset(Dataset):  # where it is defined decides, not the name
        def __len__(self):
            return 4

    H5Dataset.__module__ = "fastpipe.data.datasets.readers"
    info = profile_module.LoaderInfo.of(DataLoader(H5Dataset(), batch_size=2))
    assert info.fast_path and info.pack
    advice = "\n".join(summary_of(info, [0.2] + [0.03] * 10).advice)
    assert "fastpipe pack" not in advice and "the fast CPU path (" not in advice
    assert "(it already reads the fast CPU path and a pack file): DALI" in advice
    H5Dataset.__module__ = __name__
    assert not any(profile_module.LoaderInfo.of(DataLoader(H5Dataset())).__dict__[k]
                   for k in ("fast_path", "pack"))


def test_advice_quotes_the_summary_p95_or_says_what_it_left_out():
    info = profile_module.LoaderInfo(kind="DataLoader", num_workers=2, persistent_workers=True,
                                     prefetch_factor=2, worker_method="process")
    summary = summary_of(info, image_loader_waits(), per_epoch=8)
    uneven = next(a for a in summary.advice if "uneven" in a)
    # The summary's p95 counts the epoch starts; the advice's leaves them out and says so.
    assert f"the summary's p95 of {summary.wait_p95 * 1e3:.1f} ms counts them" in uneven
    assert "Apart from the 2 epoch starts" in uneven
    assert "prefetch_factor (now 2), or fastpipe.DataLoaderX(prefetch_depth=...)" in uneven
    # Without epoch starts to leave out, the advice's p95 is the summary's.
    flat = summary_of(info, [0.2] + [0.05 if i % 5 == 0 else 0.002 for i in range(1, 24)])
    uneven = next(a for a in flat.advice if "uneven" in a)
    assert uneven.startswith(f"Waits are uneven (p95 {flat.wait_p95 * 1e3:.1f} ms")


def test_thread_workers_are_not_told_to_persist():
    info = profile_module.LoaderInfo(kind="DataLoaderX", num_workers=2, worker_method="thread",
                                     persistent_workers=False, prefetch_factor=2,
                                     prefetch_depth=2)
    advice = "\n".join(summary_of(info, image_loader_waits(), per_epoch=8).advice)
    assert "persistent_workers" not in advice and "worker process" not in advice
    process = profile_module.LoaderInfo(kind="DataLoaderX", num_workers=2, prefetch_depth=2,
                                        worker_method="process", persistent_workers=False,
                                        prefetch_factor=2)
    advice = "\n".join(summary_of(process, image_loader_waits(), per_epoch=8).advice)
    assert "(starting 2 worker processes)" in advice and "set persistent_workers=True" in advice
    assert "prefetch_depth (now 2), or prefetch_factor (now 2) for each worker process" in advice
