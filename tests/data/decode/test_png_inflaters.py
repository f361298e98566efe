"""fastpipe._png's two inflaters give the same rows: ISA-L's (built where its headers are, as in
CI) and zlib's (built here from the same source without it), on PNGs of every filter and pixel
size, bands, seekable files, and damaged streams (with their chunk CRCs made right, so that the
damage reaches the inflater)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from fastpipe.data.decode import png as _png
from fastpipe.data.decode.budget import CorruptImageError
from fastpipe.data.decode.png import decode_png
from fuzz.harness import _fix_png_crcs
from tests.data.decode.test_png import GREY, PALETTE, PIXEL_SIZES, RGB, RGBA, _samples, write_png
from tests.helpers.cpu_path import built_module

SOURCE = Path(__file__).resolve().parents[3] / "fastpipe" / "csrc" / "png" / "png_decode.cpp"


def _require(message: str) -> None:
    if os.environ.get("FASTPIPE_REQUIRE_PNG") == "1":
        pytest.fail(f"{message} (FASTPIPE_REQUIRE_PNG=1)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def inflaters(tmp_path_factory):
    """{"isa-l": decode, "zlib": decode}: the installed module and a zlib build of its source."""
    native = built_module("fastpipe._png", "install libpng's headers (libpng-dev) and rebuild",
                          "FASTPIPE_REQUIRE_PNG")
    if native.INFLATE != "isa-l":
        _require("fastpipe._png was built without ISA-L: install libisal-dev and rebuild")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        _require("no C++ compiler to build the zlib form")
    out = tmp_path_factory.mktemp("png_zlib") / ("_png" + sysconfig.get_config_var("EXT_SUFFIX"))
    command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC",
               f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(out),
               "-lpng", "-lz"]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    spec = importlib.util.spec_from_file_location("fastpipe._png", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.INFLATE == "zlib"
    return {"isa-l": native.decode, "zlib": module.decode}


def _outcomes(inflaters, monkeypatch, data: bytes, rows=None, seekable=False) -> dict:
    """Each inflater's rows, or the error message it gave."""
    results = {}
    for name, decode in inflaters.items():
        monkeypatch.setattr(_png, "_native_decode", decode)
        try:
            results[name] = decode_png(data, "f.png", rows, seekable=seekable)
        except CorruptImageError as exc:
            results[name] = str(exc)
    return results


def _same(results: dict) -> None:
    isal, plain = results["isa-l"], results["zlib"]
    if isinstance(plain, str) or isinstance(isal, str):
        assert isinstance(plain, str) and isinstance(isal, str), (plain, isal)
    else:
        np.testing.assert_array_equal(isal, plain)


@pytest.mark.parametrize("depth,color_type", PIXEL_SIZES[:9])
def test_both_inflaters_give_the_same_rows(inflaters, monkeypatch, depth, color_type):
    rng = np.random.default_rng(depth + color_type)
    for height, width, idat in ((1, 1, 0), (9, 17, 7), (40, 300, 0), (41, 700, 1000)):
        samples = _samples(rng, height, width, depth, color_type)
        if color_type == PALETTE:
            samples %= 4
        palette = bytes(range(12)) if color_type == PALETTE else None
        data = write_png(samples, depth, color_type, palette=palette,
                         filters=(4, 4, 2, 4, 1, 3, 4), idat_size=idat)
        for rows in (None, (0, 1), (height // 2, height), (1, height - 2)):
            if rows is not None and not rows[0] < rows[1]:
                continue
            results = _outcomes(inflaters, monkeypatch, data, rows)
            _same(results)
            assert not isinstance(results["zlib"], str)


def test_both_inflaters_read_seekable_files_alike(inflaters, monkeypatch):
    from fastpipe.pack._transcode import seekable_png

    rng = np.random.default_rng(3)
    samples = rng.integers(0, 256, (300, 257, 3), dtype=np.uint8)
    data = seekable_png(write_png(samples, 8, RGB, filters=(4,)), "f.png")
    assert data is not None
    for rows in ((0, 300), (97, 150), (250, 300)):
        results = _outcomes(inflaters, monkeypatch, data, rows, seekable=True)
        _same(results)
        np.testing.assert_array_equal(results["isa-l"], samples[rows[0]:rows[1]])


def test_damaged_streams_fail_or_decode_alike(inflaters, monkeypatch):
    """Random byte changes inside the IDAT data: both inflaters refuse the file, or both give
    the same pixels (a change that deflate's format cannot see)."""
    rng = np.random.default_rng(11)
    seeds = [write_png(_samples(rng, 23, 31, 8, kind), 8, kind, filters=(4, 1, 4, 4, 2))
             for kind in (RGB, RGBA, GREY)]
    refused = 0
    for i in range(300):
        data = bytearray(seeds[i % len(seeds)])
        start = data.find(b"IDAT") + 4
        end = start + int.from_bytes(data[start - 8:start - 4], "big")
        for _ in range(rng.integers(1, 3)):
            data[rng.integers(start, end)] = rng.integers(256)
        results = _outcomes(inflaters, monkeypatch, bytes(_fix_png_crcs(data)))
        _same(results)
        refused += isinstance(results["zlib"], str)
    assert refused > 100


HIGHLY_COMPRESSED = sorted((Path(__file__).resolve().parents[2] / "conformance" / "data"
                            / "libpng" / "contrib" / "testpngs").glob("*-16*.png"))


@pytest.mark.parametrize("path", HIGHLY_COMPRESSED, ids=lambda p: p.name)
def test_both_inflaters_drain_what_they_hold_before_asking_for_input(inflaters, monkeypatch,
                                                                      path):
    """libpng's 16-bit test images inflate to far more than their last IDAT chunk: an inflater
    that asked for the next chunk as soon as it had taken all input (though it still held
    output) refused these valid files with "not enough image data"."""
    from PIL import Image

    data = path.read_bytes()
    results = _outcomes(inflaters, monkeypatch, data)
    assert not isinstance(results["isa-l"], str), results["isa-l"]
    _same(results)
    with Image.open(path) as image:
        if image.mode in ("I;16", "I;16B", "I"):  # grey: Pillow keeps the 16-bit values
            np.testing.assert_array_equal(results["zlib"], np.array(image))
