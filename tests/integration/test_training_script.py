"""examples/train_classification.py, a script in the shape of torchvision's reference train.py,
runs with each loader swap: its evaluate() reads ``data_loader.dataset``, it mixes batches at
collate time (DataLoader, DataLoaderX) or in DataPrefetcher's batch_transform, and calls
``set_epoch`` under torchrun."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers.process import run_group

pytest.importorskip("torchvision", exc_type=ImportError)

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_classification.py"


def _run(args: list[str]) -> str:
    done = run_group([sys.executable, *args], timeout=300, cwd=ROOT,
                     env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("loader", ["dataloader", "dataloaderx", "prefetcher", "both"])
def test_reference_shaped_script_trains_and_evaluates_with_each_loader(loader, sample_root):
    out = _run([str(SCRIPT), "--loader", loader, "--epochs", "2", "--data-path", str(sample_root)])
    assert out.count("evaluated 48 of 48 samples") == 2
    assert f"epoch 1 loader {loader}:" in out


def test_the_factory_in_the_script_with_a_partial_last_batch(sample_root):
    # 48 samples in batches of 20: the last batch of each epoch holds 8.
    out = _run([str(SCRIPT), "--loader", "image_loader", "--epochs", "2", "-b", "20",
                "--data-path", str(sample_root)])
    assert out.count("evaluated 48 of 48 samples") == 2
    assert "epoch 1 loader image_loader:" in out


def test_the_factory_in_the_script_under_torchrun(sample_root):
    # Two shards of 24 in batches of 20: a partial batch of 4 on each rank.
    out = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                str(SCRIPT), "--loader", "image_loader", "--epochs", "2", "-b", "20",
                "--data-path", str(sample_root)])
    assert out.count("evaluated 48 of 48 samples") == 2
    assert "epoch 1 loader image_loader:" in out


def test_reference_shaped_script_under_torchrun_with_two_processes(sample_root):
    out = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                str(SCRIPT), "--loader", "both", "--epochs", "2", "--data-path", str(sample_root)])
    # 48 samples in two shards of 24: every sample evaluated once, no padding.
    assert out.count("evaluated 48 of 48 samples") == 2
    assert "epoch 1 loader both:" in out
