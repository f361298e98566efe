"""fastpipe loaders under Hugging Face accelerate 1.15: 2 CPU processes on gloo (torchrun).

tests/integration/accelerate_ddp.py runs once in a subprocess with a timeout; the tests read what
each rank saw. accelerate tracks the end of the data in its loader as it reads one batch ahead;
DataPrefetcher reads further ahead, and must keep ``end_of_dataloader`` true on exactly the last
batch, so that ``gather_for_metrics`` drops exactly the padding and gradient accumulation syncs
on the same steps as without it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers.process import run_group

pytest.importorskip("accelerate", exc_type=ImportError)

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().with_name("accelerate_ddp.py")
SAMPLES = 100


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerate")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(SCRIPT), str(out)]
    done = run_group(command, timeout=240, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_two_processes_ran(ranks):
    assert [r["world_size"] for r in ranks] == [2, 2]


@pytest.mark.parametrize("run", ["plain", "prefetcher"])
def test_shards_are_disjoint_cover_the_data_and_reshuffle(ranks, run):
    for epoch in (0, 1):
        gathered = ranks[0][run][epoch]["gathered"]
        # gather_for_metrics drops accelerate's padding: every sample exactly once.
        assert sorted(gathered) == list(range(SAMPLES)), f"{run}, epoch {epoch}"
        assert gathered == ranks[1][run][epoch]["gathered"]
    assert ranks[0][run][0]["ids"] != ranks[0][run][1]["ids"], "the order must change"


def test_end_of_dataloader_is_true_on_exactly_the_last_batch_through_the_prefetcher(ranks):
    for rank in ranks:
        for epoch in rank["prefetcher"]:
            assert epoch["end"] == [False] * (len(epoch["end"]) - 1) + [True]


def test_gradient_accumulation_syncs_on_the_same_steps_as_without_the_prefetcher(ranks):
    for rank in ranks:
        assert [e["sync"] for e in rank["prefetcher"]] == [e["sync"] for e in rank["plain"]]
        assert [e["end"] for e in rank["prefetcher"]] == [e["end"] for e in rank["plain"]]


def test_prepare_of_dataloaderx_warns_that_its_thread_is_dropped(ranks):
    for rank in ranks:
        assert any("background thread and prefetch_depth are dropped" in message
                   for message in rank["dataloaderx_warnings"])
        assert sorted(rank["dataloaderx"][0]["gathered"]) == list(range(SAMPLES))


def test_prepare_of_a_prefetcher_is_refused_with_the_fix(ranks):
    for rank in ranks:
        message = rank["prefetcher_prepared_error"]
        assert message is not None and "DataPrefetcher(accelerator.prepare(loader))" in message
