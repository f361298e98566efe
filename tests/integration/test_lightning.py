"""fastpipe loaders under PyTorch Lightning 2.6 DDP: 2 CPU processes on gloo (ddp_spawn).

Every case runs tests/integration/lightning_ddp.py in a subprocess with a timeout and reads the
sample ids each rank trained on: the ranks' shards must be disjoint, cover the dataset, and be
reshuffled every epoch; a loader Lightning cannot shard must be refused with the fix.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers.process import run_group

pytest.importorskip("lightning", exc_type=ImportError)

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().with_name("lightning_ddp.py")
SAMPLES = 20


def run(scenario: str, out: Path) -> dict[int, dict[int, list[int]]]:
    """{rank: {epoch: ids in order}} of a 2-process run of ``scenario``."""
    done = run_group([sys.executable, str(SCRIPT), str(out), scenario], timeout=480, cwd=ROOT,
                     env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    if (out / "error.txt").exists():
        raise RuntimeError((out / "error.txt").read_text())
    seen: dict[int, dict[int, list[int]]] = {}
    for rank in (0, 1):
        for line in (out / f"rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            seen.setdefault(rank, {}).setdefault(record["epoch"], []).extend(record["ids"])
    return seen


def assert_sharded_and_reshuffled(seen: dict[int, dict[int, list[int]]]) -> None:
    for epoch in (0, 1):
        shards = [seen[rank][epoch] for rank in (0, 1)]
        assert all(len(shard) == SAMPLES // 2 for shard in shards), shards
        assert not set(shards[0]) & set(shards[1]), f"epoch {epoch}: ranks share samples"
        assert sorted(shards[0] + shards[1]) == list(range(SAMPLES))
    for rank in (0, 1):
        assert seen[rank][0] != seen[rank][1], "the order must change between epochs"


@pytest.mark.parametrize("scenario", ["dataloaderx", "prefetcher_sharded", "peeked_dataloaderx"])
def test_lightning_ddp_shards_and_reshuffles_fastpipe_loaders(scenario, tmp_path):
    assert_sharded_and_reshuffled(run(scenario, tmp_path))


def test_lightning_ddp_refuses_an_unsharded_prefetcher_with_the_fix(tmp_path):
    with pytest.raises(RuntimeError) as caught:
        run("prefetcher_unsharded", tmp_path)
    message = str(caught.value)
    assert "every process would iterate the whole dataset" in message
    assert "on_after_batch_transfer" in message and "DistributedSampler" in message
