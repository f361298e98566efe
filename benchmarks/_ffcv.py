"""FFCV for ``bench_cpu_path.py``: write a ``.beton`` from an ImageFolder tree, and load it.

Runs only under an interpreter with FFCV installed, in a virtual environment of its own: FFCV
builds a C extension against the system's OpenCV and libjpeg-turbo and brings numba and
opencv-python, which fastpipe's environment need not carry. The commands that installed it on
Debian 12 with Python 3.11 (ffcv 1.0.2, numba 0.68.1, numpy 2.4.6, opencv-python 5.0.0.93):

    apt-get install -y libopencv-dev libturbojpeg0-dev pkg-config
    python3.11 -m venv /work/ffcv-venv
    /work/ffcv-venv/bin/pip install torch==2.13.0 pillow   # the CPU wheel; no torchvision needed
    /work/ffcv-venv/bin/pip install ffcv

Used as a script, it writes a ``.beton`` (one-time preparation, never timed) and prints what it
stored as JSON::

    /work/ffcv-venv/bin/python benchmarks/_ffcv.py write ROOT OUT.beton --max-resolution 256
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

EXTENSIONS = (".jpg", ".jpeg", ".JPG", ".JPEG")


class Folder:
    """The samples of an ImageFolder tree, as torchvision orders and labels them: sorted class
    folders, sorted files; ``(uint8 (H, W, 3) RGB array, int label)`` per index, as FFCV's
    writer wants (its examples pass torchvision's ImageFolder, which returns PIL RGB images)."""

    def __init__(self, root: str | Path) -> None:
        classes = sorted(p.name for p in Path(root).iterdir() if p.is_dir())
        self.samples = [(str(path), label) for label, name in enumerate(classes)
                        for path in sorted((Path(root) / name).rglob("*"))
                        if path.suffix in EXTENSIONS]
        if not self.samples:
            raise ValueError(f"no JPEG files in class folders under {root}")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        import numpy as np
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB")), label


def write_beton(root: str | Path, out: str | Path, max_resolution: int, quality: int = 90,
                num_workers: int = 2) -> dict:
    """Writes ``out`` with FFCV's ``DatasetWriter``: every image as a JPEG of ``quality`` whose
    longer side is at most ``max_resolution`` (FFCV resizes with OpenCV's INTER_AREA, then
    re-encodes every image, even one that was small enough). Returns what it stored."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.reader import Reader
    from ffcv.writer import DatasetWriter

    writer = DatasetWriter(str(out), {
        "image": RGBImageField(write_mode="jpg", max_resolution=max_resolution,
                               jpeg_quality=quality),
        "label": IntField(),
    }, num_workers=num_workers)
    writer.from_indexed_dataset(Folder(root))
    meta = Reader(str(out)).metadata["f0"]
    pixels = meta["height"].astype("int64") * meta["width"].astype("int64")
    return {"images": int(len(meta)), "mean_pixels": float(pixels.mean()),
            "max_side": int(max(meta["height"].max(), meta["width"].max())),
            "bytes": Path(out).stat().st_size}


def loader(beton: str | Path, cfg):
    """FFCV's ``Loader`` of float32 ``(N, 3, size, size)`` batches normalized with the ImageNet
    mean and std, built the way FFCV's ImageNet example builds its train loader, on the CPU:
    JPEG decode of the whole stored image, RandomResizedCrop + resize (OpenCV), flip, then
    FFCV's table-lookup ``NormalizeImage`` to float32 in its numba stage (on the CPU it works on
    the NHWC arrays, so it comes before ``ToTensor``), and ``ToTorchImage``, whose NCHW tensor is
    a channels-last view (as FFCV hands it to a model). ``num_workers`` numba threads run the
    stage; a background thread keeps ``batches_ahead`` (3) batches ready. Each batch is a view of
    one of a few buffers that later batches overwrite."""
    import numpy as np
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fastpipe import IMAGENET_MEAN, IMAGENET_STD

    mean = np.array(IMAGENET_MEAN) * 255
    std = np.array(IMAGENET_STD) * 255
    return Loader(str(beton), batch_size=cfg.batch_size, num_workers=cfg.workers,
                  order=OrderOption.RANDOM, os_cache=True, drop_last=False, pipelines={
                      "image": [RandomResizedCropRGBImageDecoder((cfg.size, cfg.size)),
                                RandomHorizontalFlip(),
                                NormalizeImage(mean, std, np.float32),
                                ToTensor(), ToTorchImage()],
                      "label": [IntDecoder(), ToTensor()],
                  })


def batches(ffcv_loader, epochs: int) -> Iterator:
    """The image batches of ``epochs`` epochs of ``ffcv_loader``."""
    for _ in range(epochs):
        for images, _labels in ffcv_loader:
            yield images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write an FFCV .beton from an ImageFolder tree")
    parser.add_argument("command", choices=["write"])
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--max-resolution", type=int, required=True)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(write_beton(args.root, args.out, args.max_resolution, args.quality,
                                 args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
