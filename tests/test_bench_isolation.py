"""The CPU-path benchmark runs every measurement in its own, fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cpu_path.py"


@pytest.mark.slow
def test_each_pipeline_is_measured_in_its_own_process(tmp_path, sample_root):
    out = tmp_path / "runs.json"
    subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--root", str(sample_root), "--only",
         "ImageFolder, uint8", "ImageFolder, threads", "--batch-size", "8", "--size", "32",
         "--repeat", "2",
         "--json", str(out)],
        check=True, timeout=600, capture_output=True,
    )
    runs = json.loads(out.read_text())
    measured = [m for m in runs["measurements"] if "rate" in m]
    # Two pipelines and the decode ceiling, two rounds each, interleaved.
    assert [m["name"] for m in measured] == 2 * [
        "fastpipe ImageFolder, threads", "fastpipe ImageFolder, uint8 out", "ceiling"]
    pids = [m["pid"] for m in measured]
    assert len(set(pids)) == len(pids), f"measurements shared a process: {pids}"
    assert runs["parent_pid"] not in pids
