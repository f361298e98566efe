"""The source interface, held by every source: the same tests run over each implementation
(fastpipe's HDF5 and LMDB packs of both format versions and their virtual merges, a plain HDF5
file, tar shards, an image folder, a list file, paired folders, .npy files, a list of columns, a
map-style dataset and a Hugging Face dataset): length, schema, one record, a batch into blocks,
the stored form of every field, errors, pickling, fork, spawn, threads, the fingerprint."""

from __future__ import annotations

import concurrent.futures
import io
import multiprocessing
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py", exc_type=ImportError)
pytest.importorskip("lmdb", exc_type=ImportError)

from fastpipe.data.sources._base import Schema, Source  # noqa: E402
from fastpipe.data.sources.resolve import kind_of, resolve  # noqa: E402

pytestmark = pytest.mark.hdf5

STORED = Path(__file__).resolve().parents[2] / "stored" / "packs"
KINDS = ["h5-v1-bytes", "h5-v1-array", "h5-v1-virtual", "h5-v2", "h5-v2-virtual", "h5-plain",
         "lmdb-v1", "lmdb-v2", "tar", "folder", "list", "paired", "arrays", "columns",
         "dataset", "hf", "parquet", "parquet-hub"]


def _jpeg(i: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(i)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (12, 16 + i, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


def _png(i: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((12, 16 + i), i, np.uint8), "L").save(out, "PNG")
    return out.getvalue()


class Records:
    """A map-style dataset of records (every kind of field, fixed and variable)."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng(i)
        return {"image": _jpeg(i), "mix": rng.standard_normal((2, 3)).astype(np.float32),
                "label": i % 2, "text": f"t{i}"}


def _make(kind: str, root: Path) -> Source:
    """A small source of ``kind``, made under ``root``."""
    if kind.startswith(("h5-v", "lmdb-v")):
        name = {"h5-v1-bytes": "v1_bytes_copy.h5", "h5-v1-array": "v1_array_chw_copy.h5",
                "h5-v1-virtual": "v1_bytes_virtual.h5", "h5-v2": "v2_records_copy.h5",
                "h5-v2-virtual": "v2_records_virtual.h5", "lmdb-v1": "v1_bytes.lmdb",
                "lmdb-v2": "v2_records.lmdb"}[kind]
        return resolve(STORED / name)
    if kind == "h5-plain":
        path = root / "plain.h5"
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
            f.create_dataset("y", data=np.arange(5, dtype=np.int64), chunks=(2,))
            f["z"] = np.arange(5 * 6, dtype=">i2").reshape(5, 2, 3)  # foreign byte order: h5py
            f.create_dataset("s", data=[f"s{i}" for i in range(5)],
                             dtype=h5py.string_dtype())
        return resolve(path)
    if kind == "tar":
        path = root / "shard.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(5):
                for ext, data in (("jpg", _jpeg(i)), ("cls", str(i % 3).encode()),
                                  ("txt", f"caption {i}".encode())):
                    info = tarfile.TarInfo(f"{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return resolve(path)
    if kind in ("folder", "list"):
        folder = root / "images"
        for i in range(5):
            (folder / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            (folder / f"c{i % 2}" / f"{i}.jpg").write_bytes(_jpeg(i))
        if kind == "folder":
            return resolve(folder)
        listing = root / "list.txt"
        listing.write_text("".join(f"images/c{i % 2}/{i}.jpg {i % 2}\n" for i in range(5)))
        return resolve(listing)
    if kind == "paired":
        for name in ("lr", "hr"):
            (root / name).mkdir()
            for i in range(5):
                (root / name / f"{i:03d}.png").write_bytes(_png(i))
        from fastpipe.data.sources.paired import PairedSource

        return PairedSource({"lr": root / "lr", "hr": root / "hr"})
    if kind == "arrays":
        for i in range(5):
            (root / "arrays" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            np.savez(root / "arrays" / f"c{i % 2}" / f"{i}.npz",
                     feats=np.full((i + 1, 3), i, np.float32), fixed=np.arange(4) + i)
        return resolve(root / "arrays")
    if kind == "columns":
        for i in range(5):
            (root / f"a{i}.jpg").write_bytes(_jpeg(i))
            np.save(root / f"b{i}.npy", np.full((2, 2), i, np.int32))
        listing = root / "columns.txt"
        listing.write_text("#fields: a b label\n" + "".join(f"a{i}.jpg b{i}.npy {i}\n"
                                                            for i in range(5)))
        return resolve(listing)
    if kind == "dataset":
        return resolve(Records())
    if kind == "parquet":
        import pyarrow as pa

        from tests.helpers.parquet import plain_file

        rows = [Records()[i] for i in range(5)]
        mix = pa.array([r["mix"].tolist() for r in rows], pa.list_(pa.list_(pa.float32(), 3), 2))
        return resolve(plain_file(root / "records.parquet", {
            "image": pa.array([r["image"] for r in rows], pa.binary()), "mix": mix,
            "frames": pa.array([[i] * (i + 1) for i in range(5)], pa.list_(pa.int32())),
            "label": [r["label"] for r in rows], "text": [r["text"] for r in rows]},
            row_group=2))
    if kind == "parquet-hub":
        pytest.importorskip("datasets")
        from tests.helpers.parquet import hub_dataset

        hub_dataset(root, rows=7, shards=2, row_group=3)
        return resolve(root)
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": _jpeg(i), "path": None} for i in range(5)],
         "label": [i % 2 for i in range(5)]},
        features=datasets.Features({"image": datasets.Image(decode=False),
                                    "label": datasets.ClassLabel(names=["a", "b"])}))
    return resolve(ds)


@pytest.fixture(params=KINDS)
def source(request, tmp_path) -> Source:
    src = _make(request.param, tmp_path)
    yield src
    src.close()


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _same_record(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)


def test_length_schema_and_the_stored_form_of_every_field(source):
    assert len(source) >= 5
    assert isinstance(source.schema, Schema) and source.schema.names
    assert source.schema.record in ("dict", "tuple", "pair")
    record = source.read(0)
    assert list(record) == source.schema.names
    for name, field in source.schema.fields.items():
        value = np.asarray(record[name])
        if field.kind in ("image", "bytes", "str"):
            assert value.dtype == np.uint8 and value.ndim == 1 and value.size, name
        elif field.variable:
            assert value.shape[1:] == tuple(field.row_shape), name
            assert value.dtype == np.dtype(field.stored_dtype), name
        else:
            assert value.shape == tuple(field.row_shape), name
            assert value.dtype.newbyteorder("=") == np.dtype(field.stored_dtype), name
        field.value(record[name])  # what a dataset returns from it


def test_read_checks_the_index(source):
    n = len(source)
    assert _same_record(source.read(-1), source.read(n - 1))
    with pytest.raises(IndexError, match="out of range"):
        source.read(n)
    with pytest.raises(TypeError, match="index must be an int"):
        source.read("0")


def test_a_batch_is_the_records_in_the_order_asked_with_fixed_fields_in_blocks(source):
    indices = [3, 0, 4, 0, 1]
    fixed = source.schema.fixed()
    blocks = {n: np.empty((len(indices), *source.schema.fields[n].row_shape),
                          source.schema.fields[n].stored_dtype) for n in fixed}
    batch = source.read_batch(indices, blocks)
    assert len(batch) == len(indices)
    for k, i in enumerate(indices):
        one = source.read(i)
        assert list(batch[k]) == [n for n in source.schema.names if n not in blocks]
        for name in source.schema.names:
            got = blocks[name][k] if name in blocks else batch[k][name]
            assert _same(got, one[name]), (name, i)  # values, dtype and shape
    if fixed:
        wrong = {fixed[0]: np.empty((1, *source.schema.fields[fixed[0]].row_shape), "f8")}
        with pytest.raises(ValueError, match="block of field"):
            source.read_batch(indices, wrong)


def test_pickles_without_handles_and_reads_the_same(source):
    first = source.read(1)
    assert "_opened" in source.__dict__ or not source.__dict__.get("_opened")
    clone = pickle.loads(pickle.dumps(source))
    assert "_opened" not in clone.__dict__
    assert _same_record(clone.read(1), first)
    assert clone.fingerprint() == source.fingerprint()
    clone.close()
    assert _same_record(clone.read(1), first)  # reopens after close


def _read_all(source: Source) -> list[dict]:
    return [source.read(i) for i in range(len(source))]


def _in_child(source: Source) -> tuple[str, list[dict], str]:
    return source.describe(0), _read_all(source), source.fingerprint()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_reads_the_same_in_forked_and_spawned_processes(source, method):
    want = _read_all(source)  # the parent has its handles open before the fork
    with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context(method)) as pool:
        described, got, fingerprint = pool.submit(_in_child, source).result(timeout=120)
    assert described == source.describe(0)
    assert fingerprint == source.fingerprint()  # stable across processes
    assert all(_same_record(a, b) for a, b in zip(got, want, strict=True))


def test_threads_read_side_by_side(source):
    want = _read_all(source)
    indices = list(range(len(source))) * 8
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(source.read, indices))
    assert all(_same_record(g, want[i]) for g, i in zip(got, indices, strict=True))


def test_describe_names_each_sample(source):
    names = [source.describe(i) for i in range(len(source))]
    assert all(isinstance(n, str) and n for n in names)
    assert source.where and isinstance(source.fingerprint(), str)


def test_the_resolver_names_every_path_kind(tmp_path):
    kinds = {}
    for kind in ("h5-plain", "tar", "folder", "list", "arrays", "columns", "parquet"):
        root = tmp_path / kind
        root.mkdir()
        src = _make(kind, root)
        kinds[kind] = type(src).__name__
    assert kinds == {"h5-plain": "H5Source", "tar": "TarSource", "folder": "FolderSource",
                     "list": "ListSource", "arrays": "ArrayFilesSource",
                     "columns": "ColumnsSource", "parquet": "ParquetSource"}
    assert kind_of(STORED / "v1_bytes.lmdb") == "lmdb"
    assert kind_of(STORED / "v2_records_copy.h5") == "hdf5"
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(_png(0))
    assert kind_of(tmp_path / "flat") == "images"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        kind_of(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a source fastpipe reads"):
        kind_of(tmp_path / "empty")


def test_fingerprints_differ_for_different_data(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first = _make("folder", a)
    (b / "images" / "c0").mkdir(parents=True)
    (b / "images" / "c0" / "0.jpg").write_bytes(_jpeg(7))
    assert first.fingerprint() != resolve(b / "images").fingerprint()
