"""ImageFolder: the same samples as torchvision's, numpy metadata, workers, seeds and errors."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastpipe.data import CorruptImageError, ImageFolder, fast_collate
from tests.helpers.cpu_path import sample_files

pytest.importorskip("torchvision", exc_type=ImportError)

import torchvision.datasets  # noqa: E402

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def tree(sample_root, tmp_path_factory):
    """The sample tree plus what real folders hold: a nested folder, an upper-case suffix, a file
    that is not an image, and a class name sorting between the others."""
    root = tmp_path_factory.mktemp("tree") / "images"
    shutil.copytree(sample_root, root)
    files = sample_files(root)
    (root / "class_01" / "nested").mkdir()
    shutil.copy(files[0], root / "class_01" / "nested" / "deep.jpg")
    shutil.copy(files[1], root / "class_02" / "UPPER.JPG")
    (root / "class_00" / "readme.txt").write_text("not an image")
    (root / "class_00b").mkdir()
    shutil.copy(files[2], root / "class_00b" / "only.jpeg")
    return root


def test_same_samples_classes_and_labels_as_torchvision(tree):
    ours = ImageFolder(tree)
    theirs = torchvision.datasets.ImageFolder(str(tree))
    assert ours.classes == theirs.classes
    assert ours.class_to_idx == theirs.class_to_idx
    assert len(ours) == len(theirs.samples)
    assert [ours.path(i) for i in range(len(ours))] == [path for path, _ in theirs.samples]
    assert ours.targets.tolist() == theirs.targets


def test_per_sample_metadata_lives_in_numpy_arrays(tree):
    """No Python list or tuple of per-sample objects: workers would copy it page by page."""
    dataset = ImageFolder(tree)
    n = len(dataset)
    for name, value in vars(dataset).items():
        if isinstance(value, (list, tuple, dict)):
            assert len(value) < n, f"attribute {name} holds {len(value)} Python objects"
    assert isinstance(dataset.targets, np.ndarray) and dataset.targets.dtype == np.int64


@pytest.mark.parametrize("train", [True, False])
def test_items_are_uint8_chw_and_int_labels(tree, train):
    dataset = ImageFolder(tree, train=train, size=128)
    image, label = dataset[3]
    assert image.shape == (3, 128, 128) and image.dtype == torch.uint8
    assert type(label) is int and label == dataset.targets[3]
    image, label = dataset[-1]
    assert label == dataset.targets[-1]


def test_eval_items_are_deterministic(tree):
    dataset = ImageFolder(tree, train=False)
    assert torch.equal(dataset[5][0], dataset[5][0])


def test_index_out_of_range_raises_index_error(tree):
    dataset = ImageFolder(tree)
    with pytest.raises(IndexError, match="out of range"):
        dataset[len(dataset)]
    with pytest.raises(IndexError):
        dataset[-len(dataset) - 1]


def test_extensions_filter(tree):
    only_jpeg = ImageFolder(tree, extensions=("jpeg",))
    assert len(only_jpeg) == 1 and only_jpeg.path(0).endswith("only.jpeg")


def test_pickles_for_spawned_workers(tree):
    dataset = ImageFolder(tree, size=64)
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone.path(7) == dataset.path(7) and len(clone) == len(dataset)
    torch.manual_seed(0)
    first = dataset[7][0]
    torch.manual_seed(0)
    assert torch.equal(clone[7][0], first)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_two_workers_see_every_sample_once_and_a_seed_reproduces_the_run(sample_root,
                                                                         no_thread_leak):
    dataset = ImageFolder(sample_root, size=64)

    def run(seed):
        torch.manual_seed(seed)
        loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2,
                            collate_fn=fast_collate)
        return [(images, labels) for images, labels in loader]

    first, again, other = run(0), run(0), run(1)
    labels = torch.cat([labels for _, labels in first])
    assert sorted(labels.tolist()) == sorted(dataset.targets.tolist())
    assert all(images.shape[1:] == (3, 64, 64) and images.dtype == torch.uint8
               for images, _ in first)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, other, strict=True))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_files_whose_size_is_not_known_up_front_are_read_to_the_end(tmp_path):
    """fstat reports 0 bytes for /proc files; the read goes on to the end, as open().read() does."""
    from fastpipe.data.sources.folder import read_file as _read_file

    data = _read_file("/proc/self/status")
    assert data.startswith(b"Name:") and data.endswith(b"\n") and len(data) > 100
    path = tmp_path / "plain.bin"
    path.write_bytes(bytes(range(256)) * 300)
    assert _read_file(str(path)) == path.read_bytes()


def test_missing_root_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        ImageFolder(tmp_path / "nowhere")


def test_root_without_class_folders_says_the_layout(tmp_path):
    (tmp_path / "loose.jpg").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no class sub-folders"):
        ImageFolder(tmp_path)


def test_class_folders_without_images_name_the_extensions(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"\.jpg"):
        ImageFolder(tmp_path)


@pytest.fixture()
def broken_tree(sample_root, tmp_path):
    root = tmp_path / "broken"
    (root / "good").mkdir(parents=True)
    (root / "zbad").mkdir()
    good = sample_files(sample_root)[0]
    shutil.copy(good, root / "good" / "fine.jpg")
    (root / "zbad" / "truncated.jpg").write_bytes(good.read_bytes()[:3000])
    (root / "zbad" / "words.jpg").write_text("this is a text file with an image suffix\n")
    return root


def test_truncated_and_non_image_files_raise_naming_the_file(broken_tree):
    dataset = ImageFolder(broken_tree)
    assert dataset[0][0].shape == (3, 224, 224)
    with pytest.raises(CorruptImageError, match=r"zbad/truncated\.jpg"):
        dataset[1]
    with pytest.raises(CorruptImageError, match=r"zbad/words\.jpg"):
        dataset[2]


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_corrupt_file_error_reaches_the_main_process_with_the_name(broken_tree, no_thread_leak):
    loader = DataLoader(ImageFolder(broken_tree, train=False), batch_size=3, num_workers=1,
                        collate_fn=fast_collate)
    with pytest.raises(CorruptImageError, match=r"truncated\.jpg"):
        next(iter(loader))


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_documented_pipeline_gives_normalized_float_batches(sample_root, no_thread_leak):
    """docs/cpu-path.md's usage: ImageFolder + fast_collate + DataPrefetcher(mean, std) on CPU."""
    from fastpipe import DataPrefetcher
    from fastpipe.ops import normalize

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    dataset = ImageFolder(sample_root, train=False, size=64)
    loader = DataLoader(dataset, batch_size=16, num_workers=2, collate_fn=fast_collate)
    expected = [normalize(images, mean, std) for images, _ in loader]
    seen = 0
    for (images, labels), reference in zip(DataPrefetcher(loader, mean=mean, std=std), expected,
                                           strict=True):
        assert images.dtype == torch.float32 and images.shape == (16, 3, 64, 64)
        assert labels.dtype == torch.int64
        torch.testing.assert_close(images, reference)
        seen += len(labels)
    assert seen == len(dataset)
