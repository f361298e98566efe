"""Packed datasets against the files they came from and against the memmap ceiling.

Measured in one run on the built-in sample dataset (photo-like JPEGs around 500x400):

* packing: files/s of ``fastpipe.pack.pack`` with 1 and 2 worker processes (target: 2 workers
  at least 1.7x one);
* random access in one process, samples/s: stored bytes only (the I/O part) and decoded;
* through a DataLoader (shuffled, ``--batch-size``, 0 and ``--workers`` processes, second epoch
  of persistent workers): bytes storage decoded to ``--size`` vs the original files through
  torchvision's ImageFolder with the same decoder; array storage vs ``np.memmap`` of the same
  decoded arrays, the practical ceiling (target: array storage at least half of it).

Every measurement runs in this one process, one after another (the packs and the loaders it
compares are plain file readers: no pipeline beside them to distort them); the machine line comes
from ``_harness.py``.

``--scale N [N ...]`` measures instead what ``pack``'s main process holds per input: an
ImageFolder tree of N tiny files (one byte each, 1,000 class folders; made once under
``--workdir``) packed with 2 worker processes and no decode check (the inputs are not images: what
is measured is the listing, the plan and the merge), each size in a fresh interpreter, which
reports its peak resident memory (VmHWM) after its imports and after ``pack``; the growth of the
peak from one N to the next, divided by the inputs added, is the bytes held per input. With
``--baseline CHECKOUT`` every size is measured again with the fastpipe of another checkout.

    python -m benchmarks.bench_pack [--quick] [--markdown FILE]
    python -m benchmarks.bench_pack --scale 100000 1000000 [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks import _harness
from fastpipe.data import H5Dataset, ImageDecoder, LMDBDataset, sample_images
from fastpipe.data.datasets._records import decode_chw
from fastpipe.pack import pack


class MemmapDataset(Dataset):
    """The ceiling: decoded uint8 CHW arrays in one ``np.memmap``, opened lazily per process."""

    def __init__(self, path: Path, shape: tuple[int, ...], labels: np.ndarray) -> None:
        self.path, self.shape, self.labels = path, shape, labels
        self._array = None

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: int):
        if self._array is None:
            self._array = np.memmap(self.path, np.uint8, "r", shape=self.shape)
        return torch.from_numpy(np.array(self._array[index])), int(self.labels[index])

    def __getstate__(self):
        return dict(self.__dict__, _array=None)


class FilesDataset(Dataset):
    """The starting point: torchvision's ImageFolder over the original files, one read per
    sample."""

    def __init__(self, root: Path, decoder) -> None:
        from torchvision.datasets import ImageFolder

        self.folder = ImageFolder(str(root), loader=_read_bytes)
        self.decoder = decoder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int):
        path, label = self.folder.samples[index]
        return self.decoder(_read_bytes(path), path), label

    def encoded(self, index: int):
        path, label = self.folder.samples[index]
        return _read_bytes(path), label


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def bench_packing(root: Path, work: Path, workers: int) -> tuple[float, int]:
    out = work / f"pack-{workers}.h5"
    report = pack(root, out, num_workers=workers, progress=False, overwrite=True)
    shutil.rmtree(out.with_name(out.name + ".shards"), ignore_errors=True)
    return report.files_per_second, report.count


MIN_SECONDS = 1.0  # each measurement repeats until it has run this long


def bench_random_access(fn, n: int, reads: int, seed: int = 0) -> float:
    indices = [int(i) for i in np.random.default_rng(seed).integers(0, n, reads)]
    for i in indices[:8]:  # warm-up: open files, fault in index arrays
        fn(i)
    count, start = 0, time.perf_counter()
    while True:
        for i in indices:
            fn(i)
        count += len(indices)
        seconds = time.perf_counter() - start
        if seconds >= MIN_SECONDS:
            return _rate(count, seconds)


def bench_loader(dataset: Dataset, batch_size: int, workers: int) -> float:
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0, generator=torch.Generator().manual_seed(0))
    for _ in loader:  # epoch 1: worker start-up, file opens
        pass
    count, start = 0, time.perf_counter()
    while True:  # whole epochs, so every sample is read equally often
        count += sum(len(labels) for _, labels in loader)
        seconds = time.perf_counter() - start
        if seconds >= MIN_SECONDS:
            break
    del loader
    return _rate(count, seconds)


def run(args: argparse.Namespace) -> list[dict]:
    root = sample_images(num_images=args.num_images)
    work = Path(tempfile.mkdtemp(prefix="fastpipe-bench-pack-", dir=args.workdir))
    rows: list[dict] = []

    def add(group: str, variant: str, value: float, baseline: float | None = None,
            unit: str = "samples/s"):
        rows.append({"group": group, "variant": variant, "value": value, "unit": unit,
                     "ratio": None if baseline is None else value / baseline})
        ratio = "" if baseline is None else f"  ({value / baseline:.2f}x)"
        print(f"{group:<44} {variant:<40} {value:>10.1f} {unit}{ratio}", flush=True)

    try:
        one, n = bench_packing(root, work, 1)
        add("packing (bytes, decode check)", "fastpipe pack --workers 1", one, one, "files/s")
        two, _ = bench_packing(root, work, 2)
        add("packing (bytes, decode check)", "fastpipe pack --workers 2", two, one, "files/s")

        size = (args.size, args.size)
        pack(root, work / "bytes.h5", merge="copy", progress=False)
        pack(root, work / "bytes-virtual.h5", num_workers=2, shard_size=max(1, n // 4),
             progress=False)
        pack(root, work / "bytes.lmdb", progress=False)
        pack(root, work / "array.h5", storage="array", size=size, num_workers=2, merge="copy",
             progress=False)
        pack(root, work / "array-virtual.h5", storage="array", size=size, num_workers=2,
             shard_size=max(1, n // 4), progress=False)
        pack(root, work / "array.lmdb", storage="array", size=size, num_workers=2, progress=False)
        arrays = H5Dataset(work / "array.h5")
        shape = (len(arrays), *arrays.sample_shape)
        memmap = np.memmap(work / "array.u8", np.uint8, "w+", shape=shape)
        for i in range(len(arrays)):
            memmap[i] = arrays[i][0].numpy()
        memmap.flush()
        del memmap
        ceiling = MemmapDataset(work / "array.u8", shape, arrays.targets)

        files = FilesDataset(root, decode_chw)
        packs = {"H5Dataset bytes (copy, contiguous)": H5Dataset(work / "bytes.h5"),
                 "H5Dataset bytes (virtual, 4 shards)": H5Dataset(work / "bytes-virtual.h5"),
                 "LMDBDataset bytes": LMDBDataset(work / "bytes.lmdb")}
        group = "random access, stored bytes only (1 process)"
        base = bench_random_access(files.encoded, n, args.reads)
        add(group, "ImageFolder files (open + read)", base, base)
        for name, ds in packs.items():
            add(group, name, bench_random_access(ds.encoded, n, args.reads), base)
        group = "random access, full decode (1 process)"
        reads = max(16, args.reads // 20)
        base = bench_random_access(files.__getitem__, n, reads)
        add(group, "ImageFolder files + decode", base, base)
        for name, ds in packs.items():
            add(group, name, bench_random_access(ds.__getitem__, n, reads), base)

        array_sets = {"H5Dataset array (copy, contiguous)": arrays,
                      "H5Dataset array (virtual, 4 shards)": H5Dataset(work / "array-virtual.h5"),
                      "LMDBDataset array": LMDBDataset(work / "array.lmdb")}
        group = f"random access, decoded {args.size}x{args.size} arrays (1 process)"
        base = bench_random_access(ceiling.__getitem__, n, args.reads)
        add(group, "np.memmap (ceiling)", base, base)
        for name, ds in array_sets.items():
            add(group, name, bench_random_access(ds.__getitem__, n, args.reads), base)

        decoder = ImageDecoder(train=False, size=args.size)
        for workers in sorted({0, args.workers}):
            group = f"DataLoader bytes -> {args.size}x{args.size}, {workers} workers"
            base = bench_loader(FilesDataset(root, decoder), args.batch_size, workers)
            add(group, "ImageFolder files", base, base)
            add(group, "H5Dataset bytes (copy)", bench_loader(
                H5Dataset(work / "bytes.h5", decoder=decoder), args.batch_size, workers), base)
            add(group, "LMDBDataset bytes", bench_loader(
                LMDBDataset(work / "bytes.lmdb", decoder=decoder), args.batch_size, workers), base)
        for workers in sorted({0, args.workers}):
            group = f"DataLoader array {args.size}x{args.size}, {workers} workers"
            base = bench_loader(ceiling, args.batch_size, workers)
            add(group, "np.memmap (ceiling)", base, base)
            for name, path in (("H5Dataset array (copy)", "array.h5"),
                               ("H5Dataset array (virtual)", "array-virtual.h5")):
                add(group, name, bench_loader(H5Dataset(work / path), args.batch_size, workers),
                    base)
            add(group, "LMDBDataset array",
                bench_loader(LMDBDataset(work / "array.lmdb"), args.batch_size, workers),
                base)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def to_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"{args.num_images} sample JPEGs (~500x400), arrays {args.size}x{args.size}, batch "
        f"{args.batch_size}. Machine: {_harness.machine()}. "
        "Ratio: against the first row of its group (packing: 1 worker; bytes: the original files; "
        "arrays: the np.memmap ceiling). Files sit in the page cache, so the file rows show "
        "per-file overhead, not disk seeks.",
        "",
        "| measurement | variant | rate | ratio |",
        "|---|---|---:|---:|",
    ]
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"| {r['group']} | {r['variant']} | {r['value']:.0f} {r['unit']} | {ratio} |")
    return "\n".join(lines) + "\n"


# The child of one --scale measurement: a fresh interpreter, the fastpipe first on its path.
SCALE_CHILD = """
import json, sys, time
from pathlib import Path


def peak_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


import h5py  # noqa: F401 - imported before the first reading, as pack imports it
import fastpipe
from fastpipe.pack import pack

root, out = Path(sys.argv[1]), Path(sys.argv[2])
before = peak_kib()
started = time.perf_counter()
report = pack(root, out, num_workers=2, check=False, progress=False, overwrite=True)
seconds = time.perf_counter() - started
print(json.dumps({"fastpipe": fastpipe.__file__, "before_kib": before, "peak_kib": peak_kib(),
                  "count": report.count, "seconds": seconds}))
"""
CLASSES = 1000


def tiny_tree(root: Path, n: int) -> Path:
    """An ImageFolder tree of ``n`` one-byte files in 1,000 class folders (made once)."""
    tree = root / f"tiny-{n}"
    done = tree / ".complete"
    if done.exists():
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    for k in range(CLASSES):
        (tree / f"c{k:03d}").mkdir(parents=True)
    for i in range(n):
        fd = os.open(tree / f"c{i % CLASSES:03d}" / f"{i:07d}.jpg",
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.write(fd, b"x")
        os.close(fd)
    done.touch()
    return tree


def bench_scale(args: argparse.Namespace) -> str:
    work = Path(args.workdir or tempfile.gettempdir()) / "fastpipe-bench-pack-scale"
    work.mkdir(parents=True, exist_ok=True)
    sides = [("current", _harness.REPO)] + ([("baseline", args.baseline)] if args.baseline
                                            else [])
    results: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for n in sorted(args.scale):
        tree = tiny_tree(work, n)
        for folder, _, files in os.walk(tree):  # warm: both sides find the files cached
            for file in files:
                os.stat(os.path.join(folder, file))
        for name, checkout in sides:
            out = work / f"pack-{n}.h5"
            env = dict(os.environ, PYTHONPATH=str(checkout))
            done = subprocess.run([sys.executable, "-c", SCALE_CHILD, str(tree), str(out)],
                                  capture_output=True, text=True, env=env, cwd=work, check=False)
            if done.returncode:
                raise SystemExit(f"the {name} measurement of {n} inputs failed:\n{done.stderr}")
            record = json.loads(done.stdout.strip().splitlines()[-1])
            if not record["fastpipe"].startswith(str(Path(checkout).resolve())):
                raise SystemExit(f"the {name} child imported {record['fastpipe']}")
            record["n"] = n
            results[name].append(record)
            print(f"{name:<9} {n:>9} inputs: peak {record['peak_kib'] / 1024:8.1f} MiB "
                  f"(after imports {record['before_kib'] / 1024:.1f}), "
                  f"{n / record['seconds']:8.0f} files/s", flush=True)
            shutil.rmtree(out.with_name(out.name + ".shards"), ignore_errors=True)
            out.unlink(missing_ok=True)
    lines = [
        f"`pack`'s main process, an ImageFolder tree of N one-byte files in {CLASSES} class "
        "folders, 2 worker processes, no decode check, default (virtual) merge; each size in a "
        f"fresh interpreter. Machine: {_harness.machine()}.",
        "",
        "| fastpipe | inputs | peak after imports | peak after pack | held per input | files/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, records in results.items():
        previous = None
        for r in records:
            per = "" if previous is None else \
                f"{(r['peak_kib'] - previous['peak_kib']) * 1024 / (r['n'] - previous['n']):.0f} B"
            lines.append(f"| {name} | {r['n']} | {r['before_kib'] / 1024:.0f} MiB | "
                         f"{r['peak_kib'] / 1024:.0f} MiB | {per} | {r['n'] / r['seconds']:.0f} |")
            previous = r
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_pack",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--num-images", type=int, default=2048,
                        help="sample dataset size (default 2048)")
    parser.add_argument("--size", type=int, default=224,
                        help="array storage side and decode size (default 224)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2,
                        help="DataLoader worker processes (default 2)")
    parser.add_argument("--reads", type=int, default=4000, help="random reads per raw-access row")
    parser.add_argument("--workdir", help="where to write the packs (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the packs afterwards")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--scale", type=int, nargs="+", metavar="N",
                        help="measure the packing process's memory per input at these numbers "
                             "of tiny inputs instead (e.g. 100000 1000000)")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="with --scale: measure every size with this checkout's fastpipe "
                             "too")
    args = parser.parse_args(argv)
    if args.baseline and not args.scale:
        parser.error("--baseline is measured on the --scale rows only: add --scale N [N ...] "
                     "(e.g. --scale 100000 1000000), or drop --baseline")
    if args.scale:
        _harness.finish(bench_scale(args), args)
        return 0
    global MIN_SECONDS
    if args.quick:
        args.num_images, args.size, args.batch_size, args.reads = 96, 64, 16, 200
        MIN_SECONDS = 0.2
    _harness.finish(to_markdown(run(args), args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
