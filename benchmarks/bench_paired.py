"""Super-resolution patch pairs: fastpipe's joint crop (PairedFolders on PNG folders, H5Dataset
on a pack of the same PNG bytes, and on a pack of their seekable rewrites) against a hand-written
BasicSR-style DataLoader + PIL pipeline.

Every pipeline: HR PNGs of 512-1,024 px with photo-like texture, LR = the HR reduced 2x (PIL's
box ``reduce``), one random 48 px LR patch and the 96 px HR patch at the matching position per
sample, random hflip, vflip and rot90, uint8 tensors, batch 16, 2 workers. Each row runs in its
own process, in interleaved rounds (``_harness.run_rounds``); the ratio is to the DataLoader +
PIL row's median.

    python -m benchmarks.bench_paired [--quick] [--images N] [--repeat R] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import _harness

ROWS = {
    "DataLoader + PIL (BasicSR-style), 2 processes":
        "a Dataset opening both PNGs with PIL, np.asarray, paired random crop, hflip/vflip/"
        "rot90 on the arrays, torch.from_numpy; DataLoader(num_workers=2, shuffle=True)",
    "fastpipe PairedFolders + DataLoaderX, 2 processes":
        "PairedFolders({'lr', 'hr'}, joint=JointCrop(48, vflip=0.5, rot90=True, "
        "factors={'hr': 2})), fast_collate",
    "fastpipe PairedFolders + DataLoaderX, 2 threads": "the same, worker_method='thread'",
    "fastpipe H5Dataset (PNG bytes pack) + DataLoaderX, 2 processes":
        "pack(PairedFolders(...).pack_source()) -> H5Dataset(pack, joint=the same JointCrop)",
    "fastpipe H5Dataset (PNG bytes pack) + DataLoaderX, 2 threads":
        "the same, worker_method='thread'",
    "fastpipe H5Dataset (seekable PNG pack) + DataLoaderX, 2 processes":
        "pack(..., transcode=True): the same pixels, PNGs rewritten in segments of rows "
        "that inflate on their own",
    "fastpipe H5Dataset (seekable PNG pack) + DataLoaderX, 2 threads":
        "the same, worker_method='thread'",
}
BASE = "DataLoader + PIL (BasicSR-style), 2 processes"
PATCH = 48
SCALE = 2
TEMPLATE = "{}x" + str(SCALE)  # DIV2K's LR names: 0001x2.png


def write_pairs(folder: Path, count: int, seed: int = 0) -> tuple[Path, Path]:
    """HR PNGs (photo-like, 512-1,024 px, even sides) and their 2x box reductions."""
    import numpy as np
    from PIL import Image

    from benchmarks._photos import _field

    rng = np.random.default_rng(seed)
    hr_dir, lr_dir = folder / "HR", folder / "LR_x2"
    hr_dir.mkdir()
    lr_dir.mkdir()
    for i in range(count):
        height, width = (int(rng.integers(256, 513)) * 2 for _ in range(2))
        luma = 0.55 * _field(rng, height, width, 1.0)
        edges = (_field(rng, height, width, 1.8) > rng.uniform(-0.5, 0.5)).astype(np.float32)
        luma = 118 + 52 * (luma + 0.9 * (edges - edges.mean()))
        luma += rng.normal(0.0, 2.0, (height, width))
        chroma = [14 * _field(rng, height, width, 1.6) for _ in range(2)]
        rgb = np.stack([luma + 1.4 * chroma[0], luma - 0.35 * chroma[1] - 0.7 * chroma[0],
                        luma + 1.8 * chroma[1]], axis=-1)
        image = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")
        image.save(hr_dir / f"{i:04d}.png")
        image.reduce(SCALE).save(lr_dir / f"{i:04d}x{SCALE}.png")
    return lr_dir, hr_dir


class BasicSRPairs:
    """The hand-written baseline: what BasicSR's PairedImageDataset does, in uint8."""

    def __init__(self, lr_dir: str, hr_dir: str) -> None:
        self.hr = sorted(Path(hr_dir).glob("*.png"))
        self.lr = [Path(lr_dir) / f"{p.stem}x{SCALE}.png" for p in self.hr]

    def __len__(self) -> int:
        return len(self.hr)

    def __getitem__(self, index: int) -> dict[str, Any]:
        import random

        import numpy as np
        import torch
        from PIL import Image

        with Image.open(self.hr[index]) as f:
            hr = np.asarray(f.convert("RGB"))
        with Image.open(self.lr[index]) as f:
            lr = np.asarray(f.convert("RGB"))
        top = random.randint(0, lr.shape[0] - PATCH)
        left = random.randint(0, lr.shape[1] - PATCH)
        lr = lr[top:top + PATCH, left:left + PATCH]
        hr = hr[top * SCALE:(top + PATCH) * SCALE, left * SCALE:(left + PATCH) * SCALE]
        hflip, vflip, rot = (random.random() < 0.5 for _ in range(3))

        def augment(a):
            if hflip:
                a = a[:, ::-1]
            if vflip:
                a = a[::-1]
            if rot:
                a = a.transpose(1, 0, 2)
            return torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1)

        return {"lr": augment(lr), "hr": augment(hr)}


def _epochs(loader: Any, cfg: Any):
    for _ in range(cfg.epochs):
        for batch in loader:
            if batch["lr"].shape[-1] * SCALE != batch["hr"].shape[-1]:
                raise AssertionError("unpaired batch")
            yield batch["hr"]


def measure(name: str, cfg: Any) -> dict[str, Any]:
    import torch

    if name == BASE:
        loader = torch.utils.data.DataLoader(BasicSRPairs(cfg.lr, cfg.hr),
                                             batch_size=cfg.batch_size, shuffle=True,
                                             num_workers=2)
    else:
        from fastpipe import DataLoaderX
        from fastpipe.data import H5Dataset, JointCrop, PairedFolders, fast_collate

        crop = JointCrop(PATCH, hflip=0.5, vflip=0.5, rot90=True, factors={"hr": SCALE})
        if "H5Dataset" in name:
            dataset = H5Dataset(cfg.seekable if "seekable" in name else cfg.pack, joint=crop,
                                seed=0)
        else:
            dataset = PairedFolders({"lr": cfg.lr, "hr": cfg.hr}, joint=crop, seed=0,
                                    templates={"lr": TEMPLATE})
        loader = DataLoaderX(dataset, batch_size=cfg.batch_size, shuffle=True, num_workers=2,
                             collate_fn=fast_collate,
                             worker_method="thread" if "threads" in name else "process")
    return _harness.time_batches(_epochs(loader, cfg), warmup=cfg.warmup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_paired",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    _harness.add_arguments(parser, repeat=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.epochs = 48, 1
    rounds = _harness.rounds_of(args, 3)
    names = _harness.select(ROWS, args.only)
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-paired-") as folder:
        from fastpipe.data import PairedFolders
        from fastpipe.pack import pack

        lr, hr = write_pairs(Path(folder), args.images)
        packed, seekable = Path(folder) / "pairs.h5", Path(folder) / "seekable.h5"
        source = PairedFolders({"lr": lr, "hr": hr}, templates={"lr": TEMPLATE}).pack_source()
        pack(source, packed, progress=False)
        pack(source, seekable, progress=False, transcode=True, num_workers=2)
        config = {"lr": str(lr), "hr": str(hr), "pack": str(packed), "seekable": str(seekable),
                  "batch_size": args.batch_size, "epochs": args.epochs,
                  "warmup": 1 if args.quick else 3}
        runs = _harness.run_rounds("bench_paired", names, config, rounds,
                                   baseline=args.baseline, unit="pairs/s")
    lines = [f"{args.images} HR PNGs of 512-1,024 px (photo-like texture) + LR x{SCALE}, "
             f"patches LR {PATCH} px / HR {PATCH * SCALE} px with hflip, vflip, rot90, batch "
             f"{args.batch_size}, {rounds} interleaved rounds (median, min-max), each row in its "
             f"own process; files in the page cache. Machine: {_harness.machine()}.", "",
             *_harness.rate_table(names, runs, ROWS, unit="pairs/s", per="pair",
                                  versus="DataLoader + PIL", base=_harness.median_rate(runs, BASE))]
    if args.baseline is not None:
        lines += ["", *_harness.before_after(names, runs)]
    _harness.finish("\n".join(lines), args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
