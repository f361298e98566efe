"""Requests that may fail for a while: which failures pass (a timeout, a dropped or refused
connection, a 5xx or 429 answer, a response cut short), retried with exponential backoff; the
error after the retry budget names the object and never a credential."""

from __future__ import annotations

import errno
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from fastpipe._threads import stop_of
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.urls import redact

__all__ = ["Cancelled", "RemoteError", "ShortResponse", "attempt", "clean", "describe", "status",
           "transient"]

T = TypeVar("T")
# The longest wait between two attempts.
MAX_WAIT = 30.0
_NETWORK_ERRNOS = {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT,
                   errno.EPIPE, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN,
                   errno.EHOSTDOWN}
# Words in the class names of the backends' network errors (aiohttp, botocore, requests, google),
# which fastpipe does not import to test them.
_NETWORK_WORDS = ("Timeout", "Connect", "Connection", "Payload", "IncompleteRead", "Disconnected",
                  "ResponseStreaming", "ProtocolError", "ChunkedEncoding", "ReadError",
                  "ProxyError")  # gcsfs raises requests' ProxyError, without a status, for a 502
_RETRIED_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
                  "Throttling", "ThrottlingException", "RequestTimeTooSkewed", "503", "500"}


class RemoteError(OSError):
    """Reading an object failed after every retry (``url``: the object, without its
    credentials; ``attempts``: how many were made), or its bytes are not those of the object (a
    size or checksum that does not match)."""

    def __init__(self, message: str, url: str = "", attempts: int = 0) -> None:
        super().__init__(message)
        self.url = url
        self.attempts = attempts

    def __str__(self) -> str:
        return str(self.args[0])


class ShortResponse(Exception):
    """A response that ended before the bytes asked for (a connection dropped mid-body, a
    server that stopped): retried like a dropped connection."""


class Cancelled(Exception):
    """The request was stopped from outside (a prefetch closed): no error of the object's."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _status(exc: BaseException) -> int | str | None:
    """The HTTP status (or S3 error code) an exception carries, if any."""
    for name in ("status", "status_code", "code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore's ClientError
        meta = response.get("ResponseMetadata") or {}
        code = (response.get("Error") or {}).get("Code")
        if code in _RETRIED_CODES:
            return str(code)
        status = meta.get("HTTPStatusCode")
        if isinstance(status, int):
            return status
        return str(code) if code else None
    status = getattr(response, "status_code", None) or getattr(response, "status", None)
    return status if isinstance(status, int) else None


def status(exc: BaseException) -> int | str | None:
    """The HTTP status (or S3 error code) of ``exc`` or of the first error it was raised from
    that carries one."""
    return next((found for error in _chain(exc) if (found := _status(error)) is not None), None)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or the error it was raised from) is a failure that may pass: a timeout,
    a connection refused, reset or dropped, a response cut short or damaged on the way, an HTTP
    5xx, 408 or 429 (S3's SlowDown). A missing object, a refused permission, or any other error
    is final."""
    for error in _chain(exc):
        if isinstance(error, Cancelled):
            return False
        status = _status(error)
        if isinstance(status, str):
            return status in _RETRIED_CODES
        if status == 401 and "Invalid Credentials" in str(error):
            return True  # an expired Google token: gcsfs refreshes it for the next request
        if status is not None:
            return status >= 500 or status in (408, 429)
        if isinstance(error, (TimeoutError, ConnectionError, ShortResponse)):
            return True
        if isinstance(error, OSError) and error.errno in _NETWORK_ERRNOS:
            return True
        if any(word in type(error).__name__ for word in _NETWORK_WORDS):
            return True
        if type(error).__name__ == "FlexibleChecksumError" and "did not match" in str(error):
            return True  # botocore: a body unlike the checksum S3 states for it
    return False


def clean(text: str, options: RemoteOptions) -> str:
    """``text`` with every credential of ``options`` replaced by ``***``."""
    for secret in options.secrets():
        text = text.replace(secret, "***")
    return text


def describe(exc: BaseException, options: RemoteOptions) -> str:
    """``Type: message`` of an error, for a message: URLs in it redacted, credentials masked."""
    words = [redact(w) if "://" in w else w for w in str(exc).split(" ")]
    return clean(f"{type(exc).__name__}: {' '.join(words)}", options)


def _wait(seconds: float, stop: threading.Event | None) -> None:
    stop = stop_of(stop)
    if stop is None:
        time.sleep(seconds)  # the main thread: Ctrl-C interrupts it
    elif stop.wait(seconds):
        raise Cancelled()


def attempt(call: Callable[[], T], url: str, doing: str, options: RemoteOptions,
            stop: threading.Event | None = None) -> T:
    """``call()``, retried while it fails transiently, at most ``options.retries`` more times,
    waiting ``options.backoff`` seconds, then twice as long each time (with jitter); a final
    failure, or the last transient one, becomes a :class:`RemoteError` naming ``url`` (a missing
    object stays a ``FileNotFoundError``, a refused one a ``PermissionError``, each naming it).
    ``stop`` (set from another thread) ends the waits with :class:`Cancelled`."""
    shown = redact(url)
    stop = stop_of(stop)
    last: BaseException | None = None
    for k in range(options.retries + 1):
        if stop is not None and stop.is_set():
            raise Cancelled()
        try:
            return call()
        except (Cancelled, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - sorted into final and transient below
            if not transient(exc):
                raise _final(exc, shown, doing, options) from None
            last = exc
        if k < options.retries:
            wait = min(MAX_WAIT, options.backoff * 2 ** k) * random.uniform(0.5, 1.5)
            _wait(wait, stop)
    attempts = options.retries + 1
    raise RemoteError(
        f"{shown}: {doing} failed {attempts} time{'s' if attempts > 1 else ''} in a row, the last "
        f"with {describe(last, options)}; the store may be down or overloaded (raise "
        "RemoteOptions(retries=..., timeout=...) to wait longer)", shown, attempts) from None


def _final(exc: BaseException, shown: str, doing: str, options: RemoteOptions) -> BaseException:
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, FileNotFoundError) or _status(exc) == 404:
        return FileNotFoundError(errno.ENOENT, f"{shown} does not exist ({doing})")
    if isinstance(exc, PermissionError) or _status(exc) in (401, 403):
        return PermissionError(errno.EACCES, f"{shown}: access denied ({doing}); check the "
                               "credentials (environment, profile, or RemoteOptions("
                               "storage_options=...))")
    return RemoteError(f"{shown}: {doing} failed with {describe(exc, options)}", shown, 1)

