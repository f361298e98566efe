"""The suite behind `fastpipe bench`: the loader variants side by side on the sample dataset."""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastpipe.bench.machine import describe_machine, machine_line
from fastpipe.bench.variants import VARIANTS, BenchConfig, Skip, Variant
from fastpipe.data.samples import default_cache_dir, sample_images
from fastpipe.profiling._runner import close_loader, run_loader

BASELINE = "dataloader"


@dataclass
class BenchRow:
    """One variant's result; ``images_per_second`` is None when it was skipped.

    With several rounds, ``images_per_second`` and ``wait_share`` are medians over the rounds
    (each round's rate is in ``per_round``), and ``batches``/``seconds`` are totals.
    """

    key: str
    name: str
    description: str
    images_per_second: float | None = None
    ratio: float | None = None
    wait_share: float | None = None
    batches: int = 0
    seconds: float = 0.0
    first_batch_seconds: float | None = None
    output: str | None = None
    skipped: str | None = None
    per_round: list[float] = field(default_factory=list)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _merge(rounds: list[BenchRow]) -> BenchRow:
    """One row from the same variant's rounds; skipped if any round was."""
    first = rounds[0]
    skipped = next((r for r in rounds if r.images_per_second is None), None)
    if skipped is not None:
        return skipped
    return BenchRow(
        first.key, first.name, first.description,
        images_per_second=_median([r.images_per_second for r in rounds]),
        wait_share=_median([r.wait_share for r in rounds]),
        batches=sum(r.batches for r in rounds), seconds=sum(r.seconds for r in rounds),
        first_batch_seconds=_median([r.first_batch_seconds for r in rounds]),
        output=first.output, per_round=[r.images_per_second for r in rounds],
    )


@dataclass
class BenchReport:
    machine: dict[str, Any]
    settings: dict[str, Any]
    rows: list[BenchRow]

    @property
    def baseline(self) -> BenchRow | None:
        return next((r for r in self.rows if r.key == BASELINE and r.images_per_second), None)

    def table(self) -> str:
        width = max(len(r.name) for r in self.rows) + 2
        lines = [f"{'loader':<{width}}{'images/s':>10}{'vs DataLoader':>15}{'data wait':>11}"]
        lines.append("-" * len(lines[0]))
        for r in self.rows:
            if r.images_per_second is None:
                lines.append(f"{r.name:<{width}}{'-':>10}{'-':>15}{'-':>11}   skipped: {r.skipped}")
                continue
            ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
            lines.append(f"{r.name:<{width}}{r.images_per_second:>10.1f}{ratio:>15}"
                         f"{r.wait_share:>11.0%}")
        return "\n".join(lines)

    def header(self) -> str:
        s = self.settings
        return (f"machine: {machine_line(self.machine)}\n"
                f"data: {s['num_images']} JPEGs in {s['root']}; batch {s['batch_size']}, "
                f"{_workers(s['num_workers'])}, {s['size']}x{s['size']} crops, "
                f"{s['seconds']:g} s per loader after its first batch, "
                f"{s['step_ms']:g} ms simulated step, median of {s['rounds']} round(s)")

    def __str__(self) -> str:
        return f"{self.header()}\n\n{self.table()}"

    def to_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "settings": self.settings,
                "rows": [asdict(r) for r in self.rows]}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def to_markdown(self, path: str | os.PathLike | None = None) -> str:
        """The table for docs/benchmarks.md, with the machine and the command under it."""
        lines = ["| loader | images/s | vs DataLoader | data wait | what runs |",
                 "|---|---:|---:|---:|---|"]
        for r in self.rows:
            if r.images_per_second is None:
                lines.append(f"| {r.name} | - | - | - | skipped: {r.skipped} |")
                continue
            ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
            lines.append(f"| {r.name} | {r.images_per_second:.0f} | {ratio} | "
                         f"{r.wait_share:.0%} | {r.description} |")
        s = self.settings
        lines += ["", f"Machine: {machine_line(self.machine)}.",
                  f"Command: `{s['command']}` ({s['num_images']} images, batch {s['batch_size']}, "
                  f"{_workers(s['num_workers'])}, {s['size']}x{s['size']} crops, {s['seconds']:g} "
                  f"s per loader, {s['step_ms']:g} ms simulated step, median of {s['rounds']} "
                  "round(s))."]
        text = "\n".join(lines) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    def plot(self, path: str | os.PathLike) -> Path:
        """Images/s per variant as a PNG (needs matplotlib: ``fastpipe[plot]``)."""
        from fastpipe.profiling.plots import plot_bench

        title = f"fastpipe bench: {machine_line(self.machine)}"
        return plot_bench(self.rows, title, path)


def _workers(count: int) -> str:
    return f"{count} worker{'' if count == 1 else 's'}"


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
        for batch in self.loader:
            if self.output is None:
                self.output = _describe_output(batch)
            yield batch


def run_variant(variant: Variant, config: BenchConfig, seconds: float, step_seconds: float,
                min_batches: int) -> BenchRow:
    row = BenchRow(variant.key, variant.name, variant.description)
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
    if summary.steps_counted == 0:
        row.skipped = "the dataset gave only one batch; use more images or a smaller batch"
        return row
    row.images_per_second = summary.samples_per_second
    row.wait_share = summary.wait_share
    row.batches = summary.steps_counted
    row.seconds = summary.seconds
    row.first_batch_seconds = summary.warmup_seconds
    row.output = peek.output
    return row


def run_bench(
    root: str | os.PathLike | None = None,
    *,
    num_images: int = 256,
    batch_size: int = 32,
    num_workers: int | None = None,
    size: int = 224,
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
        num_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
    if root is None:
        root = sample_images(num_images=num_images)
    else:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory; pass an ImageFolder tree")
        num_images = sum(1 for p in root.glob("*/*") if p.is_file())
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

    results: dict[str, list[BenchRow]] = {key: [] for key in chosen}
    bar = progress_bar(progress, only_on_terminal=True, total=len(chosen) * rounds,
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
        rows = [_merge(results[key]) for key in chosen]
    finally:
        bar.close()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    settings["total_seconds"] = round(time.perf_counter() - started, 1)
    report = BenchReport(describe_machine(), settings, rows)
    base = report.baseline
    for row in rows:
        if base is not None and row.images_per_second is not None:
            # Within each round first, against the baseline measured beside it.
            row.ratio = _median([r / b for r, b in zip(row.per_round, base.per_round, strict=True)])
    return report
