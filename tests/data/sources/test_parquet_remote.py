"""Parquet in object storage, against real servers on the loopback (tests/helpers/remote.py):
moto's S3 server, gcp-storage-emulator's Cloud Storage server and nginx. A Hub-layout dataset
read by URL is the local one bit for bit; only the footers are read when it is opened; each file
is downloaded once, in the order the samplers read, through a cache smaller than the dataset;
and a job saved on 4 gloo ranks mid-epoch resumes on 3 and on 6 over S3 with every sample once
and the uninterrupted draws."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pyarrow")
pytest.importorskip("datasets", exc_type=ImportError)
pytest.importorskip("s3fs", exc_type=ImportError)
pytest.importorskip("moto", exc_type=ImportError)

import fastpipe  # noqa: E402
from fastpipe import DataLoaderX  # noqa: E402
from fastpipe.data import DistributedSampler, ParquetDataset, SampleIndex, fast_collate  # noqa
from fastpipe.data.sources.parquet import ParquetSource  # noqa: E402
from tests.helpers.parquet import hub_dataset  # noqa: E402
from tests.helpers.remote import GcsServer, MotoServer, Nginx, require_nginx  # noqa: E402

RECIPE = fastpipe.Recipe(train=True, size=24)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    rows = hub_dataset(root, rows=60, shards=4, row_group=5, ids=True)
    hub_dataset(root, rows=9, shards=1, row_group=5, split="validation", ids=True)
    return root, rows


@pytest.fixture(scope="module")
def moto(hub):
    with MotoServer() as server:
        server.upload(hub[0], "hub", "imagenet-like/")
        yield server


@pytest.fixture(scope="module")
def gcs(hub):
    GcsServer.require()
    with GcsServer() as server:
        server.upload(hub[0], "hub", "imagenet-like/")
        yield server


def _objects(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "objects").rglob("*.parquet")) if cache.exists() else []


def _same_records(remote: ParquetSource, local: ParquetSource) -> None:
    assert len(remote) == len(local) and remote.schema == local.schema
    for i in range(len(local)):
        a, b = remote.read(i), local.read(i)
        assert a["image"].tobytes() == b["image"].tobytes() and int(a["id"]) == int(b["id"])


@pytest.mark.parametrize("store", ["s3", "gs"])
def test_a_hub_folder_in_a_bucket_opens_by_its_footers_and_reads_bit_for_bit(
        hub, request, tmp_path, store):
    root, _ = hub
    cache = tmp_path / "cache"
    server = request.getfixturevalue("moto" if store == "s3" else "gcs")
    options = server.options(cache_dir=cache)
    with pytest.raises(ValueError, match="splits 'train', 'validation'"):
        ParquetSource(f"{store}://hub/imagenet-like", remote=options)
    remote = ParquetSource(f"{store}://hub/imagenet-like/", split="train", remote=options)
    assert _objects(cache) == []  # only the footers were read, by ranges
    assert remote.files[0] == f"{store}://hub/imagenet-like/data/train-00000-of-00004.parquet"
    assert remote.schema.classes == {"label": ("cat", "dog", "fish")}
    assert remote.describe(16) == "data/train-00001-of-00004.parquet[row 1] (img_00016.JPEG)"
    local = ParquetSource(root, split="train")
    _same_records(remote, local)
    assert len(_objects(cache)) == 4  # each file downloaded once
    assert remote.fingerprint() != local.fingerprint()
    with pytest.raises(ValueError, match="remote= says how URLs are read"):
        ParquetSource(root, split="train", remote=options)


def test_over_http_each_file_is_sent_once_after_its_footer(hub, tmp_path):
    require_nginx()
    root, _ = hub
    server = Nginx(root, tmp_path / "nginx")
    try:
        urls = [f"{server.url}/data/train-0000{k}-of-00004.parquet" for k in range(4)]
        remote = ParquetSource(urls, remote={"cache_dir": tmp_path / "cache"})
        footers = server.bytes_sent()
        sizes = {f"/data/{Path(u).name}": (root / "data" / Path(u).name).stat().st_size
                 for u in urls}
        # The last 64 KiB at most (the footer is in them): these files are smaller than that.
        assert set(footers) == set(sizes)
        assert all(footers[p] <= min(sizes[p], 64 << 10) for p in sizes)
        _same_records(remote, ParquetSource(root, split="train"))
        sent = server.bytes_sent()
        assert all(sent[p] - footers[p] == sizes[p] for p in sizes), "each file sent once"
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_an_epoch_through_a_cache_smaller_than_the_dataset_reads_every_sample_once(
        hub, moto, tmp_path):
    root, _ = hub
    files = sorted((root / "data").glob("train-*.parquet"))
    total, largest = sum(p.stat().st_size for p in files), max(p.stat().st_size for p in files)
    # Room for the window being read, the next one and one fetched ahead: 3 of the 4 files.
    limit = 3 * largest
    assert limit < total
    options = moto.options(cache_dir=tmp_path / "cache", cache_limit=limit, ahead=1)
    dataset = ParquetDataset("s3://hub/imagenet-like/data/train-*.parquet", recipe=RECIPE,
                             seed=4, remote=options)
    local = ParquetDataset(root, split="train", recipe=RECIPE, seed=4)
    asked, prefetch = [], dataset.source.prefetch
    dataset.source.prefetch = lambda shards, released: (asked.append(list(shards))
                                                        or prefetch(shards, released))
    for epoch in range(2):
        sampler = DistributedSampler(dataset, world_size=1, rank=0, seed=3, window=1)
        sampler.set_epoch(epoch)
        loader = DataLoaderX(dataset, batch_size=8, sampler=sampler, num_workers=2,
                             collate_fn=fast_collate)
        ids = []
        for batch in loader:
            ids += batch["id"].tolist()
            want = torch.stack([local[SampleIndex(i, epoch)]["image"]
                                for i in batch["id"].tolist()])
            assert torch.equal(batch["image"], want)
        assert sorted(ids) == list(range(60))
        # The cache was told the files in the order the epoch first needs them.
        assert sorted(asked[-1]) == [0, 1, 2, 3] and len(asked) == epoch + 1
    held = sum(p.stat().st_size for p in _objects(tmp_path / "cache"))
    assert held <= limit < total  # it streamed: never all of it


_ELASTIC_OPTIONS = "FASTPIPE_TEST_REMOTE"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_elastic_resume_over_s3_from_4_ranks_to_3_and_6(hub, moto, tmp_path, monkeypatch):
    from tests.data.sampling import test_elastic as elastic

    options = {"storage_options": moto.options().storage_options,
               "cache_dir": str(tmp_path / "cache")}
    monkeypatch.setenv(_ELASTIC_OPTIONS, json.dumps(options))
    script = tmp_path / "rank.py"
    script.write_text(elastic.script_text(
        "ParquetDataset(data, recipe=recipe, seed={augment}, remote=__import__('json').loads("
        f"__import__('os').environ[{_ELASTIC_OPTIONS!r}]))"))
    data = elastic.ROWS, elastic.SHARDS
    root = tmp_path / "elastic"
    hub_dataset(root, rows=data[0], shards=data[1], row_group=6, ids=True)
    moto.upload(root, "elastic", "")
    dataset = ParquetDataset(root, recipe=RECIPE, seed=elastic.AUGMENT_SEED)
    assert np.array_equal(dataset.shard_sizes(), [data[0] // data[1]] * data[1])
    elastic.check_elastic_resume(script, tmp_path, "s3://elastic/data/", dataset,
                                 [(3, "0", "process"), (6, "2", "thread")])
