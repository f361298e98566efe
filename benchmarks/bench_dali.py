"""Train-time image loading on the CPU: fastpipe's DALI pipeline against torchvision.

Every contender produces the same batches from the sample dataset: RandomResizedCrop 224 +
horizontal flip, float32 ``(N, 3, 224, 224)`` normalized with the ImageNet mean and std, batch 64,
with 2 CPU threads (DALI) or 2 worker processes (DataLoader):

* fastpipe ``DALILoader`` in DALI's CPU mode (fused crop decode, resize, normalize);
* torchvision ``ImageFolder`` with PIL transforms (the classification references' recipe);
* torchvision.transforms.v2 on ``torchvision.io.decode_jpeg`` tensors.

One extra row, marked as a different output: ``DALILoader(dtype=torch.uint8)``, which stops
before normalization (to normalize on the GPU later).

``--auto-augment ra`` (or ``ta_wide``, ``imagenet``) adds the policy after the crop everywhere:
DALI's ``nvidia.dali.auto_aug`` in the DALILoader rows, torchvision's ``RandAugment()``,
``TrivialAugmentWide()`` or ``AutoAugment()`` in the torchvision rows (same settings).

Contenders run one after another, round-robin over ``--repeat`` rounds, each measurement in its
own Python process (a DALI pipeline alive in a process slows the others down); each round is a
fresh loader running ``--epochs`` epochs, timed from its first batch (start-up excluded).
Reported: median images/s and the ratio to torchvision + PIL measured in the same run.

    python benchmarks/bench_dali.py                      # full run (a few minutes)
    python benchmarks/bench_dali.py --quick              # smoke run
    python benchmarks/bench_dali.py --auto-augment ra
    python benchmarks/bench_dali.py --markdown docs/dali-table.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastpipe import IMAGENET_MEAN as MEAN  # noqa: E402
from fastpipe import IMAGENET_STD as STD  # noqa: E402

BASELINE = "torchvision ImageFolder + PIL"


@dataclass(frozen=True)
class Config:
    root: Path
    batch_size: int
    workers: int
    size: int
    epochs: int
    auto_augment: str | None = None


def fastpipe_dali(cfg: Config, dtype: torch.dtype = torch.float32) -> Iterable[torch.Tensor]:
    from fastpipe.dali import DALILoader

    loader = DALILoader(
        cfg.root, batch_size=cfg.batch_size, train=True, size=cfg.size, num_workers=cfg.workers,
        device="cpu", dtype=dtype, auto_augment=cfg.auto_augment,
        **({} if dtype == torch.uint8 else {"mean": MEAN, "std": STD}),
    )
    try:
        for _ in range(cfg.epochs):
            for images, _ in loader:
                yield images
    finally:
        loader.close()


def fastpipe_dali_uint8(cfg: Config) -> Iterable[torch.Tensor]:
    return fastpipe_dali(cfg, dtype=torch.uint8)


def _epochs_of(loader: DataLoader, epochs: int) -> Iterable[torch.Tensor]:
    for _ in range(epochs):
        for images, _ in loader:
            yield images


def _policy(module, name: str | None) -> list:
    """torchvision's transform for a policy name, from ``module`` (v1 or v2 transforms)."""
    if name is None:
        return []
    policies = {
        "ra": lambda: module.RandAugment(),
        "ta_wide": lambda: module.TrivialAugmentWide(),
        "imagenet": lambda: module.AutoAugment(module.AutoAugmentPolicy.IMAGENET),
    }
    return [policies[name]()]


def torchvision_pil(cfg: Config) -> Iterable[torch.Tensor]:
    import torchvision.datasets
    import torchvision.transforms as T

    transform = T.Compose([
        T.RandomResizedCrop(cfg.size), T.RandomHorizontalFlip(), *_policy(T, cfg.auto_augment),
        T.PILToTensor(), T.ConvertImageDtype(torch.float32), T.Normalize(MEAN, STD),
    ])
    dataset = torchvision.datasets.ImageFolder(str(cfg.root), transform=transform)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True,
                        num_workers=cfg.workers, persistent_workers=True)
    return _epochs_of(loader, cfg.epochs)


class _DecodeJpegFolder(Dataset):
    """ImageFolder files read as bytes, decoded by ``torchvision.io.decode_jpeg``, v2 transforms."""

    def __init__(self, root: Path, size: int, auto_augment: str | None = None) -> None:
        import torchvision.datasets
        from torchvision.transforms import v2

        self.samples = torchvision.datasets.ImageFolder(str(root)).samples
        self.transform = v2.Compose([
            v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(),
            *_policy(v2, auto_augment),
            v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
        ])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import torchvision.io

        path, label = self.samples[index]
        image = torchvision.io.decode_jpeg(torchvision.io.read_file(path))
        return self.transform(image), label


def torchvision_v2(cfg: Config) -> Iterable[torch.Tensor]:
    dataset = _DecodeJpegFolder(cfg.root, cfg.size, cfg.auto_augment)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True,
                        num_workers=cfg.workers, persistent_workers=True)
    return _epochs_of(loader, cfg.epochs)


CONTENDERS: dict[str, tuple[Callable[[Config], Iterable[torch.Tensor]], str]] = {
    "fastpipe DALILoader (DALI CPU)": (fastpipe_dali, "float32"),
    BASELINE: (torchvision_pil, "float32"),
    "torchvision v2 on decode_jpeg": (torchvision_v2, "float32"),
    "fastpipe DALILoader, dtype=uint8": (fastpipe_dali_uint8, "uint8, not normalized"),
}


def measure(
    make: Callable[[Config], Iterable[torch.Tensor]], cfg: Config, expected_dtype: torch.dtype
) -> float:
    """Images per second after the first batch (which carries the start-up)."""
    batches = iter(make(cfg))
    try:
        first = next(batches)
        if first.shape[1:] != (3, cfg.size, cfg.size) or first.dtype != expected_dtype:
            raise AssertionError(f"unexpected batch {tuple(first.shape)} {first.dtype}")
        start, images = time.perf_counter(), 0
        for batch in batches:
            images += batch.shape[0]
        return images / (time.perf_counter() - start)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def measure_one(name: str, cfg: Config) -> float:
    make, output = CONTENDERS[name]
    dtype = torch.uint8 if output.startswith("uint8") else torch.float32
    return measure(make, cfg, dtype)


def measure_in_own_process(name: str, cfg: Config) -> float:
    config = {**cfg.__dict__, "root": str(cfg.root)}
    result = subprocess.run(
        [sys.executable, __file__, "--one", name, "--config", json.dumps(config)],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stderr[-3000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def run(cfg: Config, repeat: int) -> dict[str, float]:
    rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for round_number in range(repeat):
        for name in CONTENDERS:
            rates[name].append(measure_in_own_process(name, cfg))
            rate = rates[name][-1]
            print(f"round {round_number + 1}/{repeat}  {name:<36} {rate:8.1f} img/s", flush=True)
    return {name: statistics.median(values) for name, values in rates.items()}


def table(results: dict[str, float], cfg: Config, images: int) -> str:
    base = results[BASELINE]
    lines = [
        f"Train transforms to {cfg.size}x{cfg.size}"
        f"{f', auto_augment={cfg.auto_augment!r}' if cfg.auto_augment else ''}, "
        f"batch {cfg.batch_size}, {cfg.workers} threads/workers, "
        f"{images} sample images, {cfg.epochs} epochs per round; median of rounds. "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}.",
        "",
        "| pipeline | output | images/s | vs torchvision + PIL |",
        "|---|---|---:|---:|",
    ]
    for name, rate in results.items():
        lines.append(f"| {name} | {CONTENDERS[name][1]} | {rate:.0f} | {rate / base:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few images, one round")
    parser.add_argument("--images", type=int, help="sample images (default 256, quick 64)")
    parser.add_argument("--batch-size", type=int, help="default 64, quick 16")
    parser.add_argument("--epochs", type=int, help="epochs per round (default 3, quick 1)")
    parser.add_argument("--repeat", type=int, help="rounds (default 3, quick 1)")
    parser.add_argument("--workers", type=int, default=2, help="DALI threads / DataLoader workers")
    parser.add_argument("--auto-augment", choices=["ra", "ta_wide", "imagenet"],
                        help="add this policy after the crop in every pipeline")
    parser.add_argument("--markdown", type=Path, help="write the results table to this file")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one measurement
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        config = json.loads(args.config)
        print(measure_one(args.one, Config(**{**config, "root": Path(config["root"])})))
        return 0

    from fastpipe.data import sample_images

    images = args.images or (64 if args.quick else 256)
    cfg = Config(
        root=sample_images(num_images=images, num_classes=4),
        batch_size=args.batch_size or (16 if args.quick else 64),
        workers=args.workers,
        size=224,
        epochs=args.epochs or (1 if args.quick else 3),
        auto_augment=args.auto_augment,
    )
    results = run(cfg, args.repeat or (1 if args.quick else 3))
    text = table(results, cfg, images)
    print()
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
