"""Runs a command whose processes (torchrun's ranks, Lightning's spawned workers) all end with
it."""

from __future__ import annotations

import os
import signal
import subprocess


def run_group(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, ...)`` in a process group of its
    own: on a timeout (or any error) the whole group is killed, so ranks that outlive their
    launcher (a deadlocked DDP run) cannot linger after the test."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, **kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        kill_group(process)
        raise
    kill_group(process)  # anything the command left behind in its group
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
