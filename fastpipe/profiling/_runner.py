"""The loader runner shared by ``profile``, ``tune`` and ``bench``: iterate a loader under the
profiler for a time or a number of steps, then stop its threads and processes; what it measured
becomes a :class:`~fastpipe.profiling._table.Row` of the command's table."""

from __future__ import annotations

import contextlib
import gc
import math
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
    wrapped = profiler.wrap(epochs(loader))
    profiler.loader_info = LoaderInfo.of(loader)  # not of the epoch generator
    from fastpipe._progress import progress_bar

    bar = progress_bar(progress and steps is not None,
                       total=(steps or 0) + 1, unit="step", desc="fastpipe profile")
    counted, first = 0, True
    deadline = hard_deadline = math.inf
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
    finally:
        wrapped.close()  # ends the last step, and stops the loader's iterator
        bar.close()
    return profiler.summary()


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
    with deferred_interrupt():
        batches = iter(loader)
    try:
        yield batches
    finally:
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
