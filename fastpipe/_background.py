"""One background thread that runs an iterator ahead of its consumer.

The contract, each clause tested in tests/test_background.py:

* bounded: at most ``prefetch_depth`` items wait in the queue, so memory stays bounded;
* stoppable: ``close()`` sets a stop event, drains the queue so a producer blocked in ``put`` wakes
  up, and joins the thread; the producer checks the event between items;
* errors forwarded: an exception raised by the source iterator is raised to the consumer, as the
  same object, at the position where it happened; iteration ends after it;
* ends with its consumer: early ``break``, ``del``, garbage collection and interpreter exit all
  close the thread, because the thread holds no reference to the consumer-side object (``del``
  and garbage collection signal it and wait at most ``_DROP_JOIN_SECONDS``: the thread dropping
  the iterator may be unwinding a Ctrl-C; the producer ends after the item it is fetching).

Ctrl-C: the consumer waits only in ``queue.SimpleQueue.get`` (implemented in C), so a
KeyboardInterrupt can never leave a Python-level lock of the queue half-taken (``queue.Queue``'s
conditions can be, and the producer then hangs or fails with "release unlocked lock"); and a close
while a KeyboardInterrupt unwinds signals the producer without waiting for it. A producer is a
daemon thread; interpreter exit gives all of them ``_EXIT_JOIN_SECONDS`` together.

prefetch_generator's BackgroundGenerator is the idea this follows, but it is not used: version 1.0.3
forwards exceptions (older ones did not), but its thread stays blocked in ``put`` after an early
break, it has no ``close()``, and it treats a ``None`` item as the end of the data.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from fastpipe import _validate as check
from fastpipe._compat import register_before_thread_join

T = TypeVar("T")

# How often a producer blocked on a full queue looks at the stop event.
_POLL_SECONDS = 0.05
# How long close() waits for the producer; it can only stop between two items of its source.
_JOIN_SECONDS = 30.0
# How long interpreter exit waits for all producers together: a producer inside a slow item (or
# waiting on DataLoader workers that a Ctrl-C has killed) is a daemon thread and dies with the
# process, so exit must not wait out its item.
_EXIT_JOIN_SECONDS = 0.3
# How long dropping an iterator (``del``, garbage collection) waits for its producer: the thread
# that drops it may be unwinding a Ctrl-C (where sys.exc_info() no longer shows it), and a
# producer inside an item ends after it anyway.
_DROP_JOIN_SECONDS = 0.3


class _End:
    pass


class _Raised:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = _End()


class _Items(queue.SimpleQueue):
    """The items waiting for the consumer: at most ``maxsize``, since the producer takes a slot
    before it queues one."""

    def __new__(cls, maxsize: int) -> _Items:
        return super().__new__(cls)

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize

    def full(self) -> bool:
        return self.qsize() >= self.maxsize


def _put(items: queue.SimpleQueue, slots: queue.SimpleQueue, stop: threading.Event,
         item: Any) -> bool:
    # A slot is taken before an item is queued and given back when the consumer takes it: at
    # most prefetch_depth items wait.
    while not stop.is_set():
        try:
            slots.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
        if stop.is_set():
            return False
        items.put(item)
        return True
    return False


def _produce(source: Iterator, items: queue.SimpleQueue, slots: queue.SimpleQueue,
             stop: threading.Event) -> None:
    # `source` is the only strong reference to the underlying iterator once the consumer side has
    # handed it over, so leaving this function releases it (a DataLoader iterator then shuts down
    # its workers).
    try:
        while not stop.is_set():
            try:
                item = next(source)
            except StopIteration:
                break
            except BaseException as error:  # noqa: BLE001 - forwarded to the consumer as is
                _put(items, slots, stop, _Raised(error))
                return
            if not _put(items, slots, stop, item):
                return
        _put(items, slots, stop, _END)
    finally:
        close = getattr(source, "close", None)
        del source
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - the consumer is gone; nothing to report to
                pass


def _signal_stop(items: queue.SimpleQueue, slots: queue.SimpleQueue,
                 stop: threading.Event) -> None:
    stop.set()
    slots.put(None)  # wakes a producer waiting for a slot at once instead of after a poll
    # Drops the items waiting, so their memory (and a DataLoader's shared memory) goes now.
    while True:
        try:
            items.get_nowait()
        except queue.Empty:
            break


def interrupted() -> bool:
    """Whether a KeyboardInterrupt is unwinding through the caller (a ``finally`` or ``except``
    on its way): closing then only signals threads to stop, and does not wait for the item they
    are fetching (a slow batch, or one from worker processes the same Ctrl-C killed).

    The exception being handled may be another one raised while the interrupt unwinds: a
    GeneratorExit when the unwinding closes a generator that consumes the iterator (a loop's
    ``for batch in loader: yield batch``), an error of a cleanup step; the interrupt is then in
    its context chain."""
    error, seen = sys.exc_info()[1], set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__context__
    return False


def _shutdown(thread: threading.Thread, items: queue.SimpleQueue, slots: queue.SimpleQueue,
              stop: threading.Event, wait: float = _DROP_JOIN_SECONDS) -> None:
    _signal_stop(items, slots, stop)
    if thread is not threading.current_thread() and thread.is_alive() and not interrupted():
        thread.join(wait)


_live: weakref.WeakSet[BackgroundIterator] = weakref.WeakSet()


def _forget_the_parents_iterators() -> None:
    # A forked child (a DataLoader worker) inherits copies of the parent's iterators, whose
    # threads do not exist in it and whose queues may have been locked by them at the fork;
    # stopping those at the child's exit made workers exit with code 1 (fastpipe bench).
    global _live
    _live = weakref.WeakSet()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_the_parents_iterators)


def _close_all_at_exit() -> None:
    live = list(_live)
    for it in live:
        _signal_stop(it._items, it._slots, it._stop)
    deadline = time.monotonic() + _EXIT_JOIN_SECONDS
    for it in live:
        it._done = True
        it._thread.join(max(0.0, deadline - time.monotonic()))


# Runs before the interpreter joins threads at exit, like concurrent.futures does; plain atexit
# handlers would run too late for a producer blocked on a full queue.
register_before_thread_join(_close_all_at_exit)


class BackgroundIterator(Generic[T]):
    """Iterates ``source`` in a daemon thread, keeping up to ``prefetch_depth`` items ready.
    ``stop``: the event set when the iterator is closed (given where ``source`` watches it too,
    to end the wait for an item the consumer will no longer take)."""

    def __init__(
        self,
        source: Iterator[T],
        prefetch_depth: int = 2,
        name: str = "fastpipe-background",
        stop: threading.Event | None = None,
    ):
        prefetch_depth = check.positive_int("prefetch_depth", prefetch_depth)
        self._items = _Items(prefetch_depth)
        self._slots: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(prefetch_depth):
            self._slots.put(None)
        self._stop = stop if stop is not None else threading.Event()
        self._done = False
        self._closed = threading.Event()  # set once the first close() has done waiting
        self._thread = threading.Thread(
            target=_produce, args=(source, self._items, self._slots, self._stop), name=name,
            daemon=True,
        )
        del source
        self._thread.start()
        self._finalizer = weakref.finalize(
            self, _shutdown, self._thread, self._items, self._slots, self._stop)
        # At exit, _close_all_at_exit stops every producer without waiting out a slow item;
        # finalize's own exit hook would join each one for up to _JOIN_SECONDS.
        self._finalizer.atexit = False
        _live.add(self)

    def __iter__(self) -> BackgroundIterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._items.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._items.empty():
                    # Only a closed iterator gets here: the producer always leaves _END or an error.
                    self._done = True
                    raise StopIteration from None
            except KeyboardInterrupt:
                # Ctrl-C: tell the producer to stop, but do not wait for the item it is fetching
                # (a slow batch, or workers the same Ctrl-C killed): the interrupt goes on now.
                self._done = True
                _signal_stop(self._items, self._slots, self._stop)
                raise
        self._slots.put(None)
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Raised):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stops the producer and waits for it; pending items are dropped. Safe to call twice,
        also from two threads at once (the second waits as the first does).

        The producer can only stop between two items of its source; if one item takes longer
        than 30 s, close() warns and returns while the thread finishes that item.
        """
        self._done = True
        if self._finalizer.detach() is not None:  # not closed yet: stop it and wait for it
            try:
                _shutdown(self._thread, self._items, self._slots, self._stop, _JOIN_SECONDS)
            finally:
                self._closed.set()
        elif self._thread is not threading.current_thread() and not interrupted():
            self._closed.wait(_JOIN_SECONDS)  # another thread's close() is waiting for it
        if (self._thread.is_alive() and self._thread is not threading.current_thread()
                and not interrupted()):
            warnings.warn(
                f"{self._thread.name}: the background thread is still fetching an item after "
                f"{_JOIN_SECONDS:.0f} s; it stops when that item is done",
                RuntimeWarning,
                stacklevel=2,
            )

    @property
    def thread(self) -> threading.Thread:
        """The producer thread (it holds no reference to this object)."""
        return self._thread

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> BackgroundIterator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Holds back Ctrl-C (SIGINT) once worker processes start being forked in its block.

    A KeyboardInterrupt raised inside ``os.fork``'s hooks (logging's ``_releaseLock``, or any
    module's) is printed as "Exception ignored" and lost, leaving the program running with its
    workers killed by the same Ctrl-C, and possibly with logging's lock held. In the block, a
    SIGINT that arrives after the first fork began is held, and given to the Python handler in
    place (Python's KeyboardInterrupt, or a program's own) at the block's end; before any fork,
    it is handled at once, so a block that only waits (for persistent workers to resume, say)
    stays interruptible. Only the main thread receives SIGINT and may change the handler:
    elsewhere, or when SIGINT is ignored or not handled in Python, this changes nothing. A
    process forked inside the block (a DataLoader worker) ends quietly, with status 0, on SIGINT.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    owner = os.getpid()
    received: list[Any] = []
    outer = _fork_state.forked

    def hold(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a worker forked in the block, before its handler is reset
            _exit_quietly(signum, frame)
        if not _fork_state.forked:
            previous(signum, frame)
            return
        received.append(frame)

    hold.fastpipe_previous = previous  # type: ignore[attr-defined]
    _fork_state.forked = False
    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _fork_state.forked = outer or _fork_state.forked
        if received and not interrupted():
            previous(signal.SIGINT, received[0])


class _ForkState:
    """Whether a fork began in the innermost deferred_interrupt() block."""

    forked = False


_fork_state = _ForkState()


def _before_fork() -> None:
    _fork_state.forked = True


def _exit_quietly(signum: int, frame: Any) -> None:
    os._exit(0)


def _handler_back_in_child() -> None:
    # A DataLoader worker forked inside deferred_interrupt() inherits `hold`: it must stop on
    # Ctrl-C, which a terminal sends to the worker too. It ends at once with status 0, as torch's
    # worker loop does on a KeyboardInterrupt: a KeyboardInterrupt raised before that loop (while
    # multiprocessing bootstraps the worker) would end it with status 1 and a traceback, and
    # torch's SIGCHLD handler in the training process would then raise "DataLoader worker exited
    # unexpectedly" in place of the user's KeyboardInterrupt.
    _fork_state.forked = False
    try:
        if getattr(signal.getsignal(signal.SIGINT), "fastpipe_previous", None) is not None:
            signal.signal(signal.SIGINT, _exit_quietly)
    except ValueError:  # forked from a thread other than the main one: not this module's fork
        pass


if hasattr(os, "register_at_fork"):
    # "before" hooks run in reverse order of registration: this one runs before logging's
    # (torch imports logging first), so the hold covers every fork hook.
    os.register_at_fork(before=_before_fork, after_in_child=_handler_back_in_child)
