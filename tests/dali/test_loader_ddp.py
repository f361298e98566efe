"""DALILoader under torch.distributed: two processes, gloo on the CPU, DALI in CPU mode."""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from tests.helpers.dali import DALI_MISSING, ddp_worker, image_files, write_index_list

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)


pytestmark = [pytest.mark.dali, pytest.mark.slow, pytest.mark.timeout(150)]


def test_ranks_get_disjoint_covering_shards_reshuffled_every_epoch(sample_root, tmp_path):
    list_file = write_index_list(tmp_path / "index.txt", image_files(sample_root))
    mp.spawn(
        ddp_worker, args=(2, str(tmp_path / "init"), str(list_file), str(tmp_path)), nprocs=2,
        join=True
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # The shard comes from the process group, not from arguments.
    assert [r["shard"] for r in ranks] == [[0, 2], [1, 2]]
    assert [r["len"] for r in ranks] == [5, 5] and ranks[0]["total_steps"] == 10
    for epoch in range(2):
        shards = [r["epochs"][epoch] for r in ranks]
        assert len(shards[0]) == len(shards[1]) == 24
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(48))
    for r in ranks:
        assert r["epochs"][0] != r["epochs"][1]
        assert set(r["epochs"][0]) != set(r["epochs"][1]), (
            "each epoch deals a new share to every rank")
    # Each rank resumed its own stream mid-epoch exactly, and the ranks' streams stay disjoint.
    assert [r["resumed"] for r in ranks] == [True, True]
    assert not set(ranks[0]["resumed_labels"][:10]) & set(ranks[1]["resumed_labels"][:10])
