"""Every fastpipe loader lists an ImageFolder tree as torchvision does: same files, same labels."""

from __future__ import annotations

import os

import pytest
from PIL import Image

from fastpipe.data import ImageFolder
from fastpipe.data.sources.folder import FolderSource
from tests.helpers.dali import DALI_MISSING

pytest.importorskip("torchvision", exc_type=ImportError)

import torchvision  # noqa: E402

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)

from fastpipe.dali import FileList  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tricky_tree(tmp_path):
    """Hidden folders, nested folders, names that sort around '/', mixed-case suffixes."""
    files = [
        ".ipynb_checkpoints/x.jpg",
        "cat/a/sub/y.JPG",
        "cat/a-b/w.jpg",
        "cat/a.b/v.jpeg",
        "cat/a/z.png",
        "cat/.hidden.jpg",
        "dog/b.jpg",
        "dog/notes.txt",
    ]
    for name in files:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".txt"):
            path.write_text("not an image")
        else:
            Image.new("RGB", (4, 4)).save(path, format="PNG" if name.endswith(".png") else "JPEG")
    (tmp_path / "root-level.jpg").write_bytes((tmp_path / "dog/b.jpg").read_bytes())
    return tmp_path


def test_all_listings_match_torchvision(tricky_tree):
    reference = torchvision.datasets.ImageFolder(str(tricky_tree))
    expected = [(os.path.relpath(path, tricky_tree), label) for path, label in reference.samples]
    assert len(expected) == 7

    folder = ImageFolder(tricky_tree)
    assert folder.classes == reference.classes
    assert [(os.path.relpath(folder.path(i), tricky_tree), int(folder.targets[i]))
            for i in range(len(folder))] == expected

    files = FileList.from_folder(tricky_tree)
    assert files.classes == reference.classes
    assert [(os.path.relpath(f, tricky_tree), int(label))
            for f, label in zip(files.files, files.targets)] == expected

    listing = FolderSource(tricky_tree)  # what fastpipe pack lists
    assert listing.classes == reference.classes
    assert list(zip(listing.paths(0, len(listing)), listing.labels().tolist())) == expected
