"""Memory between images: glibc's thresholds (fastpipe._malloc). fast_collate's kept batches are
in tests/data/collate/test_batch_memory.py."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from fastpipe import _malloc

pytestmark = pytest.mark.timeout(120)

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


@pytest.fixture
def fresh_malloc_state(monkeypatch):
    """keep_freed_memory() as in a process that has not decided yet, with mallopt recorded."""
    calls = []

    def mallopt(option, value):
        calls.append((option, value))
        return 1

    monkeypatch.setattr(_malloc, "state", None)
    monkeypatch.setattr(_malloc, "_mallopt", lambda: mallopt)
    for name in ("FASTPIPE_MALLOC", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                 "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_thresholds_go_to_glibcs_adaptive_ceilings_once_recording_stand_in(fresh_malloc_state):
    assert _malloc.keep_freed_memory() == "set"
    assert _malloc.keep_freed_memory() == "set"
    assert fresh_malloc_state == [(_malloc._M_MMAP_THRESHOLD, 32 << 20),
                                  (_malloc._M_TRIM_THRESHOLD, 64 << 20)]


@pytest.mark.parametrize("name, value, reason", [
    ("FASTPIPE_MALLOC", "default", "FASTPIPE_MALLOC=default"),
    ("MALLOC_TRIM_THRESHOLD_", "1000000", "the environment sets malloc's thresholds"),
    ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=4096", "the environment sets malloc's"),
])
def test_the_users_choice_is_left_alone(fresh_malloc_state, monkeypatch, name, value, reason):
    monkeypatch.setenv(name, value)
    assert _malloc.keep_freed_memory().startswith(reason)
    assert fresh_malloc_state == []


def test_other_tunables_do_not_count_as_a_malloc_choice(fresh_malloc_state, monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F")
    assert _malloc.keep_freed_memory() == "set"


def test_other_c_libraries_are_left_alone(fresh_malloc_state, monkeypatch):
    monkeypatch.setattr(_malloc, "_mallopt", lambda: None)
    assert _malloc.keep_freed_memory() == "not glibc"


_TRIM = textwrap.dedent("""
    import ctypes, importlib.util, json, resource, sys
    # fastpipe/_malloc.py alone: importing torch would already have moved glibc's thresholds.
    spec = importlib.util.spec_from_file_location("malloc_alone", sys.argv[1])
    _malloc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_malloc)
    state = _malloc.keep_freed_memory()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    def images():
        # An image's worth of buffers below the mmap threshold, written and freed: the top of
        # the heap is then free, and with the default trim threshold (128 KiB) goes back.
        blocks = [libc.malloc(100 << 10) for _ in range(8)]
        for block in blocks:
            ctypes.memset(block, 1, 100 << 10)
        for block in reversed(blocks):
            libc.free(block)
    images()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        images()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
    print(json.dumps({"state": state, "faults_per_image": faults}))
""")


def _run(code: str, *args: str, **env: str) -> dict:
    import json
    import os

    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=100, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc
def test_freed_buffers_stay_mapped_with_the_thresholds_set():
    """Against the real glibc: 800 KiB of freed buffers go back to the kernel after every image
    with its default thresholds (200 page faults to get them again) and stay with fastpipe's."""
    default = _run(_TRIM, _malloc.__file__, FASTPIPE_MALLOC="default")
    assert default["state"] == "FASTPIPE_MALLOC=default" and default["faults_per_image"] >= 100
    kept = _run(_TRIM, _malloc.__file__, FASTPIPE_MALLOC="")
    assert kept["state"] == "set" and kept["faults_per_image"] < 5, kept


_FIRST_IMAGE = textwrap.dedent("""
    import json, sys
    from fastpipe import _malloc
    from fastpipe.data import ImageFolder
    before = _malloc.state
    ImageFolder(sys.argv[1], train=True, size=32)[0]
    print(json.dumps({"before": before, "after": _malloc.state}))
""")


@glibc
@pytest.mark.slow
def test_the_first_decoded_image_sets_the_thresholds(sample_root):
    """Decoding is what sets them, in every process that decodes (a spawned worker too), and
    importing fastpipe alone changes nothing."""
    states = _run(_FIRST_IMAGE, str(sample_root), FASTPIPE_MALLOC="")
    assert states == {"before": None, "after": "set"}
