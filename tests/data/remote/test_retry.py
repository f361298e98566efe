"""Which failures are retried (timeouts, dropped connections, 5xx, 429, cut-short bodies) and
which are final (a missing object, a refused permission, a bug), the backoff, and the error
after the retry budget."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.retry import (
    Cancelled,
    RemoteError,
    ShortResponse,
    attempt,
    transient,
)


class _Status(Exception):
    def __init__(self, status):
        super().__init__(f"HTTP {status}")
        self.status = status


class _ClientError(Exception):  # botocore's shape
    def __init__(self, code, status):
        super().__init__(code)
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class ServerDisconnectedError(Exception):  # aiohttp's name
    pass


def test_what_passes_and_what_does_not():
    for passing in (TimeoutError(), ConnectionResetError(), _Status(503), _Status(429),
                    _Status(500), _ClientError("SlowDown", 503), ShortResponse("cut"),
                    OSError(errno.ECONNREFUSED, "refused"), ServerDisconnectedError()):
        assert transient(passing), passing
    for final in (FileNotFoundError("x"), PermissionError("x"), _Status(404), _Status(403),
                  _ClientError("NoSuchKey", 404), ValueError("bug"), KeyError("bug"),
                  Cancelled()):
        assert not transient(final), final
    # fsspec's HTTP file system reports a refused connection as FileNotFoundError from it
    try:
        try:
            raise ConnectionRefusedError("refused")
        except ConnectionRefusedError as cause:
            raise FileNotFoundError("http://host/x") from cause
    except FileNotFoundError as wrapped:
        assert transient(wrapped)


def test_retried_with_backoff_then_named(monkeypatch):
    options = RemoteOptions(retries=3, backoff=0.01)
    calls = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise _Status(503)
        return b"ok"

    assert attempt(flaky, "s3://b/x.tar", "reading", options) == b"ok" and len(calls) == 3
    calls.clear()

    def down():
        calls.append(1)
        raise ConnectionRefusedError("refused")

    url = "https://user:pw@host/x.tar?X-Amz-Signature=abc"
    with pytest.raises(RemoteError) as caught:
        attempt(down, url, "reading", options)
    assert len(calls) == 4 and caught.value.attempts == 4
    text = str(caught.value)
    assert "host/x.tar" in text and "4 times" in text and "retries=" in text
    assert "pw" not in text and "abc" not in text and caught.value.__cause__ is None


def test_final_errors_are_not_retried():
    options = RemoteOptions(retries=5, backoff=0.01)
    calls = []

    def missing():
        calls.append(1)
        raise FileNotFoundError("bkt/x")

    with pytest.raises(FileNotFoundError, match="s3://bkt/x does not exist"):
        attempt(missing, "s3://bkt/x", "reading", options)
    assert len(calls) == 1
    with pytest.raises(PermissionError, match="credentials"):
        attempt(lambda: (_ for _ in ()).throw(_Status(403)), "s3://bkt/x", "reading", options)


def test_a_stop_ends_the_backoff():
    options = RemoteOptions(retries=5, backoff=10)
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        attempt(lambda: (_ for _ in ()).throw(TimeoutError()), "s3://b/x", "reading", options,
                stop)
    assert time.monotonic() - started < 2


def test_cloud_storage_errors_as_gcsfs_raises_them():
    """fastpipe makes gcsfs's requests once and retries them itself: the errors gcsfs raises
    (its own HttpError, requests' ProxyError for a 502) are told apart as its retries did; an
    expired token's 401 passes (gcsfs refreshes the token for the next request), another 401
    does not."""
    retry = pytest.importorskip("gcsfs.retry", exc_type=ImportError)
    import requests

    for passing in (retry.HttpError({"code": 503, "message": "Service Unavailable"}),
                    retry.HttpError({"code": 429, "message": "rate"}),
                    retry.HttpError({"code": 401, "message": "Invalid Credentials"}),
                    requests.exceptions.ProxyError()):
        assert transient(passing), passing
    for final in (retry.HttpError({"code": 401, "message": "Login Required"}),
                  retry.HttpError({"code": 400, "message": "bad"})):
        assert not transient(final), final
