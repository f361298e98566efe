"""The cuda lane itself: its tests skip cleanly without a GPU, and fail the run when
FASTPIPE_REQUIRE_CUDA=1 (so a GPU run cannot pass by skipping). How the lane is collected is in
test_lane_collection.py.

Run in a subprocess on this very file's probe, so the outcome is pytest's own report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()


@pytest.mark.cuda
def test_probe_runs_on_a_gpu():
    assert torch.cuda.is_available()
    assert torch.zeros(1, device="cuda").add(1).item() == 1


def _run_probe(require: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FASTPIPE_REQUIRE_CUDA"}
    if require:
        env["FASTPIPE_REQUIRE_CUDA"] = "1"
    command = [sys.executable, "-m", "pytest", f"{HERE}::test_probe_runs_on_a_gpu", "-q", "-rs",
               "-p", "no:cacheprovider"]
    return subprocess.run(command, capture_output=True, text=True, cwd=HERE.parents[2],
                          env=env, timeout=120)


@pytest.mark.timeout(150)
def test_cuda_tests_skip_without_a_gpu_and_fail_when_one_is_required():
    plain, required = _run_probe(False), _run_probe(True)
    if torch.cuda.is_available():
        assert plain.returncode == 0 and "1 passed" in plain.stdout, plain.stdout
        assert required.returncode == 0 and "1 passed" in required.stdout, required.stdout
        return
    assert plain.returncode == 0 and "1 skipped" in plain.stdout, plain.stdout
    assert "no CUDA GPU" in plain.stdout
    # Reported at set-up (an error, before any fixture touches CUDA): the run fails either way.
    assert required.returncode == 1 and "1 error" in required.stdout, required.stdout
    assert "FASTPIPE_REQUIRE_CUDA=1 requires one" in required.stdout
