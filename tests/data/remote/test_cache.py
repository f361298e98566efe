"""The node's cache against moto's S3 server (through a proxy that counts requests): one download
per object per node across threads and processes (fork and spawn), whole files only, damaged or
truncated entries fetched again, least recently used objects evicted under the limit, downloads
ahead of the reader, a killed download that leaves nothing half-written and Ctrl-C within a
second."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fastpipe.data import RemoteError, ShardCache
from fastpipe.data.remote.cache import PART, SPENT
from tests.helpers.remote import MotoServer, read_in_threads

REPO = Path(__file__).resolve().parents[3]
SIZE = 40_000


@pytest.fixture(scope="module")
def objects(moto_server, tmp_path_factory):
    return moto_server.upload_random(tmp_path_factory.mktemp("objects"), "cachetest",
                                     {f"obj-{k}.bin": SIZE + k for k in range(4)}, seed=5)


@pytest.fixture
def proxied(moto_server, fault_proxy, cache_dir):
    """Options reaching moto through a proxy (which counts the requests)."""
    proxy = fault_proxy(moto_server.endpoint)
    return proxy, moto_server.options(proxy.url, cache_dir=cache_dir, chunk_size=8192,
                                      backoff=0.01)


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_downloaded_once_whole_then_read_from_disk(objects, proxied):
    proxy, options = proxied
    cache = ShardCache(options)
    url, data = next(iter(objects.items()))
    path = cache.local_path(url)
    assert Path(path).read_bytes() == data and Path(path).name == "obj-0.bin"
    assert proxy.ranges("obj-0.bin") == [None]  # one GET of the whole object, read in chunks
    assert ShardCache(options).local_path(url) == path  # another instance, same node
    assert proxy.gets("obj-0.bin") == 1
    assert cache.holds(url) and not list(Path(path).parent.glob("*" + PART))


@pytest.mark.slow
def test_one_download_per_object_across_threads_and_processes(objects, proxied):
    proxy, options = proxied
    urls = sorted(objects)
    ctx = [multiprocessing.get_context("spawn"), multiprocessing.get_context("fork")]
    with ctx[0].Pool(2) as spawned, ctx[1].Pool(2) as forked:
        waiting = [pool.apply_async(read_in_threads, (options, urls, 3)) for pool in
                   (spawned, spawned, forked, forked)]
        here = read_in_threads(options, urls, 3)
        results = [w.get(120) for w in waiting]
    expected = sorted(_md5(objects[u]) for u in urls)
    assert here == expected and all(r == expected for r in results)
    for url in objects:
        assert proxy.gets(url.rsplit("/", 1)[1]) == 1, url


def test_damaged_or_truncated_entries_are_fetched_again(objects, proxied):
    proxy, options = proxied
    cache = ShardCache(options)
    url, data = next(iter(objects.items()))
    path = Path(cache.local_path(url))
    gets = proxy.gets("obj-0.bin")
    with open(path, "r+b") as f:  # cut short
        f.truncate(1000)
    assert not cache.holds(url)
    assert Path(cache.local_path(url)).read_bytes() == data
    assert proxy.gets("obj-0.bin") == 2 * gets
    with open(path, "r+b") as f:  # the same size, bytes changed
        f.seek(500)
        f.write(b"\xff" * 16)
    assert Path(cache.local_path(url)).read_bytes() == data
    assert proxy.gets("obj-0.bin") == 3 * gets


def test_content_check_finds_damage_that_keeps_size_and_time(objects, proxied):
    proxy, options = proxied
    from dataclasses import replace

    cache = ShardCache(replace(options, check="content"))
    url, data = next(iter(objects.items()))
    path = Path(cache.local_path(url))
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(bytes([data[100] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not ShardCache(replace(options, check="content")).holds(url)
    assert ShardCache(options).holds(url)  # the stat check cannot see it: why "content" exists
    # the check runs when a process first reads the entry: a worker process here
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_md5_through, (replace(options, check="content"), url)) == _md5(data)
    assert Path(cache.path_of(url)).read_bytes() == data


def _md5_through(options, url):
    return _md5(Path(ShardCache(options).local_path(url)).read_bytes())


def test_an_object_rewritten_at_the_source_is_fetched_again(moto_server, proxied):
    _, options = proxied
    client = moto_server.client()
    client.create_bucket(Bucket="rewritten")
    client.put_object(Bucket="rewritten", Key="x.bin", Body=b"first version")
    url = "s3://rewritten/x.bin"
    assert Path(ShardCache(options).local_path(url)).read_bytes() == b"first version"
    client.put_object(Bucket="rewritten", Key="x.bin", Body=b"second, longer version")
    assert Path(ShardCache(options).local_path(url)).read_bytes() == b"second, longer version"


def test_least_recently_used_objects_are_evicted_under_the_limit(objects, proxied):
    proxy, options = proxied
    from dataclasses import replace

    cache = ShardCache(replace(options, cache_limit=int(2.5 * SIZE)))
    urls = sorted(objects)
    for url in urls[:2]:
        cache.local_path(url)
    cache.local_path(urls[0])  # urls[1] is now the least recently used
    # pins of the last reads are dropped only when newer reads replace them
    for url in urls[2:]:
        assert Path(cache.local_path(url)).read_bytes() == objects[url]
    assert cache.usage() <= 2.5 * SIZE
    assert not cache.holds(urls[1]) and not cache.holds(urls[0])
    assert cache.holds(urls[2]) and cache.holds(urls[3])
    # what is evicted is fetched again, whole and right
    assert Path(cache.local_path(urls[1])).read_bytes() == objects[urls[1]]


def test_spent_objects_are_evicted_first_until_read_again(objects, proxied):
    proxy, options = proxied
    cache = ShardCache(replace(options, cache_limit=int(2.5 * SIZE)))
    urls = sorted(objects)
    cache.local_path(urls[0])
    cache.local_path(urls[1])
    cache.spent(urls[1])  # read after urls[0], but not needed again: it goes first
    cache.local_path(urls[2])
    assert cache.holds(urls[0]) and not cache.holds(urls[1])
    cache.spent(urls[0])
    cache.local_path(urls[0])  # read again after the mark: needed after all
    cache.local_path(urls[3])  # the least recently read goes: urls[2]
    assert cache.holds(urls[0]) and not cache.holds(urls[2])
    cache.spent(urls[3])
    cache.needed([urls[3]])  # a new pass needs it: the mark is taken off
    cache.local_path(urls[1])
    assert cache.holds(urls[3]) and not cache.holds(urls[0])
    assert Path(cache.local_path(urls[2])).read_bytes() == objects[urls[2]]
    cache.spent("s3://cachetest/never-fetched.bin")  # nothing cached: nothing marked
    assert not Path(cache.entry("s3://cachetest/never-fetched.bin").folder).exists()


def _spent(cache: ShardCache, url: str) -> bool:
    return (Path(cache.entry(url).folder) / SPENT).exists()


def test_the_prefetch_marks_spent_the_objects_the_reader_has_passed(objects, proxied):
    proxy, options = proxied
    cache = ShardCache(replace(options, ahead=1, downloads=1))
    urls = sorted(objects)
    cache.local_path(urls[3])
    cache.spent(urls[3])  # a mark of an earlier pass
    # Each done with once the reader has started the one two places on.
    with cache.prefetch(urls, released=np.array([2, 3, 4, 4])) as prefetch:
        deadline = time.monotonic() + 20
        while _spent(cache, urls[3]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _spent(cache, urls[3])  # this pass needs it
        for url in urls[:2]:
            cache.local_path(url)
        while 2 not in prefetch.done and time.monotonic() < deadline:
            time.sleep(0.02)  # the prefetch has seen the reader start urls[1]: it fetched urls[2]
        assert not any(_spent(cache, u) for u in urls)
        cache.local_path(urls[2])
        while not _spent(cache, urls[0]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _spent(cache, urls[0])
        assert not any(_spent(cache, u) for u in urls[1:])
        cache.local_path(urls[3])
        assert prefetch.wait(20)
    with pytest.raises(ValueError, match="released has 1 places for 4 objects"):
        cache.prefetch(urls, released=[4])
    assert not _fastpipe_threads()


def _until(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_given_where_the_pass_stands_the_prefetch_marks_spent_what_it_has_passed(objects,
                                                                                 proxied):
    # Where the pass stands (the training loop received those batches), not where the readers
    # started: they read ahead of it.
    proxy, options = proxied
    cache = ShardCache(replace(options, ahead=1, downloads=1))
    urls = sorted(objects)
    stands = [-1]
    # The last two are needed to the end of the pass (a place past the last: never reached).
    with cache.prefetch(urls, released=[1, 2, 4, 4], progress=lambda: stands[0]) as prefetch:
        for url in urls:
            cache.local_path(url)  # the readers, far ahead
        assert _until(lambda: len(prefetch.done) == 4)
        time.sleep(0.1)  # a few looks
        assert not any(_spent(cache, u) for u in urls)
        stands[0] = 1
        assert _until(lambda: _spent(cache, urls[0]))
        time.sleep(0.1)
        assert not any(_spent(cache, u) for u in urls[1:])
        stands[0] = 3  # the last place
        assert _until(lambda: _spent(cache, urls[1]))
        assert prefetch.wait(5)  # every mark it can make made: its threads end
        assert not any(_spent(cache, u) for u in urls[2:])
    assert not _fastpipe_threads()


def test_the_marks_a_pass_makes_as_it_starts_stay(objects, proxied):
    # The prefetch takes the marks of earlier passes off its objects a few hundred at a time
    # after it marks what this pass is done with: not those.
    proxy, options = proxied
    cache = ShardCache(replace(options, ahead=1, downloads=1))
    urls = sorted(objects)
    for url in urls:
        cache.local_path(url)
        cache.spent(url)  # marks of an earlier pass
    with cache.prefetch(urls, released=[1, 4, 4, 4], progress=lambda: 1) as prefetch:
        assert _until(lambda: not any(_spent(cache, u) for u in urls[1:]))
        time.sleep(0.1)
        assert _spent(cache, urls[0]) and not any(_spent(cache, u) for u in urls[1:])
        prefetch.close()


def test_the_marks_of_a_pass_under_way_stay(objects, proxied, monkeypatch):
    # Another rank's pass on the node marks what it is done with while this one's sweep takes
    # the marks of earlier passes off, one object a look here.
    from fastpipe.data.remote import prefetch as prefetch_module

    monkeypatch.setattr(prefetch_module, "_CLEARED_PER_POLL", 1)
    proxy, options = proxied
    cache = ShardCache(replace(options, ahead=1, downloads=1))
    urls = sorted(objects)
    for url in urls:
        cache.local_path(url)
    cache.spent(urls[0])  # earlier passes'
    cache.spent(urls[2])
    with cache.prefetch(urls, released=[4] * 4, progress=lambda: -1):
        assert _until(lambda: not _spent(cache, urls[0]))  # this pass has begun
        cache.spent(urls[3])  # the other pass's, before this one's sweep reaches it
        assert _until(lambda: not _spent(cache, urls[2]))
        time.sleep(0.2)  # the sweep is past urls[3]
        assert _spent(cache, urls[3])


def test_a_first_read_right_after_a_moment_is_seen_as_since_it(objects, proxied):
    # The read marked the entry by creating its file, whose time is the kernel's coarse clock:
    # up to a tick before the moment taken just before, so the prefetch missed the read.
    proxy, options = proxied
    cache = ShardCache(options)
    urls = sorted(objects)
    for url in urls:
        with cache.pinned([url], read=False):  # downloaded ahead, never read
            pass
    for url in urls:
        moment = time.time_ns()
        cache.local_path(url)
        assert cache.used_since(url, moment)


def test_a_spent_object_being_read_stays_and_a_mark_older_than_the_copy_is_not_its(
        objects, proxied):
    proxy, options = proxied
    cache = ShardCache(replace(options, cache_limit=int(2.5 * SIZE)))
    urls = sorted(objects)
    cache.local_path(urls[0])
    with cache.pinned([urls[1]]):
        cache.spent(urls[1])  # being read: eviction passes over it
        cache.local_path(urls[2])
        assert cache.holds(urls[1]) and not cache.holds(urls[0])
    # A mark the copy was written after (left behind by an evicted one) does not count.
    cache.spent(urls[2])
    spent = Path(cache.entry(urls[2]).folder) / SPENT
    os.utime(spent, ns=(1, 1))
    cache.local_path(urls[3])  # the spent urls[1] goes; urls[2]'s old mark would go first
    assert cache.holds(urls[2]) and not cache.holds(urls[1])


def _fastpipe_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fastpipe-")]


def test_prefetch_downloads_ahead_of_the_reader_in_order(objects, proxied):
    proxy, options = proxied
    from dataclasses import replace

    cache = ShardCache(replace(options, ahead=1, downloads=2))
    urls = sorted(objects)
    with cache.prefetch(urls) as prefetch:
        deadline = time.monotonic() + 20
        while len(prefetch.done) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        assert sorted(prefetch.done) == [0, 1]  # the first `ahead + 1`, nothing further
        assert not cache.holds(urls[2])
        for url in urls:  # the reader moves on: the prefetch follows
            assert Path(cache.local_path(url)).read_bytes() == objects[url]
        assert prefetch.wait(20)
    assert all(prefetch.done.values()) and not prefetch.errors and not _fastpipe_threads()
    for url in urls:
        assert proxy.gets(url.rsplit("/", 1)[1]) == 1


def test_the_prefetch_s_own_downloads_are_not_reads(objects, proxied):
    # They marked the entry read: the prefetch took its own downloads for the reader's progress
    # and, from ahead=2 on, downloaded the whole order at once (evicting, under a limit, what
    # the reader needed next); and the LRU took prefetched objects for read ones.
    proxy, options = proxied
    from dataclasses import replace

    cache = ShardCache(replace(options, ahead=2, downloads=2))
    urls = sorted(objects)
    with cache.prefetch(urls) as prefetch:
        deadline = time.monotonic() + 20
        while len(prefetch.done) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        assert sorted(prefetch.done) == [0, 1, 2]  # the first `ahead + 1`, nothing further
        assert not cache.holds(urls[3])
        assert not any(cache.used_since(u, 0) for u in urls)
        cache.local_path(urls[0])  # a reader: now it counts
        assert cache.used_since(urls[0], 0)


def test_finish_completes_the_downloads_under_way_and_starts_no_other(objects, proxied):
    # A sampler that has handed out every index finishes its prefetch: the object being
    # downloaded is the one its readers need next, and was cancelled and downloaded again by
    # them before (two downloads of each Parquet file of a short epoch).
    proxy, options = proxied
    from dataclasses import replace

    cache = ShardCache(replace(options, ahead=1, downloads=1))
    urls = sorted(objects)
    proxy.set_delay(0.1)  # before the object's answer: the download is under way
    prefetch = cache.prefetch(urls)
    deadline = time.monotonic() + 20
    while proxy.gets("obj-0.bin") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    prefetch.finish()
    proxy.set_delay(0)
    assert not prefetch.alive and not _fastpipe_threads()
    assert cache.holds(urls[0]) and not any(cache.holds(u) for u in urls[1:])
    assert Path(cache.local_path(urls[0])).read_bytes() == objects[urls[0]]
    assert proxy.gets("obj-0.bin") == 1  # downloaded once


def test_a_failed_download_is_named_and_left_to_the_reader(moto_server, proxied):
    proxy, options = proxied
    from dataclasses import replace

    cache = ShardCache(replace(options, retries=1))
    with pytest.raises(FileNotFoundError, match="s3://cachetest/missing.bin does not exist"):
        cache.local_path("s3://cachetest/missing.bin")
    with cache.prefetch(["s3://cachetest/missing.bin"]) as prefetch:
        assert prefetch.wait(20)
    assert prefetch.done == {0: False} and "missing.bin" in str(prefetch.errors[0][1])


_KILLED = """
import sys, os
sys.path[:0] = [{repo!r}]
from fastpipe.data import ShardCache
from tests.helpers.remote import MotoServer, read_in_threads
options = MotoServer.options(MotoServer.__new__(MotoServer), {endpoint!r}, cache_dir={cache!r},
                             chunk_size=4096)
print("start", flush=True)
ShardCache(options).local_path({url!r})
print("done", flush=True)
"""


def _downloading(tmp_path, endpoint, cache_dir, url) -> subprocess.Popen:
    script = tmp_path / "download.py"
    script.write_text(_KILLED.format(repo=str(REPO), endpoint=endpoint, cache=str(cache_dir),
                                     url=url))
    process = subprocess.Popen([sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout.readline().strip() == "start"
    return process


def _wait_for_part(cache: ShardCache, url: str, timeout: float = 20) -> Path:
    folder = Path(cache.path_of(url)).parent
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        parts = [p for p in folder.glob("*" + PART) if p.stat().st_size]
        if parts:
            return parts[0]
        time.sleep(0.02)
    raise AssertionError("the download never started")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "Ctrl-C"])
def test_a_stopped_download_leaves_nothing_half_written(objects, moto_server, fault_proxy,
                                                        cache_dir, tmp_path, how):
    proxy = fault_proxy(moto_server.endpoint)
    proxy.set_delay(0.2)  # ten chunks: two seconds of download
    url = sorted(objects)[1]
    cache = ShardCache(moto_server.options(proxy.url, cache_dir=cache_dir))
    process = _downloading(tmp_path, proxy.url, cache_dir, url)
    try:
        part = _wait_for_part(cache, url)
        sent = time.monotonic()
        process.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGINT)
        _, stderr = process.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    data = Path(cache.path_of(url))
    assert not data.exists(), "a partial download became the entry"
    if how == "Ctrl-C":
        assert took < 1.0, f"Ctrl-C took {took:.2f} s to end the download"
        assert "KeyboardInterrupt" in stderr and not part.exists()
    proxy.set_delay(0)
    # the next process to take the entry finds it empty, downloads it whole, and the .part of
    # the dead download is gone
    assert Path(cache.local_path(url)).read_bytes() == objects[url]
    assert not list(data.parent.glob("*" + PART))


def test_after_the_retries_the_error_names_the_object(objects, fault_proxy, cache_dir):
    server = MotoServer()
    try:
        client = server.client()
        client.create_bucket(Bucket="gone")
        client.put_object(Bucket="gone", Key="x.bin", Body=b"x" * 1000)
        options = server.options(cache_dir=cache_dir, retries=2, backoff=0.01, timeout=2)
        cache = ShardCache(options)
        cache.info_of("s3://gone/x.bin")  # known, then the store goes away
        server.stop()
        started = time.monotonic()
        with pytest.raises(RemoteError, match=r"s3://gone/x.bin: .* failed 3 times") as caught:
            cache.local_path("s3://gone/x.bin")
        assert time.monotonic() - started < 30
        assert "fastpipe-test-secret" not in str(caught.value)
        assert not list(Path(cache.path_of("s3://gone/x.bin")).parent.glob("*" + PART))
    finally:
        server.stop()


def test_an_object_put_after_its_folder_was_listed_is_found(moto_server):
    """s3fs answers info() from a listing of the folder it cached earlier in the process: an
    object uploaded since (a shard list put beside the shards) was 'does not exist' until the
    process ended."""
    from fastpipe.data.remote.filesystems import info, list_objects

    client = moto_server.client()
    client.create_bucket(Bucket="later")
    client.put_object(Bucket="later", Key="train/a.tar", Body=b"a" * 10)
    options = moto_server.options()
    assert list(list_objects("s3://later/train/", options)) == ["s3://later/train/a.tar"]
    client.put_object(Bucket="later", Key="train/b.json", Body=b"{}")
    assert info("s3://later/train/b.json", options).size == 2
    with pytest.raises(FileNotFoundError, match="later/train/c.json does not exist"):
        info("s3://later/train/c.json", options)


def _files_parsed_by_first_request(options, url: str) -> tuple[list[str], bytes]:
    """The botocore data files this process parses to make its S3 client, and what it read."""
    from botocore.loaders import JSONFileLoader

    from fastpipe.data.remote.filesystems import read_range

    parsed, load = [], JSONFileLoader.load_file

    def counting(self, file_path, *args, **kwargs):
        parsed.append(os.path.basename(str(file_path)))
        return load(self, file_path, *args, **kwargs)

    JSONFileLoader.load_file = counting
    try:
        return parsed, read_range(url, 0, 100, options)
    finally:
        JSONFileLoader.load_file = load


def test_a_forked_worker_s_s3_client_reuses_the_models_its_parent_parsed(objects, moto_server):
    # Parsing them is half of making a client (about 50 ms of CPU), which every worker process
    # of every epoch pays when it reads s3://.
    options = moto_server.options(timeout=30 + random.random())  # a file system of its own
    url, data = next(iter(objects.items()))
    parsed, _ = _files_parsed_by_first_request(options, url)
    assert any(name.startswith("service-2") for name in parsed)  # the parent parsed them
    with multiprocessing.get_context("fork").Pool(1) as pool:
        parsed, got = pool.apply(_files_parsed_by_first_request, (options, url))
    assert got == data[:100]
    assert not any(name.startswith(("service-2", "endpoint-rule-set")) for name in parsed)


_GIVEN: list = []  # options holding a session (which does not pickle), for a forked worker


def _session_marker(url: str) -> str | None:
    from fastpipe.data.remote.filesystems import filesystem, read_range

    read_range(url, 0, 10, _GIVEN[0])
    return getattr(filesystem(url, _GIVEN[0])[0].session, "marker", None)


def test_a_session_given_in_the_storage_options_is_the_forked_worker_s_too(objects,
                                                                           moto_server):
    from aiobotocore.session import AioSession

    session = AioSession()
    session.marker = "given"
    options = moto_server.options(timeout=30 + random.random())
    _GIVEN[:] = [replace(options, storage_options={**options.storage_options,
                                                   "session": session})]
    url = next(iter(objects))
    assert _session_marker(url) == "given"
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_session_marker, (url,)) == "given"
