"""``RemoteOptions``: how fastpipe reads data that lives behind a URL, checked once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fastpipe import _validate

__all__ = ["CACHE_DIR_ENV", "CACHE_LIMIT_ENV", "RemoteOptions", "parse_bytes"]

CACHE_DIR_ENV = "FASTPIPE_CACHE_DIR"
CACHE_LIMIT_ENV = "FASTPIPE_CACHE_LIMIT"
CHECKS = ("stat", "content")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
# Keys of storage options whose values are never shown (the rest are shown by name only).
_SECRET_KEY = re.compile(r"key|secret|token|password|credential|auth|sas|signature", re.I)


def parse_bytes(name: str, value: int | str) -> int:
    """A size in bytes from an int or text such as ``"20GB"``, ``"500 MiB"`` (GB = 10^9 bytes,
    GiB = 2^30)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number of bytes or text such as '20GB', got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        unit = match and _UNITS.get(match.group(2).lower())
        if not unit:
            raise ValueError(f"{name}: cannot read {value!r} as a size; write it as a number of "
                             "bytes or with a unit: '20GB', '500MiB'")
        number = int(float(match.group(1)) * unit)
    else:
        raise TypeError(f"{name} must be a number of bytes or text such as '20GB', got "
                        f"{type(value).__name__}")
    if number < 1:
        raise ValueError(f"{name} must be at least 1 byte, got {value!r}")
    return number


def _default_dir() -> str:
    given = os.environ.get(CACHE_DIR_ENV)
    if given:
        return os.path.abspath(os.path.expanduser(given))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "fastpipe")


@dataclass(frozen=True)
class RemoteOptions:
    """How data behind a URL (``s3://``, ``gs://``, ``http(s)://``, ``hf://``, any fsspec
    protocol) is read: through a cache on this node's disk, shared by every rank and worker of the
    node (docs/object-storage.md).

    Building one checks every value (a bad one raises ``ValueError`` or ``TypeError`` naming it).

    Args:
        storage_options: what the protocol's fsspec file system takes (``key``, ``secret``,
            ``endpoint_url``, ``client_kwargs``, ``token``, ``anon``, ...); credentials otherwise
            come the way the backend finds them (environment, profile, instance role). Never
            shown: not in ``repr``, nor in any message.
        cache_dir: the cache's folder; default ``$FASTPIPE_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/fastpipe`` (``~/.cache/fastpipe``). Every process of a node that
            reads the same data should name the same folder (the default does).
        cache_limit: bytes the cache may hold (an int, or text: ``"20GB"``, ``"500MiB"``); the
            least recently used objects are evicted to stay under it, so a dataset larger than
            the cache streams. Default ``$FASTPIPE_CACHE_LIMIT``, else no limit.
        ahead: objects :meth:`ShardCache.prefetch` keeps downloaded ahead of the reader.
        downloads: objects downloaded at once by a prefetch or an index build.
        retries: further attempts of a request that failed in a way that may pass (a timeout, a
            dropped connection, a 5xx or 429 answer, a response cut short) before the read fails
            with a :class:`RemoteError` naming the object.
        backoff: seconds before the first retry, doubled for each next one (with jitter, at
            most 30 s a wait).
        timeout: seconds one request may take before it counts as failed (and is retried).
        chunk_size: bytes of a download read (and retried) at once: a range request each,
            or, for ``s3://``, a piece of the one GET of the object.
        check: what confirms a cached object before a process first uses it: ``"stat"`` (its size
            and modification time are those it was written with, and the object's size and ETag
            those of the remote object now) or ``"content"`` (that too, and its checksum is the
            one computed while it was downloaded: a read of the whole object).
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    cache_dir: str | os.PathLike | None = None
    cache_limit: int | str | None = None
    ahead: int = 2
    downloads: int = 4
    retries: int = 5
    backoff: float = 0.5
    timeout: float = 60.0
    chunk_size: int = 8 << 20
    check: str = "stat"

    def __post_init__(self) -> None:
        if not isinstance(self.storage_options, Mapping):
            raise TypeError("storage_options must be a dict of the fsspec file system's options, "
                            f"got {type(self.storage_options).__name__}")
        object.__setattr__(self, "storage_options", dict(self.storage_options))
        directory = _default_dir() if self.cache_dir is None else os.path.abspath(
            os.path.expanduser(os.fspath(self.cache_dir)))
        object.__setattr__(self, "cache_dir", directory)
        limit = self.cache_limit
        if limit is None and os.environ.get(CACHE_LIMIT_ENV):
            limit = os.environ[CACHE_LIMIT_ENV]
            name = CACHE_LIMIT_ENV
        else:
            name = "cache_limit"
        object.__setattr__(self, "cache_limit", None if limit is None else parse_bytes(name,
                                                                                        limit))
        object.__setattr__(self, "ahead", _validate.non_negative_int("ahead", self.ahead))
        object.__setattr__(self, "downloads", _validate.positive_int("downloads",
                                                                     self.downloads))
        object.__setattr__(self, "retries", _validate.non_negative_int("retries", self.retries))
        object.__setattr__(self, "chunk_size", _validate.positive_int("chunk_size",
                                                                      self.chunk_size))
        object.__setattr__(self, "backoff", _validate.non_negative_float("backoff",
                                                                         self.backoff))
        object.__setattr__(self, "timeout", _validate.positive_float("timeout", self.timeout))
        _validate.choice("check", self.check, CHECKS)

    @classmethod
    def of(cls, value: RemoteOptions | Mapping[str, Any] | None) -> RemoteOptions:
        """``value`` as options: options as they are, a dict as keywords, None as the
        defaults."""
        if value is None:
            return cls()
        if isinstance(value, RemoteOptions):
            return value
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            if unknown := sorted(set(value) - known):
                raise TypeError(f"remote: unknown option {unknown[0]!r}; RemoteOptions takes "
                                f"{', '.join(sorted(known))}")
            return cls(**value)
        raise TypeError(f"remote must be a fastpipe.data.RemoteOptions or a dict of its options, "
                        f"got {type(value).__name__}")

    def endpoint(self) -> str | None:
        """The endpoint of an S3-compatible store, where the options name one: part of the
        identity of the objects (the same bucket on another endpoint is another object)."""
        so = self.storage_options
        client = so.get("client_kwargs") or {}
        value = so.get("endpoint_url") or (client.get("endpoint_url") if isinstance(
            client, Mapping) else None)
        return str(value) if value else None

    def secrets(self) -> list[str]:
        """The credential values in ``storage_options`` (every text under a key that names a
        key, secret, token or password), which no message may show."""
        found: list[str] = []

        def walk(value: Any, secret: bool) -> None:
            if isinstance(value, Mapping):
                for k, v in value.items():
                    walk(v, secret or bool(_SECRET_KEY.search(str(k))))
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v, secret)
            elif secret and isinstance(value, (str, bytes)) and len(value) >= 4:
                found.append(value.decode("utf-8", "replace") if isinstance(value, bytes)
                             else value)

        walk(self.storage_options, False)
        return found
