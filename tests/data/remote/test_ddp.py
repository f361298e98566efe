"""Two gloo ranks on one node read tar shards (worker processes, fork), a pack (worker threads)
and Parquet files in the Hub's layout (worker processes, spawn) over S3 (moto), Cloud Storage
(gcp-storage-emulator) and HTTP (nginx), sharing the node's cache: two epochs, every sample once
per epoch across the ranks, bit-exact against the local copies, and each object downloaded once
for the node (counted by a proxy in front of the server)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from fastpipe import Recipe
from fastpipe.data import H5Dataset, ParquetDataset, TarDataset
from fastpipe.data.samples import sample_images
from fastpipe.pack import pack
from tests.helpers.process import run_ranks
from tests.helpers.remote import ACCESS_KEY, SECRET_KEY

pytest.importorskip("h5py", exc_type=ImportError)

REPO = Path(__file__).resolve().parents[3]

_RANK = """
import hashlib, json, sys
sys.path[:0] = [{repo!r}]
import torch.distributed as dist
from fastpipe import DataLoaderX, Recipe
from fastpipe.data import (DistributedSampler, H5Dataset, ParquetDataset, RemoteOptions,
                           TarDataset)

def digest(image):
    return hashlib.sha256(image.numpy().tobytes()).hexdigest()

def epochs(dataset, sampler, loader):
    out = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = []
        for batch in loader:
            images, labels = batch[0], batch[1]
            seen += [[digest(images[k]), int(labels[k])] for k in range(len(labels))]
        out.append(seen)
    return out

def main():
    dist.init_process_group("gloo")
    shards, packed, parquet = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    options, out = json.loads(sys.argv[4]), sys.argv[5]
    options = RemoteOptions(**options)
    recipe = Recipe(train=False, size=16)
    tar = TarDataset(shards, fields=["jpg", "cls"], recipe=recipe, remote=options)
    sampler = DistributedSampler(tar, seed=3)
    loader = DataLoaderX(tar, batch_size=4, sampler=sampler, num_workers=2,
                         multiprocessing_context="fork")
    result = {{"tar": epochs(tar, sampler, loader)}}
    h5 = H5Dataset(packed, recipe=recipe, remote=options)
    sampler = DistributedSampler(h5, seed=3)
    loader = DataLoaderX(h5, batch_size=4, sampler=sampler, num_workers=2,
                         worker_method="thread")
    result["pack"] = epochs(h5, sampler, loader)
    hub = ParquetDataset(parquet, fields=["image", "label"], recipe=recipe, remote=options)
    sampler = DistributedSampler(hub, seed=3)
    loader = DataLoaderX(hub, batch_size=4, sampler=sampler, num_workers=2,
                         multiprocessing_context="spawn", persistent_workers=True)
    result["parquet"] = epochs(hub, sampler, loader)
    json.dump(result, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory, moto_server, nginx_root):
    folder = tmp_path_factory.mktemp("ddp")
    images = sample_images(folder / "images", num_images=12, num_classes=3)
    (folder / "packs").mkdir()
    pack(images, folder / "packs" / "train.h5", progress=False)
    moto_server.upload(folder / "packs", "ddp")
    (nginx_root / "ddp").mkdir(exist_ok=True)
    (nginx_root / "ddp" / "train.h5").write_bytes((folder / "packs" / "train.h5").read_bytes())
    return folder / "packs" / "train.h5"


def _expected(dataset) -> list[tuple[str, int]]:
    out = []
    for i in range(len(dataset)):
        image, label = dataset[i][0], dataset[i][1]
        out.append((hashlib.sha256(image.numpy().tobytes()).hexdigest(), int(label)))
    return sorted(out)


@pytest.fixture(scope="module")
def hub(tmp_path_factory, moto_server, nginx_root):
    pytest.importorskip("pyarrow")
    pytest.importorskip("datasets", exc_type=ImportError)
    from tests.helpers.parquet import hub_dataset

    root = tmp_path_factory.mktemp("ddp-hub")
    hub_dataset(root, rows=14, shards=2, row_group=3)
    moto_server.upload(root, "ddp-hub")
    names = [p.name for p in sorted((root / "data").glob("*.parquet"))]
    (nginx_root / "hub").mkdir(exist_ok=True)
    for name in names:
        (nginx_root / "hub" / name).write_bytes((root / "data" / name).read_bytes())
    return root, names


def _two_ranks(tmp_path: Path, shards: str, packed_url: str, parquet: str | list[str],
               options: dict) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(_RANK.format(repo=str(REPO)))
    run_ranks([sys.executable, str(script), shards, packed_url, json.dumps(parquet),
               json.dumps(options), str(tmp_path / "r{rank}.json")], 2, timeout=240, cwd=REPO)
    return [json.loads((tmp_path / f"r{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("served", ["s3", "gs", "http"])
def test_two_ranks_read_every_sample_once_and_download_each_object_once(
        served, shards, packed, hub, moto_server, fault_proxy, cache_dir, tmp_path, request):
    if served == "s3":
        proxy = fault_proxy(moto_server.endpoint)
        options = {"cache_dir": str(cache_dir), "storage_options": {
            "key": ACCESS_KEY, "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"}}}
        shard_url, pack_url = shards.s3, "s3://ddp/train.h5"
        parquet = "s3://ddp-hub/"  # the Hub's layout: data/train-0000k-of-00002.parquet
    elif served == "gs":
        server = request.getfixturevalue("gcs_server")
        shard_url = request.getfixturevalue("gcs_shards")
        server.upload(packed.parent, "ddp")
        server.upload(hub[0], "ddp-hub")
        proxy = fault_proxy(server.endpoint)
        options = {"cache_dir": str(cache_dir), "storage_options": server.storage(proxy.url)}
        pack_url, parquet = "gs://ddp/train.h5", "gs://ddp-hub/"
    else:
        proxy = fault_proxy(request.getfixturevalue("nginx_server").url)
        options = {"cache_dir": str(cache_dir)}
        shard_url = f"{proxy.url}/train/{{000000..000002}}.tar"
        pack_url = f"{proxy.url}/ddp/train.h5"
        parquet = [f"{proxy.url}/hub/{name}" for name in hub[1]]
    results = _two_ranks(tmp_path, shard_url, pack_url, parquet, options)
    recipe = Recipe(train=False, size=16)
    expected = {"tar": _expected(TarDataset(shards.folder, fields=["jpg", "cls"],
                                            recipe=recipe)),
                "pack": _expected(H5Dataset(packed, recipe=recipe)),
                "parquet": _expected(ParquetDataset(hub[0], fields=["image", "label"],
                                                    recipe=recipe))}
    for kind in ("tar", "pack", "parquet"):
        for epoch in range(2):
            seen = [tuple(s) for rank in results for s in rank[kind][epoch]]
            assert sorted(seen) == expected[kind], f"{kind}, epoch {epoch}"
        assert len(results[0][kind][0]) == len(results[1][kind][0])  # equal shares
    # one download per object for the node (each fits one range request); a Parquet file's
    # footer is read by each rank when it opens the dataset, and these files are smaller than
    # the 64 KiB its read takes from the end: one whole-file range each, beside the download
    for name in ("000000.tar", "000001.tar", "000002.tar", "train.h5"):
        assert proxy.gets(name) == 1, (name, proxy.ranges(name))
    for name in hub[1]:
        assert proxy.gets(name) == 2 + 1, (name, proxy.ranges(name))
