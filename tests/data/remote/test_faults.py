"""Faults of the store while shards are read, with real servers (S3, Cloud Storage, HTTP):
stopped mid-epoch and started again (the epoch completes, no sample skipped or repeated), slow
answers (within the timeout: read; past it: retried, then named), 503s and 502s (retried, by
fastpipe alone), a body cut short (retried, then a clear error naming the object, nothing
half-written in the cache), and no credential in any message."""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fastpipe import DataLoaderX, Recipe
from fastpipe.data import RemoteError, RemoteOptions, ShardCache, TarDataset
from fastpipe.data.remote.cache import PART
from tests.helpers.remote import ACCESS_KEY, SECRET_KEY, GcsServer, MotoServer

FIELDS = ["jpg", "cls", "txt"]
EXPECTED = sorted(f"sample {k}" for k in range(30))
FAST = {"retries": 8, "backoff": 0.05, "timeout": 5}


def _texts(dataset, **loader) -> list[str]:
    seen = []
    for _, _, texts in DataLoaderX(dataset, batch_size=4, **loader):
        seen += list(texts)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("store", ["s3", "gs"])
def test_a_store_stopped_mid_epoch_and_started_again(shards, fault_proxy, cache_dir, store):
    if store == "gs":
        GcsServer.require()
    with MotoServer() if store == "s3" else GcsServer() as server:
        _stopped_mid_epoch_and_started_again(server, store, shards, fault_proxy, cache_dir)


def _stopped_mid_epoch_and_started_again(server, store, shards, fault_proxy, cache_dir):
    server.upload(shards.folder, "shards", "train/")
    # The server keeps nothing when it stops: clients reach it through a proxy that refuses
    # connections from the stop until the restarted server holds the same objects again.
    proxy = fault_proxy(server.endpoint)
    options = server.options(proxy.url, cache_dir=cache_dir, **FAST)
    dataset = TarDataset(f"{store}://shards/train/", fields=FIELDS,
                         recipe=Recipe(train=False, size=16), remote=options)
    shutil.rmtree(cache_dir / "objects")  # the epoch downloads every shard
    seen = []
    restarted = threading.Event()

    def start_again():
        time.sleep(1.0)
        server.start()
        server.upload(shards.folder, "shards", "train/")  # the same bytes, the same ETags
        proxy.up()
        restarted.set()

    worker = threading.Thread(target=start_again)
    try:
        for k, (_, _, texts) in enumerate(DataLoaderX(dataset, batch_size=4, num_workers=0)):
            seen += list(texts)
            if k == 0:
                proxy.down()
                server.stop()
                worker.start()
    finally:
        if worker.is_alive():
            worker.join()
    assert restarted.is_set() and sorted(seen) == EXPECTED and len(seen) == 30


@pytest.mark.slow
def test_http_stopped_mid_epoch_and_started_again(shards, nginx_server, cache_dir):
    options = RemoteOptions(cache_dir=cache_dir, **FAST)
    dataset = TarDataset([f"{nginx_server.url}/{p}" for p in shards.http_paths], fields=FIELDS,
                         recipe=Recipe(train=False, size=16), remote=options)
    shutil.rmtree(cache_dir / "objects")  # the epoch downloads every shard
    seen = []
    timer = None
    try:
        for k, (_, _, texts) in enumerate(DataLoaderX(dataset, batch_size=4, num_workers=2,
                                                      worker_method="thread")):
            seen += list(texts)
            if k == 0:
                nginx_server.stop()
                timer = threading.Timer(1.0, nginx_server.start)
                timer.start()
    finally:
        if timer is not None:
            timer.join()
    assert timer is not None and sorted(seen) == EXPECTED and len(seen) == 30


def _proxied(moto_server, fault_proxy, cache_dir, **options):
    proxy = fault_proxy(moto_server.endpoint)
    return proxy, moto_server.options(proxy.url, cache_dir=cache_dir, **options)


def test_503s_are_retried(shards, moto_server, fault_proxy, cache_dir):
    proxy, options = _proxied(moto_server, fault_proxy, cache_dir, **FAST)
    proxy.fail_next(3, 503, pattern="000001.tar")
    dataset = TarDataset(shards.s3, fields=FIELDS, recipe=Recipe(train=False, size=16),
                         remote=options)
    assert sorted(_texts(dataset, num_workers=0)) == EXPECTED
    assert not proxy.faults.status  # all three answered, and retried past


def test_slow_answers_within_the_timeout_are_read_and_past_it_named(
        shards, moto_server, fault_proxy, cache_dir):
    proxy, options = _proxied(moto_server, fault_proxy, cache_dir, retries=1, backoff=0.01,
                              timeout=0.5)
    proxy.set_delay(0.2)
    cache = ShardCache(options)
    url = shards.s3_urls[0]
    assert cache.local_path(url)
    proxy.set_delay(1.5)
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"000001.tar: .* failed 2 times .*Timeout"):
        ShardCache(replace(options, cache_dir=cache_dir / "other")).local_path(
            shards.s3_urls[1])
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("served", ["s3", "http"])
def test_a_body_cut_short_is_retried_then_named(shards, moto_server, fault_proxy, cache_dir,
                                                request, served):
    if served == "s3":
        proxy, options = _proxied(moto_server, fault_proxy, cache_dir, retries=2,
                                  backoff=0.01)
        url = shards.s3_urls[1]
    else:
        nginx = request.getfixturevalue("nginx_server")
        proxy = fault_proxy(nginx.url)
        options = RemoteOptions(cache_dir=cache_dir, retries=2, backoff=0.01)
        url = f"{proxy.url}/{shards.http_paths[1]}"
    cache = ShardCache(options)
    cache.info_of(url)
    proxy.truncate("000001.tar", 1000)  # every answer stops after 1000 bytes of its body
    with pytest.raises(RemoteError) as caught:
        cache.local_path(url)
    text = str(caught.value)
    assert "000001.tar" in text and "failed 3 times" in text
    assert SECRET_KEY not in text and ACCESS_KEY not in text
    assert not cache.holds(url)  # nothing half-written became the entry
    assert not list(Path(cache.entry(url).folder).glob("*" + PART))
    proxy.truncate("000001.tar", -1)  # the store is whole again: read as it is
    with open(cache.local_path(url), "rb") as f:
        assert f.read() == (shards.folder / "000001.tar").read_bytes()


@pytest.mark.parametrize("status", [503, 502])
def test_cloud_storage_errors_are_retried_by_fastpipe_alone(shards, gcs_shards, gcs_server,
                                                              fault_proxy, cache_dir, status):
    """gcsfs retries every failed request itself, up to six times with waits of 1 to 16 s:
    fastpipe makes each request once and retries as the options say (a 502, which gcsfs raises
    without a status, is retried too). A body cut short on every answer is named after
    ``retries + 1`` downloads, not minutes of gcsfs's own."""
    proxy = fault_proxy(gcs_server.endpoint)
    options = gcs_server.options(proxy.url, cache_dir=cache_dir, retries=2, backoff=0.01)
    url = gcs_shards + "000001.tar"
    proxy.fail_next(2, status, pattern="^/download/.*000001.tar")  # the object's bytes
    with open(ShardCache(options).local_path(url), "rb") as f:
        assert f.read() == (shards.folder / "000001.tar").read_bytes()
    assert not proxy.faults.status and proxy.gets("000001.tar") == 3
    proxy.truncate("000002.tar", 1000)
    with pytest.raises(RemoteError, match=r"000002.tar: .* failed 3 times"):
        ShardCache(options).local_path(gcs_shards + "000002.tar")
    assert proxy.gets("000002.tar") == 3


def test_no_credential_in_messages_or_reprs(shards, moto_server, cache_dir):
    options = moto_server.options(cache_dir=cache_dir, retries=0)
    dataset = TarDataset(shards.s3, fields=FIELDS, remote=options)
    shown = " ".join([repr(options), repr(dataset), repr(dataset.source),
                      repr(dataset.source.remote), repr(ShardCache(options))])
    with pytest.raises(FileNotFoundError) as missing:
        ShardCache(options).local_path("s3://shards/train/missing.tar")
    shown += str(missing.value)
    wrong = RemoteOptions(storage_options={**options.storage_options,
                                           "client_kwargs": {"endpoint_url": "http://127.0.0.1:9",
                                                             "region_name": "us-east-1"}},
                          cache_dir=cache_dir, retries=0)
    with pytest.raises(RemoteError) as refused:
        ShardCache(wrong).local_path("s3://shards/train/000000.tar")
    shown += str(refused.value)
    assert SECRET_KEY not in shown and ACCESS_KEY not in shown
    assert "s3://shards/train/missing.tar" in shown and "000000.tar" in shown
