"""The package surface: a small sorted public API, and an import that pulls in no optional part."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fastpipe
from fastpipe._optional import MissingDependencyError, require

# (tqdm is not listed: torch itself imports it.)
OPTIONAL = ["h5py", "lmdb", "nvidia.dali", "matplotlib", "PIL", "simplejpeg", "torchvision"]


def test_public_api_is_sorted_and_resolvable():
    assert fastpipe.__all__ == sorted(fastpipe.__all__)
    for name in fastpipe.__all__:
        assert hasattr(fastpipe, name), name


def test_import_fastpipe_loads_no_optional_dependency():
    code = (
        "import sys, json; import fastpipe, fastpipe.data, fastpipe.ops; "
        f"print(json.dumps([m for m in {OPTIONAL!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_missing_optional_dependency_names_the_extra():
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastpipe\[hdf5\]'") as caught:
        require("fastpipe_no_such_module", extra="hdf5", package="h5py", feature="H5Dataset")
    assert "H5Dataset needs the optional package 'h5py'" in str(caught.value)
    assert isinstance(caught.value, ImportError)


def test_cli_help_lists_every_subcommand():
    done = subprocess.run([sys.executable, "-m", "fastpipe", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "bench" in done.stdout


def test_cli_rejects_an_unknown_subcommand():
    done = subprocess.run([sys.executable, "-m", "fastpipe", "no-such-command"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
