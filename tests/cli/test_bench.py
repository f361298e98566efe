"""`fastpipe bench` end to end: every variant on a tiny dataset, JSON, plot, Markdown, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastpipe._cli import main
from fastpipe.bench.variants import VARIANTS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_bench_quick_json_from_the_command_line(tmp_path):
    # The README's main job, through the real entry point, on a fresh cache: the sample dataset
    # is generated on first use, and stdout is nothing but JSON.
    env = {**os.environ, "FASTPIPE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "fastpipe", "bench", "--quick", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=140)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["key"] for r in report["rows"]] == [v.key for v in VARIANTS]
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"]
    baseline = report["rows"][0]
    assert baseline["ratio"] == 1.0 and baseline["images_per_second"] > 0
    for row in report["rows"]:
        if row["skipped"] is None:
            # Every loader hands the training loop the same thing.
            assert row["output"] == "float32 (8, 3, 64, 64)", row
            assert row["images_per_second"] > 0 and row["batches"] >= 2
        else:
            assert row["images_per_second"] is None and row["skipped"]
    assert list((tmp_path / "cache").glob("sample-*-n32-*/class_00/*.jpg"))


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_bench_table_plot_and_markdown(capsys, sample_root, tmp_path, no_thread_leak):
    plot, table = tmp_path / "bench.png", tmp_path / "bench.md"
    code = main(["bench", "--quick", "--root", str(sample_root), "--variants",
                 "dataloader,dataloaderx,prefetcher", "--plot", str(plot), "--markdown", str(table),
                 "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ") and "48 JPEGs" in out
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "1.00x" in lines["DataLoader"]
    # The last line names the fastest loader; the files written are listed above it.
    *above, last = out.rstrip("\n").splitlines()
    assert last.startswith("verdict: ") and ("x DataLoader (" in last or "DataLoader was" in last)
    assert f"plot: {plot}" in above and f"markdown: {table}" in above
    assert "DataLoaderX + DataPrefetcher" in out
    assert plot.read_bytes()[:4] == b"\x89PNG"
    markdown = table.read_text()
    assert markdown.startswith("| loader | images/s | vs DataLoader |")
    assert markdown.count("\n| ") == 3 and "Machine: " in markdown
    assert f"`fastpipe bench --quick --root {sample_root} --variants" in markdown


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "--variants", "turbo"], "unknown variant(s) ['turbo']"),
    (["bench", "--root", "/no/such/dir"], "/no/such/dir is not a directory"),
    (["bench", "--workers", "-1"], "--workers must be >= 0"),
    (["bench", "--seconds", "0"], "--seconds must be more than 0"),
    (["bench", "--plot", "/no/such/dir/b.png"], "cannot write the plot"),
    (["bench", "--root", "x", "--num-images", "3"], "--num-images applies to the sample dataset"),
    (["bench", "--size", "4"], "--size must be >= 8, got 4"),
    (["bench", "--quick", "--batch-size", "64"],
     "--batch-size 64 is larger than the dataset's 32 samples: every epoch would be one short "
     "batch of 32, and the measurement would time workers starting and stopping. Pass "
     "--batch-size 8 (4 batches an epoch), or --num-images 192"),
])
def test_bench_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastpipe bench: error: ") and message in err and err.count("\n") == 1


@pytest.mark.slow
def test_every_command_has_help(capsys):
    for argv in (["--help"], ["bench", "--help"], ["tune", "--help"], ["profile", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: fastpipe")
    main_help = subprocess.run([sys.executable, "-m", "fastpipe", "--help"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60).stdout
    for command in ("bench", "profile", "tune"):
        assert command in main_help


# --- fastpipe bench --device: a real model step --------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.slow
def test_bench_device_cpu_tiny_model_table_and_json(capsys, sample_root, tmp_path,
                                                    no_thread_leak):
    saved = tmp_path / "bench-cpu.json"
    code = main(["bench", "--device", "cpu", "--model", "tiny", "--quick", "--root",
                 str(sample_root), "--variants", "dataloader,prefetcher,fast-cpu",
                 "--save", str(saved), "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ") and "step: tiny on cpu, channels_last, AMP, batch 8" in out
    assert "GPU util" in out and f"json: {saved}" in out
    report = json.loads(saved.read_text())
    assert report["settings"]["model"] == "tiny" and report["settings"]["amp"] is True
    assert "--device cpu --model tiny" in report["settings"]["command"]
    rows = {r["key"]: r for r in report["rows"]}
    assert list(rows) == ["dataloader", "prefetcher", "fast-cpu"]
    assert rows["dataloader"]["ratio"] == 1.0
    for row in rows.values():
        assert row["skipped"] is None, row
        assert row["images_per_second"] > 0 and row["batches"] >= 2
        assert 0.0 <= row["wait_share"] <= 1.0
        assert row["clock"] == "host" and row["gpu_utilization"] is None  # no GPU: no number
        assert row["output"] == "float32 (8, 3, 64, 64) on cpu", row


@pytest.mark.slow
def test_bench_device_json_to_stdout(capsys, sample_root, tmp_path):
    saved = tmp_path / "b.json"
    assert main(["bench", "--device", "cpu", "--quick", "--root", str(sample_root), "--variants",
                 "dataloader", "--seconds", "0.1", "--json", "--save", str(saved)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(saved.read_text())
    assert printed["settings"]["model"] == "tiny"  # the CPU default


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "cpu", "--model", "resnet5000"], "unknown model 'resnet5000'"),
    (["--device", "cpu", "--plot", "x.png"], "--plot applies to the simulated-step bench"),
    (["--device", "cpu", "--rounds", "2"], "--rounds applies to the simulated-step bench"),
    (["--device", "cpu", "--variants", "turbo"], "unknown variant(s) ['turbo']"),
    (["--device", "cpu", "--save", "/no/such/dir/b.json"], "cannot write the JSON report"),
])
@pytest.mark.slow
def test_bench_device_bad_arguments_exit_2(argv, message, capsys, sample_root):
    assert main(["bench", "--root", str(sample_root), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastpipe bench: error: ") and message in err


def test_bench_device_cuda_without_a_gpu_says_so(capsys, sample_root, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda", "--root", str(sample_root)]) == 2
    assert "--device cpu --model tiny" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    # 32 images in batches of 8 for 4 workers: 4 batches per epoch, fewer than 2 x 4.
    (["bench", "--device", "cpu", "--model", "tiny", "--num-images", "32", "--batch-size", "8",
      "--workers", "4"], "make 4 batches per epoch, fewer than 2 x 4 workers = 8"),
    # Six images of the caller's tree in batches of 2 for 2 workers: 3 batches, fewer than 4.
    (["bench", "--device", "cpu", "--model", "tiny", "--batch-size", "2", "--workers", "2",
      "--root", "tree"], "6 images in batches of 2 make 3 batches per epoch, fewer than 2 x 2"),
])
def test_model_bench_refuses_a_workload_too_small_for_its_workers(argv, message, capsys,
                                                                    tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i in range(6):
        (tmp_path / "tree" / f"class_{i % 2}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / f"class_{i % 2}" / f"{i}.jpg").write_bytes(b"")
    made = set(tmp_path.rglob("*"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastpipe bench: error: ") and message in err
    assert "at least" in err and "--num-images" in err and err.count("\n") == 1
    assert set(tmp_path.rglob("*")) == made  # refused before any data or report was made
