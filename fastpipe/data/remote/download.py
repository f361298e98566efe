"""One object's bytes into a file: range requests of ``chunk_size`` bytes, each retried on its
own (a connection dropped mid-object resumes where it stopped), the size checked, the MD5
computed on the way."""

from __future__ import annotations

import hashlib
import threading

from fastpipe.data.remote.filesystems import ObjectInfo, read_range
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.retry import Cancelled, ShortResponse, attempt

__all__ = ["download"]


def download(info: ObjectInfo, path: str, options: RemoteOptions,
             stop: threading.Event | None = None) -> str:
    """Writes object ``info`` into the file ``path`` (which exists) from its start; returns the
    MD5 (hex) of what was written. A request that fails in a way that may pass is retried
    (``options.retries``); after that, or on a final failure, the error names the object."""
    md5 = hashlib.md5()
    size = info.size
    with open(path, "r+b") as out:
        offset = 0
        while offset < size:
            if stop is not None and stop.is_set():
                raise Cancelled()
            end = min(offset + options.chunk_size, size)

            def chunk(start: int = offset, stop_at: int = end) -> bytes:
                data = read_range(info.url, start, stop_at, options, stop)
                if len(data) == stop_at - start:
                    return data
                if start == 0 and len(data) == size:  # a server that ignores Range: all of it
                    return data
                raise ShortResponse(f"{len(data)} bytes of the {stop_at - start} asked for at "
                                    f"byte {start}")

            data = attempt(chunk, info.url, f"downloading bytes {offset}-{end} of {size}",
                           options, stop)
            out.write(data)
            md5.update(data)
            offset += len(data)
        out.truncate(size)
    return md5.hexdigest()
