"""Records: the speech-feature recipe's samples (``mix`` float32 (4, 16000) + ``zone0`` float32
(16000,), 320 KB a sample) read at random and through loaders with 2 workers.

Rows, each in its own process, in interleaved rounds (``_harness.run_rounds``):

- the hand-written baseline users have: a Dataset opening ``h5py.File`` lazily and reading
  ``f["mix"][i]``, ``f["zone0"][i]``, through ``torch.utils.data.DataLoader`` (2 processes);
- fastpipe's ``H5Dataset`` on the same plain file and on a records pack (``pack`` with
  ``merge="copy"``), through ``DataLoaderX`` with ``fast_collate`` and 2 worker processes or 2
  threads; and on a pack written by 2 packing workers (the default virtual merge of its shards);
- fastpipe's ``LMDBDataset`` on the same records packed into LMDB, through 2 threads;
- random access in one process (no loader) for each reader;
- FFCV (``--ffcv-python``, an interpreter of its own, see ``_ffcv.py``; h5py installed there
  too): a ``.beton`` of two ``NDArrayField`` s written from the plain file, read by FFCV's
  ``Loader`` (2 threads, RANDOM order, os_cache).

Every loader's first epoch is timed apart (``first epoch``: FFCV compiles its pipeline with numba
then; memory-mapped readers, FFCV's and fastpipe's, touch the files' pages for the first time in
the process) and the steady rate is measured over the epochs after it. Reported: samples/s, GB/s
of sample data, CPU ms per sample, the first epoch's samples/s. The files sit in the page cache
(the set is smaller than memory), so this measures the reader and the hand-off between workers and
the training loop, not the disk.

    python -m benchmarks.bench_records [--quick] [--samples N] [--repeat R] [--markdown FILE]
        [--ffcv-python /work/ffcv-venv/bin/python]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _ffcv, _harness

SAMPLE_BYTES = (4 * 16000 + 16000) * 4
ROWS = {
    "h5py Dataset, random access": "",
    "H5Dataset plain file, random access": "",
    "H5Dataset pack, random access": "",
    "h5py Dataset + DataLoader, 2 processes": "",
    "H5Dataset pack + DataLoaderX, 2 processes": "",
    "H5Dataset plain file + DataLoaderX, 2 threads": "",
    "H5Dataset pack + DataLoaderX, 2 threads": "",
    "H5Dataset virtual pack + DataLoaderX, 2 threads": "",
    "LMDBDataset pack + DataLoaderX, 2 threads": "",
    "FFCV, 2 NDArrayFields, 2 threads": "",
}
FFCV_ROW = "FFCV, 2 NDArrayFields, 2 threads"


class HandWritten:
    """The common hand-written Dataset: h5py opened on first use in each process."""

    def __init__(self, path: str) -> None:
        self.path, self.file = path, None
        import h5py

        with h5py.File(path, "r") as f:
            self.n = len(f["mix"])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        import h5py
        import torch

        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return (torch.from_numpy(self.file["mix"][index]),
                torch.from_numpy(self.file["zone0"][index]))

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, file=None)


def optional(name: str) -> bool:
    """FFCV, built elsewhere, may fail without sinking the run (a note in the table)."""
    return name == FFCV_ROW


def write_beton(plain: str, out: str) -> None:
    """Under FFCV's interpreter: the plain file's two arrays as two ``NDArrayField`` s."""
    import h5py
    import numpy as np
    from ffcv.fields import NDArrayField
    from ffcv.writer import DatasetWriter

    class Rows:
        def __init__(self) -> None:
            self.file = h5py.File(plain, "r")

        def __len__(self) -> int:
            return len(self.file["mix"])

        def __getitem__(self, i: int):
            return self.file["mix"][i], self.file["zone0"][i]

    writer = DatasetWriter(out, {
        "mix": NDArrayField(np.dtype("float32"), (4, 16000)),
        "zone0": NDArrayField(np.dtype("float32"), (16000,)),
    }, num_workers=1)
    writer.from_indexed_dataset(Rows())


def measure_ffcv(cfg: Any) -> dict[str, Any]:
    from ffcv.fields.decoders import NDArrayDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import ToTensor

    beton = Path(cfg.folder) / "records.beton"
    if not beton.exists():
        raise _harness.Skip(f"{beton} was not written")
    loader = Loader(str(beton), batch_size=cfg.batch_size, num_workers=2,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=False, pipelines={
                        "mix": [NDArrayDecoder(), ToTensor()],
                        "zone0": [NDArrayDecoder(), ToTensor()]})
    return time_loader(loader, cfg)


def time_loader(loader: Any, cfg: Any) -> dict[str, Any]:
    """The first epoch timed on its own, then the steady rate over ``cfg.epochs`` more."""
    start, count = time.perf_counter(), 0
    for mix, _zone0 in loader:
        count += len(mix)
    first = {"first_rate": count / (time.perf_counter() - start)}

    def epochs():
        for _ in range(cfg.epochs):
            for mix, _zone0 in loader:
                yield mix

    return {**_harness.time_batches(epochs(), warmup=cfg.warmup), **first}


def prepare(folder: Path, samples: int, ffcv_python: Path | None = None) -> None:
    """The plain file (as users write it: one dataset per key, a row per sample) and the pack."""
    import h5py
    import numpy as np

    from fastpipe.pack import pack

    rng = np.random.default_rng(0)
    with h5py.File(folder / "plain.h5", "w") as f:
        mix = f.create_dataset("mix", (samples, 4, 16000), np.float32)
        zone0 = f.create_dataset("zone0", (samples, 16000), np.float32)
        for start in range(0, samples, 256):
            n = min(256, samples - start)
            mix[start:start + n] = rng.standard_normal((n, 4, 16000), np.float32)
            zone0[start:start + n] = rng.standard_normal((n, 16000), np.float32)

    class Records:
        def __len__(self) -> int:
            return samples

        def __getitem__(self, i: int) -> dict:
            return {"mix": source["mix"][i], "zone0": source["zone0"][i]}

    with h5py.File(folder / "plain.h5", "r") as source:
        pack(Records(), folder / "pack.h5", merge="copy", progress=False)
        pack(Records(), folder / "virtual.h5", num_workers=2, progress=False)
        pack(Records(), folder / "records.lmdb", progress=False)
    if ffcv_python is not None:
        import subprocess

        subprocess.run([str(ffcv_python), "-m", "benchmarks.bench_records", "write-beton",
                        str(folder / "plain.h5"), str(folder / "records.beton")],
                       check=True, cwd=_harness.REPO)


def measure(name: str, cfg: Any) -> dict[str, Any]:
    if name == FFCV_ROW:
        return measure_ffcv(cfg)
    import numpy as np
    import torch

    from fastpipe import DataLoaderX
    from fastpipe.data import H5Dataset, LMDBDataset

    folder = Path(cfg.folder)
    plain, packed = str(folder / "plain.h5"), str(folder / "pack.h5")
    if name.startswith("h5py"):
        dataset: Any = HandWritten(plain)
    elif name.startswith("LMDB"):
        dataset = LMDBDataset(folder / "records.lmdb", fields=["mix", "zone0"])
    else:
        path = plain if "plain" in name else str(folder / "virtual.h5") if "virtual" in name \
            else packed
        dataset = H5Dataset(path, fields=["mix", "zone0"])
    n = len(dataset)
    if "random access" in name:
        order = np.random.default_rng(1).permutation(n)
        for i in order[:64]:  # warm-up: open the file, first reads
            dataset[int(i)]
        cpu, start = _harness.cpu_seconds(), time.perf_counter()
        for i in order:
            dataset[int(i)]
        seconds = time.perf_counter() - start
        return {"rate": n / seconds, "cpu_ms": (_harness.cpu_seconds() - cpu) / n * 1e3}
    kwargs = dict(batch_size=cfg.batch_size, shuffle=True, num_workers=2)
    if name.startswith("h5py"):
        loader: Any = torch.utils.data.DataLoader(dataset, **kwargs)
    else:
        from fastpipe.data import fast_collate

        loader = DataLoaderX(dataset, **kwargs, collate_fn=fast_collate,
                             worker_method="thread" if "threads" in name else "process")
    return time_loader(loader, cfg)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["write-beton"]:
        write_beton(*argv[1:3])
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_records",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ffcv-python", type=Path, default=None,
                        help=f"FFCV's interpreter, for the FFCV row; {_ffcv.COMMANDS}; h5py")
    _harness.add_arguments(parser, repeat=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.epochs = 256, 1
    rounds = _harness.rounds_of(args, 3)
    names = _harness.select(ROWS, args.only)
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-records-") as folder:
        ffcv = args.ffcv_python if FFCV_ROW in names else None
        prepare(Path(folder), args.samples, ffcv)

        def python(name: str) -> str:
            if name != FFCV_ROW:
                return sys.executable
            if ffcv is None:
                raise _harness.Skip(f"no --ffcv-python; {_ffcv.INSTALL}")
            return str(ffcv)

        config = {"folder": folder, "batch_size": args.batch_size, "epochs": args.epochs,
                  "warmup": 2 if not args.quick else 1}
        runs = _harness.run_rounds("bench_records", names, config, rounds, unit="samples/s",
                                   baseline=args.baseline, python=python,
                                   twin=lambda name: name != FFCV_ROW)
    base = "h5py Dataset + DataLoader, 2 processes"
    base_rate, ffcv_rate = ((statistics.median(r["rate"] for r in runs.current[row] if "rate" in r)
                             if any("rate" in r for r in runs.current.get(row, [])) else None)
                            for row in (base, FFCV_ROW))
    lines = [f"{args.samples} records of mix float32 (4, 16000) + zone0 float32 (16000,) "
             f"({SAMPLE_BYTES // 1000} KB), batch {args.batch_size}, {rounds} interleaved rounds "
             f"(median, min-max), each row in its own process. Machine: {_harness.machine()}.",
             "", "| row | samples/s (min-max) | GB/s | CPU ms/sample | first epoch samples/s | "
             "vs hand-written h5py + DataLoader | vs FFCV |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        measured = [r for r in runs.current.get(name, []) if "rate" in r]
        if not measured:
            lines.append(f"| {name} | {runs.note(name) or 'not run'} | | | | | |")
            continue
        rates = [r["rate"] for r in measured]
        rate = statistics.median(rates)
        cpu = statistics.median(r["cpu_ms"] for r in measured)
        loader_row = "random" not in name
        ratio = f"{rate / base_rate:.2f}x" if base_rate and loader_row else ""
        versus = f"{rate / ffcv_rate:.2f}x" if ffcv_rate and loader_row else ""
        first = (f"{statistics.median(r['first_rate'] for r in measured):.0f}"
                 if loader_row else "")
        lines.append(f"| {name} | {rate:.0f} ({min(rates):.0f}-{max(rates):.0f}) | "
                     f"{rate * SAMPLE_BYTES / 1e9:.2f} | {cpu:.2f} | {first} | {ratio} | "
                     f"{versus} |")
    if args.baseline is not None:
        lines += ["", *_harness.before_after(names, runs, unit="samples/s")]
    _harness.finish("\n".join(lines), args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
