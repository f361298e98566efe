"""Merging and upgrading packs through the sources: every stored pack of an earlier format
(tests/stored/packs) upgraded to the current one bit for bit, parts of several versions merged,
the refusals, and merges of many parts within the open-file limit, where a limit of the machine is
never reported as damage."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("h5py", exc_type=ImportError)
pytest.importorskip("lmdb", exc_type=ImportError)

import h5py  # noqa: E402

from fastpipe._cli import main  # noqa: E402
from fastpipe.data import H5Dataset, LMDBDataset  # noqa: E402
from fastpipe.data.format.layout import VERSION  # noqa: E402
from fastpipe.data.sources.resolve import resolve  # noqa: E402
from fastpipe.pack import PackError, merge_packs, pack, upgrade, verify  # noqa: E402
from tests.helpers.pack import ArrayDataset  # noqa: E402

pytestmark = pytest.mark.hdf5

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "tests" / "stored" / "packs"
PACKS = sorted(p.name for p in STORED.iterdir() if p.suffix in (".h5", ".lmdb"))


def _same_records(a, b) -> None:
    """Two sources hold the same samples: every field's stored bytes, dtype and shape, the
    checksums, the source paths, the labels and the schema."""
    assert len(a) == len(b)
    assert a.schema.to_json() == b.schema.to_json()
    for i in range(len(a)):
        ra, rb = a.read(i), b.read(i)
        for name in a.schema.names:
            x, y = np.asarray(ra[name]), np.asarray(rb[name])
            assert (x.dtype, x.shape) == (y.dtype, y.shape) and x.tobytes() == y.tobytes(), \
                (i, name)
    for name in a.schema.names:
        if a.crc32(name) is not None:
            assert np.array_equal(a.crc32(name), b.crc32(name)), name
    assert a.paths(0, len(a)) == b.paths(0, len(b))
    assert np.array_equal(a.labels(), b.labels()) if a.labels() is not None else \
        b.labels() is None


def _dataset(path: Path):
    return (LMDBDataset if path.suffix == ".lmdb" else H5Dataset)(path)


@pytest.mark.parametrize("suffix", [".h5", ".lmdb"])
@pytest.mark.parametrize("name", PACKS)
def test_every_stored_pack_upgrades_bit_for_bit(name, suffix, tmp_path):
    old = tmp_path / name
    shutil.copy(STORED / name, old)
    shards = STORED / (name + ".shards")
    if shards.exists():
        shutil.copytree(shards, tmp_path / shards.name)
    new = tmp_path / f"new{suffix}"
    report = upgrade(old, new, progress=False)
    assert (report.count, report.merge, report.format) == (6, "copy",
                                                          "lmdb" if suffix == ".lmdb" else "hdf5")
    with resolve(old) as a, resolve(new) as b:
        assert a.version < VERSION and b.version == VERSION
        assert b.meta["upgraded_from"] == a.version and b.meta["plan"] == a.meta["plan"]
        assert b.meta["skipped"] == a.meta.get("skipped", [])
        _same_records(a, b)
    assert verify(new).ok
    # What a training loop reads is the same: items, targets, classes, paths.
    before, after = _dataset(old), _dataset(new)
    assert (after.classes, after.storage, after.layout, after.sample_shape) == (
        before.classes, before.storage, before.layout, before.sample_shape)
    for i in range(len(before)):
        x, y = before[i], after[i]
        assert type(x) is type(y)
        for u, v in zip(x.values() if isinstance(x, dict) else x,
                        y.values() if isinstance(y, dict) else y, strict=True):
            assert torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v
    assert [after.path(i) for i in range(6)] == [before.path(i) for i in range(6)]
    if new.suffix == ".h5":  # one self-contained file of the current layout
        with h5py.File(new) as f:
            assert f.attrs["fastpipe_format_version"] == VERSION
            assert not any(f[n].is_virtual for n in json.loads(f["_fastpipe/meta"][()])["order"])


def test_the_command_upgrades_and_refuses_what_does_not_apply(tmp_path, capsys):
    out = tmp_path / "new.h5"
    assert main(["pack", "--upgrade", str(STORED / "v1_bytes_virtual.h5"), str(out),
                 "--quiet"]) == 0
    assert f"into {out} (hdf5, bytes storage" in capsys.readouterr().out
    assert verify(out).ok and len(H5Dataset(out)) == 6
    assert main(["pack", "--upgrade", str(STORED / "v1_bytes.lmdb"), str(out), "--quiet"]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["pack", "--upgrade", "a", "b", "--workers", "2", "--merge", "copy"]) == 2
    assert "--merge, --workers do not apply to --upgrade" in capsys.readouterr().err
    assert main(["pack", "--upgrade", str(STORED / "v1_bytes.lmdb")]) == 2
    assert "--upgrade needs OLD NEW, got 1 paths" in capsys.readouterr().err


def test_parts_of_every_version_merge_by_copy_and_version_1_is_refused_virtually(tmp_path):
    v1 = STORED / "v1_bytes_copy.h5"
    shutil.copy(v1, tmp_path / "v1.h5")
    v3 = tmp_path / "v3.h5"
    upgrade(v1, v3, progress=False)
    out = tmp_path / "both.h5"
    report = merge_packs([tmp_path / "v1.h5", v3], out, merge="copy", progress=False)
    assert (report.count, report.storage) == (12, "bytes")
    both, one = H5Dataset(out), H5Dataset(v1)
    for i in range(12):
        assert np.array_equal(both.encoded(i)[0], one.encoded(i % 6)[0])
        assert both.targets[i] == one.targets[i % 6]
    assert verify(out).ok
    with pytest.raises(PackError, match=r"v1\.h5 is a pack of format version 1.*merge='copy'"):
        merge_packs([tmp_path / "v1.h5", v3], tmp_path / "virtual.h5", progress=False)
    assert not (tmp_path / "virtual.h5").exists()
    assert not (tmp_path / "virtual.h5.partial").exists()
    # Version 2 parts map into a virtual merge of the current format.
    shutil.copytree(STORED / "v2_records_virtual.h5.shards",
                    tmp_path / "v2_records_virtual.h5.shards")
    shutil.copy(STORED / "v2_records_virtual.h5", tmp_path / "v2.h5")
    shutil.copy(STORED / "v2_records_copy.h5", tmp_path / "v2c.h5")
    virtual = tmp_path / "v2v.h5"
    merge_packs([tmp_path / "v2c.h5", tmp_path / "v2.h5"], virtual, progress=False)
    with h5py.File(virtual) as f:
        assert f["mix"].is_virtual
        files = sorted({s.file_name for s in f["mix"].virtual_sources()})
    assert "v2c.h5" in files and len(files) == 3  # the copy, and the virtual part's 2 files
    assert all(f.startswith("v2_records_virtual.h5.shards/") for f in files if f != "v2c.h5")
    with resolve(virtual) as merged, resolve(STORED / "v2_records_copy.h5") as stored:
        for i in range(12):
            record, want = merged.read(i), stored.read(i % 6)
            assert all(np.asarray(record[n]).tobytes() == np.asarray(want[n]).tobytes()
                       for n in want)
    assert verify(virtual).ok
    with pytest.raises(PackError, match="only packs of the same fields"):
        merge_packs([tmp_path / "v2c.h5", v3], tmp_path / "mixed.h5", merge="copy",
                    progress=False)


def _run(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env_path = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
    return subprocess.run([sys.executable, "-c", env_path + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_running_out_of_descriptors_while_merging_is_never_called_damage(tmp_path):
    for i in range(3):
        pack(ArrayDataset(n=9), tmp_path / f"p{i}.h5", storage="array", part=(i, 3),
             progress=False)
    done = _run(f"""
        import os, resource
        from pathlib import Path
        from fastpipe.data.format.layout import PackFormatError
        from fastpipe.pack import merge_packs, verify
        import fastpipe.pack._write, h5py, lmdb  # imported before the limit: they open files
        parts = [Path({str(tmp_path)!r}) / f"p{{i}}.h5" for i in range(3)]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        # One descriptor free (listing /proc/self/fd counts the one it uses): a part opens,
        # the second file does not.
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
        for call in (lambda: merge_packs(parts, parts[0].with_name("m.h5"), merge="copy",
                                         progress=False),
                     lambda: verify(parts[0])):
            try:
                call()
            except PackFormatError as exc:
                print("DAMAGE", exc)
            except OSError as exc:
                print("LIMIT", "not damage" in str(exc))
            else:
                print("DONE")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["LIMIT True", "LIMIT True"], done.stdout
    assert not (tmp_path / "m.h5").exists() and not (tmp_path / "m.h5.partial").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pack_of_a_thousand_parts_writes_within_the_open_file_limit(tmp_path):
    """1,000 shards written and merged (virtually, by copy, into LMDB) by a process allowed far
    fewer descriptors than parts: a merge opens one part at a time."""
    done = _run(f"""
        import os, resource
        from pathlib import Path
        from fastpipe.pack import pack
        from fastpipe.pack._write import read_meta
        from tests.helpers.pack import ArrayDataset
        import h5py, lmdb  # imported before the limit: they open files
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
        root = Path({str(tmp_path)!r})
        for name in ("v.h5", "c.h5", "c.lmdb"):
            report = pack(ArrayDataset(n=1000, shape=(4, 4, 3)), root / name, storage="array",
                          shard_size=1, merge="copy" if name != "v.h5" else None,
                          progress=False)
            print(report.shards, report.count, len(read_meta(root / name)["parts"] or []))
    """, timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1000", "1000", "1000"] + ["1000", "1000", "0"] * 2
    source = ArrayDataset(n=1000, shape=(4, 4, 3))
    for name in ("c.h5", "c.lmdb"):
        copy = _dataset(tmp_path / name)
        assert all(np.array_equal(copy[i][0].numpy(), source.array(i).transpose(2, 0, 1))
                   for i in range(0, 1000, 97))
    with h5py.File(tmp_path / "v.h5") as f:
        assert len({s.file_name for s in f["image"].virtual_sources()}) == 1000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pack_of_a_thousand_parts_reads_within_the_open_file_limit(tmp_path):
    done = _run(f"""
        import os, resource
        from pathlib import Path
        from fastpipe.data import H5Dataset
        from fastpipe.pack import pack, verify
        from tests.helpers.pack import ArrayDataset
        out = Path({str(tmp_path)!r}) / "v.h5"
        pack(ArrayDataset(n=1000, shape=(4, 4, 3)), out, storage="array", shard_size=1,
             progress=False)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 200,
                                                    hard))
        ds = H5Dataset(out)
        batch = ds.__getitems__(list(range(1000)))
        print(len(batch), verify(out).ok)
    """, timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1000", "True"]
