"""Records packs: every field kind and dtype bit-exact through fastpipe's readers and plain h5py,
virtual and copy merges, workers, an interrupted pack resumed, verify, and the refusals."""

from __future__ import annotations

import io
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
import torch

h5py = pytest.importorskip("h5py", exc_type=ImportError)

from fastpipe.data import H5Dataset  # noqa: E402
from fastpipe.data.format.fields import ArrayField, FloatField, IntField  # noqa: E402
from fastpipe.pack import PackError, merge_packs, pack, verify  # noqa: E402
from tests.helpers.pack import SpeechRecords, flip_byte  # noqa: E402

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]
VARIABLE = {"frames": ArrayField("int64", (None,))}


class EveryKind:
    """One field per dtype (fixed (2, 3) and variable (k, 2)), plus scalars, str, bytes, image."""

    def __init__(self, n: int = 13) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng(i)
        out = {}
        for dtype in DTYPES:
            if dtype == "bool":
                fixed, var = rng.integers(0, 2, (2, 3)), rng.integers(0, 2, (i % 4, 2))
            elif np.dtype(dtype).kind == "f":
                fixed, var = rng.standard_normal((2, 3)) * 1e3, rng.standard_normal((i % 4, 2))
            else:
                info = np.iinfo(dtype)
                fixed = rng.integers(info.min, info.max, (2, 3), dtype=dtype, endpoint=True)
                var = rng.integers(info.min, info.max, (i % 4, 2), dtype=dtype, endpoint=True)
            out[f"fixed_{dtype}"] = fixed.astype(dtype)
            out[f"var_{dtype}"] = var.astype(dtype)
        out.update(count=int(rng.integers(-2**62, 2**62)), small=np.uint8(i), ratio=float(i) / 7,
                   half=np.float32(i) / 3, name=f"sample-{i}-é", meta=bytes(rng.bytes(i)),
                   image=_png(i))
        return out


def _png(i: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (5 + i, 4), (i, 2 * i, 3)).save(out, format="PNG")
    return out.getvalue()


EVERY_FIELDS = {f"var_{d}": ArrayField(d, (None, 2)) for d in DTYPES}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        a = a.numpy()
    if isinstance(a, np.ndarray):
        b = np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("merge", ["virtual", "copy"])
@pytest.mark.slow
def test_every_kind_and_dtype_round_trips_bit_exact(tmp_path, merge):
    source = EveryKind()
    out = tmp_path / "every.h5"
    report = pack(source, out, fields=EVERY_FIELDS, shard_size=4, merge=merge, progress=False)
    assert (report.count, report.storage, report.shards) == (13, "fields", 4)
    ds = H5Dataset(out)
    # A virtual merge's numeric fields read from the part files directly, not through h5py.
    columns = ds.source._columns
    numeric = [n for n, f in ds.fields.items() if f.kind in ("array", "int", "float")]
    assert all(columns[n].extents is not None for n in numeric)
    files = {Path(ds.source._files.paths[int(k)]).name for n in numeric
             for k in columns[n].extents.files}
    assert files == ({"every.h5"} if merge == "copy" else
                     {p.name for p in (tmp_path / "every.h5.shards").rglob("part-*.h5")})
    for i in range(len(source)):
        want, got = source[i], ds[i]
        assert list(got) == list(want)
        for name, value in want.items():
            if name == "image":  # decoded by default; the stored bytes are checked below
                assert got[name].shape == (3, 4, 5 + i) and got[name].dtype == torch.uint8
                continue
            assert _same(got[name], value), name
    with h5py.File(out) as f:  # plain h5py: f[field][i] for fixed fields, offsets for variable
        for i in range(len(source)):
            want = source[i]
            assert np.array_equal(f["fixed_uint64"][i], want["fixed_uint64"])
            assert f["fixed_float16"][i].tobytes() == want["fixed_float16"].tobytes()
            assert f["count"][i] == want["count"] and f["small"][i] == want["small"]
            o = f["_fastpipe/offsets/var_int8"]
            assert np.array_equal(f["var_int8"][o[i]:o[i + 1]], want["var_int8"])
            o = f["_fastpipe/offsets/image"]
            assert f["image"][o[i]:o[i + 1]].tobytes() == want["image"]
            o = f["_fastpipe/offsets/name"]
            assert f["name"][o[i]:o[i + 1]].tobytes().decode() == want["name"]
        assert f["fixed_int32"].shape == (13, 2, 3) and f["fixed_int32"].dtype == np.int32
    assert verify(out).ok


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_speech_records_pack_with_workers_and_read_back_exactly(tmp_path, no_thread_leak):
    source = SpeechRecords(n=30)
    out = tmp_path / "speech.h5"
    pack(source, out, fields=VARIABLE, num_workers=2, shard_size=7, progress=False)
    assert multiprocessing.active_children() == []
    ds = H5Dataset(out)
    assert len(ds) == 30 and list(ds.targets) == [i % 4 for i in range(30)]
    for i in (0, 7, 29):
        for name, value in source.record(i).items():
            assert _same(ds[i][name], value), name
    mix, zone0 = H5Dataset(out, fields=["mix", "zone0"])[5]
    assert _same(mix, source.record(5)["mix"]) and _same(zone0, source.record(5)["zone0"])
    batch = H5Dataset(out).__getitems__([9, 2, 9])
    assert [b["label"] for b in batch] == [1, 2, 1]


def test_two_arrays_of_one_shape_stay_two_arrays_of_their_dtype(tmp_path):
    # They used to be packed as one float64 (2, T) array.
    source = SpeechRecords(n=5, kind="tuple")
    out = tmp_path / "pairs.h5"
    pack(source, out, progress=False)
    ds = H5Dataset(out)
    first, second = ds[3]
    assert first.dtype == torch.float32 and second.dtype == torch.float32
    assert _same(first, source[3][0]) and _same(second, source[3][1])


def test_int64_frame_labels_come_back_as_int64(tmp_path):
    class Frames:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.full((6, 40), i, np.float32), np.arange(6, dtype=np.int64) + 2**53 + 1

    out = tmp_path / "frames.h5"
    pack(Frames(), out, fields=["key1", "key2"], progress=False)
    key1, key2 = H5Dataset(out)[2]
    assert key2.dtype == torch.int64 and int(key2[0]) == 2**53 + 1
    with h5py.File(out) as f:
        assert sorted(k for k in f if not k.startswith("_")) == ["key1", "key2"]


@pytest.mark.timeout(120)
def test_an_interrupted_records_pack_resumes(tmp_path, no_thread_leak):
    marker = tmp_path / "armed"
    marker.touch()
    source = SpeechRecords(n=24, marker=marker, kill_index=10)
    out = tmp_path / "r.h5"
    with pytest.raises(PackError, match="exited with code -9"):
        pack(source, out, fields=VARIABLE, num_workers=2, shard_size=6, progress=False)
    report = pack(source, out, fields=VARIABLE, num_workers=2, shard_size=6, progress=False,
                  resume=True)
    assert (report.count, report.resumed_shards) == (24, 3)
    ds = H5Dataset(out)
    for i in range(24):
        assert _same(ds[i]["mix"], source.record(i)["mix"])
        assert _same(ds[i]["frames"], source.record(i)["frames"])


def test_parts_merge_virtual_and_copy_with_h5py_reading_the_merge(tmp_path):
    source = SpeechRecords(n=20)
    parts = []
    for k in range(3):
        parts.append(tmp_path / f"part{k}.h5")
        pack(source, parts[-1], fields=VARIABLE, part=(k, 3), shard_size=4, progress=False)
    for merge in ("virtual", "copy"):
        out = tmp_path / f"all-{merge}.h5"
        merge_packs(list(reversed(parts)), out, merge=merge, progress=False)
        ds = H5Dataset(out)
        assert len(ds) == 20
        with h5py.File(out) as f:
            assert f["mix"].is_virtual == (merge == "virtual")
            for i in range(20):
                assert np.array_equal(f["mix"][i], source.record(i)["mix"])
                assert _same(ds[i]["frames"], source.record(i)["frames"])
        assert verify(out).ok


def test_verify_names_the_damaged_field(tmp_path):
    source = SpeechRecords(n=6)
    out = tmp_path / "v.h5"
    pack(source, out, fields=VARIABLE, merge="copy", progress=False)
    with h5py.File(out) as f:
        offset = f["zone0"].id.get_offset() + 3 * 160 * 4 + 8  # inside sample 3's zone0
    flip_byte(out, offset)
    report = verify(out)
    assert not report.ok
    assert any("sample 3" in p and "'zone0'" in p and "checksum" in p for p in report.problems)


class Changing:
    def __init__(self, bad):
        self.bad = bad

    def __len__(self):
        return 4

    def __getitem__(self, i):
        mix = np.zeros((4, 8), np.float32)
        if i == 2:
            mix = self.bad
        return {"mix": mix, "label": np.int64(i)}


@pytest.mark.parametrize("bad, match", [
    (np.zeros((4, 8), np.float64), r"field 'mix' of .*\[2\] is float64, the field holds float32"),
    (np.zeros((4, 9), np.float32), r"field 'mix' of .*\[2\] has shape \(4, 9\)"),
])
def test_a_sample_that_does_not_fit_is_an_error_naming_sample_and_field(tmp_path, bad, match):
    with pytest.raises(PackError, match=match):
        pack(Changing(bad), tmp_path / "x.h5", progress=False)


def test_declared_fields_are_checked_not_cast(tmp_path):
    with pytest.raises(PackError, match="is int64, the field holds int32"):
        pack(Changing(np.zeros((4, 8), np.float32)), tmp_path / "x.h5",
             fields={"label": IntField("int32")}, progress=False)
    with pytest.raises(PackError, match="fields declares \\['nope'\\]"):
        pack(Changing(np.zeros((4, 8), np.float32)), tmp_path / "y.h5",
             fields={"nope": FloatField()}, progress=False)


def test_a_nested_tuple_gets_a_hint_not_a_numpy_error(tmp_path):
    class Nested:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return (np.zeros((4, 8), np.float32), np.zeros(8, np.float32)), i

    with pytest.raises(PackError, match=r"tuple.*flat tuple.*or a dict"):
        pack(Nested(), tmp_path / "n.h5", progress=False)


def test_image_only_options_are_refused_for_records(tmp_path):
    with pytest.raises(PackError, match="storage apply to \\(image, label\\) packs"):
        pack(SpeechRecords(n=3), tmp_path / "a.h5", storage="array", progress=False)
    with pytest.raises(PackError, match="max_side apply"):
        pack(SpeechRecords(n=3), tmp_path / "b.h5", max_side=64, progress=False)


def test_every_kind_round_trips_through_lmdb_and_verify_catches_a_damaged_field(tmp_path):
    pytest.importorskip("lmdb", exc_type=ImportError)
    from fastpipe.data import LMDBDataset
    from fastpipe.data.sources.lmdb import LMDBSource

    source = EveryKind()
    out = tmp_path / "every.lmdb"
    report = pack(source, out, fields=EVERY_FIELDS, shard_size=4, num_workers=2, progress=False)
    assert (report.format, report.count) == ("lmdb", 13)
    ds = LMDBDataset(out)
    for i in range(len(source)):
        want, got = source[i], ds[i]
        for name, value in want.items():
            if name != "image":
                assert _same(got[name], value), name
    with LMDBSource(out) as reader:
        assert reader.read(5)["image"].tobytes() == source[5]["image"]
    assert verify(out).ok
    data = out.read_bytes()
    target = source[7]["fixed_float64"].tobytes()
    at = data.index(target)
    flip_byte(out, at + 3)
    report = verify(out)
    assert any("sample 7" in p and "'fixed_float64'" in p for p in report.problems), report.problems


def _npy_folder(root, lengths=(10, 11, 12, 13)):
    root.mkdir()
    for i, t in enumerate(lengths):
        row = np.arange(40, dtype=np.float32)
        np.save(root / f"utt{i}.npy", np.full((t, 40), i, np.float32) + row)
    return root


def test_a_folder_of_npy_files_packs_one_record_per_file_with_a_variable_axis(tmp_path):
    root = _npy_folder(tmp_path / "feats")
    report = pack(root, tmp_path / "f.h5", progress=False)
    assert (report.count, report.storage) == (4, "fields")
    ds = H5Dataset(tmp_path / "f.h5")
    assert ds.fields["array"] == ArrayField("float32", (None, 40))
    for i in range(4):
        assert _same(ds[i]["array"], np.load(root / f"utt{i}.npy"))
        assert ds.path(i) == f"utt{i}.npy"


def test_a_list_file_of_npz_files_with_labels(tmp_path):
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", x=np.full((2, 3), i, np.int16), y=np.arange(i + 1.0))
    (tmp_path / "list.txt").write_text("".join(f"s{i}.npz {i % 2}\n" for i in range(3)))
    pack(tmp_path / "list.txt", tmp_path / "z.h5", progress=False)
    ds = H5Dataset(tmp_path / "z.h5")
    assert list(ds.targets) == [0, 1, 0]
    assert _same(ds[2]["x"], np.full((2, 3), 2, np.int16)) and _same(ds[2]["y"], np.arange(3.0))


@pytest.mark.slow
def test_the_cli_packs_a_list_of_npy_files_and_exits_nonzero_when_nothing_packs(tmp_path):
    import subprocess
    import sys

    root = _npy_folder(tmp_path / "feats")
    (tmp_path / "list.txt").write_text("".join(f"feats/utt{i}.npy\n" for i in range(4)))
    done = subprocess.run([sys.executable, "-m", "fastpipe", "pack", str(tmp_path / "list.txt"),
                           str(tmp_path / "l.h5"), "--no-progress"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "packed 4 of 4 inputs" in done.stdout
    assert _same(H5Dataset(tmp_path / "l.h5")[1]["array"], np.load(root / "utt1.npy"))
    for i in range(3):
        (tmp_path / f"x{i}.jpg").write_bytes(b"not an image")
    (tmp_path / "bad.txt").write_text("".join(f"x{i}.jpg\n" for i in range(3)))
    done = subprocess.run([sys.executable, "-m", "fastpipe", "pack", str(tmp_path / "bad.txt"),
                           str(tmp_path / "e.h5"), "--no-progress"], capture_output=True, text=True)
    assert done.returncode != 0
    assert "nothing was packed: all 3 inputs were skipped" in done.stderr
    assert not (tmp_path / "e.h5").exists()


def test_a_tar_shard_is_read_as_shards_not_as_a_list_file(tmp_path):
    # It used to be read as a list file ('utf-8' codec can't decode byte 0xff).
    import tarfile

    member = tmp_path / "x.jpg"
    member.write_bytes(b"\xff\xd8\xff\xe0" + bytes(200))  # a JPEG's start, then nothing
    with tarfile.open(tmp_path / "000000.tar", "w") as tar:
        tar.add(member, arcname="000.jpg")
    with pytest.raises(PackError, match=r"nothing was packed.*000000.tar:000.*field 'jpg': "
                                        r"corrupt image"):
        pack(tmp_path / "000000.tar", tmp_path / "t.h5", progress=False)


def _jpegs(root, n=6):
    from PIL import Image

    files = []
    for i in range(n):
        buffer = io.BytesIO()
        Image.new("RGB", (20 + i, 16), (i * 30, 5, 9)).save(buffer, format="JPEG", quality=90)
        (root / f"{i}.jpg").write_bytes(buffer.getvalue())
        files.append(root / f"{i}.jpg")
    return files


@pytest.mark.slow
def test_a_hugging_face_dataset_packs_its_stored_bytes_and_class_names(tmp_path):
    datasets = pytest.importorskip("datasets", exc_type=ImportError)
    from fastpipe.data.sources.h5 import H5Source

    files = _jpegs(tmp_path)
    features = datasets.Features({"image": datasets.Image(decode=False),
                                  "label": datasets.ClassLabel(names=["cat", "dog"])})
    hf = datasets.Dataset.from_dict({"image": [str(f) for f in files],
                                     "label": [i % 2 for i in range(len(files))]},
                                    features=features)
    pack(hf, tmp_path / "hf.h5", num_workers=2, progress=False)
    ds = H5Dataset(tmp_path / "hf.h5")
    assert ds.classes == ["cat", "dog"] and list(ds.targets) == [0, 1, 0, 1, 0, 1]
    assert ds[3]["image"].shape == (3, 16, 23)
    with H5Source(tmp_path / "hf.h5") as reader:
        for i, path in enumerate(files):
            assert reader.read(i)["image"].tobytes() == path.read_bytes()
    # Decoded images: the file each was decoded from is packed, bytes unchanged.
    decoded = hf.cast_column("image", datasets.Image())
    pack(decoded, tmp_path / "decoded.h5", progress=False)
    with H5Source(tmp_path / "decoded.h5") as reader:
        assert reader.read(2)["image"].tobytes() == files[2].read_bytes()


def test_a_decoded_image_without_its_file_is_refused_not_re_encoded(tmp_path):
    from PIL import Image

    class Pictures:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"image": Image.new("RGB", (8, 8)), "label": i}

    with pytest.raises(PackError, match=r"decoded PIL image.*Image\(decode=False\)"):
        pack(Pictures(), tmp_path / "p.h5", progress=False)


def test_a_list_file_with_named_columns_packs_pairs_of_files(tmp_path):
    from PIL import Image

    (tmp_path / "HR").mkdir()
    (tmp_path / "LR").mkdir()
    for i in range(4):
        Image.new("RGB", (64, 48), (i * 40, 9, 0)).save(tmp_path / "HR" / f"{i}.png")
        Image.new("RGB", (32, 24), (i * 40, 9, 0)).save(tmp_path / "LR" / f"{i}.png")
        np.save(tmp_path / f"{i}.npy", np.full(3, i, np.int8))
    (tmp_path / "pairs.txt").write_text(
        "# super-resolution pairs\n#fields: lr hr extra label\n"
        + "".join(f"LR/{i}.png\tHR/{i}.png\t{i}.npy\t{'ab'[i % 2]}\n" for i in range(4)))
    pack(tmp_path / "pairs.txt", tmp_path / "p.h5", progress=False)
    ds = H5Dataset(tmp_path / "p.h5")
    assert list(ds.fields) == ["lr", "hr", "extra", "label"]
    assert ds.classes == ["a", "b"] and list(ds.targets) == [0, 1, 0, 1]
    from fastpipe.data.sources.h5 import H5Source

    with H5Source(tmp_path / "p.h5") as reader:
        assert reader.read(2)["hr"].tobytes() == (tmp_path / "HR" / "2.png").read_bytes()
    assert _same(ds[3]["extra"], np.full(3, 3, np.int8)) and ds[3]["lr"].shape == (3, 24, 32)
    (tmp_path / "bad.txt").write_text("#fields: lr hr\nLR/0.png\n")
    with pytest.raises(PackError, match=r"bad.txt:2: 1 columns, but the header names 2"):
        pack(tmp_path / "bad.txt", tmp_path / "b.h5", progress=False)
