"""RemoteOptions: checked once, sizes in words, the environment's cache folder and limit, and
credentials that no repr or message shows."""

from __future__ import annotations

import re

import pytest

from fastpipe.data import RemoteOptions
from fastpipe.data.remote.options import parse_bytes
from fastpipe.data.remote.retry import clean


def test_sizes_in_words():
    assert parse_bytes("x", "20GB") == 20 * 10**9
    assert parse_bytes("x", "1.5 MiB") == 3 * 2**19
    assert parse_bytes("x", 4096) == 4096
    for bad in ("lots", "3 parsecs", ""):
        with pytest.raises(ValueError, match="cannot read"):
            parse_bytes("cache_limit", bad)
    with pytest.raises(TypeError):
        parse_bytes("cache_limit", True)
    with pytest.raises(ValueError, match="at least 1 byte"):
        parse_bytes("cache_limit", 0)


def test_values_checked_once(tmp_path):
    options = RemoteOptions(cache_dir=tmp_path, cache_limit="1MB", retries=0)
    assert options.cache_dir == str(tmp_path) and options.cache_limit == 10**6
    for bad in ({"ahead": -1}, {"downloads": 0}, {"timeout": 0}, {"backoff": -1},
                {"check": "crc"}, {"chunk_size": 0}):
        with pytest.raises((ValueError, TypeError)):
            RemoteOptions(**bad)
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        RemoteOptions(storage_options="key=1")
    assert RemoteOptions.of({"retries": 2}).retries == 2
    with pytest.raises(TypeError, match="unknown option 'retry'"):
        RemoteOptions.of({"retry": 2})
    with pytest.raises(TypeError, match="RemoteOptions"):
        RemoteOptions.of(3)


def test_the_environment_names_the_folder_and_the_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTPIPE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("FASTPIPE_CACHE_LIMIT", "2GiB")
    options = RemoteOptions()
    assert options.cache_dir == str(tmp_path / "c") and options.cache_limit == 2 * 2**30
    monkeypatch.setenv("FASTPIPE_CACHE_LIMIT", "much")
    with pytest.raises(ValueError, match="FASTPIPE_CACHE_LIMIT"):
        RemoteOptions()


def test_credentials_are_never_shown():
    options = RemoteOptions(storage_options={
        "key": "AKIAEXAMPLEKEY", "secret": "wJalrXUtnFEMIK7MDENG",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000",
                          "aws_session_token": "FwoGZXIvYXdzEXAMPLE"}})
    shown = repr(options) + str(options)
    for secret in ("AKIAEXAMPLEKEY", "wJalrXUtnFEMIK7MDENG", "FwoGZXIvYXdzEXAMPLE"):
        assert secret not in shown
        assert secret not in clean(f"failed with key {secret} here", options)
    assert options.endpoint() == "http://127.0.0.1:9000"
    assert "http://127.0.0.1:9000" not in options.secrets()


def test_every_backend_s_extra_is_in_pyproject_and_installs_it():
    from pathlib import Path

    from fastpipe.data.remote.filesystems import EXTRAS

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        return {re.split(r"[<>=\[;]", spec)[0].strip().lower().replace("_", "-")
                for spec in extras[extra]}

    assert "fsspec" in names("remote")  # the extra every protocol fsspec carries itself names
    for proto, (_, package, extra) in EXTRAS.items():
        assert extra in extras, f"{proto}:// names the extra {extra!r}, which pyproject lacks"
        assert {"fsspec", package.replace("_", "-")} <= names(extra), (proto, extra)
    # the tests' servers and clients come with the test extra
    assert {"s3fs", "moto", "aiohttp", "fsspec"} <= names("test")


def test_a_missing_backend_names_its_extra(monkeypatch):
    import sys

    from fastpipe._optional import MissingDependencyError
    from fastpipe.data.remote import filesystems

    monkeypatch.setitem(sys.modules, "gcsfs", None)  # an import of it fails
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastpipe\[gcs\]'"):
        filesystems.filesystem("gs://bucket/x.tar", RemoteOptions(retries=0))
