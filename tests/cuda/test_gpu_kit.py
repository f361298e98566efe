"""The offline GPU kit (scripts/gpu-kit.sh, docs/gpu.md), run here on the CPU: it must run to the
end, return its results as one archive plus a summary (a lent machine brings back at most 8
files), bound every step by a time limit within the kit's deadline, and report its CUDA steps as
"no GPU" (a GPU machine runs the kit itself, so these tests skip there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "scripts" / "gpu-kit.sh"
STEPS = ["bundle", "build", "doctor", "cuda-lane", "bench", "cpu-checks"]


@pytest.fixture(autouse=True)
def cpu_only():
    if torch.cuda.is_available():
        pytest.skip("a GPU machine runs the kit itself (bash scripts/gpu-kit.sh, docs/gpu.md)")


def _kit(out: Path, *options: str, timeout: float, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, **env}
    environment.pop("FASTPIPE_REQUIRE_CUDA", None)
    return subprocess.run(["bash", str(KIT), str(out), *options], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=timeout)


def _summary(out: Path) -> dict[str, str]:
    lines = (out / "summary.txt").read_text().splitlines()
    return {line.split(":")[0]: line.split(":", 1)[1].strip() for line in lines}


def _results(out: Path, into: Path) -> Path:
    """The archive unpacked: the folder of logs, after checking what came back."""
    assert sorted(p.name for p in out.iterdir()) == ["gpu-results.tgz", "summary.txt"]
    with tarfile.open(out / "gpu-results.tgz") as archive:
        archive.extractall(into, filter="data")
    logs = into / "gpu-results"
    assert (logs / "summary.txt").read_text() == (out / "summary.txt").read_text()
    return logs


@pytest.mark.slow  # two fastpipe processes (doctor) and a pytest collection: 20-90 s here
@pytest.mark.timeout(300)
def test_the_quick_kit_runs_to_the_end_on_the_cpu_and_says_no_gpu(tmp_path):
    out, scratch = tmp_path / "results", tmp_path / "tmp"
    scratch.mkdir()
    done = _kit(out, "--quick", timeout=290, TMPDIR=str(scratch))
    assert done.returncode == 0, done.stdout + done.stderr
    steps = _summary(out)
    assert list(steps) == STEPS
    assert steps["bundle"].startswith(("ok", "skipped (no offline bundle"))
    for name in ("build", "cuda-lane"):
        assert steps[name].startswith("no GPU"), steps
    assert steps["doctor"].startswith("ok")
    assert steps["cpu-checks"] == steps["bench"] == "skipped (--quick)"
    logs = _results(out, tmp_path / "unpacked")
    doctor = json.loads((logs / "doctor.json").read_text())
    assert doctor["cuda_available"] is False and doctor["torch"] == torch.__version__
    assert "driver" in doctor and "nvjpeg" in doctor
    assert "fastpipe will use:" in (logs / "doctor.txt").read_text()
    env = (logs / "env.txt").read_text()
    assert f"torch {torch.__version__}" in env and "GPU architectures: none" in env
    assert f"results: {out}/summary.txt and {out}/gpu-results.tgz" in done.stdout
    assert not list(scratch.glob("fastpipe-kit.*")), "the kit left its work folder behind"


def test_the_kit_refuses_an_unknown_option(tmp_path):
    done = _kit(tmp_path / "results", "--fast", timeout=30)
    assert done.returncode == 2 and "unknown option --fast" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_step_that_hangs_is_stopped_at_its_limit_and_the_kit_ends_by_its_deadline(tmp_path):
    """Every step runs under a time limit, at most the time left of KIT_SECONDS: a doctor that
    hangs is stopped there, the steps after it run or are skipped for lack of time, and the
    results still come back."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\ncase "$*" in *"fastpipe doctor"*) exec sleep 600 ;; esac\n'
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "results"
    started = time.monotonic()
    done = _kit(out, timeout=110, PYTHON=str(python), KIT_SECONDS="25")
    took = time.monotonic() - started
    steps = _summary(out)
    assert list(steps) == STEPS, done.stdout + done.stderr
    assert steps["doctor"].startswith("timed out after"), steps
    assert done.returncode == 124
    assert steps["cuda-lane"].startswith("no GPU") and steps["bench"].startswith("no GPU")
    assert steps["cpu-checks"] == "skipped (the kit's 25 s are used up)"
    assert took < 25 + 10 + 20, f"the kit took {took:.0f} s for a deadline of 25 s"
    _results(out, tmp_path / "unpacked")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_whole_kit_runs_to_the_end_on_the_cpu(tmp_path):
    """Every step: the CPU checks of the CUDA code (nvcc) run here; the bench says no GPU."""
    out = tmp_path / "results"
    done = _kit(out, timeout=590)
    logs = _results(out, tmp_path / "unpacked")
    assert done.returncode == 0, done.stdout + done.stderr + (logs / "cpu-checks.log").read_text()
    steps = _summary(out)
    assert steps["cpu-checks"].startswith("ok") and steps["bench"].startswith("no GPU")
    assert " passed" in (logs / "cpu-checks.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_gpu_decode_kit_runs_to_the_end_on_the_cpu(tmp_path):
    """--gpu-decode narrows the lane and the bench to GPU decode; here it still runs to the
    end and says no GPU."""
    out = tmp_path / "results"
    done = _kit(out, "--quick", "--gpu-decode", timeout=290)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = _summary(out)
    assert list(steps) == STEPS and steps["cuda-lane"].startswith("no GPU")
    text = KIT.read_text()
    assert "tests/cuda/test_gpu_decode.py" in text and "gpu-decode,gpu-decode-4" in text
