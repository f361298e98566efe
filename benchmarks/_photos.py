"""Benchmark image sets that behave like real photographs, generated on demand and cached.

The built-in sample set (``fastpipe.data.sample_images``) is smooth: soft shapes and mild texture,
~1.3 bits per pixel at quality 90. Decode cost grows with the entropy of the coefficients, so
real photographs (ImageNet averages ~4 bits per pixel) decode slower per pixel. These sets add:

- texture with a natural-image spectrum (amplitude ~ 1/f, summed over octaves, with edges);
- a size mix like ImageNet's (mostly 500x375 / 375x500 / 500x333, ~8% larger photos of
  800-1600 px), or the "photos" set at 1-2k px;
- quality 75-95; chroma 4:2:0 mostly, some 4:2:2 and 4:4:4; ~3% progressive and ~2% greyscale
  files (as ImageNet has a few of each).

    python -m benchmarks._photos imagenet 1024 /tmp/imagenet-like     # write a set, describe it
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

_VERSION = 1
_MARKER = ".fastpipe-photos.json"
KINDS = ("imagenet", "photos")


def photo_set(kind: str, num_images: int, root: str | os.PathLike | None = None,
              num_classes: int = 4, seed: int = 0) -> Path:
    """An ImageFolder tree of ``num_images`` photo-like JPEGs of ``kind`` ("imagenet" or "photos").

    The same arguments give the same bytes; without ``root`` the set is cached under
    ``$FASTPIPE_CACHE`` (default ``~/.cache/fastpipe``). Written to a temporary folder and renamed
    when complete.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    params = {"version": _VERSION, "kind": kind, "num_images": num_images,
              "num_classes": num_classes, "seed": seed}
    if root is None:
        cache = Path(os.environ.get("FASTPIPE_CACHE", Path.home() / ".cache" / "fastpipe"))
        root = cache / f"photos-v{_VERSION}-{kind}-n{num_images}-c{num_classes}-s{seed}"
    root = Path(root)
    marker = root / _MARKER
    if marker.is_file() and json.loads(marker.read_text()) == params:
        return root
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} exists and holds something else; pass an empty or new root")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        for k in range(num_classes):
            (staging / f"class_{k:02d}").mkdir()
        for i in range(num_images):
            rng = np.random.default_rng([seed, i, KINDS.index(kind)])
            image, options = _photo(rng, kind)
            image.save(staging / f"class_{i % num_classes:02d}" / f"img_{i:05d}.jpg", **options)
        (staging / _MARKER).write_text(json.dumps(params))
        if root.exists():
            root.rmdir()
        os.replace(staging, root)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return root


def _size(rng: np.random.Generator, kind: str) -> tuple[int, int]:
    if kind == "photos":
        long_side = int(rng.integers(1000, 2049))
        aspect = float(rng.choice([4 / 3, 3 / 2, 16 / 9]))
    elif rng.random() < 0.08:
        long_side = int(rng.integers(800, 1601))
        aspect = float(rng.choice([4 / 3, 3 / 2]))
    else:
        long_side = 500
        aspect = float(rng.choice([4 / 3, 4 / 3, 4 / 3, 3 / 2, 1.0, 5 / 4]))
    short_side = max(64, round(long_side / aspect))
    return (long_side, short_side) if rng.random() < 0.75 else (short_side, long_side)


def _field(rng: np.random.Generator, height: int, width: int, slope: float) -> np.ndarray:
    """Zero-mean noise with amplitude spectrum ~ 1/f**slope, scaled to unit standard deviation."""
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    radius = np.sqrt(fx * fx + fy * fy)
    radius[0, 0] = 1.0
    spectrum = (rng.normal(size=radius.shape) + 1j * rng.normal(size=radius.shape)) / radius**slope
    spectrum[0, 0] = 0.0
    field = np.fft.irfft2(spectrum, s=(height, width))
    return (field / (field.std() + 1e-12)).astype(np.float32)


def texture(rng: np.random.Generator, width: int, height: int):
    """A photo-like RGB PIL image of ``width`` x ``height``: the pixels of photo_set's files."""
    from PIL import Image

    # Luminance: a natural spectrum (slope ~1) plus hard edges from thresholded smooth fields,
    # as objects against a background; colour: smoother chroma fields, as in photographs.
    luma = 0.55 * _field(rng, height, width, 1.0)
    edges = (_field(rng, height, width, 1.8) > rng.uniform(-0.5, 0.5)).astype(np.float32)
    luma += 0.9 * (edges - edges.mean())
    luma = 118 + 52 * luma + rng.normal(0.0, rng.uniform(1.5, 4.0), (height, width))
    chroma = [14 * _field(rng, height, width, 1.6) for _ in range(2)]
    rgb = np.stack([luma + 1.4 * chroma[0], luma - 0.35 * chroma[1] - 0.7 * chroma[0],
                    luma + 1.8 * chroma[1]], axis=-1)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")


def _photo(rng: np.random.Generator, kind: str):
    image = texture(rng, *_size(rng, kind))
    options: dict = {"quality": int(rng.integers(75, 96))}
    draw = rng.random()
    if draw < 0.02:
        image = image.convert("L")
    else:
        options["subsampling"] = 0 if draw < 0.07 else (1 if draw < 0.17 else 2)
    if rng.random() < 0.03:
        options["progressive"] = True
    return image, options


def describe(root: Path) -> str:
    from PIL import Image

    files = sorted(root.rglob("*.jpg"))
    pixels = sizes = progressive = grey = large = 0
    for path in files:
        with Image.open(path) as image:
            pixels += image.width * image.height
            progressive += bool(image.info.get("progressive") or image.info.get("progression"))
            grey += image.mode == "L"
            large += max(image.size) >= 800
        sizes += path.stat().st_size
    return (f"{len(files)} files, {sizes / len(files) / 1e3:.0f} kB and "
            f"{pixels / len(files) / 1e3:.0f} kpx on average, {8 * sizes / pixels:.2f} bits/pixel, "
            f"{large} of >= 800 px, {progressive} progressive, {grey} greyscale")


if __name__ == "__main__":
    kind, count, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    print(describe(photo_set(kind, count, out)))
