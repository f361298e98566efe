"""Packs, list files and image folders read over S3 (moto), Cloud Storage (gcp-storage-emulator)
and HTTP (nginx) through the node's cache, bit-exact against the local copies: a pack
downloaded once and checked against its CRC-32s (a damaged one refused, naming it; a virtual
merge refused with the fix), what a URL names (kind_of, resolve), and image_loader on a URL."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from fastpipe import Recipe, image_loader
from fastpipe.data import H5Dataset, ImageFolder, LMDBDataset, PackFormatError, RemoteOptions
from fastpipe.data.samples import sample_images
from fastpipe.data.sources.folder import ListSource
from fastpipe.data.sources.resolve import kind_of, resolve
from fastpipe.pack import pack

h5py = pytest.importorskip("h5py", exc_type=ImportError)
pytest.importorskip("lmdb", exc_type=ImportError)


@pytest.fixture(scope="module")
def data(tmp_path_factory, moto_server, nginx_root):
    """An image folder, a list file naming its images, and packs of it (HDF5, LMDB, a damaged
    one, a virtual merge), local, in moto's bucket 'data' and in nginx's folder 'data/'."""
    root = tmp_path_factory.mktemp("data")
    images = sample_images(root / "images", num_images=12, num_classes=3)
    lines = [f"images/{p.parent.name}/{p.name} {p.parent.name}"
             for p in sorted(images.rglob("*.jpg"))]
    (root / "train.txt").write_text("# path class\n" + "\n".join(lines) + "\n")
    (root / "packs").mkdir()
    (root / "virtual").mkdir()
    pack(images, root / "packs" / "train.h5", progress=False)
    pack(images, root / "packs" / "train.lmdb", format="lmdb", progress=False)
    shutil.copy(root / "packs" / "train.h5", root / "packs" / "damaged.h5")
    with h5py.File(root / "packs" / "damaged.h5", "r+") as f:  # one byte of sample 5's image
        start = int(f["_fastpipe/offsets/image"][5])
        f["image"][start + 300] ^= 0xFF
    pack(images, root / "virtual" / "train.h5", shard_size=4, merge="virtual", progress=False)
    moto_server.upload(root, "data")
    target = nginx_root / "data"
    shutil.copytree(root, target, dirs_exist_ok=True)
    return types.SimpleNamespace(root=root, images=images)


@pytest.fixture(scope="module")
def gcs_data(data, gcs_server):
    """The data folder in the Cloud Storage server's bucket 'data'."""
    gcs_server.upload(data.root, "data")
    return gcs_server


@pytest.fixture(params=["s3", "gs", "http"])
def at(request, moto_server, cache_dir):
    """A function: path relative to the data folder -> its URL; and the options to read it."""
    if request.param == "s3":
        return (lambda rel: f"s3://data/{rel}"), moto_server.options(cache_dir=cache_dir)
    if request.param == "gs":
        server = request.getfixturevalue("gcs_data")
        return (lambda rel: f"gs://data/{rel}"), server.options(cache_dir=cache_dir)
    server = request.getfixturevalue("nginx_server")
    return (lambda rel: f"{server.url}/data/{rel}"), RemoteOptions(cache_dir=cache_dir)


def _same_records(a, b) -> None:
    assert len(a) == len(b) and a.schema.names == b.schema.names
    for i in range(len(b)):
        x, y = a.read(i), b.read(i)
        assert all(np.array_equal(x[k], y[k]) for k in y), i


def test_packs_read_bit_exact_and_checked_once(data, at):
    url, options = at
    remote = H5Dataset(url("packs/train.h5"), remote=options)
    local = H5Dataset(data.root / "packs" / "train.h5")
    _same_records(remote.source, local.source)
    assert np.array_equal(remote.targets, local.targets) and remote.classes == local.classes
    assert remote.file == url("packs/train.h5") and "://" in remote.source.describe(3)
    remote_lmdb = LMDBDataset(url("packs/train.lmdb"), remote=options)
    _same_records(remote_lmdb.source, LMDBDataset(data.root / "packs" / "train.lmdb").source)
    # the datasets' samples too (decoded the same way)
    for i in (0, 7):
        assert torch.equal(remote[i][0], local[i][0]) and remote[i][1] == local[i][1]


def test_a_pack_damaged_at_its_source_is_refused_naming_it(data, at):
    url, options = at
    with pytest.raises(PackFormatError, match=r"damaged.h5: sample \d+, field 'image' does not "
                                              "match its checksum"):
        H5Dataset(url("packs/damaged.h5"), remote=options)
    assert not list(Path(options.cache_dir).rglob("damaged.h5"))  # never entered the cache


def test_a_virtual_merge_is_refused_with_the_fix(data, at):
    url, options = at
    with pytest.raises(PackFormatError, match="virtual merge.*merge='copy'"):
        H5Dataset(url("virtual/train.h5"), remote=options)


def test_list_files_and_image_folders_as_local(data, at):
    url, options = at
    listed = ListSource(url("train.txt"), remote=options)
    _same_records(listed, ListSource(data.root / "train.txt"))
    assert listed.classes == ["class_00", "class_01", "class_02"]
    assert listed.describe(0) == url("images/class_00/img_00000.jpg")
    recipe = Recipe(train=False, size=32)
    remote = ImageFolder(url("images/"), recipe=recipe, remote=options)
    local = ImageFolder(data.images, recipe=recipe)
    assert remote.classes == local.classes and np.array_equal(remote.targets, local.targets)
    for i in range(len(local)):
        assert torch.equal(remote[i][0], local[i][0]), i


def test_what_a_url_names(data, at):
    url, options = at
    assert kind_of(url("packs/train.h5"), options) == "hdf5"
    assert kind_of(url("packs/train.lmdb"), options) == "lmdb"
    assert kind_of(url("train.txt"), options) == "list"
    assert kind_of(url("images/"), options) == "folder"
    assert kind_of(url("images"), options) == "folder"
    with pytest.raises(FileNotFoundError, match="nothing-here does not exist"):
        kind_of(url("nothing-here"), options)
    with resolve(url("packs/train.h5"), remote=options) as source:
        assert len(source) == 12 and source.remote is not None


def test_kinds_over_s3_only(data, moto_server, shards, cache_dir):
    options = moto_server.options(cache_dir=cache_dir)
    assert kind_of("s3://shards/train/", options) == "tar"
    assert kind_of("s3://shards/train/{000000..000002}.tar", options) == "tar"
    assert kind_of("s3://shards/train/000001.tar", options) == "tar"
    with pytest.raises(ValueError, match="not a source fastpipe reads"):
        kind_of("s3://data/packs/", options)  # a folder of packs: name one of them


@pytest.mark.slow
def test_image_loader_reads_a_url_as_the_local_copy(data, moto_server, cache_dir):
    options = moto_server.options(cache_dir=cache_dir)
    kw = dict(batch_size=5, train=False, size=32, device="cpu", num_workers=2, seed=0)
    remote = image_loader("s3://data/packs/train.h5", remote=options, **kw)
    local = image_loader(data.root / "packs" / "train.h5", **kw)
    got, want = list(remote), list(local)
    assert len(got) == len(want) == 3  # 12 samples: a partial last batch of 2
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a, b) and torch.equal(la, lb)
    with pytest.raises(ValueError, match="DALI backend reads local files"):
        image_loader("s3://data/packs/train.h5", backend="dali", remote=options, **kw)
