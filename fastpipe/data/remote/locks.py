"""Locks every process of a node sees: ``flock`` on a lock file, shared (readers of an object)
or exclusive (its one download, its eviction).

Separate opens of a lock file exclude each other, in one process or several, so threads, forked
and spawned workers and the ranks of a node all wait for one another the same way. A wait tries
the lock without blocking and sleeps in between, so that a stop event (a prefetch closed) or
Ctrl-C ends it at once. A forked child closes its copies of the parent's lock descriptors
without unlocking them: the locks stay the parent's, and end with it. The cache must be on a
local file system (``flock`` on NFS is per process, not per open).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

from fastpipe._threads import stop_of
from fastpipe.data.remote.retry import Cancelled

__all__ = ["lock", "try_lock", "unlock"]

# The first and the longest sleep between two tries of a lock that is held.
_FIRST_SLEEP = 0.001
_LONGEST_SLEEP = 0.05

_held: set[int] = set()
_held_lock = threading.Lock()


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)


def try_lock(path: str, shared: bool) -> int | None:
    """The descriptor of ``path`` locked (shared or exclusive), or None where another holds it
    in a way that excludes this."""
    fd = _open(path)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    with _held_lock:
        _held.add(fd)
    return fd


def lock(path: str, shared: bool, stop: threading.Event | None = None) -> int:
    """The descriptor of ``path`` locked, waiting as long as another holds it; ``stop`` (set
    from another thread) ends the wait with :class:`~fastpipe.data.remote.retry.Cancelled`."""
    sleep = _FIRST_SLEEP
    stop = stop_of(stop)
    while True:
        fd = try_lock(path, shared)
        if fd is not None:
            return fd
        if stop is not None:
            if stop.wait(sleep):
                raise Cancelled()
        else:
            time.sleep(sleep)  # Ctrl-C interrupts it
        sleep = min(_LONGEST_SLEEP, sleep * 2)


def unlock(fd: int) -> None:
    """Releases the lock and closes its descriptor (unlocked first: a forked child may still
    hold a copy of the descriptor)."""
    with _held_lock:
        _held.discard(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _after_fork_in_child() -> None:
    global _held_lock
    _held_lock = threading.Lock()
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
