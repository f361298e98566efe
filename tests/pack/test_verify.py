"""verify and the metadata's checksum (issue 40): a value of the metadata edited after the pack
was written (a field's kind or role, a class) fails verify and `fastpipe verify`; packs written
before the checksum (format versions 1 and 2, version 3 without it) still read and verify, with a
note that their metadata is unchecked; every writer stores it (shards, virtual and copy merges,
LMDB, upgrade). And a virtual pack whose part folder is gone names that folder."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

h5py = pytest.importorskip("h5py", exc_type=ImportError)
lmdb = pytest.importorskip("lmdb", exc_type=ImportError)

from fastpipe.__main__ import main  # noqa: E402
from fastpipe.data import H5Dataset, LMDBDataset  # noqa: E402
from fastpipe.data.format import layout as fmt  # noqa: E402
from fastpipe.pack import PackError, merge_packs, pack, upgrade, verify  # noqa: E402

pytestmark = pytest.mark.hdf5

STORED = Path(__file__).resolve().parents[1] / "stored" / "packs"


def _png(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((6, 5, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


class Records:
    classes = ["cat", "dog"]

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < 4:
            raise IndexError(i)
        return {"image": _png(40 * i), "label": i % 2}


def _edit_h5_meta(path: Path, edit) -> None:
    with h5py.File(path, "r+") as f:
        meta = json.loads(f[fmt.R_META][()])
        edit(meta)
        del f[fmt.R_META]
        f.create_dataset(fmt.R_META, data=json.dumps(meta), dtype=h5py.string_dtype("utf-8"))


def _edit_lmdb_meta(path: Path, edit) -> None:
    env = lmdb.open(str(path), subdir=False, lock=False)
    try:
        with env.begin(write=True) as txn:
            meta = json.loads(bytes(txn.get(fmt.LMDB_META)))
            edit(meta)
            txn.put(fmt.LMDB_META, json.dumps(meta).encode())
    finally:
        env.close()


def _image_as_bytes(meta: dict) -> None:
    meta["fields"]["image"]["kind"] = "bytes"
    meta["fields"]["image"].pop("role", None)


@pytest.mark.parametrize("edit", [
    _image_as_bytes,
    lambda meta: meta["fields"]["image"].update(role={"name": "mask"}),
    lambda meta: meta["classes"].update(label=["dog", "cat"]),
    lambda meta: meta.update(meta_crc32=None),  # null is not an absent key
], ids=["kind", "role", "classes", "null checksum"])
def test_an_edited_metadata_value_fails_verify(tmp_path, capsys, edit):
    path = tmp_path / "edited.h5"
    pack(Records(), path, progress=False, merge="copy")
    assert verify(path).ok
    _edit_h5_meta(path, edit)
    H5Dataset(path)  # its types and ranges still pass: only the checksum tells
    report = verify(path)
    assert not report.ok
    assert any("its metadata does not match the checksum fastpipe stored with it" in p
               for p in report.problems), report.problems
    assert main(["verify", str(path), "--quiet"]) == 1
    assert "does not match the checksum" in capsys.readouterr().out


def test_an_edited_lmdb_metadata_value_fails_verify(tmp_path):
    path = tmp_path / "edited.lmdb"
    pack(Records(), path, progress=False, format="lmdb")
    assert verify(path).ok
    _edit_lmdb_meta(path, _image_as_bytes)
    LMDBDataset(path)
    report = verify(path)
    assert not report.ok and "does not match the checksum" in report.problems[0]


def test_every_writer_stores_a_checksum_that_holds(tmp_path):
    written = {"copy": tmp_path / "copy.h5", "virtual": tmp_path / "virtual.h5",
               "lmdb": tmp_path / "records.lmdb"}
    pack(Records(), written["copy"], progress=False, merge="copy")
    pack(Records(), written["virtual"], progress=False, merge="virtual", shard_size=2)
    pack(Records(), written["lmdb"], progress=False, format="lmdb")
    merge_packs([written["copy"], written["virtual"]], tmp_path / "merged.h5", merge="virtual")
    merge_packs([written["copy"], written["virtual"]], tmp_path / "merged.lmdb")
    upgrade(STORED / "v1_bytes_copy.h5", tmp_path / "upgraded.h5")
    paths = [*written.values(), tmp_path / "merged.h5", tmp_path / "merged.lmdb",
             tmp_path / "upgraded.h5"]
    paths += sorted((tmp_path / "virtual.h5.shards").rglob("*.h5"))  # the part files too
    for path in paths:
        meta = _read_meta(path)
        assert fmt.has_checksum(meta), path
        assert fmt.unsealed_reason(meta, str(path)) is None, path
        report = verify(path)
        assert report.ok and not report.notes, (path, report.problems, report.notes)


def _read_meta(path: Path) -> dict:
    from fastpipe.pack._write import read_meta

    return read_meta(path)


@pytest.mark.parametrize("name", sorted(p.name for p in STORED.iterdir()
                                        if p.suffix in (".h5", ".lmdb")))
def test_packs_written_before_the_checksum_verify_with_a_note(tmp_path, name):
    """The stored packs of format versions 1 and 2 (never rewritten here: copies are read)."""
    for item in STORED.iterdir():
        if item.name.startswith(name):
            (shutil.copytree if item.is_dir() else shutil.copy)(item, tmp_path / item.name)
    report = verify(tmp_path / name)
    assert report.ok, report.problems
    assert len(report.notes) == 1 and "the metadata has no checksum (format version" in \
        report.notes[0], report.notes
    assert "note: the metadata has no checksum" in report.summary()


def test_a_version_3_pack_without_the_checksum_verifies_with_a_note(tmp_path, capsys):
    path = tmp_path / "older.h5"
    pack(Records(), path, progress=False, merge="copy")
    _edit_h5_meta(path, lambda meta: meta.pop(fmt.META_CRC32))
    report = verify(path)
    assert report.ok, report.problems
    assert report.notes == [
        "the metadata has no checksum (format version 3, written before fastpipe stored one): "
        "its values were checked for type and range only, not against what fastpipe wrote; "
        "fastpipe pack --upgrade OLD NEW (fastpipe.pack.upgrade) rewrites the pack with one"]
    assert main(["verify", str(path), "--quiet"]) == 0
    assert "note: the metadata has no checksum" in capsys.readouterr().out
    upgrade(path, tmp_path / "sealed.h5")
    assert verify(tmp_path / "sealed.h5").notes == []


@pytest.mark.parametrize("how", ["upgrade", "merge copy", "merge virtual", "merge lmdb",
                                 "lmdb upgrade", "pack"])
def test_a_pack_whose_metadata_fails_its_checksum_is_not_sealed_again(tmp_path, how):
    """upgrade, merge_packs and pack (a pack as its source) wrote an edited pack's metadata, or
    the fields it describes, with a new checksum: verify then called the output sound. They
    refuse it, naming the pack and the fix."""
    lmdb_input = how == "lmdb upgrade"
    path = tmp_path / ("edited.lmdb" if lmdb_input else "edited.h5")
    if lmdb_input:
        pack(Records(), path, progress=False, format="lmdb")
        _edit_lmdb_meta(path, _image_as_bytes)
    else:
        pack(Records(), path, progress=False, merge="copy")
        _edit_h5_meta(path, _image_as_bytes)
    good = tmp_path / "good.h5"
    pack(Records(), good, progress=False, merge="copy")
    out = tmp_path / ("out.lmdb" if how == "merge lmdb" else "out.h5")
    with pytest.raises(PackError, match=r"edited\.(h5|lmdb): its metadata does not match the "
                       r"checksum.*(upgrade|merge_packs|pack) refuses"):
        if how == "pack":  # the pack as a source of another
            pack(path, out, progress=False)
        elif how.endswith("upgrade"):
            upgrade(path, out)
        else:
            merge_packs([good, path], out, merge=how.split()[1] if how != "merge lmdb" else None)
    assert not out.exists()


def test_upgrading_a_pack_without_a_checksum_says_what_the_new_one_covers(tmp_path):
    report = upgrade(STORED / "v1_bytes_copy.h5", tmp_path / "upgraded.h5")
    assert len(report.notes) == 1, report.notes
    assert "covers its metadata as it stood at the upgrade" in report.notes[0]
    assert report.notes[0] in report.summary()
    sealed = tmp_path / "sealed.h5"
    assert upgrade(tmp_path / "upgraded.h5", sealed).notes == []  # it had one: nothing to say


def test_the_checksum_covers_the_text_as_stored():
    meta = {"format": fmt.FORMAT, "version": 3, "count": 2, "source": "données/ü",
            "score": 0.1, "classes": {"label": ["a", "b"]}}
    sealed = fmt.sealed(meta)
    assert fmt.sealed(sealed) == sealed  # sealing again replaces the value with the same
    again = json.loads(fmt.meta_json(sealed))
    assert fmt.unsealed_reason(again, "p") is None
    again["source"] = "données/v"
    assert "p: its metadata does not match" in fmt.unsealed_reason(again, "p")
    again = dict(sealed, meta_crc32="7")
    assert fmt.unsealed_reason(again, "p") is not None


def test_a_missing_part_folder_of_a_merged_pack_is_named_with_what_to_do(tmp_path):
    """A merge of virtual packs reads its parts from each pack's .shards folder: the message
    named the merged pack's own .shards folder, which never existed."""
    for name in ("p0.h5", "p1.h5"):
        pack(Records(), tmp_path / name, progress=False, merge="virtual", shard_size=2)
    merge_packs([tmp_path / "p0.h5", tmp_path / "p1.h5"], tmp_path / "m.h5", merge="virtual")
    shutil.rmtree(tmp_path / "p0.h5.shards")
    report = verify(tmp_path / "m.h5")
    assert not report.ok
    text = report.problems[0]
    assert f"the folder {tmp_path / 'p0.h5.shards'} is gone, and with it 2 of the pack's 4 " \
           "part files; put it back at that path" in text, text
    assert "m.h5.shards" not in text and "merge='copy'" in text
