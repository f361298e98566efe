"""Room in the node's cache against moto's S3 server: made from the ledger, so that a download
does not list every entry of a large cache, and the limit held whatever the ledger says (missing,
unreadable, stale, counting too little or too much, kept by processes without a limit)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fastpipe.data import ShardCache
from fastpipe.data.remote import cache as cache_module
from tests.helpers.remote import read_in_threads

SIZE = 40_000


@pytest.fixture(scope="module")
def objects(moto_server, tmp_path_factory):
    return moto_server.upload_random(tmp_path_factory.mktemp("room"), "roomtest",
                                     {f"room-{k}.bin": SIZE for k in range(6)}, seed=7)


@pytest.fixture
def options(moto_server, cache_dir):
    return moto_server.options(cache_dir=cache_dir, backoff=0.01)


@pytest.fixture
def counts(monkeypatch):
    """How many times the cache was listed in full."""
    listed = []
    scan = ShardCache._scan

    def counting(self):
        listed.append(1)
        return scan(self)

    monkeypatch.setattr(ShardCache, "_scan", counting)
    return listed


def _old_entries(cache: ShardCache, n: int, size: int) -> None:
    """``n`` entries of ``size`` bytes (sparse) read long ago, as a cache full of an earlier
    run's shards holds them."""
    for k in range(n):
        e = cache.entry(f"s3://earlier/shard-{k:05d}.tar")
        os.makedirs(e.folder, exist_ok=True)
        with open(e.data, "wb") as f:
            f.truncate(size)
        Path(e.meta).write_text("{}")
        Path(e.used).touch()
        os.utime(e.used, ns=(k, k))


def _ledger(cache: ShardCache) -> dict:
    return json.loads((Path(cache.root) / cache_module.USAGE).read_text())


def test_downloads_into_a_large_cache_do_not_list_it_each_time(objects, options, counts):
    cache = ShardCache(replace(options, cache_limit=10**12))
    _old_entries(cache, 300, SIZE)
    for url, data in objects.items():
        assert Path(cache.local_path(url)).read_bytes() == data
    assert len(counts) == 1  # the first download: no ledger yet
    assert _ledger(cache)["bytes"] == cache.usage() == 306 * SIZE


def test_a_large_cache_that_streams_is_listed_once_per_many_downloads(objects, options,
                                                                      counts):
    # Full: every download needs an eviction; each count frees room for the next ones.
    limit = 300 * SIZE
    cache = ShardCache(replace(options, cache_limit=limit))
    _old_entries(cache, 300, SIZE)
    for url, data in objects.items():
        assert Path(cache.local_path(url)).read_bytes() == data
        assert cache.usage() <= limit
    assert len(counts) - len(objects) <= 1  # usage() above lists it each time
    assert all(cache.holds(u) for u in objects)
    # The earlier run's shards read longest ago went, as many as the download and the spare
    # (1/32 of the limit) needed: 11 of them, for all six downloads.
    earlier = [Path(cache.path_of(f"s3://earlier/shard-{k:05d}.tar")).exists()
               for k in range(300)]
    assert earlier == [False] * 11 + [True] * 289


def test_a_small_cache_keeps_all_that_fits(objects, options):
    # No spare where listing is cheap: a limit of three objects keeps the three read last.
    cache = ShardCache(replace(options, cache_limit=3 * SIZE))
    urls = list(objects)
    for url in urls:
        cache.local_path(url)
        assert cache.usage() <= 3 * SIZE
    assert [cache.holds(u) for u in urls] == [False] * 3 + [True] * 3


def test_a_process_without_a_limit_adds_its_downloads_to_the_ledger(objects, options):
    urls = list(objects)
    limited = ShardCache(replace(options, cache_limit=int(2.5 * SIZE)))
    limited.local_path(urls[0])  # the ledger: one object
    unlimited = ShardCache(options)
    for url in urls[1:4]:
        unlimited.local_path(url)
    assert _ledger(limited)["bytes"] == 4 * SIZE
    limited.local_path(urls[4])
    assert limited.usage() <= 2.5 * SIZE


@pytest.mark.parametrize("ledger", ["missing", "unreadable", "stale", "from the future",
                                    "too much"])
def test_the_limit_holds_whatever_the_ledger_says(objects, options, ledger):
    urls = list(objects)
    cache = ShardCache(replace(options, cache_limit=int(2.5 * SIZE)))
    cache.local_path(urls[0])
    ShardCache(options).local_path(urls[1])  # downloads the ledger knows ...
    ShardCache(options).local_path(urls[2])
    path = Path(cache.root) / cache_module.USAGE
    if ledger == "missing":
        path.unlink()
    elif ledger == "unreadable":
        path.write_text('{"bytes": 4')  # cut short
    elif ledger == "stale":  # ... or not: an older fastpipe put two more there a minute ago
        old = time.time_ns() - int((cache_module.RECOUNT_SECONDS + 1) * 1e9)
        path.write_text(json.dumps({"bytes": SIZE, "counted_ns": old}))
    elif ledger == "from the future":  # the clock was set back since
        later = time.time_ns() + int(3600 * 1e9)
        path.write_text(json.dumps({"bytes": SIZE, "counted_ns": later}))
    else:  # an entry removed by hand is still counted: nothing is evicted for it
        path.write_text(json.dumps({"bytes": 10**12, "counted_ns": time.time_ns()}))
    cache.local_path(urls[3])
    assert cache.usage() <= 2.5 * SIZE
    assert cache.holds(urls[3]) and cache.holds(urls[2]) and not cache.holds(urls[1])
    assert _ledger(cache)["bytes"] == cache.usage()


def test_a_download_asks_the_store_nothing_more_than_its_listing_and_one_get(
        objects, moto_server, fault_proxy, cache_dir):
    proxy = fault_proxy(moto_server.endpoint)
    cache = ShardCache(moto_server.options(proxy.url, cache_dir=cache_dir))
    url, data = next(iter(objects.items()))
    assert Path(cache.local_path(url)).read_bytes() == data
    path = "/" + url.split("://", 1)[1]
    assert {k: n for k, n in proxy.requests.items() if path in k} == {
        f"HEAD {path}": 1, f"GET {path}": 1}


def test_an_object_rewritten_between_its_listing_and_its_download_is_named(moto_server,
                                                                           cache_dir):
    client = moto_server.client()
    client.create_bucket(Bucket="rewrite-listed")
    client.put_object(Bucket="rewrite-listed", Key="x.bin", Body=b"the listed version")
    cache = ShardCache(moto_server.options(cache_dir=cache_dir, backoff=0.01))
    cache.info_of("s3://rewrite-listed/x.bin")
    client.put_object(Bucket="rewrite-listed", Key="x.bin", Body=b"a newer version, longer")
    with pytest.raises(Exception, match="changed while it was listed and downloaded"):
        cache.local_path("s3://rewrite-listed/x.bin")
    assert not Path(cache.path_of("s3://rewrite-listed/x.bin")).exists()


@pytest.mark.slow
def test_processes_and_threads_downloading_at_once_keep_the_ledger_true(objects, options):
    import multiprocessing

    options = replace(options, cache_limit=10**12)
    urls = list(objects)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        waiting = [pool.apply_async(read_in_threads, (options, urls, 3)) for _ in range(2)]
        here = read_in_threads(options, urls, 3)
        results = [w.get(120) for w in waiting]
    expected = sorted(hashlib.md5(data).hexdigest() for data in objects.values())
    assert here == expected and all(r == expected for r in results)
    cache = ShardCache(options)
    assert all(cache.holds(u) for u in urls)
    assert _ledger(cache)["bytes"] == cache.usage() == len(urls) * SIZE  # each counted once
