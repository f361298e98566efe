"""The offline GPU kit (scripts/gpu-kit.sh, docs/gpu.md), run here on the CPU: it must run to the
end, write every result file it promises, and report its CUDA steps as "no GPU" (a GPU machine
runs the kit itself, so these tests skip there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "scripts" / "gpu-kit.sh"


@pytest.fixture(autouse=True)
def cpu_only():
    if torch.cuda.is_available():
        pytest.skip("a GPU machine runs the kit itself (bash scripts/gpu-kit.sh, docs/gpu.md)")


def _kit(out: Path, *options: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("FASTPIPE_REQUIRE_CUDA", None)
    return subprocess.run(["bash", str(KIT), str(out), *options], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _summary(out: Path) -> dict[str, str]:
    lines = (out / "summary.txt").read_text().splitlines()
    return {line.split(":")[0]: line.split(":", 1)[1].strip() for line in lines}


@pytest.mark.slow  # two fastpipe processes (doctor) and a pytest collection: 20-90 s here
@pytest.mark.timeout(300)
def test_the_quick_kit_runs_to_the_end_on_the_cpu_and_says_no_gpu(tmp_path):
    out = tmp_path / "results"
    done = _kit(out, "--quick", timeout=290)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = _summary(out)
    assert list(steps) == ["build", "doctor", "cuda-lane", "cpu-checks", "bench"]
    for name in ("build", "cuda-lane"):
        assert steps[name].startswith("no GPU"), steps
    assert steps["doctor"].startswith("ok")
    assert steps["cpu-checks"] == steps["bench"] == "skipped (--quick)"
    doctor = json.loads((out / "doctor.json").read_text())
    assert doctor["cuda_available"] is False and doctor["torch"] == torch.__version__
    assert "driver" in doctor and "fastpipe will use:" in (out / "doctor.txt").read_text()
    env = (out / "env.txt").read_text()
    assert f"torch {torch.__version__}" in env and "GPU architectures: none" in env
    assert f"results: {out}" in done.stdout


def test_the_kit_refuses_an_unknown_option(tmp_path):
    done = _kit(tmp_path / "results", "--fast", timeout=30)
    assert done.returncode == 2 and "unknown option --fast" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_whole_kit_runs_to_the_end_on_the_cpu(tmp_path):
    """Every step: the CPU checks of the CUDA code (nvcc) run here; the bench says no GPU."""
    out = tmp_path / "results"
    done = _kit(out, timeout=590)
    assert done.returncode == 0, done.stdout + done.stderr + (out / "cpu-checks.log").read_text()
    steps = _summary(out)
    assert steps["cpu-checks"].startswith("ok") and steps["bench"].startswith("no GPU")
    assert " passed" in (out / "cpu-checks.log").read_text()
