"""Tar indexes where they can be written: shards on a read-only file system (a read-only bind
mount where this machine allows one) get their indexes in the cache folder, built once per node
(other processes wait for it, then read it) and validated as an index beside the shard is."""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fastpipe.data.sources import tar
from fastpipe.data.sources.tar import INDEX_SUFFIX, TarSource, index_folder
from tests.helpers.pack import write_shards


def _bind_read_only(source: Path, target: Path) -> bool:
    target.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(target)],
                          capture_output=True)
    if done.returncode:
        return False
    try:  # a kernel that ignores "ro" on a bind mount in one step
        (target / "probe").write_bytes(b"")
    except OSError as exc:
        return exc.errno == errno.EROFS
    (target / "probe").unlink()
    subprocess.run(["umount", str(target)], check=True)
    return False


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """Three shards in a folder that refuses writes with EROFS: a read-only bind mount, or
    where this machine cannot mount, the same refusals made by patching the calls."""
    write_shards(tmp_path / "writable")
    folder = tmp_path / "ro"
    monkeypatch.setenv("FASTPIPE_CACHE_DIR", str(tmp_path / "cache"))
    if _bind_read_only(tmp_path / "writable", folder):
        try:
            yield folder
        finally:
            subprocess.run(["umount", str(folder)], check=True)
        return
    shutil.copytree(tmp_path / "writable", folder, dirs_exist_ok=True)
    inside = str(folder)
    real_access, real_open = os.access, open

    def access(path, mode, *args, **kwargs):
        if str(path).startswith(inside) and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    def refusing_open(path, mode="r", *args, **kwargs):
        if str(path).startswith(inside) and any(c in mode for c in "wax+"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr("builtins.open", refusing_open)
    yield folder


@pytest.fixture
def scans(monkeypatch, tmp_path):
    """The shards scanned, in this process and in the processes it forks (a line each)."""
    log = tmp_path / "scans.log"
    log.touch()
    real = tar._scan

    def counted(shard, name=None):
        with open(log, "a") as f:
            f.write(f"{Path(shard).name}\n")
        return real(shard, name)

    monkeypatch.setattr(tar, "_scan", counted)
    return lambda: sorted(log.read_text().split())


def test_a_read_only_folder_gets_its_indexes_in_the_cache_once(read_only, scans):
    source = TarSource(read_only)  # Errno 30 from shard_index before
    assert len(source) == 30
    assert not list(read_only.glob("*" + INDEX_SUFFIX))
    assert len(list(index_folder().glob("*" + INDEX_SUFFIX))) == 3
    assert scans() == ["000000.tar", "000001.tar", "000002.tar"]
    again = TarSource(read_only)
    assert scans() == ["000000.tar", "000001.tar", "000002.tar"]  # read from the cache
    for i in (0, 17, 29):
        a, b = again.read(i), TarSource(read_only.parent / "writable").read(i)
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_an_index_in_the_cache_is_validated_like_one_beside_the_shard(read_only, scans):
    TarSource(read_only)
    for path in index_folder().glob("*" + INDEX_SUFFIX):  # forged: offsets moved
        with np.load(path) as saved:
            arrays = dict(saved)
        arrays["offset"] = arrays["offset"] + 512
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    source = TarSource(read_only)
    assert len(scans()) == 6  # each forged index scanned again
    assert bytes(source.read(0)["txt"]) == b"sample 0"


def _build(folder: str) -> int:
    return len(TarSource(folder))


@pytest.mark.slow
def test_processes_building_at_once_scan_each_shard_once(read_only, scans):
    with multiprocessing.get_context("fork").Pool(3) as pool:
        assert pool.map(_build, [str(read_only)] * 3) == [30, 30, 30]
    assert scans() == ["000000.tar", "000001.tar", "000002.tar"]
