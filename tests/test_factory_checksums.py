"""``image_loader``'s CPU path gives, byte for byte, the batches it gave before the recipe moved
into one object (``fastpipe.Recipe``): checksums of every batch, stored in
``tests/stored/image_loader_checksums.json`` by the code of main before that change.

The inputs are the sample set's JPEGs (generated with PIL); their own checksums are stored too,
so a PIL whose encoder writes other bytes fails here with that reason, not with a pixel
mismatch. Regenerate (only for an intended change of the pixels, saying why in the commit)::

    python tests/test_factory_checksums.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

STORED = Path(__file__).parent / "stored" / "image_loader_checksums.json"

# name -> image_loader keyword arguments (uint8 pixels: integer decode and resize, the same on
# every CPU; the float outputs are checked against normalizing these below).
CONFIGS: dict[str, dict] = {
    "train-224": dict(train=True, size=224, seed=0),
    "eval-224": dict(train=False, size=224, seed=0),
    "train-160x224": dict(train=True, size=(160, 224), seed=1),
    "eval-160x224": dict(train=False, size=(160, 224), seed=1),
    "eval-224x160-bicubic": dict(train=False, size=(224, 160), interpolation="bicubic",
                                 crop_pct=0.95, seed=2),
    "train-options": dict(train=True, size=96, scale=(0.25, 1.0), ratio=(0.5, 2.0), hflip=1.0,
                          interpolation="bicubic", seed=3),
    "train-ra-processes": dict(train=True, size=64, auto_augment="ra", seed=4,
                               worker_method="process"),
    "train-rank1-of-2": dict(train=True, size=64, seed=5, rank=1, world_size=2, drop_last=True),
    "pack-train-ta_wide": dict(train=True, size=64, auto_augment="ta_wide", seed=6, pack=True),
    "pack-eval-112x80": dict(train=False, size=(112, 80), seed=7, pack=True),
}
EPOCHS = 2
BATCH_SIZE = 16


def _sample_root(base: Path) -> Path:
    from fastpipe.data import sample_images

    return sample_images(base / "images", num_images=48, num_classes=4)


def _file_checksums(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for p in sorted(root.rglob("*.jpg"))}


def _loader(root: Path, options: dict, **extra):
    from fastpipe import image_loader

    options = dict(options)
    if options.pop("pack", False):
        root = _packed(root)
    kwargs = dict(backend="cpu", device="cpu", num_workers=2, dtype=torch.uint8, mean=None,
                  std=None)
    kwargs.update(options)
    kwargs.update(extra)
    return image_loader(root, BATCH_SIZE, **kwargs)


def _packed(root: Path) -> Path:
    """The sample set as an HDF5 bytes pack beside it (made once)."""
    from fastpipe.pack import pack

    output = root.parent / "images.h5"
    if not output.exists():
        pack(root, output, progress=False)
    return output


def _batch_checksum(images: torch.Tensor, labels: torch.Tensor) -> str:
    digest = hashlib.sha256()
    digest.update(str((tuple(images.shape), str(images.dtype))).encode())
    digest.update(images.contiguous().numpy().tobytes())
    digest.update(labels.numpy().tobytes())
    return digest.hexdigest()[:16]


def _checksums(root: Path, options: dict) -> list[list[str]]:
    loader = _loader(root, options)
    try:
        return [[_batch_checksum(images, labels) for images, labels in loader]
                for _ in range(EPOCHS)]
    finally:
        loader.close()


@pytest.fixture(scope="module")
def stored() -> dict:
    return json.loads(STORED.read_text())


@pytest.fixture(scope="module")
def checksum_root(tmp_path_factory, stored) -> Path:
    root = _sample_root(tmp_path_factory.mktemp("checksums"))
    files = _file_checksums(root)
    if files != stored["files"]:
        changed = sorted(k for k in files if files[k] != stored["files"].get(k))
        pytest.fail(
            f"the sample set's JPEG bytes differ from those the checksums were made from "
            f"({len(changed)} files, e.g. {changed[:3]}): this PIL encodes differently. The "
            "pixel checksums below cannot be compared; regenerate them at a commit known to be "
            "right (python tests/test_factory_checksums.py --write)", pytrace=False)
    return root


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.slow
def test_cpu_batches_are_those_stored(checksum_root, stored, name, no_thread_leak):
    assert _checksums(checksum_root, CONFIGS[name]) == stored["batches"][name]


def test_float_batches_normalize_the_stored_pixels(checksum_root, no_thread_leak):
    from fastpipe import IMAGENET_MEAN, IMAGENET_STD
    from fastpipe.ops import normalize

    options = CONFIGS["train-224"]
    pixels = _loader(checksum_root, options)
    floats = _loader(checksum_root, options, dtype=torch.float16, mean=IMAGENET_MEAN,
                     std=IMAGENET_STD, channels_last=True)
    try:
        for (raw, labels), (images, float_labels) in zip(pixels, floats, strict=True):
            expected = normalize(raw, IMAGENET_MEAN, IMAGENET_STD, dtype=torch.float16,
                                 channels_last=True)
            assert torch.equal(images, expected) and torch.equal(labels, float_labels)
            assert images.is_contiguous(memory_format=torch.channels_last)
    finally:
        pixels.close()
        floats.close()


def _write() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as base:
        root = _sample_root(Path(base))
        data = {"files": _file_checksums(root),
                "batches": {name: _checksums(root, CONFIGS[name]) for name in sorted(CONFIGS)}}
    STORED.parent.mkdir(exist_ok=True)
    STORED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {STORED}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_factory_checksums.py --write")
    _write()
