"""`fastpipe tune` end to end: text and JSON output, the plot, and clear errors."""

from __future__ import annotations

import json

import pytest

from fastpipe._cli import main


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_tune_json_and_plot_on_a_factory_dataset(capsys, tmp_path, no_thread_leak):
    plot = tmp_path / "tune.png"
    code = main(["tune", "tests.helpers.tune:tiny_sleepy_dataset", "--batch-size", "8",
                 "--workers", "0,1", "--budget", "4", "--plot", str(plot), "--json",
                 "--rounds", "2", "--no-progress"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rounds"] == 2 and "by chance 1 time in 6" in data["notes"][0]
    assert data["best"]["samples_per_second"] > 0
    assert "loader = " in data["code"] and "SleepyDataset" in data["dataset"]
    assert {t["settings"]["num_workers"] for t in data["trials"]} == {0, 1}
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(60)
def test_tune_text_on_an_image_folder(capsys, sample_root, no_thread_leak):
    code = main(["tune", str(sample_root), "--size", "32", "--batch-size", "8", "--workers", "0",
                 "--batch-sizes", "8", "--wrappers", "DataLoader", "--budget", "1",
                 "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "48 images" in out and "samples/s" in out and "Recommended:" in out
    assert "loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=0" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["tune", "/no/such/dir"], "does not exist; pass an ImageFolder directory"),
    (["tune", "no_such_module_xyz:make"], "cannot import 'no_such_module_xyz'"),
    (["tune", "tests.helpers.tune:not_a_dataset"], "not a map-style dataset"),
    (["tune", "tests.helpers.tune:tiny_sleepy_dataset", "--wrappers", "Turbo"],
     "--wrappers must be among"),
    (["tune", "tests.helpers.tune:tiny_sleepy_dataset", "--budget", "0"],
     "--budget must be more than 0"),
    (["tune", "tests.helpers.tune:tiny_sleepy_dataset", "--plot", "/no/such/dir/t.png"],
     "cannot write the plot"),
    (["tune", "tests.helpers.tune:tiny_sleepy_dataset", "--batch-size", "128"],
     "--batch-size 128 is larger than the dataset's 64 samples: every epoch would be one short "
     "batch of 64, and the measurement would time workers starting and stopping. Pass "
     "--batch-size 16 (4 batches an epoch), or a dataset of at least 384 samples"),
])
def test_tune_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastpipe tune: error: ") and message in err and err.count("\n") == 1


def test_tune_that_measures_nothing_is_one_line_not_a_traceback(capsys, monkeypatch):
    import fastpipe.profiling

    def measures_nothing(*args, **kwargs):
        raise ValueError("no loader setting could be measured (the dataset gave no batch)")

    monkeypatch.setattr(fastpipe.profiling, "tune", measures_nothing)
    assert main(["tune", "tests.helpers.tune:tiny_sleepy_dataset", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == ("fastpipe tune: error: no loader setting could be measured (the dataset gave "
                   "no batch)\n")


def test_tune_malformed_numbers_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "x:y", "--workers", "two"])
    assert exit_info.value.code == 2
    assert "expected comma-separated integers" in capsys.readouterr().err
