"""TarDataset: WebDataset shards read in place (index cached beside each shard), and packed."""

from __future__ import annotations

import io
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch

from fastpipe.data import PackFormatError, TarDataset
from fastpipe.data.sources.tar import INDEX_SUFFIX
from tests.helpers.pack import write_shards


def test_samples_group_by_key_and_fields_by_extension(tmp_path):
    jpegs = write_shards(tmp_path / "s", shards=2, per_shard=4)
    ds = TarDataset(tmp_path / "s")
    assert len(ds) == 8 and list(ds.fields) == ["cls", "jpg", "txt"]
    sample = ds[5]
    assert sample["cls"] == 2 and sample["txt"] == "sample 5"
    assert sample["jpg"].dtype == torch.uint8 and sample["jpg"].shape == (3, 20, 29)
    image, label = TarDataset(sorted((tmp_path / "s").glob("*.tar")), fields=["jpg", "cls"])[6]
    assert label == 0 and image.shape == (3, 20, 30)
    assert ds.path(5).endswith("000001.tar:00005")
    from fastpipe.data.sources.tar import TarSource

    with TarSource(tmp_path / "s") as source:
        assert all(source.read(k)["jpg"].tobytes() == jpegs[k] for k in range(8))


def test_the_index_is_cached_and_rebuilt_when_a_shard_changes(tmp_path):
    write_shards(tmp_path / "s", shards=1, per_shard=3)
    shard = tmp_path / "s" / "000000.tar"
    cache = shard.with_name(shard.name + INDEX_SUFFIX)
    TarDataset(shard)
    assert cache.is_file()
    stamp = cache.stat().st_mtime_ns
    TarDataset(shard)
    assert cache.stat().st_mtime_ns == stamp  # reused, not rebuilt
    with tarfile.open(shard, "a") as tar:
        info = tarfile.TarInfo("00003.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"7"))
    ds = TarDataset(shard, fields=["cls"])
    assert len(ds) == 4 and ds[3] == (7,)


@pytest.mark.slow
def test_works_after_pickling_in_a_spawned_worker_and_threads(tmp_path, no_thread_leak):
    from fastpipe import DataLoaderX

    write_shards(tmp_path / "s", shards=2, per_shard=5)
    ds = TarDataset(tmp_path / "s", fields=["cls", "txt"])
    assert pickle.loads(pickle.dumps(ds))[4] == (1, "sample 4")
    for kwargs in ({"worker_method": "thread"}, {"multiprocessing_context": "spawn"}):
        seen = [t for _, texts in DataLoaderX(ds, batch_size=3, num_workers=2, **kwargs)
                for t in texts]
        assert sorted(seen) == sorted(f"sample {k}" for k in range(10))


def _shard(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_pickles_are_refused_and_missing_fields_named(tmp_path):
    _shard(tmp_path / "p.tar", [("a.pyd", b"\x80\x04N."), ("a.cls", b"1")])
    with pytest.raises(PackFormatError, match="does not unpickle"):
        TarDataset(tmp_path / "p.tar")
    assert TarDataset(tmp_path / "p.tar", fields=["cls"])[0] == (1,)
    _shard(tmp_path / "m.tar", [("a.jpg", b"x"), ("a.cls", b"1"), ("b.cls", b"2")])
    with pytest.raises(PackFormatError, match="sample 'b' .* has no 'jpg' member"):
        TarDataset(tmp_path / "m.tar")
    _shard(tmp_path / "n.tar", [("a.cls", b"one")])
    with pytest.raises(PackFormatError, match="'cls' member of .*a is b'one', not an integer"):
        TarDataset(tmp_path / "n.tar")[0]


def test_npy_members_are_arrays(tmp_path):
    buffer = io.BytesIO()
    np.save(buffer, np.arange(6, dtype=np.int16).reshape(2, 3))
    _shard(tmp_path / "a.tar", [("a.npy", buffer.getvalue()), ("a.cls", b"3")])
    sample = TarDataset(tmp_path / "a.tar")[0]
    assert sample["npy"].dtype == torch.int16 and sample["npy"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_pack_reads_shards_in_place_keeping_the_image_bytes(tmp_path):
    h5py = pytest.importorskip("h5py", exc_type=ImportError)
    from fastpipe.data import H5Dataset
    from fastpipe.pack import pack

    jpegs = write_shards(tmp_path / "s", shards=2, per_shard=5)
    report = pack(tmp_path / "s", tmp_path / "w.h5", num_workers=2, progress=False)
    assert report.count == 10
    with h5py.File(tmp_path / "w.h5") as f:
        o = f["_fastpipe/offsets/jpg"]
        assert all(f["jpg"][o[k]:o[k + 1]].tobytes() == jpegs[k] for k in range(10))
        assert list(f["cls"][:]) == [k % 3 for k in range(10)]
    assert H5Dataset(tmp_path / "w.h5")[4]["txt"] == "sample 4"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]
