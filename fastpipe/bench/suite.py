"""The suite behind `fastpipe bench`: the loader variants side by side on the sample dataset."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastpipe._constants import DEFAULT_SIZE
from fastpipe._hardware import usable_cores
from fastpipe.bench.machine import describe_machine
from fastpipe.bench.report import BenchReport, loader_table, noise_notes, workers
from fastpipe.bench.variants import VARIANTS, BenchConfig, Skip, Variant
from fastpipe.data.samples import default_cache_dir, sample_images
from fastpipe.profiling._runner import close_loader, epoch_batches, measured_row, run_loader
from fastpipe.profiling._table import Row
from fastpipe.profiling._workload import Spelling, check_measurable


def _describe_output(batch: Any) -> str:
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    if isinstance(images, dict):
        images = next(iter(images.values()))
    shape = tuple(getattr(images, "shape", ()))
    return f"{getattr(images, 'dtype', type(images).__name__)} {shape}".replace("torch.", "")


class _Peek:
    """Passes batches through and remembers what the first one looked like."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.output: str | None = None

    def __iter__(self):
        with epoch_batches(self.loader) as batches:
            for batch in batches:
                if self.output is None:
                    self.output = _describe_output(batch)
                yield batch


def run_variant(variant: Variant, config: BenchConfig, seconds: float, step_seconds: float,
                min_batches: int) -> Row:
    row = Row(variant.name, key=variant.key, description=variant.description)
    try:
        loader = variant.build(config)
    except (ImportError, Skip) as exc:
        reason = str(exc).splitlines()[0]
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").startswith("fastpipe"):
            reason = f"this fastpipe has no {exc.name} ({reason})"
        row.skipped = reason
        return row
    peek = _Peek(loader)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            summary = run_loader(peek, seconds, step_seconds, min_batches)
    finally:
        close_loader(loader)
        del loader, peek.loader
        gc.collect()  # so this variant's workers are gone before the next one starts
    row.output = peek.output
    return measured_row(summary, row, "the dataset gave only one batch; use more images or a "
                                      "smaller batch")


def run_bench(
    root: str | os.PathLike | None = None,
    *,
    num_images: int = 256,
    batch_size: int = 32,
    num_workers: int | None = None,
    size: int = DEFAULT_SIZE,
    seconds: float = 4.0,
    step_ms: float = 10.0,
    variants: Sequence[str] | None = None,
    rounds: int = 2,
    min_batches: int = 3,
    progress: bool = False,
    command: str = "fastpipe bench",
) -> BenchReport:
    """Runs each loader variant for ``seconds`` on the same JPEG folder and compares images/s.

    Without ``root`` the built-in sample dataset of ``num_images`` images is used (generated on
    first use and cached). Each batch is followed by a ``step_ms`` pause standing in for a GPU
    training step (the host idles while the GPU computes), which loaders that work in the
    background can overlap. Every variant yields normalized float32 images on the device.
    Each of the ``rounds`` runs every variant once, in turn; a variant's result is its median.
    """
    known = {v.key: v for v in VARIANTS}
    chosen = list(variants) if variants is not None else list(known)
    unknown = [k for k in chosen if k not in known]
    if unknown or not chosen:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {', '.join(known)}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"a variant is listed twice in {chosen}; use rounds to repeat them")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if batch_size < 1 or seconds <= 0 or step_ms < 0 or size < 8:
        raise ValueError(
            f"need batch_size >= 1, seconds > 0, step_ms >= 0 and size >= 8; got batch_size="
            f"{batch_size}, seconds={seconds}, step_ms={step_ms}, size={size}"
        )
    if num_workers is None:
        num_workers = usable_cores()
    sample_set = root is None
    if sample_set:
        root = sample_images(num_images=num_images)
    else:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory; pass an ImageFolder tree")
        num_images = sum(1 for p in root.glob("*/*") if p.is_file())
    workload = check_measurable(num_images, batch_size, Spelling(
        "", "--batch-size", "--num-images" if sample_set else None))
    root = Path(root)
    cache = default_cache_dir()
    # Packs of the cached sample dataset are cached beside it; others live for this run only.
    temporary = None
    if cache in root.parents:
        pack_dir = cache / "packs"
    else:
        temporary = tempfile.mkdtemp(prefix="fastpipe-bench-")
        pack_dir = Path(temporary)
    config = BenchConfig(root=root, batch_size=batch_size, num_workers=num_workers, size=size,
                         pack_dir=pack_dir)
    settings = {"root": str(root), "num_images": num_images, "batch_size": batch_size,
                "num_workers": num_workers, "size": size, "seconds": seconds, "step_ms": step_ms,
                "rounds": rounds, "command": command}

    from fastpipe._progress import progress_bar

    results: dict[str, list[Row]] = {key: [] for key in chosen}
    bar = progress_bar(progress, total=len(chosen) * rounds,
                       desc="fastpipe bench", unit="run")
    started = time.perf_counter()
    try:
        # Rounds interleave the variants, so a burst of load from elsewhere on the machine
        # lands on all of them rather than on one.
        for _ in range(rounds):
            for key in chosen:
                if results[key] and results[key][-1].skipped:
                    bar.update(1)
                    continue
                bar.set_postfix_str(known[key].name, refresh=True)
                results[key].append(
                    run_variant(known[key], config, seconds, step_ms / 1000, min_batches))
                bar.update(1)
        rows = [Row.merged(results[key]) for key in chosen]
    finally:
        bar.close()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    settings["total_seconds"] = round(time.perf_counter() - started, 1)
    conditions = (f"{num_images} images, batch {batch_size}, {workers(num_workers)}, "
                  f"{size}x{size} crops, {seconds:g} s per loader, {step_ms:g} ms simulated step, "
                  f"median of {rounds} round(s)")
    setup = (f"data: {num_images} JPEGs in {root}; batch {batch_size}, {workers(num_workers)}, "
             f"{size}x{size} crops, {seconds:g} s per loader after its first batch, {step_ms:g} ms "
             f"simulated step, median of {rounds} round(s)")
    table = loader_table(rows)
    notes = noise_notes(table, rounds) + ([] if workload is None else [f"note: {workload}"])
    return BenchReport(describe_machine(), settings, table, setup, conditions, notes=notes)
