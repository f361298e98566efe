"""Writes the seed corpus: a JPEG of every layout the decoders accept, a PNG of every kind
(plain, interlaced, seekable), WebDataset tar shards of every tar format, and the shared
findings.

4:2:0, 4:2:2, 4:4:4 (PIL), 4:4:0, 4:1:1, 4:1:0, 4:4:1 and 3x1 (tests/jpeg/sampling_encoder.c),
greyscale, RGB-coded (Adobe), CMYK, progressive, arithmetic-coded and restart-marked (jpegtran),
transcoded (fastpipe._jpeg.transcode), odd sizes from 1x1 up; plus every file in
``--extra`` folders (e.g. the findings of earlier runs).

    python -m fuzz.corpus OUT [--jpegtran PATH] [--extra DIR ...]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
ENCODER = ROOT / "tests" / "jpeg" / "sampling_encoder.c"
# (luma h, luma v) with chroma 1x1: the layouts PIL cannot write.
SAMPLINGS = {"440": (1, 2), "411": (4, 1), "410": (4, 2), "441": (1, 4), "3x1": (3, 1),
             "1x3": (1, 3)}
SIZES = [(1, 1), (1, 17), (17, 1), (2, 3), (5, 7), (8, 8), (9, 15), (16, 16), (17, 33),
         (31, 64), (48, 33), (64, 64)]


def _image(height: int, width: int, seed: int) -> Image.Image:
    """A smooth gradient with noise and a sharp colour edge: every coefficient band in use."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1),
                     (x + y) * 127 // max(width + height, 1)], axis=-1)
    base[:, width // 2:, 0] = 255 - base[:, width // 2:, 0]
    noise = rng.integers(-20, 21, size=base.shape)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _pil(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", **options)
    return out.getvalue()


def _encoder(tmp: Path) -> Path | None:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    out = tmp / "sampling_encoder"
    subprocess.run([compiler, str(ENCODER), "-o", str(out), "-ljpeg"], check=True,
                   capture_output=True)
    return out


def _sampled(encoder: Path, image: Image.Image, h: int, v: int) -> bytes:
    width, height = image.size
    return subprocess.run([str(encoder), str(width), str(height), str(h), str(v)],
                          input=image.tobytes(), capture_output=True, check=True).stdout


def _jpegtran(jpegtran: str, data: bytes, *options: str) -> bytes:
    # A jpegtran of fuzz/build_libjpeg.sh has no RPATH (Debian's patch): its library beside it.
    lib = Path(jpegtran).resolve().parent.parent / "lib"
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0",
               LD_LIBRARY_PATH=f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    return subprocess.run([jpegtran, *options], input=data, capture_output=True, check=True,
                          env=env).stdout


def seeds(jpegtran: str | None) -> dict[str, bytes]:
    """Every seed by name."""
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        encoder = _encoder(Path(tmp))
        for i, (height, width) in enumerate(SIZES):
            image = _image(height, width, i)
            tag = f"{height}x{width}"
            for name, sub in (("420", 2), ("422", 1), ("444", 0)):
                out[f"{name}-{tag}"] = _pil(image, quality=90, subsampling=sub)
            out[f"grey-{tag}"] = _pil(image.convert("L"), quality=85)
            if height * width >= 64:
                out[f"progressive-{tag}"] = _pil(image, quality=80, progressive=True)
                out[f"cmyk-{tag}"] = _pil(image.convert("CMYK"), quality=80)
            if encoder is not None and height >= 8 and width >= 8:
                for name, (h, v) in SAMPLINGS.items():
                    out[f"{name}-{tag}"] = _sampled(encoder, image, h, v)
        if jpegtran is not None:
            for name in [n for n in out if n.endswith(("-17x33", "-48x33", "-64x64", "-1x17"))]:
                data = out[name]
                if name.startswith("cmyk"):
                    continue
                out[f"arith-{name}"] = _jpegtran(jpegtran, data, "-arithmetic")
                out[f"arith-progressive-{name}"] = _jpegtran(jpegtran, data, "-arithmetic",
                                                             "-progressive")
                out[f"restart2-{name}"] = _jpegtran(jpegtran, data, "-restart", "2B")
        try:
            from fastpipe._jpeg import transcode
        except ImportError:
            transcode = None
        if transcode is not None:
            for name in [n for n in out if n.startswith(("420-", "422-", "444-", "grey-", "411-",
                                                          "progressive-"))]:
                try:
                    out[f"transcoded-{name}"] = transcode(out[name])
                except ValueError:
                    pass
        rgb = io.BytesIO()
        _image(24, 40, 99).save(rgb, format="JPEG", quality=90, subsampling=0,
                                keep_rgb=True)
        out["rgb-24x40"] = rgb.getvalue()
    return out


def png_seeds() -> dict[str, bytes]:
    """A PNG of every colour type and bit depth, interlaced and not, at odd sizes, and the
    seekable rewrite (``transcode``) of each 8/16-bit one: fastpipe._png's two decoders."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    def write(rows: np.ndarray, width: int, depth: int, color_type: int, filters: bytes) -> bytes:
        """Filter-type bytes from ``filters`` on raw rows (the values do not matter to a fuzzer:
        every filter type gets undone), one stream split over two IDATs."""
        height = rows.shape[0]
        raw = b"".join(bytes([filters[y % len(filters)]]) + rows[y].tobytes()
                       for y in range(height))
        stream = zlib.compress(raw)
        half = max(1, len(stream) // 2)
        body = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
        palette = chunk(b"PLTE", bytes(range(48))) if color_type == 3 else b""
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", body) + palette
                + chunk(b"IDAT", stream[:half]) + chunk(b"IDAT", stream[half:])
                + chunk(b"IEND", b""))

    out: dict[str, bytes] = {}
    rng = np.random.default_rng(7)
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
    kinds = [(0, 1), (0, 4), (0, 8), (0, 16), (2, 8), (2, 16), (3, 2), (3, 8), (4, 8), (4, 16),
             (6, 8), (6, 16)]
    for height, width in ((1, 1), (3, 17), (17, 5), (33, 40)):
        for color_type, depth in kinds:
            row_bytes = -(-width * channels[color_type] * depth // 8)
            rows = rng.integers(0, 256, (height, row_bytes), dtype=np.uint8)
            if color_type == 3 and depth == 8:
                rows %= 16  # indices within the 16 colours of the palette
            out[f"png-{color_type}-{depth}-{height}x{width}"] = write(
                rows, width, depth, color_type, b"\x04\x01\x02\x03\x00")
    for name, mode in (("rgb", "RGB"), ("grey", "L"), ("palette", "P")):
        buffer = io.BytesIO()
        _image(29, 37, 5).convert(mode).save(buffer, format="PNG", interlace=1)
        out[f"png-adam7-{name}"] = buffer.getvalue()
    try:
        from fastpipe.pack._transcode import seekable_png
    except ImportError:
        return out
    for name in [n for n in out if not n.startswith("png-adam7")]:
        try:
            rewritten = seekable_png(out[name], name)
        except (ValueError, ImportError):
            rewritten = None
        if rewritten is not None:
            out[f"seekable-{name}"] = rewritten
    big = io.BytesIO()
    _image(200, 64, 3).save(big, format="PNG")  # several segments
    out["seekable-png-200x64"] = seekable_png(big.getvalue(), "big") or big.getvalue()
    return out


def tar_seeds(images: list[bytes]) -> dict[str, bytes]:
    """WebDataset shards of a few samples each (an image member, a class, a caption, raw bytes),
    in each format tarfile writes (GNU, and GNU with long-name headers; POSIX pax with extended
    headers for non-ASCII names and for names past 100 bytes; ustar with names split into a
    prefix and a name; pax with a float mtime, an extended header of it before each member, as
    webdataset's writer writes), one of them ending without its end-of-archive blocks: the
    tar_shard target's seeds."""
    import tarfile

    def shard(format: int, prefix: str, members: int, end: bool = True,
              mtime: float = 1_700_000_000) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=format) as tar:
            for i in range(members):
                key = f"{prefix}{i:06d}"
                for ext, body in (("png" if images[i % len(images)][:1] == b"\x89" else "jpg",
                                   images[i % len(images)]),
                                  ("cls", str(i % 3).encode()),
                                  ("txt", f"sample {i} \u00e9t\u00e9".encode()),
                                  ("bin", bytes(range(i, i + 37)))):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime, info.mode = len(body), mtime, 0o644
                    tar.addfile(info, io.BytesIO(body))
            members_end = tar.offset
        return out.getvalue() if end else out.getvalue()[:members_end]

    # Member names past a header's 100 bytes (the key's folders, then "000000.png"): GNU writes
    # a long-name header (type L) before the member's, pax an extended header (type x) with
    # the path, ustar splits the name at a "/" into the prefix (byte 345 on) and the name.
    # pax writes an extended header for a non-ASCII name too.
    long_prefix = ("a-folder-name-long-enough-that-the-member-names-pass-the-100-bytes-of-a-header/"
                   + "x" * 30 + "/")
    return {
        "tar-gnu": shard(tarfile.GNU_FORMAT, "", 4),
        "tar-gnu-long": shard(tarfile.GNU_FORMAT, long_prefix, 3),
        "tar-pax": shard(tarfile.PAX_FORMAT, "pax-\u00e9t\u00e9/", 3),
        "tar-pax-long": shard(tarfile.PAX_FORMAT, long_prefix, 3),
        "tar-ustar": shard(tarfile.USTAR_FORMAT, long_prefix, 3),
        "tar-pax-times": shard(tarfile.PAX_FORMAT, "", 3, mtime=1_700_000_000.25),
        "tar-unended": shard(tarfile.GNU_FORMAT, "", 2, end=False),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--jpegtran", default=shutil.which("jpegtran"),
                        help="a jpegtran for the arithmetic-coded and restart-marked seeds")
    parser.add_argument("--extra", type=Path, nargs="*", default=[],
                        help="folders whose files join the corpus (the shared findings)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, data in seeds(args.jpegtran).items():
        (args.out / f"{name}.jpg").write_bytes(data)
        written += 1
    pngs = png_seeds()
    for name, data in pngs.items():
        (args.out / f"{name}.png").write_bytes(data)
        written += 1
    small = sorted((d for d in pngs.values() if len(d) < 600), key=len)[:3]
    small += [_pil(_image(9, 11, 3), quality=90)]
    for name, data in tar_seeds(small).items():
        (args.out / f"{name}.tar").write_bytes(data)
        written += 1
    for folder in args.extra:
        for path in sorted(folder.glob("*")):
            if path.is_file() and path.suffix.lower() in (".jpg", ".jpeg", ".bin"):
                shutil.copyfile(path, args.out / f"extra-{path.name}")
                written += 1
    print(f"{written} seeds in {args.out}")


if __name__ == "__main__":
    main()
