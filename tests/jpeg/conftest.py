"""Fixtures of the tests of fastpipe._jpeg (csrc/jpeg). ``jpeg``, the module itself, is in
tests/conftest.py: tests/pack uses it too."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def sampling_encoder(tmp_path_factory) -> Path:
    """tests/jpeg/sampling_encoder.c, built against the libjpeg-turbo the module was built with."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        pytest.skip("no C compiler to build the test's JPEG encoder")
    out = tmp_path_factory.mktemp("encoder") / "encoder"
    source = Path(__file__).with_name("sampling_encoder.c")
    subprocess.run([compiler, str(source), "-o", str(out), "-ljpeg"], check=True,
                   capture_output=True)
    return out
