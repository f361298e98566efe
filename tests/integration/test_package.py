"""The package surface: a small sorted public API, and an import that pulls in no optional part."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import fastpipe
from fastpipe._optional import MissingDependencyError, require

# (tqdm is not listed: torch itself imports it.)
OPTIONAL = ["h5py", "lmdb", "nvidia.dali", "matplotlib", "PIL", "simplejpeg", "torchvision"]


def test_public_api_is_sorted_and_resolvable():
    assert fastpipe.__all__ == sorted(fastpipe.__all__)
    for name in fastpipe.__all__:
        assert hasattr(fastpipe, name), name


@pytest.mark.slow
def test_import_fastpipe_loads_no_optional_dependency():
    code = (
        "import sys, json; import fastpipe, fastpipe.data, fastpipe.ops; "
        f"print(json.dumps([m for m in {OPTIONAL!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.slow
def test_subpackages_load_on_first_use_without_optional_dependencies():
    code = (
        "import sys, json; import fastpipe; "
        "names = [fastpipe.data.ImageFolder, fastpipe.data.sample_images, fastpipe.ops.cutout, "
        "fastpipe.image_loader]; "
        f"print(json.dumps([m for m in {OPTIONAL!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.slow
def test_dali_is_reachable_from_import_fastpipe_alone():
    pytest.importorskip("nvidia.dali")
    code = "import fastpipe; print(fastpipe.dali.DALILoader.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DALILoader"


def test_unknown_attributes_still_raise():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        fastpipe.no_such_name  # noqa: B018
    assert {"data", "ops", "dali", "image_loader"} <= set(dir(fastpipe))


def test_one_home_for_the_imagenet_statistics():
    from fastpipe import _constants

    assert fastpipe.IMAGENET_MEAN == (0.485, 0.456, 0.406)
    assert fastpipe.IMAGENET_STD == (0.229, 0.224, 0.225)
    assert fastpipe.IMAGENET_MEAN is _constants.IMAGENET_MEAN
    if importlib.util.find_spec("nvidia.dali") is not None:
        dali = importlib.import_module("fastpipe.dali")
        assert not hasattr(dali, "IMAGENET_MEAN"), "one home: fastpipe.IMAGENET_MEAN"


def test_datasets_live_in_fastpipe_data_only():
    # (Checked on the files: an editable install of another checkout could still resolve it.)
    package = Path(fastpipe.__file__).parent
    assert not (package / "datasets.py").exists() and not (package / "datasets").exists()
    assert "sample_images" in fastpipe.data.__all__


def test_missing_optional_dependency_names_the_extra():
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastpipe\[hdf5\]'") as caught:
        require("fastpipe_no_such_module", extra="hdf5", package="h5py", feature="H5Dataset")
    assert "H5Dataset needs the optional package 'h5py'" in str(caught.value)
    assert isinstance(caught.value, ImportError)


@pytest.mark.slow
def test_cli_help_lists_every_subcommand():
    done = subprocess.run([sys.executable, "-m", "fastpipe", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "bench" in done.stdout


@pytest.mark.slow
def test_cli_rejects_an_unknown_subcommand():
    done = subprocess.run([sys.executable, "-m", "fastpipe", "no-such-command"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "invalid choice" in done.stderr


def test_sample_images_are_the_same_bytes_every_time(tmp_path):
    first = fastpipe.data.sample_images(tmp_path / "a", num_images=4, num_classes=2)
    second = fastpipe.data.sample_images(tmp_path / "b", num_images=4, num_classes=2)
    files = sorted(p.relative_to(first) for p in first.rglob("*.jpg"))
    assert [str(f) for f in files] == [
        "class_00/img_00000.jpg", "class_00/img_00002.jpg",
        "class_01/img_00001.jpg", "class_01/img_00003.jpg",
    ]
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)
    assert fastpipe.data.sample_images(first, num_images=4, num_classes=2) == first  # cached
    with pytest.raises(ValueError, match="made with other arguments"):
        fastpipe.data.sample_images(first, num_images=5, num_classes=2)
    with pytest.raises(TypeError, match="num_images must be a positive int, got the bool"):
        fastpipe.data.sample_images(tmp_path / "c", num_images=True)
