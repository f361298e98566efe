"""The CPU image path, end to end: train transforms to normalized float NCHW batches on the CPU.

Every pipeline below yields the same batches: RandomResizedCrop 224 + horizontal flip, float32
(N, 3, 224, 224) normalized with the ImageNet mean and std, batch 64, 2 workers (or DALI
threads), on three image sets (the built-in sample set, ImageNet-like photos and 1-2k px photos,
see ``_photos.py``). Each measurement runs in a fresh process, in interleaved rounds, after an
untimed warm-up epoch (``_harness.py``). Reported: median images/s per pipeline with its min-max,
the ratio to the best baseline (torchvision + PIL, torchvision.transforms.v2 on decode_jpeg, DALI
CPU), and the CPU time all processes spent per image (less sensitive to other load on the machine
than images/s). The main process runs torch with ``--main-threads`` (1) threads: with as many
workers as cores, more threads for the main process's normalize only contend with the workers.
The ceiling row is a full-size libjpeg-turbo decode alone (simplejpeg, no crop, no resize, no
batching) in 2 processes.

    python -m benchmarks.bench_cpu_path                 # full run (a few minutes)
    python -m benchmarks.bench_cpu_path --quick         # smoke run, seconds
    python -m benchmarks.bench_cpu_path --markdown docs/cpu-path-table.md
    python -m benchmarks.bench_cpu_path --baseline ../fastpipe-main   # before and after

The FFCV rows (``--ffcv-python``, optional, never in CI) compare FFCV's loader with a fastpipe
bytes pack storing as many pixels, at each FFCV ``max_resolution`` of ``--max-side``; FFCV runs in
an interpreter of its own (``_ffcv.py`` has its install commands):

    python -m benchmarks.bench_cpu_path --sets imagenet --only FFCV DALI "ImageFolder, threads" \\
        --ffcv-python /work/ffcv-venv/bin/python --max-side 256 512

Compare ratios within one run only; absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from benchmarks import _ffcv, _harness
from benchmarks._harness import Skip

BASELINES = ("torchvision + PIL", "torchvision v2 on decode_jpeg", "DALI CPU (fastpipe.dali)")

# ---------------------------------------------------------------- pipelines
# Each builder takes the row's configuration (root, size, batch_size, workers, epochs, mean, std,
# workdir) and returns the float32 normalized batches of ``epochs`` epochs. Module-level
# functions (not lambdas) so the datasets pickle under any start method. Only fastpipe's public
# API: a --baseline run calls them with another checkout's fastpipe.


def _decode_jpeg_file(path: str) -> torch.Tensor:
    import torchvision.io

    return torchvision.io.decode_jpeg(torchvision.io.read_file(path))


def _torch_loader(dataset, cfg, collate_fn=None) -> DataLoader:
    # One long pass over ``epochs`` reshuffled permutations: no idle workers at epoch boundaries,
    # and the iterator shuts its workers down when it is exhausted.
    sampler = RandomSampler(dataset, num_samples=len(dataset) * cfg.epochs)
    return DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                      num_workers=cfg.workers, collate_fn=collate_fn)


def _normalized(images: torch.Tensor, cfg) -> torch.Tensor:
    if images.dtype == torch.uint8:
        from fastpipe.ops import normalize

        return normalize(images, cfg.mean, cfg.std)
    return images


def _epochs(loader, cfg) -> Iterator[torch.Tensor]:
    """The images of ``cfg.epochs`` epochs of a loader that runs epoch by epoch (DALI, the
    factory), then closes it."""
    for _ in range(cfg.epochs):
        for images, _labels in loader:
            yield _normalized(images, cfg)
    loader.close()


def _thread_loaded(dataset, cfg) -> Iterable[torch.Tensor]:
    from fastpipe.data import fast_collate
    from fastpipe.loader import DataLoaderX

    sampler = RandomSampler(dataset, num_samples=len(dataset) * cfg.epochs)
    loader = DataLoaderX(dataset, batch_size=cfg.batch_size, sampler=sampler,
                         num_workers=cfg.workers, collate_fn=fast_collate, worker_method="thread")
    return (_normalized(images, cfg) for images, _ in loader)


def torchvision_pil(cfg) -> Iterable[torch.Tensor]:
    import torchvision.datasets
    import torchvision.transforms as T

    # The recipe of torchvision's classification references (PILToTensor, not the slower ToTensor).
    transform = T.Compose([
        T.RandomResizedCrop(cfg.size), T.RandomHorizontalFlip(), T.PILToTensor(),
        T.ConvertImageDtype(torch.float32), T.Normalize(cfg.mean, cfg.std),
    ])
    dataset = torchvision.datasets.ImageFolder(cfg.root, transform=transform)
    return (images for images, _ in _torch_loader(dataset, cfg))


def torchvision_v2(cfg) -> Iterable[torch.Tensor]:
    import torchvision.datasets
    from torchvision.transforms import v2

    transform = v2.Compose([
        v2.RandomResizedCrop(cfg.size, antialias=True), v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(cfg.mean, cfg.std),
    ])
    dataset = torchvision.datasets.ImageFolder(cfg.root, transform=transform,
                                               loader=_decode_jpeg_file)
    return (images for images, _ in _torch_loader(dataset, cfg))


def dali_cpu(cfg) -> Iterable[torch.Tensor]:
    if importlib.util.find_spec("nvidia.dali") is None:
        raise Skip("nvidia-dali is not installed (pip install 'fastpipe[dali]')")
    try:
        from fastpipe.dali import DALILoader
    except ImportError as exc:
        raise Skip(f"fastpipe.dali is not available in this checkout ({exc})") from None
    loader = DALILoader(cfg.root, batch_size=cfg.batch_size, train=True, size=cfg.size,
                        num_workers=cfg.workers, device="cpu", mean=cfg.mean, std=cfg.std)
    return _epochs(loader, cfg)


def fastpipe_folder(cfg) -> Iterable[torch.Tensor]:
    from fastpipe.data import ImageFolder, fast_collate

    dataset = ImageFolder(cfg.root, train=True, size=cfg.size)
    return (_normalized(images, cfg) for images, _ in _torch_loader(dataset, cfg, fast_collate))


def fastpipe_folder_threads(cfg) -> Iterable[torch.Tensor]:
    from fastpipe.data import ImageFolder

    return _thread_loaded(ImageFolder(cfg.root, train=True, size=cfg.size), cfg)


def fastpipe_image_loader(cfg) -> Iterable[torch.Tensor]:
    from fastpipe.factory import image_loader

    loader = image_loader(cfg.root, cfg.batch_size, train=True, size=cfg.size, device="cpu",
                          num_workers=cfg.workers, seed=0)
    return _epochs(loader, cfg)


def _pack_batches(out: Path, cfg, threads: bool) -> Iterable[torch.Tensor]:
    """Batches of the bytes pack ``out`` (written before timing) through H5Dataset +
    ImageDecoder, loaded by worker processes or by threads."""
    if importlib.util.find_spec("h5py") is None:
        raise Skip("h5py is not installed (pip install 'fastpipe[hdf5]')")
    from fastpipe.data import H5Dataset, ImageDecoder, fast_collate

    if not out.exists():
        raise Skip(f"{out} was not packed")
    dataset = H5Dataset(out, decoder=ImageDecoder(train=True, size=cfg.size))
    if threads:
        return _thread_loaded(dataset, cfg)
    return (_normalized(images, cfg) for images, _ in _torch_loader(dataset, cfg, fast_collate))


def _pack_path(root: str, workdir: str, transcode: bool = False) -> Path:
    return Path(workdir) / f"{Path(root).name}-{'transcoded' if transcode else 'bytes'}.h5"


def fastpipe_h5(cfg) -> Iterable[torch.Tensor]:
    return _pack_batches(_pack_path(cfg.root, cfg.workdir), cfg, threads=False)


def fastpipe_h5_transcoded(cfg) -> Iterable[torch.Tensor]:
    return _pack_batches(_pack_path(cfg.root, cfg.workdir, transcode=True), cfg, threads=False)


def fastpipe_h5_transcoded_threads(cfg) -> Iterable[torch.Tensor]:
    return _pack_batches(_pack_path(cfg.root, cfg.workdir, transcode=True), cfg, threads=True)


def fastpipe_uint8(cfg) -> Iterable[torch.Tensor]:
    from fastpipe.data import ImageFolder, fast_collate

    dataset = ImageFolder(cfg.root, train=True, size=cfg.size)
    return (images for images, _ in _torch_loader(dataset, cfg, fast_collate))


# Rows measured once per FFCV max_resolution M (--max-side), named "<row> @ M": FFCV's loader in
# its own interpreter (``_ffcv.py``) and a fastpipe bytes pack storing as many pixels.

def fastpipe_h5_ffcv_pixels(cfg) -> Iterable[torch.Tensor]:
    return _pack_batches(_ffcv.pack_path(cfg.root, cfg.workdir, cfg.resolution), cfg,
                         threads=False)


def fastpipe_h5_ffcv_pixels_threads(cfg) -> Iterable[torch.Tensor]:
    return _pack_batches(_ffcv.pack_path(cfg.root, cfg.workdir, cfg.resolution), cfg,
                         threads=True)


PIPELINES: dict[str, tuple[Callable[[Any], Iterable[torch.Tensor]] | None, str]] = {
    "torchvision + PIL": (
        torchvision_pil,
        "ImageFolder, PIL RandomResizedCrop/flip, PILToTensor, float, Normalize in workers"),
    "torchvision v2 on decode_jpeg": (
        torchvision_v2,
        "decode_jpeg tensors, v2 RandomResizedCrop/flip, ToDtype, Normalize in workers"),
    "DALI CPU (fastpipe.dali)": (dali_cpu, "fastpipe.dali.DALILoader(device='cpu', num_workers=2)"),
    "fastpipe ImageFolder": (
        fastpipe_folder,
        "fused decode/crop/resize/flip, fast_collate, fastpipe.ops.normalize in the main process"),
    "fastpipe ImageFolder, threads": (
        fastpipe_folder_threads,
        "as fastpipe ImageFolder, loaded by threads of the main process instead of worker "
        "processes"),
    "fastpipe.image_loader": (
        fastpipe_image_loader,
        "the factory on the ImageFolder, defaults (threads for 2 workers), normalized by its "
        "DataPrefetcher"),
    "fastpipe HDF5 pack (bytes)": (
        fastpipe_h5,
        "pack(storage='bytes'), H5Dataset + ImageDecoder, fast_collate, normalize"),
    "fastpipe HDF5 pack (transcoded)": (
        fastpipe_h5_transcoded,
        "pack(storage='bytes', transcode=True): a restart marker per MCU, crops decode only their "
        "segments"),
    "fastpipe HDF5 pack (transcoded), threads": (
        fastpipe_h5_transcoded_threads,
        "as the transcoded pack, loaded by threads of the main process instead of worker "
        "processes"),
    "fastpipe ImageFolder, uint8 out": (
        fastpipe_uint8,
        "for reference: no normalize, not the same output as the rows above"),
    "FFCV": (None, _ffcv.HOW),
    "fastpipe HDF5 pack (transcoded), FFCV's pixels": (
        fastpipe_h5_ffcv_pixels,
        "pack(storage='bytes', max_side=S, quality=90, transcode=True), S chosen so the pack "
        "stores as many pixels as FFCV at M; H5Dataset + ImageDecoder, fast_collate, normalize"),
    "fastpipe HDF5 pack (transcoded), FFCV's pixels, threads": (
        fastpipe_h5_ffcv_pixels_threads,
        "the row above, loaded by threads of the main process instead of worker processes"),
}
PER_RESOLUTION = ("FFCV", "fastpipe HDF5 pack (transcoded), FFCV's pixels",
                  "fastpipe HDF5 pack (transcoded), FFCV's pixels, threads")
# Parts built by other modules (DALI, HDF5, FFCV): their failure is a note, not the run's end.
OPTIONAL = (dali_cpu, fastpipe_h5, fastpipe_h5_transcoded, fastpipe_h5_transcoded_threads,
            fastpipe_h5_ffcv_pixels, fastpipe_h5_ffcv_pixels_threads)
CEILING = "ceiling"


# ---------------------------------------------------------------- the decode ceiling

def _decode_files(paths: list[str], epochs: int) -> int:
    import simplejpeg

    for _ in range(epochs):
        for path in paths:
            with open(path, "rb") as file:
                simplejpeg.decode_jpeg(file.read())
    return len(paths) * epochs


def _warm_up(_: int) -> int:
    import simplejpeg  # noqa: F401 - import outside the timed part

    return 0


def decode_ceiling(cfg) -> dict[str, float]:
    cpu_start = _harness.cpu_seconds()
    paths = sorted(str(p) for p in Path(cfg.root).rglob("*.jpg"))
    shards = [paths[i::cfg.workers] for i in range(cfg.workers)]
    with concurrent.futures.ProcessPoolExecutor(cfg.workers) as pool:
        list(pool.map(_warm_up, range(cfg.workers)))  # start the processes before timing
        start = time.perf_counter()
        done = sum(pool.map(_decode_files, shards, [cfg.epochs] * cfg.workers))
        rate = done / (time.perf_counter() - start)
    return {"rate": rate, "cpu_ms": (_harness.cpu_seconds() - cpu_start) / done * 1e3}


# ---------------------------------------------------------------- one measurement (the child)

def _split_resolution(name: str) -> tuple[str, int | None]:
    """``"FFCV @ 256"`` -> ``("FFCV", 256)``; other names -> ``(name, None)``."""
    base, at, resolution = name.rpartition(" @ ")
    return (base, int(resolution)) if at and base in PER_RESOLUTION else (name, None)


def optional(name: str) -> bool:
    base = _split_resolution(name)[0]
    return base == "FFCV" or PIPELINES.get(base, (None,))[0] in OPTIONAL


def measure(name: str, cfg) -> dict[str, float]:
    """One row, in this fresh process: build the pipeline, warm up, time (``_harness``)."""
    torch.set_num_threads(max(1, cfg.main_threads))
    if name == CEILING:
        return decode_ceiling(cfg)
    base, cfg.resolution = _split_resolution(name)
    uint8 = base == "fastpipe ImageFolder, uint8 out"

    def check(images: torch.Tensor) -> None:
        if images.dtype != torch.float32 and not uint8:
            raise AssertionError(f"expected float32 batches, got {images.dtype}")
        if tuple(images.shape[1:]) != (3, cfg.size, cfg.size):
            raise AssertionError(f"expected (N, 3, {cfg.size}, {cfg.size}) batches, got "
                                 f"{tuple(images.shape)}")

    if base == "FFCV":
        return _ffcv.measure(cfg.resolution, cfg, check)
    # Built before the harness starts its clocks: one-time set-up (DALI's pipeline build) apart.
    batches = PIPELINES[base][0](cfg)
    return _harness.time_batches(batches, cfg.warmup, check)


# ---------------------------------------------------------------- the run (the parent)

def _image_sets(args) -> dict[str, str]:
    if args.root:
        return {"your images": str(args.root)}
    from benchmarks._photos import photo_set

    sets = {}
    for kind in args.sets:
        if kind == "sample":
            from fastpipe.data import sample_images

            sets["built-in sample set"] = str(sample_images(num_images=args.images))
        elif kind == "imagenet":
            sets["ImageNet-like photos"] = str(photo_set("imagenet", args.images))
        else:
            sets["1-2k px photos"] = str(photo_set("photos", max(64, args.images // 4)))
    return sets


def _pack_before_timing(label: str, root: str, out: Path, **options: Any) -> bool:
    """Packs ``root`` into ``out`` (bytes storage) before any timing; False, with the reason
    printed for the report, where it cannot (transcoding without fastpipe._jpeg)."""
    from fastpipe.pack import pack

    try:
        pack(root, out, storage="bytes", progress=False, **options)
    except ValueError as exc:
        print(f"{label}: not packed: {exc}", flush=True)
        return False
    return True


def _prepare(root: str, args) -> dict[int, dict[str, Any]]:
    """Packs the set once, before any timing, so that no measured process pays for it; the
    FFCV comparison's files too (what they store is returned)."""
    has_h5py = importlib.util.find_spec("h5py") is not None
    if has_h5py:
        for name, transcode in (("fastpipe HDF5 pack (bytes)", False),
                                ("fastpipe HDF5 pack (transcoded)", True)):
            out = _pack_path(root, args.workdir, transcode)
            if any(n.startswith(name) for n in args.names if n not in PER_RESOLUTION) \
                    and not out.exists():
                _pack_before_timing(name, root, out, transcode=transcode)
    wanted = [n for n in args.names if n in PER_RESOLUTION]
    with_ffcv = "FFCV" in wanted and args.ffcv_python is not None
    with_pack = has_h5py and any(n != "FFCV" for n in wanted)
    if not (with_ffcv or with_pack):
        return {}
    return _ffcv.prepare(root, args.workdir, args.max_side, args.ffcv_python, with_ffcv,
                         with_pack, args.workers, _pack_before_timing)


def _measured(args) -> list[str]:
    """The measurements of a round, in order: each pipeline, the rows per FFCV resolution,
    then the ceiling."""
    names = [n for n in args.names if n not in PER_RESOLUTION]
    for resolution in args.max_side:
        names += [f"{name} @ {resolution}" for name in PER_RESOLUTION if name in args.names]
    return names + [CEILING]


def _python(args) -> Callable[[str], str]:
    def python(name: str) -> str:
        if _split_resolution(name)[0] != "FFCV":
            return sys.executable
        if not args.ffcv_python:
            raise Skip(f"no --ffcv-python; {_ffcv.INSTALL}")
        return str(args.ffcv_python)

    return python


def _table(set_name: str, root: str, runs: _harness.Runs, stored: dict[int, dict[str, Any]],
           args) -> list[str]:
    from benchmarks._photos import describe
    from fastpipe.profiling._table import Column, ResultTable

    names = _measured(args)
    rows = _harness.rows(names, runs, labels=lambda name: name if name != CEILING else
                         f"ceiling: full-size decode only, {args.workers} processes",
                         baseline_label=f"the row above, with the fastpipe of {args.baseline}")
    medians = {r.key: r.median for r in rows if r.median is not None}
    best = max((n for n in BASELINES if n in medians), key=medians.get, default=None)

    def how(row) -> str:
        if row.description:
            return row.description
        base, resolution = _split_resolution(row.key)
        if base == CEILING:
            return "simplejpeg.decode_jpeg of every file, no crop, resize or batching"
        text = PIPELINES[base][1]
        if resolution is not None:
            side = stored.get(resolution, {}).get("max_side", "?")
            text = text.replace("max_resolution=M", f"max_resolution={resolution}").replace(
                "max_side=S", f"max_side={side}").replace("FFCV at M", f"FFCV at {resolution}")
        return text

    table = ResultTable(rows, unit="images/s", name_header="pipeline", baseline=best,
                        ratio_header="vs best baseline",
                        after=[_harness.cpu_column(), Column("how", how, "<")])
    lines = [
        f"### {set_name}", "",
        f"{describe(Path(root))}. {args.workers} workers, batch {args.batch_size}, "
        f"RandomResizedCrop {args.size} + flip, float32 NCHW normalized output; each measurement "
        f"in its own process, median (and min-max) of {args.repeat} interleaved round(s) of "
        f"{args.epochs} epoch(s) after a warm-up of {args.warmup} batches. CPU ms/image: user + "
        "system time of all the measuring process's processes per image.", "",
        table.markdown(), "",
    ]
    if best:
        lines += [f"Best baseline: {best}.", ""]
    if args.baseline:
        lines += [f"Before and after: this checkout against {args.baseline_label}, each pair "
                  "in the same rounds.", "",
                  *_harness.before_after(names, runs), ""]
    setup_cpu = {m: [r["setup_cpu_s"] for r in runs.current.get(f"FFCV @ {m}", [])
                     if "setup_cpu_s" in r] for m in stored}
    return lines + _ffcv.same_pixels_table(stored, medians, setup_cpu, PER_RESOLUTION[1:])


def normalize_cost(args) -> float:
    """Milliseconds for fastpipe.ops.normalize on one uint8 batch, alone (median of 10)."""
    from fastpipe._constants import IMAGENET_MEAN, IMAGENET_STD
    from fastpipe.ops import normalize

    images = torch.randint(0, 256, (args.batch_size, 3, args.size, args.size), dtype=torch.uint8)
    normalize(images, IMAGENET_MEAN, IMAGENET_STD)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        normalize(images, IMAGENET_MEAN, IMAGENET_STD)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cpu_path",
                                     description=__doc__.split("\n\n")[0])
    _harness.add_arguments(parser, repeat=3)
    parser.add_argument("--images", type=int, default=None,
                        help="images per set (default 1024, quick 256)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="timed epochs per measurement (default 3, quick 1)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed batches first (default one epoch, quick 1)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--main-threads", type=int, default=1,
                        help="torch threads of the main process, where fastpipe normalizes "
                             "(default 1)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--sets", nargs="*", default=["sample", "imagenet", "photos"],
                        choices=["sample", "imagenet", "photos"],
                        help="image sets: the built-in sample set, ImageNet-like photos, 1-2k px "
                             "photos")
    parser.add_argument("--root", type=Path, default=None,
                        help="an ImageFolder tree of JPEGs instead of the sets")
    parser.add_argument("--ffcv-python", type=Path, default=None,
                        help="an interpreter with FFCV installed, for the FFCV rows (without it "
                             f"they are skipped); to install FFCV in a venv of its own: "
                             f"{_ffcv.COMMANDS}")
    parser.add_argument("--max-side", type=int, nargs="+", default=[256],
                        help="FFCV max_resolution M (the longer side) of the FFCV rows; the "
                             "fastpipe rows beside them pack as many pixels (default 256)")
    args = parser.parse_args(argv)
    _harness.check_baseline(parser, args.baseline)
    args.images = args.images or (256 if args.quick else 1024)
    args.epochs = args.epochs or (1 if args.quick else 3)
    args.repeat = _harness.rounds_of(args, 3)
    warmup = args.warmup
    torch.set_num_threads(max(1, args.main_threads))

    args.names = _harness.select(PIPELINES, args.only)
    if args.ffcv_python and not os.access(args.ffcv_python, os.X_OK):
        parser.error(f"--ffcv-python {args.ffcv_python} is not an executable file; "
                     f"{_ffcv.INSTALL}")
    if not args.ffcv_python and not args.only:
        # The same-pixels fastpipe rows are there to be compared with FFCV: without FFCV, a full
        # run lists FFCV as skipped (with how to install it) and does not pack or time them.
        args.names = [n for n in args.names if n not in PER_RESOLUTION or n == "FFCV"]
    from fastpipe._constants import IMAGENET_MEAN, IMAGENET_STD

    lines = [f"Machine: {_harness.machine()}.", "",
             f"fastpipe: {_harness.describe_checkout(_harness.REPO)}.", ""]
    if args.baseline:
        args.baseline_label = _harness.describe_checkout(args.baseline.resolve())
        lines += [f"Baseline rows: the fastpipe of {args.baseline_label}.", ""]
    if args.ffcv_python and "FFCV" in args.names:
        lines += [f"FFCV rows: {_ffcv.describe(args.ffcv_python)}.", ""]
    runs = _harness.Runs()
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-") as workdir:
        args.workdir = workdir
        for set_name, root in _image_sets(args).items():
            stored = _prepare(root, args)
            # An untimed warm-up epoch of this set (the sets differ in size).
            files = sum(1 for _ in Path(root).rglob("*.jpg"))
            args.warmup = warmup or (1 if args.quick else max(2, files // args.batch_size))
            config = {"root": root, "workdir": workdir, "epochs": args.epochs,
                      "warmup": args.warmup, "workers": args.workers,
                      "main_threads": args.main_threads, "batch_size": args.batch_size,
                      "size": args.size, "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
            set_runs = _harness.run_rounds(
                "bench_cpu_path", _measured(args), config, args.repeat, baseline=args.baseline,
                twin=lambda name: _split_resolution(name)[0] != "FFCV", python=_python(args),
                label=set_name)
            runs.records += set_runs.records
            lines += _table(set_name, root, set_runs, stored, args)
    lines += [f"fastpipe.ops.normalize alone on one uint8 batch ({args.batch_size}x3x{args.size}x"
              f"{args.size}, {torch.get_num_threads()} threads): {normalize_cost(args):.1f} ms."]
    _harness.finish("\n".join(lines) + "\n", args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
