"""fastpipe._jpeg.decode_train: ImageDecoder's train path for a sample's seed in one C++ call.

The crop is drawn in C++ (csrc/jpeg/train_plan.h) from the numbers torch's generator gives for the
seed; it must be the Python path's exactly: the plan (DCT scale, decoded crop, flip) over many
image sizes, seeds and options, and the pixels over every JPEG layout the region decode takes.
What it refuses goes down ImageDecoder's own path, with the same crop.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastpipe.data import ImageDecoder
from fastpipe.data.decode import image as _decode
from fastpipe.data.sampling.seeds import reseeded, sample_seed
from tests.helpers.cpu_path import encode, turns_inside_calls
from tests.jpeg.test_region import JPEG_KINDS, _photo

pytestmark = pytest.mark.timeout(300)


DECODERS = [
    {},
    {"size": (160, 192), "scale": (0.5, 1.0), "hflip": 0.0},
    {"size": 64, "ratio": (0.2, 5.0), "hflip": 1.0, "interpolation": "bicubic"},
    {"size": 224, "scale": (1.0, 1.0), "ratio": (1.0, 1.0), "reducing_gap": 2.0},
    {"size": 96, "reducing_gap": float("inf"), "fast_upsample": False},
    {"size": (1, 7), "scale": (0.001, 0.01)},
]


def _python_plan(decoder: ImageDecoder, height: int, width: int, seed: int):
    plan = decoder._plan(height, width, generator=reseeded(seed))
    box = decoder._region((height, width), plan)[0]
    return plan.k, tuple(box), bool(plan.flip)


def _options(decoder: ImageDecoder) -> tuple:
    return decoder._out, decoder.scale, decoder.ratio, decoder.hflip, decoder.reducing_gap


@pytest.mark.parametrize("options", DECODERS, ids=range(len(DECODERS)))
def test_the_plan_is_the_python_plan(jpeg, options):
    """Box, DCT scale and flip equal ImageDecoder._plan + _region's for the same seed: sizes from
    1x1 to 8000 px, square to 1:60, seeds of every magnitude (the generator keeps their low 32
    bits), including crops that fall back to the centre (ratio and scale no attempt fits)."""
    decoder = ImageDecoder(train=True, **options)
    rng = np.random.default_rng(len(str(options)))
    sizes = [(1, 1), (1, 60), (60, 1), (2, 3), (375, 500), (500, 375), (224, 224), (8000, 133)]
    sizes += [(int(h), int(w)) for h, w in rng.integers(1, 3000, size=(60, 2))]
    seeds = [0, 1, 2**32 - 1, 2**32, 2**63 - 1] + [sample_seed(7, e, i) for e in range(2)
                                                   for i in range(6)]
    for height, width in sizes:
        for seed in seeds:
            got = jpeg._train_plan(height, width, seed, *_options(decoder))
            assert got == _python_plan(decoder, height, width, seed), (height, width, seed)


def test_the_draws_are_torchs(jpeg):
    """The plan reads the numbers torch.rand(23, float64) gives after manual_seed: a crop with
    scale (1, 1) and ratio (1, 1) on a square image is the whole image wherever it is drawn, so
    only the flip (the 23rd number against hflip) is left to tell; hflip at that number and just
    above it tells it exactly."""
    for seed in [0, 5, 12345, 2**40 + 5, sample_seed(1, 2, 3)]:
        g = torch.Generator().manual_seed(seed)
        last = torch.rand(23, dtype=torch.float64, generator=g)[22].item()
        options = ((8, 8), (1.0, 1.0), (1.0, 1.0))
        assert jpeg._train_plan(64, 64, seed, *options, last, 1.0)[2] is False
        assert jpeg._train_plan(64, 64, seed, *options, math.nextafter(last, 2.0), 1.0)[2] is True


def _sources(jpeg) -> dict[str, bytes]:
    sources = {kind: make() for kind, make in JPEG_KINDS.items()}
    sources.update({f"{kind}-transcoded": jpeg.transcode(data) for kind, data in
                    list(sources.items())})
    sources["odd-size"] = encode(_photo(97, 1203, 6), quality=80)
    return sources


@pytest.mark.parametrize("options", DECODERS[:5], ids=range(5))
@pytest.mark.slow
def test_the_pixels_are_the_python_paths(jpeg, options):
    """Every layout the region decode takes (4:2:0, 4:2:2, 4:4:4, progressive, greyscale, restart
    markers, transcoded packs' files, an odd size), many seeds: the bytes of
    ImageDecoder(...)(data, generator=reseeded(seed))."""
    decoder = ImageDecoder(train=True, **options)
    args = (decoder.scale, decoder.ratio, decoder.hflip, decoder.reducing_gap,
            decoder.fast_upsample, _decode.RESIZE_FILTERS[decoder.interpolation])
    for kind, data in _sources(jpeg).items():
        for n in range(12):
            seed = sample_seed(n, 0, len(kind))
            out = np.full((3, *decoder._out), 7, np.uint8)
            assert jpeg.decode_train(data, seed, out, *args) is True, kind
            expected = decoder(data, kind, generator=reseeded(seed))
            np.testing.assert_array_equal(out, expected.numpy(), err_msg=f"{kind} seed {seed}")


@pytest.mark.parametrize("kind", ["420", "grey", "420-progressive"])
def test_the_decoder_takes_it_for_a_seed(jpeg, kind, monkeypatch):
    """ImageDecoder._from_seed, which fastpipe's datasets call, goes through decode_train and
    gives what the generator path gives."""
    data = JPEG_KINDS[kind]()
    decoder = ImageDecoder(train=True, size=128)
    calls = []
    real = _decode._decode_train
    monkeypatch.setattr(_decode, "_decode_train", lambda *a: calls.append(1) or real(*a))
    for seed in range(5):
        got = decoder._from_seed(data, kind, seed)
        assert torch.equal(got, decoder(data, kind, generator=reseeded(seed)))
    assert len(calls) == 5


def test_refused_data_takes_the_decoders_own_path(jpeg):
    """Not a JPEG, no end-of-image marker, CMYK, a progressive file missing scans: False, and
    _from_seed then gives (or raises) what the generator path does."""
    data = JPEG_KINDS["420"]()
    png = encode(_photo(40, 50), fmt="PNG")
    cmyk = encode(_photo(64, 64).convert("CMYK"), quality=90)
    progressive = JPEG_KINDS["420-progressive"]()
    cut = progressive[:len(progressive) * 2 // 3] + b"\xff\xd9"
    decoder = ImageDecoder(train=True, size=32)
    out = np.empty((3, 32, 32), np.uint8)
    for name, bad in [("png", png), ("truncated", data[:len(data) // 2]), ("cmyk", cmyk),
                      ("appended", data + b"\0\0"), ("empty", b""), ("text", b"not a jpeg"),
                      ("marker only", b"\xff\xd8\xff\xd9")]:
        assert jpeg.decode_train(bad, 3, out, (0.08, 1.0), (0.75, 4 / 3), 0.5, 1.0, True,
                                 0) is False, name
        try:
            expected = decoder(bad, name, generator=reseeded(3))
        except _decode.CorruptImageError as error:
            with pytest.raises(_decode.CorruptImageError, match=str(error).split(":")[0]):
                decoder._from_seed(bad, name, 3)
        else:
            assert torch.equal(decoder._from_seed(bad, name, 3), expected), name
    for seed in range(4):  # a region below the last scan's end may decode, others are refused
        assert torch.equal(decoder._from_seed(cut, "cut", seed),
                           decoder(cut, "cut", generator=reseeded(seed)))


def test_a_subclass_is_called_as_it_is(monkeypatch):
    """A subclass may override __call__ or the plan; the C++ plan would not see that."""

    class Marked(ImageDecoder):
        def __call__(self, data, source="<bytes>", *, generator=None):
            return super().__call__(data, source, generator=generator) // 2

    monkeypatch.setattr(_decode, "_decode_train", lambda *a: pytest.fail("called for a subclass"))
    data = JPEG_KINDS["420"]()
    decoder = Marked(train=True, size=32)
    assert torch.equal(decoder._from_seed(data, "x", 4), decoder(data, "x", generator=reseeded(4)))


def test_eval_decoders_take_the_generator_path(monkeypatch):
    decoder = ImageDecoder(train=False, size=64)
    monkeypatch.setattr(_decode, "_decode_train", lambda *a: pytest.fail("called in eval"))
    data = JPEG_KINDS["420"]()
    assert torch.equal(decoder._from_seed(data, "x", 1), decoder(data, "x"))


@pytest.mark.parametrize("change, match", [
    ({"out": np.empty((4, 8, 8), np.uint8)}, "writable C-contiguous"),
    ({"out": np.empty((3, 8, 8), np.float32)}, "writable C-contiguous"),
    ({"filt": 2}, r"filter must be 0 \(bilinear\) or 1 \(bicubic\), got 2"),
    ({"scale": (0.5, 0.1)}, r"need 0 < scale\[0\] <= scale\[1\]"),
    ({"ratio": (0.0, 1.0)}, r"0 < ratio\[0\] <= ratio\[1\]"),
    ({"gap": 0.5}, "reducing_gap >= 1"),
])
def test_bad_arguments_say_what_is_wrong(jpeg, change, match):
    args = {"out": np.empty((3, 8, 8), np.uint8), "filt": 0, "scale": (0.08, 1.0),
            "ratio": (0.75, 1.25), "gap": 1.0}
    args.update(change)
    with pytest.raises(ValueError, match=match):
        jpeg.decode_train(JPEG_KINDS["420"](), 1, args["out"], args["scale"], args["ratio"], 0.5,
                          args["gap"], True, args["filt"])


def test_the_gil_is_released_while_decoding_and_resizing(jpeg):
    data = encode(_photo(1200, 1600), quality=95)
    out = np.empty((3, 224, 224), np.uint8)
    inside, working = turns_inside_calls(lambda: jpeg.decode_train(
        data, 1, out, (1.0, 1.0), (1.0, 1.0), 0.5, float("inf"), False, 0))
    assert inside > 1000 * working, f"{inside} main-thread turns in {working:.3f} s of work"
