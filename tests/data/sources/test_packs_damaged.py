"""Damaged packs: the readers check offsets, lengths, labels, metadata and the parts of a virtual
merge at open and give a PackFormatError naming the pack (and the field, key or sample); verify
reports every such pack unsound and never crashes. Packs of the current format are written here;
those of format version 1 are copies of the stored packs (tests/stored/packs), which the readers
still read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py", exc_type=ImportError)
lmdb = pytest.importorskip("lmdb", exc_type=ImportError)

from fastpipe._cli import main  # noqa: E402
from fastpipe.data import H5Dataset, LMDBDataset, PackFormatError  # noqa: E402
from fastpipe.data.format.fields import ArrayField  # noqa: E402
from fastpipe.pack import pack, verify  # noqa: E402
from tests.helpers.pack import ArrayDataset, SpeechRecords  # noqa: E402

pytestmark = pytest.mark.hdf5

VARIABLE = {"frames": ArrayField("int64", (None,))}
STORED = Path(__file__).resolve().parents[2] / "stored" / "packs"
# Where an (image, label) pack keeps its offsets, labels and metadata: format version 3 (written
# today) and version 1.
LAYOUT = {"bytes": ("_fastpipe/offsets/image", "label", "_fastpipe/meta"),
          "v1_bytes": ("offsets", "labels", "meta")}


@pytest.fixture(scope="module")
def packs(sample_root, tmp_path_factory) -> dict[str, Path]:
    """Pristine packs, each copied (with its shards) before a test damages it."""
    root = tmp_path_factory.mktemp("pristine")
    out = {"bytes": root / "bytes.h5", "array": root / "array.h5",
           "bytes_virtual": root / "bytes_virtual.h5", "array_virtual": root / "array_virtual.h5",
           "records": root / "records.h5", "records_virtual": root / "records_virtual.h5",
           "lmdb": root / "bytes.lmdb", "lmdb_records": root / "records.lmdb"}
    pack(sample_root, out["bytes"], merge="copy", progress=False)
    pack(ArrayDataset(n=20), out["array"], storage="array", merge="copy", progress=False)
    pack(sample_root, out["bytes_virtual"], num_workers=2, shard_size=12, merge="virtual",
         progress=False)
    pack(ArrayDataset(n=40), out["array_virtual"], storage="array", num_workers=2, shard_size=10,
         merge="virtual", progress=False)
    pack(SpeechRecords(n=12), out["records"], fields=VARIABLE, merge="copy", progress=False)
    pack(SpeechRecords(n=24), out["records_virtual"], fields=VARIABLE, num_workers=2,
         shard_size=6, merge="virtual", progress=False)
    pack(sample_root, out["lmdb"], progress=False)
    pack(SpeechRecords(n=12), out["lmdb_records"], fields=VARIABLE, progress=False)
    out.update(v1_bytes=STORED / "v1_bytes_copy.h5", v1_array=STORED / "v1_array_chw_copy.h5",
               v1_bytes_virtual=STORED / "v1_bytes_virtual.h5", v1_lmdb=STORED / "v1_bytes.lmdb")
    return out


def copy(packs: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    source = packs[kind]
    for extra in source.parent.glob(source.name + ".shards"):
        shutil.copytree(extra, tmp_path / extra.name)
    target = tmp_path / source.name
    shutil.copy(source, target)
    return target


def set_values(path: Path, name: str, changes: dict[int, int]) -> None:
    with h5py.File(path, "r+") as f:
        for index, value in changes.items():
            f[name][index] = value


def meta_of(path: Path, name: str = "meta") -> dict:
    with h5py.File(path, "r") as f:
        return json.loads(f[name][()])


def write_meta(path: Path, meta: dict, name: str = "meta") -> None:
    with h5py.File(path, "r+") as f:
        del f[name]
        f.create_dataset(name, data=json.dumps(meta), dtype=h5py.string_dtype("utf-8"))


def assert_unsound(path: Path, *needles: str) -> None:
    """verify reports the damage (with each needle in one problem), and the CLI exits 1."""
    report = verify(path)
    assert not report.ok
    text = "\n".join(report.problems)
    assert all(n in text for n in needles), text
    assert main(["verify", str(path), "--no-progress"]) == 1


# --- offsets -----------------------------------------------------------------------------------

def _offsets_damage(offsets: np.ndarray, kind: str) -> dict[int, int]:
    last = len(offsets) - 1
    return {"backwards": {5: int(offsets[4]) - 10},  # a negative length ("negative dimensions")
            "huge": {5: 2**62},  # "Unable to allocate 4.00 EiB"
            "first": {0: 3},
            "short": {last: int(offsets[-1]) - 1},  # the last sample one byte short
            "shifted": {last - 1: int(offsets[last - 1]) + 100}}[kind]  # bytes moved across


@pytest.mark.slow
@pytest.mark.parametrize("pack_kind", ["bytes", "v1_bytes"])
@pytest.mark.parametrize("kind", ["backwards", "huge", "first", "short", "shifted"])
def test_damaged_offsets_are_refused_at_open_naming_the_pack(packs, tmp_path, kind, pack_kind):
    path = copy(packs, pack_kind, tmp_path)
    name = LAYOUT[pack_kind][0]
    with h5py.File(path, "r") as f:
        offsets = f[name][()]
    set_values(path, name, _offsets_damage(offsets, kind))
    if kind == "shifted":  # still monotone and in range: only the checksums can tell
        assert_unsound(path, f"sample {len(offsets) - 3}", "checksum")
        return
    needle = "'offsets'" if pack_kind == "v1_bytes" else "field 'image': its offsets"
    with pytest.raises(PackFormatError, match=rf"{path.name}.*{needle}"):
        H5Dataset(path)
    assert_unsound(path, needle)


@pytest.mark.parametrize("kind", ["backwards", "huge", "first", "short"])
def test_damaged_field_offsets_are_refused_naming_the_pack_and_field(packs, tmp_path, kind):
    path = copy(packs, "records", tmp_path)
    name = "_fastpipe/offsets/frames"
    with h5py.File(path, "r") as f:
        offsets = f[name][()]
    set_values(path, name, _offsets_damage(offsets, kind))
    with pytest.raises(PackFormatError, match=rf"{path.name}.*field 'frames'.*offsets"):
        H5Dataset(path)
    assert_unsound(path, "'frames'")


def test_a_field_with_a_row_missing_is_refused_naming_the_field(packs, tmp_path):
    path = copy(packs, "records", tmp_path)
    with h5py.File(path, "r+") as f:
        data = f["zone0"][()]
        del f["zone0"]
        f.create_dataset("zone0", data=data[:-1])
    with pytest.raises(PackFormatError, match=rf"{path.name}.*field 'zone0'"):
        H5Dataset(path)
    assert_unsound(path, "'zone0'")


# --- labels ------------------------------------------------------------------------------------

@pytest.mark.parametrize("pack_kind, index, classes", [("bytes", 7, 4), ("v1_bytes", 3, 2)])
@pytest.mark.parametrize("label", [99, 4, -2])
def test_out_of_range_labels_are_refused_at_open_naming_the_first_bad_sample(
        packs, tmp_path, label, pack_kind, index, classes):
    path = copy(packs, pack_kind, tmp_path)
    set_values(path, LAYOUT[pack_kind][1], {index: label, index + 1: label})
    with pytest.raises(PackFormatError,
                       match=rf"{path.name}.*sample {index}.*label {label}.*{classes} classes"):
        H5Dataset(path)
    assert_unsound(path, f"sample {index}", f"label {label}")


def test_out_of_range_labels_of_a_records_pack_are_refused(packs, tmp_path):
    path = copy(packs, "records", tmp_path)
    meta = meta_of(path, "_fastpipe/meta")
    write_meta(path, dict(meta, classes={"label": ["a", "b", "c"]}), "_fastpipe/meta")
    # SpeechRecords labels are index % 4: sample 3 holds 3, outside three classes
    with pytest.raises(PackFormatError, match=rf"{path.name}.*field 'label'.*sample 3.*label 3"):
        H5Dataset(path)
    assert_unsound(path, "sample 3", "'label'")


def test_out_of_range_labels_of_an_lmdb_pack_are_refused(packs, tmp_path):
    path = copy(packs, "lmdb", tmp_path)  # one value per field and sample
    _lmdb_edit(path, {b"f/label/%010d" % 11: np.int64(17).tobytes()})
    with pytest.raises(PackFormatError, match=rf"{path.name}.*sample 11.*label 17"):
        LMDBDataset(path)
    assert_unsound(path, "sample 11")
    (tmp_path / "v1").mkdir()
    path = copy(packs, "v1_lmdb", tmp_path / "v1")  # format version 1: one array of labels
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        labels = np.frombuffer(txn.get(b"__labels__"), "<i8").copy()
        labels[4] = 17
        txn.put(b"__labels__", labels.tobytes())
    env.close()
    with pytest.raises(PackFormatError, match=rf"{path.name}.*sample 4.*label 17"):
        LMDBDataset(path)
    assert_unsound(path, "sample 4")


# --- metadata ----------------------------------------------------------------------------------

# Format version 1 kept its image field in these keys; version 3 describes it as a field.
BAD_META = [
    ("v1_bytes", "classes", 7), ("v1_bytes", "classes", ["a", 3]), ("v1_bytes", "count", "48"),
    ("v1_bytes", "count", -1), ("v1_bytes", "count", 10**30), ("v1_bytes", "layout", 5),
    ("v1_bytes", "skipped", 7), ("v1_bytes", "inputs", "many"), ("v1_bytes", "version", "1"),
    ("v1_array", "sample_shape", "abc"), ("v1_array", "sample_shape", [24, -32, 3]),
    ("v1_array", "sample_shape", None), ("v1_array", "dtype", "no-such-dtype"),
    ("v1_array", "dtype", 3),
    ("v1_bytes_virtual", "parts", 7), ("v1_bytes_virtual", "parts", [{"file": 3}]),
    ("v1_bytes_virtual", "parts", [{"file": "x.h5", "samples": [0, "a"]}]),
    ("bytes", "classes", 7), ("bytes", "classes", {"label": ["a", 3]}), ("bytes", "count", "48"),
    ("bytes", "count", -1), ("bytes", "count", 10**30), ("bytes", "skipped", 7),
    ("bytes", "inputs", "many"), ("bytes", "version", "3"), ("bytes", "record", 5),
    ("bytes", "fields", {"image": 3, "label": {"kind": "int", "dtype": "int64"}}),
    ("bytes", "order", ["image"] * 2), ("array", "fields", {"image": {"kind": "array"},
                                                           "label": {"kind": "int"}}),
    ("bytes_virtual", "parts", 7), ("bytes_virtual", "parts", [{"file": 3}]),
    ("bytes_virtual", "parts", [{"file": "x.h5", "count": "a"}]),
]


@pytest.mark.parametrize("kind, key, value", BAD_META)
def test_every_malformed_metadata_value_is_a_pack_format_error_naming_the_key(packs, tmp_path,
                                                                              kind, key, value):
    path = copy(packs, kind, tmp_path)
    name = LAYOUT["v1_bytes" if kind.startswith("v1") else "bytes"][2]
    write_meta(path, dict(meta_of(path, name), **{key: value}), name)
    with pytest.raises(PackFormatError, match=rf"{path.name}.*'{key}'"):
        H5Dataset(path)
    assert_unsound(path, f"'{key}'")


BAD_RECORD_META = [
    ("fields", 7), ("fields", {"mix": {"kind": "array"}}), ("fields", {"mix": 3}),
    ("order", "mix"), ("order", ["mix", "nope"]), ("order", [["mix"]]), ("classes", 7),
    ("classes", {"label": 3}), ("count", "12"),
]


@pytest.mark.parametrize("key, value", BAD_RECORD_META)
def test_malformed_records_metadata_is_a_pack_format_error_naming_the_key(packs, tmp_path, key,
                                                                          value):
    path = copy(packs, "records", tmp_path)
    write_meta(path, dict(meta_of(path, "_fastpipe/meta"), **{key: value}), "_fastpipe/meta")
    with pytest.raises(PackFormatError, match=rf"{path.name}.*'{key}'"):
        H5Dataset(path)
    assert_unsound(path, f"'{key}'")


@pytest.mark.parametrize("kind", ["bytes", "v1_bytes"])
@pytest.mark.parametrize("value", ["[1, 2]", "7", "\"text\""])
def test_metadata_that_is_not_an_object_is_a_pack_format_error(packs, tmp_path, value, kind):
    path = copy(packs, kind, tmp_path)
    name = LAYOUT[kind][2]
    with h5py.File(path, "r+") as f:
        del f[name]
        f.create_dataset(name, data=value, dtype=h5py.string_dtype("utf-8"))
    with pytest.raises(PackFormatError, match=path.name):
        H5Dataset(path)
    assert_unsound(path, path.name)


@pytest.mark.parametrize("kind", ["bytes", "v1_bytes"])
def test_a_meta_dataset_of_numbers_is_a_pack_format_error(packs, tmp_path, kind):
    path = copy(packs, kind, tmp_path)
    name = LAYOUT[kind][2]
    with h5py.File(path, "r+") as f:
        del f[name]
        f.create_dataset(name, data=np.arange(5))
    with pytest.raises(PackFormatError, match=rf"{path.name}.*'{name}'"):
        H5Dataset(path)
    assert_unsound(path, f"'{name}'")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bytes", "records"])
def test_every_flipped_byte_of_the_hdf5_structure_opens_or_is_a_pack_format_error(packs, tmp_path,
                                                                                  kind):
    """The superblock, object headers, B-trees and index arrays: bytes of the first 4 KiB flipped
    in turn; opening the pack and reading every sample's stored form either works or gives a
    PackFormatError, never a raw h5py error; verify never raises."""
    pristine = copy(packs, kind, tmp_path)
    data = pristine.read_bytes()
    path = tmp_path / f"damaged-{pristine.name}"
    raw = []
    for at in range(0, min(4096, len(data)), 5):
        damaged = bytearray(data)
        damaged[at] ^= 0xFF
        path.write_bytes(damaged)
        ds = None
        try:
            ds = H5Dataset(path)
            for i in range(len(ds)):
                if kind == "bytes":
                    ds.encoded(i)
                else:
                    ds[i]
        except PackFormatError:
            pass
        except Exception as exc:  # noqa: BLE001 - what this test looks for
            raw.append(f"byte {at}: {type(exc).__name__}: {exc}")
        finally:
            if ds is not None:
                ds.close()
        report = verify(path, sample=2)  # never raises
        assert report.ok or report.problems
    assert not raw, "\n".join(raw[:10])


# --- virtual merges ----------------------------------------------------------------------------

def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _parts(path: Path) -> list[Path]:
    return sorted(Path(str(path) + ".shards").rglob("*.h5"))


@pytest.mark.parametrize("kind", ["array_virtual", "bytes_virtual"])
def test_two_swapped_parts_of_equal_counts_are_refused(packs, tmp_path, kind):
    path = copy(packs, kind, tmp_path)
    parts = _parts(path)
    with h5py.File(parts[0]) as f0, h5py.File(parts[1]) as f1:
        assert f0["label"].shape == f1["label"].shape  # equal sample counts, same plan
    _swap(parts[0], parts[1])
    # Every part is checked when the pack opens, as for a records pack: one reader engine.
    with pytest.raises(PackFormatError, match=rf"{parts[0].name}.*does not hold the samples"):
        H5Dataset(path)
    assert_unsound(path, parts[0].name)


def test_two_swapped_parts_of_a_records_pack_are_refused_at_open(packs, tmp_path):
    path = copy(packs, "records_virtual", tmp_path)
    parts = _parts(path)
    _swap(parts[1], parts[2])
    with pytest.raises(PackFormatError, match=rf"{parts[1].name}.*does not hold the samples"):
        H5Dataset(path)
    assert_unsound(path, parts[1].name)


@pytest.mark.slow
def test_an_undamaged_virtual_pack_reads_every_sample_and_verifies(packs, tmp_path):
    for kind in ("array_virtual", "bytes_virtual", "records_virtual"):
        path = copy(packs, kind, tmp_path / kind)
        ds = H5Dataset(path)
        for i in range(len(ds)):
            ds[i]
        ds.close()
        assert verify(path).ok


# --- LMDB --------------------------------------------------------------------------------------

def _lmdb_edit(path: Path, puts: dict[bytes, bytes | None]) -> None:
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        for key, value in puts.items():
            if value is None:
                txn.delete(key)
            else:
                txn.put(key, value)
    env.close()


@pytest.mark.parametrize("kind, key, value, needle", [
    ("v1_lmdb", b"__labels__", b"\x00" * 7, "'__labels__'"),
    ("v1_lmdb", b"__labels__", None, "'__labels__'"),
    ("v1_lmdb", b"__meta__", b"[1, 2]", "metadata"),
    ("lmdb", b"__meta__", b"[1, 2]", "metadata"),
    ("lmdb", b"__meta__", b"\xff\xfe", "metadata"),
    ("lmdb", b"f/label/0000000003", b"\x01" * 5, "'label'"),
])
def test_damaged_lmdb_index_keys_are_pack_format_errors(packs, tmp_path, kind, key, value,
                                                        needle):
    path = copy(packs, kind, tmp_path)
    _lmdb_edit(path, {key: value})
    with pytest.raises(PackFormatError, match=rf"{path.name}.*{needle}"):
        LMDBDataset(path)
    assert_unsound(path, needle)


def test_a_missing_lmdb_sample_names_the_pack_and_sample(packs, tmp_path):
    path = copy(packs, "lmdb", tmp_path)
    _lmdb_edit(path, {b"f/image/%010d" % 9: None})
    ds = LMDBDataset(path)
    with pytest.raises(PackFormatError, match=rf"{path.name}.*sample 9"):
        ds[9]
    ds.close()
    assert_unsound(path, "sample 9")


def test_lmdb_metadata_values_are_checked(packs, tmp_path):
    path = copy(packs, "lmdb", tmp_path)
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin() as txn:
        meta = json.loads(bytes(txn.get(b"__meta__")))
    env.close()
    _lmdb_edit(path, {b"__meta__": json.dumps(dict(meta, classes=7)).encode()})
    with pytest.raises(PackFormatError, match=rf"{path.name}.*'classes'"):
        LMDBDataset(path)
    assert_unsound(path, "'classes'")


@pytest.mark.parametrize("value, needle", [
    (b"\x01" * 5, "5 bytes"),  # not a whole number of int64 values
    (None, "sample 4"),
])
def test_a_damaged_lmdb_record_field_names_the_field_and_sample(packs, tmp_path, value, needle):
    path = copy(packs, "lmdb_records", tmp_path)
    _lmdb_edit(path, {b"f/frames/%010d" % 4: value})
    ds = LMDBDataset(path)
    with pytest.raises(PackFormatError, match=rf"{path.name}.*'frames'.*sample 4|"
                                              rf"{path.name}.*sample 4.*'frames'"):
        ds[4]
    ds.close()
    assert_unsound(path, "'frames'", needle)


@pytest.mark.parametrize("value, needle", [
    (b"\x01" * 5, "holds 5 bytes"),
    (None, "is missing"),
])
def test_a_damaged_fixed_lmdb_field_read_in_a_batch_names_the_field_and_sample(
        packs, tmp_path, value, needle):
    # A batch copies a fixed field's values into its block in one call: the damaged one is
    # named, not copied.
    path = copy(packs, "lmdb_records", tmp_path)
    _lmdb_edit(path, {b"f/mix/%010d" % 4: value})
    ds = LMDBDataset(path, fields=["mix", "zone0"])
    assert len(ds.__getitems__([0, 1, 2])) == 3
    with pytest.raises(PackFormatError, match=rf"{path.name}: field 'mix' of sample 4") as caught:
        ds.__getitems__([2, 4, 6])
    assert needle in str(caught.value)
    ds.close()


def test_lmdb_records_labels_out_of_range_are_refused(packs, tmp_path):
    path = copy(packs, "lmdb_records", tmp_path)
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin() as txn:
        meta = json.loads(bytes(txn.get(b"__meta__")))
    env.close()
    _lmdb_edit(path, {b"__meta__": json.dumps(dict(meta, classes={"label": ["a", "b"]})).encode()})
    with pytest.raises(PackFormatError, match=rf"{path.name}.*field 'label'.*sample 2.*label 2"):
        LMDBDataset(path)
    assert_unsound(path, "'label'")


# --- the fuzz lane's pack targets ----------------------------------------------------------------

def test_the_fuzz_lanes_pack_targets_find_nothing_on_fixed_seeds(sample_root):
    """fuzz/packs.py's damage on fixed argument seeds (what the lane's bounded run draws at
    random): every damaged pack opens, reads and verifies within the readers' contract."""
    from fuzz import packs

    seeds = [p.read_bytes() for p in sorted(sample_root.glob("class_0*/*.jpg"))[:8]]
    packs.set_corpus(seeds)
    findings = []
    for name, function in sorted(packs.TARGETS.items()):
        for call_seed in range(12):
            try:
                function(seeds[call_seed % len(seeds)][::-1] if call_seed % 3 == 0
                         else seeds[call_seed % len(seeds)], np.random.default_rng(call_seed))
            except packs.Finding as exc:
                findings.append(f"{name} seed {call_seed}: {exc}")
    assert not findings, "\n".join(findings)
