"""Runs commands whose processes (torchrun's ranks, Lightning's spawned workers) all end with
them: one command (:func:`run_group`), or the ranks of a gloo job on the loopback
(:func:`run_ranks`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path


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


def free_port() -> int:
    """A TCP port of the loopback nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(command: Sequence[str], world_size: int, timeout: float, cwd: str | Path) -> None:
    """``command`` as ``world_size`` ranks of one gloo job on the loopback, as torchrun starts
    them (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), ``{rank}``
    in an argument replaced by the rank. Asserts every rank exits 0, naming the first that did
    not with the end of its stderr; each runs in a process group of its own, killed with
    everything it started when the job ends, fails or times out."""
    port = free_port()
    ranks = []
    try:
        for rank in range(world_size):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
            ranks.append(subprocess.Popen(
                [part.replace("{rank}", str(rank)) for part in command], env=env, cwd=cwd,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True))
        for rank, process in enumerate(ranks):
            _, stderr = process.communicate(timeout=timeout)
            assert process.returncode == 0, \
                f"rank {rank} of {world_size} failed:\n{stderr[-3000:]}"
    finally:
        for process in ranks:
            kill_group(process)
