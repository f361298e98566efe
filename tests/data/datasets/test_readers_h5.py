"""Reading packs: DataLoader workers under fork and spawn, DistributedSampler, bad files, verify."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

pytest.importorskip("h5py", exc_type=ImportError)

import h5py  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from fastpipe._cli import main  # noqa: E402
from fastpipe.data import H5Dataset, ImageDecoder, PackFormatError  # noqa: E402
from fastpipe.data.format import layout as fmt  # noqa: E402
from fastpipe.pack import pack, verify  # noqa: E402
from tests.helpers.pack import ArrayDataset, flip_byte, hflip  # noqa: E402

pytestmark = pytest.mark.hdf5


@pytest.fixture(scope="module")
def array_pack(tmp_path_factory):
    """40 random 24x32 images in array storage, packed by 2 workers into a virtual merge."""
    path = tmp_path_factory.mktemp("array") / "images.h5"
    pack(ArrayDataset(n=40), path, storage="array", num_workers=2, shard_size=12, progress=False)
    return path


@pytest.fixture(scope="module")
def bytes_pack(sample_root, tmp_path_factory):
    path = tmp_path_factory.mktemp("bytes") / "images.h5"
    pack(sample_root, path, num_workers=2, shard_size=16, merge="copy", progress=False)
    return path


def expected_arrays(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    source = ArrayDataset(n=n)
    images = torch.stack(
        [torch.from_numpy(source.array(i).transpose(2, 0, 1).copy()) for i in range(n)])
    return images, torch.tensor([source.label(i) for i in range(n)])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.slow
def test_dataloader_workers_read_the_right_samples(array_pack, context, no_thread_leak):
    ds = H5Dataset(array_pack)
    ds[3]  # a handle open in the parent before the workers start must not leak into them
    loader = DataLoader(ds, batch_size=6, num_workers=2, multiprocessing_context=context,
                        shuffle=False)
    images, labels = zip(*loader, strict=True)
    want_images, want_labels = expected_arrays()
    assert torch.equal(torch.cat(images), want_images)
    assert torch.equal(torch.cat(labels), want_labels)
    ds.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_dataloader_spawn_with_a_decoder_and_transform(bytes_pack, no_thread_leak):
    decoder = ImageDecoder(train=False, size=32)
    ds = H5Dataset(bytes_pack, decoder=decoder, transform=hflip)
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn")
    images, labels = zip(*loader, strict=True)
    want = torch.stack([hflip(decoder(ds.encoded(i)[0], f"{i}")) for i in range(len(ds))])
    assert torch.equal(torch.cat(images), want)
    assert torch.equal(torch.cat(labels), torch.from_numpy(ds.targets))


def test_distributed_sampler_covers_the_set_disjointly(bytes_pack):
    ds = H5Dataset(bytes_pack)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        sampler.set_epoch(1)
        indices = list(sampler)
        loader = DataLoader(ds, sampler=sampler, batch_size=None, collate_fn=lambda x: x)
        # What each rank reads is the sample its indices name.
        for index, (image, label) in zip(indices[:3], loader, strict=False):
            assert label == ds.targets[index] and image.shape[0] == 3
        seen.append(indices)
    assert len(seen[0]) == len(seen[1]) == 24
    assert not set(seen[0]) & set(seen[1])
    assert set(seen[0]) | set(seen[1]) == set(range(len(ds)))


def test_pickles_without_an_open_handle(array_pack):
    ds = H5Dataset(array_pack)
    first = ds[0][0]
    assert "_opened" in ds.source.__dict__  # this process's handles
    clone = pickle.loads(pickle.dumps(ds))
    assert "_opened" not in clone.source.__dict__
    assert torch.equal(clone[0][0], first)


def test_index_errors_are_clear(array_pack, bytes_pack):
    ds = H5Dataset(array_pack)
    with pytest.raises(IndexError,
                       match=r"index 40 is out of range for .*images\.h5 with 40 samples"):
        ds[40]
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, -41])
    assert torch.equal(ds[-1][0], ds[39][0])
    with pytest.raises(ValueError, match="encoded\\(\\) needs bytes storage"):
        ds.encoded(0)
    with pytest.raises(ValueError, match="decoder applies to bytes storage"):
        H5Dataset(array_pack, decoder=ImageDecoder())
    with pytest.raises(TypeError, match="int"):
        ds["0"]


def test_files_that_are_not_packs_are_refused(sample_root, tmp_path, bytes_pack):
    jpeg = next(sample_root.glob("class_00/*.jpg"))
    with pytest.raises(PackFormatError, match="cannot open .* as HDF5"):
        H5Dataset(jpeg)
    with h5py.File(tmp_path / "other.h5", "w") as f:  # a plain HDF5 file reads as records
        f["x"] = np.arange(3)
        f["y"] = np.arange(4)
    with pytest.raises(PackFormatError, match=r"different lengths \(x 3, y 4\).*fields="):
        H5Dataset(tmp_path / "other.h5")
    assert H5Dataset(tmp_path / "other.h5", fields=["x"])[2] == (2,)
    with pytest.raises(FileNotFoundError):
        H5Dataset(tmp_path / "missing.h5")
    damaged = tmp_path / "nolabels.h5"
    damaged.write_bytes(bytes_pack.read_bytes())
    with h5py.File(damaged, "a") as f:
        del f["label"]
    with pytest.raises(PackFormatError, match="without the dataset 'label'"):
        H5Dataset(damaged)
    assert "'label'" in verify(damaged).problems[0]


def test_verify_catches_a_flipped_byte(bytes_pack, tmp_path, capsys):
    damaged = tmp_path / "damaged.h5"
    damaged.write_bytes(bytes_pack.read_bytes())
    with h5py.File(damaged) as f:
        start, stop = f["_fastpipe/offsets/image"][5], f["_fastpipe/offsets/image"][6]
        where = f["image"].id.get_offset() + int(start + stop) // 2
    flip_byte(damaged, where)
    report = verify(damaged)
    assert not report.ok and report.checked == 48
    assert len(report.problems) == 1 and report.problems[0].startswith("sample 5 (class_00/")
    assert "checksum mismatch" in report.problems[0]
    assert main(["verify", str(damaged), "--quiet"]) == 1
    assert "1 problem" in capsys.readouterr().out
    assert verify(bytes_pack).ok


def test_verify_catches_a_missing_part_and_a_truncated_file(array_pack, bytes_pack, tmp_path):
    folder = tmp_path / "v"
    folder.mkdir()
    pack(ArrayDataset(n=10), folder / "v.h5", storage="array", num_workers=2, progress=False)
    part = next((folder / "v.h5.shards").glob("*/part-*.h5"))
    part.unlink()
    report = verify(folder / "v.h5")
    assert (not report.ok and "part files are missing" in report.problems[0]
            and part.name in report.problems[0])
    with pytest.raises(PackFormatError, match=f"put the part file {part} back"):
        H5Dataset(folder / "v.h5")
    import shutil

    shutil.rmtree(folder / "v.h5.shards")  # the whole folder gone: named, not its file
    with pytest.raises(PackFormatError, match=r"put the folder \S*v\.h5\.shards back"):
        H5Dataset(folder / "v.h5")
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(bytes_pack.read_bytes()[: bytes_pack.stat().st_size // 2])
    report = verify(truncated)
    assert not report.ok and report.problems


def test_verify_of_something_else(sample_root, tmp_path):
    jpeg = next(sample_root.glob("class_00/*.jpg"))
    report = verify(jpeg)
    assert not report.ok and "not a fastpipe pack" in report.problems[0]


@pytest.mark.parametrize("which", ["array", "bytes"])
@pytest.mark.slow
def test_a_pack_rewritten_with_compression_still_reads(array_pack, bytes_pack, tmp_path, which):
    """Data the direct reader cannot map (here gzip chunks, as after h5repack) reads through
    h5py."""
    source = array_pack if which == "array" else bytes_pack
    rewritten = tmp_path / "gzip.h5"
    with h5py.File(source) as src, h5py.File(rewritten, "w") as dst:
        for key, value in src.attrs.items():
            dst.attrs[key] = value

        def copy(key, ds):
            if not isinstance(ds, h5py.Dataset):
                return
            options = {"compression": "gzip", "chunks": True} if key == "image" else {}
            data = ds[()]
            if key == "_fastpipe/meta":  # every sample copied in: no part files any more,
                # and the metadata sealed again (verify checks it against its checksum)
                data = fmt.meta_json(fmt.sealed(dict(json.loads(data), merge="copy",
                                                     parts=None)))
            dst.create_dataset(key, data=data, dtype=ds.dtype, **options)

        src.visititems(copy)
    original, gz = H5Dataset(source), H5Dataset(rewritten)
    assert gz[0] is not None and gz.source._columns["image"].extents is None  # the h5py path
    for i in range(0, len(original), 5):
        assert torch.equal(gz[i][0], original[i][0]) and gz[i][1] == original[i][1]
    assert verify(rewritten).ok


def test_a_batch_of_array_records_is_the_samples_one_by_one(tmp_path):
    from fastpipe.data import fast_collate

    path = tmp_path / "plain.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["x"] = rng.standard_normal((30, 3, 5)).astype(np.float32)
        f["y"] = rng.integers(0, 9, (30, 2)).astype(np.int16)
    indices = [7, 0, 29, 3, 3]
    # Tuples in the order asked (fields=[...]); dicts of every field otherwise.
    for ds, keys in ((H5Dataset(path, fields=["y", "x"]), [0, 1]),
                     (H5Dataset(path), ["x", "y"])):
        for transform in (None, lambda r: (r[0], r[1] * 2) if isinstance(r, tuple)
                          else {**r, "x": r["x"] * 2}):
            ds.transform = transform
            batch = ds.__getitems__(indices)
            one_by_one = [ds[i] for i in indices]
            assert all(type(got) is type(want) for got, want in zip(batch, one_by_one,
                                                                      strict=True))
            for got, want in zip(batch, one_by_one, strict=True):
                assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype
                           for k in keys)
            collated = fast_collate(batch)
            for k in keys:
                assert torch.equal(collated[k], torch.stack([s[k] for s in one_by_one]))
