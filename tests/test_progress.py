"""fastpipe._progress: one rule for every command's progress: a bar on a terminal, a plain line
every few seconds in a pipe or a log, nothing when it is off."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from fastpipe._progress import ProgressLines, progress_bar

ROOT = Path(__file__).resolve().parents[1]

# Five updates 0.15 s apart, lines due every 0.2 s.
SCRIPT = """
import time
from fastpipe._progress import progress_bar
bar = progress_bar(True, total=5, desc="packing", unit="file", interval=0.2)
for _ in range(5):
    time.sleep(0.15)
    bar.update(1)
bar.close()
print("finished", flush=True)
"""


def run_script(stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=stderr, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow  # a fresh Python process
@pytest.mark.timeout(120)
def test_into_a_pipe_progress_is_plain_lines_without_carriage_returns():
    process = run_script(subprocess.PIPE)
    _, err = process.communicate(timeout=50)
    text = err.decode()
    assert process.returncode == 0, text
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert 2 <= len(lines) <= 5, lines  # one at most every 0.2 s, and the last
    assert all(line.startswith("packing: ") and " file (" in line for line in lines)
    assert lines[-1].startswith("packing: 5/5 file (100%)") and lines[-1].endswith(" done")


@pytest.mark.slow  # a fresh Python process
@pytest.mark.timeout(120)
def test_on_a_terminal_progress_is_a_bar():
    leader, follower = pty.openpty()
    # A new pty is 0 columns wide, where tqdm draws nothing; a terminal has a width.
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = run_script(follower)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + 50
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if not ready:
            if process.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=10)
    os.close(leader)
    text = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 0, text
    assert "\r" in text and "5/5" in text and "packing" in text  # tqdm's bar, redrawn in place
    assert " done" not in text  # not the plain lines


def test_off_means_nothing_and_write_still_speaks(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with progress_bar(False, total=3, desc="verify", unit="sample", interval=0.0) as bar:
        bar.update(3)
        bar.write("resuming: 2 of 3 shards already packed")
    assert err.getvalue() == "resuming: 2 of 3 shards already packed\n"


def test_lines_come_at_the_interval_not_at_every_update(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("fastpipe._progress.time.monotonic", lambda: now[0])
    out = io.StringIO()
    bar = ProgressLines(out, interval=5.0, total=100, desc="fastpipe bench", unit="run")
    for _ in range(10):
        now[0] += 1.0
        bar.update(1)
    bar.set_postfix_str("DataLoaderX")
    now[0] += 0.5
    bar.close()
    assert out.getvalue().splitlines() == [
        "fastpipe bench: 5/100 run (5%), 1.00 run/s, 5 s",
        "fastpipe bench: 10/100 run (10%), 1.00 run/s, 10 s",
        "fastpipe bench: 10/100 run (10%), 0.95 run/s, 10 s done",
    ]


def test_short_work_in_a_pipe_ends_without_a_line():
    out = io.StringIO()
    with ProgressLines(out, interval=60.0, total=2, desc="d", unit="u") as bar:
        bar.update(2)
    assert out.getvalue() == ""
