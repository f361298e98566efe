"""The benchmarks' harness runs every measurement in its own, fresh process, and a before/after
run measures each row with the fastpipe it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench_cpu_path(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.bench_cpu_path", *args], cwd=ROOT,
                          timeout=600, capture_output=True, text=True)


@pytest.mark.slow
def test_each_pipeline_is_measured_in_its_own_process(tmp_path, sample_root):
    out = tmp_path / "runs.json"
    done = _bench_cpu_path("--quick", "--root", str(sample_root), "--only", "ImageFolder, uint8",
                           "ImageFolder, threads", "--batch-size", "8", "--size", "32",
                           "--repeat", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())
    measured = [m for m in runs["measurements"] if "rate" in m]
    # Two pipelines and the decode ceiling, two rounds each, interleaved.
    assert [m["name"] for m in measured] == 2 * [
        "fastpipe ImageFolder, threads", "fastpipe ImageFolder, uint8 out", "ceiling"]
    pids = [m["pid"] for m in measured]
    assert len(set(pids)) == len(pids), f"measurements shared a process: {pids}"
    assert runs["parent_pid"] not in pids
    assert {m["fastpipe"] for m in measured} == {str(ROOT / "fastpipe")}


@pytest.mark.slow
@pytest.mark.timeout(600)  # 8 fresh interpreters importing torch: minutes on a loaded 2-core box
def test_a_baseline_row_imports_the_baseline_checkouts_fastpipe(tmp_path, sample_root):
    # The baseline: a copy of this checkout's package (its compiled extensions with it).
    import shutil

    baseline = tmp_path / "baseline"
    shutil.copytree(ROOT / "fastpipe", baseline / "fastpipe",
                    ignore=shutil.ignore_patterns("csrc", "__pycache__"))
    out = tmp_path / "runs.json"
    done = _bench_cpu_path("--quick", "--root", str(sample_root), "--only", "ImageFolder, uint8",
                           "--batch-size", "8", "--size", "32", "--repeat", "2",
                           "--baseline", str(baseline), "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    measured = [m for m in json.loads(out.read_text())["measurements"] if "rate" in m]
    # Each row and its twin in the same round, the twin first in every other round.
    assert [(m["name"], m["baseline"]) for m in measured] == [
        ("fastpipe ImageFolder, uint8 out", False), ("fastpipe ImageFolder, uint8 out", True),
        ("ceiling", False), ("ceiling", True),
        ("fastpipe ImageFolder, uint8 out", True), ("fastpipe ImageFolder, uint8 out", False),
        ("ceiling", True), ("ceiling", False)]
    for m in measured:
        assert m["fastpipe"] == str((baseline if m["baseline"] else ROOT) / "fastpipe"), m
    assert "| fastpipe ImageFolder, uint8 out [baseline] |" in done.stdout
    assert "| row | current images/s | baseline images/s | current / baseline |" in done.stdout


def test_a_child_that_imports_another_fastpipe_stops_the_run(tmp_path):
    # PYTHONPATH names no checkout here: the child finds the installed fastpipe, not the one it
    # was asked to measure, and says so instead of measuring.
    (tmp_path / "fastpipe").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks._harness", "child", "bench_cpu_path", "ceiling",
         "--config", "{}", "--result", str(tmp_path / "r.json"), "--fastpipe", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert f"not the fastpipe of {tmp_path}" in done.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_a_row_that_cannot_run_here_is_a_note_not_a_number(tmp_path):
    pytest.importorskip("h5py")
    from benchmarks import _harness

    config = {"root": str(tmp_path), "workdir": str(tmp_path), "main_threads": 1}
    with _harness.Isolated() as isolated:
        record = isolated.run("bench_cpu_path", "fastpipe HDF5 pack (bytes)", config)
    assert "rate" not in record and record["fastpipe"] == str(ROOT / "fastpipe")
    assert record["note"].startswith("skipped: ") and "was not packed" in record["note"]


def test_isolated_run_fails_loudly_on_the_wrong_fastpipe(tmp_path):
    from benchmarks import _harness

    (tmp_path / "fastpipe").mkdir()
    # A checkout whose fastpipe cannot be the one imported: no __init__.py there, so the
    # installed fastpipe answers the import.
    with _harness.Isolated() as isolated, pytest.raises(RuntimeError, match="not the fastpipe"):
        isolated.run("bench_cpu_path", "ceiling", {}, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_scale_measures_every_row_of_a_small_run(tmp_path):
    """bench_scale's quick run: each size's pack, H5Dataset and TarDataset rows measured in their
    own processes, with the numbers its table reports."""
    out = tmp_path / "runs.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_scale", "--quick", "--only",
                           "N=2000", "--json", str(out)], cwd=ROOT, timeout=600,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = {m["name"]: m for m in json.loads(out.read_text())["measurements"] if "rate" in m}
    assert set(measured) == {"pack N=2000", "H5Dataset N=2000", "TarDataset N=2000"}
    assert measured["pack N=2000"]["peak_mb"] > 0
    for name in ("H5Dataset N=2000", "TarDataset N=2000"):
        assert measured[name]["seen"] == 2000
        assert measured[name]["worker_private_mb"] > 0 and measured[name]["worker_fds"] > 0
        assert measured[name]["worker_mapped_mb"] >= 0


@pytest.mark.parametrize("module", ["bench_png", "bench_scale"])
def test_a_benchmark_without_baseline_rows_refuses_a_baseline(module, tmp_path):
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--baseline",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unrecognized arguments: --baseline" in done.stderr
