"""Shared fixtures: the sample dataset, and the check that threads do not outlive a test."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import pytest

from fastpipe.data import sample_images


def wait_for_threads(baseline: set[int], timeout: float = 10.0) -> list[str]:
    """Waits until no thread outside ``baseline`` (thread idents) is alive; returns the leftovers."""
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


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    """48 sample JPEGs in 4 classes (ImageFolder layout), made once per test session."""
    return sample_images(tmp_path_factory.mktemp("sample") / "images", num_images=48, num_classes=4)
