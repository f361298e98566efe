"""fastpipe/data/decode/gpu.py: the worker's half of GPU decode, the header and the draw."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fastpipe import Recipe
from fastpipe.data.decode import budget
from fastpipe.data.decode.budget import CorruptImageError, ImageTooLargeError
from fastpipe.data.decode.gpu import PLAN_FIELDS, ROUTE_CPU, ROUTE_GPU, gpu_plan
from fastpipe.data.decode.image import ImageDecoder
from fastpipe.data.sampling.seeds import reseeded
from tests.helpers.cpu_path import encode


def _image(height: int, width: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(height * 1000 + width)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    return image.convert(mode)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("fmt, mode", [("JPEG", "RGB"), ("JPEG", "L"), ("PNG", "RGB"),
                                       ("PNG", "RGBA"), ("WEBP", "RGB")])
def test_the_plan_is_the_cpu_decoders_draw_for_the_images_size(train, fmt, mode):
    decoder = ImageDecoder(recipe=Recipe(train=train, size=(40, 56)))
    for seed, (height, width) in enumerate([(120, 90), (64, 200), (57, 57)]):
        data = encode(_image(height, width, mode), fmt)
        _, plan = gpu_plan(decoder, np.frombuffer(data, np.uint8), "x.img", seed)
        cpu = decoder._plan(height, width, generator=reseeded(seed))
        fields = dict(zip(PLAN_FIELDS, plan))
        assert (fields["height"], fields["width"]) == (height, width)
        assert (fields["top"], fields["left"], fields["box_height"],
                fields["box_width"]) == tuple(cpu.box)
        assert fields["flip"] == int(cpu.flip)
        assert (fields["resize_height"], fields["resize_width"]) == (cpu.resize or (0, 0))
        assert fields["route"] == ROUTE_GPU


def test_cmyk_jpegs_go_to_the_cpu_decoder():
    decoder = ImageDecoder(recipe=Recipe(train=True, size=32))
    data = encode(_image(50, 70, "CMYK"), "JPEG")
    _, plan = gpu_plan(decoder, data, "cmyk.jpg", 1)
    assert plan[:2] == (50, 70) and plan[-1] == ROUTE_CPU


def test_what_the_cpu_path_refuses_is_refused_in_the_worker(monkeypatch):
    decoder = ImageDecoder(recipe=Recipe(train=True, size=32))
    with pytest.raises(CorruptImageError, match="bad.bin.*not a format Pillow recognises"):
        gpu_plan(decoder, b"not an image at all", "bad.bin", 1)
    monkeypatch.setattr(budget, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ImageTooLargeError, match="big.png"):
        gpu_plan(decoder, encode(_image(20, 20), "PNG"), "big.png", 1)


def test_jpegs_cut_short_or_with_bytes_after_their_end_go_to_the_cpu_decoder():
    """The CPU path decodes them strictly (a truncated JPEG is an error for every crop); a GPU
    decoder might pad one without a word."""
    decoder = ImageDecoder(recipe=Recipe(train=True, size=32))
    data = encode(_image(60, 80), "JPEG")
    assert gpu_plan(decoder, data, "whole.jpg", 1)[1][-1] == ROUTE_GPU
    assert gpu_plan(decoder, data[:len(data) // 2], "cut.jpg", 1)[1][-1] == ROUTE_CPU
    assert gpu_plan(decoder, data + b"trailing", "appended.jpg", 1)[1][-1] == ROUTE_CPU
