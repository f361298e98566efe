"""WebDataset tar shards (``xxx.jpg`` + ``xxx.cls``) of photo-like JPEGs, read in place: fastpipe's
``TarDataset`` against the webdataset package + torchvision and DALI's ``fn.readers.webdataset``
(CPU mode), every pipeline a train RandomResizedCrop to 224 with a flip, uint8 batches of 64,
2 workers (processes or threads; DALI: 2 CPU threads).

Each row runs in its own process, in interleaved rounds (``_harness.run_rounds``); the ratio is
to DALI's median. The shards sit in the page cache.

    python -m benchmarks.bench_webdataset [--quick] [--images N] [--repeat R] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import _harness

ROWS = {
    "webdataset + torchvision v2, 2 processes":
        "wds.WebDataset(shards).decode() of torchvision.io.decode_jpeg, v2.RandomResizedCrop + "
        "RandomHorizontalFlip, DataLoader(num_workers=2)",
    "DALI fn.readers.webdataset, CPU":
        "fn.readers.webdataset(ext=['jpg', 'cls']) -> decoders.image_random_crop(device='cpu') "
        "-> resize -> flip, num_threads=2, random_shuffle",
    "fastpipe TarDataset + DataLoaderX, 2 processes":
        "TarDataset(shards, fields=['jpg', 'cls'], recipe=Recipe(size=224)), fast_collate, "
        "shuffle",
    "fastpipe TarDataset + DataLoaderX, 2 threads": "the same, worker_method='thread'",
}
BASE = "DALI fn.readers.webdataset, CPU"


def write_shards(root: Path, folder: Path, per_shard: int) -> list[Path]:
    """The photo set's files as WebDataset shards, labels as ``.cls`` text."""
    files = sorted(root.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in files})
    shards = []
    for start in range(0, len(files), per_shard):
        shards.append(folder / f"{len(shards):06d}.tar")
        with tarfile.open(shards[-1], "w") as tar:
            for k, path in enumerate(files[start:start + per_shard], start):
                for name, data in ((f"{k:07d}.jpg", path.read_bytes()),
                                   (f"{k:07d}.cls", b"%d" % classes.index(path.parent.name))):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return shards


def _webdataset(cfg: Any):
    import torch
    import webdataset as wds
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2

    crop = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])

    def sample(item):
        data, label = item
        image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                            mode=ImageReadMode.RGB)
        return crop(image), int(label)

    dataset = (wds.WebDataset(cfg.shards, shardshuffle=len(cfg.shards), empty_check=False)
               .shuffle(256).to_tuple("jpg", "cls").map(sample))
    loader = torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, num_workers=2)

    def epochs():
        for _ in range(cfg.epochs):
            for images, _ in loader:
                yield images

    return epochs()


def _dali(cfg: Any):
    if importlib.util.find_spec("nvidia.dali") is None:
        raise _harness.Skip("nvidia-dali is not installed")
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=cfg.batch_size, num_threads=2, device_id=None, seed=0)
    def pipe():
        jpegs, labels = fn.readers.webdataset(paths=cfg.shards, ext=["jpg", "cls"],
                                              random_shuffle=True, name="reader",
                                              missing_component_behavior="error")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return fn.transpose(images, perm=[2, 0, 1]), labels

    built = pipe()
    built.build()
    steps = -(-cfg.images // cfg.batch_size)

    def epochs():
        import numpy as np

        for _ in range(cfg.epochs * steps):
            images, _ = built.run()
            yield np.stack([np.asarray(images[k]) for k in range(len(images))])

    return epochs()


def _fastpipe(cfg: Any, threads: bool):
    from fastpipe import DataLoaderX, Recipe
    from fastpipe.data import TarDataset, fast_collate

    dataset = TarDataset(cfg.shards, fields=["jpg", "cls"], recipe=Recipe(size=224))
    loader = DataLoaderX(dataset, batch_size=cfg.batch_size, shuffle=True, num_workers=2,
                         collate_fn=fast_collate,
                         worker_method="thread" if threads else "process")

    def epochs():
        for _ in range(cfg.epochs):
            for images, _ in loader:
                yield images

    return epochs()


def measure(name: str, cfg: Any) -> dict[str, Any]:
    if name.startswith("webdataset"):
        batches = _webdataset(cfg)
    elif name.startswith("DALI"):
        batches = _dali(cfg)
    else:
        batches = _fastpipe(cfg, threads="threads" in name)
    return _harness.time_batches(batches, warmup=cfg.warmup)


def optional(name: str) -> bool:
    return name.startswith(("DALI", "webdataset"))


def main(argv: list[str] | None = None) -> int:
    from benchmarks._photos import photo_set

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_webdataset",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--per-shard", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    _harness.add_arguments(parser, repeat=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.per_shard, args.epochs = 128, 64, 1
    rounds = _harness.rounds_of(args, 3)
    names = _harness.select(ROWS, args.only)
    root = photo_set("imagenet", args.images)
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-wds-") as folder:
        shards = write_shards(root, Path(folder), args.per_shard)
        config = {"shards": [str(s) for s in shards], "images": args.images,
                  "batch_size": args.batch_size, "epochs": args.epochs,
                  "warmup": 1 if args.quick else 3}
        runs = _harness.run_rounds("bench_webdataset", names, config, rounds,
                                   baseline=args.baseline)
    lines = [f"{args.images} ImageNet-like photos in {len(shards)} WebDataset shards, train crop "
             f"to 224 + flip, batch {args.batch_size}, {rounds} interleaved rounds (median, "
             f"min-max), each row in its own process. Machine: {_harness.machine()}.", "",
             *_harness.rate_table(names, runs, ROWS, unit="images/s", per="image",
                                  versus="DALI CPU", base=_harness.median_rate(runs, BASE))]
    if args.baseline is not None:
        lines += ["", *_harness.before_after(names, runs)]
    _harness.finish("\n".join(lines), args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
