"""Transcoded JPEGs (a restart marker after every MCU): lossless, and region decodes that read only
the segments around the crop give the same pixels as the original file's region decode."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg

from tests.jpeg.test_region import (
    JPEG_KINDS,
    _encode_with_sampling,
    _photo,
    _region_pixels,
    _regions,
    _whole,
)

pytestmark = pytest.mark.timeout(300)


def _segment_starts(data: bytes) -> list[int]:
    """Offsets of the bytes after each restart marker (the second segment on)."""
    starts, at = [], data.index(b"\xff\xda")
    while (at := data.find(b"\xff", at + 1)) != -1:
        if 0xD0 <= data[at + 1] <= 0xD7:
            starts.append(at + 2)
    return starts


@pytest.mark.parametrize("kind", sorted(JPEG_KINDS))
def test_transcoding_is_lossless_and_adds_a_restart_marker_per_mcu(jpeg, kind):
    data = JPEG_KINDS[kind]()
    transcoded = jpeg.transcode(data)
    assert np.array_equal(simplejpeg.decode_jpeg(transcoded), simplejpeg.decode_jpeg(data))
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    mcu = 8 if kind == "grey" else 16 if kind.startswith("420") else 8 * (2 if kind == "422" else 1)
    mcu_h = 8 if kind in ("grey", "422", "444") else 16
    assert len(_segment_starts(transcoded)) + 1 == -(-height // mcu_h) * -(-width // mcu)
    assert b"\xff\xc0" in transcoded  # baseline, progressive sources included


@pytest.mark.parametrize("kind", sorted(JPEG_KINDS))
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("fast_upsample", [True, False])
def test_regions_of_the_transcoded_file_equal_the_originals(jpeg, kind, k, fast_upsample):
    data = JPEG_KINDS[kind]()
    transcoded = jpeg.transcode(data)
    height, width = _whole(data, k, fast_upsample).shape[:2]
    rng = np.random.default_rng(k)
    boxes = _regions(height, width, rng) + [
        (height // 3, width // 3, height // 4 or 1, width // 4 or 1)]
    for box in boxes:
        want = _region_pixels(jpeg.decode_region, data, k, box, fast_upsample)
        got = _region_pixels(jpeg.decode_region, transcoded, k, box, fast_upsample)
        np.testing.assert_array_equal(got, want, err_msg=f"{kind} 1/{k} {box}")


@pytest.mark.parametrize("h, v", [(4, 2), (2, 4), (4, 1)])
def test_unusual_chroma_sampling_stays_exact(jpeg, sampling_encoder, h, v):
    data = _encode_with_sampling(sampling_encoder, _photo(120, 160, 7), h, v)
    transcoded = jpeg.transcode(data)
    for k in (1, 2, 4):
        box = (-(-120 // k) // 3, -(-160 // k) // 3, -(-120 // k) // 3, -(-160 // k) // 4)
        want = _region_pixels(jpeg.decode_region, data, k, box, True)
        np.testing.assert_array_equal(_region_pixels(jpeg.decode_region, transcoded, k, box, True),
                                      want)


def test_segments_away_from_the_crop_are_never_read(jpeg):
    data = JPEG_KINDS["420"]()  # 333x517: 21 rows of 33 MCUs
    transcoded = bytearray(jpeg.transcode(data))
    starts = _segment_starts(bytes(transcoded))
    # Damage the entropy data of the last two MCU rows: a decode that read them would fail.
    for start in starts[-66:]:
        transcoded[start] ^= 0x5A
        if transcoded[start] == 0xFF:
            transcoded[start] = 0x00
    box = (0, 0, 100, 120)
    want = _region_pixels(jpeg.decode_region, data, 1, box, False)
    np.testing.assert_array_equal(
        _region_pixels(jpeg.decode_region, bytes(transcoded), 1, box, False),
                                  want)
    with pytest.raises(ValueError, match="libjpeg-turbo"):
        _region_pixels(jpeg.decode_region, bytes(transcoded), 1, (300, 0, 33, 517), False)


def _damage(data: bytearray, starts: list[int]) -> None:
    for start in starts:
        data[start] ^= 0x5A
        if data[start] == 0xFF:
            data[start] = 0x00


def test_replicated_chroma_reads_only_the_crops_own_mcus(jpeg):
    data = JPEG_KINDS["420"]()  # 333x517: 21 rows of 33 MCUs of 16x16
    transcoded = bytearray(jpeg.transcode(data))
    starts = [at - 1 for at in _segment_starts(bytes(transcoded))]  # the markers' 0xD0-0xD7 bytes
    # Damage the entropy data of MCU columns 5 and 12 (each MCU's data begins at a marker, the
    # first one's at the end of the scan header, which the column-0 MCUs hold and stay intact).
    _damage(transcoded, [starts[r * 33 + c - 1] + 1 for r in range(21) for c in (5, 12)])
    box = (40, 96, 100, 96)  # columns 96-191: MCU columns 6 to 11
    want = _region_pixels(jpeg.decode_region, data, 1, box, True)
    np.testing.assert_array_equal(
        _region_pixels(jpeg.decode_region, bytes(transcoded), 1, box, True), want)
    # Smooth upsampling interpolates from the neighbouring MCUs, so it reads columns 5 and 12.
    with pytest.raises(ValueError, match="libjpeg-turbo"):
        _region_pixels(jpeg.decode_region, bytes(transcoded), 1, box, False)


@pytest.mark.parametrize("payload", [b"", b"not a jpeg", None])
def test_transcoding_rejects_what_is_not_a_whole_jpeg(jpeg, payload):
    if payload is None:
        data = JPEG_KINDS["420"]()
        payload = data[: len(data) // 2]  # truncated: libjpeg-turbo warns, and warnings are errors
    with pytest.raises(ValueError, match="libjpeg-turbo"):
        jpeg.transcode(payload)
