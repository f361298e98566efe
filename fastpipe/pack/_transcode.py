"""``transcode``: encoded images rewritten losslessly so that crops decode only what they show.

- JPEG: a restart marker after every MCU (``fastpipe._jpeg.transcode``, the DCT coefficients
  copied as ``jpegtran`` does).
- PNG: a *seekable* PNG. The rows are re-filtered and compressed in segments of ``R`` rows, each
  segment one IDAT chunk starting after a zlib full flush, with a first row that does not read the
  row above (filter None or Sub); a private ancillary chunk ``fpIX`` before the IDATs says so
  (version, ``R``, and the CRC-32 of each segment's filtered bytes, which the reader checks).
  fastpipe._png (fastpipe/csrc/png/rows.h) then inflates only the segments of a band of rows.
  The file stays a plain PNG of the same pixels: other decoders skip ``fpIX``.

Either rewrite is checked: the new file must decode to the pixels of the old one, else the
original bytes are kept (and so is any file neither rewrite takes).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from fastpipe.data.decode import png as _png
from fastpipe.pack._errors import PackError

SEEK_CHUNK = b"fpIX"
SEEK_VERSION = 1
# Raw bytes per segment: about zlib's 32 KiB window, so a full flush loses little compression,
# while a band reads on average half a segment more than it needs.
SEGMENT_BYTES = 32 * 1024
COMPRESS_LEVEL = 6
# Rows filtered per numpy pass (at least a segment), bounding the temporary arrays to a few MB
# for rows narrower than this.
_BLOCK_BYTES = 1 << 20


def transcoded(data: bytes, source: str) -> bytes:
    """``data`` rewritten for crops (a JPEG or a PNG of 8 or 16 bits per sample), or ``data``
    itself when neither rewrite applies. A JPEG or PNG whose rewrite needs an extension this
    install lacks is an error naming the fix, never stored as it is without a word."""
    if data[:2] == b"\xff\xd8":
        return _jpeg(data, source)
    if data[:8] == _png.PNG_SIGNATURE:
        if _png._native_decode is None:
            raise PackError(_missing(source, "PNG", "fastpipe._png", "libpng-dev"))
        return seekable_png(data, source) or data
    return data


def _missing(source: str, kind: str, module: str, package: str) -> str:
    return (f"transcode: {source} is a {kind}, whose rewrite needs {module}, which this install "
            f"was built without: install the headers (Debian/Ubuntu: apt install {package}) and "
            "reinstall fastpipe, or pack without transcode")


def _jpeg(data: bytes, source: str) -> bytes:
    try:
        from fastpipe._jpeg import transcode
    except ImportError as exc:
        raise PackError(_missing(source, "JPEG", "fastpipe._jpeg", "libjpeg62-turbo-dev")) from exc
    try:
        return transcode(data)
    except ValueError:
        # What libjpeg-turbo warns about (the input check decoded it) is kept as it is: the same
        # pixels, through the whole-image path.
        return data


def _chunks(data: bytes):
    """``(type, whole chunk bytes)`` of each chunk after the signature, through IEND."""
    pos = 8
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        end = pos + 12 + length
        if end > len(data):
            return
        kind = data[pos + 4:pos + 8]
        yield kind, data[pos:end]
        if kind == b"IEND":
            return
        pos = end


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (struct.pack(">I", len(body)) + kind + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))


def segment_rows(row_bytes: int) -> int:
    """Rows per segment for rows of ``row_bytes`` raw bytes."""
    return max(1, -(-SEGMENT_BYTES // (row_bytes + 1)))


def seekable_png(data: bytes, source: str) -> bytes | None:
    """A seekable PNG of the same pixels as ``data``, or None for a PNG below 8 bits per sample
    (which this does not rewrite). Needs fastpipe._png."""
    header = _png._read_header(data)
    if header is None or header.depth < 8:
        return None
    pixels = _png.decode_png(data, source)
    sample = ">u2" if header.depth == 16 else "u1"
    raw = np.ascontiguousarray(pixels, dtype=sample).view(np.uint8)
    raw = raw.reshape(header.height, -1)
    bpp = header.channels * header.depth // 8
    rows = segment_rows(raw.shape[1])

    ihdr = bytearray(data[16:29])
    ihdr[12] = 0  # not interlaced: rows must be in order to be seekable
    before, after, seen_idat = [], [], False
    for kind, whole in _chunks(data):
        if kind == b"IDAT":
            seen_idat = True
        elif kind not in (b"IHDR", b"IEND", SEEK_CHUNK):
            (after if seen_idat else before).append(whole)
    segments, crcs = zip(*_segments(raw, bpp, rows))
    index = struct.pack(f">BI{len(crcs)}I", SEEK_VERSION, rows, *crcs)
    out = [_png.PNG_SIGNATURE, _chunk(b"IHDR", bytes(ihdr)), *before, _chunk(SEEK_CHUNK, index)]
    out += [_chunk(b"IDAT", segment) for segment in segments]
    out += [*after, _chunk(b"IEND", b"")]
    rewritten = b"".join(out)
    # Never store other pixels than the input's, whether read whole or through the index.
    same = np.array_equal(_png.decode_png(rewritten, source), pixels)
    if same and header.height > rows:
        band = _png.decode_png(rewritten, source, (rows, header.height), seekable=True)
        same = np.array_equal(band, pixels[rows:])
    if not same:
        raise PackError(f"transcode: the seekable rewrite of {source} does not decode to its "
                        "pixels (a fastpipe bug: please report it); pack without transcode")
    return rewritten


def _segments(raw: np.ndarray, bpp: int, rows: int):
    """``(compressed bytes, CRC-32 of the filtered bytes)`` of each segment of ``rows`` rows of
    ``raw`` ``(H, row bytes)``."""
    height, width = raw.shape
    compressor = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 15, 9, zlib.Z_FILTERED)
    block = max(rows, _BLOCK_BYTES // max(width, 1) // rows * rows)
    for start in range(0, height, block):
        stop = min(height, start + block)
        above = raw[start - 1] if start > 0 else np.zeros(width, np.uint8)
        filtered = filter_rows(raw[start:stop], above, bpp, first_of_segment=
                               (np.arange(start, stop) % rows) == 0)
        for top in range(0, stop - start, rows):
            segment = filtered[top:top + rows].tobytes()
            last = start + top + rows >= height
            yield (compressor.compress(segment)
                   + compressor.flush(zlib.Z_FINISH if last else zlib.Z_FULL_FLUSH),
                   zlib.crc32(segment))


def filter_rows(raw: np.ndarray, above: np.ndarray, bpp: int,
                first_of_segment: np.ndarray) -> np.ndarray:
    """``raw`` ``(h, n)`` filtered row by row, each row with the filter of the smallest sum of
    absolute (signed byte) values, libpng's heuristic; rows marked ``first_of_segment`` choose
    only None or Sub. Returns ``(h, 1 + n)`` uint8: the filter type, then the filtered bytes."""
    x = raw.astype(np.int16)
    b = np.concatenate([above[None].astype(np.int16), x[:-1]])
    a = np.zeros_like(x)
    a[:, bpp:] = x[:, :-bpp]
    c = np.zeros_like(x)
    c[:, bpp:] = b[:, :-bpp]
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    candidates = np.stack([x, x - a, x - b, x - (a + b) // 2, x - paeth]).astype(np.uint8)
    cost = np.abs(candidates.view(np.int8).astype(np.int32)).sum(axis=2)
    cost[2:, first_of_segment] = np.iinfo(cost.dtype).max
    choice = cost.argmin(axis=0)
    out = np.empty((x.shape[0], x.shape[1] + 1), np.uint8)
    out[:, 0] = choice
    out[:, 1:] = candidates[choice, np.arange(x.shape[0])]
    return out
