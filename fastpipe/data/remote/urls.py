"""What a URL is to fastpipe: recognised, joined, named in messages without its secrets, and
turned into the key of its cache entry.

A URL is ``protocol://...`` with a protocol fsspec knows (``s3``, ``gs``, ``http``, ``https``,
``hf``, ...); ``file://`` URLs are local paths. Messages name a URL through :func:`redact`: the
user and password of ``https://user:password@host/...`` and the values of query parameters that
carry a signature or a token (pre-signed S3 and GCS URLs, SAS tokens) become ``***``.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = ["basename", "entry_key", "expand_braces", "is_url", "join", "local_path_of", "parent",
           "protocol", "redact"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# Query parameters whose values are credentials: AWS and GCS signatures, Azure SAS, tokens.
_SECRET_QUERY = re.compile(r"(signature|sig|token|credential|key|secret|password|auth|"
                           r"x-amz-|x-goog-|^se$|^sp$|^sv$|^sr$|^st$|expires)", re.I)


def is_url(value: object) -> bool:
    """Whether ``value`` is a URL string (``protocol://...``) other than a ``file://`` one."""
    if not isinstance(value, str):
        return False
    match = _SCHEME.match(value)
    return match is not None and match.group(1).lower() != "file"


def protocol(url: str) -> str:
    """The protocol of ``url``, lower case (``s3``, ``https``, ...)."""
    match = _SCHEME.match(url)
    if match is None:
        raise ValueError(f"{redact(url)} is not a URL (protocol://...)")
    return match.group(1).lower()


def local_path_of(value: str | os.PathLike) -> str | os.PathLike:
    """A ``file://`` URL as its local path; anything else unchanged."""
    if isinstance(value, str) and value.lower().startswith("file://"):
        return value[len("file://"):]
    return value


def redact(url: str) -> str:
    """``url`` as messages show it: no user or password, credential query values as ``***``."""
    if not isinstance(url, str) or "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***" if _SECRET_QUERY.search(k) else v) for k, v in pairs],
                          safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _identity(url: str) -> str:
    """``url`` without what changes from one request of the same object to the next (the
    credentials, the signature of a pre-signed URL)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    pairs = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if not _SECRET_QUERY.search(k)]
    return urlunsplit((parts.scheme.lower(), netloc, parts.path, urlencode(pairs), ""))


def entry_key(url: str, endpoint: str | None = None) -> str:
    """The key of ``url``'s cache entry: a hash of the object's identity (the URL without its
    credentials, and the endpoint of an S3-compatible store, where the same bucket name names
    another object)."""
    text = _identity(url) + "\0" + (endpoint or "")
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def basename(url: str) -> str:
    """The last part of ``url``'s path (``shard-000.tar``), safe as a file name."""
    name = unquote(posixpath.basename(urlsplit(url).path.rstrip("/")))
    name = name.replace("/", "_").replace("\0", "_").lstrip(".")
    return (name or "object")[-200:]


def join(base: str, name: str) -> str:
    """``name`` relative to the folder URL ``base`` (a URL ``name`` stays as it is; ``..`` goes
    up within ``base``'s path)."""
    if is_url(name):
        return name
    parts = urlsplit(base)
    path = posixpath.normpath(posixpath.join(parts.path.rstrip("/") + "/", name))
    if name.endswith("/"):
        path += "/"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def parent(url: str) -> str:
    """The folder URL ``url`` is in (``s3://bucket/train/`` for ``s3://bucket/train/a.txt``)."""
    parts = urlsplit(url)
    path = posixpath.dirname(parts.path.rstrip("/"))
    return urlunsplit((parts.scheme, parts.netloc, path.rstrip("/") + "/", "", ""))


_BRACES = re.compile(r"\{([^{}]*)\}")
# The most names one pattern may expand to (a typo such as {0..99999999} must not hang).
_MOST_NAMES = 1_000_000


def expand_braces(text: str) -> list[str]:
    """The names of a WebDataset-style pattern: ``{000..099}`` (a range, zero-padded as
    written), ``{a,b}`` (alternatives), several of them multiplied out; text without braces is
    itself."""
    match = _BRACES.search(text)
    if match is None:
        return [text]
    inner = match.group(1)
    numbers = re.fullmatch(r"(-?[0-9]+)\.\.(-?[0-9]+)", inner)
    if numbers:
        first, last = numbers.group(1), numbers.group(2)
        width = len(first) if first.startswith("0") and len(first) > 1 else 0
        lo, hi = int(first), int(last)
        if abs(hi - lo) >= _MOST_NAMES:
            raise ValueError(f"{redact(text)}: {{{inner}}} names more than {_MOST_NAMES} objects")
        step = 1 if hi >= lo else -1
        options = [str(n).zfill(width) for n in range(lo, hi + step, step)]
    elif "," in inner:
        options = inner.split(",")
    else:
        return [text[:match.end()] + name for name in expand_braces(text[match.end():])] \
            if _BRACES.search(text[match.end():]) else [text]
    head, tail = text[:match.start()], text[match.end():]
    out = []
    for option in options:
        out.extend(expand_braces(head + option + tail))
        if len(out) > _MOST_NAMES:
            raise ValueError(f"{redact(text)} names more than {_MOST_NAMES} objects")
    return out
