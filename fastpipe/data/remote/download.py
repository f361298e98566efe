"""One object's bytes into a file, in pieces of ``chunk_size`` bytes, each retried on its own (a
connection dropped mid-object resumes where it stopped), the size checked, a checksum computed
on the way: the cheapest the store states (:mod:`~fastpipe.data.remote.checksums`), else a
CRC-32 of fastpipe's own.

An ``s3://`` object is read by one GET of the whole object, which states its checksums and asks
for the listed version (``If-Match``); a GET cut short resumes from where it stopped, for the
same version. Other stores are read by a range request per piece."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from fastpipe.data.remote.checksums import (
    Checksum,
    Hasher,
    cheapest,
    etag_is_no_md5,
    stated_by_s3,
)
from fastpipe.data.remote.filesystems import ObjectInfo, S3Stream, read_range
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.retry import Cancelled, RemoteError, ShortResponse, attempt, status
from fastpipe.data.remote.urls import protocol, redact

__all__ = ["Downloaded", "download"]


@dataclass(frozen=True)
class Downloaded:
    """What a download wrote: ``checksum``, its bytes'; ``expected``, the store's checksum of
    the same algorithm (None: the store states none fastpipe computes); ``as_listed``, whether
    every request asked for the listed version of the object (so that the bytes are of it)."""

    checksum: Checksum
    expected: Checksum | None
    as_listed: bool

    @property
    def matches(self) -> bool:
        return self.checksum.same(self.expected)


def download(info: ObjectInfo, path: str, options: RemoteOptions,
             stop: threading.Event | None = None) -> Downloaded:
    """Writes object ``info`` into the file ``path`` (which exists) from its start. A request
    that fails in a way that may pass is retried (``options.retries``); after that, or on a
    final failure, the error names the object."""
    if protocol(info.url) in ("s3", "s3a"):
        return _from_s3(info, path, options, stop)
    expected = cheapest(info.checksums)
    hasher = Hasher(expected.algorithm if expected else "crc32")
    size = info.size

    def piece(start: int, end: int) -> bytes:
        data = read_range(info.url, start, end, options, stop)
        if len(data) == end - start:
            return data
        if start == 0 and len(data) == size:  # a server that ignores Range: all of it
            return data
        raise ShortResponse(f"{len(data)} bytes of the {end - start} asked for at byte {start}")

    _write(info, path, options, stop, piece, hasher.update)
    return Downloaded(hasher.checksum(), expected, False)


def _from_s3(info: ObjectInfo, path: str, options: RemoteOptions,
             stop: threading.Event | None) -> Downloaded:
    stream: S3Stream | None = None
    hasher: Hasher | None = None
    expected = cheapest(info.checksums)

    def piece(start: int, end: int) -> bytes:
        nonlocal stream, hasher, expected
        try:
            if stream is None:
                stream = S3Stream(info, start, options, stop)
                if hasher is None:  # the first GET, of the whole object: its checksums
                    listed = info.checksums
                    if etag_is_no_md5(stream.response):
                        listed = tuple(c for c in listed if not c.etag)
                    expected = cheapest([*stated_by_s3(stream.response), *listed])
                    hasher = Hasher(expected.algorithm if expected else "crc32")
            data = stream.read(end - start)
            if len(data) != end - start:
                raise ShortResponse(f"{len(data)} bytes of the {end - start} asked for at byte "
                                    f"{start}")
            if end == info.size and stream.read(1):
                # Reading to the end of the body is also what runs botocore's own checks of it
                # (its length, and the checksum S3 states for it).
                raise ShortResponse(f"more than the {info.size} bytes listed")
            return data
        except BaseException as exc:
            if stream is not None:
                stream.close()
                stream = None
            if status(exc) == 412:
                raise RemoteError(
                    f"{redact(info.url)} changed while it was listed and downloaded (its ETag is "
                    f"no longer {info.etag}): the data was rewritten under the run; start again "
                    "once it is stable", redact(info.url)) from None
            raise

    try:
        _write(info, path, options, stop, piece, lambda data: hasher.update(data))
    finally:
        if stream is not None:
            stream.close()
    if hasher is None:  # an empty object: no request
        hasher = Hasher(expected.algorithm if expected else "crc32")
    return Downloaded(hasher.checksum(), expected, info.etag is not None)


def _write(info: ObjectInfo, path: str, options: RemoteOptions, stop: threading.Event | None,
           piece: Callable[[int, int], bytes], update: Callable[[bytes], None]) -> None:
    """Writes the object's bytes, ``piece(start, end)`` after ``piece(start, end)``, each
    retried on its own, into ``path``; ``update`` is given each piece."""
    size = info.size
    with open(path, "r+b") as out:
        offset = 0
        while offset < size:
            if stop is not None and stop.is_set():
                raise Cancelled()
            end = min(offset + options.chunk_size, size)
            data = attempt(lambda start=offset, stop_at=end: piece(start, stop_at), info.url,
                           f"downloading bytes {offset}-{end} of {size}", options, stop)
            out.write(data)
            update(data)
            offset += len(data)
        out.truncate(size)
