"""`fastpipe profile` end to end: summary, JSON, CSV, plot, and clear errors."""

from __future__ import annotations

import csv
import json

import pytest

from fastpipe._cli import main


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_profile_json_csv_and_plot_on_an_image_folder(capsys, sample_root, tmp_path,
                                                       no_thread_leak):
    timeline, plot = tmp_path / "steps.csv", tmp_path / "profile.png"
    code = main(["profile", str(sample_root), "--size", "32", "--batch-size", "4", "--workers", "1",
                 "--steps", "6", "--step-ms", "5", "--csv", str(timeline), "--plot", str(plot),
                 "--json", "--no-progress"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steps_counted"] == 6 and 0 <= data["wait_share"] <= 1
    assert data["samples_per_second"] > 0 and data["verdict"]
    assert data["loader"]["kind"] == "DataLoader" and data["loader"]["num_workers"] == 1
    rows = list(csv.DictReader(timeline.open()))
    assert len(rows) == 7 and rows[0]["warmup"] == "1" and rows[1]["samples"] == "4"
    # Each step sleeps 5 ms after its batch arrives.
    assert all(float(r["compute"]) >= 0.005 for r in rows)
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(60)
def test_profile_text_with_datalaoderx_and_prefetcher(capsys, no_thread_leak):
    code = main(["profile", "tests.helpers.tune:tiny_sleepy_dataset", "--batch-size", "4",
                 "--workers", "0", "--loader", "DataLoaderX+DataPrefetcher", "--steps", "5",
                 "--step-ms", "1", "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "DataLoaderX + DataPrefetcher, 0 workers" in out
    assert "fastpipe.profile: 5 steps" in out and "verdict:" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["profile", "/no/such/dir"], "does not exist"),
    (["profile", "tests.helpers.tune:tiny_sleepy_dataset", "--workers", "-1"],
     "--workers must be >= 0"),
    (["profile", "tests.helpers.tune:empty_dataset", "--workers", "0", "--no-progress"],
     "is empty: the dataset has no samples"),
    (["profile", "tests.helpers.tune:tiny_sleepy_dataset", "--csv", "/no/such/dir/x.csv"],
     "cannot write the CSV"),
])
@pytest.mark.slow
def test_profile_bad_arguments_exit_2_with_one_line(argv, message, capsys, no_thread_leak):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastpipe profile: error: ") and message in err and err.count("\n") == 1
