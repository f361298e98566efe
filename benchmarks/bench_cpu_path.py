"""The CPU image path, end to end: train transforms to normalized float NCHW batches on the CPU.

Every measurement runs in its own, fresh process (pipelines sharing a process distort each other:
a DALI pipeline alive beside a DataLoader moved both by up to a third), round-robin over
``--repeat`` rounds, after an untimed warm-up epoch, on three image sets (the built-in sample set,
ImageNet-like photos and 1-2k px photos, see ``_photos.py``), with the same settings: 2 workers (or
DALI threads), batch 64, RandomResizedCrop 224 + horizontal flip, output float32 (N, 3, 224, 224)
normalized with the ImageNet mean and std. Reported: median images/s per pipeline, the ratio to the
best baseline (torchvision + PIL, torchvision.transforms.v2 on decode_jpeg, DALI CPU), and the CPU
time all processes spent per image (less sensitive to other load on the machine than images/s). The
main process runs torch with ``--main-threads`` (1) threads: with as many workers as cores, more
threads for the main process's normalize only contend with the workers. The ceiling row is a
full-size libjpeg-turbo decode alone (simplejpeg, no crop, no resize, no batching) in 2 processes.

    python benchmarks/bench_cpu_path.py                 # full run (a few minutes)
    python benchmarks/bench_cpu_path.py --quick         # smoke run, seconds
    python benchmarks/bench_cpu_path.py --markdown docs/cpu-path-table.md

Compare ratios within one run only; absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastpipe import IMAGENET_MEAN as MEAN  # noqa: E402
from fastpipe import IMAGENET_STD as STD  # noqa: E402

BASELINES = ("torchvision + PIL", "torchvision v2 on decode_jpeg", "DALI CPU (fastpipe.dali)")


class Skip(Exception):
    """A pipeline that cannot run here; the message says why."""


# ---------------------------------------------------------------- pipelines
# Each builder returns a callable that yields float32 normalized batches for ``epochs`` epochs.
# Module-level functions (not lambdas) so the datasets pickle under any start method.

def _decode_jpeg_file(path: str) -> torch.Tensor:
    import torchvision.io

    return torchvision.io.decode_jpeg(torchvision.io.read_file(path))


def _torch_loader(dataset, cfg, collate_fn=None) -> DataLoader:
    # One long pass over ``epochs`` reshuffled permutations: no idle workers at epoch boundaries,
    # and the iterator shuts its workers down when it is exhausted.
    sampler = RandomSampler(dataset, num_samples=len(dataset) * cfg.epochs)
    return DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                      num_workers=cfg.workers, collate_fn=collate_fn)


def torchvision_pil(cfg) -> Iterable[torch.Tensor]:
    import torchvision.datasets
    import torchvision.transforms as T

    # The recipe of torchvision's classification references (PILToTensor, not the slower ToTensor).
    transform = T.Compose([
        T.RandomResizedCrop(cfg.size), T.RandomHorizontalFlip(), T.PILToTensor(),
        T.ConvertImageDtype(torch.float32), T.Normalize(MEAN, STD),
    ])
    dataset = torchvision.datasets.ImageFolder(cfg.root, transform=transform)
    return (images for images, _ in _torch_loader(dataset, cfg))


def torchvision_v2(cfg) -> Iterable[torch.Tensor]:
    import torchvision.datasets
    from torchvision.transforms import v2

    transform = v2.Compose([
        v2.RandomResizedCrop(cfg.size, antialias=True), v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
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
                        num_workers=cfg.workers, device="cpu", mean=MEAN, std=STD)

    def batches() -> Iterator[torch.Tensor]:
        for _ in range(cfg.epochs):
            for images, _labels in loader:
                yield _normalized(images)

    return batches()


def fastpipe_folder(cfg) -> Iterable[torch.Tensor]:
    from fastpipe.data import ImageFolder, fast_collate

    dataset = ImageFolder(cfg.root, train=True, size=cfg.size)
    return (_normalized(images) for images, _ in _torch_loader(dataset, cfg, fast_collate))


def fastpipe_folder_uint8(cfg) -> Iterable[torch.Tensor]:
    from fastpipe.data import ImageFolder, fast_collate

    dataset = ImageFolder(cfg.root, train=True, size=cfg.size)
    return (images for images, _ in _torch_loader(dataset, cfg, fast_collate))


def _thread_loaded(dataset, cfg) -> Iterable[torch.Tensor]:
    from fastpipe import DataLoaderX
    from fastpipe.data import fast_collate

    sampler = RandomSampler(dataset, num_samples=len(dataset) * cfg.epochs)
    loader = DataLoaderX(dataset, batch_size=cfg.batch_size, sampler=sampler,
                         num_workers=cfg.workers, collate_fn=fast_collate, worker_method="thread")
    return (_normalized(images) for images, _ in loader)


def fastpipe_image_loader(cfg) -> Iterable[torch.Tensor]:
    from fastpipe import image_loader

    loader = image_loader(cfg.root, cfg.batch_size, train=True, size=cfg.size, device="cpu",
                          num_workers=cfg.workers, seed=0)

    def batches() -> Iterator[torch.Tensor]:
        for _ in range(cfg.epochs):
            for images, _labels in loader:
                yield images
        loader.close()

    return batches()


def fastpipe_folder_threads(cfg) -> Iterable[torch.Tensor]:
    from fastpipe.data import ImageFolder

    return _thread_loaded(ImageFolder(cfg.root, train=True, size=cfg.size), cfg)


def _h5_batches(cfg, transcode: bool, threads: bool = False) -> Iterable[torch.Tensor]:
    if importlib.util.find_spec("h5py") is None:
        raise Skip("h5py is not installed (pip install 'fastpipe[hdf5]')")
    from fastpipe.data import H5Dataset, ImageDecoder, fast_collate

    out = _pack_path(cfg.root, cfg, transcode)
    if not out.exists():
        raise Skip(f"{out} was not packed")
    dataset = H5Dataset(out, decoder=ImageDecoder(train=True, size=cfg.size))
    if threads:
        return _thread_loaded(dataset, cfg)
    return (_normalized(images) for images, _ in _torch_loader(dataset, cfg, fast_collate))


def fastpipe_h5(cfg) -> Iterable[torch.Tensor]:
    return _h5_batches(cfg, transcode=False)


def fastpipe_h5_transcoded(cfg) -> Iterable[torch.Tensor]:
    return _h5_batches(cfg, transcode=True)


def fastpipe_h5_transcoded_threads(cfg) -> Iterable[torch.Tensor]:
    return _h5_batches(cfg, transcode=True, threads=True)


def _pack_path(root: str, cfg, transcode: bool = False) -> Path:
    return Path(cfg.workdir) / f"{Path(root).name}-{'transcoded' if transcode else 'bytes'}.h5"


def _normalized(images: torch.Tensor) -> torch.Tensor:
    if images.dtype == torch.uint8:
        from fastpipe.ops import normalize

        return normalize(images, MEAN, STD)
    return images


PIPELINES: dict[str, tuple[Callable[[Any], Iterable[torch.Tensor]], str]] = {
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
        fastpipe_folder_uint8,
        "for reference: no normalize, not the same output as the rows above"),
}
OPTIONAL = (dali_cpu, fastpipe_h5, fastpipe_h5_transcoded, fastpipe_h5_transcoded_threads)


# ---------------------------------------------------------------- the decode ceiling

def _decode_files(paths: list[str], epochs: int) -> int:
    import simplejpeg

    for _ in range(epochs):
        for path in paths:
            with open(path, "rb") as file:
                simplejpeg.decode_jpeg(file.read())
    return len(paths) * epochs


def decode_ceiling(cfg) -> tuple[float, int]:
    paths = sorted(str(p) for p in Path(cfg.root).rglob("*.jpg"))
    shards = [paths[i::cfg.workers] for i in range(cfg.workers)]
    with concurrent.futures.ProcessPoolExecutor(cfg.workers) as pool:
        list(pool.map(_warm_up, range(cfg.workers)))  # start the processes before timing
        start = time.perf_counter()
        done = sum(pool.map(_decode_files, shards, [cfg.epochs] * cfg.workers))
        rate = done / (time.perf_counter() - start)
    return rate, done


def _warm_up(_: int) -> int:
    import simplejpeg  # noqa: F401 - import outside the timed part

    return 0


# ---------------------------------------------------------------- measuring

def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (DataLoader workers are joined
    when their iterator is exhausted, a process pool when it shuts down)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(batches: Iterable[torch.Tensor], cfg) -> tuple[float, int]:
    """Images/s after ``cfg.warmup`` batches (worker start-up and first reads are not timed), and
    the number of images of the whole run."""
    count, start, total = 0, None, 0
    for i, images in enumerate(batches):
        total += images.shape[0]
        if images.dtype != torch.float32 and not cfg.allow_uint8:
            raise AssertionError(f"expected float32 batches, got {images.dtype}")
        if tuple(images.shape[1:]) != (3, cfg.size, cfg.size):
            raise AssertionError(f"expected (N, 3, {cfg.size}, {cfg.size}) batches, got "
                                 f"{tuple(images.shape)}")
        if i == cfg.warmup - 1:
            start = time.perf_counter()
        elif start is not None:
            count += images.shape[0]
    if start is None or count == 0:
        raise RuntimeError("too few batches to time: raise --images or --epochs")
    return count / (time.perf_counter() - start), total


def normalize_cost(cfg) -> float:
    """Milliseconds for fastpipe.ops.normalize on one uint8 batch, alone (median of 10)."""
    from fastpipe.ops import normalize

    images = torch.randint(0, 256, (cfg.batch_size, 3, cfg.size, cfg.size), dtype=torch.uint8)
    normalize(images, MEAN, STD)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        normalize(images, MEAN, STD)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def machine_description() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = [f"torch {torch.__version__}"]
    for module in ("torchvision", "simplejpeg", "PIL", "nvidia.dali"):
        try:
            mod = __import__(module, fromlist=["__version__"])
            versions.append(f"{module} {getattr(mod, '__version__', '?')}")
        except ImportError:
            versions.append(f"{module} not installed")
    extension = importlib.util.find_spec("fastpipe._C") is not None
    return (f"{cpu}, {os.cpu_count()} logical cores, Python {platform.python_version()}; "
            f"{', '.join(versions)}; fastpipe.ops.normalize: "
            f"{'compiled extension' if extension else 'pure-PyTorch reference'}")


BASELINE_SUFFIX = " [baseline checkout]"
# The rows whose code an earlier fastpipe also has: --baseline-checkout measures them with it.
COMPARABLE = ("fastpipe ImageFolder", "fastpipe HDF5 pack (bytes)",
              "fastpipe ImageFolder, uint8 out")


def _child(args) -> int:
    """One measurement in this fresh process: build the pipeline, warm up, time, report as JSON."""
    name = args.child
    if args.fastpipe_path:
        sys.path.insert(0, args.fastpipe_path)  # before any import of fastpipe
    builder = PIPELINES[name][0] if name != "ceiling" else None
    args.allow_uint8 = builder is fastpipe_folder_uint8
    result: dict[str, Any] = {"name": name, "pid": os.getpid()}
    try:
        if builder is None:
            cpu_start = cpu_seconds()
            rate, total = decode_ceiling(args)
        else:
            batches = builder(args)
            cpu_start = cpu_seconds()  # after one-time set-up (DALI's pipeline build)
            rate, total = measure(batches, args)
        result.update(rate=rate, cpu_ms=(cpu_seconds() - cpu_start) / total * 1e3)
    except Skip as exc:
        result["note"] = f"skipped: {exc}"
    except Exception as exc:
        # Parts built by other modules (DALI, HDF5) must not sink the whole run; their failure
        # is reported in the table instead.
        if builder not in OPTIONAL:
            raise
        result["note"] = f"failed: {type(exc).__name__}: {exc}"
    Path(args.result).write_text(json.dumps(result))
    return 0


def _run_isolated(name: str, root: str, args, timeout: float = 1800) -> dict[str, Any]:
    """Runs one measurement in a fresh interpreter: pipelines that share a process distort each
    other (a DALI pipeline alive beside a DataLoader moved both by up to a third)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        result_path = out.name
    extra = []
    if name.endswith(BASELINE_SUFFIX):
        name = name[: -len(BASELINE_SUFFIX)]
        extra = ["--fastpipe-path", str(args.baseline_checkout)]
    command = [sys.executable, str(Path(__file__).resolve()), *extra, "--child", name, "--result",
               result_path, "--root", root, "--workdir", args.workdir, "--epochs", str(args.epochs),
               "--warmup", str(args.warmup), "--workers", str(args.workers),
               "--main-threads", str(args.main_threads), "--batch-size", str(args.batch_size),
               "--size", str(args.size)]
    try:
        subprocess.run(command, check=True, timeout=timeout)
        result = json.loads(Path(result_path).read_text())
        if extra:
            result["name"] += BASELINE_SUFFIX
        return result
    finally:
        Path(result_path).unlink(missing_ok=True)


def _image_sets(args) -> dict[str, str]:
    if args.root:
        return {"your images": str(args.root)}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _photos import photo_set

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


def _prepare_pack(root: str, args) -> None:
    """Packs the set once, before any timing, so that no measured process pays for it."""
    if importlib.util.find_spec("h5py") is None:
        return
    from fastpipe.pack import pack

    for name, transcode in (("fastpipe HDF5 pack (bytes)", False),
                            ("fastpipe HDF5 pack (transcoded)", True)):
        out = _pack_path(root, args, transcode)
        if any(n.startswith(name) for n in args.names) and not out.exists():
            try:
                pack(root, out, storage="bytes", transcode=transcode, progress=False)
            except ValueError as exc:  # transcode without fastpipe._jpeg: the row says why
                print(f"{name}: not packed: {exc}", flush=True)


def _measured(args) -> list[str]:
    """The measurements of a round, in order: each pipeline (then, with --baseline-checkout, the
    same pipeline with the other checkout's fastpipe, right after it), then the ceiling."""
    names = []
    for name in args.names:
        names.append(name)
        if args.baseline_checkout and name in COMPARABLE:
            names.append(name + BASELINE_SUFFIX)
    return names + ["ceiling"]


def _table(set_name: str, root: str, rows: dict[str, list[dict[str, Any]]], args) -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _photos import describe

    medians = {n: statistics.median(r["rate"] for r in rs) for n, rs in rows.items()
               if rs and all("rate" in r for r in rs)}
    best_name = max((n for n in BASELINES if n in medians), key=medians.get, default=None)
    best = medians.get(best_name) if best_name else None
    lines = [
        f"### {set_name}", "",
        f"{describe(Path(root))}. {args.workers} workers, batch {args.batch_size}, "
        f"RandomResizedCrop {args.size} + flip, float32 NCHW normalized output; each measurement "
        f"in its own process, median of {args.repeat} interleaved round(s) of {args.epochs} "
        f"epoch(s) after a warm-up of {args.warmup} batches. CPU ms/image: user + system time of "
        "all the measuring process's processes per image.", "",
        "| pipeline | images/s | vs best baseline | CPU ms/image | how |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name in _measured(args):
        base = name.removesuffix(BASELINE_SUFFIX)
        how = PIPELINES[base][1] if base in PIPELINES else (
            "simplejpeg.decode_jpeg of every file, no crop, resize or batching")
        if base != name:
            how = (f"the row above, with the fastpipe of {args.baseline_checkout} "
                   f"({args.baseline_label})")
        label = name if base in PIPELINES else (
            f"ceiling: full-size decode only, {args.workers} processes")
        if name in medians:
            ratio = f"{medians[name] / best:.2f}x" if best else "n/a"
            cpu = statistics.median(r["cpu_ms"] for r in rows[name])
            lines.append(f"| {label} | {medians[name]:.0f} | {ratio} | {cpu:.2f} | {how} |")
        else:
            note = next((r.get("note") for r in rows.get(name, []) if r.get("note")), "not run")
            lines.append(f"| {label} | - | - | - | {note} |")
    if best_name:
        lines += ["", f"Best baseline: {best_name}."]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small dataset, one round")
    parser.add_argument("--images", type=int, default=None,
                        help="images per set (default 1024, quick 256)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="timed epochs per measurement (default 3, quick 1)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds; the median is reported (default 3, quick 1)")
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
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only pipelines whose name contains one of these words")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="write the results tables to this file")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every measurement (with its PID) here")
    parser.add_argument("--baseline-checkout", type=Path, default=None,
                        help="also measure the fastpipe rows with the fastpipe package of this "
                             "checkout (e.g. a git worktree of an earlier commit, built in place), "
                             "each in its own process: before and after in the same run")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fastpipe-path", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.images = args.images or (256 if args.quick else 1024)
    args.epochs = args.epochs or (1 if args.quick else 3)
    args.repeat = args.repeat or (1 if args.quick else 3)
    warmup = args.warmup
    torch.set_num_threads(max(1, args.main_threads))
    if args.child:
        return _child(args)

    args.names = [n for n in PIPELINES if not args.only
                  or any(w.lower() in n.lower() for w in args.only)]
    args.baseline_label = ""
    if args.baseline_checkout:
        described = subprocess.run(["git", "-C", str(args.baseline_checkout), "log", "-1",
                                    "--format=%h %s"], capture_output=True, text=True)
        args.baseline_label = described.stdout.strip()[:60] or "not a git checkout"
    lines = [f"Machine: {machine_description()}.", ""]
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-") as workdir:
        args.workdir = workdir
        for set_name, root in _image_sets(args).items():
            _prepare_pack(root, args)
            # An untimed warm-up epoch of this set (the sets differ in size).
            files = sum(1 for _ in Path(root).rglob("*.jpg"))
            args.warmup = warmup or (1 if args.quick else max(2, files // args.batch_size))
            rows: dict[str, list[dict[str, Any]]] = {n: [] for n in _measured(args)}
            for round_ in range(args.repeat):
                for name in _measured(args):
                    if any("note" in r for r in rows[name]):
                        continue
                    result = _run_isolated(name, root, args)
                    rows[name].append(result)
                    records.append({"set": set_name, "round": round_, **result})
                    shown = (f"{result['rate']:8.1f} images/s {result['cpu_ms']:6.2f} CPU ms/image"
                             if "rate" in result else result["note"])
                    print(f"[{set_name}, round {round_ + 1}/{args.repeat}] {name:48s} {shown} "
                          f"(pid {result['pid']})", flush=True)
            lines += _table(set_name, root, rows, args)
    lines += [f"fastpipe.ops.normalize alone on one uint8 batch ({args.batch_size}x3x{args.size}x"
              f"{args.size}, {torch.get_num_threads()} threads): {normalize_cost(args):.1f} ms."]
    table = "\n".join(lines) + "\n"
    print()
    print(table)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table)
        print(f"wrote {args.markdown}")
    if args.json:
        args.json.write_text(
            json.dumps({"parent_pid": os.getpid(), "measurements": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
