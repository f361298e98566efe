"""fastpipe's Huffman decoder (fastpipe/csrc/jpeg/huffman_decoder.h) against libjpeg-turbo's own.

decode_region swaps libjpeg-turbo's entropy decoder for fastpipe's on sequential JPEGs; the
private ``fastpipe._jpeg._huffman(enabled)`` switches between the two and counts the decodes that
used fastpipe's, so every comparison here also checks which decoder ran.
"""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from tests.helpers.cpu_path import encode, large_jpeg, sample_files
from tests.jpeg.test_region import JPEG_KINDS, _photo, _region_pixels, _regions, _whole

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def _huffman_back_on(jpeg):
    """Leaves fastpipe's Huffman decoder switched on after this module's tests."""
    yield
    jpeg._huffman(True)


def _noise(height: int, width: int, seed: int) -> bytes:
    """White noise at quality 100 with optimized tables: large coefficients, codes of up to 16
    bits, values of up to 10 bits, most symbols outside the one-lookup table."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    return encode(Image.fromarray(pixels), quality=100, optimize=True, subsampling=0)


KINDS = dict(JPEG_KINDS)
KINDS["noise-q100-optimized"] = lambda: _noise(97, 131, 0)
KINDS["420-q50"] = lambda: encode(_photo(200, 264, 6), quality=50)
KINDS["420-restart-every-mcu"] = lambda: encode(_photo(150, 170, 7), quality=90,
                                                restart_marker_blocks=1)
# An interval that does not divide a row of MCUs: segments cross the rows a crop skips.
KINDS["420-restart-every-7-mcus"] = lambda: encode(_photo(170, 250, 8), quality=90,
                                                   restart_marker_blocks=7)


def _both(jpeg, data: bytes, k: int, box, fast_upsample: bool):
    """(libjpeg-turbo's pixels, fastpipe's pixels, decodes that used fastpipe's decoder)."""
    jpeg._huffman(False)
    theirs = _region_pixels(jpeg.decode_region, data, k, box, fast_upsample)
    jpeg._huffman(True)
    before = jpeg._huffman()[1]
    ours = _region_pixels(jpeg.decode_region, data, k, box, fast_upsample)
    return theirs, ours, jpeg._huffman()[1] - before


@pytest.mark.parametrize("transcoded", [False, True], ids=["file", "transcoded"])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_every_layout_and_scale_gives_libjpegs_pixels(jpeg, kind, k, transcoded):
    """Region decodes, edges and corners included, at every DCT scale, of every layout: the same
    pixels with either entropy decoder; fastpipe's runs on all but progressive files (whose
    transcoded form is baseline, so it runs there)."""
    data = KINDS[kind]()
    if transcoded:
        data = jpeg.transcode(data)
    height, width = _whole(data, k, fast_upsample=True).shape[:2]
    rng = np.random.default_rng(k)
    for fast_upsample in (True, False):
        for box in _regions(height, width, rng):
            theirs, ours, used = _both(jpeg, data, k, box, fast_upsample)
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{kind} 1/{k} {box}")
            assert used == (0 if kind.endswith("progressive") and not transcoded else 1)


@pytest.mark.slow
def test_photos_and_their_transcoded_packs_give_libjpegs_pixels(jpeg, sample_root):
    """Photo-like files, one large enough for every scale, whole and cropped, as files and
    transcoded."""
    files = [path.read_bytes() for path in sample_files(sample_root)[:6]]
    files.append(large_jpeg(sample_files(sample_root)[0], factor=3))
    rng = np.random.default_rng(0)
    for data in files:
        for source in (data, jpeg.transcode(data)):
            for k in (1, 2, 4, 8):
                height, width = _whole(source, k, fast_upsample=True).shape[:2]
                top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
                for box in ((0, 0, height, width),
                            (top, left, height - top, width - left)):
                    theirs, ours, used = _both(jpeg, source, k, box, True)
                    np.testing.assert_array_equal(ours, theirs, err_msg=f"1/{k} {box}")
                    assert used == 1


def _damaged(data: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    start = data.index(b"\xff\xda") + 20
    at = int(rng.integers(start, len(data) - 3))
    damaged = bytearray(data)
    how = ("flip", "truncate", "0xFF", "zeros")[int(rng.integers(0, 4))]
    if how == "flip":
        damaged[at] ^= 1 << int(rng.integers(0, 8))
    elif how == "truncate":
        del damaged[at:]
    elif how == "0xFF":
        damaged[at] = 0xFF
    else:
        damaged[at:at + 8] = bytes(8)
    return how, bytes(damaged)


def _outcome(jpeg, data: bytes, enabled: bool, lower_half: bool):
    """The pixels of the whole image at full scale, or of its lower half at 1/2 scale (the MCUs
    above skipped), or the error's message."""
    jpeg._huffman(enabled)
    try:
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        if lower_half:
            height, width = -(-height // 2), -(-width // 2)
            box = (height // 2, 0, height - height // 2, width)
            return _region_pixels(jpeg.decode_region, data, 2, box, True)
        return _region_pixels(jpeg.decode_region, data, 1, (0, 0, height, width), True)
    except ValueError as exc:
        return str(exc)


# Where fastpipe's decoder reports damage that libjpeg-turbo's decodes through: an invalid code
# (libjpeg-turbo's fast path fakes a zero silently), whole bytes left in a restart segment
# (libjpeg-turbo only counts them when its buffer had already reached the marker), and a missing
# end of file seen by its earlier refill.
STRICTER = ("bad Huffman code", "extraneous bytes", "Premature end")


@pytest.mark.parametrize("transcoded", [False, True], ids=["file", "transcoded"])
def test_damaged_data_is_an_error_whenever_libjpeg_reports_it(jpeg, sample_root, transcoded):
    """Flipped bits, truncation, stray 0xFF and zeroed bytes in the entropy data: where
    libjpeg-turbo's decoder reports the damage (an error, strict), so does fastpipe's; where it
    decodes, fastpipe's gives its pixels, or reports damage libjpeg-turbo lets through (STRICTER).
    Whole images and lower halves, whose MCUs above are decoded and discarded."""
    rng = np.random.default_rng(1 + transcoded)
    files = [path.read_bytes() for path in sample_files(sample_root)[:12]]
    errors = 0
    for data in files:
        source = jpeg.transcode(data) if transcoded else data
        for i in range(12):
            how, damaged = _damaged(source, rng)
            lower = i % 2 == 1
            theirs = _outcome(jpeg, damaged, False, lower)
            ours = _outcome(jpeg, damaged, True, lower)
            if isinstance(theirs, str):
                errors += 1
                assert isinstance(ours, str), f"{how}: libjpeg-turbo reported {theirs!r}"
            elif isinstance(ours, str):
                assert any(kind in ours for kind in STRICTER), f"{how}: {ours}"
            else:
                np.testing.assert_array_equal(ours, theirs, err_msg=how)
    assert errors >= 20  # the damage was real


def test_the_switch_selects_libjpegs_decoder_and_counts_fastpipes(jpeg):
    data = KINDS["420"]()
    assert jpeg._huffman(False)[0] is True
    before = jpeg._huffman()[1]
    jpeg.decode_region(data, 1, 0, 0, 16, 16, True)
    assert jpeg._huffman(True) == (False, before)
    jpeg.decode_region(data, 1, 0, 0, 16, 16, True)
    assert jpeg._huffman() == (True, before + 1)
    with pytest.raises(TypeError, match="True, False or None"):
        jpeg._huffman(1)
