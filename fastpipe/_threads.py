"""Batches loaded by a pool of threads in this process, in sampler order.

For datasets whose per-sample work releases the GIL (fastpipe's JPEG decode and resize do), threads
load as fast as worker processes without their costs: no shared-memory collate, no pickling of
batches between processes, no worker start-up each epoch.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from fastpipe._background import interrupted
from fastpipe._compat import register_before_thread_join

_thread_stop = threading.local()


@contextmanager
def cancelled_by(stop: threading.Event) -> Iterator[None]:
    """Inside, this thread's remote waits given no stop event of their own (a dataset's reads
    in a loader's thread: requests, retries' waits, the cache's locks) end with
    :class:`~fastpipe.data.remote.retry.Cancelled` once ``stop`` is set, within a poll interval."""
    previous = getattr(_thread_stop, "event", None)
    _thread_stop.event = stop
    try:
        yield
    finally:
        _thread_stop.event = previous


def stop_of(stop: threading.Event | None) -> threading.Event | None:
    """``stop``, or where it is None the event of an enclosing :func:`cancelled_by`."""
    return stop if stop is not None else getattr(_thread_stop, "event", None)


# How often a wait for a batch looks at ``stop``.
_POLL_SECONDS = 0.1
# Every pool's stop event, set at the interpreter's exit before Python joins the pools' threads.
_live: weakref.WeakSet[threading.Event] = weakref.WeakSet()


def _stop_all() -> None:
    for stop in list(_live):
        stop.set()


register_before_thread_join(_stop_all)


class _Either:
    """Set when either of two events is (as far as ``is_set`` and ``wait`` go)."""

    def __init__(self, a: threading.Event, b: threading.Event) -> None:
        self._a, self._b = a, b

    def is_set(self) -> bool:
        return self._a.is_set() or self._b.is_set()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._a.wait(min(left, _POLL_SECONDS))
        return True


class _Stopped(Exception):
    """A batch left unfinished because its generator ended (nobody takes its result)."""


def _load(stop: Any, dataset: Any, indices: Sequence[int],
          collate_fn: Callable[[list], Any], pin_memory: bool) -> Any:
    with cancelled_by(stop):
        return _load_batch(dataset, indices, collate_fn, pin_memory, stop)


def _load_batch(dataset: Any, indices: Sequence[int], collate_fn: Callable[[list], Any],
                pin_memory: bool, stop: Any) -> Any:
    getitems = getattr(dataset, "__getitems__", None)
    if callable(getitems):
        samples = getitems(list(indices))
    else:
        samples = []
        for i in indices:  # a thread ends after the sample it is reading once its epoch ended
            if stop.is_set():
                raise _Stopped
            samples.append(dataset[i])
    batch = collate_fn(samples)
    if pin_memory:
        from torch.utils.data._utils.pin_memory import pin_memory as pin

        batch = pin(batch)
    return batch


def thread_batches(
    dataset: Any,
    batch_indices: Iterable[Sequence[int]],
    collate_fn: Callable[[list], Any],
    num_threads: int,
    in_flight: int,
    pin_memory: bool = False,
    name: str = "fastpipe-loader",
    stop: threading.Event | None = None,
) -> Generator[Any, None, None]:
    """Yields ``collate_fn([dataset[i] for i in indices])`` for each ``indices`` of
    ``batch_indices``, in order, loading up to ``in_flight`` batches ahead on ``num_threads``
    threads. An exception raised while loading a batch is raised at that batch. The threads stop
    when the generator is exhausted, closed or garbage collected, and at the interpreter's exit
    (a Ctrl-C): batches not started are cancelled, the ones being loaded are waited for, and
    their waits on object storage (a download, a retry, the cache's lock) cancelled. ``stop``
    (set from another thread: the consumer is gone) ends the generator as closing it does, even
    while it waits for a batch.
    """
    ended = threading.Event()  # set when this generator ends, and at the interpreter's exit
    _live.add(ended)
    cancel = ended if stop is None else _Either(ended, stop)
    pool = concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix=name)
    pending: collections.deque[concurrent.futures.Future] = collections.deque()
    indices = iter(batch_indices)
    try:
        exhausted = False
        while True:
            while not exhausted and len(pending) < in_flight:
                with cancelled_by(cancel):  # a sampler's end waits for its downloads
                    batch = next(indices, None)
                if batch is None:
                    exhausted = True
                    break
                pending.append(pool.submit(_load, cancel, dataset, batch, collate_fn,
                                           pin_memory))
            if not pending:
                return
            loading = pending.popleft()
            while not concurrent.futures.wait([loading], timeout=_POLL_SECONDS).done:
                if stop is not None and stop.is_set():
                    return
            yield loading.result()
    finally:
        ended.set()
        # Under a Ctrl-C, or when `stop` ended the generator from another thread, the batches
        # being loaded are not waited for here: the threads end after them (their remote waits
        # cancelled by `ended`), and the interpreter's exit joins them.
        stopped = stop is not None and stop.is_set()
        pool.shutdown(wait=not (interrupted() or stopped), cancel_futures=True)


# How long close() from another thread waits for the consumer to leave a wait for a batch.
_CLOSE_SECONDS = 1.0


class ThreadEpoch:
    """An epoch of :func:`thread_batches` iterated in the consumer's own thread.

    The pool's threads are what loads ahead; each batch passes from the thread that loaded it
    straight to the consumer. Behind a background thread of its own, every batch would wake two
    threads, and take the GIL twice, instead of once.

    Like :class:`~fastpipe._background.BackgroundIterator`: an exception of a batch reaches the
    consumer at that batch and ends the epoch; the threads end on exhaustion, on :meth:`close`
    (from any thread: it sets ``stop``, which ends a wait for a batch under way within a poll),
    when the iterator is garbage collected and at the interpreter's exit; a Ctrl-C in the
    consumer is not held up by the batches being loaded.
    """

    def __init__(self, batches: Generator[Any, None, None], stop: threading.Event) -> None:
        self._batches: Generator[Any, None, None] | None = batches
        self._stop = stop
        self._lock = threading.Lock()  # held by the thread inside next(), which close() awaits

    def __iter__(self) -> ThreadEpoch:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._batches is None:
                raise StopIteration
            try:
                return next(self._batches)
            except BaseException:
                self._batches = None  # the generator has ended (exhausted, raised, interrupted)
                raise

    def close(self) -> None:
        """Stops the threads, and waits for the batches they are loading; batches not taken are
        dropped. Safe to call twice. From another thread while the consumer waits for a batch,
        the consumer's wait ends within a poll and the threads end after the batches they are
        loading, not waited for."""
        if not self._lock.acquire(blocking=False):
            self._stop.set()  # the consumer is inside next(): its wait ends
            if not self._lock.acquire(timeout=_CLOSE_SECONDS):
                return  # its thread ends the epoch when the wait sees `stop`
        try:
            batches, self._batches = self._batches, None
        finally:
            self._lock.release()
        if batches is not None:
            batches.close()
        self._stop.set()

    @property
    def thread(self) -> None:
        """No thread of its own (a background iterator's ``thread``)."""
        return None

    @property
    def alive(self) -> bool:
        """Whether the epoch can still yield batches."""
        return self._batches is not None
