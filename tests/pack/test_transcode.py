"""Transcoded packs: the same pixels as the original files on every path, smaller work per crop."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg
import torch

from fastpipe.data import H5Dataset, ImageDecoder, ImageFolder
from fastpipe.pack import pack
from tests.helpers.cpu_path import sample_files
from tests.jpeg.test_region import JPEG_KINDS

h5py = pytest.importorskip("h5py", exc_type=ImportError)


def _good_files(root, sample_root):
    (root / "a").mkdir()
    (root / "b").mkdir()
    for i, path in enumerate(sample_files(sample_root)[:12]):
        (root / "a" / f"photo{i:02d}.jpg").write_bytes(path.read_bytes())
    for kind in sorted(JPEG_KINDS):
        (root / "b" / f"{kind}.jpg").write_bytes(JPEG_KINDS[kind]())
    return root


@pytest.fixture(scope="module")
def good_root(tmp_path_factory, sample_root):
    """Sample photos plus every JPEG layout of the region tests."""
    return _good_files(tmp_path_factory.mktemp("good"), sample_root)


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory, sample_root):
    """The good files plus a corrupt and a truncated one."""
    root = _good_files(tmp_path_factory.mktemp("mixed"), sample_root)
    data = JPEG_KINDS["420"]()
    (root / "b" / "truncated.jpg").write_bytes(data[: len(data) // 3])
    (root / "b" / "corrupt.jpg").write_bytes(b"\xff\xd8" + b"\x00" * 300)
    return root


def test_transcoded_pack_holds_the_same_images_and_reports_what_it_skipped(jpeg, mixed_root,
                                                                             tmp_path):
    plain = pack(mixed_root, tmp_path / "plain.h5", progress=False)
    rewritten = pack(mixed_root, tmp_path / "transcoded.h5", transcode=True, progress=False)
    skipped = sorted(entry["source"] for entry in rewritten.skipped)
    assert skipped == sorted(entry["source"] for entry in plain.skipped)
    assert skipped == ["b/corrupt.jpg", "b/truncated.jpg"]
    a, b = H5Dataset(tmp_path / "plain.h5"), H5Dataset(tmp_path / "transcoded.h5")
    assert len(a) == len(b) == 12 + len(JPEG_KINDS)
    with h5py.File(tmp_path / "plain.h5") as fa, h5py.File(tmp_path / "transcoded.h5") as fb:
        def stored_bytes(f, i):  # read with plain h5py, as any reader of the format would
            offsets = f["_fastpipe/offsets/image"]
            return f["image"][offsets[i]:offsets[i + 1]].tobytes()

        for i in range(len(a)):
            original, stored = stored_bytes(fa, i), stored_bytes(fb, i)
            # Plain h5py reads JPEG bytes, and every decoder sees the same image.
            np.testing.assert_array_equal(simplejpeg.decode_jpeg(stored),
                                          simplejpeg.decode_jpeg(original))
            assert b"\xff\xdd\x00\x04\x00\x01" in stored  # a restart interval of one MCU


@pytest.mark.parametrize("train", [True, False])
def test_decoded_samples_equal_the_original_files(jpeg, good_root, tmp_path, train):
    pack(good_root, tmp_path / "transcoded.h5", transcode=True, progress=False)
    folder = ImageFolder(good_root, train=train, size=64, seed=7)
    packed = H5Dataset(tmp_path / "transcoded.h5", decoder=ImageDecoder(train=train, size=64),
                       seed=7)
    assert len(folder) == len(packed)
    for epoch in range(2):
        folder.set_epoch(epoch)
        packed.set_epoch(epoch)
        for i in range(len(folder)):
            want, got = folder[i][0], packed[i][0]
            assert torch.equal(got, want), (epoch, folder.path(i))


def test_transcode_is_refused_where_it_cannot_apply(tmp_path, mixed_root):
    with pytest.raises(ValueError, match="transcode applies to bytes storage"):
        pack(mixed_root, tmp_path / "x.h5", storage="array", size=32, transcode=True)


@pytest.mark.slow
def test_cli_transcode(jpeg, mixed_root, tmp_path):
    out = tmp_path / "cli.h5"
    done = subprocess.run([sys.executable, "-m", "fastpipe", "pack", str(mixed_root), str(out),
                           "--transcode", "--quiet", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["skipped"]) == 2
    bad = subprocess.run([sys.executable, "-m", "fastpipe", "pack", str(mixed_root),
                          str(tmp_path / "arr.h5"), "--storage", "array", "--size", "32x32",
                          "--transcode"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--transcode applies to bytes storage" in bad.stderr
