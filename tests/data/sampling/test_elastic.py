"""Elastic, exact resume in the shard-aware order, with real processes: a job of 4 gloo ranks (each
with 2 worker processes) reads a Hub-layout Parquet dataset in windows of shards, is stopped
mid-epoch, and restarts on 3 ranks (no workers) and on 6 ranks (2 worker threads). The union of
what was read before and after is every sample of the epoch exactly once, in the one global order
of (seed, epoch); each sample's pixels are the draws an uninterrupted run gives it; every rank
takes the same number of steps."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pyarrow")
pytest.importorskip("datasets", exc_type=ImportError)

import fastpipe  # noqa: E402
from fastpipe.data import ParquetDataset, SampleIndex  # noqa: E402
from fastpipe.data.sampling.order import shard_sizes_of, windowed_permutation  # noqa: E402
from tests.helpers.parquet import hub_dataset  # noqa: E402
from tests.helpers.process import run_ranks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(fastpipe.__file__).resolve().parent.parent
ROWS, SHARDS, WINDOW, SEED, AUGMENT_SEED, BATCH, SAVED_STEPS = 120, 6, 2, 5, 11, 4, 3
RECIPE = fastpipe.Recipe(train=True, size=24)

# One rank: phase "save" reads SAVED_STEPS batches and saves the loader's state, as a job that is
# preempted; phase "resume" loads the state of rank (rank % 4) and reads the rest of the epoch.
# Each records the ids and images of its batches and the step count of every rank.
_SCRIPT = """
import sys, torch, torch.distributed as dist
sys.path[:0] = [{repo!r}]
import fastpipe
from fastpipe import DataLoaderX
from fastpipe.data import DistributedSampler, ParquetDataset, TarDataset, fast_collate
phase, folder, data, workers, method = sys.argv[1:6]
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
recipe = fastpipe.Recipe(train=True, size=24)
dataset = {dataset}


def pick(batch):
    # (ids, images) of a batch: a Parquet record's dict, or tar shards' (jpg, id) tuple.
    return (batch["id"], batch["image"]) if isinstance(batch, dict) else (batch[1], batch[0])


sampler = DistributedSampler(dataset, seed={seed}, window={window})
loader = DataLoaderX(dataset, batch_size={batch}, sampler=sampler, num_workers=int(workers),
                     worker_method=method, collate_fn=fast_collate)
seen = []
if phase == "save":
    batches = iter(loader)
    for _ in range({steps}):
        ids, images = pick(next(batches))
        seen.append((ids.clone(), images.clone()))
    state = loader.state_dict()
    del batches
    torch.save(state, f"{{folder}}/state{{rank}}.pt")
else:
    loader.load_state_dict(torch.load(f"{{folder}}/state{{rank % 4}}.pt", weights_only=True))
    for batch in loader:
        ids, images = pick(batch)
        seen.append((ids.clone(), images.clone()))
steps = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
dist.all_gather(steps, torch.tensor([len(seen)]))
torch.save({{"seen": seen, "steps": [int(s) for s in steps]}},
           f"{{folder}}/{{phase}}{{world_size}}-{{rank}}.pt")
dist.destroy_process_group()
"""


def _load(folder: Path, phase: str, world_size: int) -> list[dict]:
    return [torch.load(folder / f"{phase}{world_size}-{r}.pt", weights_only=True)
            for r in range(world_size)]


def _global(ranks: list[dict]) -> list[int]:
    """The ranks' samples interleaved step by step: the order they were dealt from."""
    per_rank = [torch.cat([ids for ids, _ in r["seen"]]).tolist() for r in ranks]
    assert len({len(p) for p in per_rank}) == 1
    return [p[k] for k in range(len(per_rank[0])) for p in per_rank]


PARQUET = "ParquetDataset(data, recipe=recipe, seed={augment})"


def script_text(dataset: str = PARQUET) -> str:
    """The rank script, its dataset built by the expression ``dataset`` (of ``data``, the path
    or URL given, and ``recipe``)."""
    return _SCRIPT.format(repo=str(REPO), seed=SEED, window=WINDOW, batch=BATCH,
                          steps=SAVED_STEPS, dataset=dataset.format(augment=AUGMENT_SEED))


def _image(sample) -> torch.Tensor:
    return sample["image"] if isinstance(sample, dict) else sample[0]


def check_elastic_resume(script: Path, folder: Path, data: str, dataset,
                         resumes: list[tuple[int, str, str]]) -> None:
    """Saves on 4 ranks with 2 worker processes, resumes on each of ``resumes`` (world size,
    workers, worker_method), and checks the epoch: every sample once, in the global order, with
    the uninterrupted draws, equal steps per rank."""
    run_ranks([sys.executable, str(script), "save", str(folder), data, "2", "process"], 4,
              timeout=300, cwd=REPO)
    saved = _load(folder, "save", 4)
    order = windowed_permutation(shard_sizes_of(dataset), WINDOW, SEED, 0).tolist()
    assert _global(saved) == order[:4 * BATCH * SAVED_STEPS]
    for world_size, workers, method in resumes:
        run_ranks([sys.executable, str(script), "resume", str(folder), data, workers, method],
                  world_size, timeout=300, cwd=REPO)
        resumed = _load(folder, "resume", world_size)
        steps = {tuple(r["steps"]) for r in resumed}
        assert len(steps) == 1 and len(set(next(iter(steps)))) == 1, f"unequal steps: {steps}"
        rest = _global(resumed)
        assert rest == order[4 * BATCH * SAVED_STEPS:], "the rest of the same global order"
        counts = collections.Counter(_global(saved) + rest)
        assert sorted(counts) == list(range(ROWS)) and set(counts.values()) == {1}
        for ranks in (saved, resumed):
            for record in ranks:
                for ids, images in record["seen"]:
                    want = torch.stack([_image(dataset[SampleIndex(i, 0)])
                                        for i in ids.tolist()])
                    assert torch.equal(images, want), "the draws of an uninterrupted run"


def test_saved_on_4_ranks_mid_epoch_resumed_on_3_and_on_6(tmp_path):
    data = tmp_path / "hub"
    hub_dataset(data, rows=ROWS, shards=SHARDS, row_group=6, ids=True)
    script = tmp_path / "rank.py"
    script.write_text(script_text())
    dataset = ParquetDataset(data, recipe=RECIPE, seed=AUGMENT_SEED)
    assert np.array_equal(dataset.shard_sizes(), [ROWS // SHARDS] * SHARDS)
    check_elastic_resume(script, tmp_path, str(data), dataset,
                         [(3, "0", "process"), (6, "2", "thread")])


def _tar_shards(folder: Path) -> None:
    """The Hub dataset's rows as WebDataset shards: ``xxx.jpg`` + ``xxx.id``, 20 to a shard."""
    import io
    import tarfile

    from tests.helpers.parquet import jpeg

    folder.mkdir(parents=True)
    per_shard = ROWS // SHARDS
    for s in range(SHARDS):
        with tarfile.open(folder / f"{s:06d}.tar", "w") as tar:
            for i in range(s * per_shard, (s + 1) * per_shard):
                for name, data in ((f"{i:05d}.jpg", jpeg(i)), (f"{i:05d}.id", b"%d" % i)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def test_tar_shards_on_s3_saved_on_4_ranks_resumed_on_3_and_on_6(tmp_path, monkeypatch):
    pytest.importorskip("s3fs", exc_type=ImportError)
    pytest.importorskip("moto", exc_type=ImportError)
    import json

    from fastpipe.data import TarDataset
    from tests.helpers.remote import MotoServer

    _tar_shards(tmp_path / "tar")
    server = MotoServer()
    try:
        server.upload(tmp_path / "tar", "elastic", "tar/")
        options = {"storage_options": server.options().storage_options,
                   "cache_dir": str(tmp_path / "cache")}
        monkeypatch.setenv("FASTPIPE_TEST_REMOTE", json.dumps(options))
        script = tmp_path / "rank.py"
        script.write_text(script_text(
            "TarDataset(data, fields=['jpg', 'id'], recipe=recipe, seed={augment}, remote="
            "__import__('json').loads(__import__('os').environ['FASTPIPE_TEST_REMOTE']))"))
        dataset = TarDataset(tmp_path / "tar", fields=["jpg", "id"], recipe=RECIPE,
                             seed=AUGMENT_SEED)
        assert np.array_equal(dataset.source.shard_sizes(), [ROWS // SHARDS] * SHARDS)
        check_elastic_resume(script, tmp_path, "s3://elastic/tar/", dataset,
                             [(3, "0", "process"), (6, "2", "thread")])
    finally:
        server.stop()
