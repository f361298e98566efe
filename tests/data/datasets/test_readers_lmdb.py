"""LMDB packs: round trips, DataLoader workers, verify, and the same errors as HDF5."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("h5py", exc_type=ImportError)
lmdb = pytest.importorskip("lmdb", exc_type=ImportError)

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from fastpipe.data import H5Dataset, LMDBDataset, PackFormatError  # noqa: E402
from fastpipe.pack import merge_packs, pack, verify  # noqa: E402
from tests.helpers.pack import ArrayDataset  # noqa: E402

pytestmark = pytest.mark.hdf5


def test_bytes_round_trip_is_bit_exact(sample_root, tmp_path):
    out = tmp_path / "p.lmdb"
    report = pack(sample_root, out, num_workers=2, shard_size=20, progress=False)
    assert (report.format, report.merge, report.count) == ("lmdb", "copy", 48)
    assert (out.is_file() and not (tmp_path / "p.lmdb-lock").exists()
            and not (tmp_path / "p.lmdb.shards").exists())
    files = sorted(sample_root.glob("class_*/*.jpg"), key=lambda p: (p.parent.name, p.name))
    ds = LMDBDataset(out)
    assert ds.classes == ["class_00", "class_01", "class_02", "class_03"]
    for i, path in enumerate(files):
        data, label = ds.encoded(i)
        assert data.tobytes() == path.read_bytes() and label == int(path.parent.name[-2:])
        assert ds.path(i) == f"{path.parent.name}/{path.name}"
    h5 = pack(sample_root, tmp_path / "p.h5", progress=False)
    assert h5.count == 48
    assert torch.equal(ds[11][0], H5Dataset(tmp_path / "p.h5")[11][0])
    assert verify(out).ok


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_array_round_trip_through_dataloader_workers(tmp_path, no_thread_leak):
    source = ArrayDataset(n=30)
    out = tmp_path / "a.lmdb"
    pack(source, out, storage="array", format="lmdb", progress=False)
    ds = LMDBDataset(out)
    ds[0]  # opened in the parent first
    for context in ("fork", "spawn"):
        loader = DataLoader(ds, batch_size=7, num_workers=2, multiprocessing_context=context)
        images, labels = zip(*loader, strict=True)
        want = torch.stack(
            [torch.from_numpy(source.array(i).transpose(2, 0, 1).copy()) for i in range(30)])
        assert torch.equal(torch.cat(images), want)
        assert torch.cat(labels).tolist() == [source.label(i) for i in range(30)]
    ds.close()


def test_merge_shards_into_lmdb_and_verify_catches_damage(sample_root, tmp_path):
    parts = [tmp_path / f"s{i}.h5" for i in range(2)]
    for i, part in enumerate(parts):
        pack(sample_root, part, part=(i, 2), progress=False)
    out = tmp_path / "m.lmdb"
    assert merge_packs(parts, out, progress=False).count == 48
    ds = LMDBDataset(out)
    assert np.array_equal(ds.targets, np.concatenate([H5Dataset(p).targets for p in parts]))
    assert ds.path(47) == H5Dataset(parts[1]).path(23)
    with pytest.raises(ValueError, match="LMDB has no virtual"):
        merge_packs(parts, tmp_path / "v.lmdb", merge="virtual")
    assert verify(out).ok  # while the dataset holds the file open in this process
    ds.close()
    # Damage one stored JPEG in place; the checksum catches it even where the JPEG still decodes.
    env = lmdb.open(str(out), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(b"f/image/0000000007"))
        value[len(value) // 2] ^= 0xFF
        txn.put(b"f/image/0000000007", bytes(value))
    env.close()
    report = verify(out)
    assert (not report.ok and report.problems[0].startswith("sample 7 ")
            and "checksum" in report.problems[0])


def test_not_an_lmdb_pack(tmp_path, sample_root):
    env = lmdb.open(str(tmp_path / "plain.lmdb"), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    with pytest.raises(PackFormatError, match="not a fastpipe pack"):
        LMDBDataset(tmp_path / "plain.lmdb")
    pack(sample_root, tmp_path / "p.lmdb", progress=False)
    with pytest.raises(IndexError, match="index 48 is out of range"):
        LMDBDataset(tmp_path / "p.lmdb")[48]
    with pytest.raises(PackFormatError,
                       match=r"LMDB file, but H5Dataset reads HDF5 packs: .*LMDBDataset"):
        H5Dataset(tmp_path / "p.lmdb")
    pack(sample_root, tmp_path / "p.h5", progress=False)
    with pytest.raises(PackFormatError,
                       match=r"HDF5 file, but LMDBDataset reads LMDB packs: .*H5Dataset"):
        LMDBDataset(tmp_path / "p.h5")


def test_lmdb_draws_what_h5_draws_for_the_same_seed(sample_root, tmp_path):
    """Per-sample randomness belongs to (seed, epoch, index), not to the storage."""
    from fastpipe.data import ImageDecoder

    pack(sample_root, tmp_path / "p.lmdb", progress=False)
    pack(sample_root, tmp_path / "p.h5", progress=False)
    kwargs = {"decoder": ImageDecoder(train=True, size=40), "auto_augment": "ra", "seed": 3}
    ours, theirs = (LMDBDataset(tmp_path / "p.lmdb", **kwargs),
                    H5Dataset(tmp_path / "p.h5", **kwargs))
    ours.set_epoch(2), theirs.set_epoch(2)
    assert all(torch.equal(ours[i][0], theirs[i][0]) for i in range(6))
    assert ours.targets.dtype == np.int64 and np.array_equal(ours.targets, theirs.targets)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_thread_workers_read_through_a_transaction_each(sample_root, tmp_path, no_thread_leak):
    import threading

    from fastpipe import DataLoaderX
    from fastpipe.data import ImageDecoder, fast_collate

    out = tmp_path / "p.lmdb"
    pack(sample_root, out, progress=False)
    ds = LMDBDataset(out, decoder=ImageDecoder(train=True, size=32), seed=2)
    kwargs = dict(batch_size=8, shuffle=True, seed=1, collate_fn=fast_collate, num_workers=2)
    by_processes = DataLoaderX(ds, **kwargs)
    processes = [batch for _ in range(2) for batch in by_processes]
    loader = DataLoaderX(ds, worker_method="thread", **kwargs)
    threads = [batch for _ in range(2) for batch in loader]  # 2 epochs: 4 threads in all
    assert len(threads) == len(processes) == 12
    for (a, la), (b, lb) in zip(threads, processes, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    reader = ds.source._handles()
    # A transaction is used by one thread only (LMDB's rule), and those of ended threads are
    # ended when a new thread begins one, so they do not pile up epoch after epoch.
    assert len(reader._txns) <= 3
    txns, both_running = {}, threading.Barrier(2)

    def use() -> None:
        both_running.wait()  # alive together, so their idents differ
        txns[threading.get_ident()] = reader.txn()
        both_running.wait()

    workers = [threading.Thread(target=use) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len({id(txn) for txn in txns.values()}) == 2
    ds.close()
    assert reader._txns == {}
