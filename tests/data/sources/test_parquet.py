"""ParquetSource against files written by pyarrow and by Hugging Face ``datasets`` in the Hub's
layout: every value as written, the Hub's struct, ClassLabel names and split names, row groups as
the unit of random access with a bounded cache, and refusals that name the file, column or row."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from fastpipe.data.format.fields import ArrayField, BytesField, ImageField  # noqa: E402
from fastpipe.data.format.layout import PackFormatError  # noqa: E402
from fastpipe.data.format.roles import Label  # noqa: E402
from fastpipe.data.sources.parquet import ParquetSource, list_parquet  # noqa: E402
from fastpipe.data.sources.resolve import kind_of, resolve  # noqa: E402
from tests.helpers.parquet import CLASSES, hub_dataset, jpeg, plain_file  # noqa: E402


@pytest.fixture
def hub(tmp_path):
    pytest.importorskip("datasets")
    rows = hub_dataset(tmp_path, rows=50, shards=3, row_group=7)
    return tmp_path, rows


def test_a_hub_dataset_reads_every_row_as_written(hub):
    root, rows = hub
    source = ParquetSource(root)
    assert len(source) == 50
    assert [p.name for p in source.files] == [f"train-0000{k}-of-00003.parquet" for k in range(3)]
    assert source.schema.record == "dict"
    image, label = source.schema.fields["image"], source.schema.fields["label"]
    assert isinstance(image, ImageField) and isinstance(label.role, Label)
    assert source.schema.classes == {"label": CLASSES}
    assert source.schema.label == "label"
    for i in range(50):
        record = source.read(i)
        assert record["image"].tobytes() == rows[i]["image"]["bytes"]
        assert int(record["label"]) == rows[i]["label"]
    assert source.labels().tolist() == [r["label"] for r in rows]
    # Files of 17, 17 and 16 rows in row groups of 7: the last group of each file is partial.
    assert source.shard_sizes().tolist() == [17, 17, 16]
    assert source._group_rows.tolist() == [7, 7, 3] * 2 + [7, 7, 2]


def test_describe_names_the_file_the_row_and_the_stored_path(hub):
    root, _ = hub
    source = ParquetSource(root)
    assert source.describe(20) == str(Path("data/train-00001-of-00003.parquet")) + \
        "[row 3] (img_00020.JPEG)"


def test_a_batch_reads_rows_from_several_row_groups_in_the_order_asked(hub):
    root, rows = hub
    source = ParquetSource(root, ["label", "image"])
    assert source.schema.record == "tuple" and source.schema.names == ["label", "image"]
    indices = [49, 0, 20, 21, 0, 33]
    batch = source.read_batch(indices)
    for record, i in zip(batch, indices, strict=True):
        assert list(record) == ["label", "image"]
        assert record["image"].tobytes() == rows[i]["image"]["bytes"]


def test_splits_are_picked_by_name_and_a_split_with_files_missing_is_refused(tmp_path):
    pytest.importorskip("datasets")
    hub_dataset(tmp_path, rows=10, shards=2, row_group=4)
    hub_dataset(tmp_path, rows=6, shards=1, row_group=4, split="validation")
    with pytest.raises(ValueError, match=r"splits 'train', 'validation'.*split='train'"):
        ParquetSource(tmp_path)
    assert len(ParquetSource(tmp_path, split="validation")) == 6
    assert len(ParquetSource(tmp_path, split="train")) == 10
    with pytest.raises(ValueError, match="no split 'test'"):
        ParquetSource(tmp_path, split="test")
    # A glob names one split's files without split=.
    assert len(ParquetSource(str(tmp_path / "data" / "train-*.parquet"))) == 10
    (tmp_path / "data" / "train-00001-of-00002.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of the 2 files .* missing "
                                                r"\(train-00001-of-00002.parquet\)"):
        ParquetSource(tmp_path, split="train")


def test_split_folders_of_the_converted_layout(tmp_path):
    for split, n in (("train", 4), ("test", 3)):
        (tmp_path / "default" / split).mkdir(parents=True)
        plain_file(tmp_path / "default" / split / "0000.parquet", {"x": list(range(n))})
    files, root = list_parquet(tmp_path, "test")
    assert files == [tmp_path / "default" / "test" / "0000.parquet"] and root == tmp_path


def test_plain_columns_become_fields_with_their_stored_form(tmp_path):
    images = [jpeg(i) for i in range(5)]
    path = plain_file(tmp_path / "plain.parquet", {
        "jpg": pa.array(images, pa.binary()),
        "blob": pa.array([b"\x00\x01", b"xy", b"", b"z", b"w"], pa.large_binary()),
        "score": pa.array([0.5, 1.5, 2.5, 3.5, 4.5], pa.float32()),
        "flag": [True, False, True, True, False],
        "frames": pa.array([[1.0] * (i + 1) for i in range(5)], pa.list_(pa.float64())),
        "box": pa.array([[[i, 0], [0, i]] for i in range(5)], pa.list_(pa.list_(pa.int16(), 2),
                                                                     2)),
        "tokens": pa.array([[[i, 1, 2]] * (i + 1) for i in range(5)],
                           pa.list_(pa.list_(pa.int32(), 3))),
        "caption": [f"c{i}" for i in range(5)],
    }, row_group=2)
    source = resolve(path)
    fields = source.schema.fields
    assert isinstance(fields["jpg"], ImageField)  # told by the bytes, not the name
    assert isinstance(fields["blob"], BytesField)
    assert fields["score"].kind == "float" and fields["score"].dtype == "float32"
    assert fields["flag"].kind == "int" and fields["flag"].dtype == "bool"
    assert fields["frames"] == ArrayField("float64", (None,))
    assert fields["box"] == ArrayField("int16", (2, 2))
    assert fields["tokens"] == ArrayField("int32", (None, 3))
    assert fields["caption"].kind == "str"
    record = source.read(3)
    assert record["jpg"].tobytes() == images[3]
    assert record["blob"].tobytes() == b"z"
    assert fields["score"].value(record["score"]) == 3.5
    assert fields["flag"].value(record["flag"]) is True
    assert np.array_equal(record["frames"], [1.0] * 4)
    assert np.array_equal(record["box"], [[3, 0], [0, 3]]) and record["box"].dtype == np.int16
    assert np.array_equal(record["tokens"], [[3, 1, 2]] * 4)
    assert fields["caption"].value(record["caption"]) == "c3"
    assert source.read(2)["blob"].size == 0
    blocks = {"box": np.zeros((3, 2, 2), np.int16)}
    rest = source.read_batch([4, 0, 3], blocks)
    assert blocks["box"][:, 0, 0].tolist() == [4, 0, 3] and "box" not in rest[0]


def test_nulls_and_unreadable_columns_are_refused_naming_them(tmp_path):
    path = plain_file(tmp_path / "nulls.parquet", {
        "x": pa.array([1, None, 3], pa.int64()),
        "meta": pa.array([{"a": 1, "b": "x"}] * 3)})
    with pytest.raises(PackFormatError, match="column 'meta' is a struct.*fields=\\[...\\]"):
        ParquetSource(path)
    source = ParquetSource(path, ["x"])
    assert int(source.read(2)["x"]) == 3
    with pytest.raises(PackFormatError, match=r"nulls.parquet\[row 1\]: column 'x' is null"):
        source.read(1)
    ragged = plain_file(tmp_path / "ragged.parquet", {
        "r": pa.array([[[1], [2, 3]]], pa.list_(pa.list_(pa.int8())))})
    with pytest.raises(PackFormatError, match="lists of varying length"):
        ParquetSource(ragged)


def test_files_with_other_columns_and_files_that_are_not_parquet_are_refused(tmp_path):
    a = plain_file(tmp_path / "a.parquet", {"x": [1, 2]})
    b = plain_file(tmp_path / "b.parquet", {"x": [1.0, 2.0]})
    with pytest.raises(PackFormatError, match="b.parquet has other columns"):
        ParquetSource([a, b])
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 40)
    with pytest.raises(PackFormatError, match="bad.parquet is not a readable Parquet file"):
        ParquetSource(bad)
    with pytest.raises(ValueError, match="no column 'y'; it has x"):
        ParquetSource(a, ["y"])


def test_a_truncated_row_group_is_an_error_naming_the_file(tmp_path):
    path = plain_file(tmp_path / "t.parquet", {"b": pa.array([b"x" * 1000] * 40)}, row_group=10)
    source = ParquetSource(path)
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    data[100:len(data) - footer] = b"\xff" * (len(data) - footer - 100)  # pages damaged
    path.write_bytes(bytes(data))
    with pytest.raises(PackFormatError, match=r"t.parquet: row group 0 cannot be read"):
        source.read(0)


def test_the_row_group_cache_is_bounded_and_each_group_read_once_per_batch(hub):
    root, rows = hub
    one_group = ParquetSource(root)._handles().group(0).nbytes
    source = ParquetSource(root, cache_bytes=2 * one_group + one_group // 2)
    reader = source._handles()
    source.read_batch(list(range(0, 50, 3)))  # 9 row groups, each read once
    assert reader.reads == 9
    assert reader.cached <= source.cache_bytes and 1 < len(reader.groups) < 9
    assert 0 not in reader.groups and 8 in reader.groups  # least recently used out first
    source.read(49)  # the last group read is still there
    assert reader.reads == 9
    source.read(0)
    assert reader.reads == 10
    assert source.read(0)["image"].tobytes() == rows[0]["image"]["bytes"]


def test_reading_that_jumps_between_row_groups_is_warned_about_once(tmp_path):
    path = plain_file(tmp_path / "many.parquet", {"x": list(range(2000))}, row_group=20)
    source = ParquetSource(path, cache_bytes=0)
    order = np.random.default_rng(0).permutation(2000)
    with pytest.warns(RuntimeWarning, match="row groups .* were read for .* samples.*window="):
        for i in order[:200]:
            source.read(int(i))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in order[200:400]:
            source.read(int(i))
    calm = ParquetSource(path, cache_bytes=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for start in range(0, 2000, 20):
            calm.read_batch(list(range(start, start + 20)))


def test_the_resolver_names_parquet_files_folders_and_globs(hub, tmp_path):
    root, _ = hub
    assert kind_of(root) == "parquet"
    assert kind_of(root / "data" / "train-00000-of-00003.parquet") == "parquet"
    assert kind_of(str(root / "data" / "*.parquet")) == "parquet"
    assert type(resolve(root)).__name__ == "ParquetSource"


def test_the_fingerprint_follows_the_files_not_where_they_are(hub, tmp_path):
    root, _ = hub
    first = ParquetSource(root).fingerprint()
    moved = tmp_path.parent / (tmp_path.name + "-moved")
    root.rename(moved)
    try:
        assert ParquetSource(moved).fingerprint() == first
        plain_file(moved / "data" / "train-00002-of-00003.parquet", {"x": [1]})
        with pytest.raises(PackFormatError, match="other columns"):
            ParquetSource(moved)
    finally:
        moved.rename(root)
