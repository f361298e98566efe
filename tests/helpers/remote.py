"""Real servers on the loopback for the tests of data in object storage (fastpipe.data.remote),
started and stopped by the tests (the fixtures of tests/data/remote/conftest.py build on them):

* :class:`MotoServer`: moto's standalone S3-compatible server (``python -m moto.server``), the
  server s3fs tests itself against; :meth:`MotoServer.upload` puts a folder's files in a
  bucket, :meth:`MotoServer.options` gives the ``RemoteOptions`` that reach it.
* :class:`GcsServer`: gcp-storage-emulator's server (``python -m gcp_storage_emulator``), which
  speaks Google Cloud Storage's JSON API (buckets, objects, ranges, ``md5Hash``), reached through
  gcsfs's JSON-API class as ``gs://`` at its endpoint.
* :class:`Nginx`: nginx from the distribution serving a folder over HTTP with range requests
  (its access log says how many bytes of each object were sent: :meth:`Nginx.bytes_sent`).
  :func:`nginx_binary` is None where nginx is not installed; :func:`require_nginx` then skips
  the test, saying so (fails it with ``FASTPIPE_REQUIRE_NGINX=1``, as CI sets).
* :class:`FaultProxy`: an HTTP server in this process that forwards to either of them and
  injects faults on request: answers of a status (503), slow answers, bodies cut short, a
  server that is down (connections refused) and back.

Every server is a process or thread the test ends (``stop()``; the fixtures do it), on a port
of its own; a server process also ends when the process that started it is gone.
"""

from __future__ import annotations

import http.client
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.helpers.process import free_port

ACCESS_KEY = "fastpipe-test-access"
SECRET_KEY = "fastpipe-test-secret-9f8e7d"


def wait_for_port(port: int, timeout: float = 20.0, process: subprocess.Popen | None = None
                  ) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode} before it "
                                   "listened") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on port {port} after {timeout} s") from None
            time.sleep(0.05)


# Runs a server as its child and ends it when told to (SIGTERM) or when the process that started
# it is gone (a test run killed before its fixtures' teardown leaves no server behind).
_GUARD = """
import os, signal, subprocess, sys, time
parent = os.getppid()
child = subprocess.Popen(sys.argv[1:])
def stop(*_):
    child.terminate()
    try:
        child.wait(5)
    except subprocess.TimeoutExpired:
        child.kill()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while child.poll() is None:
    if os.getppid() != parent:
        stop()
    time.sleep(0.2)
sys.exit(child.returncode)
"""


def _guarded(command: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _GUARD, *command], start_new_session=True,
                            **kwargs)


def _end(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class _ServerProcess:
    """A server in a process of its own on ``port`` (one of its own by default), listening once
    built: :meth:`command` is how it starts."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.start()

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = _guarded(self.command(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        wait_for_port(self.port, process=self.process)

    def stop(self) -> None:
        _end(self.process)

    def __enter__(self) -> _ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_in_threads(options, urls: list[str], threads: int) -> list[str]:
    """Every object through a fresh ShardCache in ``threads`` threads, each in its own order:
    the MD5s of what they read, sorted, each once (a module-level function: a pool of spawned
    processes runs it too)."""
    import hashlib

    from fastpipe.data import ShardCache

    results = {}

    def run(seed: int) -> None:
        cache, order = ShardCache(options), list(urls)
        random.Random(seed).shuffle(order)
        for url in order:
            data = Path(cache.local_path(url)).read_bytes()
            results[(seed, url)] = hashlib.md5(data).hexdigest()

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sorted(set(results.values()))


class MotoServer(_ServerProcess):
    """moto's S3 server."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def client(self, checksums: bool = True):
        """boto3's client of this server; with ``checksums=False``, one that puts objects
        without the CRC-32 boto3 adds by default (as older clients and other tools do)."""
        import boto3
        from botocore.config import Config

        config = None if checksums else Config(request_checksum_calculation="when_required")
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                            config=config)

    def upload(self, folder: Path, bucket: str, prefix: str = "",
               checksum: str | None = "CRC32") -> list[str]:
        """Puts every file under ``folder`` in ``bucket`` (made if needed) under ``prefix``,
        each with the ``checksum`` S3 is to state for it (None: none); the URLs, sorted."""
        client = self.client(checksums=checksum is not None)
        extra = {} if checksum is None else {"ChecksumAlgorithm": checksum}
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        urls = []
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            key = prefix + path.relative_to(folder).as_posix()
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), **extra)
            urls.append(f"s3://{bucket}/{key}")
        return urls

    def upload_random(self, folder: Path, bucket: str, sizes: dict[str, int],
                      seed: int, checksum: str | None = "CRC32") -> dict[str, bytes]:
        """Objects of random bytes (file name -> size, drawn in this order from ``seed``)
        written into ``folder`` and put in ``bucket``: URL -> bytes, sorted by URL."""
        rng = random.Random(seed)
        for name, size in sizes.items():
            (Path(folder) / name).write_bytes(rng.randbytes(size))
        return {url: (Path(folder) / url.rsplit("/", 1)[1]).read_bytes()
                for url in self.upload(folder, bucket, checksum=checksum)}

    def options(self, endpoint: str | None = None, **kwargs):
        """RemoteOptions that reach this server (or ``endpoint``, a proxy in front of it)."""
        from fastpipe.data.remote.options import RemoteOptions

        storage = {"key": ACCESS_KEY, "secret": SECRET_KEY,
                   "client_kwargs": {"endpoint_url": endpoint or self.endpoint,
                                     "region_name": "us-east-1"}}
        return RemoteOptions(storage_options=storage, **kwargs)


class GcsServer(_ServerProcess):
    """gcp-storage-emulator's Cloud Storage server, its objects in memory."""

    @staticmethod
    def require() -> None:
        """Skips the test where gcsfs or the emulator is not installed (the test extra installs
        both)."""
        import pytest

        pytest.importorskip("gcsfs", exc_type=ImportError)
        pytest.importorskip("gcp_storage_emulator", exc_type=ImportError)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                "--port", str(self.port), "--in-memory"]

    def storage(self, endpoint: str | None = None) -> dict:
        """gcsfs's storage options for this server (or ``endpoint``, a proxy in front of it)."""
        return {"endpoint_url": endpoint or self.endpoint, "token": "anon", "project": "test"}

    def upload(self, folder: Path, bucket: str, prefix: str = "") -> list[str]:
        """Puts every file under ``folder`` in ``bucket`` (made if needed) under ``prefix``;
        the URLs, sorted."""
        from gcsfs.core import GCSFileSystem

        fs = GCSFileSystem(skip_instance_cache=True, **self.storage())
        if bucket not in {b.rstrip("/") for b in fs.ls("")}:
            fs.mkdir(bucket)
        urls = []
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            key = prefix + path.relative_to(folder).as_posix()
            fs.pipe_file(f"{bucket}/{key}", path.read_bytes())
            urls.append(f"gs://{bucket}/{key}")
        return urls

    def options(self, endpoint: str | None = None, **kwargs):
        """RemoteOptions that reach this server (or ``endpoint``, a proxy in front of it)."""
        from fastpipe.data.remote.options import RemoteOptions

        return RemoteOptions(storage_options=self.storage(endpoint), **kwargs)


class HubServer(_ServerProcess):
    """The Hugging Face Hub's HTTP API for one dataset repository, ``hf://datasets/`` +
    :data:`tests.helpers.hub.REPO`, serving the folder ``root`` (tests/helpers/hub.py)."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = Path(root)
        super().__init__(port)

    def command(self) -> list[str]:
        return [sys.executable, str(Path(__file__).with_name("hub.py")), str(self.port),
                str(self.root)]

    @property
    def url(self) -> str:
        from tests.helpers.hub import REPO

        return f"hf://datasets/{REPO}"

    def requests(self) -> Counter:
        """The server's requests so far, by ``"METHOD path"``."""
        import json
        import urllib.request

        from tests.helpers.hub import COUNTS

        with urllib.request.urlopen(self.endpoint + COUNTS, timeout=10) as answer:
            return Counter(json.loads(answer.read()))

    def options(self, endpoint: str | None = None, **kwargs):
        """RemoteOptions that reach this server (or ``endpoint``, a proxy in front of it)."""
        from fastpipe.data.remote.options import RemoteOptions

        return RemoteOptions(storage_options={"endpoint": endpoint or self.endpoint,
                                              "token": False}, **kwargs)


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found is None and os.path.exists("/usr/sbin/nginx"):
        found = "/usr/sbin/nginx"
    return found


def require_nginx() -> str:
    """nginx's binary; skips the test where nginx is not installed, or fails it where
    ``FASTPIPE_REQUIRE_NGINX=1`` (CI installs it: a skip there would hide the HTTP tests)."""
    import pytest

    found = nginx_binary()
    if found is None:
        missing = "nginx is not installed (apt-get install nginx; CI installs it)"
        if os.environ.get("FASTPIPE_REQUIRE_NGINX") == "1":
            pytest.fail(missing + " and FASTPIPE_REQUIRE_NGINX=1")
        pytest.skip(missing)
    return found


_NGINX_CONF = """daemon off;
worker_processes 1;
{user}
pid {prefix}/nginx.pid;
error_log {prefix}/error.log;
events {{ worker_connections 256; }}
http {{
  log_format bytes '$request_uri $status $body_bytes_sent';
  access_log {prefix}/access.log bytes;
  client_body_temp_path {prefix}/tmp; proxy_temp_path {prefix}/tmp;
  fastcgi_temp_path {prefix}/tmp; uwsgi_temp_path {prefix}/tmp; scgi_temp_path {prefix}/tmp;
  server {{
    listen 127.0.0.1:{port};
    root {root};
    autoindex on;
    location /slow/ {{ alias {root}/; limit_rate {slow_rate}; }}
  }}
}}
"""


class Nginx:
    """nginx serving ``root`` on ``port`` (``/slow/...``: the same files at ``slow_rate``
    bytes a second); stop() and start() again keep the port and the files."""

    def __init__(self, root: Path, prefix: Path, port: int | None = None,
                 slow_rate: int = 200_000) -> None:
        binary = nginx_binary()
        if binary is None:
            raise FileNotFoundError("nginx is not installed")
        self.binary, self.root, self.prefix = binary, Path(root), Path(prefix)
        self.port = port or free_port()
        (self.prefix / "tmp").mkdir(parents=True, exist_ok=True)
        # Run by root, nginx's worker would be nobody, who may not read a test's folder.
        user = f"user {pwd.getpwuid(0).pw_name};" if os.geteuid() == 0 else ""
        self.conf = self.prefix / "nginx.conf"
        self.conf.write_text(_NGINX_CONF.format(user=user, prefix=self.prefix, port=self.port,
                                                root=self.root, slow_rate=slow_rate))
        self.process: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = _guarded([self.binary, "-c", str(self.conf), "-p", str(self.prefix)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, process=self.process)

    def stop(self) -> None:
        _end(self.process)

    def bytes_sent(self) -> Counter:
        """Bytes of each path sent so far (successful answers), from the access log."""
        sent: Counter = Counter()
        log = self.prefix / "access.log"
        if not log.exists():
            return sent
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in ("200", "206"):
                sent[parts[0].split("?", 1)[0]] += int(parts[2])
        return sent


class _Faults:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.status: list[tuple[str, int]] = []  # (path pattern, status) answered once each
        self.delay = 0.0
        self.truncate: dict[str, int] = {}  # path pattern -> bytes of the body sent
        self.corrupt: list[str] = []  # path patterns, one GET's body each (a byte flipped)
        self.strip: set[str] = set()  # request headers not forwarded (lower case)
        self.requests: Counter = Counter()
        self.ranges: list[tuple[str, str | None]] = []  # (path, Range header) of each GET

    def take_corrupt(self, path: str) -> bool:
        with self.lock:
            for k, pattern in enumerate(self.corrupt):
                if re.search(pattern, path):
                    del self.corrupt[k]
                    return True
        return False

    def take_status(self, path: str) -> int | None:
        with self.lock:
            for k, (pattern, status) in enumerate(self.status):
                if re.search(pattern, path):
                    del self.status[k]
                    return status
        return None


class FaultProxy:
    """An HTTP server on the loopback forwarding every request to ``upstream``
    (``http://127.0.0.1:PORT``), with faults injected on request: :meth:`fail_next`,
    ``delay`` (seconds before each answer), :meth:`truncate`, :meth:`corrupt`,
    :meth:`strip_header`, :meth:`down` and :meth:`up`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.split("://", 1)[1].rstrip("/")
        self.faults = _Faults()
        self.port = free_port()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> Counter:
        """Requests so far, by ``"METHOD /path"``."""
        return self.faults.requests

    def gets(self, suffix: str) -> int:
        """GET requests so far of the bytes of objects whose paths end in ``suffix`` (Cloud
        Storage's GETs of an object's metadata, under ``/storage/v1/``, are not counted: its
        bytes come from ``/download/storage/v1/``)."""
        return sum(n for key, n in self.faults.requests.items()
                   if key.startswith("GET ") and not key.startswith("GET /storage/v1/")
                   and key.split("?", 1)[0].endswith(suffix))

    def ranges(self, suffix: str) -> list[str | None]:
        """The Range header (None: the whole object) of each GET so far of paths ending in
        ``suffix``, in order."""
        with self.faults.lock:
            return [r for p, r in self.faults.ranges if p.endswith(suffix)]

    def fail_next(self, count: int, status: int = 503, pattern: str = "") -> None:
        """The next ``count`` requests whose path matches ``pattern`` get ``status``."""
        with self.faults.lock:
            self.faults.status += [(pattern, status)] * count

    def set_delay(self, seconds: float) -> None:
        self.faults.delay = seconds

    def truncate(self, pattern: str, sent: int) -> None:
        """Answers to paths matching ``pattern`` stop after ``sent`` bytes of their body (the
        Content-Length promising all of it), until cleared with ``sent=-1``."""
        with self.faults.lock:
            if sent < 0:
                self.faults.truncate.pop(pattern, None)
            else:
                self.faults.truncate[pattern] = sent

    def corrupt(self, pattern: str, count: int = 1) -> None:
        """The bodies of the next ``count`` GETs of paths matching ``pattern`` each have their
        byte in the middle flipped (a transfer damaged on the way)."""
        with self.faults.lock:
            self.faults.corrupt += [pattern] * count

    def strip_header(self, name: str) -> None:
        """Requests are forwarded without the header ``name`` (a store or gateway that ignores
        it)."""
        with self.faults.lock:
            self.faults.strip.add(name.lower())

    def up(self) -> None:
        handler = _handler(self.upstream, self.faults)
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="fault-proxy", daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stops listening: new connections are refused until :meth:`up`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    stop = down


def _handler(upstream: str, faults: _Faults) -> type:
    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            path = self.path.split('?', 1)[0]
            faults.requests[f"{self.command} {path}"] += 1
            if self.command == "GET":
                with faults.lock:
                    faults.ranges.append((path, self.headers.get("Range")))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if faults.delay:
                time.sleep(faults.delay)
            status = faults.take_status(self.path)
            if status is not None:
                payload = b"<Error><Code>SlowDown</Code></Error>" if status == 503 else b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            connection = http.client.HTTPConnection(upstream, timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in faults.strip}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
            finally:
                connection.close()
            cut = next((n for p, n in list(faults.truncate.items())
                        if re.search(p, self.path)), None)
            if self.command == "GET" and data and faults.take_corrupt(self.path):
                middle = len(data) // 2
                data = data[:middle] + bytes([data[middle] ^ 0x20]) + data[middle + 1:]
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            length = answer.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            if cut is not None and self.command == "GET":
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Forward
