"""fastpipe._resize: antialiased bilinear resize of RGB crops into (3, H, W) planes.

Checked against a float64 reference built from PIL's filter definition, against torch's and
PIL's own resizes, and for the properties the CPU image path relies on: a window of the resized
image read from a region equals the same window of the whole resize, flips mirror exactly, strided
crop views read like copies, and bad buffers or boxes raise ValueError. The module is built with
the extensions; without it these tests skip, unless FASTPIPE_REQUIRE_EXTENSION=1 (CI).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from fastpipe.data import ImageDecoder
from fastpipe.data.decode import image as _decode
from tests.helpers.cpu_path import (
    built_module,
    decoded,
    large_jpeg,
    sample_files,
    turns_inside_calls,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def module():
    return built_module("fastpipe._resize", "rebuild the extensions", "FASTPIPE_REQUIRE_EXTENSION")


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus noise, (height, width, 3) uint8."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 110 * np.sin(x / 7 + c) * np.cos(y / 11 - c) for c in range(3)], -1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def _resize(module, pixels: np.ndarray, size: tuple[int, int], flip: bool = False) -> np.ndarray:
    out = np.empty((3, *size), np.uint8)
    module.resize(pixels, (0, 0), pixels.shape[:2], out, (0, 0), size, flip)
    return out


def _weights(in_size: int, out_size: int) -> np.ndarray:
    """(out_size, in_size) weights of PIL's antialiased bilinear filter (Resample.c,
    precompute_coeffs), in float64: a triangle widened by the scale when shrinking."""
    scale = in_size / out_size
    support = max(scale, 1.0)
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    matrix = np.zeros((out_size, in_size))
    for i in range(out_size):
        centre = scale * (i + 0.5)
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), in_size)
        taps = np.array([max(0.0, 1.0 - abs((j - centre + 0.5) * inv)) for j in range(lo, hi)])
        matrix[i, lo:hi] = taps / taps.sum()
    return matrix


def _reference(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Exact separable resize in float64, (3, *size), not rounded."""
    rows, cols = _weights(pixels.shape[0], size[0]), _weights(pixels.shape[1], size[1])
    return np.stack([rows @ pixels[:, :, c].astype(np.float64) @ cols.T for c in range(3)])


SHAPES = [((300, 300), (224, 224)), ((150, 170), (224, 224)), ((480, 500), (224, 224)),
          ((7, 5), (224, 224)), ((1, 1), (4, 3)), ((224, 224), (224, 224)), ((900, 40), (33, 100)),
          ((2000, 1500), (224, 224)), ((256, 341), (256, 341)), ((3000, 60), (50, 60)),
          ((60, 3000), (60, 40))]  # the last two: rows shrunk past fixed point's range, columns 75x


@pytest.mark.parametrize("in_size, out_size", SHAPES)
@pytest.mark.slow
def test_equals_the_exact_filter_rounded_half_up(module, in_size, out_size):
    """Rows are summed with 14-bit fixed-point weights (exactly) and kept with 6 fraction bits,
    columns summed with 14-bit weights (in float past an 8x shrink), and rounded once: every value
    is the float64 result rounded half up, except where that result lies within 0.05 of a rounding
    boundary (the weights' and the rows' quantization), where it may be the other neighbour."""
    pixels = _image(*in_size)
    exact = _reference(pixels, out_size)
    got = _resize(module, pixels, out_size).astype(np.float64)
    rounded = np.floor(exact + 0.5)
    assert np.abs(got - exact).max() <= 0.55
    near_boundary = np.abs(exact - np.floor(exact) - 0.5) < 0.05
    assert np.all((got == rounded) | near_boundary)
    assert (got != rounded).mean() < 0.02  # the exception stays rare


@pytest.mark.parametrize("in_size, out_size", SHAPES[:6])
def test_within_a_grey_level_of_torch_and_pil(module, in_size, out_size):
    """The same filter as torch's F.interpolate(antialias=True) and PIL's BILINEAR resize; each
    rounds its own way (16-bit weights, two fixed-point roundings), so values differ by at most
    1."""
    pixels = _image(*in_size, seed=1)
    got = _resize(module, pixels, out_size).astype(np.int32)
    tensor = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
    torch_out = F.interpolate(tensor, size=out_size, mode="bilinear", antialias=True)[0].numpy()
    pil_out = np.asarray(Image.fromarray(pixels).resize(out_size[::-1], Image.BILINEAR))
    for reference in (torch_out, pil_out.transpose(2, 0, 1)):
        diff = np.abs(got - reference.astype(np.int32))
        assert diff.max() <= 1 and diff.mean() < 0.35, (diff.max(), diff.mean())


def _bicubic(x: np.ndarray) -> np.ndarray:
    """PIL's bicubic filter (Keys' cubic, a = -0.5)."""
    x, a = np.abs(x), -0.5
    return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _bicubic_weights(in_size: int, out_size: int) -> np.ndarray:
    """(out_size, in_size) weights of PIL's antialiased bicubic filter (support 2, stretched by
    the scale when shrinking), float64."""
    scale = in_size / out_size
    support = 2.0 * max(scale, 1.0)
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    matrix = np.zeros((out_size, in_size))
    for i in range(out_size):
        centre = scale * (i + 0.5)
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), in_size)
        taps = _bicubic((np.arange(lo, hi) - centre + 0.5) * inv)
        matrix[i, lo:hi] = taps / taps.sum()
    return matrix


def _smooth(height: int, width: int) -> np.ndarray:
    """Gradients in 40-216, so no filter overshoots 0-255 and PIL's clipping between its two
    passes never applies."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 88 * np.sin(x / 9 + c) * np.cos(y / 13 - c) for c in range(3)], -1)
    return base.round().astype(np.uint8)


@pytest.mark.parametrize("in_size, out_size", SHAPES)
@pytest.mark.slow
def test_bicubic_equals_the_exact_filter_clamped_and_rounded(module, in_size, out_size):
    """filter=1: PIL's bicubic taps; the float64 result clamped to 0-255 and rounded half up,
    except within 0.1 of a rounding boundary (negative weights quantize less evenly)."""
    pixels = _image(*in_size)
    rows = _bicubic_weights(in_size[0], out_size[0])
    cols = _bicubic_weights(in_size[1], out_size[1])
    planes = [rows @ pixels[:, :, c].astype(np.float64) @ cols.T for c in range(3)]
    exact = np.clip(np.stack(planes), 0, 255)
    out = np.empty((3, *out_size), np.uint8)
    module.resize(pixels, (0, 0), pixels.shape[:2], out, (0, 0), out_size, False, 1)
    got, rounded = out.astype(np.float64), np.floor(exact + 0.5)
    assert np.abs(got - exact).max() <= 0.6
    near_boundary = np.abs(exact - np.floor(exact) - 0.5) < 0.1
    assert np.all((got == rounded) | near_boundary)
    assert (got != rounded).mean() < 0.02


@pytest.mark.parametrize("in_size, out_size", SHAPES[:6])
def test_bicubic_within_a_grey_level_of_torch_and_pil(module, in_size, out_size):
    """Where nothing overshoots 0-255, within one grey level of PIL's BICUBIC and torch's
    antialiased bicubic (they clip after their first pass, this resize at the end only)."""
    pixels = _smooth(*in_size)
    out = np.empty((3, *out_size), np.uint8)
    module.resize(pixels, (0, 0), pixels.shape[:2], out, (0, 0), out_size, False, 1)
    tensor = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
    torch_out = F.interpolate(tensor, size=out_size, mode="bicubic", antialias=True)[0].numpy()
    pil_out = np.asarray(Image.fromarray(pixels).resize(out_size[::-1], Image.BICUBIC))
    for reference in (torch_out, pil_out.transpose(2, 0, 1)):
        diff = np.abs(out.astype(np.int32) - reference.astype(np.int32))
        assert diff.max() <= 1 and diff.mean() < 0.35, (diff.max(), diff.mean())


def test_bicubic_window_from_its_input_box_equals_the_whole_resize(module):
    image = _image(333, 517, seed=3)
    whole = np.empty((3, 256, 397), np.uint8)
    module.resize(image, (0, 0), (333, 517), whole, (0, 0), (256, 397), False, 1)
    top, left, height, width = module.input_box((333, 517), (256, 397), (16, 86), (224, 224), 1)
    assert (top, left, height, width) != module.input_box((333, 517), (256, 397), (16, 86),
                                                          (224, 224))
    region = np.ascontiguousarray(image[top:top + height, left:left + width])
    out = np.empty((3, 224, 224), np.uint8)
    module.resize(region, (top, left), (333, 517), out, (16, 86), (256, 397), False, 1)
    np.testing.assert_array_equal(out, whole[:, 16:240, 86:310])


def test_unknown_filter_is_refused(module):
    with pytest.raises(ValueError, match="filter must be 0"):
        module.resize(np.zeros((10, 10, 3), np.uint8), (0, 0), (10, 10),
                      np.empty((3, 5, 5), np.uint8), (0, 0), (5, 5), False, 2)


NARROW_AND_EXTREME = [((40, 9), (50, 13)), ((37, 41), (150, 160)), ((200, 230), (60, 50)),
                      ((64, 95), (31, 33)), ((30, 6), (31, 5))]


@pytest.mark.parametrize("in_size, out_size", NARROW_AND_EXTREME)
@pytest.mark.parametrize("filter_", [0, 1])
def test_black_and_white_pixels_resize_like_the_exact_filter(module, in_size, out_size, filter_):
    """Random 0 and 255 pixels give the sums' extremes (bicubic's largest overshoot, which the
    rows' 16-bit values must hold), and rows of 15 to 123 values take every loop of the vertical
    pass (the scalar one, the SSE2 steps within the AVX2 form, and the overlapping last step)."""
    pixels = (np.random.default_rng(sum(in_size)).random((*in_size, 3)) < 0.5).astype(np.uint8)
    pixels *= 255
    weights = _bicubic_weights if filter_ else _weights
    rows, cols = weights(in_size[0], out_size[0]), weights(in_size[1], out_size[1])
    exact = np.clip(np.stack([rows @ pixels[:, :, c].astype(np.float64) @ cols.T
                              for c in range(3)]), 0, 255)
    out = np.empty((3, *out_size), np.uint8)
    module.resize(pixels, (0, 0), in_size, out, (0, 0), out_size, False, filter_)
    assert np.abs(out - exact).max() <= 0.6


@pytest.mark.parametrize("in_size, out_size", SHAPES + NARROW_AND_EXTREME + [
    ((301, 333), (223, 225))])
@pytest.mark.parametrize("filter_", [0, 1])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.slow
def test_the_avx2_form_writes_the_sse2_forms_bytes(module, in_size, out_size, filter_, flip):
    """The output must not depend on the CPU: AVX2 (chosen where the CPU has it) and SSE2 give
    the same bytes, odd widths, padded taps and both filters included."""
    if module._simd() != "avx2":
        pytest.skip("this CPU (or build) has no AVX2 form to compare")
    pixels = _image(*in_size, seed=sum(in_size))
    view = np.pad(pixels, ((0, 0), (0, 7), (0, 0)))[:, :in_size[1]]  # strided rows
    outs = {}
    try:
        for level in ("sse2", "avx2"):
            assert module._simd(level) == level
            out = np.empty((3, *out_size), np.uint8)
            module.resize(view, (0, 0), in_size, out, (0, 0), out_size, flip, filter_)
            outs[level] = out
    finally:
        module._simd("avx2")
    np.testing.assert_array_equal(outs["avx2"], outs["sse2"])


def test_flip_mirrors_the_output(module):
    pixels = _image(123, 211)
    np.testing.assert_array_equal(_resize(module, pixels, (64, 97), flip=True),
                                  _resize(module, pixels, (64, 97))[:, :, ::-1])


def test_a_strided_crop_view_reads_like_its_copy(module):
    """ImageDecoder passes crops of whole decodes as numpy views, without copying."""
    image = _image(200, 300)
    view = image[17:150, 31:270]
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(_resize(module, view, (100, 90)),
                                  _resize(module, np.ascontiguousarray(view), (100, 90)))


@pytest.mark.parametrize("in_size, resized", [((400, 500), (256, 320)), ((333, 517), (256, 397)),
                                              ((120, 90), (341, 256)), ((256, 256), (256, 256))])
def test_a_window_read_from_its_input_box_equals_that_window_of_the_whole_resize(module, in_size,
                                                                                 resized):
    """Eval's centre crop: the window of the resized image, from only the input pixels it reads
    (input_box), is that window of the whole resize, pixel for pixel, flipped or not."""
    image = _image(*in_size, seed=2)
    whole = _resize(module, image, resized)
    rng = np.random.default_rng(0)
    for _ in range(6):
        height, width = int(rng.integers(1, resized[0] + 1)), int(rng.integers(1, resized[1] + 1))
        top, left = (int(rng.integers(0, resized[0] - height + 1)),
                     int(rng.integers(0, resized[1] - width + 1)))
        box = module.input_box(in_size, resized, (top, left), (height, width))
        itop, ileft, iheight, iwidth = box
        region = np.ascontiguousarray(image[itop:itop + iheight, ileft:ileft + iwidth])
        for flip in (False, True):
            out = np.empty((3, height, width), np.uint8)
            module.resize(region, (itop, ileft), in_size, out, (top, left), resized, flip)
            expected = whole[:, top:top + height, left:left + width]
            np.testing.assert_array_equal(out, expected[:, :, ::-1] if flip else expected)
        # One pixel less on any side of the input box is refused, not read out of bounds.
        for cut in ((1, 0, -1, 0), (0, 1, 0, -1), (0, 0, -1, 0), (0, 0, 0, -1)):
            t, left_, h, w = itop + cut[0], ileft + cut[1], iheight + cut[2], iwidth + cut[3]
            if h < 1 or w < 1:
                continue
            with pytest.raises(ValueError, match="do not hold every input pixel"):
                module.resize(image[t:t + h, left_:left_ + w], (t, left_), in_size,
                              np.empty((3, height, width), np.uint8), (top, left), resized, False)


@pytest.mark.parametrize("at, shape", [((2**63 - 1, 0), (1, 1)), ((1, 0), (2**63 - 1, 1)),
                                       ((0, 0), (0, 1)), ((-1, 0), (1, 1))])
def test_input_box_refuses_boxes_outside_the_image(module, at, shape):
    with pytest.raises(ValueError, match="out: "):
        module.input_box((10, 10), (5, 5), at, shape)


def test_input_box_is_the_span_of_the_filter(module):
    """Shrinking 1000 -> 100 (scale 10), output pixel i reads the inputs within 10 of its centre."""
    top, left, height, width = module.input_box((1000, 1000), (100, 100), (50, 50), (1, 1))
    centre = 10 * 50.5
    assert (top, height) == (int(centre - 10 + 0.5),
                             int(centre + 10 + 0.5) - int(centre - 10 + 0.5))
    assert (top, left, height, width) == (top, top, height, height)
    assert module.input_box((10, 10), (10, 10), (0, 0), (10, 10)) == (0, 0, 10, 10)


@pytest.mark.parametrize("pixels, message", [
    (np.zeros((10, 10, 4), np.uint8), r"\(height, width, 3\) uint8"),
    (np.zeros((10, 10, 3), np.float32), r"\(height, width, 3\) uint8"),
    (np.zeros((10, 10, 3), np.uint8)[:, ::2], r"3-byte pixels"),
    (np.zeros((10, 10, 3), np.uint8)[::-1], r"rows apart by at least"),
    (np.zeros((0, 10, 3), np.uint8), r"not empty"),
    (b"\x00" * 300, r"\(height, width, 3\) uint8"),
])
def test_bad_pixels_are_refused(module, pixels, message):
    with pytest.raises(ValueError, match=message):
        module.resize(pixels, (0, 0), (10, 10), np.empty((3, 5, 5), np.uint8), (0, 0), (5, 5),
                      False)


@pytest.mark.parametrize("out, message", [
    (np.empty((3, 5, 5), np.float32), "contiguous, writable"),
    (np.empty((4, 5, 5), np.uint8), "contiguous, writable"),
    (np.empty((3, 5, 10), np.uint8)[:, :, ::2], "contiguous, writable"),
])
def test_bad_outputs_are_refused(module, out, message):
    with pytest.raises(ValueError, match=message):
        module.resize(np.zeros((10, 10, 3), np.uint8), (0, 0), (10, 10), out, (0, 0), (5, 5), False)


def test_read_only_output_is_refused(module):
    out = np.empty((3, 5, 5), np.uint8)
    out.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        module.resize(np.zeros((10, 10, 3), np.uint8), (0, 0), (10, 10), out, (0, 0), (5, 5), False)


@pytest.mark.parametrize("at, image_size, out_at, out_size, message", [
    ((1, 0), (10, 10), (0, 0), (5, 5),
     r"pixels: a 10x10 box at \(1, 0\) does not fit an image of 10x10"),
    ((0, 0), (10, 10), (1, 0), (5, 5), r"out: a 5x5 box at \(1, 0\) does not fit an image of 5x5"),
    ((0, 0), (10, 10), (0, 0), (2**25, 5), "sides up to 2\\*\\*24"),
    ((-1, 0), (10, 10), (0, 0), (5, 5), "does not fit"),
    ((0, 0), (10, 10), (2**63 - 1, 0), (5, 5), "does not fit"),  # top + height would overflow
    ((0, 2**62), (10, 10), (0, 0), (5, 5), "does not fit"),
    ((0, 0), (10, 10), (0, 2**63 - 2), (5, 5), "does not fit"),
])
def test_boxes_outside_their_images_are_refused(module, at, image_size, out_at, out_size, message):
    with pytest.raises(ValueError, match=message):
        module.resize(np.zeros((10, 10, 3), np.uint8), at, image_size,
                      np.empty((3, 5, 5), np.uint8), out_at, out_size, False)


def test_writes_only_the_output_and_reads_only_the_pixels(module):
    """A resize into the middle of a larger tensor (a batch slot) leaves its neighbours alone."""
    batch = torch.full((3, 3, 40, 40), 7, dtype=torch.uint8)
    module.resize(_image(60, 50), (0, 0), (60, 50), batch[1].numpy(), (0, 0), (40, 40), False)
    assert bool((batch[0] == 7).all()) and bool((batch[2] == 7).all())
    assert not bool((batch[1] == 7).all())


def test_the_gil_is_released_while_resizing(module):
    """Another Python thread runs while resizes run (thread-based loaders scale): the worker
    resizes for at least 0.3 s, and the main thread must get many turns inside the calls."""
    pixels, out = _image(2000, 2000), np.empty((3, 1500, 1500), np.uint8)
    inside, busy = turns_inside_calls(
        lambda: module.resize(pixels, (0, 0), (2000, 2000), out, (0, 0), (1500, 1500), False)
    )
    assert inside > 1000 * busy, f"{inside} main-thread turns in {busy:.3f} s of resizing"


def test_reference_weights_are_pils(module):
    """The float64 reference above is PIL's filter: it matches PIL's own resize to a grey level,
    so the exactness test compares against the right thing."""
    pixels = _image(97, 131, seed=3)
    pil_out = np.asarray(
        Image.fromarray(pixels).resize((50, 40), Image.BILINEAR)).transpose(2, 0, 1)
    assert np.abs(np.floor(_reference(pixels, (40, 50)) + 0.5) - pil_out).max() <= 1
    assert math.isclose(_weights(10, 3).sum(axis=1).min(), 1.0)


@pytest.mark.slow
def test_without_the_module_image_decoder_stays_within_a_grey_level(module, sample_root,
                                                                    monkeypatch):
    """Installed without extensions, ImageDecoder resizes with torch and decodes eval images
    whole; train and eval outputs stay within a grey level of the module's."""
    images = [p.read_bytes() for p in sample_files(sample_root)[:6]]
    images.append(large_jpeg(sample_files(sample_root)[0]))  # decoded at reduced scale
    for train in (True, False):
        decoder = ImageDecoder(train=train)
        assert _decode._resize_pixels is module.resize
        with_module = decoded(decoder, images, seed=5)
        with monkeypatch.context() as patch:
            patch.setattr(_decode, "_resize_pixels", None)
            patch.setattr(_decode, "_input_box", None)
            without = decoded(decoder, images, seed=5)
        for a, b in zip(with_module, without):
            diff = (a.int() - b.int()).abs()
            assert a.shape == b.shape and diff.max() <= 1 and diff.float().mean() < 0.35
