"""Fixtures shared by several folders: the sample dataset, the check that threads do not outlive
a test, the crop-only JPEG module; and the cuda lane (tests marked ``cuda`` skip without a GPU,
fail instead with FASTPIPE_REQUIRE_CUDA=1). A fixture used by one folder only lives in that
folder's conftest.py (tests/ops: ``backend``; tests/dali: ``index_list``; tests/jpeg:
``sampling_encoder``)."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from fastpipe.data import sample_images
from tests.helpers.cpu_path import built_module
from tests.helpers.cuda import REQUIRE_CUDA


def pytest_sessionstart(session: pytest.Session) -> None:
    """With FASTPIPE_REQUIRE_DALI=1 (CI sets it) a DALI that does not import stops the run: the
    DALI test modules skip without it, which must not pass unnoticed where it is installed."""
    if os.environ.get("FASTPIPE_REQUIRE_DALI") != "1":
        return
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as exc:
        pytest.exit(f"FASTPIPE_REQUIRE_DALI=1, but DALI does not import: {exc}", returncode=1)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The cuda lane: a test marked ``cuda`` needs a CUDA GPU; without one it skips, or fails
    when FASTPIPE_REQUIRE_CUDA=1 (so a GPU run cannot pass by skipping everything)."""
    if item.get_closest_marker("cuda") is None or torch.cuda.is_available():
        return
    reason = "no CUDA GPU (torch.cuda.is_available() is False)"
    if os.environ.get(REQUIRE_CUDA) == "1":
        pytest.fail(f"{reason}, and {REQUIRE_CUDA}=1 requires one", pytrace=False)
    pytest.skip(f"{reason}; the cuda lane runs on a GPU machine (docs/gpu.md)")


def wait_for_threads(baseline: set[int], timeout: float = 10.0) -> list[str]:
    """Waits until no thread outside ``baseline`` (thread idents) is alive; returns the
    leftovers."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        extra = [t for t in threading.enumerate() if t.ident not in baseline and t.is_alive()]
        if not extra or time.monotonic() > deadline:
            return [t.name for t in extra]
        time.sleep(0.02)


@pytest.fixture
def no_thread_leak():
    """Fails the test if it leaves a thread running that was not there before it."""
    baseline = {t.ident for t in threading.enumerate()}
    yield baseline
    leftovers = wait_for_threads(baseline)
    assert not leftovers, f"threads left running after the test: {leftovers}"


@pytest.fixture
def sigint_default():
    """SIGINT with Python's default handler for the test. A test run started in the background
    (CI under nohup, `pytest &`) inherits SIGINT ignored: a Ctrl-C sent by a test would then be
    lost, as would one in every process the test forks or starts until it sets a handler, which a
    terminal's Ctrl-C never is."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    """48 sample JPEGs in 4 classes (ImageFolder layout), made once per test session."""
    return sample_images(tmp_path_factory.mktemp("sample") / "images", num_images=48, num_classes=4)


@pytest.fixture(scope="module")
def jpeg():
    """fastpipe._jpeg (crop-only JPEG decoding); skips when it is not built, fails instead with
    FASTPIPE_REQUIRE_JPEG=1. Used by tests/jpeg and tests/pack/test_transcode.py."""
    return built_module("fastpipe._jpeg", "install libjpeg-turbo's headers and rebuild",
                        "FASTPIPE_REQUIRE_JPEG")
