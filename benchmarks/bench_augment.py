"""Per-sample automatic augmentation on the CPU: fastpipe's fast path with ``auto_augment='ra'``
against torchvision.transforms.v2 with RandAugment and DALI CPU with its RandAugment.

Every pipeline does RandomResizedCrop 224 (scale 0.08-1, ratio 3/4-4/3) + horizontal flip +
RandAugment (2 ops, magnitude 9) and gives uint8 (N, 3, 224, 224) batches of 64, with 2 workers
(DataLoader processes, or DALI threads); the same pipelines without RandAugment give the cost of
the policy itself on each path. Each measurement runs in a fresh interpreter (a subprocess), so
pipelines cannot distort one another; rounds are interleaved and the median reported, as images/s
and as CPU ms/image (user + system time of the process and its workers over the whole run,
start-up and warm-up included, per image).

    python benchmarks/bench_augment.py                  # 3 rounds
    python benchmarks/bench_augment.py --quick          # 1 round, small dataset
    python benchmarks/bench_augment.py --markdown out.md

Compare ratios within one run only; absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cpu_seconds() -> float:
    """User + system time of this process and of its joined children (DataLoader workers are
    joined when their iterator is exhausted)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# ---------------------------------------------------------------- pipelines (in the child)

def _decode_jpeg_file(path: str):
    import torchvision.io

    return torchvision.io.decode_jpeg(torchvision.io.read_file(path))


def _torch_loader(dataset, args, collate_fn=None):
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    sampler = RandomSampler(dataset, num_samples=len(dataset) * args.epochs,
                            generator=torch.Generator().manual_seed(0))
    return DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                      num_workers=args.workers, collate_fn=collate_fn)


def fastpipe_path(args, policy: str | None) -> Iterable:
    from fastpipe.data import ImageFolder, fast_collate

    dataset = ImageFolder(args.root, train=True, size=args.size, auto_augment=policy, seed=0)
    return (images for images, _ in _torch_loader(dataset, args, fast_collate))


def torchvision_v2(args, policy: str | None) -> Iterable:
    import torchvision.datasets
    from torchvision.transforms import v2

    ops = [v2.RandomResizedCrop(args.size, antialias=True), v2.RandomHorizontalFlip()]
    if policy:
        ops.append(v2.RandAugment())
    dataset = torchvision.datasets.ImageFolder(args.root, transform=v2.Compose(ops),
                                               loader=_decode_jpeg_file)
    return (images for images, _ in _torch_loader(dataset, args))


def dali_cpu(args, policy: str | None) -> Iterable:
    import torch
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import rand_augment

    @pipeline_def(enable_conditionals=True)
    def graph():
        encoded, labels = fn.readers.file(file_root=args.root, random_shuffle=True, seed=0,
                                          name="reader")
        images = fn.decoders.image(encoded, device="cpu", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=[args.size, args.size],
                                        random_area=[0.08, 1.0],
                                        random_aspect_ratio=[3 / 4, 4 / 3], antialias=True)
        if policy:
            images = rand_augment.rand_augment(images, n=2, m=9)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    pipe = graph(batch_size=args.batch_size, num_threads=args.workers, device_id=None, seed=0,
                 prefetch_queue_depth=2)
    pipe.build()
    per_epoch = pipe.epoch_size("reader") // args.batch_size

    def batches():
        for _ in range(args.epochs * per_epoch):
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
HOW = {
    "fastpipe": "ImageFolder(train=True, size=224, auto_augment=...), DataLoader + fast_collate",
    "torchvision": "ImageFolder(loader=decode_jpeg), v2 RandomResizedCrop + flip (+ RandAugment)",
    "DALI": "fn.readers.file, decoders.image(cpu), random_resized_crop (+ rand_augment n=2 m=9), "
            "crop_mirror_normalize(uint8, CHW, mirror)",
}


def child(args) -> None:
    """One measurement, printed as one JSON line."""
    import torch

    torch.set_num_threads(1)
    builder, policy = PIPELINES[args.child]
    batches = builder(args, policy)
    cpu_start = cpu_seconds()
    count, total, start = 0, 0, None
    for i, images in enumerate(batches):
        if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, args.size, args.size):
            raise AssertionError(f"{args.child}: got {images.dtype} {tuple(images.shape)}")
        total += images.shape[0]
        if i == args.warmup - 1:
            start = time.perf_counter()
        elif start is not None:
            count += images.shape[0]
    if start is None or count == 0:
        raise RuntimeError("too few batches to time: raise --images or --epochs")
    rate = count / (time.perf_counter() - start)
    del batches
    print(json.dumps({"rate": rate, "cpu_ms": (cpu_seconds() - cpu_start) / total * 1e3}))


# ---------------------------------------------------------------- orchestration

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round on 256 images")
    parser.add_argument("--images", type=int, default=None, help="sample images (default 512)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per measurement (2)")
    parser.add_argument("--repeat", type=int, default=None, help="rounds, median reported (3)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=2, help="batches not timed")
    parser.add_argument("--root", default=None, help="an ImageFolder tree instead of the sample")
    parser.add_argument("--only", nargs="*", default=None, help="pipelines whose name has a word")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.epochs = args.epochs or (1 if args.quick else 2)
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.child:
        child(args)
        return 0
    images = args.images or (256 if args.quick else 512)
    args.root_is_sample = args.root is None
    if args.root is None:
        from fastpipe.datasets import sample_images

        args.root = str(sample_images(num_images=images))
    names = [n for n in PIPELINES
             if not args.only or any(w.lower() in n.lower() for w in args.only)]
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    notes: dict[str, str] = {}
    common = ["--root", args.root, "--epochs", str(args.epochs), "--workers", str(args.workers),
              "--batch-size", str(args.batch_size), "--size", str(args.size),
              "--warmup", str(args.warmup)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for round_ in range(args.repeat):
        for name in names:
            if name in notes:
                continue
            done = subprocess.run([sys.executable, __file__, "--child", name, *common],
                                  capture_output=True, text=True, env=env, timeout=1800)
            if done.returncode != 0:
                notes[name] = done.stderr.strip().splitlines()[-1] if done.stderr else "failed"
                print(f"{name:36s} FAILED: {notes[name]}", flush=True)
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[name].append(result)
            print(f"[round {round_ + 1}/{args.repeat}] {name:36s} {result['rate']:7.1f} images/s "
                  f"{result['cpu_ms']:6.2f} CPU ms/image", flush=True)
    source = f"{images} sample JPEGs (~500x400)" if args.root_is_sample else args.root
    lines = [
        f"{source}, {args.workers} workers, batch "
        f"{args.batch_size}, {args.size}x{args.size} uint8 out, median of {args.repeat} round(s) "
        f"of {args.epochs} epoch(s), each in a fresh process.",
        "",
        "| pipeline | images/s | CPU ms/image | policy's CPU ms/image | how |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    medians = {n: (statistics.median(r["rate"] for r in rs),
                   statistics.median(r["cpu_ms"] for r in rs)) for n, rs in results.items() if rs}
    for name in names:
        how = HOW[name.split(",")[0].split(" ")[0]]
        if name not in medians:
            lines.append(f"| {name} | - | - | - | {notes.get(name, 'not run')} |")
            continue
        rate, cpu = medians[name]
        plain = {"fastpipe": "fastpipe, no policy", "torchvision": "torchvision v2, no policy",
                 "DALI": "DALI CPU, no policy"}[name.split(",")[0].split(" ")[0]]
        extra = "-"
        if PIPELINES[name][1] and plain in medians:
            extra = f"{cpu - medians[plain][1]:.2f}"
        lines.append(f"| {name} | {rate:.0f} | {cpu:.2f} | {extra} | {how} |")
    table = "\n".join(lines) + "\n"
    print()
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
