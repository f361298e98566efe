"""benchmarks/bench_gpu.py: its argument checks, a smoke run of every part on the CPU (one JSON
line per part, the same code the GPU runs), and a failing part reported while the others run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "cpu", "--parts", "h2d,copy"], "unknown part(s) ['copy']"),
    (["--device", "cpu", "--parts", ","], "unknown part(s) []"),
    (["--device", "cpu", "--batch-size", "1"], "--batch-size must be at least 2, got 1"),
    (["--device", "cpu", "--size", "8"], "--size must be at least 16, got 8"),
    (["--device", "cpu", "--steps", "1"], "--steps must be at least 2, got 1"),
    (["--device", "cpu", "--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--device", "cpu", "--out", "/no/such/folder/gpu.jsonl"], "does not exist"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
])
def test_bad_arguments_exit_2_naming_the_problem(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_gpu.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: --device cuda is valid")
def test_the_gpu_run_without_a_gpu_points_at_the_cpu_smoke_run(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_gpu.main([])
    assert exit_info.value.code == 2
    assert "--device cpu --quick" in capsys.readouterr().err


def test_an_unknown_model_is_refused_before_any_part_runs(capsys):
    assert bench_gpu.main(["--device", "cpu", "--quick", "--model", "resnet5000"]) == 2
    captured = capsys.readouterr()
    assert "unknown model 'resnet5000'" in captured.err and captured.out == ""


@pytest.mark.timeout(300)
def test_the_smoke_run_prints_one_json_line_per_part(tmp_path):
    out = tmp_path / "gpu.jsonl"
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_gpu", "--device", "cpu",
                           "--quick", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["part"] for line in lines] == list(bench_gpu.PARTS)
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines
    parts = {line["part"]: line for line in lines}
    assert not [line for line in lines if "error" in line]
    assert parts["env"]["device"] == "cpu" and parts["env"]["batch"] == [8, 3, 32, 32]
    assert parts["h2d"]["pageable_gb_per_s"] > 0 and "pinned_gb_per_s" not in parts["h2d"]
    cases = parts["ops"]["cases"]
    assert {"normalize uint8 -> float32", "mixup float16, in place"} <= {c["case"] for c in cases}
    for case in cases:
        assert set(case["device_ms"]) == set(case["host_ms"]) == {"fastpipe", "eager"}
    for name in ("feed-2ms", "feed-6ms", "feed-resnet50"):
        ways = {row["way"]: row for row in parts[name]["ways"]}
        assert bench_gpu.ALONE in ways and "copy inside the step" in ways
        assert {"DataPrefetcher, depth 1", "DataPrefetcher, depth 2",
                "DataPrefetcher, depth 1, pageable memory"} <= set(ways)
        for way, row in ways.items():
            assert row["ms_per_step"]["median"] > 0
            if way != bench_gpu.ALONE:
                assert 0.0 <= row["hidden_share"] <= 1.0
    assert parts["feed-2ms"]["ways"][0]["ms_per_step"]["median"] >= 2.0  # the 2 ms step
    assert parts["nosync"] == {"part": "nosync", "skipped": "torch's sync debug mode needs CUDA",
                               "seconds": parts["nosync"]["seconds"]}


def test_a_failing_part_is_reported_and_the_next_parts_run(monkeypatch, capsys):
    def broken(cfg):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setitem(bench_gpu.RUNNERS, "h2d", broken)
    assert bench_gpu.main(["--device", "cpu", "--quick", "--parts", "env,h2d,nosync"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["part"] for line in lines] == ["env", "h2d", "nosync"]
    assert "illegal memory access" in lines[1]["error"] and "error" not in lines[2]
