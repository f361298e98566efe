"""``Prefetch``: objects downloaded into the cache in a given order, a few ahead of the reader.

A reader of the node marks an entry when it starts reading it (``ShardCache.used_since``), in
any process; the prefetch keeps the objects up to ``ahead`` places past the last one marked
since it started downloaded (the first ``ahead + 1`` before anything is read), so that it never
fills the cache with objects read much later, which would evict those read sooner. Objects it
downloaded and nobody read yet are the last the cache evicts. Given where each object is no
longer needed (``released``: a place in the order), it marks spent those the pass is done with,
so that the cache evicts them before the objects the pass has yet to read: once the reader has
started the object at that place, or, given ``progress`` (where the pass stands: the last place
it has reached, everything needed before that object was first needed being read), once that is
at the place; it takes the marks of earlier passes off its own objects as it starts (a few
hundred each time it looks).

Its threads (one that follows the reader, ``downloads`` that download) end when the order is
done (given ``progress``, and every mark made), on :meth:`Prefetch.close` (within the poll
interval: a request under way is cancelled), on :meth:`Prefetch.finish` (no new download;
those under way complete, so that no object is downloaded twice), when the handle is dropped,
and before the interpreter exits; a ``.part`` file of a download they stopped is removed.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from fastpipe._compat import register_before_thread_join
from fastpipe._threads import stop_of
from fastpipe.data.remote.retry import Cancelled

__all__ = ["Prefetch"]

# How often the reader's position is looked at.
_POLL_SECONDS = 0.02
# Objects whose marks of an earlier pass are taken off in one look (``ShardCache.needed``):
# a pass of a million shards would otherwise keep the thread from following for seconds.
_CLEARED_PER_POLL = 256
# How long close() waits for the threads (each stops within a poll interval).
_JOIN_SECONDS = 5.0
_EXIT_JOIN_SECONDS = 1.0


def _follow(cache: Any, urls: list[str], released: list[int] | None,
            progress: Callable[[], int] | None, stop: threading.Event,
            finishing: threading.Event, work: queue.SimpleQueue, downloads: int) -> None:
    """Hands the downloaders the objects in order, ``ahead`` past the reader's position, and
    marks spent those the pass is done with."""
    ahead = cache.options.ahead
    started = time.time_ns()
    position = -1  # the last object a reader started since the prefetch began
    handed = 0
    released = released or []
    by_release = sorted(range(len(released)), key=released.__getitem__)
    marked = 0  # of by_release
    # The marks a place can be reached for (a place past the last is never reached).
    markable = sum(1 for r in released if r < len(urls))
    cleared = 0  # of urls: those whose marks of an earlier pass are taken off

    def following() -> bool:
        return handed < len(urls) or (progress is not None and marked < markable)

    try:
        while following() and not stop.is_set() and not finishing.is_set():
            for k in range(max(position + 1, 0), handed):
                if cache.used_since(urls[k], started):
                    position = k
            # Marked before the downloads that may make room for the next ones.
            done = position if progress is None else progress()
            while marked < len(by_release) and released[by_release[marked]] <= done:
                cache.spent(urls[by_release[marked]])
                marked += 1
            while handed < len(urls) and handed <= max(position, 0) + ahead:
                work.put(handed)
                handed += 1
            if cleared < len(urls):  # after the first downloads are handed out; a few a time
                # Not the marks made since the pass began (by it, or by another rank's pass).
                cache.needed(urls[cleared:cleared + _CLEARED_PER_POLL], before=started)
                cleared += _CLEARED_PER_POLL
            if following():
                finishing.wait(_POLL_SECONDS)
    finally:
        for _ in range(downloads):
            work.put(None)


def _download(cache: Any, urls: list[str], stop: threading.Event, finishing: threading.Event,
              work: queue.SimpleQueue, done: dict[int, bool], errors: list) -> None:
    while not stop.is_set():
        try:
            k = work.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
        if k is None:
            return
        if finishing.is_set():
            continue  # handed out but not started: left to the readers
        try:
            with cache.pinned([urls[k]], stop=stop, read=False):
                pass
            done[k] = True
        except Cancelled:
            return
        except Exception as exc:  # noqa: BLE001 - the reader meets it again and raises it
            done[k] = False
            errors.append((urls[k], exc))


def _stop(stop: threading.Event, threads: list[threading.Thread], wait: float) -> None:
    stop.set()
    deadline = time.monotonic() + wait
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


_live: weakref.WeakSet = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    live = list(_live)
    for p in live:
        p._stop.set()
    deadline = time.monotonic() + _EXIT_JOIN_SECONDS
    for p in live:
        for thread in p._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


register_before_thread_join(_stop_all_at_exit)


class Prefetch:
    """Downloads ``urls`` into ``cache`` in this order (see the module; ``released``:
    :meth:`ShardCache.prefetch`): ``done`` maps each position finished to whether it
    succeeded, ``errors`` lists ``(url, error)`` of the failed ones (their reader retries and
    raises). ``close()`` stops it; so does leaving a ``with`` block, dropping it, or the
    interpreter's exit."""

    def __init__(self, cache: Any, urls: Sequence[str], released: Sequence[int] | None = None,
                 progress: Callable[[], int] | None = None) -> None:
        self.urls = list(urls)
        if released is not None:
            released = [int(r) for r in released]
            if len(released) != len(self.urls):
                raise ValueError(f"released has {len(released)} places for {len(self.urls)} "
                                 "objects")
        self.done: dict[int, bool] = {}
        self.errors: list[tuple[str, BaseException]] = []
        self._stop = threading.Event()
        self._finishing = threading.Event()
        work: queue.SimpleQueue = queue.SimpleQueue()
        downloads = cache.options.downloads
        self._threads = [threading.Thread(
            target=_follow, args=(cache, self.urls, released, progress, self._stop,
                                  self._finishing, work, downloads),
            name="fastpipe-prefetch", daemon=True)]
        self._threads += [threading.Thread(
            target=_download, args=(cache, self.urls, self._stop, self._finishing, work,
                                    self.done, self.errors),
            name=f"fastpipe-download-{k}", daemon=True) for k in range(downloads)]
        for thread in self._threads:
            thread.start()
        self._finalizer = weakref.finalize(self, _stop, self._stop, self._threads, 0.0)
        self._finalizer.atexit = False
        _live.add(self)

    @property
    def alive(self) -> bool:
        """Whether any of its threads still runs."""
        return any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until every object is handled (or ``timeout`` seconds); whether they are."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self.alive

    def close(self) -> None:
        """Stops the downloads (a request under way is cancelled, its ``.part`` removed) and
        waits for the threads."""
        if self._finalizer.detach() is not None:
            _stop(self._stop, self._threads, _JOIN_SECONDS)

    def finish(self) -> None:
        """Starts no further download, lets those under way complete (a reader would
        otherwise download the object again) and waits for the threads; interrupted (Ctrl-C),
        or called in a loader's thread whose consumer is gone (``cancelled_by``), it stops them
        as :meth:`close` does."""
        if not self._finalizer.alive:
            return
        self._finishing.set()
        cancel = stop_of(None)  # a loader thread's: its consumer gone, the downloads stop
        try:
            for thread in self._threads:
                while thread is not threading.current_thread() and thread.is_alive() and not (
                        cancel is not None and cancel.is_set()):
                    thread.join(_POLL_SECONDS)
        finally:
            self.close()

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
