"""Fixtures of the tests of fastpipe.ops."""

from __future__ import annotations

import pytest

from fastpipe.ops import _extension


@pytest.fixture(params=["default", "reference"])
def backend(request, monkeypatch):
    """Runs a test with the ops as installed (the CPU kernels of fastpipe._C), then on the
    pure-PyTorch reference (no extension)."""
    if request.param == "reference":
        monkeypatch.setattr(_extension, "KERNELS", frozenset())
        monkeypatch.setattr(_extension, "_warned", True)
    return request.param
