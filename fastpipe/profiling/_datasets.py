"""What ``fastpipe profile/tune/bench`` measure: a dataset named on the command line (an image
folder, a pack, ``module:function``), how to collate it, and how to write it as code."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpipe._constants import DEFAULT_SIZE

H5_SUFFIXES = (".h5", ".hdf5")


@dataclass
class DatasetSource:
    """A dataset to tune, how to collate it, and how to write it in the recommended code."""

    dataset: Any
    collate_fn: Callable[[list[Any]], Any] | None
    description: str
    code: str
    imports: list[str] = field(default_factory=list)
    collate_code: str | None = None


def _import_factory(spec: str) -> Any:
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ValueError(f"{spec!r} is not module:function")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise FileNotFoundError(f"{path} does not exist")
            # As `python file.py` would: the script's folder comes first on the path, so the
            # files beside it import.
            folder = str(path.resolve().parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            name = f"_fastpipe_factory_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            # Registered so that worker processes started with spawn can unpickle its classes.
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            # Like `python -m`: modules next to where the command runs are importable.
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except (ImportError, FileNotFoundError) as exc:
        raise ValueError(f"cannot import {module_name!r} for the dataset factory {spec!r}: "
                         f"{exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r} (from "
                         f"{spec!r})") from None


def resolve_dataset(spec: str | os.PathLike, size: int = DEFAULT_SIZE,
                    train: bool = True) -> DatasetSource:
    """Turns what the user named into a dataset.

    ``spec`` is one of:

    * an ImageFolder directory (``root/<class>/<image>``): read with the fast CPU path
      (``fastpipe.data.ImageFolder`` + ``fast_collate``), or torchvision's ImageFolder with
      uint8 output where that is not available;
    * a pack file (``.h5``/``.hdf5``, from ``fastpipe pack``): ``fastpipe.data.H5Dataset``;
    * ``module:function`` or ``path/to/file.py:function``: a function that takes no arguments
      and returns a map-style dataset (with ``__len__`` and ``__getitem__``).

    Raises ValueError (or FileNotFoundError for a missing path) with what to pass instead.
    """
    source = _resolve(os.fspath(spec), size, train)
    if len(source.dataset) == 0:
        raise ValueError(f"{os.fspath(spec)} is empty: the dataset has no samples")
    return source


def _resolve(text: str, size: int, train: bool) -> DatasetSource:
    path = Path(text)
    if not path.exists() and ":" in text and not text.endswith(":"):
        factory = _import_factory(text)
        dataset = factory() if callable(factory) and not is_map_dataset(factory) else factory
        if not is_map_dataset(dataset):
            raise ValueError(
                f"{text} returned {type(dataset).__name__}, not a map-style dataset; it must "
                "return an object with __len__ and __getitem__ (a torch.utils.data.Dataset)"
            )
        return DatasetSource(
            dataset, None, f"{type(dataset).__name__} from {text} ({len(dataset)} samples)",
            code="dataset", imports=[], collate_code=None,
        )
    if not path.exists():
        raise FileNotFoundError(
            f"{text} does not exist; pass an ImageFolder directory, a .h5 pack file, or "
            "module:function returning a dataset"
        )
    if path.is_dir():
        return _folder_source(path, size, train)
    if path.suffix.lower() in H5_SUFFIXES:
        return _pack_source(path, size, train)
    raise ValueError(
        f"{text} is a file but not a pack (.h5/.hdf5); pass an ImageFolder directory, a .h5 pack "
        "file, or module:function returning a dataset"
    )


def is_map_dataset(value: Any) -> bool:
    if isinstance(value, type):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__getitem__")


def _folder_source(root: Path, size: int, train: bool) -> DatasetSource:
    try:
        from fastpipe.data import ImageFolder, fast_collate
    except ImportError as missing:
        fast_path_missing = missing
    else:
        dataset = ImageFolder(str(root), train=train, size=size)
        return DatasetSource(
            dataset, fast_collate, f"fastpipe.data.ImageFolder({root}), {len(dataset)} images",
            code=f"ImageFolder({str(root)!r}, train={train}, size={size})",
            imports=["from fastpipe.data import ImageFolder, fast_collate"],
            collate_code="fast_collate",
        )
    try:
        from torchvision import datasets, transforms
    except ImportError as exc:
        raise ValueError(
            f"reading the folder {root} needs fastpipe's fast CPU path ({fast_path_missing}) or "
            f"torchvision ({exc}); install torchvision"
        ) from exc
    if train:
        ops = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
        ops_code = f"transforms.RandomResizedCrop({size}), transforms.RandomHorizontalFlip()"
    else:
        ops = [transforms.Resize(size * 8 // 7), transforms.CenterCrop(size)]
        ops_code = f"transforms.Resize({size * 8 // 7}), transforms.CenterCrop({size})"
    transform = transforms.Compose([*ops, transforms.PILToTensor()])
    dataset = datasets.ImageFolder(str(root), transform=transform)
    return DatasetSource(
        dataset, None, f"torchvision ImageFolder({root}) with uint8 output, {len(dataset)} images",
        code=(f"datasets.ImageFolder({str(root)!r}, transform=transforms.Compose(["
              f"{ops_code}, transforms.PILToTensor()]))"),
        imports=["from torchvision import datasets, transforms"],
    )


def _pack_source(path: Path, size: int, train: bool) -> DatasetSource:
    from fastpipe.data import H5Dataset, ImageDecoder, fast_collate

    dataset = H5Dataset(str(path), decoder=ImageDecoder(train=train, size=size))
    return DatasetSource(
        dataset, fast_collate, f"fastpipe.data.H5Dataset({path}), {len(dataset)} samples",
        code=f"H5Dataset({str(path)!r}, decoder=ImageDecoder(train={train}, size={size}))",
        imports=["from fastpipe.data import H5Dataset, ImageDecoder, fast_collate"],
        collate_code="fast_collate",
    )
