"""Background loading vs a plain loop, on a simulated training loop where loading ~= compute.

Each step loads one batch (cost ``--load-ms``) and then "trains" for ``--compute-ms`` (a sleep: the
CPU side of a GPU step mostly waits for the device, releasing the GIL). Loading either releases the
GIL (a sleep, like I/O or torch ops) or holds it (a pure-Python busy loop, like a Python
transform). Every variant is reported as its wall time over the ideal ``steps * max(load,
compute)``: 1.00 is perfect overlap, 2.00 is no overlap at all. The variants run in the same
rounds, one epoch each per round, in this process (``_harness.interleaved``); the median counts.

    python -m benchmarks.bench_prefetch [--quick] [--markdown FILE]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_prefetch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--load-ms", type=float, default=20.0)
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few steps, for a smoke test")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 10, 1
    rows = run(args.steps, args.load_ms, args.compute_ms, args.repeats)
    _harness.finish(to_markdown(rows, args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
