"""PNG decode to the stored pixels, and the PNG header read without a decode.

:func:`decode_png` returns what the file stores, not converted (segmentation masks keep their
palette indices, 16-bit data keeps its 16 bits); fastpipe.data.decode.image.decode_rgb uses it for
the RGB images of the fast path (:func:`decode_rgb_png`). See docs/cpu-path.md ("PNG") for the
decoders measured.

fastpipe._png judges every PNG it is given: a file it calls damaged (a CRC error in any chunk,
image data that ends early, an invalid stream or filter) is a CorruptImageError with its reason,
and no other decoder is asked (Pillow would fill the missing rows with zeros, or ignore the
IDAT CRCs). PIL decodes only where fastpipe._png is not built (a RuntimeWarning says so, once a
process), or where it declines a file without calling it damaged (a limit of libpng's).
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib

import numpy as np

try:
    from fastpipe import _png as _module
    from fastpipe._png import decode as _native_decode
except ImportError:  # built without libpng's headers (setup.py says so): PIL decodes
    _module = _native_decode = None
# fastpipe._png's verdict that a file is damaged; a module built before it had one raised
# ValueError for every refusal, all of them damage then.
_Damaged = getattr(_module, "DamagedError", ValueError)
# Whether this process has warned that PIL decodes PNGs in place of the missing module.
_warned_pillow = False

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Deflate's largest expansion: a 258-byte match coded in 2 bits (a 1-bit length code and a 1-bit
# distance code) gives 1032 bytes per byte of compressed data. A PNG's image data is at least
# its pixels' bytes, so a file holding less than 1/1032 of them cannot be whole: it is refused
# before anything its declared size decides is allocated, which bounds the memory of a decode
# by the bytes actually present, not only by the size the header declares.
MAX_DEFLATE_RATIO = 1032
# The IEND chunk (length 0, type, CRC) that ends every complete PNG.
_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"

# IHDR colour types (PNG specification, 11.2.2) and the channels each stores.
_GREY, _RGB, _PALETTE, _GREY_ALPHA, _RGBA = 0, 2, 3, 4, 6
_CHANNELS = {_GREY: 1, _RGB: 3, _PALETTE: 1, _GREY_ALPHA: 2, _RGBA: 4}
_DEPTHS = {_GREY: (1, 2, 4, 8, 16), _RGB: (8, 16), _PALETTE: (1, 2, 4, 8),
           _GREY_ALPHA: (8, 16), _RGBA: (8, 16)}


class _Header:
    """The fields of a PNG's IHDR chunk that decide the decoded array."""

    __slots__ = ("height", "width", "depth", "color_type", "interlaced")

    def __init__(self, height: int, width: int, depth: int, color_type: int,
                 interlaced: bool) -> None:
        self.height, self.width = height, width
        self.depth, self.color_type, self.interlaced = depth, color_type, interlaced

    @property
    def channels(self) -> int:
        return _CHANNELS[self.color_type]


def _read_header(data, checked: bool = False) -> _Header | None:
    """The IHDR of ``data``, or None if ``data`` does not start like a PNG (or, ``checked``, if
    its IHDR does not match its CRC). Fields a valid PNG cannot have are left for the decoder to
    report as damage."""
    head = bytes(data[:33])
    if len(head) < 33 or head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
        return None
    if checked and zlib.crc32(head[12:29]) != struct.unpack(">I", head[29:33])[0]:
        return None
    width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", head[16:29])
    return _Header(height, width, depth, color_type, interlace == 1)


def png_size(data) -> tuple[int, int] | None:
    """``(height, width)`` of a PNG from its IHDR chunk, or None if ``data`` is not a PNG or its
    IHDR does not match its CRC (a size read from a damaged header is not one to plan a crop
    with: the decode then names the damage). Nothing is decoded."""
    header = _read_header(data, checked=True)
    return None if header is None else (header.height, header.width)


def _checked_header(data, source: str) -> _Header:
    """The header of a PNG that may be decoded: a valid IHDR, within the pixel budget
    (ImageTooLargeError), and a file long enough to hold the image it declares
    (:data:`MAX_DEFLATE_RATIO`); CorruptImageError naming ``source`` otherwise."""
    from fastpipe.data.decode import budget as _decode

    header = _read_header(data)
    if header is None:
        raise _decode.CorruptImageError(
            f"cannot decode image {source} as PNG: it does not start with the PNG signature and "
            "an IHDR chunk; the file is damaged or not a PNG")
    if (header.color_type not in _DEPTHS or header.depth not in _DEPTHS[header.color_type]
            or header.height == 0 or header.width == 0):
        raise _decode.CorruptImageError(
            f"cannot decode image {source}: its PNG header declares an invalid image "
            f"({header.width}x{header.height}, bit depth {header.depth}, colour type "
            f"{header.color_type}); the file is damaged")
    _decode._check_pixels(header.height, header.width, source)
    need = -(-header.height * header.width * header.channels * header.depth // 8)
    if need > MAX_DEFLATE_RATIO * len(data):
        raise _corrupt(source, (
            f"its header declares {header.width}x{header.height} pixels, {need:,} bytes of image "
            f"data, which the file's {len(data):,} bytes cannot hold (deflate expands at most "
            f"{MAX_DEFLATE_RATIO}:1)"))
    return header


def decode_png(data, source: str = "<bytes>", rows: tuple[int, int] | None = None, *,
               seekable: bool = False) -> np.ndarray:
    """The pixels a PNG stores, not converted.

    Shape and dtype by the PNG's colour type and bit depth:

    - grey: ``(H, W)``; uint8 for 1, 2, 4 and 8 bits (1-bit as 0 and 255, 2-bit as multiples of
      85, 4-bit as multiples of 17, as PIL's mode "L" holds them; PIL itself opens 1-bit files as
      mode "1", whose array is bool: here it is ``np.asarray(image.convert("L"))``), uint16 for
      16 bits (PIL's "I;16");
    - palette: ``(H, W)`` uint8, the palette INDICES (as ``np.asarray`` of PIL's mode "P"), since
      segmentation masks are stored that way; any transparency (tRNS) is not applied;
    - grey + alpha: ``(H, W, 2)``, RGB: ``(H, W, 3)``, RGBA: ``(H, W, 4)``; uint8 for 8 bits and
      uint16 for 16 bits. PIL reduces 16-bit colour to 8 bits (and 16-bit grey + alpha to 8-bit
      RGBA); this function never changes the stored values, so its 16-bit colour arrays are
      uint16 where PIL's are uint8. They need fastpipe._png (libpng): without it they raise
      ImportError naming the fix.

    A tRNS chunk of a grey or RGB file (one colour declared transparent) is not applied either:
    the array is the stored colour samples, as PIL's.

    ``rows=(top, bottom)`` returns only rows ``[top, bottom)`` (``0 <= top < bottom <= H``); a
    non-interlaced file is not inflated past row ``bottom`` by decoders that can stop early
    (interlaced files are decoded whole, then sliced). ``seekable=True`` lets a seekable PNG
    (what ``fastpipe pack --transcode`` stores) start at the segment holding ``top``: pass it only
    for files fastpipe wrote, since a crafted file's index could show other pixels than the file
    holds for every other decoder.

    The pixel budget (``fastpipe.data.set_max_image_pixels``) is checked from the header before
    anything is allocated (:class:`~fastpipe.data.decode.budget.ImageTooLargeError`), and so is
    the file's length: a file shorter than 1/1032 of the image data it declares cannot hold it
    (:data:`MAX_DEFLATE_RATIO`). Damaged, truncated or non-PNG data raise
    :class:`~fastpipe.data.decode.budget.CorruptImageError` naming ``source`` and the reason
    (fastpipe._png's, e.g. ``IDAT: CRC error``); a file fastpipe._png calls damaged is never
    handed to PIL, which decodes only where the module is not built (a RuntimeWarning, once a
    process) or declines a file without calling it damaged.
    """
    from fastpipe.data.decode import budget as _decode

    data = _decode._bytes_of(data, source)
    header = _checked_header(data, source)
    if rows is not None:
        top, bottom = (int(r) for r in rows)
        if not 0 <= top < bottom <= header.height:
            raise ValueError(
                f"rows={rows!r} of image {source}: expected (top, bottom) with "
                f"0 <= top < bottom <= {header.height} (its height)")
        rows = (top, bottom)
    pixels, declined = _judged(data, source, header, rows, seekable)
    if pixels is None:
        if declined is not None and header.depth == 16 and header.channels > 1:
            raise _corrupt(source, declined)  # PIL would reduce it to 8 bits
        if declined is None:
            _warn_pillow(source)
        pixels = _decode_pil(data, source, header, declined)
        if rows is not None:
            pixels = pixels[rows[0]:rows[1]]
    return pixels


def _judged(data, source: str, header: _Header, rows: tuple[int, int] | None,
            seekable: bool = False) -> tuple[np.ndarray | None, Exception | None]:
    """fastpipe._png's pixels, or its verdict: CorruptImageError naming ``source`` with the
    module's reason when it calls the file damaged (no other decoder is asked then);
    ``(None, None)`` when it is not built, ``(None, reason)`` when it declines the file without
    calling it damaged (PIL may decode it). MemoryError is the machine's, raised as it is."""
    try:
        return _decode_native(data, header, rows, seekable), None
    except _Damaged as exc:
        raise _corrupt(source, exc) from exc
    except ValueError as exc:
        return None, exc


def _decode_native(data, header: _Header, rows: tuple[int, int] | None,
                   seekable: bool = False) -> np.ndarray | None:
    """``rows`` (or all) of the image through fastpipe._png (libpng), or None when it is not
    built; raises its DamagedError (a ValueError) with its reason for a damaged file, ValueError
    where it declines a file it does not call damaged. Interlaced
    files, and files that do not end with the IEND chunk (truncated, or with bytes appended), are
    decoded whole: a truncated file is then an error whichever rows are asked, not only for the
    rows below the cut."""
    if _native_decode is None:
        return None
    from fastpipe.data.decode.budget import MAX_IMAGE_PIXELS

    top, bottom = (0, header.height) if rows is None else rows
    whole = header.interlaced or bytes(data[-12:]) != _IEND
    first, last = (0, header.height) if whole else (top, bottom)
    sample = np.dtype(np.uint16 if header.depth == 16 else np.uint8)
    shape = (last - first, header.width) + ((header.channels,) if header.channels > 1 else ())
    out = np.empty(shape, dtype=sample)
    _native_decode(data, out, header.height, header.width, header.channels, sample.itemsize,
                   first, last, MAX_IMAGE_PIXELS, seekable)
    if (first, last) != (top, bottom):
        out = out[top:bottom].copy()
    return out


def _decode_pil(data, source: str, header: _Header, refused: Exception | None = None) -> np.ndarray:
    """The whole image through PIL, for every kind but 16-bit colour, which PIL reduces to 8
    bits."""
    from PIL import Image

    from fastpipe.data.decode import budget as _decode

    if header.depth == 16 and header.channels > 1:
        # torchvision's libpng decode keeps 16 bits, but crashed the interpreter (SIGSEGV) on a
        # damaged file in tests/data/decode/test_png.py's mutations: it is not a fallback here.
        raise ImportError(
            f"image {source} is a 16-bit colour PNG, which PIL can only reduce to 8 bits: "
            "decoding its stored 16-bit values needs fastpipe's _png extension, built when "
            "libpng's headers are installed (Debian/Ubuntu: apt install libpng-dev; Fedora: "
            "libpng-devel), then reinstall fastpipe")
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "PNG":
                raise ValueError(f"PIL reads it as {image.format}, not PNG")
            if image.mode == "1":
                image = image.convert("L")
            array = np.array(image)
    except Image.DecompressionBombError as exc:
        raise _decode.ImageTooLargeError(
            f"image {source}: {exc} (Pillow's own limit, PIL.Image.MAX_IMAGE_PIXELS)") from exc
    except Image.UnidentifiedImageError as exc:  # it names the buffer, not the damage
        raise _corrupt(source, refused or "Pillow does not recognise it as an image") from exc
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad data
        raise _corrupt(source, refused or exc) from exc
    expected = (header.height, header.width) + ((header.channels,) if header.channels > 1 else ())
    dtype = np.uint16 if header.depth == 16 else np.uint8
    if array.shape != expected or array.dtype != dtype:
        raise _corrupt(source, ValueError(
            f"PIL decoded {array.shape} {array.dtype} pixels where the header declares "
            f"{expected} {np.dtype(dtype)}"))
    return array


def _warn_pillow(source: str) -> None:
    """Warns, once a process, that PIL decodes PNGs because fastpipe._png is not built."""
    global _warned_pillow
    if _warned_pillow:
        return
    _warned_pillow = True
    warnings.warn(
        f"fastpipe._png is not built, so PNGs decode with Pillow (the first: {source}), which "
        "checks no IDAT CRC and fills the rows of an image stream that ends early with zeros: "
        "damaged PNGs can decode to wrong pixels without an error. Install libpng's headers "
        "(Debian/Ubuntu: apt install libpng-dev; Fedora: libpng-devel) and reinstall fastpipe",
        RuntimeWarning, stacklevel=3)


def _corrupt(source: str, exc: BaseException | str):
    from fastpipe.data.decode.budget import CorruptImageError

    return CorruptImageError(
        f"cannot decode image {source}: {exc}. The file is damaged, truncated or not an image; "
        "remove it from the dataset or replace it")


def decode_rgb_png(data, source: str = "<bytes>") -> np.ndarray | None:
    """A PNG as the ``(H, W, 3)`` uint8 array ``np.array(PIL.Image.open(f).convert("RGB"))``
    gives, pixel for pixel, decoded by fastpipe._png; None when ``data`` is not a PNG, when
    fastpipe._png is not built (a RuntimeWarning, once a process), or when it declines the file
    without calling it damaged: the
    caller then decodes it with PIL. A damaged file is a CorruptImageError naming ``source`` and
    the module's reason (PIL is not asked again); the header, the pixel budget and the bytes
    present are checked first, whichever decoder follows. As PIL's conversion does: grey is
    repeated into the three channels, alpha is dropped (not composited), 16-bit colour keeps the
    high byte of each sample, 16-bit grey is clipped at 255 (PIL's "I;16" to "RGB"), palette
    indices take their PLTE colours (tRNS is not applied). A palette index past the PLTE's
    entries has no colour: PIL and libpng make it black, here it is a CorruptImageError (the PNG
    specification calls it an error; :func:`decode_png` returns the indices as stored)."""
    if _read_header(data) is None:
        return None
    header = _checked_header(data, source)
    pixels, declined = _judged(data, source, header, None)
    if pixels is None:
        if declined is None:
            _warn_pillow(source)
        return None
    if header.color_type == _PALETTE:
        return _palette_colours(data, pixels, source)
    if header.depth == 16:
        if header.color_type == _GREY:
            pixels = np.minimum(pixels, 255)
        else:
            pixels = pixels >> 8
        pixels = pixels.astype(np.uint8)
    if header.color_type in (_GREY, _GREY_ALPHA):
        grey = pixels if header.color_type == _GREY else pixels[..., 0]
        return np.repeat(grey[..., None], 3, axis=2)
    return np.ascontiguousarray(pixels[..., :3])


def _palette_colours(data, indices: np.ndarray, source: str) -> np.ndarray:
    """``indices`` ``(H, W)`` as the colours of the file's PLTE chunk (which fastpipe._png
    checked, as one palette of whole entries before the image data)."""
    body = _chunk_before_idat(data, b"PLTE")
    if body is None:  # fastpipe._png refuses a palette file without one
        raise _corrupt(source, "a palette image without a PLTE chunk")
    palette = np.frombuffer(body, np.uint8)[:len(body) // 3 * 3].reshape(-1, 3)
    highest = int(indices.max(initial=0))
    if highest >= len(palette):
        raise _corrupt(source, f"a pixel has the palette index {highest}, past the "
                               f"{len(palette)} colours of its PLTE chunk")
    return palette[indices]


def _chunk_before_idat(data, kind: bytes) -> bytes | None:
    """The body of the first chunk ``kind`` before the image data, or None."""
    pos, end = 8, len(data)
    while pos + 8 <= end:
        length = struct.unpack(">I", bytes(data[pos:pos + 4]))[0]
        name = bytes(data[pos + 4:pos + 8])
        if name == kind:
            return bytes(data[pos + 8:pos + 8 + length])
        if name == b"IDAT":
            return None
        pos += 12 + length
    return None
