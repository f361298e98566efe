"""The loader runner shared by ``profile``, ``tune`` and ``bench``: iterate a loader under the
profiler for a time or a number of steps, then stop its threads and processes; what it measured
becomes a :class:`~fastpipe.profiling._table.Row` of the command's table."""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import os
import re
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from fastpipe._background import deferred_interrupt
from fastpipe._compat import shutdown_dataloader_workers
from fastpipe.profiling._datasets import DatasetSource
from fastpipe.profiling._settings import LoaderSettings
from fastpipe.profiling._table import Row
from fastpipe.profiling.profiler import LoaderInfo, Profiler, ProfileSummary


def run_loader(
    loader: Any,
    seconds: float | None = None,
    step_seconds: float = 0.0,
    min_batches: int = 3,
    steps: int | None = None,
    progress: bool = False,
) -> ProfileSummary:
    """Iterates ``loader`` (epoch after epoch), profiled, for ``seconds`` or ``steps``.

    The first batch (starting workers) is the profile's warm-up, reported apart; ``seconds`` and
    ``steps`` count from after it. Epochs repeat until done, so the cost of restarting workers
    each epoch counts when the dataset is small. With ``seconds``, at least ``min_batches`` are
    counted unless that takes over three times ``seconds``. With ``step_seconds`` each batch is
    followed by a sleep, standing in for a training step during which the host is idle (as
    while a GPU computes).
    """
    if (seconds is None) == (steps is None):
        raise ValueError("pass exactly one of seconds or steps")
    profiler = Profiler(None, warmup=1, device="cpu", report=False)
    batches = epochs(loader)
    wrapped = profiler.wrap(batches)
    profiler.loader_info = LoaderInfo.of(loader)  # not of the epoch generator
    from fastpipe._progress import progress_bar

    bar = progress_bar(progress and steps is not None,
                       total=(steps or 0) + 1, unit="step", desc="fastpipe profile")
    counted, first = 0, True
    deadline = hard_deadline = math.inf
    _watches.ended.clear()
    try:
        for _ in wrapped:
            if step_seconds:
                time.sleep(step_seconds)
            bar.update(1)
            now = time.perf_counter()
            if first:
                first = False
                if seconds is not None:
                    deadline, hard_deadline = now + seconds, now + 3 * seconds
            else:
                counted += 1
            if steps is not None:
                if counted >= steps:
                    break
            elif (now >= deadline and counted >= min_batches) or now >= hard_deadline:
                break
    except (KeyboardInterrupt, RuntimeError) as exc:
        stopped = _watches.stopped_worker(exc)
        if stopped is None:
            raise
        raise WorkerStopped(stopped) from None
    finally:
        try:
            wrapped.close()  # ends the last step
            # Stops the epoch's workers here, where a Ctrl-C is raised: left to its finalizer
            # when the last reference goes, the generator would print one and lose it.
            batches.close()
        finally:
            bar.close()
    return profiler.summary()


class WorkerStopped(KeyboardInterrupt):
    """A worker process of the loader being measured ended while the loader still needed it.

    fastpipe's DataLoader workers end quietly (status 0) on SIGINT, so that a terminal's Ctrl-C,
    which reaches them too, ends a command with its own message; a SIGINT sent to one worker
    alone then leaves the loader waiting for that worker's batches until torch's check, every
    5 s, raises "DataLoader worker (pid(s) N) exited unexpectedly". The runner's watch (below)
    sees the exit at once and interrupts the measurement with this, an interrupt: the command
    ends as on Ctrl-C, saying which worker it was."""

    def __init__(self, pid: int) -> None:
        super().__init__(
            f"DataLoader worker process {pid} ended while the loader was running (a SIGINT "
            "sent to the worker alone ends it); the measurement stopped")
        self.pid = pid


# How often the watch looks at the workers, and how long after one worker ended the others may
# still run before that counts as a worker stopped alone (at an epoch's end all end together).
_WATCH_SECONDS = 0.05
_ALONE_SECONDS = 0.5
_TORCH_EXIT = re.compile(r"DataLoader worker \(pids?\(?s?\)? ([\d, ]+)\) exited unexpectedly$")


class _Watches:
    """The workers seen ending quietly (status 0) while their epoch ran, by pid."""

    def __init__(self) -> None:
        self.ended: dict[int, float] = {}
        self.interrupted: int | None = None
        self.workers: dict[int, multiprocessing.process.BaseProcess] = {}  # the epoch's

    def stopped_worker(self, exc: BaseException) -> int | None:
        """The worker behind ``exc``: the one a watch interrupted the main thread for, or the
        one torch's 5 s check reports, if it ended quietly."""
        if isinstance(exc, KeyboardInterrupt):
            pid, self.interrupted = self.interrupted, None
            return pid
        match = _TORCH_EXIT.search(str(exc))
        if match is None:
            return None
        pids = [int(p) for p in match.group(1).split(",")]
        # torch also raises this at once when the worker ends while its batch is being
        # received (its connection reset), before the watch has seen the exit.
        return next((p for p in pids if p in self.ended or _quiet_exit(self.workers.get(p))),
                    None)


def _quiet_exit(worker: multiprocessing.process.BaseProcess | None) -> bool:
    """Whether the worker process ended with status 0, given a second to end (one whose
    connection was just reset is ending; torch may have reaped it already)."""
    if worker is None:
        return False
    worker.join(1.0)
    return worker.exitcode == 0


_watches = _Watches()


def _ended_quietly(pid: int) -> bool | None:
    """Whether process ``pid`` (a child) has ended with status 0 (False: ended otherwise; None:
    still running), looked at without reaping it (torch and multiprocessing reap their own)."""
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False  # already reaped: it ended, and torch or multiprocessing saw how
    if result is None:
        return None
    return result.si_code == os.CLD_EXITED and result.si_status == 0


class _WorkerWatch:
    """Watches the worker processes an epoch started while the epoch is read; when one ends
    quietly while the others still run, interrupts the main thread (a real SIGINT, so a wait
    inside torch wakes up) so the command stops within a fraction of a second, not torch's 5 s.
    Only where SIGINT raises KeyboardInterrupt in the main thread (Python's handler, or the
    fastpipe command's): another program's own handler is left alone."""

    def __init__(self, workers: list[multiprocessing.process.BaseProcess]) -> None:
        self.pids = [w.pid for w in workers if w.pid is not None]
        _watches.workers = {w.pid: w for w in workers if w.pid is not None}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fastpipe-worker-watch",
                                       daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, before: set[int]) -> _WorkerWatch | None:
        if not hasattr(os, "waitid") or threading.current_thread() is not threading.main_thread():
            return None
        workers = [w for w in multiprocessing.active_children() if w.pid not in before]
        return cls(workers) if workers else None

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        first_end: float | None = None
        while not self.done.wait(_WATCH_SECONDS):
            states = {pid: _ended_quietly(pid) for pid in self.pids}
            running = [pid for pid, state in states.items() if state is None]
            quiet = [pid for pid, state in states.items() if state]
            for pid in quiet:
                _watches.ended.setdefault(pid, time.monotonic())
            if len(running) == len(self.pids):
                continue
            if not running:
                return  # all ended together: the epoch's end (or a Ctrl-C reaching them all)
            now = time.monotonic()
            first_end = now if first_end is None else first_end
            if quiet and now - first_end >= _ALONE_SECONDS:
                self._interrupt_main(quiet[0])
                return

    def _interrupt_main(self, pid: int) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if handler is not signal.default_int_handler and not getattr(
                handler, "raises_keyboard_interrupt", False):
            return  # torch's own check will raise, and the runner names the worker then
        if self.done.is_set():
            return
        _watches.interrupted = pid
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def close_loader(loader: Any) -> None:
    """Stops the threads of a loader (and of the loader a DataPrefetcher wraps)."""
    for item in (loader, getattr(loader, "loader", None)):
        close = getattr(item, "close", None)
        if callable(close):
            close()


def measured_row(summary: ProfileSummary, row: Row, too_few: str) -> Row:
    """``row`` with what ``summary`` measured: the rate, the data-wait share, the batches counted
    and their seconds, the first batch apart. Skipped when no batch came, or with ``too_few``
    when none was counted after the first."""
    if not summary.steps:
        row.skipped = "the dataset gave no batch"
    elif summary.steps_counted == 0 or summary.samples_per_second is None:
        row.first_batch_seconds = summary.warmup_seconds
        row.skipped = too_few
    else:
        row.per_round = [summary.samples_per_second]
        row.wait_share = summary.wait_share
        row.batches = summary.steps_counted
        row.seconds = summary.seconds
        row.first_batch_seconds = summary.warmup_seconds
    return row


def settings_row(settings: LoaderSettings, stage: str, skipped: str | None = None) -> Row:
    """The tuner's row for one point of its grid, named by its loader, keyed by all of it."""
    return Row(settings.wrapper_name, key=settings.label, settings=settings, stage=stage,
               skipped=skipped)


def measure(
    source: DatasetSource,
    settings: LoaderSettings,
    seconds: float,
    step_seconds: float = 0.0,
    min_batches: int = 3,
    stage: str = "",
) -> Row:
    """Builds the loader for ``settings`` and measures it with :func:`run_loader`."""
    with warnings.catch_warnings():
        # More workers than cores is a deliberate point of the grid, not a mistake to warn about.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = settings.build(source.dataset, source.collate_fn)
        try:
            summary = run_loader(loader, seconds, step_seconds, min_batches)
        finally:
            close_loader(loader)
            del loader
            gc.collect()  # so persistent workers end now, not during the next trial
    return measured_row(summary, settings_row(settings, stage),
                        "the dataset gave only one batch; use a smaller batch size")


def epochs(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch, until an epoch yields none."""
    while True:
        empty = True
        with epoch_batches(loader) as batches:
            for batch in batches:
                empty = False
                yield batch
        del batches
        if empty:
            return


@contextlib.contextmanager
def epoch_batches(loader: Any) -> Iterator[Any]:
    """One epoch's iterator over ``loader``: its workers started with Ctrl-C held back (see
    deferred_interrupt), and stopped when the block ends (see end_epoch)."""
    before = {child.pid for child in multiprocessing.active_children()}
    with deferred_interrupt():
        batches = iter(loader)
    watch = _WorkerWatch.start(before)
    try:
        yield batches
    finally:
        if watch is not None:
            watch.stop()
        end_epoch(loader, batches)


def end_epoch(loader: Any, batches: Any) -> None:
    """Stops the workers of an epoch's iterator now, not when it is collected: a Ctrl-C that
    lands in a finalizer (DataLoader's ``__del__`` joining its workers) is printed as
    "Exception ignored" and lost, where here it is raised. Persistent workers stay."""
    if getattr(loader, "persistent_workers", False):
        return
    close = getattr(batches, "close", None)
    if callable(close):
        close()
    else:
        shutdown_dataloader_workers(batches)
