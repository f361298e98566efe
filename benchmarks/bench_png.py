"""PNG decode: ms per image of each candidate decoder against PIL, by kind of PNG.

Sets of photo-like PNGs (natural-spectrum texture with edges, as benchmarks/_photos.py draws
them, written losslessly): 8-bit RGB at 512-2,048 px, DIV2K-like 2,040 x 1,356 RGB, 8-bit grey,
16-bit grey and 16-bit RGB. Every (decoder, set) pair runs in its own process, one core, in
interleaved rounds (benchmarks/_harness.py); each process decodes every file of its set ``passes``
times after one untimed pass, to the stored pixels (``np.asarray`` of the decoder's result). Every
decoder here runs on one thread, so the CPU milliseconds per image are the steadier number on a
shared machine; the wall-clock ones move with whatever else runs:

- ``pil``: ``np.asarray(PIL.Image.open(f))`` (16-bit colour reduced to 8 bits: less work);
- ``fastpipe``: ``fastpipe.data.decode.png.decode_png`` (fastpipe._png: zlib and fastpipe's filters
  for 8/16-bit files that are not interlaced, libpng for the rest);
- ``fastpipe-rows``: the same, rows ``[0, H/2)`` only (a crop in the top half);
- ``fastpipe-seekable-band``: 96 rows from the middle of the file's seekable rewrite (what
  ``pack(..., transcode=True)`` stores; fastpipe/pack/_transcode.py), rewritten before timing;
- ``torchvision``: ``torchvision.io.decode_png`` (libpng; UNCHANGED mode);
- ``pyspng``: pyspng-seunglab (libspng), ``cv2``: ``cv2.imdecode(..., IMREAD_UNCHANGED)``,
  ``imagecodecs``: ``imagecodecs.png_decode``; skipped when not installed (put them on
  PYTHONPATH, e.g. ``pip install --target DIR``).

    python -m benchmarks.bench_png                  # every row, 3 rounds
    python -m benchmarks.bench_png --only fastpipe pil --repeat 5
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import _harness

DECODERS = ("pil", "fastpipe", "fastpipe-rows", "fastpipe-seekable-band", "torchvision",
            "pyspng", "cv2", "imagecodecs")
BAND = 96  # rows of a super-resolution HR patch
# name: (sizes (height, width), mode), 4 files each.
SETS = {
    "rgb8 512-2048": ([(512, 683), (1024, 768), (1365, 2048), (2048, 1536)], "RGB"),
    "rgb8 div2k 2040x1356": ([(1356, 2040)] * 4, "RGB"),
    "grey8 512-2048": ([(512, 683), (1024, 768), (1365, 2048), (2048, 1536)], "L"),
    "grey16 512-2048": ([(512, 683), (1024, 768), (1365, 2048), (2048, 1536)], "I;16"),
    "rgb16 1024": ([(1024, 768), (768, 1024), (1024, 1024), (1024, 768)], "RGB;16"),
}


def _texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Photo-like float texture, mean ~118, the luminance model of benchmarks/_photos.py."""
    from benchmarks._photos import _field

    luma = 0.55 * _field(rng, height, width, 1.0)
    edges = (_field(rng, height, width, 1.8) > 0).astype(np.float32)
    luma += 0.9 * (edges - edges.mean())
    return 118 + 52 * luma + rng.normal(0.0, 2.5, (height, width))


def _png16(array: np.ndarray) -> bytes:
    """A 16-bit RGB PNG (PIL cannot write one): filter type 0 rows, zlib level 6."""
    import struct
    import zlib

    height, width = array.shape[:2]
    raw = b"".join(b"\0" + array[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 2,
                                                              0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def write_sets(root: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, (sizes, mode) in SETS.items():
        folder = root / name.replace(" ", "_")
        folder.mkdir(parents=True, exist_ok=True)
        for i, (height, width) in enumerate(sizes):
            channels = [_texture(rng, height, width) for _ in range(1 if mode in ("L", "I;16")
                                                                    else 3)]
            pixels = np.stack(channels, axis=-1) if len(channels) > 1 else channels[0]
            if mode == "RGB;16":
                data = _png16(np.clip(pixels * 256, 0, 65535).astype(np.uint16))
            else:
                buffer = io.BytesIO()
                if mode == "I;16":
                    image = Image.fromarray(np.clip(pixels * 256, 0, 65535).astype(np.uint16))
                else:
                    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
                image.save(buffer, "PNG")
                data = buffer.getvalue()
            (folder / f"{i}.png").write_bytes(data)


def _decoder(name: str):
    if name == "pil":
        from PIL import Image

        return lambda data: np.asarray(Image.open(io.BytesIO(data)))
    if name.startswith("fastpipe"):
        from fastpipe.data.decode import png as _png

        if _png._native_decode is None:
            raise _harness.Skip("fastpipe._png is not built (libpng's headers missing)")
        if name == "fastpipe":
            return _png.decode_png
        if name == "fastpipe-rows":
            return lambda data: _png.decode_png(data, rows=(0, _png.png_size(data)[0] // 2))

        def band(data):
            middle = _png.png_size(data)[0] // 2
            return _png.decode_png(data, rows=(middle, middle + BAND), seekable=True)

        return band
    try:
        if name == "torchvision":
            import torch
            from torchvision.io import ImageReadMode, decode_png

            # It takes a tensor over writable memory: the copy (~1% of a decode) is timed too.
            return lambda data: decode_png(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                           ImageReadMode.UNCHANGED).numpy()
        if name == "pyspng":
            import pyspng

            return pyspng.load
        if name == "cv2":
            import cv2

            cv2.setNumThreads(1)
            return lambda data: cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if name == "imagecodecs":
            import imagecodecs

            return imagecodecs.png_decode
    except ImportError as exc:
        raise _harness.Skip(f"{name} is not installed ({exc})") from None
    raise ValueError(name)


def optional(name: str) -> bool:
    """Decoders installed from elsewhere: a failure is a note in the table, not a stop."""
    return name.split(" / ")[0] in ("torchvision", "pyspng", "cv2", "imagecodecs")


def measure(name: str, cfg) -> dict:
    decoder_name, set_name = name.split(" / ")
    import torch

    torch.set_num_threads(1)
    files = [p.read_bytes()
             for p in sorted((Path(cfg.root) / set_name.replace(" ", "_")).glob("*.png"))]
    if decoder_name == "fastpipe-seekable-band":
        from fastpipe.pack._transcode import seekable_png

        files = [seekable_png(data, "bench.png") for data in files]
    decode = _decoder(decoder_name)
    for data in files:
        decode(data)
    cpu = _harness.cpu_seconds()
    start = time.perf_counter()
    for _ in range(cfg.passes):
        for data in files:
            decode(data)
    elapsed = time.perf_counter() - start
    count = cfg.passes * len(files)
    return {"rate": count / elapsed, "cpu_ms": (_harness.cpu_seconds() - cpu) / count * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_png", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _harness.add_arguments(parser, repeat=3, baseline=False)
    parser.add_argument("--passes", type=int, default=None,
                        help="timed passes over each set's 4 files per process (default 5)")
    args = parser.parse_args(argv)
    names = _harness.select([f"{d} / {s}" for s in SETS for d in DECODERS], args.only)
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-png-") as root:
        write_sets(Path(root))
        config = {"root": root, "passes": args.passes or (1 if args.quick else 5)}
        runs = _harness.run_rounds("bench_png", names, config,
                                   _harness.rounds_of(args, repeat=3), unit="images/s")
    lines = [f"Machine: {_harness.machine()}", "",
             "| decoder | PNGs | ms/image (median) | min-max | CPU ms/image | PIL's CPU / this |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name in names:
        decoder_name, set_name = name.split(" / ")
        measured = [r for r in runs.current.get(name, []) if "rate" in r]
        if not measured:
            lines.append(f"| {decoder_name} | {set_name} | - | - | - | "
                         f"{runs.note(name) or 'not run'} |")
            continue
        wall = [1e3 / r["rate"] for r in measured]
        cpu = statistics.median(r["cpu_ms"] for r in measured)
        pil = [r["cpu_ms"] for r in runs.current.get(f"pil / {set_name}", []) if "rate" in r]
        ratio = f"{statistics.median(pil) / cpu:.2f}x" if pil else "-"
        lines.append(f"| {decoder_name} | {set_name} | {statistics.median(wall):.1f} | "
                     f"{min(wall):.1f}-{max(wall):.1f} | {cpu:.1f} | {ratio} |")
    _harness.finish("\n".join(lines), args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
