"""fastpipe._jpeg on untrusted files (issue 30): the findings of the fuzz lane (fuzz/, see
docs/fuzzing.md), one regression test each. The inputs of tests/jpeg/cases/ are the shared
findings; fuzz/run.sh replays them, and every narrow crop of them, under AddressSanitizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.jpeg.test_region import _photo, _region_pixels, _whole

pytestmark = pytest.mark.timeout(300)

CASES = Path(__file__).with_name("cases")
OVERFLOW_420 = CASES / "libjpeg-crop-scanline-merged-upsampler-overflow-420.jpg"
BOMB = CASES / "dos-baseline-65500x65500.jpg"


def _encode(image: Image.Image, **options) -> bytes:
    import io

    out = io.BytesIO()
    image.save(out, format="JPEG", **options)
    return out.getvalue()


def _narrow_crop_inputs() -> dict[str, bytes]:
    photo = _photo(37, 70, seed=3)
    return {
        "shared-420": OVERFLOW_420.read_bytes(),
        "420": _encode(photo, quality=90, subsampling=2),
        "422": _encode(photo, quality=90, subsampling=1),
        "444": _encode(photo, quality=90, subsampling=0),
        "grey": _encode(photo.convert("L"), quality=90),
    }


@pytest.mark.parametrize("name", sorted(_narrow_crop_inputs()))
@pytest.mark.parametrize("fast_upsample", [True, False])
def test_crops_one_to_three_columns_wide_equal_the_whole_decode(jpeg, name, fast_upsample):
    """jpeg_crop_scanline wrote past libjpeg's merged upsampler for crops that leave chroma
    fewer than 2 samples wide (fixed by widening them); every such crop is exact."""
    data = _narrow_crop_inputs()[name]
    for k in (1, 2):
        whole = _whole(data, k, fast_upsample)
        height, width = whole.shape[:2]
        for w in (1, 2, 3):
            for left in range(0, width - w + 1):
                box = (0, left, min(height, 5), w)
                got = _region_pixels(jpeg.decode_region, data, k, box, fast_upsample)
                if fast_upsample:
                    np.testing.assert_array_equal(got, whole[:min(height, 5), left:left + w])
                else:
                    assert got.shape == (min(height, 5), w, 3)


def _peak_in_fresh_process(code: str) -> tuple[str, int]:
    """Runs ``code`` in a fresh interpreter; its output and the growth of its peak RSS in KiB
    across the code."""
    script = (
        "import resource, sys\n"
        "import fastpipe._jpeg as jpeg, numpy as np\n"
        f"data = open({str(BOMB)!r}, 'rb').read()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"{code}\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split("\n")
    return "\n".join(out[:-2]), int(out[-2])


@pytest.mark.slow
def test_a_bomb_is_refused_by_every_entry_point_before_it_allocates(jpeg):
    """65500x65500 declared in 629 bytes: refused from the frame header, with no allocation of
    its size (the peak RSS of the calls is measured in a process of their own)."""
    calls = [
        "jpeg.decode_region(data, 1, 0, 0, 65500, 65500, True)",
        "jpeg.decode_region(data, 8, 0, 0, 8188, 8188, False)",
        "jpeg.transcode(data)",
        "jpeg.decode_resize(data, 1, (0, 0, 65500, 65500), True, (0, 0), (65500, 65500), "
        "np.empty((3, 8, 8), np.uint8), (0, 0), (8, 8), False, 0)",
    ]
    code = "\n".join(
        f"try:\n    {call}\nexcept ValueError as e:\n    print('refused', e)\nelse:\n"
        "    print('decoded')" for call in calls)
    code += ("\nprint('train', jpeg.decode_train(data, 1, np.empty((3, 8, 8), np.uint8), "
             "(0.08, 1.0), (0.75, 4 / 3), 0.5, 1.0, True, 0))")
    out, grown = _peak_in_fresh_process(code)
    lines = out.splitlines()
    assert len(lines) == 5, out
    assert all(line.startswith("refused") and "pixel budget of 178956970" in line
               for line in lines[:4]), out
    assert lines[4] == "train False"  # ImageDecoder's own path then names the file
    assert grown < 64 * 1024, f"peak RSS grew by {grown} KiB"


def test_the_budget_is_an_argument_of_every_entry_point(jpeg):
    data = _encode(_photo(40, 30), quality=90)
    out = np.empty((3, 8, 8), np.uint8)
    with pytest.raises(ValueError, match="40x30 pixels, more than the pixel budget of 1199"):
        jpeg.decode_region(data, 1, 0, 0, 8, 8, True, 1199)
    jpeg.decode_region(data, 1, 0, 0, 8, 8, True, 1200)
    with pytest.raises(ValueError, match="pixel budget of 1199"):
        jpeg.transcode(data, 1199)
    with pytest.raises(ValueError, match="pixel budget of 1199"):
        jpeg.decode_resize(data, 1, (0, 0, 8, 8), True, (0, 0), (8, 8), out, (0, 0), (8, 8),
                           False, 0, 1199)
    assert not jpeg.decode_train(data, 1, out, (0.08, 1.0), (0.75, 4 / 3), 0.5, 1.0, True, 0,
                                 1199)
    assert jpeg.decode_train(data, 1, out, (0.08, 1.0), (0.75, 4 / 3), 0.5, 1.0, True, 0, 1200)
    # a transcoded file (restart segments, assembled around the crop) is checked first too
    segmented = jpeg.transcode(data)
    with pytest.raises(ValueError, match="pixel budget of 1199"):
        jpeg.decode_region(segmented, 1, 0, 0, 8, 8, True, 1199)


@pytest.mark.parametrize("scale, ratio", [
    ((0.08, float("inf")), (0.75, 4 / 3)),
    ((0.08, 1.0), (1e-300, 1.0)),
    ((0.08, 1.0), (1.0, 1e300)),
    ((float("nan"), 1.0), (0.75, 4 / 3)),
    ((0.08, 1.0), (0.75, float("nan"))),
    ((0.08, 1.5), (0.75, 4 / 3)),
])
def test_non_finite_and_absurd_crop_ranges_are_refused(jpeg, scale, ratio):
    """They reached train_plan.h's round_even as an undefined float-to-integer conversion."""
    data = _encode(_photo(40, 30), quality=90)
    with pytest.raises(ValueError, match="need 0 < scale"):
        jpeg.decode_train(data, 1, np.empty((3, 8, 8), np.uint8), scale, ratio, 0.5, 1.0, True, 0)
    with pytest.raises(ValueError, match="need 0 < scale"):
        jpeg._train_plan(40, 30, 1, (8, 8), scale, ratio, 0.5, 1.0)


def test_the_extreme_ranges_allowed_plan_inside_the_image(jpeg):
    for scale, ratio in [((1e-300, 1e-300), (1e-3, 1e-3)), ((1.0, 1.0), (1e3, 1e3)),
                         ((1e-9, 1.0), (1e-3, 1e3))]:
        for seed in range(50):
            k, (top, left, h, w), _ = jpeg._train_plan(65535, 3, seed, (1 << 24, 1 << 24), scale,
                                                       ratio, 0.5, 1.0)
            assert k == 1 and 0 <= top and 0 <= left and h >= 1 and w >= 1
            assert top + h <= 65535 and left + w <= 3


def _with_fill_before_stuffing(data: bytes, at: int) -> bytes:
    return data[:at] + b"\xff\xff\x00" + data[at:]


def test_fill_bytes_before_a_stuffed_zero_never_give_other_pixels_than_libjpeg(jpeg):
    """FF FF 00 in the entropy data: fastpipe's Huffman decoder gave other pixels than
    libjpeg-turbo's; now it refuses the data (the caller decodes it whole with libjpeg's)
    wherever the two could differ, and decodes it only to libjpeg's pixels."""
    data = _encode(_photo(64, 64, seed=5), quality=90, subsampling=0)
    start = data.index(b"\xff\xda") + 2
    start += data[start] << 8 | data[start + 1]
    refused = 0
    for at in range(start + 1, len(data) - 2, 7):
        damaged = _with_fill_before_stuffing(data, at)
        outcomes = []
        for enabled in (True, False):
            jpeg._huffman(enabled)
            try:
                outcomes.append(
                    _region_pixels(jpeg.decode_region, damaged, 1, (0, 0, 64, 64), True))
            except ValueError:
                outcomes.append(None)
        jpeg._huffman(True)
        ours, libjpegs = outcomes
        if ours is None:
            refused += 1
            continue
        assert libjpegs is not None
        np.testing.assert_array_equal(ours, libjpegs)
    assert refused > 0


def test_a_slow_arithmetic_file_is_refused_by_the_pixel_budget(jpeg, sampling_encoder):
    """A few hundred bytes of arithmetic-coded data declaring 30000x65500: libjpeg-turbo decodes
    the missing data as zeros without a warning, ~20 s per sample on the region paths. The pixel
    budget refuses it from its frame header; what stays under the budget decodes in time
    proportional to it (docs/fuzzing.md has the measurements)."""
    from fastpipe.data.decode.budget import ImageTooLargeError
    from fastpipe.data.decode.image import ImageDecoder, decode_rgb

    black = np.zeros((64, 64, 3), np.uint8).tobytes()
    data = subprocess.run([str(sampling_encoder), "64", "64", "2", "2", "arith"], input=black,
                          capture_output=True, check=True).stdout
    frame = data.index(b"\xff\xc9")  # SOF9: arithmetic-coded sequential
    slow = data[:frame + 5] + (30000).to_bytes(2, "big") + (65500).to_bytes(2, "big") + \
        data[frame + 9:]
    out = np.empty((3, 8, 8), np.uint8)
    with pytest.raises(ValueError, match="30000x65500 pixels, more than the pixel budget"):
        jpeg.decode_region(slow, 1, 29000, 0, 64, 64, True)
    with pytest.raises(ValueError, match="pixel budget"):
        jpeg.decode_resize(slow, 1, (29000, 0, 64, 64), True, (0, 0), (64, 64), out, (0, 0),
                           (8, 8), False, 0)
    assert not jpeg.decode_train(slow, 1, out, (0.08, 1.0), (0.75, 4 / 3), 0.5, 1.0, True, 0)
    for call in (decode_rgb, ImageDecoder(), ImageDecoder(train=False),
                 lambda d, s: ImageDecoder()._from_seed(d, s, 1)):
        with pytest.raises(ImageTooLargeError, match="slow.jpg declares 30000x65500"):
            call(slow, "slow.jpg")
