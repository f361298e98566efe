"""fastpipe.profile: how much of each training step waits for data.

A step runs from the moment the loop asks for a batch to the moment it asks for the next one. The
part before the batch arrives is the data wait; the rest is the step's own work (the model). On
CUDA the same boundaries are also marked with CUDA events on the current stream, so the wait is
measured as the device sees it: the time the GPU sat idle between finishing the previous step and
receiving this batch. Events are read back without blocking while the loop runs and waited for
once, when the summary is made, so profiling adds no synchronization to the loop (unless
``sync=True`` asks for it).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO

import torch

from fastpipe import _validate as check
from fastpipe._compat import tree_leaves
from fastpipe._hardware import resolve_device, usable_cores

# The host clock, a module attribute so tests can drive it.
_now = time.perf_counter

# Wait share above which a loop is called input-bound, and below which it is not at all.
INPUT_BOUND = 0.25
NOT_INPUT_BOUND = 0.05


@dataclass(frozen=True)
class Step:
    """One step of the profiled loop; times in seconds.

    ``step`` runs from asking for this batch to asking for the next one (or the end of the loop);
    ``wait`` is its first part, until the batch arrived. ``device_wait`` and ``device_step`` are
    the same spans as the CUDA device saw them (None without CUDA events). Warm-up steps (the
    first ones, which include starting the workers) are kept in the timeline but left out of
    the summary's statistics.
    """

    index: int
    start: float
    wait: float
    step: float
    samples: int | None
    warmup: bool
    device_wait: float | None = None
    device_step: float | None = None

    @property
    def compute(self) -> float:
        return self.step - self.wait


class _CudaEvents:
    """The CUDA calls of device timing, in one place so tests can record them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def wait(self, event: Any) -> None:
        event.synchronize()

    def seconds_between(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


def _device_clock_for(device: torch.device) -> _CudaEvents | None:
    """The device timing for ``device``, or None where the host clock is the only one (CPU)."""
    return _CudaEvents(device) if device.type == "cuda" else None


def batch_size_of(batch: Any) -> int | None:
    """The number of samples in ``batch``: the first dimension of its first tensor, if any."""
    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
        if hasattr(leaf, "shape") and len(getattr(leaf, "shape", ())) > 0:  # numpy arrays
            return int(leaf.shape[0])
    return None


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (as numpy's default), without needing numpy arrays."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class LoaderInfo:
    """What profile could learn about the loader, for advice. Unknown fields are None."""

    kind: str = "iterable"  # DataLoader, DataLoaderX, DALILoader or iterable
    prefetcher: bool = False
    num_workers: int | None = None
    batch_size: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    dataset: str | None = None
    batches_per_epoch: int | None = None
    # "process" (DataLoader's worker processes) or "thread" (DataLoaderX(worker_method="thread"),
    # what image_loader builds for a few workers): restarts and the knobs that fit differ.
    worker_method: str | None = None
    prefetch_depth: int | None = None  # DataLoaderX's background queue
    fast_path: bool = False  # the dataset is fastpipe's (fastpipe.data): the fast CPU path
    pack: bool = False  # ... and reads a pack file (H5Dataset, LMDBDataset)

    @classmethod
    def of(cls, loader: Any) -> LoaderInfo:
        """Reads a torch DataLoader's settings; fastpipe's loaders describe themselves through
        ``_fastpipe_describe()`` (a dict of these fields, and ``"wraps"``: the loader a wrapper
        such as DataPrefetcher feeds from), so no class is recognised by its name."""
        from torch.utils.data import DataLoader

        described = describe_loader(loader)
        wrapped = described.pop("wraps", None)
        if wrapped is not None:
            info = cls.of(wrapped)
        else:
            info = cls()
            if isinstance(loader, DataLoader):
                info.kind = "DataLoader"
                info.num_workers = loader.num_workers
                info.batch_size = loader.batch_size
                info.pin_memory = loader.pin_memory
                info.persistent_workers = loader.persistent_workers
                info.prefetch_factor = loader.prefetch_factor
                info.worker_method = "process" if loader.num_workers else None
                info.dataset = type(loader.dataset).__name__
                info.fast_path, info.pack = _fastpipe_dataset(loader.dataset)
            try:
                info.batches_per_epoch = len(loader) or None
            except TypeError:  # no len(): an iterable dataset or a generator
                pass
        known = {f.name for f in fields(cls)}
        for name, value in described.items():
            if name in known:
                setattr(info, name, value)
        if not info.num_workers:
            info.worker_method = None
        return info


def _fastpipe_dataset(dataset: Any) -> tuple[bool, bool]:
    """(the dataset is fastpipe's fast CPU path, it reads a pack), told by where its class is
    defined: fastpipe.data (ImageFolder, H5Dataset, LMDBDataset share the fast decode)."""
    module = type(dataset).__module__ or ""
    fast = module == "fastpipe.data" or module.startswith("fastpipe.data.")
    return fast, fast and type(dataset).__name__ in ("H5Dataset", "LMDBDataset")


def describe_loader(loader: Any) -> dict[str, Any]:
    """What ``loader`` says about itself through ``_fastpipe_describe()``; empty when it has no
    such method (looked up on the class, so a mock's invented attributes do not answer)."""
    describe = getattr(type(loader), "_fastpipe_describe", None)
    return dict(describe(loader)) if callable(describe) else {}


@dataclass
class ProfileSummary:
    """The result of a profile: rates, the data-wait share, a verdict and what to try next.

    ``wait_share`` is the fraction of the loop's time spent waiting for data (0-1);
    ``wait_p50``/``wait_p95`` and ``step_p50``/``step_p95`` are in seconds. ``clock`` says whether
    the numbers come from CUDA events (the device's view) or the host clock. ``steps`` is the
    whole timeline, warm-up included.
    """

    steps_counted: int
    seconds: float
    steps_per_second: float
    samples_per_second: float | None
    wait_share: float
    wait_p50: float
    wait_p95: float
    step_p50: float
    step_p95: float
    warmup_seconds: float
    clock: str
    verdict: str
    advice: list[str]
    loader: LoaderInfo
    steps: list[Step] = field(repr=False)

    def __str__(self) -> str:
        if self.steps_counted == 0:  # no rate, share or percentile to print, only why
            return "\n".join([f"fastpipe.profile: nothing measured: {self.verdict}",
                              *[f"  - {line}" for line in self.advice]])
        rate = f"{self.steps_per_second:.2f} steps/s"
        if self.samples_per_second is not None:
            rate += f", {self.samples_per_second:.1f} samples/s"
        lines = [
            f"fastpipe.profile: {self.steps_counted} step{'s' if self.steps_counted != 1 else ''} "
            f"in {self.seconds:.2f} s ({rate}; "
            f"clock: {self.clock})",
            f"  data wait: {self.wait_share:.0%} of the loop; per step p50 "
            f"{self.wait_p50 * 1e3:.1f} ms, p95 {self.wait_p95 * 1e3:.1f} ms; step p50 "
            f"{self.step_p50 * 1e3:.1f} ms, p95 {self.step_p95 * 1e3:.1f} ms",
            f"  verdict: {self.verdict}",
        ]
        lines += [f"  - {line}" for line in self.advice]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON-able values; ``steps`` is the per-step timeline."""
        summary = {k: v for k, v in asdict(self).items() if k != "steps"}
        summary["steps"] = [{**asdict(s), "compute": s.compute} for s in self.steps]
        return _finite(summary)

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The summary and timeline as JSON; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def to_csv(self, path: str | os.PathLike | None = None) -> str:
        """The per-step timeline as CSV (seconds); also written to ``path`` when given."""
        columns = ["index", "start", "wait", "compute", "step", "samples", "warmup",
                   "device_wait", "device_step"]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for s in self.steps:
            row = [s.index, s.start, s.wait, s.compute, s.step, s.samples, int(s.warmup),
                   s.device_wait, s.device_step]
            writer.writerow(["" if v is None else (f"{v:.6f}" if isinstance(v, float) else v)
                             for v in row])
        text = out.getvalue()
        if path is not None:
            Path(path).write_text(text)
        return text

    def plot(self, path: str | os.PathLike) -> Path:
        """Draws the timeline (wait and compute per step) and the wait histogram as a PNG.

        Needs matplotlib (``pip install 'fastpipe[plot]'``).
        """
        from fastpipe.profiling.plots import plot_profile

        return plot_profile(self, path)


def _finite(value: Any) -> Any:
    """JSON has no NaN: turn them into None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class Profiler:
    """Times a training loop's data wait. Made by :func:`profile`; see there."""

    def __init__(
        self,
        loader: Iterable[Any] | None = None,
        *,
        batch_size: int | None = None,
        warmup: int = 1,
        device: str | torch.device | None = None,
        sync: bool = False,
        report: bool | TextIO = False,
    ) -> None:
        if loader is not None and not hasattr(loader, "__iter__"):
            raise TypeError(f"profile() wraps an iterable of batches, got {type(loader).__name__}")
        warmup = check.non_negative_int("warmup", warmup)  # steps left out of the summary
        if batch_size is not None:
            batch_size = check.positive_int("batch_size", batch_size)
        self.loader = loader
        self.batch_size = batch_size
        self.warmup = warmup
        self.device = resolve_device(device, where="fastpipe.profile")
        self.sync = sync
        self.report = report
        self.loader_info = LoaderInfo.of(loader) if loader is not None else LoaderInfo()
        self._device = None if sync else _device_clock_for(self.device)
        self._sync = _device_clock_for(self.device) if sync else None
        self._origin: float | None = None
        self._steps: list[Step] = []
        # The open step: host start, host time the batch arrived (None while waiting), samples,
        # and the device marks at the start and at the arrival.
        self._open: dict[str, Any] | None = None
        # Finished steps whose device events are not read yet: (index, begin, ready, end).
        self._pending: deque[tuple[int, Any, Any, Any]] = deque()
        self._device_times: dict[int, tuple[float, float]] = {}

    # --- use as an iterable ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self.loader is None:
            raise TypeError("this profile() has no loader to iterate; use prof.wrap(loader)")
        return self.wrap(self.loader)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def wrap(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yields the batches of ``iterable``, timing how long each one took to arrive."""
        if self.loader is None:
            self.loader_info = LoaderInfo.of(iterable)
        iterator = iter(iterable)
        return self._timed(iterator, owned=iterator is not iterable)

    def _timed(self, iterator: Iterator[Any], owned: bool) -> Iterator[Any]:
        try:
            while True:
                self._begin_wait()
                try:
                    batch = next(iterator)
                except StopIteration:
                    self._finish()
                    return
                self._batch_arrived(batch)
                yield batch
        finally:
            # An iterator made here is ours to stop (a DataLoaderX thread, say); one passed in is
            # the caller's, like a for loop leaves it open.
            close = getattr(iterator, "close", None) if owned else None
            if callable(close):
                close()
            self._finish()
            if self.loader is not None:
                self._print_report()

    # --- use as a context manager ---------------------------------------------------------------
    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._finish()
        self._print_report()

    def fetch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Calls ``function(*args, **kwargs)`` to get a batch, timing it as the data wait.

        For loops that do not iterate, for example::

            with fastpipe.profile() as prof:
                while (batch := prof.fetch(prefetcher.next)) is not None:
                    train_step(batch)

        Each call begins a step, which lasts until the next call (or the end of the ``with``
        block). A None result (the end of an apex-style prefetcher) or StopIteration (from
        ``prof.fetch(next, iterator)``) is the end of the data, not a step.
        """
        self._begin_wait()
        try:
            batch = function(*args, **kwargs)
        except BaseException:
            self._finish()  # the ask that failed ends no step of its own
            raise
        if batch is None:
            self._finish()
            return None
        self._batch_arrived(batch)
        return batch

    # --- bookkeeping ----------------------------------------------------------------------------
    def _clock(self) -> float:
        if self._sync is not None:
            self._sync.synchronize()
        now = _now()
        if self._origin is None:
            self._origin = now
        return now - self._origin

    def _begin_wait(self) -> None:
        now = self._clock()
        mark = self._device.mark() if self._device is not None else None
        self._close_step(now, mark)
        self._open = {"start": now, "ready": None, "samples": None, "begin": mark, "arrived": None}
        self._read_device_events(block=False)

    def _batch_arrived(self, batch: Any) -> None:
        step = self._open
        assert step is not None
        step["ready"] = self._clock()
        step["arrived"] = self._device.mark() if self._device is not None else None
        samples = batch_size_of(batch)
        step["samples"] = samples if samples is not None else self.batch_size

    def _close_step(self, end: float, end_mark: Any) -> None:
        step, self._open = self._open, None
        if step is None or step["ready"] is None:
            return  # no step open, or the loop ended while waiting (StopIteration)
        index = len(self._steps)
        self._steps.append(Step(
            index=index, start=step["start"], wait=step["ready"] - step["start"],
            step=end - step["start"], samples=step["samples"], warmup=index < self.warmup,
        ))
        if self._device is not None:
            self._pending.append((index, step["begin"], step["arrived"], end_mark))

    def _read_device_events(self, block: bool) -> None:
        device = self._device
        if device is None or not self._pending:
            return
        if block:
            # On one stream, once the newest event is done all are; the loop below still checks
            # each one, since marks made while another stream was current complete apart.
            device.wait(self._pending[-1][3])
        while self._pending:
            index, begin, arrived, end = self._pending[0]
            # elapsed_time raises on an event that has not completed, and with the current
            # stream changed between marks, a step's end can complete before its begin: every
            # event is queried before its times are read.
            for event in (end, begin, arrived):
                if not device.done(event):
                    if not block:
                        return
                    device.wait(event)
            self._pending.popleft()
            self._device_times[index] = (
                device.seconds_between(begin, arrived), device.seconds_between(begin, end)
            )

    def _finish(self) -> None:
        """Ends the open step, if any; a later wrap() or fetch() continues the timeline."""
        step = self._open
        if step is None:
            return
        if step["ready"] is None:
            # The loop ended while asking for a batch that never came (StopIteration); that ask
            # already ended the previous step.
            self._open = None
            return
        self._close_step(self._clock(), self._device.mark() if self._device is not None else None)

    def _print_report(self) -> None:
        if not self.report:
            return
        stream = sys.stderr if self.report is True else self.report
        print(self.summary(), file=stream)

    # --- results --------------------------------------------------------------------------------
    @property
    def steps(self) -> list[Step]:
        """The timeline so far; device times are filled in by :meth:`summary`."""
        return list(self._steps)

    def summary(self) -> ProfileSummary:
        """The statistics of the steps so far (after warm-up), with a verdict and advice.

        With CUDA events this waits for the device to reach the last step's end, once.
        """
        if self._device is not None:
            self._read_device_events(block=True)
            self._steps = [
                Step(**{**asdict(s), "device_wait": self._device_times[s.index][0],
                        "device_step": self._device_times[s.index][1]})
                if s.index in self._device_times else s
                for s in self._steps
            ]
        counted = [s for s in self._steps if not s.warmup]
        use_device = bool(counted) and all(s.device_step is not None for s in counted)
        waits = [(s.device_wait if use_device else s.wait) for s in counted]
        durations = [(s.device_step if use_device else s.step) for s in counted]
        seconds = float(sum(durations))
        samples = [s.samples for s in counted]
        total_samples = sum(samples) if counted and all(n is not None for n in samples) else None
        wait_share = float(sum(waits)) / seconds if seconds > 0 else math.nan
        summary = ProfileSummary(
            steps_counted=len(counted),
            seconds=seconds,
            steps_per_second=len(counted) / seconds if seconds > 0 else math.nan,
            samples_per_second=(total_samples / seconds if total_samples is not None and seconds > 0
                                else None),
            wait_share=wait_share,
            wait_p50=_percentile(waits, 50), wait_p95=_percentile(waits, 95),
            step_p50=_percentile(durations, 50), step_p95=_percentile(durations, 95),
            warmup_seconds=float(sum(s.step for s in self._steps if s.warmup)),
            clock="cuda events" if use_device else ("host, synchronized" if self.sync else "host"),
            verdict="", advice=[], loader=self.loader_info, steps=list(self._steps),
        )
        summary.verdict, summary.advice = diagnose(summary, cuda=self.device.type == "cuda")
        return summary


def _workers(count: int | None) -> str:
    return f"{count} worker process{'' if count == 1 else 'es'}"


def _wait(step: Step, use_device: bool) -> float:
    return (step.device_wait if use_device else step.wait) or 0.0


def diagnose(summary: ProfileSummary, cuda: bool) -> tuple[str, list[str]]:
    """The verdict line and concrete next steps for ``summary``."""
    if summary.steps_counted == 0 or math.isnan(summary.wait_share):
        return _nothing_measured(summary)
    verdict, advice = _diagnose(summary, cuda)
    if summary.steps_counted < _FEW_STEPS:
        count = summary.steps_counted
        advice.insert(0, f"only {count} step{'s' if count != 1 else ''} after the warm-up: the "
                         "numbers rest on so few that one slow batch decides them; profile "
                         "more steps (more data, a smaller batch_size, or several epochs in one "
                         "profile)")
    return verdict, advice


# Counted steps under which a profile's numbers say little (the warm-up aside).
_FEW_STEPS = 3


def _diagnose(summary: ProfileSummary, cuda: bool) -> tuple[str, list[str]]:
    share = summary.wait_share
    info = summary.loader
    cores = usable_cores()
    advice: list[str] = []
    if share < NOT_INPUT_BOUND:
        verdict = f"compute-bound: only {share:.0%} of each step waits for data"
        advice.append(
            "The input pipeline keeps up; a faster loader will not speed this loop up. Look at the "
            "step itself (torch.profiler, mixed precision, channels_last, torch.compile)."
        )
        return verdict, advice
    if share >= INPUT_BOUND:
        verdict = f"input-bound: {share:.0%} of each step waits for data"
    else:
        verdict = f"partly input-bound: {share:.0%} of each step waits for data"

    loaderish = info.kind in ("DataLoader", "DataLoaderX")
    if loaderish and info.num_workers == 0:
        advice.append(
            f"num_workers=0 loads every batch in the training process: set num_workers (this "
            f"machine has {cores} cores); `fastpipe tune` measures the best value."
        )
    elif loaderish and info.num_workers is not None and info.num_workers < cores:
        advice.append(
            f"Raise num_workers (now {info.num_workers}; this machine has {cores} cores); "
            "`fastpipe tune` measures the best value."
        )
    if info.kind == "DataLoader":
        advice.append(
            "Use fastpipe.DataLoaderX (same arguments): collation and the hand-over from the "
            "workers run in a background thread, overlapping the step."
        )
    if cuda and not info.prefetcher and info.kind != "DALILoader":
        advice.append(
            "Wrap the loader in fastpipe.DataPrefetcher(loader, mean=..., std=...): the next batch "
            "is copied to the GPU on a side stream while this one trains, and normalized there "
            "(keep the dataset's output uint8)."
        )
        if loaderish and not info.pin_memory:
            advice.append("Set pin_memory=True so host-to-device copies can run asynchronously.")
    use_device = summary.clock == "cuda events"
    counted = [s for s in summary.steps if not s.warmup]
    per_epoch = info.batches_per_epoch
    # A DataLoader without persistent workers starts them again at every epoch: the first
    # batch of each epoch stalls. Those steps are told apart from stalls of the loader itself.
    # Threads (worker_method="thread") start again in microseconds, and are not persistent.
    restarts = (loaderish and bool(info.num_workers) and info.worker_method != "thread"
                and not info.persistent_workers)
    epoch_starts = {s.index for s in counted if per_epoch and s.index % per_epoch == 0}
    start_waits = [_wait(s, use_device) for s in counted if s.index in epoch_starts]
    other_waits = [_wait(s, use_device) for s in counted if s.index not in epoch_starts]
    other_p50, other_p95 = _percentile(other_waits, 50), _percentile(other_waits, 95)
    if restarts and start_waits and _percentile(start_waits, 50) > max(4 * other_p95, 0.005):
        advice.append(
            f"Each epoch begins with a {_percentile(start_waits, 50) * 1e3:.0f} ms wait while the "
            f"DataLoader starts its {_workers(info.num_workers)} again: set "
            "persistent_workers=True."
        )
    elif restarts and summary.warmup_seconds > 5 * max(summary.step_p50, 1e-3):
        advice.append(
            f"The first batch took {summary.warmup_seconds:.2f} s (starting "
            f"{_workers(info.num_workers)}), and a DataLoader pays that again every epoch: set "
            "persistent_workers=True."
        )
    if other_waits and other_p95 > 4 * max(other_p50, 1e-4) and other_p95 > 0.005:
        which = "Waits are uneven"
        if start_waits:
            # The summary's percentiles count every step; these leave the epoch starts out.
            which = (f"Apart from the {len(start_waits)} epoch start"
                     f"{'s' if len(start_waits) != 1 else ''} (the summary's p95 of "
                     f"{summary.wait_p95 * 1e3:.1f} ms counts them), waits are uneven")
        advice.append(
            f"{which} (p95 {other_p95 * 1e3:.1f} ms, p50 {other_p50 * 1e3:.1f} ms): the loader "
            f"keeps up on average but stalls at times; keep more batches ready with "
            f"{_deeper_queue(info)}."
        )
    if info.kind != "DALILoader":
        if loaderish and info.num_workers is not None and info.num_workers >= cores:
            lead = "The workers already use every core: make each sample cheaper"
        else:
            lead = "Once more workers stop helping, make each sample cheaper"
        # Only what this loader does not do already.
        ways = []
        if not info.fast_path:
            ways.append("the fast CPU path (fastpipe.data.ImageFolder + "
                        "fastpipe.data.fast_collate, uint8 until the device)")
        if not info.pack:
            ways.append("a pack file (`fastpipe pack`, read with fastpipe.data.H5Dataset)")
        ways.append("DALI (fastpipe.dali.DALILoader, or image_loader on a CUDA machine with "
                    "DALI; decodes on the GPU)")
        in_use = [name for name, used in (("the fast CPU path", info.fast_path),
                                          ("a pack file", info.pack)) if used]
        already = f" (it already reads {' and '.join(in_use)})" if in_use else ""
        advice.append(f"{lead}{already}: {', '.join(ways[:-1])}{', or ' if len(ways) > 1 else ''}"
                      f"{ways[-1]}.")
    return verdict, advice


def _nothing_measured(summary: ProfileSummary) -> tuple[str, list[str]]:
    """Why no step was counted, and the numbers to change."""
    from fastpipe.profiling._workload import MIN_BATCHES, batches_per_epoch, suggested_batch_size

    steps = summary.steps
    if not steps:
        return ("the loop received no batch (an empty loader, or one that ended at once)", [])
    if summary.steps_counted > 0:  # steps of zero length: a clock that did not move
        return (f"{summary.steps_counted} steps took no measurable time", [])
    warmup = sum(s.warmup for s in steps)
    received = "1 batch" if len(steps) == 1 else f"{len(steps)} batches"
    verdict = (f"the loop received {received}, all of it warm-up (warmup={warmup}: the first "
               f"steps start the workers and are not counted); the first took "
               f"{steps[0].step:.2f} s")
    advice = []
    info = summary.loader
    samples = sum(s.samples or 0 for s in steps)
    if info.batch_size and info.batches_per_epoch is not None and samples:
        size = info.batch_size
        dataset = samples if len(steps) == info.batches_per_epoch else None
        if dataset is not None and size > dataset:
            advice.append(
                f"batch_size={size} is larger than the dataset's {dataset} samples, so each "
                f"epoch is one batch: pass batch_size={suggested_batch_size(dataset)} "
                f"({batches_per_epoch(dataset, suggested_batch_size(dataset))} batches), or "
                f"use at least {MIN_BATCHES * size} samples")
        else:
            advice.append(f"the loader gives {info.batches_per_epoch} batch"
                          f"{'es' if info.batches_per_epoch != 1 else ''} of {size} an epoch: "
                          "a smaller batch_size or more data gives more steps")
    advice.append("or profile several epochs as one: `with fastpipe.profile() as prof:` around "
                  "the epoch loop, `for batch in prof.wrap(loader):` inside (only the first step "
                  "of all is warm-up), or pass warmup=0 to count the first step too")
    return verdict, advice


def _deeper_queue(info: LoaderInfo) -> str:
    """The settings that keep more batches ready, as this loader spells them."""
    if info.kind == "DataLoaderX":
        depth = f" (now {info.prefetch_depth})" if info.prefetch_depth else ""
        if info.worker_method == "thread":
            # image_loader takes prefetch_depth (not prefetch_factor) for the same queue.
            return f"prefetch_depth{depth} (DataLoaderX or image_loader)"
        factor = f" (now {info.prefetch_factor})" if info.prefetch_factor else ""
        return f"prefetch_depth{depth}, or prefetch_factor{factor} for each worker process"
    if info.kind == "DataLoader":
        factor = f" (now {info.prefetch_factor})" if info.prefetch_factor else ""
        if info.num_workers:
            return f"prefetch_factor{factor}, or fastpipe.DataLoaderX(prefetch_depth=...)"
        return "fastpipe.DataLoaderX(prefetch_depth=...) (a background queue)"
    return "a deeper queue of ready batches (fastpipe.DataLoaderX(prefetch_depth=...))"


def profile(
    loader: Iterable[Any] | None = None,
    *,
    batch_size: int | None = None,
    warmup: int = 1,
    device: str | torch.device | None = None,
    sync: bool = False,
    report: bool | TextIO = True,
) -> Profiler:
    """Measures how much of each training step waits for data, and says what to do about it.

    Wrap the loader::

        prof = fastpipe.profile(loader)
        for images, labels in prof:
            train_step(images, labels)
        prof.summary().plot("profile.png")

    or the training loop::

        with fastpipe.profile() as prof:
            for images, labels in prof.wrap(loader):
                train_step(images, labels)
        print(prof.summary().wait_share)

    A step runs from asking for a batch to asking for the next; its data wait is the part before
    the batch arrived. The first ``warmup`` steps (worker start-up) are kept in the timeline but
    not in the statistics. Samples per step are read from the batch (the first dimension of its
    first tensor); pass ``batch_size`` when batches hold no tensor.

    Args:
        loader: any iterable of batches (DataLoader, DataLoaderX, DataPrefetcher, DALILoader...).
        device: where the step runs. On CUDA (the default when available) each step boundary is
            also marked with a CUDA event on the current stream, so the wait is what the GPU saw
            (idle time before the batch was ready); events are read back without blocking, and
            waited for once by :meth:`Profiler.summary`.
        sync: synchronize the device at every step boundary, so host times are exact per step;
            this removes the overlap of host and device and slows the loop: off by default.
        report: print the summary when the loop (or the ``with`` block) ends: True for stderr,
            or a file object; False to stay silent.

    Returns:
        A :class:`Profiler`: iterate it, or use it as a context manager with ``wrap()`` or
        ``fetch()``; ``summary()`` gives a :class:`ProfileSummary` with ``to_csv()``,
        ``to_json()`` and ``plot()``.
    """
    return Profiler(loader, batch_size=batch_size, warmup=warmup, device=device, sync=sync,
                    report=report)
