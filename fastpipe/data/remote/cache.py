"""``ShardCache``: remote objects kept whole on this node's disk, shared by every rank and worker
of the node.

Layout under ``RemoteOptions.cache_dir``::

    objects/<ab>/<key>.lock        the entry's lock (flock): shared by every process reading
                                   the entry, exclusive only to evict it
    objects/<ab>/<key>.fetch       held by the one process downloading the entry
    objects/<ab>/<key>/<name>      the object's bytes, under the object's own file name
    objects/<ab>/<key>/.entry.json what they were written as: the object's size, ETag and checksum,
                                   and the file's size, inode and modification time
    objects/<ab>/<key>/.used       touched whenever a process starts reading the entry (LRU)
    objects/<ab>/<key>/.spent      touched when the node's readers need the entry no more in
                                   their pass (evicted first, until it is read again)
    objects/<ab>/<key>/<name>.<pid>.<thread>.part   a download under way
    cache.lock                     held while room is made (eviction) and a download reserves it
    usage.json                     the ledger: the bytes counted at the last full count (a
                                   listing of every entry) plus each download reserved since

An object is downloaded once per node: the process that finds its entry missing or not valid
takes the entry's fetch lock and downloads it; every other process that needs it waits for that
lock, then finds the entry valid. The bytes go to a ``.part`` file that is renamed into place
only when whole and checked, so no reader ever sees a partial file (a reader of an older copy
keeps its own); a ``.part`` left by a process that died is removed by the next one that makes
room or downloads the entry. An entry is valid when its file has the size, inode and
modification time it was written with and the object's size and ETag are still those recorded
(with ``check="content"``, also the checksum its download computed): a cached file damaged or
cut short is downloaded again.

While a process reads an entry it holds the entry's shared lock (a pin): eviction, which needs
the exclusive lock and never waits for it, passes over it. When the read is done the entry is
unpinned, and the hooks of :func:`add_unpin_hook` are told (the reader engine then unmaps the
file, so an evicted file's space is given back).

Eviction takes first the entries marked spent (:meth:`ShardCache.spent`: a prefetch marks
those the node's readers have passed) since they were written and last read, in the order they
were marked; then the rest by their last read; entries downloaded ahead and never read last.
A cache smaller than the dataset that evicted by the last read alone would evict, while a pass
reads in a new order, the entries it has yet to read as readily as those it has done with, and
fetch again most of what it evicted within the same pass.

Room is made against the ledger, not a listing of the cache: the cache is counted in full (and
entries evicted, in that order) only where the ledger says a download does not fit, is
missing or unreadable, or is ``RECOUNT_SECONDS`` old; an eviction frees a little more than the
download needs where the cache is large (``SPARE_ABOVE``), so that the next ones fit without
a count. The ledger can only count too much (an entry replaced or removed other than by
eviction stays in it until the next count), so the limit holds.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastpipe.data.remote import locks
from fastpipe.data.remote.checksums import computable, of_file
from fastpipe.data.remote.download import download
from fastpipe.data.remote.filesystems import ObjectInfo
from fastpipe.data.remote.filesystems import info as remote_info
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.retry import RemoteError
from fastpipe.data.remote.urls import basename, entry_key, redact

__all__ = ["Entry", "ShardCache", "add_unpin_hook"]

META = ".entry.json"
USED = ".used"
SPENT = ".spent"
PART = ".part"
# Entries a process keeps pinned after it stopped reading them (the most recently read). None:
# a pin held between batches would keep a shard from eviction in every worker that read it
# last, and pinning again costs tens of microseconds a batch.
IDLE_PINS = 0
# The check run on a downloaded file before it becomes the entry: raises where it is damaged.
Check = Callable[[str], None]
USAGE = "usage.json"
# Seconds a full count stays the ledger's base (bytes another program put in the cache, or an
# older fastpipe's downloads, are found within this).
RECOUNT_SECONDS = 60.0
# Listing a cache of more entries than SPARE_ABOVE is slow, and holds the node's lock: an
# eviction there leaves free, besides the download's size, the least of 1/32 of the limit and 64
# downloads of that size, so that a cache that streams is not listed for every download. A
# smaller cache is listed for every download that needs room, and keeps all that fits.
SPARE_ABOVE = 256


@dataclass(frozen=True)
class Entry:
    """Where one object lives in the cache."""

    url: str
    key: str
    folder: str
    data: str
    meta: str
    used: str
    lock: str
    fetch: str


class _Pins:
    """This process's pins: entries whose shared lock it holds, with the number of reads using
    each; unused ones kept (at most IDLE_PINS, the most recent) until others replace them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # lock path -> [descriptor, reads, data path, the file's (size, inode, time), the
        # object's (size, ETag)]
        self._held: dict[str, list[Any]] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()

    def acquire(self, path: str, identity: tuple[int, str | None]) -> bool:
        """Whether this process pins the entry of lock ``path``, validated for the object
        ``identity`` (size, ETag), with its file unchanged since (counted as one more read).
        An idle pin of another identity, or whose file changed (damaged or cut short on disk),
        is dropped."""
        with self._lock:
            held = self._held.get(path)
            if held is None:
                return False
            if held[4] == identity and _signature(held[2]) == held[3]:
                held[1] += 1
                self._idle.pop(path, None)
                return True
            if held[1]:
                return False  # read now by another thread: checked again, its lock kept
            del self._held[path]
            self._idle.pop(path, None)
            dropped = [(held[0], held[2])]
        _unpin(dropped)
        return False

    def add(self, path: str, fd: int, data: str, identity: tuple[int, str | None]) -> None:
        with self._lock:
            held = self._held.get(path)
            if held is None:
                self._held[path] = [fd, 1, data, _signature(data), identity]
                return
            held[1] += 1  # already held by a read of another thread: one lock is enough
            held[3], held[4] = _signature(data), identity
        locks.unlock(fd)

    def release(self, path: str) -> None:
        with self._lock:
            held = self._held.get(path)
            if held is None:  # held in the process this one was forked from
                return
            held[1] -= 1
            if held[1]:
                return
            self._idle[path] = None
            dropped = self._trim(IDLE_PINS)
        _unpin(dropped)

    def drop_idle(self) -> None:
        with self._lock:
            dropped = self._trim(0)
        _unpin(dropped)

    def _trim(self, keep: int) -> list[tuple[int, str]]:
        dropped = []
        while len(self._idle) > keep:
            path, _ = self._idle.popitem(last=False)
            fd, _, data, _, _ = self._held.pop(path)
            dropped.append((fd, data))
        return dropped

    def after_fork(self) -> None:
        # The descriptors were closed by the locks module (the locks stay the parent's).
        self._lock = threading.Lock()
        self._held = {}
        self._idle = OrderedDict()


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_ino, st.st_mtime_ns


_UNPIN_HOOKS: list[Callable[[str], None]] = []


def add_unpin_hook(hook: Callable[[str], None]) -> None:
    """Calls ``hook(path)`` whenever this process stops pinning a cached file (the reader
    engine forgets its mapping of the file, which may then be evicted)."""
    if hook not in _UNPIN_HOOKS:
        _UNPIN_HOOKS.append(hook)


def _unpin(dropped: list[tuple[int, str]]) -> None:
    for fd, data in dropped:
        locks.unlock(fd)
        for hook in _UNPIN_HOOKS:
            hook(data)


_PINS = _Pins()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_PINS.after_fork)

_warned_over_limit = False


class ShardCache:
    """A node's cache of remote objects (whole shards, packs, list files, images), in
    ``options.cache_dir``, at most ``options.cache_limit`` bytes (least recently used objects
    evicted first). Any number of instances, in any number of processes, may share a folder.

    :meth:`local_path` gives an object's local file, downloading it first where it is not
    cached (or not valid); :meth:`pinned` does so for several and keeps them from eviction while
    they are read; :meth:`prefetch` downloads objects in the order given, a few ahead of the
    reader. Reads of a cached file are reads of a local file.
    """

    def __init__(self, options: RemoteOptions | None = None) -> None:
        self.options = RemoteOptions.of(options)
        self.root = str(self.options.cache_dir)
        self.objects = os.path.join(self.root, "objects")
        os.makedirs(self.objects, exist_ok=True)
        self._cache_lock = os.path.join(self.root, "cache.lock")
        self._endpoint = self.options.endpoint()
        self._infos: dict[str, ObjectInfo] = {}

    def __repr__(self) -> str:
        limit = self.options.cache_limit
        return f"ShardCache({self.root!r}, cache_limit={limit if limit is None else int(limit)})"

    # ---------------------------------------------------------------------------- where

    def entry(self, url: str) -> Entry:
        key = entry_key(url, self._endpoint)
        shelf = os.path.join(self.objects, key[:2])
        folder = os.path.join(shelf, key)
        return Entry(url, key, folder, os.path.join(folder, basename(url)),
                     os.path.join(folder, META), os.path.join(folder, USED),
                     os.path.join(shelf, key + ".lock"), os.path.join(shelf, key + ".fetch"))

    def path_of(self, url: str) -> str:
        """The file ``url`` has in the cache (whether or not it is there now)."""
        return self.entry(url).data

    def learn(self, infos: Iterable[ObjectInfo]) -> None:
        """Remembers the size and ETag of objects listed elsewhere (no request for them)."""
        for found in infos:
            self._infos[found.url] = found

    def info_of(self, url: str, stop: threading.Event | None = None) -> ObjectInfo:
        found = self._infos.get(url)
        if found is None:
            found = self._infos[url] = remote_info(url, self.options, stop)
        return found

    # ---------------------------------------------------------------------------- reading

    def local_path(self, url: str, check: Check | None = None) -> str:
        """The local file of ``url``, downloaded first where the cache does not hold it whole
        and valid. ``check(path)`` is run on a new download before it becomes the entry (a
        pack's checksums), and raises where it is damaged."""
        with self.pinned([url], check) as paths:
            return paths[0]

    @contextlib.contextmanager
    def pinned(self, urls: Sequence[str], check: Check | None = None,
               stop: threading.Event | None = None, read: bool = True) -> Iterator[list[str]]:
        """The local files of ``urls`` (downloaded where needed), kept from eviction for the
        block. ``read=False`` (a prefetch) leaves them unmarked: neither read for the LRU nor
        the reader's position a prefetch follows."""
        taken: list[Entry] = []
        try:
            for url in urls:
                taken.append(self._ensure(url, check, stop, read))
            yield [e.data for e in taken]
        finally:
            for e in taken:
                _PINS.release(e.lock)

    def hold(self, url: str, check: Check | None = None) -> str:
        """The local file of ``url`` (downloaded where needed), kept from eviction until
        :meth:`release` in this process (a pack read for as long as its dataset lives)."""
        return self._ensure(url, check, None).data

    def release(self, url: str) -> None:
        """Ends one :meth:`hold` of ``url`` in this process."""
        _PINS.release(self.entry(url).lock)

    def holds(self, url: str) -> bool:
        """Whether the cache holds ``url`` whole and valid now (no download, no wait)."""
        e = self.entry(url)
        if not os.path.exists(e.lock):
            return False
        fd = locks.try_lock(e.lock, shared=True)
        if fd is None:
            return False
        try:
            return self._valid(e, self.info_of(url), None)
        finally:
            locks.unlock(fd)

    def prefetch(self, urls: Sequence[str], released: Sequence[int] | None = None,
                 progress: Callable[[], int] | None = None):
        """Downloads ``urls`` in this order in background threads (``options.downloads`` at
        once), keeping ``options.ahead`` of them beyond the last one a reader of this node has
        started reading; returns the :class:`~fastpipe.data.remote.prefetch.Prefetch`, whose
        ``close()`` (or the end of a ``with`` block) stops it. A download that fails is left to
        the reader, which retries it and raises its error.

        ``released[k]`` (a place in ``urls``): once the pass has reached that place,
        ``urls[k]`` is not needed again in it, and is marked :meth:`spent`: reached when a
        reader has started ``urls[released[k]]``, or, given ``progress``, when ``progress()``
        (the last place the pass has reached: everything it needed before that object was
        first needed is read; asked each time the prefetch looks) is at least ``released[k]``.
        The pass's objects lose the marks of earlier passes when it starts."""
        from fastpipe.data.remote.prefetch import Prefetch

        return Prefetch(self, list(urls), released, progress)

    def spent(self, url: str) -> None:
        """Marks ``url`` not needed again by this node's readers in their pass: the cache evicts
        it before the entries still needed, until a reader reads it again."""
        e = self.entry(url)
        if os.path.exists(e.data):
            _touch(os.path.join(e.folder, SPENT))

    def needed(self, urls: Iterable[str], before: int | None = None) -> None:
        """Takes the :meth:`spent` marks off ``urls`` (a pass about to read them); ``before``
        (a ``time.time_ns()``): only those made earlier (the marks of earlier passes, not those
        of the passes under way)."""
        for url in urls:
            path = os.path.join(self.entry(url).folder, SPENT)
            with contextlib.suppress(OSError):
                if before is None or os.stat(path).st_mtime_ns < before:
                    os.unlink(path)

    def used_since(self, url: str, since_ns: int) -> bool:
        """Whether a reader of this node started reading ``url`` from the cache at or after
        ``since_ns`` (``time.time_ns()``)."""
        try:
            return os.stat(self.entry(url).used).st_mtime_ns >= since_ns
        except OSError:
            return False

    # ---------------------------------------------------------------------------- the entry

    def _ensure(self, url: str, check: Check | None, stop: threading.Event | None,
                read: bool = True) -> Entry:
        e = self.entry(url)
        found = self.info_of(url, stop)
        identity = (found.size, found.etag)
        if _PINS.acquire(e.lock, identity):
            return e
        os.makedirs(os.path.dirname(e.lock), exist_ok=True)
        while True:
            # The shared lock keeps the entry from eviction; it waits only for an eviction.
            fd = locks.lock(e.lock, shared=True, stop=stop)
            try:
                if not self._valid(e, found, check):
                    # One download per node: the others wait for it, then find it valid.
                    fetching = locks.lock(e.fetch, shared=False, stop=stop)
                    try:
                        if not self._valid(e, found, check):
                            self._fill(e, found, check, stop)
                    finally:
                        locks.unlock(fetching)
                    if not self._valid(e, found, check):
                        locks.unlock(fd)
                        continue
            except BaseException:
                locks.unlock(fd)
                raise
            _PINS.add(e.lock, fd, e.data, identity)
            if read:
                _touch(e.used)
            return e

    def _valid(self, e: Entry, found: ObjectInfo, check: Check | None) -> bool:
        try:
            with open(e.meta, encoding="utf-8") as f:
                meta = json.load(f)
            st = os.stat(e.data)
        except (OSError, ValueError):
            return False
        if not isinstance(meta, dict):
            return False
        if not (meta.get("size") == st.st_size == found.size
                and meta.get("mtime_ns") == st.st_mtime_ns and meta.get("ino") == st.st_ino
                and (found.etag is None or meta.get("etag") == found.etag)):
            return False
        if check is not None and not meta.get("checked"):
            return False
        if self.options.check == "content":
            return _same_content(e.data, meta.get("checksum"))
        return True

    def _fill(self, e: Entry, found: ObjectInfo, check: Check | None,
              stop: threading.Event | None) -> None:
        """Downloads the object into its entry (the caller holds its fetch lock, and a shared
        lock of the entry); the file is replaced whole, so readers of the old one keep it."""
        os.makedirs(e.folder, exist_ok=True)
        _remove_parts(e)
        if self.options.cache_limit is not None:
            _PINS.drop_idle()  # this process's idle pins may be what has to go
        part = self._reserve(e, found.size, stop)
        try:
            got = download(found, part, self.options, stop)
            if got.expected is not None and not got.matches:
                # Downloaded again: bytes that match are the object's; two equal downloads
                # that do not are too where the expected MD5 is an S3 ETag (an encrypted
                # object's ETag is not their MD5, on a store whose answer does not say it is
                # encrypted); otherwise the object changed meanwhile or the transfer is damaged.
                again = download(found, part, self.options, stop)
                if not again.matches and not (again.checksum == got.checksum
                                              and got.expected.etag):
                    self._unchanged(e, found, stop)
                    raise RemoteError(
                        f"{redact(e.url)}: its bytes do not match the {got.expected.algorithm} "
                        "checksum the store states for them, downloaded twice: the transfer is "
                        "damaged (a proxy or the network); try again", redact(e.url), 2)
                got = again
            # Bytes that match a checksum the listing or the store states, or that were asked
            # for as the listed version, are that object: asking the store again would say
            # nothing more. Otherwise it may have been rewritten meanwhile.
            if not (got.matches or got.as_listed):
                self._unchanged(e, found, stop)
            if check is not None:
                check(part)
            os.replace(part, e.data)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(part)
            raise
        st = os.stat(e.data)
        fetched = time.time_ns()
        meta = {"url": redact(e.url), **found.to_json(),
                "checksum": [got.checksum.algorithm, got.checksum.value], "size": st.st_size,
                "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "fetched_ns": fetched,
                "checked": check is not None}
        tmp = f"{e.meta}.{os.getpid()}.{threading.get_ident()}{PART}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f)
        os.replace(tmp, e.meta)

    def _unchanged(self, e: Entry, found: ObjectInfo, stop: threading.Event | None) -> None:
        """Raises the error naming an object that is no longer as it was listed."""
        now = remote_info(e.url, self.options, stop)
        if now.size != found.size or (found.etag and now.etag != found.etag):
            raise RemoteError(
                f"{redact(e.url)} changed while it was listed and downloaded (size "
                f"{found.size} -> {now.size}, ETag {found.etag} -> {now.etag}): the data was "
                "rewritten under the run; start again once it is stable", redact(e.url))

    def _reserve(self, e: Entry, size: int, stop: threading.Event | None) -> str:
        """A new ``.part`` file of ``size`` bytes for the entry, made under the cache's lock
        after room was made for it (so that concurrent downloads count one another)."""
        part = f"{e.data}.{os.getpid()}.{threading.get_ident()}{PART}"
        fd = locks.lock(self._cache_lock, shared=False, stop=stop)
        try:
            self._make_room(size, self.options.cache_limit)
            out = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                          | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                _allocate(out, size, part)
            except BaseException:
                os.close(out)
                os.unlink(part)
                raise
            os.close(out)
        finally:
            locks.unlock(fd)
        return part

    # ---------------------------------------------------------------------------- eviction

    def usage(self) -> int:
        """Bytes the cache holds now (objects and downloads under way)."""
        return sum(item[1] for item in self._scan())

    def _scan(self) -> list[tuple[tuple[int, int], int, str]]:
        """((rank, time), bytes, entry folder) of every entry, in the order of eviction by
        their first item (the module's): spent since last read (0, marked), read (1, last
        read), never read (2, written); ``.part`` files whose writer is gone are removed on the
        way."""
        found = []
        for shelf in _listdir(self.objects):
            shelf_path = os.path.join(self.objects, shelf)
            if not os.path.isdir(shelf_path):
                continue
            for name in _listdir(shelf_path):
                folder = os.path.join(shelf_path, name)
                if name.endswith((".lock", ".fetch")) or not os.path.isdir(folder):
                    continue
                size, parts, used, spent, written = 0, [], None, None, 0
                for file in _listdir(folder):
                    path = os.path.join(folder, file)
                    try:
                        st = os.stat(path)
                    except OSError:
                        continue
                    if file.endswith(PART):
                        parts.append((path, st.st_size))
                    elif file == USED:
                        used = st.st_mtime_ns
                    elif file == SPENT:
                        spent = st.st_mtime_ns
                    elif file == META:
                        written = st.st_mtime_ns
                    else:
                        size += st.st_size
                if parts:
                    size += self._stale_parts(folder + ".fetch", parts)
                # A mark older than the copy (left by one evicted) is not the copy's.
                if spent is not None and spent > written and (used is None or spent > used):
                    rank = (0, spent)
                else:
                    rank = (1, used) if used is not None else (2, written)
                found.append((rank, size, folder))
        return found

    def _stale_parts(self, lock_path: str, parts: list[tuple[str, int]]) -> int:
        """Removes the ``.part`` files of an entry nobody is downloading; the bytes of those
        being written."""
        fd = locks.try_lock(lock_path, shared=False)  # a download holds it while it writes
        if fd is None:
            return sum(size for _, size in parts)
        try:
            for path, _ in parts:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        finally:
            locks.unlock(fd)
        return 0

    def _make_room(self, size: int, limit: int | None) -> None:
        """Adds ``size`` bytes to the ledger (the caller holds the cache's lock), counting the
        cache in full and evicting first where the ledger cannot say they fit under
        ``limit``. Without a limit, only a ledger that exists is added to (processes with a
        limit share it)."""
        path = os.path.join(self.root, USAGE)
        counted = _read_ledger(path)
        if limit is None:
            if counted is not None:
                _write_ledger(path, counted[0] + size, counted[1])
            return
        now = time.time_ns()
        if (counted is None or counted[0] + size > limit
                or not 0 <= now - counted[1] <= RECOUNT_SECONDS * 1e9):
            counted = (self._evict(size, limit), now)
        _write_ledger(path, counted[0] + size, counted[1])

    def _evict(self, size: int, limit: int) -> int:
        """Counts the cache in full and evicts entries (spent, then read longest ago, then
        never read) until ``size`` more bytes fit (with a spare in a large cache:
        ``SPARE_ABOVE``); returns the bytes it holds then."""
        global _warned_over_limit
        entries = self._scan()
        total = sum(item[1] for item in entries)
        goal = limit - (min(limit // 32, 64 * size) if len(entries) > SPARE_ABOVE else 0)
        # Spent ones first, then those read longest ago; downloaded ahead and never read last.
        for _, held, folder in sorted(entries):
            if total + size <= goal:
                break
            if not held:
                continue
            fd = locks.try_lock(folder + ".lock", shared=False)
            if fd is None:
                continue  # being read or downloaded
            try:
                for file in _listdir(folder):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(folder, file))
            finally:
                locks.unlock(fd)
            total -= held
        if total + size > limit and not _warned_over_limit:
            _warned_over_limit = True
            warnings.warn(
                f"the cache in {self.root} holds {total} bytes in objects being read or "
                f"downloaded, and {size} more are needed: more than cache_limit={limit}; it goes "
                "over the limit for now: raise RemoteOptions(cache_limit=...) to at least the "
                "objects read at once on this node (ranks x workers x shards each) plus those "
                "fetched ahead", RuntimeWarning, stacklevel=2)
        return total


def _read_ledger(path: str) -> tuple[int, int] | None:
    """(bytes, when they were counted in full) from the ledger; None where it is missing or
    unreadable (cut short by a process killed while writing it)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        counted, when = doc["bytes"], doc["counted_ns"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if type(counted) is not int or type(when) is not int or counted < 0:
        return None
    return counted, when


def _write_ledger(path: str, counted: int, when: int) -> None:
    # A ledger that could not be written whole is unreadable: the next download counts the cache.
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as f:
        json.dump({"bytes": counted, "counted_ns": when}, f)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _touch(path: str) -> None:
    """Sets the file's times to now (``time.time_ns()``), making it first where it is missing:
    a new file's own time is the kernel's coarse clock, up to a tick (milliseconds) behind."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            with open(path, "ab"):
                pass
            os.utime(path, ns=(now, now))
    except OSError:
        pass


def _remove_parts(e: Entry) -> None:
    """The ``.part`` files of downloads of the entry that ended without finishing."""
    for file in _listdir(e.folder):
        if file.endswith(PART):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(e.folder, file))


def _allocate(fd: int, size: int, path: str) -> None:
    """Reserves ``size`` bytes for the file (so that a full disk fails now, not mid-download,
    and concurrent downloads see each other's size)."""
    if not size:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"no room for {size} bytes in the cache folder "
                          f"({os.path.dirname(path)}): free disk space or lower "
                          "RemoteOptions(cache_limit=...)") from None
        os.ftruncate(fd, size)  # a file system without fallocate
    except AttributeError:
        os.ftruncate(fd, size)


def _same_content(path: str, recorded: Any) -> bool:
    """Whether the file has the checksum ``recorded`` (``[algorithm, value]``; an entry
    without one, written by an older fastpipe, has not been confirmed)."""
    if not (isinstance(recorded, list) and len(recorded) == 2
            and isinstance(recorded[0], str) and computable(recorded[0])):
        return False
    try:
        found = of_file(path, recorded[0])
    except OSError:
        return False
    return [found.algorithm, found.value] == recorded
