"""Segmentation pairs (image + mask, one random crop and flip on both): fastpipe's joint crop
(PairedFolders on the two folders, H5Dataset on a pack of the same bytes) against torchvision v2.

The data behave like VOC / ADE20K: JPEG photos of 375-683 px sides (photo-like texture of
benchmarks/_photos.py, quality 90, 4:2:0) and their masks as 8-bit palette PNGs (21 classes as
smooth blobs, 255 on a band along every boundary, as VOC's void label), images/xxx.jpg beside
masks/xxx.png. Every row: a random 320x320 crop (no resize, no padding: every side is >= 375) and
a random hflip on both, uint8 out (no normalize), batch 16, 2 workers, shuffled; its first batch is
checked (image (N, 3, 320, 320) uint8, mask uint8 with values of the masks' set only). Each row
runs in its own process, in interleaved rounds (``_harness.run_rounds``); the ratio is to the
faster torchvision row's median.

    python -m benchmarks.bench_segmentation [--quick] [--images N] [--repeat R] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import _harness

TORCHVISION_PIL = "DataLoader + torchvision v2 (PIL decode), 2 processes"
TORCHVISION_IO = "DataLoader + torchvision v2 (torchvision.io decode), 2 processes"
ROWS = {
    TORCHVISION_PIL:
        "PIL open + convert('RGB') / the P-mode mask, as torchvision's reference segmentation "
        "scripts read VOC; tv_tensors.Image + tv_tensors.Mask; v2.Compose([RandomCrop(320), "
        "RandomHorizontalFlip(0.5), ToPureTensor()]); DataLoader(num_workers=2, shuffle=True)",
    TORCHVISION_IO: "the same, decoded by torchvision.io.decode_jpeg and decode_png(UNCHANGED)",
    "fastpipe PairedFolders + DataLoaderX, 2 processes":
        "PairedFolders({'image', 'mask'}, joint=JointCrop(320, hflip=0.5, "
        "interpolation={'mask': 'nearest'})), fast_collate",
    "fastpipe PairedFolders + DataLoaderX, 2 threads": "the same, worker_method='thread'",
    "fastpipe H5Dataset (stored bytes pack) + DataLoaderX, 2 threads":
        "pack(PairedFolders(...).pack_source()) -> H5Dataset(pack, joint=the same JointCrop), "
        "worker_method='thread'",
}
CROP = 320
CLASSES = 21
VOID = 255
# Any colours will do (the masks are read as indices); VOC's void label is cream.
PALETTE = [(i * c) % 256 for i in range(256) for c in (37, 91, 157)]
PALETTE[3 * VOID:3 * VOID + 3] = [224, 224, 192]


def write_pairs(folder: Path, count: int, seed: int = 0) -> tuple[Path, Path]:
    """``count`` JPEG photos (375-683 px sides) and their palette PNG masks."""
    import numpy as np
    from PIL import Image

    from benchmarks._photos import _field, texture

    images, masks = folder / "images", folder / "masks"
    images.mkdir()
    masks.mkdir()
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        height, width = (int(rng.integers(375, 684)) for _ in range(2))
        texture(rng, width, height).save(images / f"{i:06d}.jpg", quality=90, subsampling=2)
        # 1-4 objects, each a very smooth field above a threshold: blobs with smooth outlines.
        labels = np.zeros((height, width), np.uint8)
        for label in rng.choice(np.arange(1, CLASSES), int(rng.integers(1, 5)), replace=False):
            labels[_field(rng, height, width, 3.0) > rng.uniform(0.8, 1.6)] = label
        void = np.zeros(labels.shape, bool)  # a ~4 px band along every boundary
        for s in (1, 2):
            rows, cols = labels[s:] != labels[:-s], labels[:, s:] != labels[:, :-s]
            void[s:] |= rows
            void[:-s] |= rows
            void[:, s:] |= cols
            void[:, :-s] |= cols
        labels[void] = VOID
        mask = Image.fromarray(labels, "P")
        mask.putpalette(PALETTE)
        mask.save(masks / f"{i:06d}.png")
    return images, masks


class TorchvisionPairs:
    """The baseline Dataset: both files decoded whole, then torchvision v2's joint transforms."""

    def __init__(self, images: str, masks: str, pil: bool) -> None:
        from torchvision.transforms import v2

        self.images = sorted(Path(images).glob("*.jpg"))
        self.masks = [Path(masks) / f"{p.stem}.png" for p in self.images]
        self.pil = pil
        self.transforms = v2.Compose([v2.RandomCrop(CROP), v2.RandomHorizontalFlip(0.5),
                                      v2.ToPureTensor()])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Any:
        from torchvision import io, tv_tensors
        from torchvision.transforms.v2.functional import pil_to_tensor

        if self.pil:
            from PIL import Image

            with Image.open(self.images[index]) as f:
                image = pil_to_tensor(f.convert("RGB"))
            with Image.open(self.masks[index]) as f:
                mask = pil_to_tensor(f)
        else:
            image = io.decode_jpeg(io.read_file(str(self.images[index])))
            mask = io.decode_png(io.read_file(str(self.masks[index])), io.ImageReadMode.UNCHANGED)
        return self.transforms(tv_tensors.Image(image), tv_tensors.Mask(mask[0]))


def _check(image: Any, mask: Any) -> None:
    """A broken row must not look fast: the shapes, dtypes and the mask's value set."""
    import torch

    if mask.dim() == 4 and mask.shape[1] == 1:
        mask = mask[:, 0]
    n = image.shape[0]
    if image.dtype != torch.uint8 or tuple(image.shape) != (n, 3, CROP, CROP):
        raise AssertionError(f"image batch {image.dtype} {tuple(image.shape)}, expected uint8 "
                             f"({n}, 3, {CROP}, {CROP})")
    if mask.dtype != torch.uint8 or tuple(mask.shape) != (n, CROP, CROP):
        raise AssertionError(f"mask batch {mask.dtype} {tuple(mask.shape)}, expected uint8 "
                             f"({n}, {CROP}, {CROP}) or ({n}, 1, {CROP}, {CROP})")
    values = set(mask.unique().tolist())
    if not values <= {*range(CLASSES), VOID} or len(values) < 3 or VOID not in values:
        raise AssertionError(f"mask values {sorted(values)}: not the masks' labels")
    if image[:, :, ::8, ::8].float().std() < 5:
        raise AssertionError("flat images")


def _epochs(loader: Any, epochs: int):
    for epoch in range(epochs):
        for i, batch in enumerate(loader):
            image, mask = (batch["image"], batch["mask"]) if isinstance(batch, dict) else batch
            if epoch == i == 0:
                _check(image, mask)
            yield image


def measure(name: str, cfg: Any) -> dict[str, Any]:
    import torch

    if name in (TORCHVISION_PIL, TORCHVISION_IO):
        dataset = TorchvisionPairs(cfg.images, cfg.masks, pil=name == TORCHVISION_PIL)
        loader = torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True,
                                             num_workers=2)
    else:
        from fastpipe import DataLoaderX
        from fastpipe.data import H5Dataset, JointCrop, PairedFolders, fast_collate

        crop = JointCrop(CROP, hflip=0.5, interpolation={"mask": "nearest"})
        if "H5Dataset" in name:
            dataset = H5Dataset(cfg.pack, joint=crop, seed=0)
        else:
            dataset = PairedFolders({"image": cfg.images, "mask": cfg.masks}, joint=crop, seed=0)
        loader = DataLoaderX(dataset, batch_size=cfg.batch_size, shuffle=True, num_workers=2,
                             collate_fn=fast_collate,
                             worker_method="thread" if "threads" in name else "process")
    return _harness.time_batches(_epochs(loader, cfg.epochs), warmup=cfg.warmup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_segmentation",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    _harness.add_arguments(parser, repeat=3)
    args = parser.parse_args(argv)
    _harness.check_baseline(parser, args.baseline)
    if args.quick:
        args.images, args.epochs = 48, 1
    rounds = _harness.rounds_of(args, 3)
    names = _harness.select(ROWS, args.only)
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-segmentation-") as folder:
        from fastpipe.data import PairedFolders
        from fastpipe.pack import pack

        images, masks = write_pairs(Path(folder), args.images)
        kb = [sum(f.stat().st_size for f in d.iterdir()) / args.images / 1e3
              for d in (images, masks)]
        packed = Path(folder) / "pairs.h5"
        pack(PairedFolders({"image": images, "mask": masks}).pack_source(), packed,
             progress=False)
        config = {"images": str(images), "masks": str(masks), "pack": str(packed),
                  "batch_size": args.batch_size, "epochs": args.epochs,
                  "warmup": 1 if args.quick else 3}
        runs = _harness.run_rounds("bench_segmentation", names, config, rounds,
                                   baseline=args.baseline, unit="samples/s",
                                   twin=lambda name: name.startswith("fastpipe"))
    peers = [_harness.median_rate(runs, n) for n in (TORCHVISION_PIL, TORCHVISION_IO)]
    best = max((rate for rate in peers if rate), default=None)
    lines = [f"{args.images} VOC/ADE20K-like pairs: JPEG photos of 375-683 px sides (photo-like, "
             f"quality 90, 4:2:0, {kb[0]:.0f} kB on average) + 8-bit palette PNG masks "
             f"({CLASSES} classes as smooth blobs, {VOID} boundary bands, {kb[1]:.1f} kB), random "
             f"{CROP}x{CROP} crop + hflip on both, uint8 out, batch {args.batch_size}, 2 workers, "
             f"{args.epochs} epochs, {rounds} interleaved rounds (median, min-max), each row in "
             f"its own process; files in the page cache. Machine: {_harness.machine()}.", "",
             *_harness.rate_table(names, runs, ROWS, unit="samples/s", per="sample",
                                  versus="best torchvision", base=best)]
    if args.baseline is not None:
        lines += ["", *_harness.before_after(names, runs, unit="samples/s")]
    _harness.finish("\n".join(lines), args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
