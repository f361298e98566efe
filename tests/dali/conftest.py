"""Fixtures of the tests of fastpipe.dali (DALI's CPU mode)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.dali import image_files, write_index_list


@pytest.fixture(scope="module")
def index_list(sample_root, tmp_path_factory) -> Path:
    """The 48 sample images in a list file labelled 0..47, so labels name samples."""
    return write_index_list(tmp_path_factory.mktemp("lists") / "index.txt",
                            image_files(sample_root))
