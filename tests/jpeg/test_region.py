"""fastpipe._jpeg: crop-only JPEG decoding with libjpeg-turbo, against simplejpeg's whole decode.

The module is built when libjpeg-turbo's headers are present (setup.py). Without it these tests
skip, unless FASTPIPE_REQUIRE_JPEG=1 (CI installs the headers, so there a missing module fails).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from fastpipe.data import CorruptImageError, ImageDecoder
from fastpipe.data.decode import image as _decode
from tests.helpers.cpu_path import (
    built_module,
    decoded,
    encode,
    large_jpeg,
    sample_files,
    turns_inside_calls,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def region():
    hint = "install libjpeg-turbo's headers and rebuild"
    return built_module("fastpipe._jpeg", hint, "FASTPIPE_REQUIRE_JPEG").decode_region


def _photo(height: int, width: int, seed: int = 0) -> Image.Image:
    """Smooth colour gradients plus noise: sharp enough that chroma upsampling matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / 17 + c) * np.cos(y / 23 - c) for c in range(3)],
                    axis=-1)
    noisy = base + rng.normal(0, 12, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


# Every layout libjpeg-turbo's upsampler treats differently, odd sizes, progressive and greyscale.
JPEG_KINDS = {
    "420": lambda: encode(_photo(333, 517), quality=90, subsampling=2),
    "422": lambda: encode(_photo(301, 402, 1), quality=90, subsampling=1),
    "444": lambda: encode(_photo(250, 199, 2), quality=85, subsampling=0),
    "420-progressive": lambda: encode(_photo(417, 289, 3), quality=90, progressive=True),
    "grey": lambda: encode(_photo(211, 305, 4).convert("L"), quality=90),
    "420-restart-markers": lambda: encode(_photo(260, 390, 5), quality=90, restart_marker_rows=1),
}


def _whole(data: bytes, k: int, fast_upsample: bool) -> np.ndarray:
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    return simplejpeg.decode_jpeg(data, colorspace="rgb", min_height=-(-height // k),
                                  min_width=-(-width // k), fastupsample=fast_upsample)


def _regions(height: int, width: int, rng: np.random.Generator) -> list[tuple[int, int, int, int]]:
    """Whole image, corners, single row and column, 1x1, and random rectangles."""
    fixed = [(0, 0, height, width), (0, 0, 1, 1), (height - 1, width - 1, 1, 1),
             (height // 2, 0, 1, width), (0, width // 2, height, 1), (height - 7, 0, 7, width)]
    fixed = [box for box in fixed if box[0] >= 0 and box[2] >= 1 and box[3] >= 1]
    random = []
    for _ in range(12):
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        random.append((top, left, int(rng.integers(1, height - top + 1)),
                       int(rng.integers(1, width - left + 1))))
    return fixed + random


def _region_pixels(region, data, k, box, fast_upsample) -> np.ndarray:
    top, left, height, width = box
    pixels, row_stride, column = region(data, k, top, left, height, width, fast_upsample)
    assert (isinstance(pixels, bytearray) and row_stride % 3 == 0
            and row_stride >= 3 * (column + width))
    assert len(pixels) >= height * row_stride
    rows = np.frombuffer(pixels, dtype=np.uint8, count=height * row_stride)
    return rows.reshape(height, row_stride // 3, 3)[:, column:column + width]


@pytest.mark.parametrize("kind", sorted(JPEG_KINDS))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_region_equals_the_crop_of_the_whole_decode_with_fast_upsampling(region, kind, k):
    data = JPEG_KINDS[kind]()
    whole = _whole(data, k, fast_upsample=True)
    rng = np.random.default_rng(k)
    for box in _regions(*whole.shape[:2], rng):
        top, left, height, width = box
        got = _region_pixels(region, data, k, box, fast_upsample=True)
        np.testing.assert_array_equal(got, whole[top:top + height, left:left + width],
                                      err_msg=f"{box}")


@pytest.mark.parametrize("kind", sorted(JPEG_KINDS))
@pytest.mark.parametrize("k", [1, 2, 8])
def test_smooth_upsampling_differs_only_on_the_left_and_right_edges(region, kind, k):
    """libjpeg-turbo has no chroma neighbour outside a cropped column range to interpolate from;
    everything more than 2 columns inside the region is the whole decode's pixel."""
    data = JPEG_KINDS[kind]()
    whole = _whole(data, k, fast_upsample=False).astype(np.int32)
    rng = np.random.default_rng(10 + k)
    for box in _regions(*whole.shape[:2], rng):
        top, left, height, width = box
        reference = whole[top:top + height, left:left + width]
        got = _region_pixels(region, data, k, box, fast_upsample=False).astype(np.int32)
        np.testing.assert_array_equal(got[:, 2:-2], reference[:, 2:-2], err_msg=f"{box}")
        if width >= 32:
            assert np.abs(got - reference).mean() <= 0.5, box


def test_region_rows_below_the_crop_are_not_needed(region):
    """A crop above the damage decodes, a crop through it raises: decoding stops at the crop's
    last row (which is why ImageDecoder requires the end-of-image marker, next test)."""
    data = JPEG_KINDS["420"]()
    cut = data[: len(data) * 2 // 3]
    whole = _whole(data, 1, fast_upsample=True)
    np.testing.assert_array_equal(_region_pixels(region, cut, 1, (0, 0, 32, 517), True), whole[:32])
    with pytest.raises(ValueError, match="libjpeg-turbo: .*(premature|end)"):
        region(cut, 1, 300, 0, 33, 517, True)


def test_decoder_reports_a_truncated_jpeg_whatever_the_crop(region, sample_root):
    """Every draw of a truncated file is an error naming it, also crops the region decode could
    have finished above the cut."""
    data = sample_files(sample_root)[0].read_bytes()
    truncated = data[: len(data) * 9 // 10]
    decoder = ImageDecoder(train=True, scale=(0.08, 0.1))  # small crops, many of them above the cut
    torch.manual_seed(0)
    for _ in range(30):
        with pytest.raises(CorruptImageError, match="class_00/img.jpg"):
            decoder(truncated, "class_00/img.jpg")


@pytest.mark.parametrize("args, match", [
    ((3, 0, 0, 1, 1, True), "scale_denom must be 1, 2, 4 or 8, got 3"),
    ((1, -1, 0, 1, 1, True), "need top, left >= 0"),
    ((1, 0, 0, 0, 5, True), "need top, left >= 0 and a size of 1 to 65535"),
    ((1, 300, 0, 40, 10, True),
     r"region 40x10 at \(300, 0\) exceeds the decoded image, 333x517 at 1/1"),
    ((2, 0, 250, 10, 10, True), r"exceeds the decoded image, 167x259 at 1/2"),
])
def test_bad_arguments_are_value_errors_that_say_what_is_wrong(region, args, match):
    data = JPEG_KINDS["420"]()
    with pytest.raises(ValueError, match=match):
        region(data, *args)


@pytest.mark.parametrize("payload", [b"", b"not a jpeg at all", b"\xff\xd8\xff\xe0" + b"\x00" * 40])
def test_non_jpeg_bytes_are_value_errors(region, payload):
    with pytest.raises(ValueError, match="libjpeg-turbo: "):
        region(payload, 1, 0, 0, 1, 1, True)


def test_cmyk_is_refused_so_pil_decodes_it(region):
    data = encode(_photo(64, 64).convert("CMYK"), quality=90)
    with pytest.raises(ValueError, match="colour space .* is not YCbCr, RGB or greyscale"):
        region(data, 1, 0, 0, 8, 8, True)


def test_bytes_after_the_regions_rows_are_zero(region):
    """libjpeg may write a row past the region, and the buffer is sized by an upper bound: none of
    that is handed out as old heap contents."""
    data = JPEG_KINDS["420"]()
    for k, box in ((1, (5, 6, 21, 30)), (2, (0, 0, 7, 9)), (8, (1, 1, 3, 3))):
        pixels, row_stride, _ = region(data, k, *box, True)
        assert not any(pixels[box[2] * row_stride:])


def test_any_byte_buffer_is_accepted(region):
    data = JPEG_KINDS["444"]()
    expected = _region_pixels(region, data, 1, (5, 6, 20, 30), True)
    for wrapped in (bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8)):
        np.testing.assert_array_equal(_region_pixels(region, wrapped, 1, (5, 6, 20, 30), True),
                                      expected)


def test_the_gil_is_released_while_decoding(region):
    """Another Python thread runs while regions decode (thread-based loaders scale): the worker
    decodes for at least 0.3 s, and the main thread must get many turns inside the decode calls."""
    data = encode(_photo(1200, 1600), quality=95)
    inside, decoding = turns_inside_calls(lambda: region(data, 1, 0, 0, 1200, 1600, False))
    # Holding the GIL, the main thread would get no turn inside a call; released, it spins.
    assert inside > 1000 * decoding, f"{inside} main-thread turns in {decoding:.3f} s of decoding"


def _progressive_without_last_scans(data: bytes, scans: int) -> bytes:
    """The first ``scans`` scans of a progressive JPEG, then the end-of-image marker: a valid
    file that libjpeg decodes without a warning, with detail missing."""
    starts = [i for i in range(len(data) - 1) if data[i:i + 2] == b"\xff\xda"]
    assert len(starts) > scans
    return data[:starts[scans]] + b"\xff\xd9"


@pytest.mark.parametrize("scans", [1, 3, 6])
def test_progressive_jpeg_missing_scans_is_refused_and_decoded_whole(region, region_path,
                                                                     monkeypatch, scans):
    """libjpeg smooths the missing detail from neighbouring blocks, which a crop does not have:
    the module refuses, and ImageDecoder's output equals the whole-image path's."""
    data = _progressive_without_last_scans(JPEG_KINDS["420-progressive"](), scans)
    simplejpeg.decode_jpeg(data)  # a valid file
    with pytest.raises(ValueError, match="progressive JPEG without all its scans"):
        region(data, 1, 10, 10, 50, 50, True)
    decoder = ImageDecoder(train=True)
    torch.manual_seed(1)
    first = decoder(data, "x.jpg")
    torch.manual_seed(1)
    _whole_image_path(monkeypatch)
    assert torch.equal(first, decoder(data, "x.jpg"))


def _encode_with_sampling(encoder: Path, image: Image.Image, h: int, v: int) -> bytes:
    rgb = np.asarray(image.convert("RGB"))
    return subprocess.run([str(encoder), str(rgb.shape[1]), str(rgb.shape[0]), str(h), str(v)],
                          input=rgb.tobytes(), capture_output=True, check=True).stdout


@pytest.mark.parametrize("h, v", [(4, 2), (2, 4), (4, 1)])
def test_chroma_subsampled_beyond_2x_is_refused_with_smooth_upsampling(region, sampling_encoder,
                                                                       h, v):
    """libjpeg-turbo 2.1.5's smooth upsampling gives wrong pixels inside a cropped column range
    when chroma is subsampled more than 2x along an axis; those files decode whole. Replicated
    chroma (fast_upsample) stays exact."""
    data = _encode_with_sampling(sampling_encoder, _photo(120, 160, 7), h, v)
    with pytest.raises(ValueError, match=f"sampling factors 1x1 against {h}x{v}"):
        region(data, 2, 0, 20, 60, 50, False)
    for k in (1, 2, 4):
        # simplejpeg's header reader rejects these sampling factors: the whole image comes from
        # the module itself.
        height, width = -(-120 // k), -(-160 // k)
        whole = _region_pixels(region, data, k, (0, 0, height, width), fast_upsample=True)
        box = (height // 3, width // 3 + 1, height - height // 3, width - width // 3 - 1)
        got = _region_pixels(region, data, k, box, fast_upsample=True)
        np.testing.assert_array_equal(got, whole[box[0]:box[0] + box[2], box[1]:box[1] + box[3]])


# ---------------------------------------------------------------- through ImageDecoder

def _every_kind_of_jpeg(sample_root: Path, photos: int, copies_of_large: int) -> list[bytes]:
    """Sample photos, two large photos (decoded at reduced scale) ``copies_of_large`` times each
    (train crops differ per copy), and every layout of JPEG_KINDS."""
    images = [p.read_bytes() for p in sample_files(sample_root)[:photos]]
    images += [large_jpeg(sample_files(sample_root)[i]) for i in range(2)] * copies_of_large
    return images + [JPEG_KINDS[kind]() for kind in sorted(JPEG_KINDS)]


@pytest.fixture(params=["decode_resize", "decode_region"])
def region_path(request, region, monkeypatch) -> str:
    """ImageDecoder's region path under test: the region decode and the resize in one call
    (fastpipe._jpeg.decode_resize, the default), or as two calls (decode_region, then
    fastpipe._resize; what a build without decode_resize runs)."""
    if request.param == "decode_region":
        monkeypatch.setattr(_decode, "_decode_resize", None)
    else:
        assert _decode._decode_resize is not None, "fastpipe._jpeg has no decode_resize: rebuild"
    return request.param


def _whole_image_path(monkeypatch) -> None:
    monkeypatch.setattr(_decode, "_decode_resize", None)
    monkeypatch.setattr(_decode, "_decode_region", None)


def _record_scales(region_path, monkeypatch) -> list[int]:
    """Has ImageDecoder call the module function of ``region_path`` through a recorder; returns
    the list of DCT scales it is called with, filled in as it decodes."""
    scales: list[int] = []
    function = getattr(_decode, f"_{region_path}")

    def recording(data, k, *rest):
        scales.append(k)
        return function(data, k, *rest)

    monkeypatch.setattr(_decode, f"_{region_path}", recording)
    return scales


@pytest.mark.parametrize("fast_upsample", [True, False])
@pytest.mark.slow
def test_train_outputs_equal_the_whole_image_path(region_path, sample_root, monkeypatch,
                                                  fast_upsample):
    """Same seed, same crops: the region path gives the whole-image path's train output, exactly
    with fast upsampling and within a grey level on average with smooth upsampling. The large
    images decode at 1/2-1/8 scale."""
    images = _every_kind_of_jpeg(sample_root, photos=16, copies_of_large=4)
    decoder = ImageDecoder(train=True, fast_upsample=fast_upsample)
    scales = _record_scales(region_path, monkeypatch)
    with_region = decoded(decoder, images, seed=3)
    assert len(scales) == len(images) and {1, 2} <= set(scales), scales
    _whole_image_path(monkeypatch)
    whole = decoded(decoder, images, seed=3)
    for a, b in zip(with_region, whole):
        if fast_upsample:
            assert torch.equal(a, b)
        else:
            assert (a.int() - b.int()).abs().float().mean() <= 0.1


def test_train_and_eval_paths_use_the_region_decoder(region_path, sample_root, monkeypatch):
    """ImageDecoder calls fastpipe._jpeg for train crops and for the pixels eval's centre crop
    reads (and falls back when it refuses)."""
    calls = []
    function = getattr(_decode, f"_{region_path}")

    def counting(*args):
        calls.append(args[1:])
        return function(*args)

    monkeypatch.setattr(_decode, f"_{region_path}", counting)
    data = sample_files(sample_root)[0].read_bytes()
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    ImageDecoder(train=True)(data, "x.jpg")
    ImageDecoder(train=False)(data, "x.jpg")
    assert len(calls) == 2
    if region_path == "decode_region":
        k, top, left, rows, cols, fast_upsample = calls[1][:6]
    else:
        k, (top, left, rows, cols), fast_upsample = calls[1][:3]
    assert (k, fast_upsample) == (1, False)
    assert rows * cols < 0.9 * height * width, "eval decoded (nearly) the whole image"


@pytest.mark.parametrize("fast_upsample", [True, False])
@pytest.mark.slow
def test_eval_outputs_equal_the_whole_image_path(region_path, sample_root, monkeypatch,
                                                 fast_upsample):
    """Eval decodes only the pixels its centre crop reads, plus a margin of columns where smooth
    upsampling differs at a region's edges: the output is the whole-image path's, pixel for pixel,
    at full and reduced DCT scale and for every JPEG layout."""
    images = _every_kind_of_jpeg(sample_root, photos=8, copies_of_large=1)
    decoder = ImageDecoder(train=False, fast_upsample=fast_upsample)
    scales = _record_scales(region_path, monkeypatch)
    with_region = decoded(decoder, images, seed=0)
    assert len(scales) == len(images) and {1, 2} <= set(scales), scales
    _whole_image_path(monkeypatch)
    for data, got in zip(images, with_region):
        assert torch.equal(got, decoder(data, "x.jpg"))
