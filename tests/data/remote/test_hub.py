"""``hf://`` through huggingface_hub's own file system, against a server of the Hub's HTTP API
on the loopback (tests/helpers/hub.py; the Hub itself is out of reach of the test machines): a
Hub-layout Parquet dataset opens with one call and trains as the local copy; tar shards in a
repository read bit for bit; and a failing Hub is retried as ``RemoteOptions`` say, by fastpipe
alone, each request bounded by its timeout."""

from __future__ import annotations

import hashlib

import pytest
import torch

from fastpipe import DataLoaderX, Recipe
from fastpipe.data import ParquetDataset, RemoteError, ShardCache, fast_collate
from fastpipe.data.remote.filesystems import info
from fastpipe.data.sources.tar import TarSource
from tests.helpers.pack import write_shards
from tests.helpers.remote import HubServer

pytest.importorskip("huggingface_hub", exc_type=ImportError)
pytest.importorskip("pyarrow", exc_type=ImportError)
pytest.importorskip("datasets", exc_type=ImportError)

from tests.helpers.parquet import hub_dataset  # noqa: E402


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    hub_dataset(root, rows=21, shards=2, row_group=5)
    write_shards(root / "shards")
    server = HubServer(root)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("workers", ["thread", "fork"])
def test_a_hub_dataset_opens_with_one_call_and_trains_as_the_local_copy(hub, tmp_path, workers):
    recipe = Recipe(train=True, size=24)
    before = hub.requests()
    remote = ParquetDataset(hub.url, split="train", recipe=recipe, seed=3,
                            remote=hub.options(cache_dir=tmp_path / "cache"))
    local = ParquetDataset(hub.root, split="train", recipe=recipe, seed=3)
    assert len(remote) == len(local) == 21 and remote.classes == local.classes
    for source in (remote, local):
        source.set_epoch(1)

    def epoch(dataset):
        how = ({"worker_method": "thread"} if workers == "thread" else
               {"multiprocessing_context": workers})
        loader = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=0, num_workers=2,
                             collate_fn=fast_collate, **how)
        return list(loader)

    got, want = epoch(remote), epoch(local)
    assert [len(batch["image"]) for batch in got] == [4, 4, 4, 4, 4, 1]  # a partial last batch
    for a, b in zip(got, want, strict=True):
        assert a["image"].dtype == torch.uint8 and a["image"].shape[1:] == (3, 24, 24)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    # each Parquet file read twice for the node: its footer (a range), then the whole file once
    sent = hub.requests() - before
    assert sorted(n for key, n in sent.items() if "/resolve/" in key) == [2, 2], sent


def test_tar_shards_in_a_repository_read_bit_for_bit(hub, tmp_path):
    options = hub.options(cache_dir=tmp_path / "cache")
    remote = TarSource(hub.url + "/shards/", remote=options)
    local = TarSource(hub.root / "shards")
    assert len(remote) == len(local) == 30
    for i in range(30):
        a, b = remote.read(i), local.read(i)
        assert all(a[k].tobytes() == b[k].tobytes() for k in b), i
    # what identifies a file's bytes for the cache: its LFS object's SHA-256, as the Hub lists it
    data = (hub.root / "shards" / "000001.tar").read_bytes()
    found = info(hub.url + "/shards/000001.tar", options)
    assert found.size == len(data) and found.etag == hashlib.sha256(data).hexdigest()


def test_a_failing_hub_is_retried_by_fastpipe_alone_within_the_timeout(hub, fault_proxy,
                                                                         tmp_path):
    """huggingface_hub retries each read five times itself, with waits of up to 8 s, and under
    its own timeout: fastpipe reads each range once, bounded by ``timeout``, and retries as the
    options say."""
    proxy = fault_proxy(hub.endpoint)
    options = hub.options(proxy.url, cache_dir=tmp_path / "cache", retries=2, backoff=0.01,
                          timeout=1.0)
    shard = hub.url + "/shards/000001.tar"
    proxy.fail_next(2, 503, pattern="resolve/.*000001.tar")
    with open(ShardCache(options).local_path(shard), "rb") as f:
        assert f.read() == (hub.root / "shards" / "000001.tar").read_bytes()
    assert proxy.gets("000001.tar") == 3
    proxy.truncate("000002.tar", 1000)
    with pytest.raises(RemoteError, match=r"000002.tar: .* failed 3 times"):
        ShardCache(options).local_path(hub.url + "/shards/000002.tar")
    assert proxy.gets("000002.tar") == 3
    proxy.truncate("000002.tar", -1)
    proxy.set_delay(2.5)  # past the timeout of 1 s: each attempt ends at 1 s
    with pytest.raises(RemoteError, match=r"000000.tar: .* failed 3 times .*Timeout"):
        ShardCache(options).local_path(hub.url + "/shards/000000.tar")
