"""Background loading vs a plain loop, on a simulated training loop where loading ~= compute.

Each step loads one batch (cost ``--load-ms``) and then "trains" for ``--compute-ms`` (a sleep: the
CPU side of a GPU step mostly waits for the device, releasing the GIL). Loading either releases the
GIL (a sleep, like I/O or torch ops) or holds it (a pure-Python busy loop, like a Python
transform). Every variant is reported as its wall time over the ideal ``steps * max(load,
compute)``: 1.00 is perfect overlap, 2.00 is no overlap at all. The variants run in the same
rounds, one epoch each per round, in this process (``_harness.interleaved``); the median counts.

    python -m benchmarks.bench_prefetch [--quick] [--markdown FILE]

``--regimes``: DataLoaderX against DataLoader on real JPEG loading (fastpipe's ImageFolder at
224 px, fast_collate, batch 32) in three regimes set by the simulated step: loader-bound (no
step), balanced (a step as long as loading one batch, taken in each round from that round's
loader-bound DataLoader row) and compute-bound (three times that). Each measurement runs in a
fresh process, rounds interleave the rows, and each row reports its median, min-max, and the
per-round ratio to DataLoader:

    python -m benchmarks.bench_prefetch --regimes [--workers N] [--repeat R] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks import _harness
from fastpipe.loader import DataLoaderX
from fastpipe.prefetch import DataPrefetcher


class SimulatedLoad(Dataset):
    """Each item is one ready batch that takes ``seconds`` to produce."""

    def __init__(self, steps: int, seconds: float, holds_gil: bool) -> None:
        self.steps, self.seconds, self.holds_gil = steps, seconds, holds_gil
        self.batch = torch.zeros(8, 3, 32, 32, dtype=torch.uint8)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int):
        if self.holds_gil:
            deadline = time.perf_counter() + self.seconds
            while time.perf_counter() < deadline:
                pass
        else:
            time.sleep(self.seconds)
        return self.batch, torch.tensor(index)


def _variants(dataset: Dataset) -> dict:
    from prefetch_generator import BackgroundGenerator

    def loader(cls=DataLoader, **kw):
        return cls(dataset, batch_size=None, num_workers=0, **kw)

    return {
        "DataLoader (plain loop)": lambda: loader(),
        "prefetch_generator.BackgroundGenerator": (
            lambda: BackgroundGenerator(loader(), max_prefetch=2)),
        "DataLoaderX": lambda: loader(DataLoaderX, prefetch_depth=2),
        "DataPrefetcher(DataLoader)": (
            lambda: DataPrefetcher(loader(), device="cpu", prefetch_depth=2)),
        "DataPrefetcher(DataLoaderX)": lambda: DataPrefetcher(
            loader(DataLoaderX, prefetch_depth=2), device="cpu", prefetch_depth=2
        ),
    }


def _time_epoch(make, compute_seconds: float) -> float:
    iterable = make()
    start = time.perf_counter()
    for _batch in iterable:
        time.sleep(compute_seconds)
    elapsed = time.perf_counter() - start
    close = getattr(iterable, "close", None)
    if callable(close):
        close()
    return elapsed


def run(steps: int, load_ms: float, compute_ms: float, repeats: int) -> list[dict]:
    ideal = steps * max(load_ms, compute_ms) / 1000
    rows = []
    for holds_gil in (False, True):
        dataset = SimulatedLoad(steps, load_ms / 1000, holds_gil)
        timed = {name: (lambda make=make: _time_epoch(make, compute_ms / 1000))
                 for name, make in _variants(dataset).items()}
        for name, times in _harness.interleaved(timed, repeats, warmup=0).items():
            rows.append({
                "load": "holds the GIL" if holds_gil else "releases the GIL",
                "variant": name,
                "seconds": statistics.median(times),
                "ratio_to_ideal": statistics.median(times) / ideal,
            })
    return rows


def to_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Simulated loop: {args.steps} steps, load {args.load_ms:g} ms, compute "
        f"{args.compute_ms:g} ms per step, median of {args.repeats} interleaved runs. Ratio = wall "
        "time / ideal (steps x max(load, compute)); lower is better, 1.00 is perfect overlap. "
        f"Machine: {_harness.machine()}.",
        "",
        "| loading | variant | ratio to ideal |",
        "|---|---|---:|",
    ]
    lines += [f"| {r['load']} | {r['variant']} | {r['ratio_to_ideal']:.3f} |" for r in rows]
    return "\n".join(lines) + "\n"


REGIMES = {"loader-bound": 0.0, "balanced": 1.0, "compute-bound": 3.0}
LOADERS = ("DataLoader", "DataLoaderX")


def _regime_loader(name: str, cfg) -> object:
    from fastpipe.data import ImageFolder, fast_collate

    cls = DataLoaderX if name == "DataLoaderX" else DataLoader
    dataset = ImageFolder(cfg.root, train=True, size=cfg.size, seed=0)
    return cls(dataset, batch_size=cfg.batch_size, shuffle=True, num_workers=cfg.workers,
               collate_fn=fast_collate, persistent_workers=cfg.workers > 0, drop_last=True)


def measure(name: str, cfg) -> dict[str, float]:
    """One row in its own process, ``REGIME/LOADER``: images/s over ``cfg.epochs`` epochs with the
    regime's step."""
    regime, loader_name = name.split("/")
    step = cfg.step_seconds.get(regime, 0.0)
    loader = _regime_loader(loader_name, cfg)
    # A whole epoch of warm-up, then whole epochs timed: the two loaders draw different orders
    # (DataLoaderX's sampler is seeded per epoch), and photos differ in cost, so a timed window
    # that starts mid-epoch would time different images for each.
    return _harness.time_batches(_epochs(loader, cfg.epochs + 1, step), warmup=len(loader))


def _epochs(loader, epochs: int, step: float):
    for _ in range(epochs):
        for images, _labels in loader:
            if step:
                time.sleep(step)  # the host side of a GPU step: it waits, releasing the GIL
            yield images


def run_regimes(args: argparse.Namespace) -> str:
    from fastpipe.data.samples import sample_images

    root = sample_images(num_images=args.images)
    config = {"root": str(root), "batch_size": 32, "size": 224, "workers": args.workers,
              "epochs": args.epochs, "step_seconds": {}}
    rounds = args.repeat or 3
    runs = _harness.Runs()
    steps: dict[str, list[float]] = {regime: [] for regime in REGIMES}
    for round_ in range(rounds):
        # The step of the round is set by its own loader-bound DataLoader row (the time to load
        # one batch with no step), measured first: load on a shared machine drifts between
        # rounds, and a step calibrated once would turn "balanced" into another regime.
        bound = [f"loader-bound/{loader}" for loader in LOADERS[:: 1 if round_ % 2 else -1]]
        _harness.run_rounds("bench_prefetch", bound, config, 1, runs=runs,
                            label=f"round {round_ + 1}")
        load_seconds = config["batch_size"] / runs.current["loader-bound/DataLoader"][-1]["rate"]
        config["step_seconds"] = {r: factor * load_seconds for r, factor in REGIMES.items()}
        for regime in REGIMES:
            steps[regime].append(config["step_seconds"][regime])
        rest = [f"{regime}/{loader}" for regime in list(REGIMES)[1:]
                for loader in LOADERS[:: 1 if round_ % 2 else -1]]
        _harness.run_rounds("bench_prefetch", rest, config, 1, runs=runs,
                            label=f"round {round_ + 1}")
    lines = [
        f"DataLoaderX vs DataLoader: fastpipe ImageFolder (train, 224 px) + fast_collate, batch "
        f"32, {args.workers} worker process(es){' (persistent)' if args.workers else ''}, "
        f"{args.images} JPEGs, {args.epochs} epoch(s) per measurement after a warm-up epoch. "
        "The simulated step (a sleep: the host side of a GPU step) is 0, 1 and 3 times the time "
        "to load one batch, taken in each round from that round's loader-bound DataLoader row. "
        f"Each measurement in its own process, {rounds} rounds (the two loaders' order "
        f"alternating). Machine: {_harness.machine()}.",
        "",
        "| regime | step ms (median) | DataLoader images/s (min-max) | DataLoaderX images/s "
        "(min-max) | DataLoaderX / DataLoader (of the medians) | per round (min-max) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for regime in REGIMES:
        plain = [r["rate"] for r in runs.current[f"{regime}/DataLoader"]]
        fast = [r["rate"] for r in runs.current[f"{regime}/DataLoaderX"]]
        pairs = [b / a for a, b in zip(plain, fast)]
        lines.append(
            f"| {regime} | {statistics.median(steps[regime]) * 1000:.0f} | "
            f"{statistics.median(plain):.0f} ({min(plain):.0f}-{max(plain):.0f}) | "
            f"{statistics.median(fast):.0f} ({min(fast):.0f}-{max(fast):.0f}) | "
            f"{statistics.median(fast) / statistics.median(plain):.2f}x | "
            f"{min(pairs):.2f}-{max(pairs):.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_prefetch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--load-ms", type=float, default=20.0)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few steps, for a smoke test")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--regimes", action="store_true",
                        help="DataLoaderX vs DataLoader on JPEG loading in three regimes, each "
                             "measurement in its own process")
    parser.add_argument("--workers", type=int, default=0,
                        help="--regimes: DataLoader worker processes (default 0)")
    parser.add_argument("--images", type=int, default=256, help="--regimes: sample JPEGs")
    parser.add_argument("--epochs", type=int, default=2, help="--regimes: epochs per measurement")
    parser.add_argument("--repeat", type=int, default=None, help="--regimes: rounds (default 3)")
    args = parser.parse_args(argv)
    if args.regimes:
        if args.quick:
            args.images, args.epochs, args.repeat = 128, 1, 1
        _harness.finish(run_regimes(args), args)
        return 0
    if args.quick:
        args.steps, args.repeats = 10, 1
    rows = run(args.steps, args.load_ms, args.compute_ms, args.repeats)
    _harness.finish(to_markdown(rows, args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
