"""`fastpipe profile` end to end: summary, JSON, CSV, plot, and clear errors."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastpipe._cli import main

ROOT = Path(__file__).resolve().parents[2]


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
    (["profile", "tests.helpers.tune:tiny_sleepy_dataset", "--batch-size", "65"],
     "--batch-size 65 is larger than the dataset's 64 samples"),
])
@pytest.mark.slow
def test_profile_bad_arguments_exit_2_with_one_line(argv, message, capsys, no_thread_leak):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastpipe profile: error: ") and message in err and err.count("\n") == 1


@pytest.mark.timeout(60)
def test_profile_notes_an_epoch_of_few_batches(capsys, no_thread_leak):
    code = main(["profile", "tests.helpers.tune:tiny_sleepy_dataset", "--batch-size", "32",
                 "--workers", "0", "--steps", "3", "--step-ms", "0", "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("note: 64 samples make 2 batches of 32 an epoch: the loader "
                                 "restarts every few batches and the rates include it; "
                                 "--batch-size 16 or a dataset of at least 96 samples measures "
                                 "a steady stream")


def _children(pid: int) -> list[tuple[int, str, str]]:
    """(pid, name, state) of the processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == pid:
            found.append((int(entry.name), name, state))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_sigint_to_one_worker_ends_the_command_with_one_message(sigint_default):
    """A SIGINT sent to one DataLoader worker alone: the worker ends quietly (as on a terminal's
    Ctrl-C), and the command stops at once with a line naming it, not after torch's 5 s check
    with its traceback."""
    command = [sys.executable, "-m", "fastpipe", "profile",
               "tests.helpers.tune:clear_winner_dataset", "--workers", "2", "--steps", "2000",
               "--no-progress"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.monotonic() + 60
        victim = None
        while victim is None and time.monotonic() < deadline:
            workers = [pid for pid, name, state in _children(process.pid)
                       if name == "pt_data_worker" and state not in ("Z", "X")]
            if len(workers) == 2:
                time.sleep(0.5)  # both running their first batches
                victim = workers[-1]
            else:
                time.sleep(0.05)
        assert victim is not None, "no worker processes started"
        os.kill(victim, signal.SIGINT)
        sent = time.monotonic()
        out, err = process.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err
    assert err == (f"fastpipe profile: DataLoader worker process {victim} ended while the loader "
                   "was running (a SIGINT sent to the worker alone ends it); the measurement "
                   "stopped\nfastpipe profile: interrupted\n")
    # torch notices a worker that ended quietly only at its check every 5 s.
    assert took < 4, f"the command took {took:.1f} s to stop"


@pytest.mark.parametrize("status", [0, 1])
def test_a_worker_torch_reports_before_the_watch_saw_it_end_is_named(status):
    # A worker stopped while the loader was receiving its batch: torch raises at once (the
    # connection reset), and has reaped it, before the watch looked. One that failed (status 1)
    # is not taken for one stopped by a SIGINT.
    import multiprocessing

    from fastpipe.profiling import _runner

    worker = multiprocessing.get_context("fork").Process(target=os._exit, args=(status,))
    worker.start()
    while worker.is_alive():  # reaps it, as torch's check does
        time.sleep(0.01)
    watches = _runner._Watches()
    watches.workers = {worker.pid: worker}
    exc = RuntimeError(f"DataLoader worker (pid(s) {worker.pid}) exited unexpectedly")
    assert watches.stopped_worker(exc) == (worker.pid if status == 0 else None)
