"""fastpipe bench: the loaders side by side on the built-in sample dataset."""

from __future__ import annotations

import argparse
import os
import platform

HELP = "run the loaders side by side on the built-in sample dataset and print a table"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-images", type=int, default=256, help="sample dataset size (default 256)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader num_workers (default 2)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per variant")


def run(args: argparse.Namespace) -> int:
    import torch

    from fastpipe.bench.demo import run_demo
    from fastpipe.datasets import sample_images

    root = sample_images(num_images=args.num_images)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    print(f"data: {args.num_images} sample JPEGs in {root}")
    results = run_demo(root, batch_size=args.batch_size, num_workers=args.workers, steps=args.steps)
    base = results[0].images_per_second
    print(f"{'loader':<32}{'images/s':>10}{'vs DataLoader':>15}{'data wait':>11}")
    for r in results:
        print(f"{r.name:<32}{r.images_per_second:>10.1f}{r.images_per_second / base:>14.2f}x"
              f"{r.wait_share:>10.0%}")
    return 0
