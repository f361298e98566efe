"""PairedFolders (fastpipe/data/datasets/folders.py): pairing by name, refusing what does not pair,
the same joint crops on every kind of worker and after a resume, and packing the stored bytes."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from fastpipe import DataLoaderX
from fastpipe.data import JointCrop, PairedFolders, fast_collate


def area_down(chw: torch.Tensor, s: int) -> torch.Tensor:
    return F.avg_pool2d(chw.float()[None], s)[0].round().to(torch.uint8)


def make_pairs(root, count=10, s=2, lr_name="{}x2", size=(20, 24), seed=0):
    """HR random-texture PNGs and LR = their area downscale, DIV2K-style names."""
    rng = np.random.default_rng(seed)
    (root / "HR").mkdir(parents=True)
    (root / "LR").mkdir()
    for i in range(count):
        hr = rng.integers(0, 256, (size[0] * s, size[1] * s, 3), dtype=np.uint8)
        lr = area_down(torch.from_numpy(hr).permute(2, 0, 1), s).permute(1, 2, 0).numpy()
        Image.fromarray(hr).save(root / "HR" / f"{i:04d}.png")
        Image.fromarray(lr).save(root / "LR" / (lr_name.format(f"{i:04d}") + ".png"))
    return root / "LR", root / "HR"


SR = dict(size=8, hflip=0.5, vflip=0.5, rot90=True, factors={"hr": 2})


@pytest.fixture
def pairs(tmp_path):
    return make_pairs(tmp_path)


def test_pairs_by_name_with_a_template_and_crops_aligned(pairs):
    lr, hr = pairs
    ds = PairedFolders({"lr": lr, "hr": hr}, joint=JointCrop(**SR), seed=3,
                       templates={"lr": "{}x2"})
    assert len(ds) == 10
    assert ds.paths(4) == {"lr": str(lr / "0004x2.png"), "hr": str(hr / "0004.png")}
    for i in range(len(ds)):
        record = ds[i]
        assert record["lr"].shape == (3, 8, 8) and record["hr"].shape == (3, 16, 16)
        assert torch.equal(area_down(record["hr"], 2), record["lr"])
    whole = PairedFolders({"lr": lr, "hr": hr}, templates={"lr": "{}x2"})[4]
    assert whole["hr"].shape == (3, 40, 48)
    assert torch.equal(whole["hr"], torch.from_numpy(np.array(Image.open(hr / "0004.png")))
                       .permute(2, 0, 1))


def test_unmatched_files_are_refused_with_a_count_or_skipped_and_counted(pairs):
    lr, hr = pairs
    with pytest.raises(ValueError, match=r"20 files have no partner.*hr: 0000\.png.*15 more"):
        PairedFolders({"lr": lr, "hr": hr})  # no template: nothing pairs
    (hr / "0010.png").write_bytes((hr / "0000.png").read_bytes())
    (hr / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match=r"1 files have no partner.*hr: 0010\.png.*"
                                         "on_unmatched='skip'"):
        PairedFolders({"lr": lr, "hr": hr}, templates={"lr": "{}x2"})
    with pytest.warns(UserWarning, match="left out 1 files"):
        ds = PairedFolders({"lr": lr, "hr": hr}, templates={"lr": "{}x2"}, on_unmatched="skip")
    assert len(ds) == 10 and ds.unmatched == ["hr: 0010.png"]
    with pytest.raises(ValueError, match="do not fit templates"):
        PairedFolders({"lr": lr, "hr": hr}, templates={"hr": "{}x2"})


@pytest.mark.parametrize("kwargs, message", [
    (dict(roots=[]), "roots must be a dict"),
    (dict(roots={"lr": "missing-folder"}), "not a folder"),
    (dict(templates={"lr": "x2"}), "'{}' once"),
    (dict(templates={"mask": "{}"}), "not in roots"),
    (dict(on_unmatched="ignore"), "on_unmatched"),
    (dict(joint=JointCrop(8, interpolation={"mask": "nearest"})), "'mask'.*no such field"),
    (dict(joint=JointCrop(8, factors={"lr": 2, "hr": 4})), "reference grid"),
    (dict(joint=JointCrop(8, boxes={"boxes": ()})), "boxes names 'boxes'"),
    (dict(joint=dict(size=8)), "JointCrop"),
])
def test_bad_arguments_are_refused(pairs, kwargs, message):
    lr, hr = pairs
    kwargs = {"roots": {"lr": lr, "hr": hr}, "templates": {"lr": "{}x2"}, **kwargs}
    with pytest.raises((ValueError, TypeError, FileNotFoundError), match=message):
        PairedFolders(**kwargs)


def test_mismatched_sizes_are_refused_naming_the_sample(tmp_path):
    lr, hr = make_pairs(tmp_path, count=3)
    Image.fromarray(np.zeros((41, 48, 3), np.uint8)).save(hr / "0001.png")
    ds = PairedFolders({"lr": lr, "hr": hr}, joint=JointCrop(**SR), templates={"lr": "{}x2"})
    ds[0]
    with pytest.raises(ValueError, match=r"sample 1 of PairedFolders .*0001x2\.png.*0001\.png.*"
                                         r"'hr' is 41x48.*2 x 'lr' \(20x24\) = 40x48"):
        ds[1]


def loader(ds, **kwargs):
    return DataLoaderX(ds, batch_size=3, shuffle=True, seed=1, collate_fn=fast_collate, **kwargs)


def batches(loader, epochs=2):
    out = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        out.append([{k: v.clone() for k, v in b.items()} for b in loader])
    return out


def assert_same(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_same_crops_on_0_2_process_2_thread_workers_and_after_a_resume(pairs,
                                                                             no_thread_leak):
    lr, hr = pairs
    ds = PairedFolders({"lr": lr, "hr": hr}, joint=JointCrop(**SR), seed=7,
                       templates={"lr": "{}x2"})
    reference = batches(loader(ds, num_workers=0))
    assert not all(torch.equal(a["lr"], b["lr"])
                   for a, b in zip(reference[0], reference[1], strict=False))  # new draws
    for config in (dict(num_workers=2), dict(num_workers=2, worker_method="thread"),
                   dict(num_workers=2, multiprocessing_context="spawn")):
        got = batches(loader(ds, **config))
        for epoch in range(2):
            assert_same(reference[epoch], got[epoch])
    for config in (dict(num_workers=0), dict(num_workers=2, worker_method="thread")):
        first = loader(ds, **config)
        first.sampler.set_epoch(1)
        it = iter(first)
        next(it), next(it)
        state = first.state_dict()
        del it
        restored = loader(PairedFolders({"lr": lr, "hr": hr}, joint=JointCrop(**SR), seed=7,
                                        templates={"lr": "{}x2"}), **config)
        restored.load_state_dict(state)
        restored.sampler.set_epoch(1)
        assert_same(reference[1][2:], [dict(b) for b in restored])


def test_pickles_with_its_draws(pairs):
    lr, hr = pairs
    ds = PairedFolders({"lr": lr, "hr": hr}, joint=JointCrop(**SR), templates={"lr": "{}x2"})
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.seed == ds.seed and copy.fingerprint() == ds.fingerprint()
    for i in range(3):
        assert torch.equal(copy[i]["hr"], ds[i]["hr"])


@pytest.mark.parametrize("fmt", ["hdf5", "lmdb"])
def test_a_pack_of_the_stored_bytes_gives_the_same_crops(pairs, tmp_path, fmt):
    pytest.importorskip("h5py" if fmt == "hdf5" else "lmdb")
    from fastpipe.data import H5Dataset, LMDBDataset
    from fastpipe.pack import pack

    lr, hr = pairs
    joint = JointCrop(**SR)
    ds = PairedFolders({"lr": lr, "hr": hr}, joint=joint, seed=5, templates={"lr": "{}x2"})
    out = tmp_path / ("pairs.h5" if fmt == "hdf5" else "pairs.lmdb")
    pack(ds.pack_source(), out, progress=False, format=fmt)
    reader = H5Dataset if fmt == "hdf5" else LMDBDataset
    stored = reader(out, fields=["hr"])
    assert bytes(stored.source.read(3, ["hr"])["hr"]) == (hr / "0003.png").read_bytes()
    packed = reader(out, joint=joint, seed=5)
    for epoch in range(2):
        packed.set_epoch(epoch)
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            a, b = packed[i], ds[i]
            assert torch.equal(a["lr"], b["lr"]) and torch.equal(a["hr"], b["hr"])


@pytest.mark.slow
def test_fastpipe_pack_on_a_folder_without_class_folders_packs_one_image_field(pairs, tmp_path):
    pytest.importorskip("h5py")
    from fastpipe.data import H5Dataset

    _, hr = pairs
    result = subprocess.run([sys.executable, "-m", "fastpipe", "pack", str(hr),
                             str(tmp_path / "hr.h5"), "--no-progress"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ds = H5Dataset(tmp_path / "hr.h5")
    assert list(ds.fields) == ["image"] and len(ds) == 10
    assert bytes(ds.source.read(2, ["image"])["image"]) == (hr / "0002.png").read_bytes()
    (tmp_path / "empty").mkdir()
    result = subprocess.run([sys.executable, "-m", "fastpipe", "pack", str(tmp_path / "empty"),
                             str(tmp_path / "e.h5"), "--no-progress"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "holds no images and no class folders" in result.stderr


def test_dali_refuses_a_dataset_with_a_joint_crop(pairs):
    from fastpipe.dali.sources import EncodedSource

    lr, hr = pairs
    ds = PairedFolders({"lr": lr, "hr": hr}, joint=JointCrop(**SR), templates={"lr": "{}x2"})
    with pytest.raises(ValueError, match="DALI does not run"):
        EncodedSource(ds, batch_size=2)


def test_a_drawn_seed_is_saved_and_replayed_on_resume(pairs):
    lr, hr = pairs

    def build(global_seed):
        torch.manual_seed(global_seed)  # seed=None draws the dataset's seed from torch's
        return loader(PairedFolders({"lr": lr, "hr": hr}, joint=JointCrop(**SR),
                                    templates={"lr": "{}x2"}), num_workers=0)

    first = build(0)
    it = iter(first)
    next(it)
    state = first.state_dict()
    rest = [{k: v.clone() for k, v in b.items()} for b in it]
    restored = build(1)
    assert restored.dataset.seed != first.dataset.seed
    restored.load_state_dict(state)
    assert restored.dataset.seed == first.dataset.seed
    assert_same(rest, list(restored))
