"""The file systems behind URLs: fsspec and its backends, imported on first use (a missing one
is an error naming the extra that installs it), one instance per protocol and options in each
process, and the few calls fastpipe makes of them (an object's size and ETag, a byte range, a
listing), each bounded by the options' timeout and stoppable from another thread.

The backends' own retry loops are turned off (botocore's where the options do not set them,
gcsfs's and huggingface_hub's reads always), so that one budget,
:class:`~fastpipe.data.remote.options.RemoteOptions`' ``retries``, decides how long a failing
store is waited for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import hashlib
import importlib.metadata
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastpipe._compat import s3_request
from fastpipe._optional import require
from fastpipe._threads import stop_of
from fastpipe.data.remote.checksums import Checksum
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.retry import Cancelled, attempt
from fastpipe.data.remote.urls import protocol, redact

__all__ = ["EXTRAS", "ObjectInfo", "S3Stream", "children", "filesystem", "head", "info",
           "list_objects", "read_range"]

# protocol -> (module the backend is, pip name, fastpipe's extra)
EXTRAS = {
    "s3": ("s3fs", "s3fs", "s3"), "s3a": ("s3fs", "s3fs", "s3"),
    "gs": ("gcsfs", "gcsfs", "gcs"), "gcs": ("gcsfs", "gcsfs", "gcs"),
    "hf": ("huggingface_hub", "huggingface_hub", "hf"),
    "http": ("aiohttp", "aiohttp", "remote"), "https": ("aiohttp", "aiohttp", "remote"),
}
# How often a wait for a request looks at the stop event.
_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class ObjectInfo:
    """What identifies an object's bytes: its size and ETag (or the store's content hash), and
    the checksums of its bytes its listing states (a plain S3 ETag's MD5, Cloud Storage's
    md5Hash and crc32c)."""

    url: str
    size: int
    etag: str | None = None
    checksums: tuple[Checksum, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "etag": self.etag,
                "checksums": [[c.algorithm, c.value] for c in self.checksums]}


def _extra(proto: str) -> str:
    return EXTRAS.get(proto, (None, None, "remote"))[2]


def _fsspec(proto: str) -> Any:
    return require("fsspec", extra=_extra(proto), feature=f"reading {proto}:// URLs")


def _backend_class(proto: str) -> Any:
    fsspec = _fsspec(proto)
    module, package, extra = EXTRAS.get(proto, (None, None, "remote"))
    if module is not None:
        require(module, extra=extra, package=package, feature=f"reading {proto}:// URLs")
    try:
        return fsspec.get_filesystem_class(proto)
    except (ImportError, ValueError) as exc:
        raise ImportError(f"reading {proto}:// URLs needs fsspec's backend for {proto!r}, which "
                          f"is not available ({exc}); install it (pip install 'fastpipe[remote]' "
                          "and the package fsspec names)") from None


# Google's own endpoint: the one gcsfs's default class also reaches Google's gRPC APIs through.
_GOOGLE_STORAGE = "https://storage.googleapis.com"


def _backend(proto: str, storage_options: Mapping[str, Any]) -> Any:
    """The class that serves ``proto`` with these options. For ``gs://`` at an endpoint other
    than Google's (an emulator, a GCS-compatible store: ``endpoint_url`` or the
    ``STORAGE_EMULATOR_HOST`` gcsfs reads), gcsfs's JSON-API class: its default class asks
    Google's Storage Control gRPC API for each bucket's layout before a listing or a read, which
    such an endpoint does not serve, so that every call would wait for that request's 60 s
    timeout (and not remember the failure)."""
    cls = _backend_class(proto)
    if proto in ("gs", "gcs"):
        endpoint = storage_options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
        if endpoint and str(endpoint).rstrip("/") != _GOOGLE_STORAGE:
            from gcsfs.core import GCSFileSystem as cls
        cls = _tried_once(cls)
    elif proto == "hf":
        cls = _hub_ranges_once(cls)
    return cls


# The classes _tried_once and _hub_ranges_once made, by the backend class they wrap.
_ONCE: dict[type, type] = {}


def _tried_once(cls: type) -> type:
    """gcsfs's class with each request made once: gcsfs retries every failed request itself,
    up to six times with waits of 1 to 16 s, inside each of fastpipe's attempts, so that a store
    answering 503s (or cutting bodies short) would be named only after minutes whatever
    ``RemoteOptions(retries=, backoff=)`` say. fastpipe's :func:`attempt` retries instead. A gcsfs
    whose requests are not wrapped that way is used as it is."""
    made = _ONCE.get(cls)
    if made is None:
        raw = getattr(cls._request, "__wrapped__", None)
        made = cls if raw is None else type(cls.__name__, (cls,), {
            "_request": raw, "__module__": __name__,
            "__doc__": f"{cls.__module__}.{cls.__qualname__}, each request made once"})
        _ONCE[cls] = made
    return made


def _hub_ranges_once(cls: type) -> type:
    """huggingface_hub's file system with ``cat_file`` (the one call fastpipe reads bytes with)
    as one range request bounded by the options' timeout: its own reads go through buffered
    files that retry each request five times with waits of up to 8 s, under the library's own
    timeout, so that a Hub answering 503s would be named after a minute and more whatever
    ``RemoteOptions`` say, and a slow answer waited for past ``timeout``."""
    made = _ONCE.get(cls)
    if made is None:
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

        version = _version()

        def cat_file(self: Any, path: str, start: int | None = None, end: int | None = None,
                     **kwargs: Any) -> bytes:
            headers = build_hf_headers(token=self.token, library_name="fastpipe",
                                       library_version=version)
            if start is not None or end is not None:
                last = "" if end is None else str(end - 1)
                headers["range"] = f"bytes={start or 0}-{last}"
            answer = http_backoff("GET", self.url(path), headers=headers, max_retries=0,
                                  timeout=self.fastpipe_timeout)
            hf_raise_for_status(answer)
            return answer.content

        made = _ONCE[cls] = type(cls.__name__, (cls,), {
            "cat_file": cat_file, "fastpipe_timeout": 60.0, "__module__": __name__,
            "__doc__": f"{cls.__module__}.{cls.__qualname__}, its ranges read once"})
    return made


def _version() -> str | None:
    try:
        return importlib.metadata.version("fastpipe")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was not installed
        return None


def _with_defaults(proto: str, given: Mapping[str, Any], options: RemoteOptions) -> dict:
    """The storage options with fastpipe's defaults where the user set none: requests bounded
    by ``options.timeout``, and the backend's own retries off (fastpipe retries)."""
    so = copy.deepcopy(dict(given))
    if proto in ("s3", "s3a"):
        config = dict(so.get("config_kwargs") or {})
        config.setdefault("retries", {"max_attempts": 1})
        config.setdefault("connect_timeout", options.timeout)
        config.setdefault("read_timeout", options.timeout)
        # A download holds a connection for its whole object: room for many at once.
        config.setdefault("max_pool_connections", 64)
        so["config_kwargs"] = config
    elif proto in ("http", "https"):
        client = dict(so.get("client_kwargs") or {})
        if "timeout" not in client:
            aiohttp = require("aiohttp", extra="remote", feature="reading http(s):// URLs")
            client["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=options.timeout,
                                                      sock_read=options.timeout)
        so["client_kwargs"] = client
    return so


class _Instances:
    """This process's file systems, one per protocol and options (a child of a fork makes its
    own: the parent's event loop does not run in it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[tuple[str, str], Any] = {}
        # The parent's botocore sessions, in a child of a fork: the service models they parsed
        # are given to the child's S3 clients (half of a client's making is parsing them, about
        # 50 ms of CPU paid by every worker process of every epoch that reads s3://).
        self._parents: list[Any] = []

    def get(self, proto: str, options: RemoteOptions) -> Any:
        key = (proto, _token(options.storage_options, options.timeout))
        fs = self._made.get(key)
        if fs is not None:
            return fs
        with self._lock:
            fs = self._made.get(key)
            if fs is None:
                so = _with_defaults(proto, options.storage_options, options)
                cls = _backend(proto, so)
                fs = cls(skip_instance_cache=True, **so)
                if proto in ("s3", "s3a") and self._parents and fs.session is None:
                    _with_models(fs, self._parents)
                if hasattr(fs, "fastpipe_timeout"):
                    fs.fastpipe_timeout = options.timeout
                self._made[key] = fs
            return fs

    def after_fork(self) -> None:
        self._parents = [fs.session for fs in self._made.values()  # s3fs's, not sockets
                         if hasattr(fs, "_call_s3") and fs.session is not None] + self._parents
        self._lock = threading.Lock()
        self._made = {}


def _with_models(fs: Any, sessions: list[Any]) -> None:
    """Gives s3fs's ``fs`` the session s3fs would make, with the loader of service models of
    one of ``sessions`` (a parent's; botocore's, whose only state is what it parsed)."""
    from aiobotocore.session import AioSession

    models = next((s.get_component("data_loader") for s in sessions
                   if hasattr(s, "get_component")), None)
    if models is not None:
        session = AioSession(**fs.kwargs)
        session.register_component("data_loader", models)
        fs.session = session


def _token(storage_options: Mapping[str, Any], timeout: float) -> str:
    return hashlib.sha256(repr((sorted((str(k), repr(v)) for k, v in storage_options.items()),
                                timeout)).encode()).hexdigest()


_INSTANCES = _Instances()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_INSTANCES.after_fork)


def filesystem(url: str, options: RemoteOptions) -> tuple[Any, str]:
    """The file system of ``url`` and the path it takes (``bucket/key`` for ``s3://``)."""
    proto = protocol(url)
    fs = _INSTANCES.get(proto, options)
    return fs, _fsspec(proto).core.strip_protocol(url)


def _run(fs: Any, name: str, *args: Any, options: RemoteOptions,
         stop: threading.Event | None = None, **kwargs: Any) -> Any:
    """``fs.<name>(*args, **kwargs)``: on an async file system, its coroutine on fsspec's loop
    (:func:`_await`); on any other, the call itself."""
    coroutine = getattr(fs, "_" + name, None) if getattr(fs, "async_impl", False) else None
    if coroutine is None:
        return getattr(fs, name)(*args, **kwargs)
    return _await(fs, lambda: coroutine(*args, **kwargs), options, stop)


def _await(fs: Any, make: Callable[[], Awaitable[Any]], options: RemoteOptions,
           stop: threading.Event | None = None,
           dropped: Callable[[Any], None] | None = None) -> Any:
    """The result of the coroutine ``make()`` run on the async file system's loop, cancelled
    after ``options.timeout`` seconds, when ``stop`` is set, or on Ctrl-C. ``dropped`` is given
    a result that came after the caller stopped waiting (an open answer to close)."""

    async def timed() -> Any:
        return await asyncio.wait_for(make(), options.timeout)

    stop = stop_of(stop)
    future = asyncio.run_coroutine_threadsafe(timed(), fs.loop)
    try:
        # Waits without result(timeout=): its TimeoutError is the request's own timeout too.
        while not concurrent.futures.wait([future], timeout=_POLL_SECONDS).done:
            if stop is not None and stop.is_set():
                raise Cancelled()
        return future.result()
    finally:
        if not future.done():
            future.cancel()
            if dropped is not None:
                future.add_done_callback(lambda done: _drop(done, dropped))


def _drop(done: concurrent.futures.Future, dropped: Callable[[Any], None]) -> None:
    if not done.cancelled() and done.exception() is None:
        dropped(done.result())


def _etag(found: Mapping[str, Any]) -> tuple[str | None, tuple[Checksum, ...]]:
    """(ETag or content hash, checksums of the bytes) from a backend's info."""
    etag = found.get("ETag") or found.get("etag")
    checksums = []
    if isinstance(etag, str):
        etag = etag.strip('"')
        if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag.lower()):
            checksums.append(Checksum("md5", etag.lower(), etag=True))  # a single S3 upload's
    if found.get("md5Hash"):  # Cloud Storage: base64 of the MD5
        import base64
        import binascii

        try:
            checksums = [Checksum("md5", base64.b64decode(found["md5Hash"]).hex())]
        except (binascii.Error, ValueError):
            pass
        etag = etag or found["md5Hash"]
    if isinstance(found.get("crc32c"), str):  # Cloud Storage: base64 of the big-endian CRC
        checksums.append(Checksum("crc32c", found["crc32c"]))
    if etag is None:
        lfs = found.get("lfs")
        etag = (lfs.get("sha256") or lfs.get("oid")) if isinstance(lfs, Mapping) else None
        etag = etag or found.get("blob_id") or found.get("sha256")
    return (str(etag) if etag else None), tuple(checksums)


def _object_info(url: str, found: Mapping[str, Any]) -> ObjectInfo:
    size = found.get("size")
    if size is None:
        raise OSError(f"{redact(url)}: the server gives no size for it (no Content-Length); "
                      "fastpipe reads objects whose size is known")
    etag, checksums = _etag(found)
    return ObjectInfo(url, int(size), etag, checksums)


def info(url: str, options: RemoteOptions, stop: threading.Event | None = None) -> ObjectInfo:
    """The size and ETag of the object ``url`` (retried; a missing one is FileNotFoundError)."""
    fs, path = filesystem(url, options)

    def ask() -> Any:
        return attempt(lambda: _run(fs, "info", path, options=options, stop=stop), url,
                       "asking for its size", options, stop)

    try:
        found = ask()
    except FileNotFoundError:
        # The backend answers from a listing of the folder it cached earlier in this process
        # (s3fs does), which may predate the object: asked again without it.
        fs.invalidate_cache(path)
        found = ask()
    if found.get("type") == "directory" or (  # an HTTP server's index page of a folder
            found.get("size") is None and str(found.get("url", "")).endswith("/")):
        raise IsADirectoryError(f"{redact(url)} is a folder, not an object")
    return _object_info(url, found)


def read_range(url: str, start: int, end: int, options: RemoteOptions,
               stop: threading.Event | None = None) -> bytes:
    """Bytes ``[start, end)`` of ``url``, in one request (not retried here: the caller decides
    what a failure means)."""
    fs, path = filesystem(url, options)
    return _run(fs, "cat_file", path, start=start, end=end, options=options, stop=stop)


class S3Stream:
    """An open GET of the S3 object ``info`` from byte ``start`` to its end, read in pieces
    (:meth:`read`), each bounded by the options' timeout and stoppable like a request.
    ``response`` is the GET's answer without its body: a GET from byte 0 asks for the object's
    checksums (``ChecksumMode``), which S3 states only for the whole object; every GET asks for
    the listed version of the object (``If-Match`` its ETag: a rewritten object is answered 412),
    and an answer that is not of it (another ETag, another length, another range: a store that
    ignores the conditions) is refused, naming the object."""

    def __init__(self, info: ObjectInfo, start: int, options: RemoteOptions,
                 stop: threading.Event | None = None) -> None:
        self._fs, path = filesystem(info.url, options)
        self._options, self._stop = options, stop
        bucket, key, version = self._fs.split_path(path)
        ask: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if version:
            ask["VersionId"] = version
        if start:
            ask["Range"] = f"bytes={start}-"
        else:
            ask["ChecksumMode"] = "ENABLED"
        if info.etag:
            ask["IfMatch"] = f'"{info.etag}"'
        response = _await(self._fs, lambda: s3_request(self._fs, "get_object", **ask), options,
                          stop, dropped=lambda answer: _close_body(answer["Body"]))
        self._body = response.pop("Body")
        self.response = response
        etag = str(response.get("ETag", "")).strip('"')
        length = response.get("ContentLength")
        ranged = str(response.get("ContentRange", "")).startswith(f"bytes {start}-")
        if ((info.etag and etag != info.etag) or (start and not ranged)
                or (length is not None and length != info.size - start)):
            self.close()
            from fastpipe.data.remote.retry import RemoteError

            raise RemoteError(
                f"{redact(info.url)} changed while it was listed and downloaded, or its store "
                f"answered with other bytes than asked for (ETag {info.etag} -> {etag or None}, "
                f"{info.size - start} bytes from byte {start} asked for, {length} answered, "
                f"range {response.get('ContentRange')}); start again once it is stable",
                redact(info.url))

    def read(self, size: int) -> bytes:
        """The next ``size`` bytes (fewer only where the object or the connection ends)."""
        body = self._body

        async def take() -> bytes:
            pieces, got = [], 0
            while got < size:
                piece = await body.read(size - got)
                if not piece:
                    break
                pieces.append(piece)
                got += len(piece)
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)

        return _await(self._fs, take, self._options, self._stop)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # a loop that is closed has closed it
            asyncio.run_coroutine_threadsafe(_closed(self._body), self._fs.loop)


async def _closed(body: Any) -> None:
    result = body.close()  # aiohttp's is a function, httpx's a coroutine
    if asyncio.iscoroutine(result):
        await result


def _close_body(body: Any) -> None:
    """Closes a body on its loop's thread (where a dropped answer's callback runs)."""
    asyncio.ensure_future(_closed(body))


def list_objects(url: str, options: RemoteOptions, *, glob: bool = False
                 ) -> dict[str, ObjectInfo]:
    """The objects under the folder ``url`` (recursively), or matching the pattern ``url``
    (``glob=True``): URL -> info, sorted by URL."""
    fs, path = filesystem(url, options)
    if glob:
        found = attempt(lambda: _run(fs, "glob", path, detail=True, options=options), url,
                        "listing the objects it matches", options)
    else:
        found = attempt(lambda: _run(fs, "find", path, detail=True, options=options), url,
                        "listing the objects under it", options)
    out = {}
    for name, entry in sorted(found.items()):
        if entry.get("type") == "directory":
            continue
        object_url = name if "://" in name else fs.unstrip_protocol(name)
        if entry.get("size") is None:  # an HTTP listing: ask each object
            out[object_url] = info(object_url, options)
        else:
            out[object_url] = _object_info(object_url, entry)
    return out


def children(url: str, options: RemoteOptions) -> tuple[dict[str, ObjectInfo | None], list[str]]:
    """One level under the folder ``url``: its objects (URL -> info, None where the listing
    gives no size) and its sub-folders (URLs ending in ``/``), each sorted; nothing where
    ``url`` names no folder."""
    fs, path = filesystem(url, options)
    try:
        found = attempt(lambda: _run(fs, "ls", path, detail=True, options=options), url,
                        "listing what it holds", options)
    except (FileNotFoundError, NotADirectoryError):
        return {}, []
    objects: dict[str, ObjectInfo | None] = {}
    folders = []
    for entry in found:
        name = entry["name"]
        entry_url = name if "://" in name else fs.unstrip_protocol(name)
        if entry.get("type") == "directory":
            folders.append(entry_url.rstrip("/") + "/")
        elif entry.get("size") is not None:
            objects[entry_url] = _object_info(entry_url, entry)
        else:
            objects[entry_url] = None
    return dict(sorted(objects.items())), sorted(set(folders))


def head(url: str, size: int, options: RemoteOptions) -> bytes:
    """The first ``size`` bytes of the object ``url`` (fewer where it is shorter; retried)."""
    found = info(url, options)
    end = min(size, found.size)
    return attempt(lambda: read_range(url, 0, end, options) if end else b"", url,
                   "reading its first bytes", options)
