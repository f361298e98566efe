"""FFCV in ``bench_cpu_path``: every line of the comparison with FFCV at the same stored pixels.

FFCV runs only under an interpreter of its own, in a virtual environment of its own: FFCV builds
a C extension against the system's OpenCV and libjpeg-turbo and brings numba and opencv-python,
which fastpipe's environment need not carry. The commands that installed it on Debian 12 with
Python 3.11 (ffcv 1.0.2, numba 0.68.1, numpy 2.4.6, opencv-python 5.0.0.93):

    apt-get install -y libopencv-dev libturbojpeg0-dev pkg-config
    python3.11 -m venv /work/ffcv-venv
    /work/ffcv-venv/bin/pip install torch==2.13.0 pillow   # the CPU wheel; no torchvision needed
    /work/ffcv-venv/bin/pip install ffcv

What runs where:

- in the benchmark's process (fastpipe's interpreter): :func:`prepare` writes, once per image
  set and FFCV ``max_resolution`` M and before any timing, FFCV's ``.beton`` (by running this
  module under FFCV's interpreter) and a fastpipe bytes pack of as many pixels;
  :func:`same_pixels_table` reports them;
- in FFCV's interpreter: ``python -m benchmarks._ffcv write ...`` writes a ``.beton`` and prints
  what it stored as JSON; :func:`measure` is the timed FFCV row, in a child the harness starts.
  Neither imports fastpipe (the mean and std come in the row's configuration).

FFCV's ``max_resolution`` M caps the longer side, fastpipe's ``max_side`` S the shorter one:
:func:`matching_max_side` chooses S so that the pack stores as many pixels in all as FFCV at M.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks._harness import REPO, Skip, cpu_seconds, time_batches

EXTENSIONS = (".jpg", ".jpeg", ".JPG", ".JPEG")
COMMANDS = ("apt-get install -y libopencv-dev libturbojpeg0-dev pkg-config; "
            "python3.11 -m venv /work/ffcv-venv; "
            "/work/ffcv-venv/bin/pip install torch==2.13.0 pillow ffcv")
INSTALL = (f"install FFCV in a venv of its own ({COMMANDS}) and pass "
           "--ffcv-python /work/ffcv-venv/bin/python")
HOW = ("FFCV Loader (its own venv, --ffcv-python) on a .beton of RGBImageField(write_mode='jpg', "
       "max_resolution=M, jpeg_quality=90): RandomResizedCrop decoder, flip, NormalizeImage "
       "float32, ToTensor, ToTorchImage (channels-last); 2 numba threads, RANDOM order, "
       "os_cache")


# ---------------------------------------------------------------- the stored pixels

def image_sizes(root: str | Path) -> list[tuple[int, int]]:
    """(width, height) of every JPEG under ``root``, in sorted path order."""
    from PIL import Image

    sizes = []
    for path in sorted(Path(root).rglob("*.jpg")):
        with Image.open(path) as image:
            sizes.append(image.size)
    return sizes


def ffcv_pixels(sizes: list[tuple[int, int]], max_resolution: int) -> int:
    """Pixels FFCV's ``RGBImageField(max_resolution=M)`` stores: the longer side brought down
    to M (OpenCV resize to ``int(ratio * size)``), smaller images as they are."""
    total = 0
    for width, height in sizes:
        ratio = max_resolution / max(width, height)
        total += int(ratio * width) * int(ratio * height) if ratio < 1 else width * height
    return total


def fastpipe_pixels(sizes: list[tuple[int, int]], max_side: int) -> int:
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
    target = ffcv_pixels(sizes, max_resolution)
    return min(range(1, max_resolution + 1),
               key=lambda side: abs(fastpipe_pixels(sizes, side) - target))


def beton_path(root: str, workdir: str | Path, max_resolution: int) -> Path:
    return Path(workdir) / f"{Path(root).name}-{max_resolution}.beton"


def pack_path(root: str, workdir: str | Path, max_resolution: int) -> Path:
    """The fastpipe pack that stores as many pixels as FFCV's ``.beton`` at ``max_resolution``."""
    return Path(workdir) / f"{Path(root).name}-transcoded-as-ffcv-{max_resolution}.h5"


# ---------------------------------------------------------------- in the benchmark's process

def describe(python: Path) -> str:
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


def prepare(root: str, workdir: str, resolutions: list[int], ffcv_python: Path | None,
            with_ffcv: bool, with_pack: bool, workers: int,
            pack: Callable[..., bool]) -> dict[int, dict[str, Any]]:
    """Per FFCV max_resolution M, before any timing: FFCV's ``.beton`` (written by the FFCV
    interpreter, with ``with_ffcv``) and, with ``with_pack``, the fastpipe bytes pack of as many
    pixels (``pack(label, root, out, **options)``, False where it cannot). Returns what each
    stores."""
    sizes = image_sizes(root)
    stored: dict[int, dict[str, Any]] = {}
    for resolution in resolutions:
        side = matching_max_side(sizes, resolution)
        info = stored[resolution] = {
            "images": len(sizes), "max_side": side,
            "ffcv_pixels": ffcv_pixels(sizes, resolution) / len(sizes),
            "fastpipe_pixels": fastpipe_pixels(sizes, side) / len(sizes)}
        beton = beton_path(root, workdir, resolution)
        if with_ffcv and ffcv_python and not beton.exists():
            done = subprocess.run([str(ffcv_python), "-m", "benchmarks._ffcv", "write", root,
                                   str(beton), "--max-resolution", str(resolution),
                                   "--quality", "90", "--workers", str(workers)],
                                  cwd=REPO, capture_output=True, text=True, timeout=3600)
            if done.returncode:
                print(f"FFCV @ {resolution}: not written: {done.stderr.strip()[-2000:]}",
                      flush=True)
            else:
                info["beton"] = json.loads(done.stdout.strip().splitlines()[-1])
        out = pack_path(root, workdir, resolution)
        if with_pack and not out.exists():
            if not pack(f"same-pixels pack @ {resolution}", root, out, max_side=side,
                        quality=90, transcode=True, num_workers=workers, merge="copy"):
                continue
            info["pack_bytes"] = out.stat().st_size
    return stored


def same_pixels_table(stored: dict[int, dict[str, Any]], medians: dict[str, float],
                      setup_cpu: dict[int, list[float]], fastpipe_rows: tuple[str, str]
                      ) -> list[str]:
    """fastpipe against FFCV when both store the same pixels, one line per max_resolution:
    ``medians`` of the rows named ``"<row> @ M"``, FFCV's set-up CPU seconds per round."""
    if not stored:
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
    for m, info in stored.items():
        ffcv_rate = medians.get(f"FFCV @ {m}")

        def ratio(name: str, m: int = m, ffcv_rate: float | None = ffcv_rate) -> str:
            rate = medians.get(f"{name} @ {m}")
            return f"{rate / ffcv_rate:.2f}x" if rate and ffcv_rate else "-"

        beton = info.get("beton", {})
        cells = [
            str(m), str(info["max_side"]),
            f"{beton.get('mean_pixels', info['ffcv_pixels']):.0f}",
            f"{info['fastpipe_pixels']:.0f}",
            f"{beton['bytes'] / 1e6:.1f}" if beton else "-",
            f"{info['pack_bytes'] / 1e6:.1f}" if "pack_bytes" in info else "-",
            f"{statistics.median(setup_cpu[m]):.1f}" if setup_cpu.get(m) else "-",
            *(ratio(name) for name in fastpipe_rows),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


# ---------------------------------------------------------------- in FFCV's interpreter

class Folder:
    """The samples of an ImageFolder tree, as torchvision orders and labels them: sorted class
    folders, sorted files; ``(uint8 (H, W, 3) RGB array, int label)`` per index, as FFCV's
    writer wants (its examples pass torchvision's ImageFolder, which returns PIL RGB images)."""

    def __init__(self, root: str | Path) -> None:
        classes = sorted(p.name for p in Path(root).iterdir() if p.is_dir())
        self.samples = [(str(path), label) for label, name in enumerate(classes)
                        for path in sorted((Path(root) / name).rglob("*"))
                        if path.suffix in EXTENSIONS]
        if not self.samples:
            raise ValueError(f"no JPEG files in class folders under {root}")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        import numpy as np
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB")), label


def write_beton(root: str | Path, out: str | Path, max_resolution: int, quality: int = 90,
                num_workers: int = 2) -> dict:
    """Writes ``out`` with FFCV's ``DatasetWriter``: every image as a JPEG of ``quality`` whose
    longer side is at most ``max_resolution`` (FFCV resizes with OpenCV's INTER_AREA, then
    re-encodes every image, even one that was small enough). Returns what it stored."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.reader import Reader
    from ffcv.writer import DatasetWriter

    writer = DatasetWriter(str(out), {
        "image": RGBImageField(write_mode="jpg", max_resolution=max_resolution,
                               jpeg_quality=quality),
        "label": IntField(),
    }, num_workers=num_workers)
    writer.from_indexed_dataset(Folder(root))
    meta = Reader(str(out)).metadata["f0"]
    pixels = meta["height"].astype("int64") * meta["width"].astype("int64")
    return {"images": int(len(meta)), "mean_pixels": float(pixels.mean()),
            "max_side": int(max(meta["height"].max(), meta["width"].max())),
            "bytes": Path(out).stat().st_size}


def loader(beton: str | Path, cfg):
    """FFCV's ``Loader`` of float32 ``(N, 3, size, size)`` batches normalized with ``cfg.mean``
    and ``cfg.std``, built the way FFCV's ImageNet example builds its train loader, on the CPU:
    JPEG decode of the whole stored image, RandomResizedCrop + resize (OpenCV), flip, then
    FFCV's table-lookup ``NormalizeImage`` to float32 in its numba stage (on the CPU it works on
    the NHWC arrays, so it comes before ``ToTensor``), and ``ToTorchImage``, whose NCHW tensor is
    a channels-last view (as FFCV hands it to a model). ``num_workers`` numba threads run the
    stage; a background thread keeps ``batches_ahead`` (3) batches ready. Each batch is a view of
    one of a few buffers that later batches overwrite."""
    import numpy as np
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage

    mean = np.array(cfg.mean) * 255
    std = np.array(cfg.std) * 255
    return Loader(str(beton), batch_size=cfg.batch_size, num_workers=cfg.workers,
                  order=OrderOption.RANDOM, os_cache=True, drop_last=False, pipelines={
                      "image": [RandomResizedCropRGBImageDecoder((cfg.size, cfg.size)),
                                RandomHorizontalFlip(),
                                NormalizeImage(mean, std, np.float32),
                                ToTensor(), ToTorchImage()],
                      "label": [IntDecoder(), ToTensor()],
                  })


def batches(ffcv_loader, epochs: int) -> Iterator:
    """The image batches of ``epochs`` epochs of ``ffcv_loader``."""
    for _ in range(epochs):
        for images, _labels in ffcv_loader:
            yield images


def measure(max_resolution: int, cfg, check: Callable[[Any], None]) -> dict[str, float]:
    """The FFCV row at ``max_resolution``, timed like every other row. numba compiles FFCV's
    pipeline during the first batch (tens of CPU seconds): one-time set-up, like DALI's pipeline
    build, so one whole epoch runs before the CPU clock starts (a partial one would leave FFCV's
    loading thread running); its cost is reported apart."""
    import importlib.util

    if importlib.util.find_spec("ffcv") is None:
        raise Skip(f"ffcv is not installed in {sys.executable}; {INSTALL}")
    beton = beton_path(cfg.root, cfg.workdir, max_resolution)
    if not beton.exists():
        raise Skip(f"{beton} was not written")
    start, cpu_start = time.perf_counter(), cpu_seconds()
    ffcv_loader = loader(beton, cfg)
    for _ in ffcv_loader:
        pass
    setup = {"setup_s": time.perf_counter() - start, "setup_cpu_s": cpu_seconds() - cpu_start}
    return {**time_batches(batches(ffcv_loader, cfg.epochs), cfg.warmup, check), **setup}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._ffcv",
                                     description="Write an FFCV .beton from an ImageFolder tree")
    parser.add_argument("command", choices=["write"])
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--max-resolution", type=int, required=True)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(write_beton(args.root, args.out, args.max_resolution, args.quality,
                                 args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
