"""The FFCV comparison of bench_cpu_path stores the pixels it says it stores."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest

from benchmarks import _ffcv

PIL = pytest.importorskip("PIL.Image", exc_type=ImportError)

# Landscape, portrait, square, a small one no cap touches, an odd large one.
SIZES = [(500, 375), (375, 500), (400, 400), (120, 90), (1601, 997), (333, 501)]


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(0)
    for i, (width, height) in enumerate(SIZES):
        folder = root / f"class{i % 2}"
        folder.mkdir(exist_ok=True)
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        PIL.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return root


def _stored_sizes(pack_path: Path) -> list[tuple[int, int]]:
    import h5py

    with h5py.File(pack_path, "r") as file:
        offsets, data = file["_fastpipe/offsets/image"][:], file["image"]
        sizes = []
        for i in range(len(offsets) - 1):
            with PIL.open(io.BytesIO(data[offsets[i]:offsets[i + 1]].tobytes())) as image:
                sizes.append(image.size)
    return sizes


def test_pixel_count_of_max_side_equals_what_the_packer_stores(mixed_root, tmp_path):
    pytest.importorskip("h5py")
    from fastpipe.pack import pack

    sizes = _ffcv.image_sizes(str(mixed_root))
    assert sorted(sizes) == sorted(SIZES)
    for side in (64, 200, 377):
        out = tmp_path / f"pack-{side}.h5"
        pack(str(mixed_root), out, storage="bytes", max_side=side, quality=90, transcode=True,
             progress=False)
        stored = _stored_sizes(out)
        assert sum(w * h for w, h in stored) == _ffcv.fastpipe_pixels(sizes, side)


def test_matching_max_side_stores_about_as_many_pixels_as_ffcv(mixed_root):
    sizes = _ffcv.image_sizes(str(mixed_root))
    for resolution in (128, 256, 512):
        side = _ffcv.matching_max_side(sizes, resolution)
        target = _ffcv.ffcv_pixels(sizes, resolution)
        # The best integer cap: one less or one more is no closer to FFCV's count.
        error = abs(_ffcv.fastpipe_pixels(sizes, side) - target)
        for other in (side - 1, side + 1):
            assert abs(_ffcv.fastpipe_pixels(sizes, other) - target) >= error
        assert error <= 0.02 * target


@pytest.mark.skipif(importlib.util.find_spec("ffcv") is None,
                    reason="FFCV is not installed here (see benchmarks/_ffcv.py)")
def test_ffcv_pixel_count_equals_what_ffcv_stores(mixed_root):
    from ffcv.fields.rgb_image import resizer

    sizes = _ffcv.image_sizes(str(mixed_root))
    for resolution in (128, 256, 512):
        stored = [resizer(np.zeros((h, w, 3), np.uint8), resolution).shape[:2] for w, h in sizes]
        assert sum(h * w for h, w in stored) == _ffcv.ffcv_pixels(sizes, resolution)
