"""The speech workflow end to end: two-array records packed with workers, then read by 2 gloo
ranks with DistributedSampler + set_epoch through DataLoaderX (worker processes) and
DataPrefetcher: bit-exact, every sample once per epoch, reshuffled. The same from a hand-written
plain HDF5 file, with workers started by fork and by spawn, and with thread workers."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py", exc_type=ImportError)

from fastpipe.data.format.fields import ArrayField  # noqa: E402
from fastpipe.pack import pack  # noqa: E402
from tests.helpers.pack import SpeechRecords, write_shards  # noqa: E402
from tests.helpers.process import run_ranks  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
N = 30

_RANK = """
import json, sys, hashlib, torch, torch.distributed as dist
sys.path[:0] = [{repo!r}]
from fastpipe import DataLoaderX, DataPrefetcher
from fastpipe.data import DistributedSampler, H5Dataset
def main():
    dist.init_process_group("gloo")
    rank, path, start, out = dist.get_rank(), sys.argv[1], sys.argv[2], sys.argv[3]
    if sys.argv[4] == "tar":
        return tar(rank, path, start, out)
    dataset = H5Dataset(path, fields=["mix", "zone0", "label"])
    sampler = DistributedSampler(dataset, seed=3)
    loader = DataLoaderX(dataset, batch_size=4, sampler=sampler, num_workers=2,
                         multiprocessing_context=start)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = []
        for mix, zone0, label in DataPrefetcher(loader, device="cpu"):
            assert mix.dtype == torch.float32 and mix.shape[1:] == (4, 160), mix.shape
            for k in range(len(label)):
                digest = hashlib.sha256(mix[k].numpy().tobytes() + zone0[k].numpy().tobytes())
                seen.append([digest.hexdigest(), int(label[k])])
        epochs.append(seen)
    json.dump(epochs, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()


def tar(rank, path, start, out):
    from fastpipe import Recipe
    from fastpipe.data import TarDataset
    dataset = TarDataset(path, fields=["jpg", "cls", "txt"], recipe=Recipe(train=False, size=16))
    sampler = DistributedSampler(dataset, seed=3)
    loader = DataLoaderX(dataset, batch_size=4, sampler=sampler, num_workers=2,
                         multiprocessing_context=start)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = []
        for image, label, text in DataPrefetcher(loader, device="cpu"):
            assert image.dtype == torch.uint8 and image.shape[1:] == (3, 16, 16), image.shape
            seen += [[t, int(c)] for t, c in zip(text, label)]
        epochs.append(seen)
    json.dump(epochs, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":  # spawned workers import this file
    main()
"""


def _digest(mix: np.ndarray, zone0: np.ndarray) -> str:
    return hashlib.sha256(mix.tobytes() + zone0.tobytes()).hexdigest()


def _two_ranks(tmp_path: Path, path: Path, start: str, kind: str = "records"
               ) -> list[list[list]]:
    script = tmp_path / "rank.py"
    script.write_text(_RANK.format(repo=str(REPO)))
    run_ranks([sys.executable, str(script), str(path), start, str(tmp_path / "r{rank}.json"),
               kind], 2, timeout=240, cwd=REPO)
    return [json.loads((tmp_path / f"r{rank}.json").read_text()) for rank in range(2)]


def _check_epochs(results: list, source: SpeechRecords) -> None:
    expected = {_digest(source.record(i)["mix"], source.record(i)["zone0"]): source.record(i)[
        "label"] for i in range(N)}
    orders = []
    for epoch in range(2):
        seen = [tuple(s) for rank in results for s in rank[epoch]]
        assert sorted(d for d, _ in seen) == sorted(expected), "a sample was lost or repeated"
        assert all(expected[d] == label for d, label in seen)  # bit-exact, with its label
        orders.append([d for rank in results for d, _ in rank[epoch]])
    assert orders[0] != orders[1], "set_epoch did not reshuffle"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_speech_records_pack_then_two_ddp_ranks_read_every_sample_once(tmp_path):
    source = SpeechRecords(n=N)
    out = tmp_path / "speech.h5"
    pack(source, out, fields={"frames": ArrayField("int64", (None,))}, num_workers=2,
         shard_size=8, progress=False)
    _check_epochs(_two_ranks(tmp_path, out, "fork"), source)


def _plain_file(path: Path, source: SpeechRecords) -> None:
    """What users write by hand: one dataset per key, one row per sample."""
    with h5py.File(path, "w") as f:
        f["mix"] = np.stack([source.record(i)["mix"] for i in range(N)])
        f["zone0"] = np.stack([source.record(i)["zone0"] for i in range(N)])
        f["label"] = np.array([source.record(i)["label"] for i in range(N)], np.int64)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_plain_hdf5_file_under_ddp_with_fork_and_spawn_workers(tmp_path, start):
    source = SpeechRecords(n=N)
    path = tmp_path / "features.h5"
    _plain_file(path, source)
    _check_epochs(_two_ranks(tmp_path, path, start), source)


def test_a_plain_hdf5_file_through_thread_workers(tmp_path, no_thread_leak):
    import torch

    from fastpipe import DataLoaderX
    from fastpipe.data import H5Dataset

    source = SpeechRecords(n=N)
    path = tmp_path / "features.h5"
    _plain_file(path, source)
    loader = DataLoaderX(H5Dataset(path), batch_size=7, num_workers=2, worker_method="thread")
    seen = {}
    for batch in loader:
        assert set(batch) == {"mix", "zone0", "label"} and batch["mix"].dtype == torch.float32
        for k in range(len(batch["label"])):
            seen[_digest(batch["mix"][k].numpy(), batch["zone0"][k].numpy())] = int(
                batch["label"][k])
    assert seen == {_digest(source.record(i)["mix"], source.record(i)["zone0"]):
                    source.record(i)["label"] for i in range(N)}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_webdataset_shards_read_in_place_under_ddp_every_sample_once(tmp_path):
    write_shards(tmp_path / "shards")
    results = _two_ranks(tmp_path, tmp_path / "shards", "fork", kind="tar")
    orders = []
    for epoch in range(2):
        seen = [tuple(s) for rank in results for s in rank[epoch]]
        assert sorted(seen) == sorted((f"sample {k}", k % 3) for k in range(N))
        orders.append([t for rank in results for t, _ in rank[epoch]])
    assert orders[0] != orders[1]
