"""Packing: round trips, parallel shards, merges, interruption and resume, corrupt inputs, the
CLI."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("h5py", exc_type=ImportError)

import h5py  # noqa: E402

from fastpipe._cli import main  # noqa: E402
from fastpipe.data import H5Dataset, PackFormatError, decode_rgb  # noqa: E402
from fastpipe.pack import CorruptInputError, PackError, merge_packs, pack, verify  # noqa: E402
from tests.helpers.pack import ArrayDataset, KillOnce, make_corrupt_folder  # noqa: E402

pytestmark = pytest.mark.hdf5


def image_files(root: Path) -> list[Path]:
    """The sample tree in pack order: classes sorted, files sorted within each class."""
    return sorted(root.glob("class_*/*.jpg"), key=lambda p: (p.parent.name, p.name))


def assert_same_pack(a: H5Dataset, b: H5Dataset) -> None:
    assert len(a) == len(b)
    assert np.array_equal(a.targets, b.targets)
    assert a.classes == b.classes
    for i in range(len(a)):
        assert a.path(i) == b.path(i)
        if a.storage == "bytes":
            assert np.array_equal(a.encoded(i)[0], b.encoded(i)[0])
        else:
            assert np.array_equal(a[i][0].numpy(), b[i][0].numpy())


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_bytes_round_trip_is_bit_exact(sample_root, tmp_path, no_thread_leak):
    report = pack(sample_root, tmp_path / "p.h5", progress=True)
    files = image_files(sample_root)
    assert (report.count, report.inputs, report.skipped, report.merge) == (48, 48, [], "none")
    ds = H5Dataset(tmp_path / "p.h5")
    assert ds.classes == ["class_00", "class_01", "class_02", "class_03"]
    assert ds.storage == "bytes" and len(ds) == 48
    for i, path in enumerate(files):
        data, label = ds.encoded(i)
        assert data.dtype == np.uint8 and data.tobytes() == path.read_bytes()
        assert label == int(path.parent.name[-2:]) == ds.targets[i]
        assert ds.path(i) == f"{path.parent.name}/{path.name}"
    image, label = ds[7]
    assert image.shape[0] == 3 and image.is_contiguous()
    assert np.array_equal(image.permute(1, 2, 0).numpy(), decode_rgb(files[7].read_bytes()))
    assert not (tmp_path / "p.h5.shards").exists()
    ds.close()


@pytest.mark.timeout(60)
def test_array_round_trip_is_pixel_exact(tmp_path):
    images = ArrayDataset(n=12)
    pack(images, tmp_path / "img.h5", storage="array", progress=False)
    ds = H5Dataset(tmp_path / "img.h5")
    assert ds.sample_shape == (3, 24, 32) and ds.layout == "CHW" and ds.classes == ["a", "b", "c"]
    for i in range(len(images)):
        image, label = ds[i]
        assert image.dtype.is_floating_point is False and image.shape == (3, 24, 32)
        assert np.array_equal(image.numpy(), images.array(i).transpose(2, 0, 1))
        assert label == images.label(i)
    batch = ds.__getitems__([5, 0, 11, 5])
    assert [label for _, label in batch] == [images.label(i) for i in (5, 0, 11, 5)]
    assert np.array_equal(batch[2][0].numpy(), images.array(11).transpose(2, 0, 1))
    # Arrays that are not images (audio, features) come back exactly as stored.
    features = ArrayDataset(n=6, shape=(16, 5), dtype="float32")
    pack(features, tmp_path / "feat.h5", storage="array", progress=False, num_workers=2,
         merge="copy")
    ds = H5Dataset(tmp_path / "feat.h5")
    assert ds.layout == "raw" and ds.meta["dtype"] == "float32"
    for i in range(6):
        assert np.array_equal(ds[i][0].numpy(), features.array(i))


def reference_fit(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """The documented resize for array storage: cover HxW keeping the aspect (bicubic), crop the
    centre."""
    from PIL import Image

    h, w = image.shape[:2]
    scale = max(height / h, width / w)
    nh, nw = max(height, round(h * scale)), max(width, round(w * scale))
    resized = np.asarray(Image.fromarray(image).resize((nw, nh), Image.Resampling.BICUBIC))
    top, left = (nh - height) // 2, (nw - width) // 2
    return resized[top:top + height, left:left + width]


def test_array_storage_of_a_folder_resizes_to_shape(sample_root, tmp_path):
    report = pack(sample_root, tmp_path / "a.h5", storage="array", size="48x64", num_workers=2,
                  progress=False)
    assert report.count == 48
    ds = H5Dataset(tmp_path / "a.h5")
    files = image_files(sample_root)
    for i in (0, 17, 47):
        expected = reference_fit(decode_rgb(files[i].read_bytes()), 48, 64).transpose(2, 0, 1)
        assert np.array_equal(ds[i][0].numpy(), expected)
    with pytest.raises(PackError, match="size"):  # photos of different sizes need size=
        pack(sample_root, tmp_path / "b.h5", storage="array", progress=False)


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_virtual_and_copy_merges_read_identically(sample_root, tmp_path):
    pack(sample_root, tmp_path / "v.h5", num_workers=2, shard_size=10, progress=False)
    copy = pack(sample_root, tmp_path / "c.h5", num_workers=2, shard_size=10, merge="copy",
                progress=False)
    assert pack(sample_root, tmp_path / "s.h5", progress=False).merge == "none"
    assert (copy.shards, copy.merge) == (5, "copy")
    v, c, s = (H5Dataset(tmp_path / "v.h5"), H5Dataset(tmp_path / "c.h5"),
               H5Dataset(tmp_path / "s.h5"))
    assert_same_pack(v, c)
    assert_same_pack(c, s)
    assert len(list((tmp_path / "v.h5.shards").glob("*/part-*.h5"))) == 5
    assert not (tmp_path / "c.h5.shards").exists()  # copy: self-contained, intermediates gone
    # plain h5py sees the virtual dataset too (e.g. for DALI): the field "image" of the record
    with h5py.File(tmp_path / "v.h5") as f:
        assert f["image"].is_virtual and f["label"].is_virtual
        offsets = f["_fastpipe/offsets/image"][:]
        assert (f["image"][offsets[30]:offsets[31]].tobytes()
                == image_files(sample_root)[30].read_bytes())
        assert f["label"][30] == int(image_files(sample_root)[30].parent.name[-2:])
    with h5py.File(tmp_path / "c.h5") as f:
        for name in ("image", "label", "_fastpipe/offsets/image", "_fastpipe/crc32/image",
                     "_fastpipe/path_data"):  # a copy: every dataset contiguous
            assert f[name].chunks is None and f[name].id.get_offset() is not None, name
    # The copy moves anywhere on its own.
    os.replace(tmp_path / "c.h5", tmp_path / "moved.h5")
    assert_same_pack(H5Dataset(tmp_path / "moved.h5"), s)
    # Array storage merges alike.
    images = ArrayDataset(n=20)
    pack(images, tmp_path / "av.h5", storage="array", num_workers=2, shard_size=6, progress=False)
    pack(images, tmp_path / "ac.h5", storage="array", num_workers=2, shard_size=6, merge="copy",
         progress=False)
    assert_same_pack(H5Dataset(tmp_path / "av.h5"), H5Dataset(tmp_path / "ac.h5"))


@pytest.mark.timeout(120)
def test_killed_worker_then_resume_keeps_finished_shards(tmp_path, no_thread_leak):
    marker = tmp_path / "kill-armed"
    marker.touch()
    source = KillOnce(marker, kill_index=12, n=40)
    out = tmp_path / "k.h5"
    shards = tmp_path / "k.h5.shards"
    with pytest.raises(PackError, match=r"exited with code -9.*resume=True"):
        pack(source, out, storage="array", num_workers=2, shard_size=8, progress=False)
    assert not marker.exists() and not out.exists()
    assert multiprocessing.active_children() == []
    (shards,) = shards.iterdir()  # the folder of this run's plan
    finished = sorted(p.name for p in shards.glob("part-*.h5"))
    assert "part-0000000008-0000000016.h5" not in finished  # the killed worker's shard
    assert len(finished) == 4
    before = {name: (os.stat(shards / name).st_ino, os.stat(shards / name).st_mtime_ns)
              for name in finished}

    report = pack(source, out, storage="array", num_workers=2, shard_size=8, progress=False,
                  resume=True)
    assert (report.count, report.shards, report.resumed_shards) == (40, 5, 4)
    after = {name: (os.stat(shards / name).st_ino, os.stat(shards / name).st_mtime_ns)
             for name in finished}
    assert after == before  # kept, not rewritten
    assert not list(shards.glob("*.partial"))
    ds = H5Dataset(out)
    for i in range(40):
        assert np.array_equal(ds[i][0].numpy(), source.array(i).transpose(2, 0, 1))
        assert ds[i][1] == source.label(i)
    assert verify(out).ok


def copy_tree(src: Path, dst: Path) -> None:
    for path in image_files(src):
        (dst / path.parent.name).mkdir(parents=True, exist_ok=True)
        (dst / path.parent.name / path.name).write_bytes(path.read_bytes())


def test_overwrite_after_rewriting_files_packs_the_new_contents(sample_root, tmp_path):
    src = tmp_path / "src"
    copy_tree(sample_root, src)
    out = tmp_path / "p.h5"
    pack(src, out, shard_size=12, progress=False)
    files = image_files(src)
    for k, path in enumerate(files):  # same names, other pixels
        path.write_bytes(image_files(sample_root)[(k + 1) % len(files)].read_bytes())
    report = pack(src, out, shard_size=12, overwrite=True, progress=False)
    assert report.resumed_shards == 0
    ds = H5Dataset(out)
    for i, path in enumerate(files):
        assert ds.encoded(i)[0].tobytes() == path.read_bytes()


def test_interrupted_folder_pack_resumes_only_unchanged_files(sample_root, tmp_path):
    src = tmp_path / "src"
    copy_tree(sample_root, src)
    out = tmp_path / "p.h5"
    pack(src, out, shard_size=12, progress=False)
    out.unlink()  # as if the run had stopped before installing the output
    assert pack(src, out, shard_size=12, progress=False).resumed_shards == 4
    out.unlink()
    first = image_files(src)[0]
    first.write_bytes(image_files(sample_root)[5].read_bytes())  # the plan sees size and mtime
    assert pack(src, out, shard_size=12, progress=False).resumed_shards == 0
    assert H5Dataset(out).encoded(0)[0].tobytes() == first.read_bytes()


def test_dataset_sources_resume_only_when_asked(tmp_path):
    out = tmp_path / "d.h5"
    pack(ArrayDataset(n=12), out, storage="array", shard_size=6, progress=False)
    out.unlink()
    # A dataset's contents are invisible to the plan: another dataset of the same type and length.
    other = ArrayDataset(n=12, shape=(24, 32, 3))
    other.array = lambda i: np.full((24, 32, 3), i, np.uint8)
    assert pack(other, out, storage="array", shard_size=6, progress=False).resumed_shards == 0
    assert np.array_equal(H5Dataset(out)[3][0].numpy(), np.full((3, 24, 32), 3, np.uint8))
    out.unlink()
    assert pack(other, out, storage="array", shard_size=6, progress=False,
                resume=True).resumed_shards == 2


def test_resume_discards_shards_made_with_other_settings(tmp_path):
    source = ArrayDataset(n=18)
    out = tmp_path / "r.h5"
    shards = tmp_path / "r.h5.shards"
    pack(source, out, storage="array", shard_size=6, progress=False)
    out.unlink()  # as if the run had stopped before installing the output
    (plan,) = shards.iterdir()
    first = plan / "part-0000000000-0000000006.h5"
    stranger = ArrayDataset(n=6, shape=(24, 32, 3))
    stranger.array = lambda i: np.full((24, 32, 3), 7, np.uint8)
    pack(stranger, first, storage="array", overwrite=True, progress=False)  # another source's shard
    (plan / "part-0000000012-0000000018.h5").rename(plan / "part-0000000012-0000000018.h5.partial")
    (shards / "part-0000000000-0000000006.h5").write_bytes(b"a shard of an older fastpipe")
    report = pack(source, out, storage="array", shard_size=6, progress=False, resume=True)
    assert (report.count, report.resumed_shards) == (18, 1)
    ds = H5Dataset(out)
    for i in range(len(source)):
        assert np.array_equal(ds[i][0].numpy(), source.array(i).transpose(2, 0, 1))
        assert ds[i][1] == source.label(i)
    assert [p.name for p in shards.iterdir()] == [plan.name]
    assert sorted(p.name for p in plan.iterdir()) == ["part-0000000000-0000000006.h5",
                                                     "part-0000000006-0000000012.h5",
                                                     "part-0000000012-0000000018.h5"]


def test_failed_overwrite_leaves_the_old_virtual_pack_readable(sample_root, tmp_path):
    src = tmp_path / "src"
    copy_tree(sample_root, src)
    out = tmp_path / "p.h5"
    pack(src, out, shard_size=12, progress=False)
    (src / "class_01" / "zz_broken.jpg").write_bytes(b"not a JPEG")
    with pytest.raises(CorruptInputError):
        pack(src, out, shard_size=12, overwrite=True, strict=True, progress=False)
    ds = H5Dataset(out)
    for i, path in enumerate(image_files(sample_root)):
        assert ds.encoded(i)[0].tobytes() == path.read_bytes()
    ds.close()
    assert verify(out).ok
    # A successful overwrite installs the new pack, then removes the old run's shards.
    old = {p.name for p in (tmp_path / "p.h5.shards").iterdir()}
    report = pack(src, out, shard_size=12, overwrite=True, progress=False)
    assert (report.count, len(report.skipped)) == (48, 1)
    (new,) = (tmp_path / "p.h5.shards").iterdir()
    assert new.name not in old and verify(out).ok


def test_a_virtual_pack_refuses_a_replaced_part_file(tmp_path):
    out = tmp_path / "v.h5"
    pack(ArrayDataset(n=12), out, storage="array", shard_size=6, progress=False)
    part = next((tmp_path / "v.h5.shards").glob("*/part-0000000006-*.h5"))
    # same name, other data
    pack(ArrayDataset(n=5), part, storage="array", overwrite=True, progress=False)
    # Every part is checked when the pack opens (one reader engine for every pack).
    with pytest.raises(PackFormatError, match="replaced after the merge"):
        H5Dataset(out)


@pytest.mark.parametrize("workers", [1, 2])
def test_corrupt_inputs_are_skipped_and_listed(sample_root, tmp_path, workers):
    bad = make_corrupt_folder(sample_root, tmp_path / "src")
    report = pack(tmp_path / "src", tmp_path / "p.h5", num_workers=workers, shard_size=4,
                  progress=False)
    assert (report.inputs, report.count) == (12, 8)
    assert {s["source"]: s["reason"] for s in report.skipped}.keys() == bad.keys()
    for s in report.skipped:
        assert bad[s["source"]] in s["reason"]
    ds = H5Dataset(tmp_path / "p.h5")
    assert ds.skipped == report.skipped and len(ds) == 8
    assert all("class_" in ds.path(i) and "truncated" not in ds.path(i) for i in range(8))
    assert verify(tmp_path / "p.h5").ok
    summary = report.summary()
    assert "skipped 4 inputs" in summary and "class_02/empty.jpg: empty file" in summary


@pytest.mark.parametrize("workers", [1, 2])
def test_strict_stops_at_the_first_corrupt_input(sample_root, tmp_path, workers, no_thread_leak):
    make_corrupt_folder(sample_root, tmp_path / "src")
    with pytest.raises(CorruptInputError, match=r"class_0\d/\w+\.jpg"):
        pack(tmp_path / "src", tmp_path / "p.h5", num_workers=workers, strict=True, shard_size=4,
             progress=False)
    assert not (tmp_path / "p.h5").exists()
    assert multiprocessing.active_children() == []


def test_strict_run_does_not_reuse_shards_that_skipped_inputs(sample_root, tmp_path):
    make_corrupt_folder(sample_root, tmp_path / "src")
    out = tmp_path / "p.h5"
    assert pack(tmp_path / "src", out, shard_size=4, progress=False).count == 8
    out.unlink()  # the shards stay, as after an interrupted run
    with pytest.raises(CorruptInputError, match="strict mode"):
        pack(tmp_path / "src", out, strict=True, shard_size=4, progress=False)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_spawned_workers_need_a_picklable_source(tmp_path):
    images = ArrayDataset(n=8)
    pack(images, tmp_path / "s.h5", storage="array", num_workers=2, shard_size=4,
         start_method="spawn", progress=False)
    ds = H5Dataset(tmp_path / "s.h5")
    assert all(np.array_equal(ds[i][0].numpy(), images.array(i).transpose(2, 0, 1))
               for i in range(8))

    class Local(ArrayDataset):  # not importable by a spawned process
        pass

    with pytest.raises(PackError, match="picklable"):
        pack(Local(n=8), tmp_path / "l.h5", storage="array", num_workers=2, start_method="spawn",
             progress=False)
    assert multiprocessing.active_children() == []


def test_shards_from_several_machines_merge(sample_root, tmp_path):
    parts = []
    for i in range(3):
        part = tmp_path / f"part{i}.h5"
        # Part 1 is itself a virtual merge of 3 shards: a virtual merge maps straight to its files.
        report = pack(sample_root, part, part=f"{i}/3", merge="virtual" if i == 1 else "copy",
                      num_workers=2 if i == 1 else 1, shard_size=6 if i == 1 else 100,
                      progress=False)
        assert (report.inputs, report.shards) == (16, 3 if i == 1 else 1)
        parts.append(part)
    pack(sample_root, tmp_path / "full.h5", progress=False)
    full = H5Dataset(tmp_path / "full.h5")
    virtual = merge_packs(list(reversed(parts)), tmp_path / "mv.h5", progress=False)
    assert (virtual.count, virtual.merge) == (48, "virtual")
    with h5py.File(tmp_path / "mv.h5") as f:
        files = sorted({source.file_name for source in f["image"].virtual_sources()})
    (plan,) = (tmp_path / "part1.h5.shards").iterdir()
    assert files == ["part0.h5", f"part1.h5.shards/{plan.name}/part-0000000016-0000000021.h5",
                     f"part1.h5.shards/{plan.name}/part-0000000021-0000000026.h5",
                     f"part1.h5.shards/{plan.name}/part-0000000026-0000000032.h5", "part2.h5"]
    merge_packs(parts, tmp_path / "mc.h5", merge="copy", progress=False)
    assert_same_pack(H5Dataset(tmp_path / "mv.h5"), full)
    assert_same_pack(H5Dataset(tmp_path / "mc.h5"), full)
    with pytest.raises(PackError, match="parts 1/3 are missing"):
        merge_packs([parts[0], parts[2]], tmp_path / "bad.h5", progress=False)
    with pytest.raises(PackError, match="given twice"):
        merge_packs([parts[0], parts[0], parts[1]], tmp_path / "bad.h5", progress=False)


def test_max_side_reencodes_large_images_only(sample_root, tmp_path):
    pack(sample_root, tmp_path / "small.h5", max_side=100, progress=False)
    ds = H5Dataset(tmp_path / "small.h5")
    for i in range(0, 48, 7):
        data, _ = ds.encoded(i)
        assert data[:2].tolist() == [0xFF, 0xD8]  # still JPEG
        assert min(decode_rgb(data).shape[:2]) == 100
    pack(sample_root, tmp_path / "same.h5", max_side=10_000, progress=False)
    same = H5Dataset(tmp_path / "same.h5")
    assert same.encoded(3)[0].tobytes() == image_files(sample_root)[3].read_bytes()


def test_folder_listing_matches_torchvision_image_folder(sample_root, tmp_path):
    torchvision = pytest.importorskip("torchvision")
    jpegs = image_files(sample_root)
    root = tmp_path / "tree"
    layout = [".ipynb_checkpoints/x-checkpoint.jpg", "cat/b.jpg", "cat/.hidden.jpg", "cat/a/z.jpg",
              "cat/a/sub/y.JPG", "cat/a-b/w.jpg", "cat/a.b/v.png.txt", "cat/a.b/v.jpeg",
              "dog/1.jpg", "dog/.cache/2.jpg", "dog/10.jpg", "dog/2.jpg", "root.jpg"]
    for k, rel in enumerate(layout):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(jpegs[k].read_bytes())
    pack(root, tmp_path / "t.h5", progress=False)
    ds = H5Dataset(tmp_path / "t.h5")
    reference = torchvision.datasets.ImageFolder(str(root))
    assert ds.classes == reference.classes == [".ipynb_checkpoints", "cat", "dog"]
    assert ds.targets.tolist() == reference.targets
    assert [ds.path(i) for i in range(len(ds))] == [
        os.path.relpath(p, root) for p, _ in reference.samples]


def test_list_file_source(sample_root, tmp_path):
    files = image_files(sample_root)[:6]
    named = tmp_path / "named.txt"
    named.write_text("# path label\n" + "".join(
        f"{os.path.relpath(p, tmp_path)} {'cat' if k % 2 else 'dog'}\n"
        for k, p in enumerate(files)) + "\n")
    pack(named, tmp_path / "n.h5", progress=False)
    ds = H5Dataset(tmp_path / "n.h5")
    assert ds.classes == ["cat", "dog"] and ds.targets.tolist() == [1, 0, 1, 0, 1, 0]
    assert ds.encoded(4)[0].tobytes() == files[4].read_bytes()
    numbered = tmp_path / "numbered.scp"
    numbered.write_text("".join(f"{p}\t{k * 10}\n" for k, p in enumerate(files)))
    pack(numbered, tmp_path / "i.h5", progress=False)
    assert H5Dataset(tmp_path / "i.h5").targets.tolist() == [0, 10, 20, 30, 40, 50]
    bare = tmp_path / "bare.txt"
    bare.write_text("".join(f"{p}\n" for p in files))
    pack(bare, tmp_path / "b.h5", progress=False)
    ds = H5Dataset(tmp_path / "b.h5")
    assert ds.targets.tolist() == [-1] * 6 and ds.classes == [] and ds.path(0) == str(files[0])


def test_labels_below_minus_one_are_refused_when_packing(sample_root, tmp_path):
    files = image_files(sample_root)[:3]
    listed = tmp_path / "negative.txt"
    listed.write_text("".join(f"{p}\t{label}\n" for p, label in zip(files, [0, -1, -5])))
    with pytest.raises(PackError, match=r"sample 2 has label -5; labels are class indices"):
        pack(listed, tmp_path / "l.h5", progress=False)
    columns = tmp_path / "columns.txt"
    columns.write_text("#fields: image label\n" + "".join(
        f"{p}\t{label}\n" for p, label in zip(files, [-2, 0, 1])))
    with pytest.raises(PackError, match=r"sample 0 has label -2"):
        pack(columns, tmp_path / "c.h5", progress=False)

    class Negative(ArrayDataset):
        def __getitem__(self, index):
            return self.array(index), -3 if index == 1 else 0

    with pytest.raises(PackError, match=r"dataset\[1\] has label -3; labels are class"):
        pack(Negative(n=4), tmp_path / "d.h5", progress=False)
    assert not (tmp_path / "l.h5").exists() and not (tmp_path / "d.h5").exists()


def test_bad_arguments_say_what_to_do(sample_root, tmp_path):
    out = tmp_path / "o.h5"
    with pytest.raises(ValueError, match="storage"):
        pack(sample_root, out, storage="jpeg")
    with pytest.raises(ValueError, match="0 <= i < n"):
        pack(sample_root, out, part="3/2")
    with pytest.raises(ValueError, match="max_side applies to bytes"):
        pack(sample_root, out, storage="array", max_side=100)
    with pytest.raises(ValueError, match="size applies to array"):
        pack(sample_root, out, size=(10, 10))
    with pytest.raises(ValueError, match="LMDB has no virtual"):
        pack(sample_root, out, format="lmdb", merge="virtual")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pack(tmp_path / "nowhere", out)
    with pytest.raises(TypeError, match="map-style dataset"):
        pack(42, out)
    out.write_bytes(b"x")
    with pytest.raises(FileExistsError, match="overwrite"):
        pack(sample_root, out)
    assert pack(sample_root, out, overwrite=True, progress=False).count == 48


@pytest.mark.slow
def test_cli_pack_merge_and_verify(sample_root, tmp_path, capsys):
    out = tmp_path / "cli.h5"
    assert main(["pack", str(sample_root), str(out), "--workers", "2", "--shard-size", "20",
                 "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["count"], report["shards"], report["merge"]) == (48, 3, "virtual")
    for i in range(2):
        assert main(["pack", str(sample_root), str(tmp_path / f"s{i}.h5"), "--part", f"{i}/2",
                     "--quiet"]) == 0
    assert "packed 24 of 24 inputs" in capsys.readouterr().out
    assert main(["pack", "--merge-only", str(tmp_path / "m.h5"), str(tmp_path / "s0.h5"),
                 str(tmp_path / "s1.h5"), "--merge", "copy", "--quiet"]) == 0
    capsys.readouterr()
    assert_same_pack(H5Dataset(tmp_path / "m.h5"), H5Dataset(out))
    assert main(["verify", str(tmp_path / "m.h5"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["verify", str(out), "--sample", "5", "--quiet"]) == 0
    assert "5 checked" in capsys.readouterr().out


def test_cli_errors(sample_root, tmp_path, capsys):
    assert main(["pack", str(sample_root)]) == 2
    assert "expected SOURCE OUTPUT" in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "nowhere"), str(tmp_path / "o.h5")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["pack", "--merge-only", str(tmp_path / "o.h5"), str(tmp_path / "a.h5"),
                 "--workers", "2"]) == 2
    assert main(["verify", str(tmp_path / "missing.h5")]) == 2
    make_corrupt_folder(sample_root, tmp_path / "src")
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "o.h5"), "--strict", "--quiet"]) == 1
    assert "strict mode" in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "o.h5"), "--quiet"]) == 0
    assert "skipped 4 inputs" in capsys.readouterr().out


def test_pack_options_check_and_normalise_once():
    from fastpipe.pack import PackOptions

    options = PackOptions(storage="array", part="1/4", size="48x64", quality=80.0)
    assert (options.part, options.size, options.quality) == ((1, 4), (48, 64), 80)
    assert PackOptions(storage="array", size=32).size == (32, 32)
    assert (options.format, options.merge) == (None, None)
    assert (options.for_output("x.lmdb").format, options.for_output("x.lmdb").merge) == (
        "lmdb", "copy")
    assert (options.for_output("x.h5").format, options.for_output("x.h5").merge) == (
        "hdf5", "virtual")
    with pytest.raises(ValueError, match="num_workers must be a positive int, got the bool True"):
        PackOptions(num_workers=True)
    with pytest.raises(ValueError, match="LMDB has no virtual"):
        PackOptions(merge="virtual").for_output("x.lmdb")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.part = (0, 4)


def test_packing_has_one_home():
    import fastpipe.data
    import fastpipe.pack

    assert fastpipe.pack.__all__ == sorted(fastpipe.pack.__all__)
    for name in ("pack", "merge_packs", "verify", "PackReport", "VerifyReport", "PackError",
                 "CorruptInputError"):
        assert name in fastpipe.pack.__all__ and name not in fastpipe.data.__all__
        with pytest.raises(AttributeError):
            getattr(fastpipe.data, name)
    assert "PackFormatError" in fastpipe.data.__all__  # the readers' error, raised on open


def test_the_modules_of_pack_import_each_other_without_a_circle():
    """One writer on one format module: the pack's modules form no import circle, lazy imports
    inside functions included (the reader side is held by tests/integration/test_layering.py)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "fastpipe" / "pack"
    graph = {}
    for path in root.glob("*.py"):
        name = f"fastpipe.pack.{path.stem}" if path.stem != "__init__" else "fastpipe.pack"
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "fastpipe.pack._"):
                found.add(node.module)
        graph[name] = found
    assert "fastpipe.pack._inputs" in graph and "fastpipe.pack._records" not in graph

    def reaches(start: str, seen: tuple[str, ...]) -> None:
        for target in graph.get(start, ()):
            assert target not in seen, " -> ".join((*seen, target))
            reaches(target, (*seen, target))

    for module in graph:
        if module != "fastpipe.pack":
            reaches(module, (module,))


class SomeRaise(ArrayDataset):
    """Raises for inputs 4 to 7: with shards of 4, the second shard holds no sample."""

    def __getitem__(self, index):
        if 4 <= index < 8:
            raise OSError(f"cannot read input {index}")
        return super().__getitem__(index)


def test_a_virtual_pack_with_an_empty_shard_reads_every_field_directly(tmp_path):
    out = tmp_path / "v.h5"
    report = pack(SomeRaise(n=12), out, storage="array", shard_size=4, progress=False)
    assert (report.count, report.shards, len(report.skipped)) == (8, 3, 4)
    assert report.skipped[0] == {"index": 4, "source": "SomeRaise[4]",
                                 "reason": "dataset[4] raised OSError: cannot read input 4"}
    ds = H5Dataset(out)
    assert all(c.extents is not None for c in ds.source._columns.values())  # no h5py fallback
    assert len(ds.meta["parts"]) == 2  # the empty shard maps nothing
    source = SomeRaise(n=12)
    for k, i in enumerate([0, 1, 2, 3, 8, 9, 10, 11]):
        image, label = ds[k]
        assert np.array_equal(image.numpy(), source.array(i).transpose(2, 0, 1))
        assert label == source.label(i)
    assert verify(out).ok
