"""Packs written by an earlier fastpipe (tests/stored/packs, made at commit 01183b3 by make.py
there): format version 1 image packs (bytes and array storage), format version 2 records,
virtual merges and LMDB still read bit for bit as that version read them, verify passes on them,
and verify still catches damage in them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("h5py", exc_type=ImportError)
pytest.importorskip("lmdb", exc_type=ImportError)

from fastpipe.data import H5Dataset, LMDBDataset  # noqa: E402
from fastpipe.data.sources.resolve import resolve  # noqa: E402
from fastpipe.pack import verify  # noqa: E402

pytestmark = pytest.mark.hdf5

STORED = Path(__file__).resolve().parents[2] / "stored" / "packs"
PACKS = sorted(p.name for p in STORED.iterdir() if p.suffix in (".h5", ".lmdb"))


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(STORED / "expected.npz") as saved:
        return {k: saved[k] for k in saved.files}


@pytest.fixture(scope="module")
def described() -> dict[str, dict]:
    return json.loads((STORED / "datasets.json").read_text())


def test_every_kind_of_stored_pack_is_there():
    assert set(PACKS) == {
        "v1_array_chw_copy.h5", "v1_array_raw_virtual.h5", "v1_bytes.lmdb", "v1_bytes_copy.h5",
        "v1_bytes_virtual.h5", "v1_dataset_virtual.h5", "v2_records.lmdb", "v2_records_copy.h5",
        "v2_records_virtual.h5"}


@pytest.mark.parametrize("name", PACKS)
def test_stored_pack_reads_bit_exactly(name, expected):
    # The earlier reader's data is a version 1 pack's "image" field, its labels the "label"
    # field: one record model.
    with resolve(STORED / name) as source:
        assert len(source) == 6
        if name.startswith("v2"):
            for field in source.schema.names:
                for i in range(len(source)):
                    got = np.asarray(source.read(i, [field])[field])
                    want = expected[f"{name}/{field}/{i}"]
                    assert got.dtype == want.dtype and got.shape == want.shape, (field, i)
                    assert np.array_equal(got, want), (field, i)
                assert np.array_equal(source.crc32(field), expected[f"{name}/{field}/crc32"])
        else:
            for i in range(len(source)):
                got, want = source.read(i, ["image"])["image"], expected[f"{name}/data/{i}"]
                assert got.dtype == want.dtype and got.shape == want.shape
                assert np.array_equal(got, want), i
            assert np.array_equal(source.labels(), expected[f"{name}/labels"])
            assert np.array_equal(source.crc32("image"), expected[f"{name}/crc32"])
        assert source.paths(0, len(source)) == expected[f"{name}/sources"].tolist()


@pytest.mark.parametrize("name", PACKS)
def test_stored_pack_reads_as_the_same_dataset(name, described):
    ds = (H5Dataset if name.endswith(".h5") else LMDBDataset)(STORED / name)
    want = described[name]
    assert len(ds) == want["len"]
    assert ds.classes == want["classes"]
    assert (None if ds.targets is None else [int(t) for t in ds.targets]) == want["targets"]
    fields = {n: f.to_json() for n, f in ds.fields.items()}
    if want["fields"] is None:
        # One record model: an (image, label) pack now shows its two fields, where the earlier
        # reader showed none.
        assert list(fields) == ["image", "label"]
        assert ds.storage == want["storage"]
    else:
        assert fields == want["fields"]
    assert type(ds[0]).__name__ == want["item0"]
    assert [ds.path(i) for i in range(len(ds))] == want["paths"]


@pytest.mark.parametrize("name", PACKS)
def test_verify_passes_on_stored_packs(name):
    report = verify(STORED / name)
    assert report.ok, report.problems
    assert report.count == 6


@pytest.mark.parametrize("name", ["v1_bytes_copy.h5", "v2_records_copy.h5",
                                  "v1_bytes_virtual.h5", "v2_records_virtual.h5"])
def test_verify_catches_a_flipped_byte_in_a_stored_pack(name, tmp_path, expected):
    source = STORED / name
    target = tmp_path / name
    shutil.copy(source, target)
    shards = source.with_name(source.name + ".shards")
    if shards.exists():
        shutil.copytree(shards, tmp_path / shards.name)
        # The samples of a virtual pack live in its part files: damage the first one.
        damaged = sorted((tmp_path / shards.name).rglob("part-*.h5"))[0]
    else:
        damaged = target
    # Flip a byte of the first sample's stored JPEG, found by its content.
    first = (expected[f"{name}/data/0"] if name.startswith("v1")
             else expected[f"{name}/image/0"]).tobytes()
    raw = bytearray(damaged.read_bytes())
    at = raw.find(first[100:140])
    assert at > 0
    raw[at + 5] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    report = verify(target)
    assert not report.ok
    assert any("checksum" in p or "crc" in p.lower() for p in report.problems), report.problems
