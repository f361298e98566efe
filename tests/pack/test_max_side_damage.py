"""pack(max_side=N) takes fastpipe's verdict on an image (issue 40): a PNG fastpipe._png calls
damaged (an IDAT byte changed, a stream that ends after half the rows) is skipped and listed, or
refused with strict=True, whether it is larger than max_side (re-encoded) or not (kept as is);
Pillow, which decodes such files through (zero rows), only re-encodes the pixels fastpipe
decoded."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastpipe.data import H5Dataset
from fastpipe.data.decode.image import decode_rgb
from fastpipe.pack import CorruptInputError, pack, verify
from tests.data.decode.test_png import _damaged_files, write_png
from tests.helpers.cpu_path import built_module

h5py = pytest.importorskip("h5py", exc_type=ImportError)


@pytest.fixture(autouse=True)
def _native():
    built_module("fastpipe._png", "install libpng's headers (libpng-dev) and rebuild",
                 "FASTPIPE_REQUIRE_PNG")


def _folder(root, samples):
    """One class folder: a good PNG and each damaged kind of ``samples``."""
    (root / "cls").mkdir(parents=True)
    (root / "cls" / "a_good.png").write_bytes(write_png(samples, 8, 2))
    damaged = _damaged_files(samples)
    for k, data in enumerate(damaged.values()):
        (root / "cls" / f"b_hurt{k}.png").write_bytes(data)
    return damaged


@pytest.mark.parametrize("max_side", [12, 100], ids=["re-encoded", "kept as is"])
def test_damaged_pngs_are_skipped_on_both_sides_of_max_side(tmp_path, max_side):
    samples = np.random.default_rng(3).integers(0, 256, (32, 20, 3), dtype=np.uint8)
    damaged = _folder(tmp_path / "in", samples)
    for data in damaged.values():  # what Pillow alone makes of them: pixels, not an error
        with Image.open(io.BytesIO(data)) as image:
            image.convert("RGB").resize((12, 19))
    report = pack(tmp_path / "in", tmp_path / "out.h5", max_side=max_side, progress=False)
    assert report.count == 1
    assert sorted(s["source"] for s in report.skipped) == ["cls/b_hurt0.png", "cls/b_hurt1.png"]
    reasons = " ".join(s["reason"] for s in report.skipped)
    for reason in damaged:
        assert f"PNG: {reason}" in reasons, report.skipped
    stored = H5Dataset(tmp_path / "out.h5").encoded(0)[0].tobytes()
    pixels = decode_rgb(stored)
    if max_side == 100:
        assert stored == (tmp_path / "in" / "cls" / "a_good.png").read_bytes()
    else:
        assert pixels.shape == (19, 12, 3)
        expected = np.asarray(Image.fromarray(samples).resize((12, 19), Image.Resampling.BICUBIC,
                                                              reducing_gap=3.0))
        np.testing.assert_array_equal(pixels, expected)  # PNG: lossless re-encode
    assert verify(tmp_path / "out.h5").ok


@pytest.mark.parametrize("max_side", [12, 100], ids=["re-encoded", "kept as is"])
@pytest.mark.parametrize("check", [True, False], ids=["check", "no check"])
def test_a_strict_pack_refuses_a_damaged_png_with_max_side(tmp_path, max_side, check):
    samples = np.random.default_rng(4).integers(0, 256, (32, 20, 3), dtype=np.uint8)
    (tmp_path / "in" / "cls").mkdir(parents=True)
    data = _damaged_files(samples)["not enough image data"]
    (tmp_path / "in" / "cls" / "hurt.png").write_bytes(data)
    if not check and max_side == 100:
        # check=False trusts an input it need not decode: kept as is, bit for bit
        pack(tmp_path / "in", tmp_path / "out.h5", max_side=max_side, check=False,
             strict=True, progress=False)
        assert H5Dataset(tmp_path / "out.h5").encoded(0)[0].tobytes() == data
        return
    with pytest.raises(CorruptInputError, match="hurt.png.*PNG: not enough image data"):
        pack(tmp_path / "in", tmp_path / "out.h5", max_side=max_side, check=check,
             strict=True, progress=False)


def test_max_side_refuses_a_bomb_before_pillow_decodes_it(tmp_path):
    """The pixel budget applies with max_side too (Pillow's own is a warning up to twice it)."""
    from fastpipe.data.decode.budget import set_max_image_pixels

    samples = np.zeros((64, 64, 3), np.uint8)
    (tmp_path / "in" / "cls").mkdir(parents=True)
    (tmp_path / "in" / "cls" / "big.png").write_bytes(write_png(samples, 8, 2))
    (tmp_path / "in" / "cls" / "small.png").write_bytes(write_png(samples[:20, :20], 8, 2))
    set_max_image_pixels(1000)
    try:
        report = pack(tmp_path / "in", tmp_path / "out.h5", max_side=16, progress=False)
    finally:
        set_max_image_pixels(None)
    assert report.count == 1 and report.skipped[0]["source"] == "cls/big.png"
    assert "too large" in report.skipped[0]["reason"], report.skipped
