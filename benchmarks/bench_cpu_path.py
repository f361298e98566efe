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

The FFCV rows (``--ffcv-python``, optional, never in CI) compare FFCV's loader with a fastpipe
bytes pack storing as many pixels, at each FFCV ``max_resolution`` of ``--max-side``; FFCV runs in
an interpreter of its own (see ``_ffcv.py`` for its install commands):

    python benchmarks/bench_cpu_path.py --sets imagenet --only FFCV DALI "ImageFolder, threads" \
        --ffcv-python /work/ffcv-venv/bin/python --max-side 256 512

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
    return _epochs(loader, cfg)


def _epochs(loader, cfg) -> Iterator[torch.Tensor]:
    """The images of ``cfg.epochs`` epochs of a loader that runs epoch by epoch (DALI, the
    factory), then closes it."""
    for _ in range(cfg.epochs):
        for images, _labels in loader:
            yield _normalized(images)
    loader.close()


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
    return _epochs(loader, cfg)


def fastpipe_folder_threads(cfg) -> Iterable[torch.Tensor]:
    from fastpipe.data import ImageFolder

    return _thread_loaded(ImageFolder(cfg.root, train=True, size=cfg.size), cfg)


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
    return (_normalized(images) for images, _ in _torch_loader(dataset, cfg, fast_collate))


def _h5_batches(cfg, transcode: bool, threads: bool = False) -> Iterable[torch.Tensor]:
    return _pack_batches(_pack_path(cfg.root, cfg, transcode), cfg, threads)


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


# ---------------------------------------------------------------- FFCV, at the same stored pixels
# Rows measured once per FFCV max_resolution M (--max-side): FFCV's loader in its own interpreter
# (--ffcv-python), and a fastpipe bytes pack storing as many pixels.

def _same_pixels_batches(cfg, threads: bool) -> Iterable[torch.Tensor]:
    return _pack_batches(_same_pixels_pack_path(cfg.root, cfg, cfg.ffcv_resolution), cfg, threads)


def fastpipe_h5_max_side(cfg) -> Iterable[torch.Tensor]:
    return _same_pixels_batches(cfg, threads=False)


def fastpipe_h5_max_side_threads(cfg) -> Iterable[torch.Tensor]:
    return _same_pixels_batches(cfg, threads=True)


def ffcv(cfg) -> Iterable[torch.Tensor]:
    if importlib.util.find_spec("ffcv") is None:
        raise Skip(f"ffcv is not installed in {sys.executable}; {FFCV_INSTALL}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _ffcv

    beton = _beton_path(cfg.root, cfg, cfg.ffcv_resolution)
    if not beton.exists():
        raise Skip(f"{beton} was not written")
    # numba compiles FFCV's pipeline during the first batch (tens of CPU seconds): one-time
    # set-up, like DALI's pipeline build, so one whole epoch runs before the CPU clock starts
    # (a partial one would leave FFCV's loading thread running); its cost is reported apart.
    start, cpu_start = time.perf_counter(), cpu_seconds()
    loader = _ffcv.loader(beton, cfg)
    for _ in loader:
        pass
    cfg.setup = {"setup_s": time.perf_counter() - start, "setup_cpu_s": cpu_seconds() - cpu_start}
    return _ffcv.batches(loader, cfg.epochs)


def _same_pixels_pack_path(root: str, cfg, max_resolution: int) -> Path:
    return Path(cfg.workdir) / f"{Path(root).name}-transcoded-as-ffcv-{max_resolution}.h5"


def _beton_path(root: str, cfg, max_resolution: int) -> Path:
    return Path(cfg.workdir) / f"{Path(root).name}-{max_resolution}.beton"


PIPELINES.update({
    "FFCV": (
        ffcv,
        "FFCV Loader (its own venv, --ffcv-python) on a .beton of RGBImageField(write_mode='jpg', "
        "max_resolution=M, jpeg_quality=90): RandomResizedCrop decoder, flip, NormalizeImage "
        "float32, ToTensor, ToTorchImage (channels-last); 2 numba threads, RANDOM order, "
        "os_cache"),
    "fastpipe HDF5 pack (transcoded), FFCV's pixels": (
        fastpipe_h5_max_side,
        "pack(storage='bytes', max_side=S, quality=90, transcode=True), S chosen so the pack "
        "stores as many pixels as FFCV at M; H5Dataset + ImageDecoder, fast_collate, normalize"),
    "fastpipe HDF5 pack (transcoded), FFCV's pixels, threads": (
        fastpipe_h5_max_side_threads,
        "the row above, loaded by threads of the main process instead of worker processes"),
})
OPTIONAL += (fastpipe_h5_max_side, fastpipe_h5_max_side_threads, ffcv)
# Rows measured once per FFCV max_resolution (--max-side), named "<row> @ M".
PER_RESOLUTION = ("FFCV", "fastpipe HDF5 pack (transcoded), FFCV's pixels",
                  "fastpipe HDF5 pack (transcoded), FFCV's pixels, threads")
FFCV_COMMANDS = ("apt-get install -y libopencv-dev libturbojpeg0-dev pkg-config; "
                 "python3.11 -m venv /work/ffcv-venv; "
                 "/work/ffcv-venv/bin/pip install torch==2.13.0 pillow ffcv")
FFCV_INSTALL = (f"install FFCV in a venv of its own ({FFCV_COMMANDS}) and pass "
                "--ffcv-python /work/ffcv-venv/bin/python")


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


def ffcv_description(python: Path) -> str:
    """The versions in the FFCV interpreter, asked in a process of its own."""
    code = ("import importlib.metadata as m, platform\n"
            "names = ('ffcv', 'numba', 'llvmlite', 'numpy', 'opencv-python', 'torch', 'pillow')\n"
            "found = []\n"
            "for name in names:\n"
            "    try:\n"
            "        found.append(f'{name} {m.version(name)}')\n"
            "    except m.PackageNotFoundError:\n"
            "        found.append(f'{name} not installed')\n"
            "print(f'Python {platform.python_version()}; ' + ', '.join(found))")
    try:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              timeout=120)
    except OSError as exc:
        return f"{python} does not run ({exc})"
    return f"{python}, " + (done.stdout.strip() or done.stderr.strip()[-300:])


BASELINE_SUFFIX = " [baseline checkout]"
# The rows whose code an earlier fastpipe also has: --baseline-checkout measures them with it.
COMPARABLE = ("fastpipe ImageFolder", "fastpipe HDF5 pack (bytes)",
              "fastpipe ImageFolder, uint8 out")


def _child(args) -> int:
    """One measurement in this fresh process: build the pipeline, warm up, time, report as JSON."""
    name = args.child
    if args.fastpipe_path:
        sys.path.insert(0, args.fastpipe_path)  # before any import of fastpipe
    base, args.ffcv_resolution = _split_resolution(name)
    builder = PIPELINES[base][0] if name != "ceiling" else None
    args.allow_uint8 = builder is fastpipe_folder_uint8
    args.setup = {}
    result: dict[str, Any] = {"name": name, "pid": os.getpid()}
    try:
        if builder is None:
            cpu_start = cpu_seconds()
            rate, total = decode_ceiling(args)
        else:
            batches = builder(args)
            # After one-time set-up (DALI's pipeline build, FFCV's compilation).
            cpu_start = cpu_seconds()
            rate, total = measure(batches, args)
        result.update(rate=rate, cpu_ms=(cpu_seconds() - cpu_start) / total * 1e3, **args.setup)
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


def _split_resolution(name: str) -> tuple[str, int | None]:
    """``"FFCV @ 256"`` -> ``("FFCV", 256)``; other names -> ``(name, None)``."""
    base, at, resolution = name.rpartition(" @ ")
    return (base, int(resolution)) if at and base in PER_RESOLUTION else (name, None)


def _run_isolated(name: str, root: str, args, timeout: float = 1800) -> dict[str, Any]:
    """Runs one measurement in a fresh interpreter: pipelines that share a process distort each
    other (a DALI pipeline alive beside a DataLoader moved both by up to a third)."""
    python = sys.executable
    if _split_resolution(name)[0] == "FFCV":
        if not args.ffcv_python:
            return {"name": name, "pid": None, "note": f"skipped: no --ffcv-python; {FFCV_INSTALL}"}
        python = str(args.ffcv_python)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        result_path = out.name
    extra = []
    if name.endswith(BASELINE_SUFFIX):
        name = name[: -len(BASELINE_SUFFIX)]
        extra = ["--fastpipe-path", str(args.baseline_checkout)]
    command = [python, str(Path(__file__).resolve()), *extra, "--child", name, "--result",
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


def _prepare_pack(root: str, args) -> None:
    """Packs the set once, before any timing, so that no measured process pays for it."""
    _prepare_same_pixels(root, args)
    if importlib.util.find_spec("h5py") is None:
        return
    for name, transcode in (("fastpipe HDF5 pack (bytes)", False),
                            ("fastpipe HDF5 pack (transcoded)", True)):
        out = _pack_path(root, args, transcode)
        if any(n.startswith(name) for n in args.names) and not out.exists():
            _pack_before_timing(name, root, out, transcode=transcode)


def _image_sizes(root: str) -> list[tuple[int, int]]:
    from PIL import Image

    sizes = []
    for path in sorted(Path(root).rglob("*.jpg")):
        with Image.open(path) as image:
            sizes.append(image.size)
    return sizes


def _ffcv_pixels(sizes: list[tuple[int, int]], max_resolution: int) -> int:
    """Pixels FFCV's ``RGBImageField(max_resolution=M)`` stores: the longer side brought down
    to M (OpenCV resize to ``int(ratio * size)``), smaller images as they are."""
    total = 0
    for width, height in sizes:
        ratio = max_resolution / max(width, height)
        total += int(ratio * width) * int(ratio * height) if ratio < 1 else width * height
    return total


def _fastpipe_pixels(sizes: list[tuple[int, int]], max_side: int) -> int:
    """Pixels ``pack(storage='bytes', max_side=S)`` stores: the shorter side brought down to S
    (``round(size * S / shorter)``), smaller images as they are."""
    total = 0
    for width, height in sizes:
        scale = max_side / min(width, height)
        total += (max(1, round(width * scale)) * max(1, round(height * scale)) if scale < 1
                  else width * height)
    return total


def matching_max_side(sizes: list[tuple[int, int]], max_resolution: int) -> int:
    """The ``max_side`` (a cap on the shorter side) whose fastpipe pack stores the number of
    pixels closest to FFCV's at ``max_resolution`` (a cap on the longer side) on these images."""
    target = _ffcv_pixels(sizes, max_resolution)
    return min(range(1, max_resolution + 1),
               key=lambda side: abs(_fastpipe_pixels(sizes, side) - target))


def _prepare_same_pixels(root: str, args) -> None:
    """Once per set and FFCV max_resolution M, before any timing: FFCV's .beton (written by the
    FFCV interpreter) and the fastpipe bytes pack of as many pixels."""
    wanted = [n for n in args.names if n in PER_RESOLUTION]
    if not args.ffcv_python and "FFCV" in wanted:
        wanted.remove("FFCV")
    if not wanted:
        return
    sizes = _image_sizes(root)
    for resolution in args.max_side:
        info = args.same_pixels.setdefault((root, resolution), {})
        side = matching_max_side(sizes, resolution)
        info.update(images=len(sizes), max_side=side,
                    ffcv_pixels=_ffcv_pixels(sizes, resolution) / len(sizes),
                    fastpipe_pixels=_fastpipe_pixels(sizes, side) / len(sizes))
        beton = _beton_path(root, args, resolution)
        if "FFCV" in wanted and args.ffcv_python and not beton.exists():
            script = Path(__file__).resolve().parent / "_ffcv.py"
            done = subprocess.run([str(args.ffcv_python), str(script), "write", root, str(beton),
                                   "--max-resolution", str(resolution), "--quality", "90",
                                   "--workers", str(args.workers)],
                                  capture_output=True, text=True, timeout=3600)
            if done.returncode:
                print(f"FFCV @ {resolution}: not written: {done.stderr.strip()[-2000:]}",
                      flush=True)
            else:
                info["beton"] = json.loads(done.stdout.strip().splitlines()[-1])
        out = _same_pixels_pack_path(root, args, resolution)
        if (any(n != "FFCV" for n in wanted) and importlib.util.find_spec("h5py") is not None
                and not out.exists()):
            if not _pack_before_timing(f"same-pixels pack @ {resolution}", root, out,
                                       max_side=side, quality=90, transcode=True,
                                       num_workers=args.workers, merge="copy"):
                continue
            info["pack_bytes"] = out.stat().st_size


def _measured(args) -> list[str]:
    """The measurements of a round, in order: each pipeline (then, with --baseline-checkout, the
    same pipeline with the other checkout's fastpipe, right after it), then the ceiling."""
    names = []
    for name in args.names:
        if name in PER_RESOLUTION:
            continue
        names.append(name)
        if args.baseline_checkout and name in COMPARABLE:
            names.append(name + BASELINE_SUFFIX)
    for resolution in args.max_side:
        names += [f"{name} @ {resolution}" for name in PER_RESOLUTION if name in args.names]
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
        base, resolution = _split_resolution(name.removesuffix(BASELINE_SUFFIX))
        how = PIPELINES[base][1] if base in PIPELINES else (
            "simplejpeg.decode_jpeg of every file, no crop, resize or batching")
        if base != name.removesuffix(BASELINE_SUFFIX):
            side = args.same_pixels.get((root, resolution), {}).get("max_side", "?")
            how = how.replace("max_resolution=M", f"max_resolution={resolution}").replace(
                "max_side=S", f"max_side={side}").replace("FFCV at M", f"FFCV at {resolution}")
        elif base != name:
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
    return lines + [""] + _same_pixels_table(root, rows, medians, args)


def _same_pixels_table(root: str, rows: dict[str, list[dict[str, Any]]],
                       medians: dict[str, float], args) -> list[str]:
    """fastpipe against FFCV when both store the same pixels, one line per max_resolution."""
    resolutions = [m for m in args.max_side if (root, m) in args.same_pixels]
    if not resolutions:
        return []
    lines = [
        "fastpipe against FFCV on the same stored pixels: FFCV's `max_resolution` M caps the "
        "longer side, fastpipe's `max_side` S the shorter one, so S is chosen to store as many "
        "pixels in all as FFCV at M on this set (FFCV re-encodes every image at quality 90; "
        "fastpipe re-encodes the larger ones at quality 90 and keeps the others' bytes). FFCV's "
        "set-up (numba compiling its pipeline, and its first epoch) runs before its CPU clock "
        "starts, like DALI's pipeline build; its CPU seconds are in the table.", "",
        "| M | S | pixels/image FFCV | pixels/image fastpipe | .beton MB | pack MB "
        "| FFCV set-up CPU s | fastpipe pack / FFCV | threads / FFCV |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in resolutions:
        info = args.same_pixels[(root, m)]
        ffcv_rate = medians.get(f"FFCV @ {m}")

        def ratio(name: str, m: int = m, ffcv_rate: float | None = ffcv_rate) -> str:
            rate = medians.get(f"{name} @ {m}")
            return f"{rate / ffcv_rate:.2f}x" if rate and ffcv_rate else "-"

        setup = [r["setup_cpu_s"] for r in rows.get(f"FFCV @ {m}", []) if "setup_cpu_s" in r]
        beton = info.get("beton", {})
        cells = [
            str(m), str(info["max_side"]),
            f"{beton.get('mean_pixels', info['ffcv_pixels']):.0f}",
            f"{info['fastpipe_pixels']:.0f}",
            f"{beton['bytes'] / 1e6:.1f}" if beton else "-",
            f"{info['pack_bytes'] / 1e6:.1f}" if "pack_bytes" in info else "-",
            f"{statistics.median(setup):.1f}" if setup else "-",
            ratio("fastpipe HDF5 pack (transcoded), FFCV's pixels"),
            ratio("fastpipe HDF5 pack (transcoded), FFCV's pixels, threads"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
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
    parser.add_argument("--ffcv-python", type=Path, default=None,
                        help="an interpreter with FFCV installed, for the FFCV rows (without it "
                             f"they are skipped); to install FFCV in a venv of its own: "
                             f"{FFCV_COMMANDS}")
    parser.add_argument("--max-side", type=int, nargs="+", default=[256],
                        help="FFCV max_resolution M (the longer side) of the FFCV rows; the "
                             "fastpipe rows beside them pack as many pixels (default 256)")
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
    if args.ffcv_python and not os.access(args.ffcv_python, os.X_OK):
        parser.error(f"--ffcv-python {args.ffcv_python} is not an executable file; "
                     f"{FFCV_INSTALL}")
    if not args.ffcv_python and not args.only:
        # The same-pixels fastpipe rows are there to be compared with FFCV: without FFCV, a full
        # run lists FFCV as skipped (with how to install it) and does not pack or time them.
        args.names = [n for n in args.names if n not in PER_RESOLUTION or n == "FFCV"]
    args.baseline_label = ""
    args.same_pixels = {}
    if args.baseline_checkout:
        described = subprocess.run(["git", "-C", str(args.baseline_checkout), "log", "-1",
                                    "--format=%h %s"], capture_output=True, text=True)
        args.baseline_label = described.stdout.strip()[:60] or "not a git checkout"
    lines = [f"Machine: {machine_description()}.", ""]
    if args.ffcv_python and "FFCV" in args.names:
        lines += [f"FFCV rows: {ffcv_description(args.ffcv_python)}.", ""]
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
