"""The fused decode path: shapes, fidelity to PIL/torchvision, reduced-scale decoding, errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastpipe import _geometry as geometry
from fastpipe.data import CorruptImageError, ImageDecoder, decode_rgb
from fastpipe.data.decode.image import _decode_jpeg, _Plan, dct_scale
from tests.helpers.cpu_path import chw, encode, large_jpeg, pil_rgb, sample_files

pytest.importorskip("torchvision", exc_type=ImportError)

import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def jpegs(sample_root) -> list[bytes]:
    return [path.read_bytes() for path in sample_files(sample_root)[:12]]


@pytest.fixture(scope="module")
def big_jpeg(sample_root) -> bytes:
    return large_jpeg(sample_files(sample_root)[0])


def _finish(decoder: ImageDecoder, array: np.ndarray, full_size: tuple[int, int],
            plan: _Plan) -> torch.Tensor:
    """The decoder's output for a whole decoded array and a fixed plan (no random draw)."""
    return decoder._resized(decoder._pixels_of(array, full_size, plan), plan)


# ---------------------------------------------------------------- shapes and dtypes

@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("size", [224, 96, 299])
def test_decoder_gives_contiguous_uint8_chw(jpegs, train, size):
    decoder = ImageDecoder(train=train, size=size)
    for data in jpegs[:4]:
        out = decoder(data, "sample.jpg")
        assert out.shape == (3, size, size)
        assert out.dtype == torch.uint8
        assert out.is_contiguous()


def test_decode_rgb_is_full_size_hwc_and_matches_pil(jpegs):
    for data in jpegs[:4]:
        array = decode_rgb(data, "sample.jpg")
        reference = np.asarray(pil_rgb(data), dtype=np.int32)
        assert array.dtype == np.uint8 and array.shape == reference.shape
        # Both are libjpeg-turbo with the accurate DCT and smooth upsampling.
        assert np.abs(array.astype(np.int32) - reference).mean() <= 0.5


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "numpy", "void"])
def test_decoder_accepts_any_byte_buffer(jpegs, kind):
    data = jpegs[0]
    wrapped = {"bytes": data, "bytearray": bytearray(data), "memoryview": memoryview(data),
               "numpy": np.frombuffer(data, dtype=np.uint8), "void": np.void(data)}[kind]
    decoder = ImageDecoder(train=False)
    assert torch.equal(decoder(wrapped, "x"), decoder(data, "x"))
    assert np.array_equal(decode_rgb(wrapped, "x"), decode_rgb(data, "x"))


def test_non_buffer_input_is_a_type_error_naming_the_source():
    with pytest.raises(TypeError, match="image 17: expected encoded image bytes"):
        ImageDecoder()(["not", "bytes"], "17")


@pytest.mark.parametrize("mode,fmt", [("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG"),
                                      ("P", "PNG"), ("RGB", "WEBP"), ("RGB", "BMP")])
def test_other_modes_and_formats_decode_like_pil(jpegs, mode, fmt):
    original = pil_rgb(jpegs[1])
    data = encode(original.convert(mode), fmt)
    out = ImageDecoder(train=False, size=128, reducing_gap=float("inf"))(
        data, f"image.{fmt.lower()}")
    assert out.shape == (3, 128, 128) and out.dtype == torch.uint8
    reference = T.Compose([T.Resize(146), T.CenterCrop(128)])(pil_rgb(data))
    assert np.abs(out.numpy().astype(np.int32) - chw(reference)).mean() <= 0.5


# ---------------------------------------------------------------- fidelity at full scale

FILTERS = {"bilinear": T.InterpolationMode.BILINEAR, "bicubic": T.InterpolationMode.BICUBIC}


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_eval_output_within_bound_of_pil_resize_centre_crop(jpegs, interpolation):
    """Bound: mean |difference| <= 0.25 grey levels per image, max <= 2 (measured: up to 0.17, 1;
    fastpipe._resize rounds once where PIL rounds after each pass; torch's kernel, which rounds as
    PIL does, measured 0.02)."""
    decoder = ImageDecoder(train=False, interpolation=interpolation)
    reference = T.Compose([T.Resize(256, FILTERS[interpolation]), T.CenterCrop(224)])
    for data in jpegs:
        diff = np.abs(decoder(data, "x").numpy().astype(np.int32) - chw(reference(pil_rgb(data))))
        assert diff.mean() <= 0.25 and diff.max() <= 2, (diff.mean(), diff.max())


def test_eval_handles_portrait_and_crop_pct(jpegs):
    portrait = encode(pil_rgb(jpegs[2]).transpose(Image.Transpose.ROTATE_90), quality=95)
    decoder = ImageDecoder(train=False, size=160, crop_pct=0.8)
    reference = T.Compose([T.Resize(200), T.CenterCrop(160)])(pil_rgb(portrait))
    diff = np.abs(decoder(portrait, "x").numpy().astype(np.int32) - chw(reference))
    assert diff.mean() <= 0.25


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_eval_at_reduced_scale_stays_within_half_a_grey_level_of_pil(big_jpeg, interpolation):
    """Large images decode at 1/2 or 1/4 in eval too (default reducing_gap 2.0): bound 0.5."""
    decoder = ImageDecoder(train=False, interpolation=interpolation)
    full = pil_rgb(big_jpeg)
    resize = geometry.eval_resize(full.height, full.width, 256)
    assert decoder._dct_scale(full.height, full.width, resize) > 1
    reference = T.Compose([T.Resize(256, FILTERS[interpolation]), T.CenterCrop(224)])(full)
    assert np.abs(decoder(big_jpeg, "x").numpy().astype(np.int32) - chw(reference)).mean() <= 0.5


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_train_crop_at_full_scale_matches_torchvision_resized_crop(jpegs, interpolation):
    """A fixed box through the fused path vs torchvision's PIL resizedgeometry. Bound: mean
    |difference| <= 0.5 grey levels, max <= 2 (measured: up to 0.19, max 1)."""
    decoder = ImageDecoder(train=True, interpolation=interpolation)
    for data in jpegs[:4]:
        image = pil_rgb(data)
        for box in (geometry.Box(10, 20, 150, 180), geometry.Box(0, 0, image.height, image.width),
                    geometry.Box(33, 7, 300, 260)):
            array = _decode_jpeg(data, image.height, image.width, 1)
            out = _finish(decoder, array, (image.height, image.width), _Plan(box, None, False, 1))
            reference = TF.resized_crop(image, *box, [224, 224], FILTERS[interpolation])
            diff = np.abs(out.numpy().astype(np.int32) - chw(reference))
            assert diff.mean() <= 0.5 and diff.max() <= 2, (box, diff.mean(), diff.max())


# ---------------------------------------------------------------- reduced DCT scale

@pytest.mark.parametrize("k", [2, 4, 8])
def test_reduced_scale_decode_matches_full_decode_reduced(big_jpeg, k):
    """libjpeg-turbo's 1/k decode vs full decode followed by a k x k box average (PIL reduce):
    mean |difference| <= 0.5 grey levels (measured 0.2-0.25)."""
    full = pil_rgb(big_jpeg)
    array = _decode_jpeg(big_jpeg, full.height, full.width, k)
    assert array.shape == (-(-full.height // k), -(-full.width // k), 3)
    reference = np.asarray(full.reduce(k), dtype=np.int32)
    assert np.abs(array.astype(np.int32) - reference).mean() <= 0.5


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("reducing_gap,bound", [(1.0, 4.0), (2.0, 0.5)])
def test_reduced_scale_crops_within_bound_of_full_decode_and_resize(big_jpeg, reducing_gap, bound,
                                                                   interpolation):
    """Fused path (decode at 1/k, then resize) vs full decode + PIL resize of the same box.
    Stated bounds on the mean |difference|: 4 grey levels with the default reducing_gap=1.0
    (measured up to 2.8: the k x k DCT reduction is sharper than one wide bilinear filter), 0.5
    with reducing_gap=2.0 (measured up to 0.19)."""
    full = pil_rgb(big_jpeg)
    height, width = full.height, full.width
    decoder = ImageDecoder(train=True, reducing_gap=reducing_gap, interpolation=interpolation)
    used = set()
    for side in (460, 700, 1000, 1500):
        box = geometry.Box(20, 30, side, side)
        k = decoder._dct_scale(height, width, (height * 224 / side, width * 224 / side))
        used.add(k)
        out = _finish(decoder, _decode_jpeg(big_jpeg, height, width, k), (height, width),
                      _Plan(box, None, False, k))
        pil_filter = Image.BICUBIC if interpolation == "bicubic" else Image.BILINEAR
        reference = full.resize((224, 224), pil_filter,
                                box=(box.left, box.top, box.left + side, box.top + side))
        diff = np.abs(out.numpy().astype(np.int32) - chw(reference)).mean()
        assert diff <= bound, (side, k, diff)
    assert used - {1}, "no box was decoded at reduced scale: the test would prove nothing"


def test_dct_scale_is_the_smallest_that_covers_the_output():
    assert dct_scale(1000, 1000, 224, 224) == 4  # 250 >= 224, 125 < 224
    assert dct_scale(1000, 1000, 501, 224) == 1
    assert dct_scale(1000, 1000, 500, 500) == 2
    assert dct_scale(4000, 3000, 300, 300) == 8
    # smaller than the output: upsampled, full decode
    assert dct_scale(100, 100, 224, 224) == 1


def test_reducing_gap_defaults_and_infinity():
    assert ImageDecoder(train=True).reducing_gap == 1.0
    assert ImageDecoder(train=False).reducing_gap == 2.0
    assert ImageDecoder()._dct_scale(2000, 2000, (224, 224)) == 8
    assert ImageDecoder(reducing_gap=2.0)._dct_scale(2000, 2000, (224, 224)) == 4
    assert ImageDecoder(reducing_gap=float("inf"))._dct_scale(4000, 4000, (224, 224)) == 1


def test_fast_upsample_defaults_on_in_train_and_off_in_eval():
    assert ImageDecoder(train=True).fast_upsample is True
    assert ImageDecoder(train=False).fast_upsample is False
    assert ImageDecoder(train=True, fast_upsample=False).fast_upsample is False


def test_fast_upsample_train_crops_within_bound_of_accurate_upsampling(jpegs):
    """Replicated instead of interpolated chroma (simplejpeg fastupsample), same crops and flips.
    Bounds on the mean |difference|: 0.5 grey levels over the images, 1.0 for any one image
    (measured 0.33 and 0.71 here; 0.20 and 0.61 over 200 benchmark images). Single pixels at
    sharp colour edges differ by up to ~40 levels."""
    diffs = []
    for data in jpegs:
        outs = []
        for fast in (False, True):
            torch.manual_seed(3)
            outs.append(
                ImageDecoder(train=True, fast_upsample=fast)(data, "x").numpy().astype(np.int32))
        diffs.append(np.abs(outs[0] - outs[1]).mean())
    assert max(diffs) > 0, "fast_upsample changed nothing: the test would prove nothing"
    assert np.mean(diffs) <= 0.5 and max(diffs) <= 1.0, diffs


# ---------------------------------------------------------------- the crop distribution

def _stats(boxes, height, width):
    boxes = np.asarray(boxes, dtype=np.float64)
    top, left, h, w = boxes.T
    return {
        "scale": h * w / (height * width),
        "log_ratio": np.log(w / h),
        "centre_y": (top + h / 2) / height,
        "centre_x": (left + w / 2) / width,
    }


def _ks(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov distance."""
    grid = np.sort(np.concatenate([a, b]))
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def _hist_gap(a, b, bins: int = 20) -> float:
    """Largest difference in the share of draws falling in one of ``bins`` histogram bins."""
    edges = np.histogram_bin_edges(np.concatenate([a, b]), bins=bins)
    ha = np.histogram(a, edges)[0] / len(a)
    hb = np.histogram(b, edges)[0] / len(b)
    return float(np.abs(ha - hb).max())


# 20000 draws per side: the KS distance of two samples of one distribution stays under 0.0223 with
# probability 1 - 1e-4, and a histogram bin share (~0.05) under 0.012 at 5 standard deviations.
DRAWS = 20000
KS_BOUND = 0.025
HIST_BOUND = 0.012


@pytest.mark.timeout(120)
@pytest.mark.parametrize("height,width", [(400, 500), (480, 340), (100, 1000), (224, 224)])
@pytest.mark.slow
def test_crop_distribution_matches_torchvision_random_resized_crop(height, width):
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    torch.manual_seed(0)
    ours = [geometry.random_resized_crop_box(height, width, geometry.draw_uniforms(), scale, ratio)
            for _ in range(DRAWS)]
    torch.manual_seed(1)
    image = torch.empty(3, height, width)
    theirs = [T.RandomResizedCrop.get_params(image, list(scale), list(ratio)) for _ in range(DRAWS)]
    ours_s, theirs_s = _stats(ours, height, width), _stats(theirs, height, width)
    for name in ours_s:
        assert _ks(ours_s[name], theirs_s[name]) < KS_BOUND, name
        assert _hist_gap(ours_s[name], theirs_s[name]) < HIST_BOUND, name
    for top, left, h, w in ours[:1000]:
        assert 0 <= top <= height - h and 0 <= left <= width - w and h > 0 and w > 0


@pytest.mark.slow
def test_crop_distribution_check_detects_a_wrong_sampler():
    """The bounds above are tight enough to fail a plausible mistake: a ratio drawn uniformly
    instead of log-uniformly, and a scale range of (0.2, 1) instead of (0.08, 1)."""
    height, width = 400, 500
    torch.manual_seed(0)
    good = [geometry.random_resized_crop_box(height, width, geometry.draw_uniforms())
            for _ in range(DRAWS)]
    rng = np.random.default_rng(0)
    lo, hi = np.log(3 / 4), np.log(4 / 3)
    uniform_ratio = []
    for _ in range(DRAWS):
        u = geometry.draw_uniforms()
        for attempt in range(10):
            # The uniform number that makes the sampler's log-uniform ratio a uniform one.
            u[2 * attempt + 1] = (np.log(3 / 4 + (4 / 3 - 3 / 4) * rng.random()) - lo) / (hi - lo)
        uniform_ratio.append(geometry.random_resized_crop_box(height, width, u))
    narrow = [geometry.random_resized_crop_box(height, width, geometry.draw_uniforms(), (0.2, 1.0))
              for _ in range(DRAWS)]
    good_s = _stats(good, height, width)
    assert _ks(good_s["log_ratio"], _stats(uniform_ratio, height, width)["log_ratio"]) > KS_BOUND
    assert _ks(good_s["scale"], _stats(narrow, height, width)["scale"]) > KS_BOUND


def test_crop_falls_back_to_clamped_centre_crop_like_torchvision():
    # No 10 draws fit a 20x1000 strip: torchvision's fallback is the centre crop at ratio 4/3.
    never_fits = [0.99, 0.0] * 10 + [0.5, 0.5, 0.5]
    assert geometry.random_resized_crop_box(20, 1000, never_fits) == geometry.Box(0, 486, 20, 27)
    assert geometry.random_resized_crop_box(1000, 20, never_fits) == geometry.Box(486, 0, 27, 20)
    assert (geometry.random_resized_crop_box(100, 110, [1.5] * 20 + [0, 0, 0])
            == geometry.Box(0, 0, 100, 110))


# ---------------------------------------------------------------- randomness and flips

def test_same_torch_seed_reproduces_crops_and_other_seed_changes_them(jpegs):
    decoder = ImageDecoder(train=True)

    def run(seed):
        torch.manual_seed(seed)
        return [decoder(data, "x") for data in jpegs[:6]]

    first, again, other = run(3), run(3), run(4)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_hflip_mirrors_the_same_crop(jpegs):
    for data in jpegs[:3]:
        torch.manual_seed(5)
        plain = ImageDecoder(train=True, hflip=0.0)(data, "x")
        torch.manual_seed(5)
        mirrored = ImageDecoder(train=True, hflip=1.0)(data, "x")
        assert torch.equal(mirrored, plain.flip(-1))
        assert mirrored.is_contiguous()


def test_default_flip_rate_is_one_half():
    decoder = ImageDecoder(train=True)
    torch.manual_seed(0)
    flips = sum(decoder._plan(300, 400).flip for _ in range(4000))
    assert 1800 < flips < 2200


# ---------------------------------------------------------------- errors

def test_recoverable_jpeg_damage_decodes_through_pil_like_torchvision(jpegs):
    """Junk before a marker is a libjpeg warning: simplejpeg (strict) refuses the file, PIL and so
    torchvision load it, and so does the fast path, through its PIL fallback."""
    data = jpegs[0]
    at = data.index(b"\xff\xda")
    damaged = data[:at] + b"\x00\x00\x00\x00" + data[at:]
    out = ImageDecoder(train=False)(damaged, "damaged.jpg")
    reference = T.Compose([T.Resize(256), T.CenterCrop(224)])(pil_rgb(damaged))
    assert np.abs(out.numpy().astype(np.int32) - chw(reference)).mean() <= 0.25


def test_truncated_jpeg_raises_naming_the_source(jpegs):
    truncated = jpegs[0][: len(jpegs[0]) // 2]
    for call in (ImageDecoder(train=True), ImageDecoder(train=False), decode_rgb):
        with pytest.raises(CorruptImageError, match="class_00/img_00007.jpg") as info:
            call(truncated, "class_00/img_00007.jpg")
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("payload",
                         [b"not an image at all\n" * 10, b"", b"\xff\xd8\xff\xe0garbage"])
def test_non_image_bytes_raise_naming_the_source(payload):
    with pytest.raises(CorruptImageError, match="notes.txt"):
        ImageDecoder()(payload, "notes.txt")


def test_truncated_png_raises_naming_the_source(jpegs):
    png = encode(pil_rgb(jpegs[0]), "PNG")
    with pytest.raises(CorruptImageError, match="broken.png"):
        ImageDecoder()(png[: len(png) // 2], "broken.png")


@pytest.mark.parametrize("kwargs,match", [
    ({"size": 0}, "size"), ({"size": 22.5}, "size"), ({"scale": (0.9, 0.1)}, "scale"),
    ({"ratio": (0, 1)}, "ratio"), ({"hflip": 1.5}, "hflip"), ({"crop_pct": 0}, "crop_pct"),
    ({"reducing_gap": 0.5}, "reducing_gap"), ({"size": (224,)}, "size"),
    ({"size": (0, 5)}, "size"), ({"interpolation": "nearest"}, "interpolation"),
])
def test_bad_arguments_are_rejected_with_the_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ImageDecoder(**kwargs)


# ---------------------------------------------------------------- untrusted files (issue 30)

CASES = Path(__file__).resolve().parents[2] / "jpeg" / "cases"
SAMPLING_441 = CASES / "decode_rgb-keyerror-441-sampling.jpg"
BOMB = CASES / "dos-baseline-65500x65500.jpg"


@pytest.fixture(scope="module")
def sampled_jpeg(tmp_path_factory):
    """``(image, h, v) -> bytes``: a JPEG with luma sampling h x v against 1x1 chroma
    (tests/jpeg/sampling_encoder.c; PIL cannot write these)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        pytest.skip("no C compiler to build the test's JPEG encoder")
    encoder = tmp_path_factory.mktemp("encoder") / "encoder"
    source = Path(__file__).resolve().parents[2] / "jpeg" / "sampling_encoder.c"
    subprocess.run([compiler, str(source), "-o", str(encoder), "-ljpeg"], check=True,
                   capture_output=True)

    def encode_sampled(image: Image.Image, h: int, v: int) -> bytes:
        width, height = image.size
        return subprocess.run([str(encoder), str(width), str(height), str(h), str(v)],
                              input=image.convert("RGB").tobytes(), capture_output=True,
                              check=True).stdout
    return encode_sampled


def _unusual_layouts(jpegs, sampled_jpeg) -> dict[str, bytes]:
    photo = pil_rgb(jpegs[1])
    return {"shared-441": SAMPLING_441.read_bytes(), "441": sampled_jpeg(photo, 1, 4),
            "3x1": sampled_jpeg(photo, 3, 1), "1x3": sampled_jpeg(photo, 1, 3)}


def test_unusual_chroma_layouts_decode_to_pils_pixels(jpegs, sampled_jpeg):
    """simplejpeg's header reader raised KeyError: 6 on 4:4:1 files, which stopped decode_rgb,
    ImageDecoder and every dataset."""
    for name, data in _unusual_layouts(jpegs, sampled_jpeg).items():
        np.testing.assert_array_equal(decode_rgb(data, name), np.asarray(pil_rgb(data)))
        for train in (True, False):
            out = ImageDecoder(train=train, size=32)(data, name)
            assert out.shape == (3, 32, 32), name


def test_unusual_layouts_give_one_output_on_the_seeded_and_the_generator_paths(
        jpegs, sampled_jpeg):
    """The seeded path (decode_train) decoded 3x1 files through the region decode and the call
    through PIL whole: up to 81 grey levels apart; both now take the region decode."""
    from fastpipe.data.sampling.seeds import reseeded

    decoder = ImageDecoder(train=True, size=48)
    for name, data in _unusual_layouts(jpegs, sampled_jpeg).items():
        for seed in range(6):
            by_seed = decoder._from_seed(data, name, seed)
            by_call = decoder(data, name, generator=reseeded(seed))
            torch.testing.assert_close(by_seed, by_call, atol=0, rtol=0, msg=f"{name} {seed}")


def test_damaged_unusual_layouts_are_refused_by_both_paths_alike(jpegs, sampled_jpeg):
    from fastpipe.data.sampling.seeds import reseeded

    data = _unusual_layouts(jpegs, sampled_jpeg)["3x1"]
    decoder = ImageDecoder(train=True, size=48)
    rng = np.random.default_rng(0)
    start = data.index(b"\xff\xda") + 40
    for _ in range(30):
        damaged = bytearray(data)
        at = int(rng.integers(start, len(data) - 2))
        damaged[at:at + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        outcomes = []
        for by_seed in (True, False):
            try:
                outcomes.append(decoder._from_seed(bytes(damaged), "x", 3) if by_seed else
                                decoder(bytes(damaged), "x", generator=reseeded(3)))
            except CorruptImageError:
                outcomes.append(None)
        if outcomes[0] is None or outcomes[1] is None:
            assert outcomes[0] is None and outcomes[1] is None
        else:
            torch.testing.assert_close(outcomes[0], outcomes[1], atol=0, rtol=0)


def test_the_4_4_1_file_packs_reads_and_verifies(tmp_path, jpegs, sampled_jpeg):
    """fastpipe pack aborted on it (leaving its shards), H5Dataset raised, verify crashed."""
    pytest.importorskip("h5py")
    from fastpipe.data import H5Dataset
    from fastpipe.pack import pack, verify

    root = tmp_path / "images" / "a"
    root.mkdir(parents=True)
    (root / "shared.jpg").write_bytes(SAMPLING_441.read_bytes())
    (root / "big.jpg").write_bytes(_unusual_layouts(jpegs, sampled_jpeg)["441"])
    (root / "plain.jpg").write_bytes(jpegs[0])
    report = pack(tmp_path / "images", tmp_path / "p.h5", progress=False)
    assert report.skipped == []
    whole = H5Dataset(tmp_path / "p.h5")
    shapes = sorted(tuple(whole[i][0].shape) for i in range(len(whole)))
    assert shapes == sorted([(3, 16, 16), (3, *pil_rgb(jpegs[1]).size[::-1]),
                             (3, *pil_rgb(jpegs[0]).size[::-1])])
    cropped = H5Dataset(tmp_path / "p.h5", decoder=ImageDecoder(size=32), seed=0)
    assert [tuple(cropped[i][0].shape) for i in range(len(cropped))] == [(3, 32, 32)] * 3
    assert verify(tmp_path / "p.h5").ok


def _peak_of(code: str) -> tuple[str, int, int]:
    """Runs ``code`` in a fresh interpreter; its output, and the growth of its peak RSS (KiB) and
    the peak of tracemalloc (bytes: numpy's buffers count there) across the code."""
    script = (
        "import resource, tracemalloc\n"
        "from fastpipe.data.decode.image import ImageDecoder, ImageTooLargeError, decode_rgb\n"
        f"data = open({str(BOMB)!r}, 'rb').read()\n"
        "ImageDecoder(size=8)(open({!r}, 'rb').read())\n".format(str(SAMPLING_441)) +
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "tracemalloc.start()\n"
        f"{code}\n"
        "peak = tracemalloc.get_traced_memory()[1]\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, peak)\n"
    )
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, timeout=120).stdout.splitlines()
    rss, peak = lines[-1].split()
    return "\n".join(lines[:-1]), int(rss), int(peak)


@pytest.mark.slow
def test_a_bomb_is_refused_before_anything_is_allocated():
    """629 bytes declaring 65500x65500: decode_rgb allocated 12 GiB; now every decode refuses
    it from its header, naming the file, with peak memory measured around the calls."""
    calls = ["decode_rgb(data, 'bomb.jpg')", "ImageDecoder()(data, 'bomb.jpg')",
             "ImageDecoder(train=False)(data, 'bomb.jpg')",
             "ImageDecoder()._from_seed(data, 'bomb.jpg', 5)"]
    code = "\n".join(f"try:\n    {call}\nexcept ImageTooLargeError as e:\n    print(e)"
                     for call in calls)
    out, rss, peak = _peak_of(code)
    lines = out.splitlines()
    assert len(lines) == 4, out
    assert all("bomb.jpg declares 65500x65500 pixels" in line and "178956970" in line
               for line in lines), out
    assert rss < 64 * 1024, f"peak RSS grew by {rss} KiB"
    assert peak < 16 << 20, f"tracemalloc peak {peak} bytes"


def test_the_pixel_budget_is_a_module_setting(monkeypatch, jpegs):
    from fastpipe.data.decode import budget as _decode

    height, width = pil_rgb(jpegs[0]).size[::-1]
    png = encode(pil_rgb(jpegs[0]), "PNG")
    monkeypatch.setattr(_decode, "MAX_IMAGE_PIXELS", height * width - 1)
    for data in (jpegs[0], png):
        for call in (decode_rgb, ImageDecoder(), ImageDecoder(train=False),
                     lambda d, s: ImageDecoder()._from_seed(d, s, 1)):
            with pytest.raises(_decode.ImageTooLargeError, match="img.jpg declares"):
                call(data, "img.jpg")
    monkeypatch.setattr(_decode, "MAX_IMAGE_PIXELS", height * width)
    assert decode_rgb(jpegs[0]).shape == (height, width, 3)
    assert ImageDecoder()._from_seed(jpegs[0], "img.jpg", 1).shape == (3, 224, 224)


def test_the_packer_skips_a_bomb_as_an_input(tmp_path, jpegs):
    pytest.importorskip("h5py")
    from fastpipe.pack import pack

    root = tmp_path / "images" / "a"
    root.mkdir(parents=True)
    (root / "bomb.jpg").write_bytes(BOMB.read_bytes())
    (root / "plain.jpg").write_bytes(jpegs[0])
    report = pack(tmp_path / "images", tmp_path / "p.h5", progress=False)
    assert [Path(s["source"]).name for s in report.skipped] == ["bomb.jpg"]
    assert report.skipped[0]["reason"].startswith("too large: ")
    assert "pixel budget" in report.skipped[0]["reason"]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_images_of_a_few_pixels_decode_at_the_planned_scale_on_every_path(k):
    """simplejpeg picks its scale from the size asked for, and for images of ~8 px or less
    another M/8 scale gives the same size: the whole-image path decoded at another scale than the
    region path. It now decodes at 1/k exactly (fastpipe._jpeg)."""
    jpeg = pytest.importorskip("fastpipe._jpeg")
    rng = np.random.default_rng(k)
    for height in (1, 2, 3, 5, 8, 9, 17):
        for width in (1, 3, 5, 16):
            image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
            data = encode(image, quality=90)
            dh, dw = -(-height // k), -(-width // k)
            for fast in (True, False):
                pixels, stride, column = jpeg.decode_region(data, k, 0, 0, dh, dw, fast)
                region = np.frombuffer(pixels, np.uint8, count=dh * stride).reshape(dh, -1, 3)
                np.testing.assert_array_equal(_decode_jpeg(data, height, width, k, fast),
                                              region[:, column:column + dw])


def _budget_in_child(_: int) -> int:
    from fastpipe.data import max_image_pixels

    return max_image_pixels()


@pytest.mark.slow
def test_the_public_pixel_budget_reaches_spawned_workers(jpegs, monkeypatch):
    import concurrent.futures
    import multiprocessing

    from fastpipe.data import (
        ImageTooLargeError,
        max_image_pixels,
        set_max_image_pixels,
    )

    monkeypatch.delenv("FASTPIPE_MAX_IMAGE_PIXELS", raising=False)
    default = max_image_pixels()
    height, width = pil_rgb(jpegs[0]).size[::-1]
    try:
        set_max_image_pixels(height * width - 1)
        with pytest.raises(ImageTooLargeError, match="set_max_image_pixels"):
            decode_rgb(jpegs[0], "img.jpg")
        with concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")) as pool:
            assert pool.submit(_budget_in_child, 0).result(timeout=120) == height * width - 1
        with pytest.raises(ValueError, match="positive int"):
            set_max_image_pixels(0)
    finally:
        set_max_image_pixels(None)
    assert max_image_pixels() == default == 178_956_970
    assert decode_rgb(jpegs[0]).shape == (height, width, 3)


def _png_of(height: int, width: int) -> bytes:
    """A valid grey PNG of zeros, ``height x width``, at zlib's best compression."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    body = zlib.compress(bytes((1 + width) * height), 9)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0,
                                                              0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))


@pytest.mark.slow
def test_a_png_taller_than_the_resize_takes_is_refused_by_name():
    """Inside the pixel budget, a valid PNG 1 pixel wide and 2**24 + 1 tall gave fastpipe._resize's
    raw ValueError ('does not fit an image of ...') in eval mode, which resizes the whole image;
    it is refused from its header, naming the image and the limit. A train crop of it is small
    and resizes."""
    from fastpipe.data import ImageTooLargeError

    data = _png_of(2**24 + 1, 1)
    with pytest.raises(ImageTooLargeError, match=r"tall.png is 16777217x1 pixels: a side "
                                                 r"longer than 16,777,216 \(2\*\*24\)"):
        ImageDecoder(train=False, size=32)(data, "tall.png")
    assert ImageDecoder(train=True, size=32)(data, "tall.png").shape == (3, 32, 32)
    np.testing.assert_array_equal(ImageDecoder(train=False, size=4)(_png_of(2**12, 1), "ok.png"),
                                  np.zeros((3, 4, 4), np.uint8))


def test_a_damaged_png_is_not_decoded_again_by_pil():
    """ImageDecoder's non-JPEG path takes fastpipe._png's verdict with its reason."""
    pytest.importorskip("fastpipe._png")
    data = bytearray(_png_of(40, 30))
    data[data.index(b"IDAT") + 6] ^= 0x01  # the IDAT's CRC no longer matches
    for train in (True, False):
        with pytest.raises(CorruptImageError, match="bad.png: PNG: IDAT: CRC error"):
            ImageDecoder(train=train, size=16)(bytes(data), "bad.png")
