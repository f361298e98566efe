"""Memory between images and batches: glibc's thresholds (fastpipe._malloc) and fast_collate's
kept batches in loader threads."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from fastpipe import _malloc
from fastpipe.data import collate, fast_collate

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
def test_the_first_decoded_image_sets_the_thresholds(sample_root):
    """Decoding is what sets them, in every process that decodes (a spawned worker too), and
    importing fastpipe alone changes nothing."""
    states = _run(_FIRST_IMAGE, str(sample_root), FASTPIPE_MALLOC="")
    assert states == {"before": None, "after": "set"}


def test_a_freed_batch_is_reused_for_the_next_batch_of_its_shape():
    kept = collate._KeptBatches()
    first = kept.empty((4, 3, 8, 8), torch.uint8)
    address = first.data_ptr()
    del first
    again = kept.empty((4, 3, 8, 8), torch.uint8)
    assert again.data_ptr() == address


def test_a_batch_is_not_reused_while_any_view_of_it_lives():
    kept = collate._KeptBatches()
    batch = kept.empty((4, 3, 8, 8), torch.uint8)
    address = batch.data_ptr()
    view = batch[1:]
    del batch
    other = kept.empty((4, 3, 8, 8), torch.uint8)
    assert other.data_ptr() != address
    del view, other
    assert kept.empty((4, 3, 8, 8), torch.uint8).data_ptr() == address


def test_free_batches_of_another_shape_are_dropped():
    kept = collate._KeptBatches()
    kept.empty((4, 3, 8, 8), torch.uint8)
    kept.empty((2, 3, 8, 8), torch.uint8)
    held = kept.empty((2, 3, 8, 8), torch.uint8)
    assert [array.shape for array in kept._arrays] == [(2, 3, 8, 8)]
    del held


def test_at_most_limit_batches_are_kept_and_more_are_still_served():
    kept = collate._KeptBatches(limit=2)
    held = [kept.empty((2, 3), torch.float32) for _ in range(4)]
    assert len({t.data_ptr() for t in held}) == 4 and len(kept._arrays) == 2
    assert all(t.shape == (2, 3) and t.dtype == torch.float32 for t in held)


def test_dtypes_numpy_lacks_get_plain_tensors():
    kept = collate._KeptBatches()
    out = kept.empty((2, 3), torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3) and kept._arrays == []


def test_batches_held_by_the_loop_are_never_overwritten(no_thread_leak):
    """Two loader threads collating at once while the loop keeps every batch: no two batches
    share memory, and each still holds its own samples."""
    batches, lock = [], threading.Lock()

    def load(value):
        for _ in range(20):
            images, _ = fast_collate([(torch.full((3, 4, 4), value, dtype=torch.uint8), 0)] * 3)
            with lock:
                batches.append((value, images))

    threads = [threading.Thread(target=load, args=(v,)) for v in (1, 2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len({images.data_ptr() for _, images in batches}) == len(batches)
    assert all(images.eq(value).all() for value, images in batches)


def test_fast_collate_in_this_process_reuses_the_freed_batch():
    samples = [(torch.zeros(3, 16, 16, dtype=torch.uint8), 0)] * 4
    images, _ = fast_collate(samples)
    address = images.data_ptr()
    del images
    again, _ = fast_collate(samples)
    assert again.data_ptr() == address and again.eq(0).all()
