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
own Python process (a DALI pipeline alive in a process slows the others down; ``_harness.py``);
each round is a fresh loader running ``--epochs`` epochs, timed from its second batch (the first
carries the start-up). Reported: median (and min-max) images/s, the ratio to torchvision + PIL
measured in the same run, and the CPU ms/image.

    python -m benchmarks.bench_dali                      # full run (a few minutes)
    python -m benchmarks.bench_dali --quick              # smoke run
    python -m benchmarks.bench_dali --auto-augment ra
    python -m benchmarks.bench_dali --markdown docs/dali-table.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks import _harness

BASELINE = "torchvision ImageFolder + PIL"

# ---------------------------------------------------------------- pipelines
# Each takes the row's configuration (root, batch_size, workers, size, epochs, auto_augment,
# mean, std) and returns the batches of ``epochs`` epochs. Only fastpipe's public API: a
# --baseline run calls them with another checkout's fastpipe.


def fastpipe_dali(cfg, dtype: torch.dtype = torch.float32) -> Iterable[torch.Tensor]:
    from fastpipe.dali import DALILoader

    # Built here, before the clocks start: the pipeline's build is one-time set-up.
    loader = DALILoader(
        cfg.root, batch_size=cfg.batch_size, train=True, size=cfg.size, num_workers=cfg.workers,
        device="cpu", dtype=dtype, auto_augment=cfg.auto_augment,
        **({} if dtype == torch.uint8 else {"mean": cfg.mean, "std": cfg.std}),
    )
    return _closing(loader, cfg.epochs)


def _closing(loader, epochs: int) -> Iterable[torch.Tensor]:
    try:
        yield from _epochs_of(loader, epochs)
    finally:
        loader.close()


def fastpipe_dali_uint8(cfg) -> Iterable[torch.Tensor]:
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


def torchvision_pil(cfg) -> Iterable[torch.Tensor]:
    import torchvision.datasets
    import torchvision.transforms as T

    transform = T.Compose([
        T.RandomResizedCrop(cfg.size), T.RandomHorizontalFlip(), *_policy(T, cfg.auto_augment),
        T.PILToTensor(), T.ConvertImageDtype(torch.float32), T.Normalize(cfg.mean, cfg.std),
    ])
    dataset = torchvision.datasets.ImageFolder(cfg.root, transform=transform)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True,
                        num_workers=cfg.workers, persistent_workers=True)
    return _epochs_of(loader, cfg.epochs)


class _DecodeJpegFolder(Dataset):
    """ImageFolder files read as bytes, decoded by ``torchvision.io.decode_jpeg``, v2 transforms."""

    def __init__(self, root: str, size: int, mean: list[float], std: list[float],
                 auto_augment: str | None = None) -> None:
        import torchvision.datasets
        from torchvision.transforms import v2

        self.samples = torchvision.datasets.ImageFolder(root).samples
        self.transform = v2.Compose([
            v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(),
            *_policy(v2, auto_augment),
            v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std),
        ])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import torchvision.io

        path, label = self.samples[index]
        image = torchvision.io.decode_jpeg(torchvision.io.read_file(path))
        return self.transform(image), label


def torchvision_v2(cfg) -> Iterable[torch.Tensor]:
    dataset = _DecodeJpegFolder(cfg.root, cfg.size, cfg.mean, cfg.std, cfg.auto_augment)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True,
                        num_workers=cfg.workers, persistent_workers=True)
    return _epochs_of(loader, cfg.epochs)


CONTENDERS: dict[str, tuple[Callable[..., Iterable[torch.Tensor]], str]] = {
    "fastpipe DALILoader (DALI CPU)": (fastpipe_dali, "float32"),
    BASELINE: (torchvision_pil, "float32"),
    "torchvision v2 on decode_jpeg": (torchvision_v2, "float32"),
    "fastpipe DALILoader, dtype=uint8": (fastpipe_dali_uint8, "uint8, not normalized"),
}


def measure(name: str, cfg) -> dict[str, float]:
    """One contender, in this fresh process: images/s after the first batch (which carries the
    start-up)."""
    make, output = CONTENDERS[name]
    dtype = torch.uint8 if output.startswith("uint8") else torch.float32

    def check(batch: torch.Tensor) -> None:
        if batch.shape[1:] != (3, cfg.size, cfg.size) or batch.dtype != dtype:
            raise AssertionError(f"unexpected batch {tuple(batch.shape)} {batch.dtype}")

    return _harness.time_batches(make(cfg), cfg.warmup, check)


# ---------------------------------------------------------------- the run (the parent)

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_dali",
                                     description=__doc__.split("\n\n")[0])
    _harness.add_arguments(parser, repeat=3)
    parser.add_argument("--images", type=int, help="sample images (default 256, quick 64)")
    parser.add_argument("--batch-size", type=int, help="default 64, quick 16")
    parser.add_argument("--epochs", type=int, help="epochs per round (default 3, quick 1)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="batches not timed (default 1: the first, with the start-up)")
    parser.add_argument("--workers", type=int, default=2, help="DALI threads / DataLoader workers")
    parser.add_argument("--auto-augment", choices=["ra", "ta_wide", "imagenet"],
                        help="add this policy after the crop in every pipeline")
    args = parser.parse_args(argv)
    _harness.check_baseline(parser, args.baseline)
    from fastpipe._constants import IMAGENET_MEAN, IMAGENET_STD
    from fastpipe.data import sample_images
    from fastpipe.profiling._table import Column, ResultTable

    images = args.images or (64 if args.quick else 256)
    config = {"root": str(sample_images(num_images=images, num_classes=4)),
              "batch_size": args.batch_size or (16 if args.quick else 64),
              "workers": args.workers, "size": 224,
              "epochs": args.epochs or (1 if args.quick else 3), "warmup": args.warmup,
              "auto_augment": args.auto_augment,
              "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
    repeat = _harness.rounds_of(args, 3)
    names = _harness.select(CONTENDERS, args.only)
    runs = _harness.run_rounds("bench_dali", names, config, repeat, baseline=args.baseline)
    rows = _harness.rows(names, runs,
                         baseline_label=f"the row above, with the fastpipe of {args.baseline}")
    table = ResultTable(rows, unit="images/s", name_header="pipeline", baseline=BASELINE,
                        ratio_header="vs torchvision + PIL", after=[
                            _harness.cpu_column(),
                            Column("output", lambda r: CONTENDERS[r.key.removesuffix(
                                _harness.BASELINE_SUFFIX)][1], "<")])
    policy = f", auto_augment={args.auto_augment!r}" if args.auto_augment else ""
    lines = [
        f"Train transforms to 224x224{policy}, batch {config['batch_size']}, {args.workers} "
        f"threads/workers, {images} sample images, {config['epochs']} epochs per round; median "
        f"(and min-max) of {repeat} round(s), each measurement in its own process. Machine: "
        f"{_harness.machine()}.", "", table.markdown(), ""]
    if args.baseline:
        lines += [f"Before and after: this checkout against "
                  f"{_harness.describe_checkout(args.baseline.resolve())}.", "",
                  *_harness.before_after(names, runs), ""]
    _harness.finish("\n".join(lines), args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
