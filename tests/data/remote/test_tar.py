"""Tar shards read over S3 (moto), Cloud Storage (gcp-storage-emulator) and HTTP (nginx) through
the node's cache: every sample bit-exact against the local copy, through DataLoaderX with worker
processes (fork, spawn) and threads, the indexes built once per node, and a cache smaller than
the dataset streaming two epochs with every sample once in each."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fastpipe import DataLoaderX, Recipe
from fastpipe.data import PackFormatError, RemoteOptions, TarDataset, write_shard_list
from fastpipe.data.sources.tar import TarSource
from tests.helpers.pack import write_shards

FIELDS = ["jpg", "cls", "txt"]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["s3", "gs", "http"])
def served(request, shards, moto_server, fault_proxy, cache_dir):
    """(URL of the shards, options, proxy counting the requests) over S3, Cloud Storage or
    HTTP."""
    if request.param == "s3":
        proxy = fault_proxy(moto_server.endpoint)
        return shards.s3, moto_server.options(proxy.url, cache_dir=cache_dir), proxy
    if request.param == "gs":
        url, server = request.getfixturevalue("gcs_shards"), request.getfixturevalue("gcs_server")
        proxy = fault_proxy(server.endpoint)
        return url, server.options(proxy.url, cache_dir=cache_dir), proxy
    server = request.getfixturevalue("nginx_server")
    proxy = fault_proxy(server.url)
    return (f"{proxy.url}/train/", RemoteOptions(cache_dir=cache_dir), proxy)


def test_every_sample_bit_exact_against_the_local_shards(served, shards):
    url, options, proxy = served
    remote, local = TarSource(url, remote=options), TarSource(shards.folder)
    assert len(remote) == len(local) == 30
    assert remote.schema.names == local.schema.names
    for i in range(len(local)):
        a, b = remote.read(i), local.read(i)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    for a, b in zip(remote.read_batch([29, 0, 11, 12, 5]), local.read_batch([29, 0, 11, 12, 5])):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert remote.describe(12).endswith("000001.tar:00012") and "://" in remote.describe(12)
    # the indexes are the cache's now: a second source downloads no shard
    gets = sum(proxy.gets(f"{k:06d}.tar") for k in range(3))
    again = TarSource(url, remote=options)
    assert again.fingerprint() == remote.fingerprint()
    assert sum(proxy.gets(f"{k:06d}.tar") for k in range(3)) == gets == 3



@pytest.mark.parametrize("listed", [False, True], ids=["shards", "shard list"])
def test_a_forked_worker_imports_no_module_of_numpy_torch_or_fastpipe_to_read_a_batch(
        listed, request, shards, moto_server, cache_dir, tmp_path):
    """DataLoader's worker processes are forked anew every epoch (without persistent_workers):
    a module a worker's first batch imports is paid again by every worker of every epoch
    (numpy.ma, which np.unique imports on first use, took 17-34 ms of each). The transport's
    own libraries (s3fs, aiobotocore, aiohttp, ...) are theirs to import as they please."""
    options = moto_server.options(cache_dir=cache_dir)
    url = shards.s3
    if listed:
        url = _beside_the_shards(request, (shards.s3, options, None), shards, tmp_path)
    script = textwrap.dedent("""
        import json, os, pickle, sys
        from fastpipe.data.sources.tar import TarSource
        url, options = pickle.loads(bytes.fromhex(sys.argv[1]))
        source = TarSource(url, remote=options)  # as the training script's own process does
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a worker
            before = set(sys.modules)
            try:
                source.read_batch([25, 3, 14])
                found = sorted(m for m in set(sys.modules) - before
                               if m.split(".")[0] in ("numpy", "torch", "fastpipe", "PIL"))
            except BaseException as exc:
                found = repr(exc)
            with os.fdopen(write, "w") as out:
                json.dump(found, out)
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as answer:
            print(answer.read())
        _, status = os.waitpid(pid, 0)
        assert status == 0, f"the worker ended with status {status}"
        """)
    done = subprocess.run([sys.executable, "-c", script, pickle.dumps((url, options)).hex()],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], "imported by a worker's first batch"


def test_building_the_indexes_shows_its_progress_the_first_time_on_a_node(
        shards, moto_server, cache_dir, monkeypatch, capsys):
    """Indexing downloads every shard (it can take long, and is silent otherwise): its progress
    goes to stderr as the commands' does; a build that finds the indexes shows nothing."""
    import functools

    from fastpipe.data.sources import tar

    monkeypatch.setattr(tar, "progress_bar", functools.partial(tar.progress_bar, interval=0.0))
    options = moto_server.options(cache_dir=cache_dir)
    TarSource(shards.s3, remote=options)
    err = capsys.readouterr().err
    assert "indexing 3 remote tar shards" in err and "3/3 shards (100%)" in err, err
    assert "done" in err.splitlines()[-1]
    TarSource(shards.s3, remote=options)
    assert capsys.readouterr().err == ""


def _list_beside(shards, tmp_path) -> bytes:
    """The shard list of the local shards, written beside them (so it names them by file name)
    and moved out of their folder; its bytes."""
    listed = tmp_path / "shards.json"
    os.replace(write_shard_list(shards.folder, shards.folder / "shards.json"), listed)
    return listed.read_bytes()


def _beside_the_shards(request, served, shards, tmp_path) -> str:
    """The URL of a shard list uploaded beside the served shards."""
    url, _, _ = served
    if url.startswith("s3://"):
        request.getfixturevalue("moto_server").client().put_object(
            Bucket="shards", Key="train/shards.json", Body=_list_beside(shards, tmp_path))
    elif url.startswith("gs://"):
        (tmp_path / "list").mkdir()
        (tmp_path / "list" / "shards.json").write_bytes(_list_beside(shards, tmp_path))
        request.getfixturevalue("gcs_server").upload(tmp_path / "list", "shards", "train/")
    else:
        (request.getfixturevalue("nginx_root") / "train" / "shards.json").write_bytes(
            _list_beside(shards, tmp_path))
    return url + "shards.json"


def test_a_shard_list_builds_without_downloading_the_shards(request, served, shards, tmp_path):
    """With a shard list the dataset is built from the first shard alone; each other shard is
    downloaded (and indexed) when a read first needs it, once; every sample as the local
    shards give it."""
    listed_url = _beside_the_shards(request, served, shards, tmp_path)
    _, options, proxy = served
    source = TarSource(listed_url, remote=options)
    assert len(source) == 30 and list(source.shard_sizes()) == [10, 10, 10]
    assert [proxy.gets(f"{k:06d}.tar") for k in range(3)] == [1, 0, 0]
    local = TarSource(shards.folder)
    for a, b in zip(source.read_batch([25, 3]), local.read_batch([25, 3])):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert [proxy.gets(f"{k:06d}.tar") for k in range(3)] == [1, 0, 1]
    for i in range(30):
        a, b = source.read(i), local.read(i)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert [proxy.gets(f"{k:06d}.tar") for k in range(3)] == [1, 1, 1]
    assert source.describe(12).endswith("000001.tar:00012") and "://" in source.describe(12)


def test_a_shard_list_written_from_remote_shards_names_them_by_file_name(
        shards, moto_server, cache_dir, tmp_path):
    """write_shard_list of shards in object storage (each downloaded once to count its
    samples): the shards named by file name, so the list reads back from beside them."""
    import json

    options = moto_server.options(cache_dir=cache_dir)
    out = write_shard_list("s3://shards/train/", tmp_path / "remote.json", remote=options)
    doc = json.loads(out.read_text())
    assert [(e["url"], e["nsamples"]) for e in doc["shardlist"]] == [
        (f"{k:06d}.tar", 10) for k in range(3)]
    assert [e["filesize"] for e in doc["shardlist"]] == [
        (shards.folder / f"{k:06d}.tar").stat().st_size for k in range(3)]
    moto_server.client().put_object(Bucket="shards", Key="train/remote.json",
                                    Body=out.read_bytes())
    source = TarSource("s3://shards/train/remote.json", remote=options)
    assert source.names == [f"s3://shards/train/{k:06d}.tar" for k in range(3)]
    assert len(source) == 30 and source.read(29)["txt"].tobytes() == b"sample 29"


def test_a_remote_list_naming_local_paths_is_refused(shards, moto_server, cache_dir, tmp_path):
    """A list written away from its shards names them by their full local path; uploaded, it
    would read this machine's files (or none on another): refused, saying how to write it."""
    listed = write_shard_list(shards.folder, tmp_path / "away.json")
    moto_server.client().put_object(Bucket="shards", Key="lists/away.json",
                                    Body=listed.read_bytes())
    with pytest.raises(PackFormatError, match=r"names local paths .*write it beside the shards"):
        TarSource("s3://shards/lists/away.json", remote=moto_server.options(cache_dir=cache_dir))


@pytest.mark.parametrize("how", ["url", "base_path"])
def test_a_remote_list_in_another_folder_names_its_shards_relative_to_itself(
        how, shards, moto_server, cache_dir, tmp_path):
    """A list in s3://shards/lists/ naming ``../train/000000.tar`` (or with ``base_path``
    ``../train/``) reads s3://shards/train/000000.tar, as a relative path would locally."""
    import json

    doc = json.loads(write_shard_list(shards.folder, tmp_path / "l.json").read_text())
    for entry in doc["shardlist"]:
        name = os.path.basename(entry["url"])
        entry["url"] = f"../train/{name}" if how == "url" else name
    if how == "base_path":
        doc["base_path"] = "../train/"
    moto_server.client().put_object(Bucket="shards", Key="lists/rel.json",
                                    Body=json.dumps(doc).encode())
    source = TarSource("s3://shards/lists/rel.json", remote=moto_server.options(
        cache_dir=cache_dir))
    assert source.names == [f"s3://shards/train/{k:06d}.tar" for k in range(3)]
    assert source.read(29)["txt"].tobytes() == b"sample 29"


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["spawn", "thread"])
def test_a_shard_list_through_dataloaderx_workers_as_local(request, served, shards, tmp_path,
                                                          workers):
    """Workers index the shards they read themselves (spawned ones get the source as built:
    one shard indexed); the epoch is the local shards' (a partial last batch included)."""
    listed_url = _beside_the_shards(request, served, shards, tmp_path)
    got, want = _remote_and_local_epochs(listed_url, served, shards, workers)
    assert got == want


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["fork", "spawn", "thread"])
def test_through_dataloaderx_workers_every_sample_once_as_local(served, shards, workers):
    got, want = _remote_and_local_epochs(served[0], served, shards, workers)
    assert got == want  # the same samples, pixels and order as the local shards
    assert sorted(t for _, _, t in got) == sorted(f"sample {k}" for k in range(30))


def _remote_and_local_epochs(url, served, shards, workers):
    """One epoch of ``url`` through DataLoaderX with two ``workers`` (a start method, or
    "thread"), and one of the local shards in the main process; 30 samples in batches of 8: a
    partial last batch of 6."""
    recipe = Recipe(train=False, size=16)
    options_kw = ({"worker_method": "thread"} if workers == "thread" else
                  {"multiprocessing_context": workers})
    remote = TarDataset(url, fields=FIELDS, recipe=recipe, remote=served[1])
    local = TarDataset(shards.folder, fields=FIELDS, recipe=recipe)
    return (_epoch(DataLoaderX(remote, batch_size=8, num_workers=2, **options_kw)),
            _epoch(DataLoaderX(local, batch_size=8, num_workers=0)))


def _epoch(loader) -> list[tuple[str, int, str]]:
    seen = []
    for images, labels, texts in loader:
        for k in range(len(labels)):
            seen.append((hashlib.sha256(images[k].numpy().tobytes()).hexdigest(),
                         int(labels[k]), texts[k]))
    return seen


@pytest.mark.slow
def test_a_cache_smaller_than_the_dataset_streams_two_epochs(moto_server, fault_proxy,
                                                               cache_dir, tmp_path):
    write_shards(tmp_path / "six", shards=6, per_shard=10)
    moto_server.upload(tmp_path / "six", "six")
    proxy = fault_proxy(moto_server.endpoint)
    size = max(p.stat().st_size for p in (tmp_path / "six").glob("*.tar"))
    # room for what 2 workers read at once (a batch may span 2 shards), not for the 6 shards
    options = moto_server.options(proxy.url, cache_dir=cache_dir, cache_limit=4 * size)
    dataset = TarDataset("s3://six/", fields=FIELDS, recipe=Recipe(train=False, size=16),
                         remote=options)
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2)
    expected = sorted(f"sample {k}" for k in range(60))
    for _ in range(2):
        seen = [t for _, _, t in _epoch(loader)]
        assert sorted(seen) == expected  # each sample once, none skipped
        assert dataset.source.remote.cache.usage() <= 4 * size
    # two shards did not fit: each epoch downloaded them again
    assert sum(proxy.gets(f"{k:06d}.tar") for k in range(6)) >= 6 + 2 * 2


def test_prefetch_in_the_order_of_the_shards(shards, moto_server, fault_proxy, cache_dir):
    proxy = fault_proxy(moto_server.endpoint)
    options = moto_server.options(proxy.url, cache_dir=cache_dir, ahead=3)
    source = TarSource(shards.s3, remote=options)
    shutil.rmtree(cache_dir / "objects")  # evicted since: the indexes stay
    with source.prefetch([2, 0, 1]) as prefetch:
        assert prefetch.wait(30)
    assert prefetch.done == {0: True, 1: True, 2: True} and not prefetch.errors
    gets = [proxy.gets(f"{k:06d}.tar") for k in range(3)]
    assert gets == [2, 2, 2]  # the index builds, then the prefetch
    assert len(source.read_batch(list(range(30)))) == 30
    assert [proxy.gets(f"{k:06d}.tar") for k in range(3)] == gets  # read from the cache
    assert TarSource(shards.folder).prefetch([0]) is None  # local shards: nothing to fetch


def test_a_url_that_names_nothing_says_so(moto_server, shards, cache_dir):
    options = moto_server.options(cache_dir=cache_dir)
    with pytest.raises(FileNotFoundError, match="s3://shards/nothing/"):
        TarSource("s3://shards/nothing/", remote=options)
    with pytest.raises(FileNotFoundError, match="no tar shards match"):
        TarSource("s3://shards/train/*.tgz", remote=options)
    with pytest.raises(ValueError, match="both URLs and local paths"):
        TarSource([shards.s3_urls[0], str(next(shards.folder.glob("*.tar")))], remote=options)


@pytest.mark.slow
@pytest.mark.parametrize("listed", [False, True], ids=["shards", "shard-list"])
def test_ctrl_c_ends_loader_threads_waiting_on_a_download_within_a_second(
        shards, moto_server, fault_proxy, cache_dir, tmp_path, listed):
    """Ctrl-C while DataLoaderX's threads download a shard the batch needs (the store answering
    after 30 s), to read it or (from a shard list) to index it: the loop stops at once and the
    threads' downloads are cancelled within a second, instead of the threads (and the
    interpreter's exit) waiting for the answers."""
    import _thread
    import threading
    import time

    proxy = fault_proxy(moto_server.endpoint)
    url = shards.s3
    if listed:
        moto_server.client().put_object(Bucket="shards", Key="train/shards.json",
                                        Body=_list_beside(shards, tmp_path))
        url += "shards.json"
    dataset = TarDataset(url, fields=FIELDS, recipe=Recipe(train=False, size=16),
                         remote=moto_server.options(proxy.url, cache_dir=cache_dir))
    shutil.rmtree(cache_dir / "objects")  # the shards are downloaded again when read
    proxy.set_delay(30.0)
    loader = DataLoaderX(dataset, batch_size=8, num_workers=2, worker_method="thread")
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                pass
        took = time.monotonic() - began
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline and _loader_threads():
            time.sleep(0.05)
        left = _loader_threads()
    finally:
        timer.cancel()
        proxy.set_delay(0.0)  # (lets threads left behind finish, so that the test ends)
    assert took < 3.0, f"the loop ended {took:.1f} s after its start (Ctrl-C at 1 s)"
    assert not left, f"{left} still downloading 1.5 s after the loop ended"


def _loader_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("fastpipe-DataLoaderX")]
