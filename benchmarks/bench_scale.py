"""Scale: what a dataset of N tiny samples costs, at N = 10k, 100k and 1M.

Per size, each in its own process (``_harness.run_rounds``):

- ``pack``: packing N tiny records (a float32 (4,) array and an int label) with the default
  virtual merge and ``shard_size=1000`` (N / 1000 part files: 1,000 at 1M), samples/s, and the
  packing process's peak memory (VmHWM: its growth from one N to the next, divided by the
  inputs added, is what it holds per input);
- ``H5Dataset`` over that pack and ``TarDataset`` over N / 1000 tar shards of the same samples:
  the time to build the dataset (open), the first sample, then one epoch through a DataLoader
  with 2 persistent worker processes, after which each worker's private memory (the pages of
  its anonymous mappings in /proc/PID/smaps that no other process maps), the file pages it
  mapped and read (the page cache's, reclaimable) and its open file descriptors are read.

Flat per-worker memory and descriptors over N, and a packing rate that does not fall with N, are
what the record model promises (docs/architecture.md). Linux only (/proc).

    python -m benchmarks.bench_scale [--sizes 10000 100000 1000000] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _harness

SHARD = 1000
BATCH = 1024


class Tiny:
    """N records of a float32 (4,) array and an int label."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        import numpy as np

        return {"x": np.full(4, i, np.float32), "label": i % 10}


def _vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _private_kib(pid: int) -> tuple[int, int]:
    """A process's pages no other process maps, (anonymous, file-backed), from /proc/PID/smaps.
    Anonymous is memory it holds (its heap, its copies of the parent's pages); file-backed is
    mostly the pages of shards and packs it mapped and read, the page cache's, which the kernel
    drops under pressure (smaps calls a page of a file written moments ago dirty, whoever wrote
    it, so clean and dirty do not tell them apart)."""
    anonymous = mapped = 0
    file_backed = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(maxsplit=6)
            if first and "-" in first[0] and not first[0].endswith(":"):  # a mapping's header
                name = first[5].strip() if len(first) > 5 else ""
                file_backed = name.startswith("/") and not name.startswith("/memfd:")
            elif first and first[0] in ("Private_Clean:", "Private_Dirty:"):
                if file_backed:
                    mapped += int(first[1])
                else:
                    anonymous += int(first[1])
    return anonymous, mapped


def write_tars(folder: Path, n: int) -> None:
    """The same samples as :class:`Tiny`'s, as WebDataset shards (a .npy and a .cls member)."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    for start in range(0, n, SHARD):
        with tarfile.open(folder / f"{start // SHARD:06d}.tar", "w") as tar:
            for i in range(start, min(n, start + SHARD)):
                array = io.BytesIO()
                np.save(array, np.full(4, i, np.float32))
                for ext, data in (("npy", array.getvalue()), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{i:09d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def measure(name: str, cfg: Any) -> dict[str, Any]:
    n = int(name.split("N=")[1])
    folder = Path(cfg.folder) / str(n)
    if name.startswith("pack"):
        from fastpipe.pack import pack

        out = Path(cfg.folder) / f"timed-{n}-{os.getpid()}.h5"
        cpu, start = _harness.cpu_seconds(), time.perf_counter()
        pack(Tiny(n), out, shard_size=SHARD, progress=False)
        seconds = time.perf_counter() - start
        return {"rate": n / seconds, "cpu_ms": (_harness.cpu_seconds() - cpu) / n * 1e3,
                "peak_mb": _vm_hwm_kib() / 1024}
    import torch

    from fastpipe.data import H5Dataset, TarDataset, fast_collate

    start = time.perf_counter()
    if name.startswith("H5Dataset"):
        dataset = H5Dataset(folder / "pack.h5")
    else:
        dataset = TarDataset(folder / "tars", fields=["npy", "cls"])
    opened = time.perf_counter() - start
    start = time.perf_counter()
    dataset[0]
    first = time.perf_counter() - start
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2,
                                         persistent_workers=True, collate_fn=fast_collate)
    iterator = iter(loader)
    seen = sum(len(next(iter(batch.values())) if isinstance(batch, dict) else batch[0])
               for batch in iterator)
    workers = [w.pid for w in iterator._workers]
    private = [_private_kib(pid) for pid in workers]
    fds = [len(os.listdir(f"/proc/{pid}/fd")) for pid in workers]
    del iterator
    return {"rate": seen / max(opened + first, 1e-9), "cpu_ms": 0.0, "open_s": opened,
            "first_s": first, "worker_private_mb": max(p[0] for p in private) / 1024,
            "worker_mapped_mb": max(p[1] for p in private) / 1024, "worker_fds": max(fds),
            "seen": seen}


def prepare(folder: Path, sizes: list[int]) -> None:
    from fastpipe.pack import pack

    for n in sizes:
        where = folder / str(n)
        where.mkdir(parents=True, exist_ok=True)
        pack(Tiny(n), where / "pack.h5", shard_size=SHARD, progress=False)
        write_tars(where / "tars", n)
    os.sync()  # the files' pages written back, as a dataset's are when it is read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scale",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    _harness.add_arguments(parser, repeat=1, baseline=False)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.sizes = [2000, 4000]
    names = [f"{kind} N={n}" for n in args.sizes for kind in ("pack", "H5Dataset", "TarDataset")]
    names = _harness.select(names, args.only)
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-scale-") as folder:
        prepare(Path(folder), sorted({int(n.split("N=")[1]) for n in names}))
        runs = _harness.run_rounds("bench_scale", names, {"folder": folder},
                                   _harness.rounds_of(args, 1), unit="samples/s")
    lines = [f"Tiny records (float32 (4,) + int label), shards of {SHARD}, DataLoader with 2 "
             f"persistent worker processes, batch {BATCH}. Machine: {_harness.machine()}.", "",
             "| row | pack samples/s | pack peak MB (VmHWM) | open s | first sample s | "
             "worker private MB after an epoch | worker's mapped file pages MB | "
             "worker descriptors |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        got = [r for r in runs.current.get(name, []) if "rate" in r]
        if not got:
            lines.append(f"| {name} | {runs.note(name) or 'not run'} | | | | | | |")
            continue

        def med(key: str, fmt: str, got: list[dict[str, Any]] = got) -> str:
            values = [r[key] for r in got if key in r]
            return format(statistics.median(values), fmt) if values else ""

        if name.startswith("pack"):
            lines.append(f"| {name} | {med('rate', ',.0f')} | {med('peak_mb', ',.0f')} | | | | | |")
        else:
            lines.append(f"| {name} | | | {med('open_s', '.2f')} | {med('first_s', '.4f')} | "
                         f"{med('worker_private_mb', '.1f')} | {med('worker_mapped_mb', '.1f')} | "
                         f"{med('worker_fds', '.0f')} |")
    _harness.finish("\n".join(lines), args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
