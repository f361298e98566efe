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
    # No offline bundle: a checkout may hold prepare.sh's, made for the GPU machine's Python.
    empty = out.parent / "no-bundle"
    empty.mkdir(exist_ok=True)
    environment = {**os.environ, "PYTHON": sys.executable, "KIT_BUNDLE": str(empty), **env}
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
    done = _kit(out, "--quick", "--gpu-decode", timeout=290, KIT_SECONDS="400")
    assert done.returncode == 0, done.stdout + done.stderr
    steps = _summary(out)
    assert list(steps) == [*STEPS[:5], "gpu-decode-rows", "cpu-checks"], steps
    assert steps["cuda-lane"].startswith("no GPU")
    assert steps["gpu-decode-rows"] == "skipped (--quick: no bench)"
    text = KIT.read_text()
    assert "tests/cuda/test_gpu_decode.py" in text and "fast-cpu,gpu-decode,gpu-decode-4" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bench_only_kit_runs_the_bench_alone(tmp_path):
    """The GPU decode session's second call (docs/gpu.md): the bench and its rows' check, no lane
    and no CPU checks."""
    out = tmp_path / "results"
    done = _kit(out, "--bench-only", "--gpu-decode", timeout=290, KIT_SECONDS="300")
    assert done.returncode == 0, done.stdout + done.stderr
    steps = _summary(out)
    assert list(steps) == [*STEPS[:5], "gpu-decode-rows", "cpu-checks"], steps
    assert steps["cuda-lane"] == steps["cpu-checks"] == "skipped (--bench-only)"
    assert steps["bench"].startswith("no GPU") and steps["gpu-decode-rows"].startswith("no GPU")
    _results(out, tmp_path / "unpacked")


def test_the_lane_only_and_bench_only_options_exclude_each_other(tmp_path):
    done = _kit(tmp_path / "results", "--quick", "--bench-only", timeout=30)
    assert done.returncode == 2 and "exclude each other" in done.stderr


def _rows_check(tmp_path, rows) -> subprocess.CompletedProcess:
    """The kit's check of GPU decode's rows (gpu-decode-rows) on a bench.json of ``rows``."""
    text = KIT.read_text()
    start = text.index("CHECK_GPU_DECODE_ROWS=$(cat <<'EOF'\n")
    code = text[text.index("\n", start) + 1:text.index("\nEOF\n", start)]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": rows}))
    return subprocess.run([sys.executable, "-c", code, str(bench)], capture_output=True,
                          text=True, timeout=30)


def test_the_gpu_decode_rows_check_fails_a_row_that_did_not_decode_on_the_gpu(tmp_path):
    stats = {"gpu": 3072, "cpu": 0, "fallback_reasons": {}}
    good = [{"key": "fast-cpu", "images_per_second": 900.0, "skipped": None},
            {"key": "gpu-decode", "images_per_second": 1500.0, "skipped": None,
             "gpu_decode_stats": stats},
            {"key": "gpu-decode-4", "images_per_second": 1400.0, "skipped": None,
             "gpu_decode_stats": stats}]
    done = _rows_check(tmp_path, good)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu-decode: 1500.0 images/s" in done.stdout and "'gpu': 3072" in done.stdout
    fell_back = [*good[:2], {**good[2], "images_per_second": None,
                             "skipped": "failed: none of its 3072 image(s) was decoded on the GPU"}]
    done = _rows_check(tmp_path, fell_back)
    assert done.returncode == 1 and "gpu-decode-4: did not run: failed: none" in done.stdout
    done = _rows_check(tmp_path, good[:2])
    assert done.returncode == 1 and "gpu-decode-4: did not run: not in the bench" in done.stdout
    (tmp_path / "bench.json").write_text("{")  # the bench died before writing it whole
    code = KIT.read_text().split("CHECK_GPU_DECODE_ROWS=$(cat <<'EOF'\n")[1].split("\nEOF\n")[0]
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bench.json")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "no bench results to check" in done.stderr
