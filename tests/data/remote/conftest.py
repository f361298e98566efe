"""Fixtures of the tests of data in object storage: real servers on the loopback, started and
stopped here (tests/helpers/remote.py has the servers themselves).

* ``moto_server``: moto's S3-compatible server, one per test module (a :class:`MotoServer`:
  ``.endpoint``, ``.upload(folder, bucket, prefix)``, ``.upload_random(folder, bucket, sizes,
  seed)``, ``.options(**RemoteOptions keywords)``, ``.client()``, ``.stop()``/``.start()``).
* ``fresh_moto``: one of the test's own, for tests that stop and restart it.
* ``gcs_server``: gcp-storage-emulator's Cloud Storage server, one per test module (a
  :class:`GcsServer`: ``.endpoint``, ``.upload(folder, bucket, prefix)``, ``.options(...)``);
  skips where gcsfs or the emulator is not installed (the test extra installs both).
* ``nginx_server``: nginx serving the folder ``nginx_root`` (a :class:`Nginx`: ``.url``,
  ``.bytes_sent()``, ``.stop()``/``.start()``); skips, saying so, where nginx is not installed
  (fails with ``FASTPIPE_REQUIRE_NGINX=1``: CI installs it).
* ``fault_proxy``: a function ``upstream URL -> FaultProxy`` (503s, delays, bodies cut short,
  down and up), each proxy stopped after the test.
* ``shards``: three WebDataset tar shards of ten JPEG samples written locally
  (``shards.folder``), put in moto (``shards.s3``: ``s3://shards/train/``) and in nginx's
  folder (``shards.http``: the list of their URLs); ``shards.jpegs``: the images' bytes.
* ``gcs_shards``: the same shards put in ``gcs_server`` (``gs://shards/train/``).
* ``cache_dir``: an empty cache folder for the test.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

pytest.importorskip("s3fs", exc_type=ImportError)
pytest.importorskip("moto", exc_type=ImportError)

from tests.helpers.pack import write_shards  # noqa: E402
from tests.helpers.remote import (  # noqa: E402
    FaultProxy,
    GcsServer,
    MotoServer,
    Nginx,
    nginx_binary,
    require_nginx,
)


@pytest.fixture(scope="module")
def moto_server():
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="module")
def gcs_server():
    GcsServer.require()
    with GcsServer() as server:
        yield server


@pytest.fixture
def fresh_moto():
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="module")
def nginx_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("www")


@pytest.fixture(scope="module")
def nginx_server(nginx_root, tmp_path_factory):
    require_nginx()
    server = Nginx(nginx_root, tmp_path_factory.mktemp("nginx"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fault_proxy():
    made: list[FaultProxy] = []

    def make(upstream: str) -> FaultProxy:
        made.append(FaultProxy(upstream))
        return made[-1]

    try:
        yield make
    finally:
        for proxy in made:
            proxy.down()


@pytest.fixture(scope="module")
def shards(tmp_path_factory, moto_server, nginx_root):
    folder = tmp_path_factory.mktemp("local") / "shards"
    jpegs = write_shards(folder)
    s3 = moto_server.upload(folder, "shards", "train/")
    http = []
    if nginx_binary() is not None:
        (nginx_root / "train").mkdir(exist_ok=True)
        for path in sorted(folder.glob("*.tar")):
            (nginx_root / "train" / path.name).write_bytes(path.read_bytes())
        http = [f"train/{p.name}" for p in sorted(folder.glob("*.tar"))]
    return types.SimpleNamespace(folder=folder, jpegs=jpegs, s3="s3://shards/train/",
                                 s3_urls=s3, http_paths=http)


@pytest.fixture(scope="module")
def gcs_shards(shards, gcs_server) -> str:
    gcs_server.upload(shards.folder, "shards", "train/")
    return "gs://shards/train/"


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "cache"
