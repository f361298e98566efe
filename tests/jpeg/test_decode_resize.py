"""fastpipe._jpeg.decode_resize: the region decode and the resize in one call, against the two
calls it stands for (decode_region, then fastpipe._resize.resize), pixel for pixel."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.cpu_path import built_module, encode, turns_inside_calls
from tests.jpeg.test_region import JPEG_KINDS, _photo, _region_pixels, _regions, _whole

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def resize():
    return built_module("fastpipe._resize", "rebuild fastpipe", "FASTPIPE_REQUIRE_JPEG").resize


def _two_calls(jpeg, resize, data, k, box, fast_upsample, at, image_size, out_shape, out_at,
               out_size, flip, filt) -> np.ndarray:
    pixels = _region_pixels(jpeg.decode_region, data, k, box, fast_upsample)
    out = np.empty((3, *out_shape), np.uint8)
    resize(pixels, at, image_size, out, out_at, out_size, flip, filt)
    return out


def _one_call(jpeg, data, k, box, fast_upsample, at, image_size, out_shape, out_at, out_size,
              flip, filt) -> np.ndarray:
    out = np.full((3, *out_shape), 7, np.uint8)
    assert jpeg.decode_resize(data, k, box, fast_upsample, at, image_size, out, out_at, out_size,
                              flip, filt) is None
    return out


def _check(jpeg, resize, data, k, box, fast_upsample, *resize_args):
    np.testing.assert_array_equal(
        _one_call(jpeg, data, k, box, fast_upsample, *resize_args),
        _two_calls(jpeg, resize, data, k, box, fast_upsample, *resize_args),
        err_msg=f"k={k} box={box} fast_upsample={fast_upsample} resize={resize_args}")


def _sources(jpeg, kind: str) -> list[bytes]:
    data = JPEG_KINDS[kind]()
    return [data, jpeg.transcode(data)]


@pytest.mark.parametrize("kind", sorted(JPEG_KINDS))
@pytest.mark.parametrize("k", [1, 2, 8])
def test_a_train_crop_equals_decode_region_then_resize(jpeg, resize, kind, k):
    """Train: the crop is an image of its own, resized to the output size, flipped or not, with
    either filter and either upsampling; the file as it is and transcoded (restart segments)."""
    rng = np.random.default_rng(k)
    for data in _sources(jpeg, kind):
        height, width = _whole(data, k, True).shape[:2]
        for n, box in enumerate(_regions(height, width, rng)[::2]):
            size = (int(rng.integers(1, 80)), int(rng.integers(1, 80)))
            flip, filt, fast = bool(n % 2), n % 3 % 2, bool(n % 4 < 2)
            _check(jpeg, resize, data, k, box, fast, (0, 0), box[2:], size, (0, 0), size, flip,
                   filt)


@pytest.mark.parametrize("kind", sorted(JPEG_KINDS))
@pytest.mark.parametrize("k", [1, 2])
def test_an_eval_window_equals_decode_region_then_resize(jpeg, resize, kind, k):
    """Eval: the decoded region is part of the image, the output a window of the whole image's
    resize; the region holds every pixel the window reads (input_box)."""
    from fastpipe._resize import input_box

    for data in _sources(jpeg, kind):
        height, width = _whole(data, k, False).shape[:2]
        resized = (int(height * 0.9), int(width * 0.7))
        for window in [(0, 0, *resized), (5, 3, resized[0] // 2, resized[1] // 3),
                       (resized[0] - 9, resized[1] - 11, 9, 11)]:
            for filt in (0, 1):
                box = input_box((height, width), resized, window[:2], window[2:], filt)
                _check(jpeg, resize, data, k, tuple(box), filt == 0, box[:2], (height, width),
                       window[2:], window[:2], resized, filt == 1, filt)


def test_refusals_are_the_region_decodes(jpeg):
    """Whatever decode_region refuses, decode_resize refuses with the same message, so the caller
    falls back to the whole image as before."""
    data = JPEG_KINDS["420"]()
    truncated = data[: len(data) // 2]
    out = np.empty((3, 8, 8), np.uint8)
    for bad, region in [(truncated, (300, 0, 30, 30)), (b"not a jpeg", (0, 0, 1, 1)),
                        (data, (300, 0, 40, 10))]:
        with pytest.raises(ValueError) as expected:
            jpeg.decode_region(bad, 1, *region, True)
        with pytest.raises(ValueError) as got:
            jpeg.decode_resize(bad, 1, region, True, (0, 0), region[2:], out, (0, 0), (8, 8),
                               False, 0)
        assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("change, error, match", [
    ({"k": 3}, ValueError, "scale_denom must be 1, 2, 4 or 8, got 3"),
    ({"filt": 2}, ValueError, r"filter must be 0 \(bilinear\) or 1 \(bicubic\), got 2"),
    ({"out": np.empty((4, 8, 8), np.uint8)}, ValueError, "writable C-contiguous"),
    ({"out": np.empty((3, 8, 8), np.float32)}, ValueError, "writable C-contiguous"),
    ({"out": np.empty((3, 8, 16), np.uint8)[:, :, ::2]}, ValueError, "writable C-contiguous"),
    ({"out_size": (4, 4)}, ValueError, r"out: a 8x8 box at \(0, 0\) does not fit an image of 4x4"),
    ({"at": (5, 0)}, ValueError, r"at/image_size: a 20x20 box at \(5, 0\) does not fit"),
])
def test_bad_arguments_say_what_is_wrong(jpeg, change, error, match):
    args = {"k": 1, "filt": 0, "out": np.empty((3, 8, 8), np.uint8), "out_size": (8, 8),
            "at": (0, 0)}
    args.update(change)
    with pytest.raises(error, match=match):
        jpeg.decode_resize(JPEG_KINDS["420"](), args["k"], (0, 0, 20, 20), True, args["at"],
                           (20, 20), args["out"], (0, 0), args["out_size"], False, args["filt"])


def test_a_read_only_out_is_refused(jpeg):
    out = np.empty((3, 8, 8), np.uint8)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable C-contiguous"):
        jpeg.decode_resize(JPEG_KINDS["420"](), 1, (0, 0, 20, 20), True, (0, 0), (20, 20), out,
                           (0, 0), (8, 8), False, 0)


def test_a_region_missing_pixels_the_window_reads_is_a_runtime_error(jpeg):
    """The caller's mistake, not the data's: not a ValueError, which would send the image down
    the whole-image path and hide the bug."""
    out = np.empty((3, 10, 10), np.uint8)
    with pytest.raises(RuntimeError, match="does not hold every input pixel"):
        jpeg.decode_resize(JPEG_KINDS["420"](), 1, (0, 0, 20, 20), True, (0, 0), (200, 200), out,
                           (50, 50), (100, 100), False, 0)


def test_the_gil_is_released_while_decoding_and_resizing(jpeg):
    data = encode(_photo(1200, 1600), quality=95)
    out = np.empty((3, 224, 224), np.uint8)
    inside, working = turns_inside_calls(lambda: jpeg.decode_resize(
        data, 1, (0, 0, 1200, 1600), False, (0, 0), (1200, 1600), out, (0, 0), (224, 224),
        False, 0))
    assert inside > 1000 * working, f"{inside} main-thread turns in {working:.3f} s of work"


@pytest.mark.slow
def test_a_large_region_after_small_ones_decodes_right(jpeg, resize):
    """The thread keeps its region buffer between calls (up to 16 MiB): a larger region after
    smaller ones grows it, and the one after that, larger than what is kept, gets its own."""
    small = JPEG_KINDS["420"]()
    large = encode(_photo(2400, 2600), quality=90)
    for data, box in [(small, (0, 0, 30, 30)), (small, (0, 0, 333, 517)),
                      (large, (0, 0, 2400, 2600)), (small, (10, 10, 40, 40))]:
        _check(jpeg, resize, data, 1, box, True, (0, 0), box[2:], (64, 64), (0, 0), (64, 64),
               False, 0)
