"""Per-sample automatic augmentation on the CPU: fastpipe's fast path with ``auto_augment='ra'``
against torchvision.transforms.v2 with RandAugment and DALI CPU with its RandAugment.

Every pipeline does RandomResizedCrop 224 (scale 0.08-1, ratio 3/4-4/3) + horizontal flip +
RandAugment (2 ops, magnitude 9) and gives uint8 (N, 3, 224, 224) batches of 64, with 2 workers
(DataLoader processes, or DALI threads); the same pipelines without RandAugment give the cost of
the policy itself on each path. Each measurement runs in a fresh process, in interleaved rounds
(``_harness.py``); reported: the median (and min-max) images/s, and the CPU ms/image (user +
system time of the process and its workers over the whole run, warm-up included, per image).

    python -m benchmarks.bench_augment                  # 3 rounds
    python -m benchmarks.bench_augment --quick          # 1 round, small dataset
    python -m benchmarks.bench_augment --markdown out.md

Compare ratios within one run only; absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from benchmarks import _harness

# ---------------------------------------------------------------- pipelines
# Each builder takes the row's configuration (root, size, batch_size, workers, epochs) and the
# policy (None: no policy) and returns uint8 batches. Only fastpipe's public API: a --baseline
# run calls them with another checkout's fastpipe.


def _decode_jpeg_file(path: str):
    import torchvision.io

    return torchvision.io.decode_jpeg(torchvision.io.read_file(path))


def _torch_loader(dataset, cfg, collate_fn=None):
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    sampler = RandomSampler(dataset, num_samples=len(dataset) * cfg.epochs,
                            generator=torch.Generator().manual_seed(0))
    return DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                      num_workers=cfg.workers, collate_fn=collate_fn)


def fastpipe_path(cfg, policy: str | None) -> Iterable:
    from fastpipe.data import ImageFolder, fast_collate

    dataset = ImageFolder(cfg.root, train=True, size=cfg.size, auto_augment=policy, seed=0)
    return (images for images, _ in _torch_loader(dataset, cfg, fast_collate))


def torchvision_v2(cfg, policy: str | None) -> Iterable:
    import torchvision.datasets
    from torchvision.transforms import v2

    ops = [v2.RandomResizedCrop(cfg.size, antialias=True), v2.RandomHorizontalFlip()]
    if policy:
        ops.append(v2.RandAugment())
    dataset = torchvision.datasets.ImageFolder(cfg.root, transform=v2.Compose(ops),
                                               loader=_decode_jpeg_file)
    return (images for images, _ in _torch_loader(dataset, cfg))


def dali_cpu(cfg, policy: str | None) -> Iterable:
    import torch
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import rand_augment

    @pipeline_def(enable_conditionals=True)
    def graph():
        encoded, labels = fn.readers.file(file_root=cfg.root, random_shuffle=True, seed=0,
                                          name="reader")
        images = fn.decoders.image(encoded, device="cpu", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=[cfg.size, cfg.size],
                                        random_area=[0.08, 1.0],
                                        random_aspect_ratio=[3 / 4, 4 / 3], antialias=True)
        if policy:
            images = rand_augment.rand_augment(images, n=2, m=9)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    pipe = graph(batch_size=cfg.batch_size, num_threads=cfg.workers, device_id=None, seed=0,
                 prefetch_queue_depth=2)
    pipe.build()
    per_epoch = pipe.epoch_size("reader") // cfg.batch_size

    def batches():
        for _ in range(cfg.epochs * per_epoch):
            images, _ = pipe.run()
            yield torch.from_numpy(images.as_array())

    return batches()


PIPELINES = {
    "fastpipe, auto_augment='ra'": (fastpipe_path, "ra"),
    "torchvision v2 + RandAugment": (torchvision_v2, "ra"),
    "DALI CPU + auto_aug.rand_augment": (dali_cpu, "ra"),
    "fastpipe, no policy": (fastpipe_path, None),
    "torchvision v2, no policy": (torchvision_v2, None),
    "DALI CPU, no policy": (dali_cpu, None),
}
# Each row's path (the first word of its name): how it runs, and its row without a policy.
HOW = {
    "fastpipe": "ImageFolder(train=True, size=224, auto_augment=...), DataLoader + fast_collate",
    "torchvision": "ImageFolder(loader=decode_jpeg), v2 RandomResizedCrop + flip (+ RandAugment)",
    "DALI": "fn.readers.file, decoders.image(cpu), random_resized_crop (+ rand_augment n=2 m=9), "
            "crop_mirror_normalize(uint8, CHW, mirror)",
}
PLAIN = {"fastpipe": "fastpipe, no policy", "torchvision": "torchvision v2, no policy",
         "DALI": "DALI CPU, no policy"}


def _path(name: str) -> str:
    return name.split(",")[0].split(" ")[0]


def optional(name: str) -> bool:
    """DALI is an optional part: its rows' failure is a note in the table."""
    return _path(name) == "DALI"


def measure(name: str, cfg) -> dict[str, float]:
    """One row, in this fresh process."""
    import torch

    torch.set_num_threads(1)
    builder, policy = PIPELINES[name]

    def check(images) -> None:
        if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, cfg.size, cfg.size):
            raise AssertionError(f"{name}: got {images.dtype} {tuple(images.shape)}")

    return _harness.time_batches(builder(cfg, policy), cfg.warmup, check)


# ---------------------------------------------------------------- the run (the parent)

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_augment",
                                     description=__doc__.split("\n\n")[0])
    _harness.add_arguments(parser, repeat=3)
    parser.add_argument("--images", type=int, default=None,
                        help="sample images (default 512, quick 256)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs per measurement (default 2, quick 1)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=2, help="batches not timed (default 2)")
    parser.add_argument("--root", default=None, help="an ImageFolder tree instead of the sample")
    args = parser.parse_args(argv)
    _harness.check_baseline(parser, args.baseline)
    args.epochs = args.epochs or (1 if args.quick else 2)
    args.repeat = _harness.rounds_of(args, 3)
    images = args.images or (256 if args.quick else 512)
    root = args.root
    if root is None:
        from fastpipe.data import sample_images

        root = str(sample_images(num_images=images))
    names = _harness.select(PIPELINES, args.only)
    config = {"root": root, "epochs": args.epochs, "workers": args.workers,
              "batch_size": args.batch_size, "size": args.size, "warmup": args.warmup}
    runs = _harness.run_rounds("bench_augment", names, config, args.repeat,
                               baseline=args.baseline)
    table = _table(names, runs, args)
    source = f"{images} sample JPEGs (~500x400)" if args.root is None else args.root
    lines = [f"Machine: {_harness.machine()}.", "",
             f"{source}, {args.workers} workers, batch {args.batch_size}, {args.size}x{args.size} "
             f"uint8 out, median (and min-max) of {args.repeat} round(s) of {args.epochs} "
             "epoch(s), each in a fresh process.", "", table.markdown(), ""]
    if args.baseline:
        lines += [f"Before and after: this checkout against "
                  f"{_harness.describe_checkout(args.baseline.resolve())}.", "",
                  *_harness.before_after(names, runs), ""]
    _harness.finish("\n".join(lines), args, runs)
    return 0


def _table(names: list[str], runs: _harness.Runs, args):
    from fastpipe.profiling._table import Column, ResultTable

    rows = _harness.rows(names, runs,
                         baseline_label=f"the row above, with the fastpipe of {args.baseline}")
    cpu = {r.key: r.extra.get("cpu_ms") for r in rows}

    def policy_cost(row) -> str:
        # The row's CPU less that of the same path without a policy, measured with the same
        # fastpipe (a baseline row against the baseline's).
        name = row.key.removesuffix(_harness.BASELINE_SUFFIX)
        plain = PLAIN[_path(name)] + row.key[len(name):]
        if PIPELINES[name][1] is None or cpu.get(row.key) is None or cpu.get(plain) is None:
            return "-"
        return f"{cpu[row.key] - cpu[plain]:.2f}"

    return ResultTable(rows, unit="images/s", name_header="pipeline", after=[
        _harness.cpu_column(), Column("policy's CPU ms/image", policy_cost),
        Column("how", lambda r: r.description or HOW[_path(r.key)], "<")])


if __name__ == "__main__":
    sys.exit(main())
