"""fastpipe.data.decode.png: the stored pixels of every PNG kind, equal to PIL's where PIL keeps
them, rows, the pixel budget, damaged files; and decode_rgb's PNG pixels equal to PIL's
convert("RGB").

The PNGs are written by PIL and by a small writer here (zlib + the chunk layout of the PNG
specification), which also writes what PIL cannot: 2/4-bit grey, 16-bit colour, Adam7 interlacing.
"""

from __future__ import annotations

import io
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from PIL import Image

from fastpipe.data.decode import budget as _decode
from fastpipe.data.decode import png as _png
from fastpipe.data.decode.budget import CorruptImageError, ImageTooLargeError
from fastpipe.data.decode.image import decode_rgb
from fastpipe.data.decode.png import decode_png, decode_rgb_png, png_size
from tests.helpers.cpu_path import built_module, turns_inside_calls

GREY, RGB, PALETTE, GREY_ALPHA, RGBA = 0, 2, 3, 4, 6
CHANNELS = {GREY: 1, RGB: 3, PALETTE: 1, GREY_ALPHA: 2, RGBA: 4}
# Adam7: (first row, first column, row step, column step) of each pass.
ADAM7 = ((0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2),
         (1, 0, 2, 1))



@pytest.fixture
def native():
    """fastpipe._png (libpng); skips when it is not built, fails instead with
    FASTPIPE_REQUIRE_PNG=1 (where libpng's headers are installed)."""
    return built_module("fastpipe._png", "install libpng's headers (libpng-dev) and rebuild",
                        "FASTPIPE_REQUIRE_PNG")


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _row_bytes(row: np.ndarray, depth: int) -> bytes:
    """One scanline's samples, packed (sub-byte depths) or big-endian (16 bits)."""
    samples = row.reshape(-1)
    if depth == 16:
        return samples.astype(">u2").tobytes()
    if depth == 8:
        return samples.astype(np.uint8).tobytes()
    per_byte = 8 // depth
    padded = np.zeros(-(-samples.size // per_byte) * per_byte, dtype=np.uint8)
    padded[:samples.size] = samples
    groups = padded.reshape(-1, per_byte)
    shifts = np.arange(per_byte - 1, -1, -1) * depth
    return (groups.astype(np.uint16) << shifts).sum(axis=1).astype(np.uint8).tobytes()


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _filtered(rows: list[bytes], bpp: int, filters) -> bytes:
    """``rows`` (one pass's scanlines) each with its filter type byte and filtered bytes: the
    specification's definitions, byte by byte, with no code shared with the decoders."""
    out, above = [], bytes(len(rows[0]))
    for y, row in enumerate(rows):
        kind = filters[y % len(filters)]
        line = bytearray([kind])
        for i, x in enumerate(row):
            a = row[i - bpp] if i >= bpp else 0
            b = above[i]
            c = above[i - bpp] if i >= bpp else 0
            predictor = (0, a, b, (a + b) // 2, _paeth(a, b, c))[kind]
            line.append((x - predictor) & 0xFF)
        out.append(bytes(line))
        above = row
    return b"".join(out)


def write_png(samples: np.ndarray, depth: int, color_type: int, *, palette: bytes | None = None,
              trns: bytes | None = None, interlaced: bool = False, idat_size: int = 0,
              filters=(0,)) -> bytes:
    """A PNG of ``samples`` ((H, W) or (H, W, C) stored values), the filter types ``filters``
    on the rows in turn (filter None by default). ``idat_size`` > 0 splits the deflate stream over
    IDAT chunks of that size."""
    height, width = samples.shape[:2]
    bpp = max(1, CHANNELS[color_type] * depth // 8)
    passes = [samples]
    if interlaced:
        passes = [samples[y0::dy, x0::dx] for y0, x0, dy, dx in ADAM7]
    raw = b"".join(_filtered([_row_bytes(r, depth) for r in sub], bpp, filters)
                   for sub in passes if sub.shape[0] and sub.shape[1])
    stream = zlib.compress(raw, 6)
    size = idat_size or len(stream)
    parts = [stream[i:i + size] for i in range(0, len(stream), size)]
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(
        ">IIBBBBB", width, height, depth, color_type, 0, 0, int(interlaced)))
    if palette is not None:
        out += _chunk(b"PLTE", palette)
    if trns is not None:
        out += _chunk(b"tRNS", trns)
    return out + b"".join(_chunk(b"IDAT", p) for p in parts) + _chunk(b"IEND", b"")


def _samples(rng, height, width, depth, color_type):
    shape = (height, width) + ((CHANNELS[color_type],) if CHANNELS[color_type] > 1 else ())
    return rng.integers(0, 1 << depth, shape).astype(np.uint16 if depth == 16 else np.uint8)


def _pil_pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        # PIL's mode "1" array is bool; decode_png gives its "L" values (0 and 255).
        return np.asarray(image.convert("L") if image.mode == "1" else image)


def _pil_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.array(image.convert("RGB"))


# Every kind PIL decodes without changing the stored values: (depth, colour type, extra chunks).
LOSSLESS_KINDS = [
    (1, GREY, {}), (2, GREY, {}), (4, GREY, {}), (8, GREY, {}), (16, GREY, {}),
    (8, GREY, {"trns": b"\x00\x07"}),
    (1, PALETTE, {}), (2, PALETTE, {}), (4, PALETTE, {}), (8, PALETTE, {}),
    (8, PALETTE, {"trns": bytes(range(0, 200, 2))}), (4, PALETTE, {"trns": b"\x00\x80"}),
    (8, RGB, {}), (8, RGB, {"trns": b"\x00\x01\x00\x02\x00\x03"}), (8, RGBA, {}),
    (8, GREY_ALPHA, {}),
]


def _kind_id(kind) -> str:
    depth, color_type, extra = kind
    name = {GREY: "grey", RGB: "rgb", PALETTE: "palette", GREY_ALPHA: "grey_alpha", RGBA: "rgba"}
    return f"{name[color_type]}{depth}" + ("+trns" if extra else "")


SIZES = [(1, 1), (7, 13), (13, 7), (33, 1), (1, 29), (64, 48)]


def _kind_png(rng, depth, color_type, extra, height, width, interlaced=False):
    samples = _samples(rng, height, width, depth, color_type)
    palette = None
    if color_type == PALETTE:
        samples %= min(1 << depth, 100)
        palette = rng.integers(0, 256, 3 * min(1 << depth, 100)).astype(np.uint8).tobytes()
    return samples, write_png(samples, depth, color_type, palette=palette, interlaced=interlaced,
                              **extra)


@pytest.mark.parametrize("interlaced", [False, True], ids=["plain", "adam7"])
@pytest.mark.parametrize("depth,color_type,extra", LOSSLESS_KINDS,
                         ids=[_kind_id(k) for k in LOSSLESS_KINDS])
def test_decode_png_equals_pil(depth, color_type, extra, interlaced):
    rng = np.random.default_rng(depth * 10 + color_type)
    for height, width in SIZES:
        samples, data = _kind_png(rng, depth, color_type, extra, height, width, interlaced)
        expected = _pil_pixels(data)
        out = decode_png(data, "kind.png")
        assert out.dtype == expected.dtype and out.shape == expected.shape
        np.testing.assert_array_equal(out, expected)
        if depth in (8, 16) or color_type == PALETTE:  # stored values, not scaled
            np.testing.assert_array_equal(out, samples)
        assert png_size(data) == (height, width)


# Every pixel size the filters see: 1 (grey 8, palette 8), 2 (grey + alpha 8, grey 16), 3 (RGB 8),
# 4 (RGBA 8, grey + alpha 16), 6 (RGB 16), 8 (RGBA 16); and sub-byte rows (libpng's).
PIXEL_SIZES = [(8, GREY), (8, PALETTE), (8, GREY_ALPHA), (16, GREY), (8, RGB), (8, RGBA),
               (16, GREY_ALPHA), (16, RGB), (16, RGBA), (4, GREY), (2, PALETTE)]


# "paeth runs": two Paeth rows are undone together (unfilter.h's paeth2), so runs of every
# parity, broken by other filters, meet every band's start and end.
@pytest.mark.parametrize("filters", [(0,), (1,), (2,), (3,), (4,), (4, 1, 3, 2, 0, 4),
                                     (4, 4, 2, 4, 4, 4, 1, 4, 3)],
                         ids=["none", "sub", "up", "average", "paeth", "mixed", "paeth runs"])
@pytest.mark.parametrize("depth,color_type", PIXEL_SIZES,
                         ids=[_kind_id((d, c, {})) for d, c in PIXEL_SIZES])
def test_every_filter_on_every_pixel_size(depth, color_type, filters):
    """Each filter type undone exactly, whole and for bands, at widths that end the SIMD loops at
    every offset; values near 0 and 255 make the sums wrap."""
    rng = np.random.default_rng(depth * 7 + color_type)
    for height, width in ((1, 1), (5, 2), (9, 17), (12, 33)):
        samples = _samples(rng, height, width, depth, color_type)
        if color_type == PALETTE:
            samples %= 4
        palette = bytes(range(12)) if color_type == PALETTE else None
        data = write_png(samples, depth, color_type, palette=palette, filters=filters,
                         idat_size=7)
        out = decode_png(data, "f.png")
        expected = samples if depth in (8, 16) or color_type == PALETTE else _pil_pixels(data)
        np.testing.assert_array_equal(out, expected)
        if depth == 8 and color_type != PALETTE:
            np.testing.assert_array_equal(out, _pil_pixels(data))
        for rows in ((0, 1), (height - 1, height), (height // 2, height), (1, height - 1),
                     (2, height), (3, 6)):
            if rows[0] < rows[1] <= height:
                np.testing.assert_array_equal(decode_png(data, "f.png", rows), out[rows[0]:rows[1]])


def test_damaged_idat_is_an_error_naming_the_file(native):
    samples = _samples(np.random.default_rng(9), 30, 20, 8, RGB)
    data = bytearray(write_png(samples, 8, RGB, filters=(4, 1), idat_size=64))
    first_idat = data.index(b"IDAT")
    data[first_idat + 10] ^= 0x40  # the chunk's CRC no longer matches
    with pytest.raises(ValueError, match="CRC error"):  # libpng's words, from fastpipe's decoder
        _png._decode_native(bytes(data), _png._read_header(data), None)
    with pytest.raises(CorruptImageError, match="bad.png"):  # PIL, the fallback, refuses it too
        decode_png(bytes(data), "bad.png")
    data = bytearray(write_png(samples, 8, RGB, filters=(4, 1)))
    start = data.index(b"IDAT") + 4
    stream = bytearray(zlib.decompressobj().decompress(bytes(data[start:])))
    stream[0] = 7  # a filter type the specification does not define, with a valid stream
    damaged = write_png(samples, 8, RGB)[:start - 8]
    body = zlib.compress(bytes(stream))
    damaged += _chunk(b"IDAT", body) + _chunk(b"IEND", b"")
    with pytest.raises(ValueError, match="bad adaptive filter value"):
        _png._decode_native(damaged, _png._read_header(damaged), None)
    with pytest.raises(CorruptImageError, match="bad.png"):
        decode_png(damaged, "bad.png")


def test_sub_byte_grey_is_scaled_as_pil_does():
    rng = np.random.default_rng(1)
    for depth, factor in ((1, 255), (2, 85), (4, 17)):
        samples = _samples(rng, 9, 11, depth, GREY)
        out = decode_png(write_png(samples, depth, GREY))
        np.testing.assert_array_equal(out, samples.astype(np.uint8) * factor)


def test_pil_written_files_every_filter():
    """PIL chooses filters adaptively (Sub, Up, Average, Paeth), which the writer here never
    uses."""
    rng = np.random.default_rng(2)
    smooth = np.cumsum(rng.integers(-3, 4, (70, 90, 4)), axis=1).clip(0, 255).astype(np.uint8)
    for image in (Image.fromarray(smooth, "RGBA"), Image.fromarray(smooth[..., :3], "RGB"),
                  Image.fromarray(smooth[..., 0], "L"),
                  Image.fromarray(smooth[..., :2], "LA"),
                  Image.fromarray(smooth[..., 0].astype(np.uint16) * 257),
                  Image.fromarray(smooth[..., :3], "RGB").convert("P"),
                  Image.fromarray(smooth[..., 0] > 120)):
        buffer = io.BytesIO()
        image.save(buffer, "PNG", optimize=False)
        data = buffer.getvalue()
        np.testing.assert_array_equal(decode_png(data), _pil_pixels(data))
        np.testing.assert_array_equal(decode_rgb(data), _pil_rgb(data))


@pytest.mark.parametrize("interlaced", [False, True], ids=["plain", "adam7"])
@pytest.mark.parametrize("color_type", [RGB, RGBA, GREY_ALPHA])
def test_16_bit_colour_keeps_the_stored_values(color_type, interlaced):
    rng = np.random.default_rng(color_type)
    for height, width in ((1, 1), (17, 23)):
        samples = _samples(rng, height, width, 16, color_type)
        data = write_png(samples, 16, color_type, interlaced=interlaced)
        out = decode_png(data)
        assert out.dtype == np.uint16
        np.testing.assert_array_equal(out, samples)
        # decode_rgb: PIL's reduction (the high byte; grey + alpha repeated grey).
        np.testing.assert_array_equal(decode_rgb(data), _pil_rgb(data))


@pytest.mark.parametrize("interlaced", [False, True], ids=["plain", "adam7"])
def test_rows_are_the_slice_of_the_whole_decode(interlaced):
    rng = np.random.default_rng(3)
    for depth, color_type, extra in LOSSLESS_KINDS + [(16, RGB, {})]:
        _, data = _kind_png(rng, depth, color_type, extra, 21, 10, interlaced)
        whole = decode_png(data)
        for rows in ((0, 21), (0, 1), (20, 21), (5, 13), (7, 8)):
            part = decode_png(data, "r.png", rows=rows)
            np.testing.assert_array_equal(part, whole[rows[0]:rows[1]])


def test_rows_out_of_range_are_an_error():
    data = write_png(np.zeros((4, 4), np.uint8), 8, GREY)
    for rows in ((0, 0), (2, 1), (-1, 2), (0, 5)):
        with pytest.raises(ValueError, match="0 <= top < bottom <= 4"):
            decode_png(data, rows=rows)


def test_rows_stop_after_the_last_row_needed(native):
    """Rows below the band are not inflated: garbage in the deflate stream after the band's
    IDAT chunks (CRCs correct, IEND present) fails the whole decode but not the top rows."""
    rng = np.random.default_rng(4)
    samples = rng.integers(0, 256, (64, 64, 3)).astype(np.uint8)
    data = write_png(samples, 8, RGB, idat_size=512)
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        chunks.append(data[pos:pos + 12 + length])
        pos += 12 + length
    idats = [i for i, c in enumerate(chunks) if c[4:8] == b"IDAT"]
    for i in idats[len(idats) // 2:]:
        chunks[i] = _chunk(b"IDAT", bytes(rng.integers(0, 256, 512, dtype=np.uint8)))
    damaged = data[:8] + b"".join(chunks)
    with pytest.raises(CorruptImageError, match="damaged.png"):
        decode_png(damaged, "damaged.png")
    np.testing.assert_array_equal(decode_png(damaged, rows=(0, 4)), samples[:4])


def test_the_gil_is_released_while_decoding(native):
    """Another Python thread runs while libpng decodes (thread-based loaders scale)."""
    rng = np.random.default_rng(9)
    data = write_png(rng.integers(0, 256, (600, 600, 3)).astype(np.uint8), 8, RGB)
    inside, busy = turns_inside_calls(lambda: decode_png(data))
    assert inside > 1000 * busy, f"{inside} main-thread turns in {busy:.3f} s of decoding"


def test_truncated_file_is_an_error_for_every_band():
    """Without the IEND chunk at the end the whole image is decoded, so a truncated file is not
    accepted for the rows above the cut and refused below it."""
    rng = np.random.default_rng(5)
    samples = rng.integers(0, 256, (64, 64, 3)).astype(np.uint8)
    data = write_png(samples, 8, RGB)
    cut = data[:len(data) // 2]
    for rows in (None, (0, 1), (60, 64)):
        with pytest.raises(CorruptImageError, match="cut.png"):
            decode_png(cut, "cut.png", rows=rows)


def test_png_size_reads_only_the_header():
    data = write_png(np.zeros((3, 5), np.uint8), 8, GREY)
    assert png_size(data[:33]) == (3, 5)
    assert png_size(b"\xff\xd8\xff\xe0") is None
    assert png_size(b"") is None
    assert png_size(np.frombuffer(data, np.uint8)) == (3, 5)


def _huge_png(height: int, width: int) -> bytes:
    return write_png(np.zeros((1, 1, 3), np.uint8), 8, RGB).replace(
        struct.pack(">II", 1, 1), struct.pack(">II", width, height), 1)


def test_pixel_budget_refuses_before_allocating(monkeypatch):
    header = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8,
                                                                    RGB, 0, 0, 0))
    data = header + _chunk(b"IDAT", zlib.compress(b"\0" * 100)) + _chunk(b"IEND", b"")
    tracemalloc.start()
    try:
        for decode in (decode_png, decode_rgb, lambda d, s: decode_png(d, s, rows=(0, 1))):
            with pytest.raises(ImageTooLargeError, match="bomb.png"):
                decode(data, "bomb.png")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    monkeypatch.setattr(_decode, "MAX_IMAGE_PIXELS", 99)
    small = write_png(np.zeros((10, 10), np.uint8), 8, GREY)
    with pytest.raises(ImageTooLargeError, match="small.png"):
        decode_png(small, "small.png")
    monkeypatch.setattr(_decode, "MAX_IMAGE_PIXELS", 100)
    assert decode_png(small).shape == (10, 10)


def test_not_a_png_and_invalid_headers_name_the_source():
    for data in (b"", b"GIF89a", b"\x89PNG\r\n\x1a\n", b"\x89PNG\r\n\x1a\n" + _chunk(
            b"IHDR", struct.pack(">IIBBBBB", 4, 4, 3, RGB, 0, 0, 0)),
            b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 0, 4, 8, 0, 0, 0, 0))):
        with pytest.raises(CorruptImageError, match="bad.png"):
            decode_png(data, "bad.png")


def _fix_crcs(data: bytearray) -> bytearray:
    """Every whole chunk's CRC recomputed, so that a mutation reaches the inflate and the
    filters instead of stopping at a CRC check."""
    pos = 8
    while pos + 12 <= len(data):
        end = pos + 8 + int.from_bytes(data[pos:pos + 4], "big")
        if end + 4 > len(data):
            break
        data[end:end + 4] = struct.pack(">I", zlib.crc32(bytes(data[pos + 4:end])))
        pos = end + 4
    return data


def test_mutated_files_decode_or_raise_corrupt_image_error():
    """A few hundred random mutations (byte changes, truncations, insertions, chunk-length
    changes; the chunks' CRCs fixed up after half of them) of PNGs of several kinds: each
    decodes to the header's shape or raises CorruptImageError naming the source; never a crash
    or another exception; decode_png and decode_rgb take the same verdict on the whole file."""
    rng = np.random.default_rng(6)
    seeds = [_kind_png(rng, d, c, e, 19, 23, i)[1]
             for (d, c, e), i in ((LOSSLESS_KINDS[3], False), (LOSSLESS_KINDS[8], False),
                                  (LOSSLESS_KINDS[12], True), (LOSSLESS_KINDS[15], False))]
    seeds.append(write_png(_samples(rng, 19, 23, 16, RGB), 16, RGB))
    outcomes = {"decoded": 0, "refused": 0}
    for i in range(400):
        data = bytearray(seeds[i % len(seeds)])
        kind = rng.integers(4)
        if kind == 0:
            for _ in range(rng.integers(1, 4)):
                data[rng.integers(8, len(data))] = rng.integers(256)
        elif kind == 1:
            data = data[:rng.integers(8, len(data))]
        elif kind == 2:
            at = rng.integers(8, len(data))
            data[at:at] = bytes(rng.integers(0, 256, rng.integers(1, 9), dtype=np.uint8))
        else:  # the IDAT's length field
            at = data.find(b"IDAT") - 4
            data[at:at + 4] = struct.pack(">I", int(rng.integers(0, 1 << 31)))
        if i % 2:
            data = _fix_crcs(data)
        rows = None if i % 3 else (2, 9)
        verdicts = []
        for decode, shape in ((lambda d, rows=rows: decode_png(d, "mutant.png", rows=rows),
                               (19 if rows is None else 7, 23)),
                              (lambda d: decode_rgb(d, "mutant.png"), (19, 23, 3))):
            try:
                out = decode(bytes(data))
            except CorruptImageError as exc:
                assert "mutant.png" in str(exc)
                outcomes["refused"] += 1
                verdicts.append("palette" if "palette index" in str(exc) else "refused")
            else:
                assert out.shape[:2] == shape[:2] and out.ndim in (2, 3)
                outcomes["decoded"] += 1
                verdicts.append("decoded")
        if rows is None and _png._native_decode is not None and verdicts[1] != "palette":
            assert verdicts[0] == verdicts[1], f"mutation {i}: decode_png and decode_rgb differ"
    assert outcomes["decoded"] > 20 and outcomes["refused"] > 50


RGB_KINDS = LOSSLESS_KINDS + [(16, RGB, {}), (16, RGBA, {}), (16, GREY_ALPHA, {})]


@pytest.mark.parametrize("depth,color_type,extra", RGB_KINDS, ids=[_kind_id(k) for k in RGB_KINDS])
def test_decode_rgb_pixels_unchanged_for_png(depth, color_type, extra):
    """decode_rgb gives PIL's convert("RGB") pixels, as it did when PIL decoded every PNG;
    fastpipe._png decodes every kind when it is built (palette indices then take their PLTE
    colours)."""
    rng = np.random.default_rng(7)
    for height, width in ((1, 1), (17, 9)):
        for interlaced in (False, True):
            _, data = _kind_png(rng, depth, color_type, extra, height, width, interlaced)
            out = decode_rgb(data, "x.png")
            assert out.dtype == np.uint8 and out.flags.c_contiguous
            np.testing.assert_array_equal(out, _pil_rgb(data))
            fast = decode_rgb_png(data, "x.png")
            if _png._native_decode is None:
                assert fast is None
            else:
                np.testing.assert_array_equal(fast, out)


def test_grey16_to_rgb_clips_as_pil_does():
    values = np.array([[0, 1, 254, 255, 256, 511, 4000, 65535]], np.uint16)
    data = write_png(values, 16, GREY)
    np.testing.assert_array_equal(decode_rgb(data)[..., 0], [[0, 1, 254, 255, 255, 255, 255,
                                                              255]])
    np.testing.assert_array_equal(decode_rgb(data), _pil_rgb(data))


@pytest.mark.filterwarnings("ignore:fastpipe._png is not built")
def test_pil_fallback_gives_the_same_pixels(monkeypatch):
    """Without fastpipe._png, PIL decodes the same arrays; 16-bit colour, which PIL would reduce
    to 8 bits, is an error naming the missing extension."""
    rng = np.random.default_rng(8)
    cases = [_kind_png(rng, d, c, e, 11, 6, i)[1]
             for d, c, e in LOSSLESS_KINDS[::3] for i in (False, True)]
    expected = [(decode_png(data), decode_png(data, rows=(3, 7)), decode_rgb(data))
                for data in cases]
    deep = write_png(_samples(rng, 5, 4, 16, RGB), 16, RGB)
    deep_rgb = decode_rgb(deep)
    monkeypatch.setattr(_png, "_native_decode", None)
    for data, (whole, rows, rgb) in zip(cases, expected):
        np.testing.assert_array_equal(decode_png(data), whole)
        np.testing.assert_array_equal(decode_png(data, rows=(3, 7)), rows)
        np.testing.assert_array_equal(decode_rgb(data), rgb)
        assert decode_rgb_png(data) is None
    with pytest.raises(ImportError, match="deep.png is a 16-bit colour PNG.*libpng-dev"):
        decode_png(deep, "deep.png")
    np.testing.assert_array_equal(decode_rgb(deep), deep_rgb)  # PIL's reduction, as before


def test_numpy_and_memoryview_inputs():
    """Packs hand images over as numpy uint8 arrays (h5py) or memoryviews."""
    rng = np.random.default_rng(10)
    samples = _samples(rng, 12, 9, 8, RGBA)
    data = write_png(samples, 8, RGBA)
    for given in (np.frombuffer(data, np.uint8), memoryview(data), bytearray(data)):
        np.testing.assert_array_equal(decode_png(given), samples)
        np.testing.assert_array_equal(decode_png(given, rows=(4, 6)), samples[4:6])
        np.testing.assert_array_equal(decode_rgb(given), samples[..., :3])


# --- a damage verdict is final (issue 40) ------------------------------------------------------


def _stored_png(samples: np.ndarray, color_type: int = RGB, **extra) -> bytes:
    """A PNG whose deflate stream is stored (level 0) and goes on past the last row: a byte
    changed inside it changes one sample, and Pillow, which stops inflating after the last row,
    never reaches the stream's own checksum."""
    raw = b"".join(b"\0" + r.tobytes() for r in samples)
    return _replace_idat(write_png(samples, 8, color_type, **extra),
                         zlib.compress(raw + bytes(64), 0))


def _replace_idat(data: bytes, stream: bytes) -> bytes:
    start = data.index(b"IDAT") - 4
    end = data.index(b"IEND") - 4
    return data[:start] + _chunk(b"IDAT", stream) + data[end:]


def _damaged_files(samples: np.ndarray) -> dict[str, bytes]:
    """Damage fastpipe._png finds and Pillow decodes through: an IDAT byte changed (Pillow does
    not check IDAT CRCs) and a stream that ends after half the rows (Pillow fills the rest with
    zeros)."""
    raw = b"".join(b"\0" + r.tobytes() for r in samples)
    good = _stored_png(samples)
    flipped = bytearray(good)
    flipped[good.index(b"IDAT") + 4 + 2 + 5 + 40] ^= 0xFF  # a sample byte of the stored stream
    return {"IDAT: CRC error": bytes(flipped),
            "not enough image data": _replace_idat(good, zlib.compress(raw[:len(raw) // 2]))}


def test_damage_fastpipe_png_finds_is_never_decoded_by_pillow(native):
    samples = np.random.default_rng(11).integers(0, 256, (32, 20, 3), dtype=np.uint8)
    for reason, data in _damaged_files(samples).items():
        with Image.open(io.BytesIO(data)) as image:  # what the fallback would have returned
            assert not np.array_equal(np.array(image.convert("RGB")), samples)
        for decode in (lambda d: decode_png(d, "hurt.png"),
                       lambda d: decode_png(d, "hurt.png", rows=(0, 32)),
                       lambda d: decode_rgb(d, "hurt.png"),
                       lambda d: decode_rgb_png(d, "hurt.png")):
            with pytest.raises(CorruptImageError, match=f"hurt.png: PNG: {reason}"):
                decode(data)


def test_a_decoder_that_declines_without_calling_it_damage_leaves_it_to_pil(monkeypatch,
                                                                           native):
    """fastpipe._png's plain ValueError (a limit of libpng's, not damage) lets PIL decode; its
    DamagedError does not; MemoryError is the machine's."""
    samples = np.random.default_rng(12).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    data = write_png(samples, 8, RGB)

    def raising(error):
        def decode(*args):
            raise error
        return decode

    monkeypatch.setattr(_png, "_native_decode", raising(ValueError("libpng: a user limit")))
    np.testing.assert_array_equal(decode_png(data), samples)
    np.testing.assert_array_equal(decode_rgb(data), samples)
    monkeypatch.setattr(_png, "_native_decode", raising(native.DamagedError("PNG: bad")))
    for decode in (decode_png, decode_rgb):
        with pytest.raises(CorruptImageError, match="x.png: PNG: bad"):
            decode(data, "x.png")
    monkeypatch.setattr(_png, "_native_decode", raising(MemoryError("PNG: out of memory")))
    for decode in (decode_png, decode_rgb):
        with pytest.raises(MemoryError):
            decode(data, "x.png")


def test_the_module_says_which_refusals_are_damage(native):
    samples = np.random.default_rng(13).integers(0, 256, (8, 6, 3), dtype=np.uint8)
    for data in _damaged_files(samples).values():
        out = bytearray(8 * 6 * 3)
        with pytest.raises(native.DamagedError):
            native.decode(data, out, 8, 6, 3, 1, 0, 8, 1 << 30)
    data = write_png(samples, 8, RGB)
    with pytest.raises(ValueError) as refused:  # the caller's arguments, not the file
        native.decode(data, bytearray(8 * 6 * 3), 8, 6, 3, 1, 0, 8, 10)
    assert not isinstance(refused.value, native.DamagedError)


@pytest.mark.parametrize("interlaced", [False, True], ids=["own decoder", "libpng"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_an_ancillary_chunk_with_a_crc_error_is_damage_on_both_decoders(native, interlaced,
                                                                        where):
    """Both decoders inside fastpipe._png check every chunk's CRC, ancillary ones included (the
    own decoder used to skip them unread, libpng to drop them with a warning)."""
    samples = np.random.default_rng(14).integers(0, 256, (10, 9, 3), dtype=np.uint8)
    data = write_png(samples, 8, RGB, interlaced=interlaced)
    text = bytearray(_chunk(b"tEXt", b"Comment\0hello"))
    text[-1] ^= 1
    at = data.index(b"IDAT") - 4 if where == "before" else data.index(b"IEND") - 4
    damaged = data[:at] + bytes(text) + data[at:]
    assert decode_png(data[:at] + _chunk(b"tEXt", b"Comment\0hello") + data[at:]).shape[:2] \
        == (10, 9)
    for decode in (decode_png, decode_rgb):
        with pytest.raises(CorruptImageError, match="text.png: libpng: tEXt: CRC error"):
            decode(damaged, "text.png")


def test_palette_files_take_the_same_verdict_and_pils_colours(native):
    rng = np.random.default_rng(15)
    indices = rng.integers(0, 6, (12, 10), dtype=np.uint8)
    palette = rng.integers(0, 256, 18, dtype=np.uint8).tobytes()
    data = _stored_png(indices, PALETTE, palette=palette)
    expected = _pil_rgb(data)
    np.testing.assert_array_equal(decode_rgb_png(data), expected)  # no longer PIL's to decode
    np.testing.assert_array_equal(decode_rgb(data), expected)
    flipped = bytearray(data)
    flipped[data.index(b"IDAT") + 4 + 2 + 5 + 30] ^= 0x01  # index 1 more, within the palette
    with Image.open(io.BytesIO(bytes(flipped))) as image:  # Pillow takes it
        assert not np.array_equal(np.array(image.convert("RGB")), expected)
    for decode in (decode_png, decode_rgb):
        with pytest.raises(CorruptImageError, match="pal.png: PNG: IDAT: CRC error"):
            decode(bytes(flipped), "pal.png")
    short = write_png(indices, 8, PALETTE, palette=palette[:12])  # indices 4 and 5: no colour
    with Image.open(io.BytesIO(short)) as image:  # Pillow makes them black
        assert (np.array(image.convert("RGB"))[indices >= 4] == 0).all()
    np.testing.assert_array_equal(decode_png(short), indices)  # the stored indices
    with pytest.raises(CorruptImageError, match="short.png: a pixel has the palette index 5, "
                                                "past the 4 colours of its PLTE chunk"):
        decode_rgb(short, "short.png")
    for bad in (palette + b"\x01", b"", palette * 50):  # not whole entries, none, over 256
        broken = write_png(indices, 8, PALETTE, palette=bad)
        for decode in (decode_png, decode_rgb):
            with pytest.raises(CorruptImageError, match="plte.png: libpng: .*(PLTE|palette)"):
                decode(broken, "plte.png")


def _declaring(height: int, width: int, color_type: int = GREY) -> bytes:
    """A few bytes of PNG declaring ``height x width`` pixels (inside the pixel budget) over a
    stream of two rows of zeros."""
    row = 1 + width * CHANNELS[color_type]
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8,
                                                               color_type, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(b"\0" * min(row, 2))) + _chunk(b"IEND", b""))


@pytest.mark.parametrize("shape", [(1, 134_217_729), (134_217_729, 1)], ids=["wide", "tall"])
def test_a_file_too_short_for_its_declared_size_is_refused_before_allocating(shape):
    """Inside the pixel budget, a 67-byte file declaring 134,217,729 pixels took 5 s and 3.9 GB
    when PIL decoded the declared size: refused from the file's length now (deflate expands at
    most 1032:1), before anything its size decides is allocated, with or without the module."""
    data = _declaring(*shape)
    tracemalloc.start()
    try:
        for decode in (decode_png, decode_rgb, decode_rgb_png,
                       lambda d, s: decode_png(d, s, rows=(0, 1))):
            with pytest.raises(CorruptImageError, match=r"short.png: its header declares "
                                                        r".* bytes cannot hold"):
                decode(data, "short.png")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_the_bound_on_the_file_length_never_refuses_a_valid_file():
    """The most compressible image zlib writes (zeros, level 9) is within the bound."""
    samples = np.zeros((2048, 2048), np.uint8)
    data = write_png(samples, 8, GREY)
    data = _replace_idat(data, zlib.compress(b"\0" * (2048 * 2049), 9))
    assert 2048 * 2048 > 1000 * len(data)  # as close to the bound as zlib goes
    np.testing.assert_array_equal(decode_png(data), samples)


def test_png_size_does_not_trust_a_header_that_fails_its_crc():
    data = bytearray(write_png(np.zeros((3, 5), np.uint8), 8, GREY))
    assert png_size(bytes(data)) == (3, 5)
    data[19] = 9  # the width's low byte, CRC unchanged
    assert png_size(bytes(data)) is None
    with pytest.raises(CorruptImageError, match="ihdr.png: .*IHDR: CRC error"):
        decode_png(bytes(data), "ihdr.png")


@pytest.mark.parametrize("interlaced", [False, True], ids=["own decoder", "libpng"])
def test_an_idat_chunk_after_the_stream_s_end_is_checked_against_its_crc(native, interlaced):
    """The zlib stream ends in the first IDAT chunk and a second one follows: libpng checks that
    chunk's CRC when it reads to the end (a CRC error in a critical chunk), and so must
    fastpipe's own decoder, which stopped at the stream's end without reading it. A band that
    ends above the last row reads neither."""
    samples = np.random.default_rng(16).integers(0, 256, (10, 9, 3), dtype=np.uint8)
    data = write_png(samples, 8, RGB, interlaced=interlaced)
    trailing = bytearray(_chunk(b"IDAT", b"\x00\x00\x00\x00"))
    at = data.index(b"IEND") - 4
    sound = data[:at] + bytes(trailing) + data[at:]
    np.testing.assert_array_equal(decode_png(sound), samples)
    trailing[-1] ^= 1
    damaged = data[:at] + bytes(trailing) + data[at:]
    with Image.open(io.BytesIO(damaged)) as image:  # Pillow stops at the last row
        np.testing.assert_array_equal(np.array(image), samples)
    for decode in (decode_png, decode_rgb, lambda d, s: decode_png(d, s, rows=(2, 10))):
        with pytest.raises(CorruptImageError, match="trail.png: (PNG|libpng): IDAT: CRC error"):
            decode(damaged, "trail.png")
    if not interlaced:
        np.testing.assert_array_equal(decode_png(damaged, rows=(2, 5)), samples[2:5])


def test_pillow_in_place_of_a_missing_module_is_a_warning_once(monkeypatch):
    """Without fastpipe._png, Pillow decodes: it checks no IDAT CRC and fills a stream that ends
    early with zeros, so the first PNG it decodes warns (once a process), naming the fix."""
    import warnings

    data = write_png(np.arange(12, dtype=np.uint8).reshape(3, 4), 8, GREY)
    monkeypatch.setattr(_png, "_native_decode", None)
    for decode in (decode_png, decode_rgb):
        monkeypatch.setattr(_png, "_warned_pillow", False, raising=False)
        with pytest.warns(RuntimeWarning, match=r"fastpipe\._png is not built.*first.png.*"
                                                r"libpng-dev"):
            decode(data, "first.png")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            decode(data, "second.png")
