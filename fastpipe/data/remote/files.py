"""``RemoteFiles``: the remote objects a source reads (tar shards, a pack, images), named once
when the source is built and read through the node's cache.

It travels with the source to worker processes (the URLs, their sizes and ETags, the options);
the cache is opened in each process on first use. :meth:`RemoteFiles.pinned` gives the local
files of the objects a read needs, downloaded where they are not cached, and keeps them from
eviction while they are read.
"""

from __future__ import annotations

import contextlib
import glob as globbing
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastpipe.data.remote.cache import Check, ShardCache
from fastpipe.data.remote.filesystems import ObjectInfo, info, list_objects
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.prefetch import Prefetch
from fastpipe.data.remote.urls import expand_braces, is_url, redact

__all__ = ["RemoteFiles", "in_threads", "is_remote"]


def _release(cache: ShardCache, pid: int, urls: list[str]) -> None:
    if os.getpid() == pid:
        for url in urls:
            cache.release(url)

T = TypeVar("T")


def is_remote(value: Any) -> bool:
    """Whether ``value`` names remote objects: a URL, or a non-empty list of URLs only."""
    if is_url(value):
        return True
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, os.PathLike))
                                                          for v in value):
        urls = [is_url(v) for v in value]
        if any(urls) and not all(urls):
            raise ValueError("a list of shards holds both URLs and local paths; give all of "
                             "them as URLs or all as local paths")
        return all(urls)
    return False


def in_threads(call: Callable[[T, threading.Event], Any], items: Sequence[T],
               threads: int, done: Callable[[], Any] | None = None) -> list[Any]:
    """``[call(item, stop) for item in items]`` on ``threads`` threads, in order; an error or
    Ctrl-C stops the others (``stop`` is set; those not started are cancelled) before it is
    raised, and every thread has ended when this returns. ``done()`` is called in this thread
    as each result is taken, in order (a progress display's update)."""
    stop = threading.Event()
    done = done or (lambda: None)
    if len(items) <= 1 or threads <= 1:
        return [_then(call(item, stop), done) for item in items]
    pool = ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="fastpipe-remote")
    try:
        futures = [pool.submit(call, item, stop) for item in items]
        return [_then(f.result(), done) for f in futures]
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


def _then(result: Any, done: Callable[[], Any]) -> Any:
    done()
    return result


class RemoteFiles:
    """Remote objects read through the cache of ``options`` (see the module): ``infos``, in
    order, each an :class:`ObjectInfo` (URL, size, ETag) or a URL whose size and ETag are asked
    for when it is first read (the files a list names, too many to ask for up front)."""

    def __init__(self, infos: Sequence[ObjectInfo | str], options: RemoteOptions) -> None:
        self.infos: list[ObjectInfo | None] = [None if isinstance(i, str) else i for i in infos]
        self.options = options
        self.urls = [i if isinstance(i, str) else i.url for i in infos]

    @classmethod
    def listed(cls, spec: str | Sequence[str], options: RemoteOptions,
               suffixes: tuple[str, ...], what: str) -> RemoteFiles:
        """The objects ``spec`` names: a URL list as given, a pattern's matches (``*``, ``?``,
        ``[...]``, and ``{000..099}`` / ``{a,b}`` ranges as WebDataset writes them), a folder's
        objects ending in ``suffixes`` (sorted), or one object."""
        if isinstance(spec, (list, tuple)):
            urls = [os.fspath(u) for u in spec]
            if not urls:
                raise ValueError(f"no {what} given")
            return cls(in_threads(lambda u, stop: info(u, options, stop), urls,
                                  options.downloads), options)
        url = os.fspath(spec)
        expanded = expand_braces(url)
        if len(expanded) > 1 or expanded[0] != url:
            return cls.listed(expanded, options, suffixes, what)
        if globbing.has_magic(url.split("://", 1)[1]):
            found = list_objects(url, options, glob=True)
            if not found:
                raise FileNotFoundError(f"no {what} match {redact(url)}")
            return cls(list(found.values()), options)
        if not url.endswith("/"):
            try:
                return cls([info(url, options)], options)
            except (FileNotFoundError, IsADirectoryError):
                pass  # a folder named without its trailing slash
        folder = url.rstrip("/") + "/"
        found = list_objects(folder, options)
        inside = [i for u, i in found.items() if u.lower().endswith(suffixes)
                  and "/" not in u[len(folder):].strip("/")]
        if not inside:
            if found:
                raise FileNotFoundError(f"{redact(folder)} holds no {what} "
                                        f"({', '.join(suffixes)})")
            raise FileNotFoundError(f"{redact(url)} does not exist")
        return cls(inside, options)

    @property
    def cache(self) -> ShardCache:
        """This process's cache (opened on first use)."""
        state = self.__dict__.get("_cache")
        if state is None or state[0] != os.getpid():
            cache = ShardCache(self.options)
            cache.learn(i for i in self.infos if i is not None)
            state = self.__dict__["_cache"] = (os.getpid(), cache)
        return state[1]

    def __len__(self) -> int:
        return len(self.infos)

    @property
    def paths(self) -> list[str]:
        """The local file each object has in the cache (whether or not it is there now)."""
        return [self.cache.path_of(u) for u in self.urls]

    def at_once(self) -> int:
        """How many of the objects to download at once: ``options.downloads``, at most as many
        as the cache holds (several of the largest)."""
        limit = self.options.cache_limit
        sizes = [i.size for i in self.infos if i is not None]
        if limit is None or not sizes:
            return self.options.downloads
        largest = max(1, max(sizes))
        return max(1, min(self.options.downloads, limit // largest))

    def names(self) -> list[str]:
        """The objects as messages name them (no credentials)."""
        return [redact(u) for u in self.urls]

    @contextlib.contextmanager
    def pinned(self, ids: Sequence[int], check: Check | None = None,
               stop: threading.Event | None = None) -> Iterator[list[str]]:
        """The local files of objects ``ids`` (downloaded where needed), kept from eviction for
        the block."""
        with self.cache.pinned([self.urls[k] for k in ids], check, stop) as paths:
            yield paths

    def prefetch(self, ids: Sequence[int], released: Sequence[int] | None = None,
                 progress: Callable[[], int] | None = None) -> Prefetch:
        """Downloads objects ``ids`` in this order, ``options.ahead`` past the reader (see
        :meth:`ShardCache.prefetch`)."""
        return self.cache.prefetch([self.urls[k] for k in ids], released, progress)

    def digest(self, h: Any) -> None:
        """Adds what identifies the objects (URLs without credentials, sizes, ETags) to
        ``h``."""
        for url, i in zip(self.urls, self.infos):
            known = "" if i is None else f"{i.size}\0{i.etag}"
            h.update(f"{redact(url)}\0{known}\1".encode())

    def keep(self, k: int, check: Check | None = None) -> str:
        """The local file of object ``k`` (downloaded where needed, ``check``-ed when it is),
        kept from eviction as long as this object lives: in this process, and in those it is
        sent to (a spawned worker downloads it again where the cache lost it)."""
        path = self.cache.hold(self.urls[k], check)
        kept = self.__dict__.setdefault("_kept", {})
        kept[k] = check
        holding = self.__dict__.get("_holding")
        if holding is None or holding[0] != os.getpid():
            holding = self.__dict__["_holding"] = (os.getpid(), [])
            weakref.finalize(self, _release, self.cache, os.getpid(), holding[1])
        holding[1].append(self.urls[k])
        return path

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_cache", None)
        state.pop("_holding", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for k, check in list(state.get("_kept", {}).items()):
            self.keep(k, check)

    def __repr__(self) -> str:
        first = redact(self.urls[0]) if self.urls else ""
        return f"RemoteFiles({len(self)} objects, first {first!r})"
