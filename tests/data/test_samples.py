"""The built-in sample set (fastpipe.data.samples): the worker processes write the bytes one
process writes, a large set is split among the cores, a failing worker stops the others, and
two processes making the same set at once both get it.
(That the same arguments give the same bytes every time: tests/integration/test_package.py.)"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from fastpipe.data import samples


def _files(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*"))
            if f.is_file() and f.name != samples._MARKER}


@pytest.mark.parametrize(("num_images", "num_classes", "seed", "quality"),
                         [(13, 3, 0, 90), (7, 1, 5, 75)])
def test_worker_processes_write_the_bytes_of_one_process(tmp_path, num_images, num_classes, seed,
                                                         quality):
    serial, split = tmp_path / "serial", tmp_path / "split"
    for root, processes in ((serial, 1), (split, 3)):
        root.mkdir()
        samples._generate(root, num_images, num_classes, seed, quality, processes)
    files = _files(serial)
    assert len(files) == num_images
    assert _files(split) == files


def test_sample_images_splits_a_large_set_among_processes(tmp_path, monkeypatch):
    calls = []
    real = samples._generate

    def generate(*args):
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(samples, "_IMAGES_PER_PROCESS", 4)  # 9 images: two processes here
    monkeypatch.setattr(samples, "_generate", generate)
    monkeypatch.setattr("fastpipe._hardware.usable_cores", lambda: 2)
    root = samples.sample_images(tmp_path / "pool", num_images=9, num_classes=2, seed=4)
    assert calls == [2]
    serial = tmp_path / "serial"
    serial.mkdir()
    real(serial, 9, 2, 4, 90, 1)
    assert _files(root) == _files(serial)


def test_one_process_per_core_for_the_bench_set():
    assert samples._processes(12288, cores=16) == 16  # fastpipe bench --device cuda, 16 cores
    assert samples._processes(3072, cores=2) == 2
    assert samples._processes(300, cores=16) == 2
    assert samples._processes(64, cores=16) == 1  # small sets: in this process


def test_a_failing_worker_stops_the_others_and_names_its_error(tmp_path, monkeypatch):
    import psutil

    # A stand-in interpreter: the worker of the first images fails, the other never ends.
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nif [ "$4" = "0" ]; then echo "disk full" >&2; exit 3; fi\n'
                    "exec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    root = tmp_path / "images"
    root.mkdir()
    before = set(psutil.Process().children())  # servers other tests of the session keep
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 3: disk full"):
        samples._generate(root, 8, 2, 0, 90, processes=2)
    assert time.monotonic() - started < 30
    assert set(psutil.Process().children()) <= before, "a worker outlived the failure"


@pytest.mark.parametrize("root_made_empty", [False, True])
def test_two_processes_making_the_same_set_at_once_both_get_it(tmp_path, monkeypatch,
                                                               root_made_empty):
    """Two ranks of a job call sample_images with the same arguments at once: the one that
    finishes second finds the other's set in place (whether or not the root was there, empty,
    before) and returns it."""
    real = samples._generate
    root = tmp_path / "set"
    if root_made_empty:
        root.mkdir()

    def generate(staging, *args):
        real(staging, *args)
        # The other process finishes first, while this one is still generating.
        other = tmp_path / "other"
        other.mkdir()
        real(other, *args)
        (other / samples._MARKER).write_text(json.dumps(
            {"version": samples._VERSION, "num_images": 5, "num_classes": 2, "seed": 0,
             "quality": 90}))
        if root.exists():
            root.rmdir()
        other.rename(root)

    monkeypatch.setattr(samples, "_generate", generate)
    assert samples.sample_images(root, num_images=5, num_classes=2) == root
    assert len(_files(root)) == 5
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_set_of_other_arguments_finished_first_at_the_root_is_refused(tmp_path, monkeypatch):
    real = samples._generate
    root = tmp_path / "set"

    def generate(staging, *args):
        real(staging, *args)
        root.mkdir()
        (root / "img.jpg").write_bytes(b"x")
        (root / samples._MARKER).write_text('{"num_images": 99}')

    monkeypatch.setattr(samples, "_generate", generate)
    with pytest.raises(ValueError, match="made with other arguments"):
        samples.sample_images(root, num_images=5, num_classes=2)
