"""The built-in sample dataset: photo-like JPEGs in ImageFolder layout, generated on demand."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from fastpipe import _validate as check

_VERSION = 1
_MARKER = ".fastpipe-sample.json"


def default_cache_dir() -> Path:
    """Where generated data is cached: ``$FASTPIPE_CACHE``, else ``~/.cache/fastpipe``."""
    return Path(os.environ.get("FASTPIPE_CACHE", Path.home() / ".cache" / "fastpipe"))


def sample_images(
    root: str | os.PathLike | None = None,
    num_images: int = 256,
    num_classes: int = 4,
    seed: int = 0,
    quality: int = 90,
) -> Path:
    """Returns an ImageFolder tree of ``num_images`` photo-like JPEGs, generating it if needed.

    Images are procedural scenes (smooth lighting, soft-edged shapes, fine texture and sensor-like
    noise) of varied sizes around 500x400, so JPEG files and decode times resemble photos rather
    than noise or flat colour. Layout: ``root/class_KK/img_NNNNN.jpg`` with the images spread
    evenly over the classes; image ``i`` belongs to class ``i % num_classes``. The same arguments
    always give the same bytes.

    Without ``root`` the tree is cached under :func:`default_cache_dir`. Generation writes to a
    temporary folder and renames it when complete, so an interrupted run never leaves a partial
    dataset behind.
    """
    num_images = check.positive_int("num_images", num_images)
    num_classes = check.positive_int("num_classes", num_classes)
    seed = check.non_negative_int("seed", seed)
    quality = check.positive_int("quality", quality)
    if quality > 100:
        raise ValueError(f"quality is a JPEG quality in 1-100, got {quality}")
    params = {"version": _VERSION, "num_images": num_images, "num_classes": num_classes,
              "seed": seed, "quality": quality}
    if root is None:
        name = f"sample-v{_VERSION}-n{num_images}-c{num_classes}-s{seed}-q{quality}"
        root = default_cache_dir() / name
    root = Path(root)
    marker = root / _MARKER
    if marker.is_file():
        if json.loads(marker.read_text()) == params:
            return root
        raise ValueError(
            f"{root} holds a sample dataset made with other arguments ({marker.read_text()}); "
            "pass another root or delete it"
        )
    if root.exists() and any(root.iterdir()):
        raise ValueError(
            f"{root} exists and is not a fastpipe sample dataset; pass an empty or new root"
        )

    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        _generate(staging, num_images, num_classes, seed, quality)
        (staging / _MARKER).write_text(json.dumps(params))
        if root.exists():
            root.rmdir()
        try:
            os.replace(staging, root)
        except OSError:
            # Another process finished the same dataset first; theirs is identical.
            if not marker.is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return root


def _generate(root: Path, num_images: int, num_classes: int, seed: int, quality: int) -> None:
    for k in range(num_classes):
        (root / f"class_{k:02d}").mkdir()
    for i in range(num_images):
        image = _scene(np.random.default_rng([seed, i]), i % num_classes)
        image.save(root / f"class_{i % num_classes:02d}" / f"img_{i:05d}.jpg", quality=quality)


def _scene(rng: np.random.Generator, label: int):
    from PIL import Image, ImageDraw, ImageFilter

    width = int(rng.integers(420, 601))
    height = int(rng.integers(340, 481))
    # Each class leans towards its own hue, so a model can tell classes apart a little.
    tint = np.roll(np.array([1.15, 0.95, 0.85]), label)

    def smooth(h: int, w: int, channels: int) -> np.ndarray:
        small = rng.uniform(0, 255, (h, w, channels)).astype(np.uint8)
        mode = "RGB" if channels == 3 else "L"
        up = Image.fromarray(small.squeeze(), mode).resize((width, height), Image.BICUBIC)
        return np.asarray(up, dtype=np.float32).reshape(height, width, channels)

    light = smooth(int(rng.integers(2, 5)), int(rng.integers(2, 6)), 3) * tint
    light = 0.55 * light + 0.45 * light.mean(axis=2, keepdims=True)
    image = Image.fromarray(np.clip(light, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(6, 16))):
        x0, y0 = rng.uniform(-0.2, 1.0) * width, rng.uniform(-0.2, 1.0) * height
        x1 = x0 + rng.uniform(0.05, 0.5) * width
        y1 = y0 + rng.uniform(0.05, 0.5) * height
        colour = tuple(int(c) for c in np.clip(rng.uniform(0, 255, 3) * tint, 0, 255))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            points = [(float(rng.uniform(x0, x1)), float(rng.uniform(y0, y1))) for _ in range(5)]
            draw.polygon(points, fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.8, 2.0))))
    pixels = np.asarray(image, dtype=np.float32)
    # Texture at two scales (foliage, fabric) and per-pixel noise, as in a real photo.
    texture = smooth(height // 6, width // 6, 1) - 128.0
    fine = rng.normal(0.0, float(rng.uniform(3.0, 8.0)), (height, width, 1))
    pixels = pixels + 0.35 * texture + fine
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
