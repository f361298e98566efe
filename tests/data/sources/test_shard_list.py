"""Shard lists (webdataset's JSON shard index): a TarDataset built from one indexes only its
first shard, each other one when it is first read, reads every sample as the shards themselves
give it, and refuses a shard that no longer holds what the list says, naming it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fastpipe import DataLoaderX, Recipe
from fastpipe.data import PackFormatError, TarDataset, write_shard_list
from fastpipe.data.sources.shardlist import KIND, read_shard_list
from fastpipe.data.sources.tar import INDEX_SUFFIX, TarSource
from tests.helpers.pack import write_shards


@pytest.fixture
def folder(tmp_path):
    write_shards(tmp_path / "shards", shards=3, per_shard=10)
    return tmp_path / "shards"


def _indexed(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("*" + INDEX_SUFFIX))


def _same(a: TarSource, b: TarSource, indices) -> None:
    for x, y in zip(a.read_batch(indices), b.read_batch(indices), strict=True):
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_the_list_written_is_webdatasets_format_with_each_shards_samples(folder):
    out = write_shard_list(folder, folder / "shards.json")
    doc = json.loads(out.read_text())
    assert doc["__kind__"] == KIND and doc["wids_version"] == 1
    assert [e["url"] for e in doc["shardlist"]] == [f"{k:06d}.tar" for k in range(3)]
    assert [e["nsamples"] for e in doc["shardlist"]] == [10, 10, 10]
    assert [e["filesize"] for e in doc["shardlist"]] == [
        (folder / f"{k:06d}.tar").stat().st_size for k in range(3)]
    listed = read_shard_list(out)
    assert listed.shards == [str(folder.resolve() / f"{k:06d}.tar") for k in range(3)]


def test_a_source_from_a_list_indexes_a_shard_when_it_is_first_read(folder, tmp_path):
    write_shard_list(folder, tmp_path / "elsewhere.json")  # full paths: not beside the shards
    local = TarSource(folder)
    for index in folder.glob("*" + INDEX_SUFFIX):
        index.unlink()
    source = TarSource(tmp_path / "elsewhere.json")
    assert len(source) == 30 and list(source.shard_sizes()) == [10, 10, 10]
    assert _indexed(folder) == ["000000.tar" + INDEX_SUFFIX]  # the first, for the fields
    assert source.describe(25).endswith("000002.tar (its sample 5)")
    _same(source, local, [25, 3, 24])
    assert _indexed(folder) == [f"{k:06d}.tar{INDEX_SUFFIX}" for k in (0, 2)]
    assert source.describe(25).endswith("000002.tar:00025")
    _same(source, local, list(range(30)))
    assert source.schema.names == local.schema.names
    assert source.fingerprint() == local.fingerprint()  # the same shards, the same plan


def test_through_worker_processes_every_sample_once_as_the_shards_give_it(folder):
    recipe = Recipe(train=False, size=16)
    listed = TarDataset(write_shard_list(folder, folder / "shards.json"),
                        fields=["jpg", "cls", "txt"], recipe=recipe)
    direct = TarDataset(folder, fields=["jpg", "cls", "txt"], recipe=recipe)

    def epoch(loader):
        return [(images[k].numpy().tobytes(), int(labels[k]), texts[k])
                for images, labels, texts in loader for k in range(len(labels))]

    # batches of 8 of 30: a partial last batch; the workers index shards 1 and 2 themselves
    got = epoch(DataLoaderX(listed, batch_size=8, num_workers=2))
    assert got == epoch(DataLoaderX(direct, batch_size=8, num_workers=0))
    assert sorted(t for _, _, t in got) == sorted(f"sample {k}" for k in range(30))


def test_a_shard_that_changed_after_the_list_is_refused_naming_it(folder, tmp_path):
    out = write_shard_list(folder, folder / "shards.json")
    doc = json.loads(out.read_text())
    doc["shardlist"][1]["nsamples"] = 11
    del doc["shardlist"][1]["filesize"]
    out.write_text(json.dumps(doc))
    source = TarSource(out)
    assert len(source) == 31
    source.read(3)  # shard 0 holds what the list says
    with pytest.raises(PackFormatError, match=r"000001\.tar holds 10 samples where the shard "
                                              r"list .*shards\.json says 11.*write the list"):
        source.read(12)
    doc["shardlist"][1]["nsamples"], doc["shardlist"][1]["filesize"] = 10, 7
    out.write_text(json.dumps(doc))
    with pytest.raises(PackFormatError, match=r"000001\.tar is \d+ bytes where the shard list "
                                              r".* says 7"):
        TarSource(out)


@pytest.mark.parametrize("doc, message", [
    ({"shards": []}, "no 'shardlist'"),
    ({"shardlist": [{"url": "000000.tar", "nsamples": -1}]}, "non-negative integer"),
    ({"shardlist": [{"url": "000000.tar", "nsamples": 1.5}]}, "non-negative integer"),
    ({"shardlist": [{"nsamples": 10}]}, "needs a 'url'"),
    ({"shardlist": [{"url": "000000.tar", "nsamples": 10},
                    {"url": "s3://b/000001.tar", "nsamples": 10}]}, "both URLs and local"),
])
def test_a_list_that_is_not_one_is_refused_saying_why(folder, doc, message):
    (folder / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(PackFormatError, match=message):
        TarSource(folder / "bad.json")
    (folder / "bad.json").write_text("{not json")
    with pytest.raises(PackFormatError, match="is not JSON"):
        TarSource(folder / "bad.json")


def test_base_path_and_lists_moved_with_their_shards(folder, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    out = write_shard_list(moved, moved / "shards.json")
    _same(TarSource(out), TarSource(folder), list(range(30)))
    doc = json.loads(out.read_text())
    doc["base_path"] = str(folder)
    (tmp_path / "based.json").write_text(json.dumps(doc))
    assert TarSource(tmp_path / "based.json").names[0] == str(folder / "000000.tar")


def test_image_loader_takes_a_shard_list_as_it_takes_the_shards(folder):
    """fastpipe.image_loader (and everything that asks what a path names) takes a shard list
    for tar shards: the same batches as from the folder of shards."""
    from fastpipe import image_loader
    from fastpipe.data.sources.resolve import kind_of

    out = write_shard_list(folder, folder / "shards.json")
    assert kind_of(out) == "tar"
    kw = dict(train=False, size=16, num_workers=0, device="cpu")
    got = [(x.clone(), y.clone()) for x, y in image_loader(out, 8, **kw)]
    want = [(x.clone(), y.clone()) for x, y in image_loader(folder, 8, **kw)]
    assert len(got) == len(want) == 4  # 30 samples: the last batch partial
    assert all(a.equal(c) and b.equal(d) for (a, b), (c, d) in zip(got, want, strict=True))
