"""The PNG paths around fastpipe._png as a target of the fuzz driver (fuzz/harness.py):
``decode_png`` (whole and a band), ``decode_rgb`` and ``ImageDecoder`` on a mutated PNG seed,
with Pillow as the reference.

What they may give: pixels, or CorruptImageError (ImageTooLargeError included) naming the file.
A finding is any other exception; pixels from any of them where fastpipe._png called the file
damaged (Pillow asked again behind its verdict); decode_png and decode_rgb taking different
verdicts on the whole file (but for a palette index past the palette, which only decode_rgb
refuses), or decode_rgb's pixels differing from decode_png's converted as PIL converts them;
pixels that differ from Pillow's for a file both decode; or a decode whose memory (numpy's
allocations, traced) is not bounded by the bytes present: more than a few times 1032 times the
file's length (fastpipe.data.decode.png.MAX_DEFLATE_RATIO).

It runs Python over the installed fastpipe._png (and torch, for ImageDecoder), so fuzz/run.sh runs
it without the sanitizer preload; the module itself is fuzzed under the sanitizers by the
native ``png_decode`` target. Without fastpipe._png every path is Pillow's and there is no verdict
to hold them to: the target, and the driver asked for it, fail naming the module (:func:`require`).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from fuzz import PeakMemory

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SOURCE = "fuzzed.png"


class Finding(Exception):
    """A PNG decoded silently wrong, or an error outside the decoders' contract."""


def _pillow(data: bytes) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Pillow's RGB pixels and stored values, or (None, None) where it refuses."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as image:
                image.load()
                stored = np.array(image.convert("L") if image.mode == "1" else image)
                return np.array(image.convert("RGB")), stored
    except Exception:  # noqa: BLE001 - Pillow's verdict, whatever its type
        return None, None


def _verdict(data: bytes) -> str:
    """What fastpipe._png says of the whole file: "damaged", "declined", "decoded", or "" when
    the header, the pixel budget or the file's length refuse it before the module is asked."""
    from fastpipe.data.decode import png
    from fastpipe.data.decode.budget import CorruptImageError

    try:
        header = png._checked_header(data, SOURCE)
        png._decode_native(data, header, None)
    except CorruptImageError:
        return ""
    except png._Damaged:
        return "damaged"
    except ValueError:
        return "declined"
    return "decoded"


def _rgb_of(stored: np.ndarray, data: bytes) -> np.ndarray | None:
    """decode_png's values as PIL's convert("RGB") makes them (None for a palette index past
    the palette, which has no colour)."""
    from fastpipe.data.decode import png

    header = png._read_header(data)
    if header.color_type == 3:
        body = png._chunk_before_idat(data, b"PLTE") or b""
        palette = np.frombuffer(body, np.uint8)[:len(body) // 3 * 3].reshape(-1, 3)
        return None if stored.max(initial=0) >= len(palette) else palette[stored]
    if stored.dtype == np.uint16:
        stored = (np.minimum(stored, 255) if stored.ndim == 2 else stored >> 8).astype(np.uint8)
    if stored.ndim == 2:
        return np.repeat(stored[..., None], 3, axis=2)
    if stored.shape[2] == 2:
        return np.repeat(stored[..., :1], 3, axis=2)
    return stored[..., :3]


def _outcome(call: Callable[[], Any]) -> Any:
    from fastpipe.data.decode.budget import CorruptImageError

    try:
        return call()
    except CorruptImageError as exc:
        if SOURCE not in str(exc):
            raise Finding(f"an error that does not name the file: {exc}") from exc
        return exc
    except Exception as exc:  # noqa: BLE001 - the finding
        raise Finding(f"{type(exc).__name__}: {exc}") from exc


def require() -> None:
    """RuntimeError where fastpipe._png is not built: every path would then be Pillow's, and the
    target would compare Pillow with itself (no verdict to hold it to), finding nothing."""
    from fastpipe.data.decode import png

    if png._native_decode is None:
        raise RuntimeError(
            "fastpipe._png is not built, so png_paths would compare Pillow with itself: install "
            "libpng's headers (apt install libpng-dev) and pip install --no-build-isolation -e .")


def png_paths(data: bytes, rng: np.random.Generator) -> None:
    from fastpipe.data.decode import png
    from fastpipe.data.decode.image import ImageDecoder, decode_rgb

    require()
    header = png._read_header(data)
    verdict = _verdict(data) if header is not None else ""
    band = None
    if header is not None and header.height > 1:
        top = int(rng.integers(header.height - 1))
        band = (top, int(rng.integers(top + 1, header.height + 1)))
    with PeakMemory() as peak:
        out = {
            "decode_png": _outcome(lambda: png.decode_png(data, SOURCE)),
            "decode_rgb": _outcome(lambda: decode_rgb(data, SOURCE)),
            "ImageDecoder": _outcome(lambda: ImageDecoder(train=False, size=8)(data, SOURCE)),
        }
        if band is not None:
            out["band"] = _outcome(lambda: png.decode_png(data, SOURCE, rows=band))
    bound = 8 * png.MAX_DEFLATE_RATIO * len(data) + (4 << 20)
    if peak.bytes > bound:
        raise Finding(f"the decodes of a {len(data)}-byte file allocated {peak.bytes} bytes, past "
                      f"{bound}")
    if verdict == "damaged":
        decoded = [name for name in ("decode_png", "decode_rgb", "ImageDecoder")
                   if not isinstance(out[name], Exception)]
        if decoded:
            raise Finding(f"fastpipe._png calls the file damaged, but {decoded} gave pixels")
    stored, rgb = out["decode_png"], out["decode_rgb"]
    if isinstance(stored, Exception) or header is None:
        if not isinstance(rgb, Exception) and verdict:
            raise Finding("decode_rgb decodes what decode_png refuses: " + str(stored))
        return
    expected = _rgb_of(stored, data)
    if isinstance(rgb, Exception):
        if expected is not None:
            raise Finding(f"decode_png decodes what decode_rgb refuses: {rgb}")
        return
    if expected is None or not np.array_equal(rgb, expected):
        raise Finding("decode_rgb's pixels are not decode_png's converted")
    if band is not None and not isinstance(out["band"], Exception) and not np.array_equal(
            out["band"], stored[band[0]:band[1]]):
        raise Finding(f"rows {band} differ from those rows of the whole decode")
    pillow_rgb, _ = _pillow(data)
    if pillow_rgb is not None and not np.array_equal(pillow_rgb, rgb):
        raise Finding("decode_rgb's pixels differ from Pillow's for a file both decode")


TARGETS: dict[str, Callable[[bytes, np.random.Generator], None]] = {"png_paths": png_paths}
SEEDS: dict[str, Callable[[bytes], bool]] = {"png_paths": lambda d: d.startswith(PNG_SIGNATURE)}
