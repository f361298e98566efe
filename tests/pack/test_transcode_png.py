"""Seekable PNGs (``transcode=True`` on PNGs): the same pixels for every decoder, bands that
inflate only their own segments, and a fallback for files that do not keep the promise."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from fastpipe.data import H5Dataset, JointCrop, PairedFolders
from fastpipe.data.decode.png import decode_png
from fastpipe.pack import pack, verify
from fastpipe.pack._transcode import SEEK_CHUNK, seekable_png, segment_rows, transcoded
from tests.data.decode.test_png import (
    GREY,
    GREY_ALPHA,
    PALETTE,
    RGB,
    RGBA,
    _chunk,
    write_png,
)
from tests.helpers.cpu_path import built_module

h5py = pytest.importorskip("h5py", exc_type=ImportError)


@pytest.fixture(autouse=True)
def _native():
    """Every test here needs fastpipe._png: skipped without it, failed instead under
    FASTPIPE_REQUIRE_PNG=1."""
    built_module("fastpipe._png", "install libpng's headers (libpng-dev) and rebuild",
                 "FASTPIPE_REQUIRE_PNG")


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        out.append((data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]))
        pos += 12 + length
    return out


def _smooth(rng, height, width, channels, depth=8) -> np.ndarray:
    """Photo-like rows (neighbours close), so that every filter type gets chosen."""
    steps = rng.integers(-4, 5, (height, width, channels))
    top = (1 << depth) - 1
    values = (np.cumsum(steps, axis=1) + np.cumsum(steps, axis=0) + top // 2).clip(0, top)
    values = values.astype(np.uint16 if depth == 16 else np.uint8)
    return values[..., 0] if channels == 1 else values


KINDS = [(8, GREY, 1), (16, GREY, 1), (8, RGB, 3), (16, RGB, 3), (8, RGBA, 4), (16, RGBA, 4),
         (8, GREY_ALPHA, 2), (8, PALETTE, 1)]


@pytest.mark.parametrize("interlaced", [False, True], ids=["plain", "adam7"])
@pytest.mark.parametrize("depth,color_type,channels", KINDS,
                         ids=[f"{c}-{d}bit" for d, c, _ in KINDS])
def test_the_same_pixels_for_every_decoder_and_every_band(depth, color_type, channels,
                                                          interlaced):
    rng = np.random.default_rng(depth + color_type)
    samples = _smooth(rng, 150, 61, channels, depth)
    palette = None
    if color_type == PALETTE:
        samples %= 50
        palette = rng.integers(0, 256, 150).astype(np.uint8).tobytes()
    extra = {"trns": b"\x00\x10"} if color_type == GREY and depth == 8 else {}
    original = write_png(samples, depth, color_type, palette=palette, interlaced=interlaced,
                         filters=(4, 2, 1, 3), **extra)
    seekable = seekable_png(original, "s.png")
    assert seekable is not None
    chunks = _chunks(seekable)
    kinds = [kind for kind, _ in chunks]
    rows = segment_rows(61 * channels * depth // 8)
    assert kinds.count(b"IDAT") == -(-150 // rows)
    assert kinds.index(SEEK_CHUNK) < kinds.index(b"IDAT")
    assert chunks[0][1][12] == 0  # no longer interlaced
    for kind in (b"PLTE", b"tRNS"):  # the chunks that give the pixels their meaning are kept
        assert (kind in kinds) == (kind in [k for k, _ in _chunks(original)])

    whole = decode_png(seekable, "s.png")
    np.testing.assert_array_equal(whole, samples)
    if depth == 8:  # PIL reduces 16 bits
        with Image.open(io.BytesIO(seekable)) as image:
            np.testing.assert_array_equal(np.asarray(image), samples)
    for top in range(0, 150, 7):
        for height in (1, rows, 2 * rows + 3):
            band = (top, min(150, top + height))
            for seek in (True, False):
                np.testing.assert_array_equal(decode_png(seekable, "s.png", band, seekable=seek),
                                              samples[band[0]:band[1]])


def test_a_band_reads_only_its_segments():
    """Damage above a band goes unread with seekable=True: the band still decodes, while the
    whole file does not, nor the band read from the first row (seekable=False, the default), and
    in an ordinary PNG the same damage breaks every band."""
    samples = _smooth(np.random.default_rng(1), 400, 200, 3)
    original = write_png(samples, 8, RGB, filters=(4,), idat_size=4096)
    seekable = bytearray(seekable_png(original, "s.png"))
    first = seekable.index(b"IDAT") + 4
    seekable[first + 20] ^= 0xFF  # inside the first segment; its CRC no longer matches
    rows = segment_rows(600)
    np.testing.assert_array_equal(decode_png(bytes(seekable), "s.png", (rows, 400),
                                             seekable=True), samples[rows:])
    with pytest.raises(ValueError, match="s.png"):
        decode_png(bytes(seekable), "s.png", (rows, 400))
    with pytest.raises(ValueError, match="s.png"):
        decode_png(bytes(seekable), "s.png", seekable=True)
    plain = bytearray(original)
    plain[plain.index(b"IDAT") + 24] ^= 0xFF
    with pytest.raises(ValueError, match="p.png"):
        decode_png(bytes(plain), "p.png", (300, 400))


def test_a_file_that_breaks_the_promise_is_read_from_the_start():
    """A tool that recompresses the IDAT stream but keeps the index chunk (which PNG editors
    should drop): the chunks no longer start at segment starts, and bands are still right."""
    samples = _smooth(np.random.default_rng(2), 64, 40, 3)
    seekable = seekable_png(write_png(samples, 8, RGB), "s.png")
    chunks = _chunks(seekable)
    count = [kind for kind, _ in chunks].count(b"IDAT")
    index = dict(chunks)[SEEK_CHUNK]
    for filters in ((2,), (0,)):  # rows read the row above; or rows a wrong start can fit
        stream = zlib.compress(b"".join(
            bytes([filters[0]]) + (row - (np.roll(samples, 1, 0)[y] if filters[0] == 2 and y
                                          else 0)).astype(np.uint8).tobytes()
            for y, row in enumerate(samples)))
        cut = len(stream) // count
        parts = [stream[i * cut:(i + 1) * cut] for i in range(count - 1)]
        parts.append(stream[(count - 1) * cut:])
        data = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", dict(chunks)[b"IHDR"])
                + _chunk(SEEK_CHUNK, index) + b"".join(_chunk(b"IDAT", p) for p in parts)
                + _chunk(b"IEND", b""))
        for band in ((8, 16), (30, 64), (63, 64), (5, 40)):
            np.testing.assert_array_equal(decode_png(data, "x.png", band, seekable=True),
                                          samples[band[0]:band[1]])


def _forged() -> tuple[bytes, np.ndarray]:
    """A file whose index is internally consistent (each IDAT a full-flushed segment matching
    its CRC) but whose segments do not start at its rows: 8-bit grey, 2x3, one row per
    segment, the rows' bytes split across the chunks one byte off."""
    stream = b"\x00\x10\x20" + b"\x00\x01\x50" + b"\x00\x60\x70"
    pieces = [stream[0:4], stream[4:7], stream[7:]]
    compressor = zlib.compressobj(6, zlib.DEFLATED, 15)
    chunks = [compressor.compress(pieces[0]) + compressor.flush(zlib.Z_FULL_FLUSH),
              compressor.compress(pieces[1]) + compressor.flush(zlib.Z_FULL_FLUSH),
              compressor.compress(pieces[2]) + compressor.flush(zlib.Z_FINISH)]
    index = struct.pack(">BI3I", 1, 1, *(zlib.crc32(p) for p in pieces))
    data = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 3, 8, 0, 0, 0, 0))
            + _chunk(SEEK_CHUNK, index) + b"".join(_chunk(b"IDAT", c) for c in chunks)
            + _chunk(b"IEND", b""))
    with Image.open(io.BytesIO(data)) as image:
        return data, np.asarray(image)


def test_a_forged_index_is_never_followed_by_default():
    """The index is only followed for files fastpipe wrote (seekable=True, which the readers
    pass for packs written with transcode): a crafted file cannot show fastpipe other pixels
    than every other decoder."""
    data, pixels = _forged()
    np.testing.assert_array_equal(pixels, [[0x10, 0x20], [0x01, 0x50], [0x60, 0x70]])
    for band in ((1, 2), (1, 3), (2, 3), (0, 3)):
        np.testing.assert_array_equal(decode_png(data, "f.png", band), pixels[band[0]:band[1]])
    # With the index followed, the forged segment decodes to what it claims (this is why it is
    # not followed for files of unknown origin).
    assert not np.array_equal(decode_png(data, "f.png", (1, 2), seekable=True), pixels[1:2])


def test_what_is_not_rewritten_keeps_its_bytes():
    sub_byte = write_png(np.zeros((9, 9), np.uint8), 4, GREY)
    assert seekable_png(sub_byte, "g.png") is None
    assert transcoded(sub_byte, "g.png") == sub_byte
    assert transcoded(b"GIF89a....", "x.gif") == b"GIF89a...."


def _folders(root, count=5):
    rng = np.random.default_rng(3)
    (root / "hr").mkdir()
    (root / "lr").mkdir()
    for i in range(count):
        hr = _smooth(rng, 96 + 8 * i, 128, 3)
        Image.fromarray(hr).save(root / "hr" / f"{i}.png")
        Image.fromarray(hr).reduce(2).save(root / "lr" / f"{i}.png")
    return {"lr": root / "lr", "hr": root / "hr"}


def test_a_records_pack_of_paired_pngs_gives_the_same_crops(tmp_path):
    roots = _folders(tmp_path)
    source = PairedFolders(roots).pack_source()
    pack(source, tmp_path / "plain.h5", progress=False)
    report = pack(source, tmp_path / "seek.h5", transcode=True, progress=False)
    assert report.count == 5
    assert verify(tmp_path / "seek.h5").ok
    with h5py.File(tmp_path / "seek.h5") as f:
        offsets = f["_fastpipe/offsets/hr"][:]
        stored = f["hr"][offsets[0]:offsets[1]].tobytes()  # plain h5py, as any reader
    assert SEEK_CHUNK in stored
    np.testing.assert_array_equal(decode_png(stored), np.asarray(Image.open(roots["hr"] / "0.png")))
    crop = JointCrop(24, hflip=0.5, vflip=0.5, rot90=True, factors={"hr": 2})
    a = H5Dataset(tmp_path / "plain.h5", joint=crop, seed=5)
    b = H5Dataset(tmp_path / "seek.h5", joint=crop, seed=5)
    assert (a._seekable, b._seekable) == (False, True)  # the index followed for b only
    for epoch in range(3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        for i in range(5):
            x, y = a[i], b[i]
            assert x.keys() == y.keys()
            for name in ("lr", "hr"):
                assert np.array_equal(x[name], y[name])


def test_an_image_pack_of_pngs_rewrites_them(tmp_path):
    root = tmp_path / "images"
    rng = np.random.default_rng(4)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(_smooth(rng, 80, 70, 3)).save(root / label / f"{i}.png")
    pack(root, tmp_path / "p.h5", transcode=True, progress=False)
    dataset = H5Dataset(tmp_path / "p.h5")
    for i in range(len(dataset)):
        data, _ = dataset.encoded(i)
        assert SEEK_CHUNK in data.tobytes()
        original = np.asarray(Image.open(root / dataset.path(i)))
        np.testing.assert_array_equal(decode_png(data), original)


def test_a_png_to_rewrite_without_the_module_is_an_error_naming_the_fix(monkeypatch):
    from fastpipe.data.decode import png as _png
    from fastpipe.pack import PackError

    data = write_png(np.zeros((4, 4, 3), np.uint8), 8, RGB)
    monkeypatch.setattr(_png, "_native_decode", None)
    with pytest.raises(PackError, match=r"x\.png is a PNG.*fastpipe\._png.*libpng-dev"):
        transcoded(data, "x.png")
