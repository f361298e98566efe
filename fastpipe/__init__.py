"""fastpipe: keep the GPU fed.

The public API is small: :func:`image_loader` (normalized training batches on your device, by the
fastest path this machine has), :class:`Recipe` (what happens to each image, on every backend),
:class:`DataLoaderX`, :class:`DataPrefetcher`, :func:`profile`,
the ImageNet statistics :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`, and the subpackages
``fastpipe.data`` (datasets, samplers, collation, the sample set), ``fastpipe.pack`` (packing a
folder into HDF5 or LMDB), ``fastpipe.ops`` (batch ops) and ``fastpipe.dali`` (needs the ``dali``
extra). Everything loads on first use (``fastpipe.DataLoaderX`` and ``fastpipe.data.ImageFolder``
work after ``import fastpipe``): importing fastpipe imports neither torch nor any optional
dependency, so the ``fastpipe`` command holds Ctrl-C during torch's import (numpy's compiled
start-up clears an interrupt raised inside it, and the command ran on). Names follow
docs/vocabulary.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastpipe._constants import IMAGENET_MEAN, IMAGENET_STD
from fastpipe._version import __version__

if TYPE_CHECKING:
    from fastpipe import dali as dali
    from fastpipe import data as data
    from fastpipe import ops as ops
    from fastpipe import pack as pack
    from fastpipe._hardware import DeviceUnavailableError
    from fastpipe.factory import image_loader
    from fastpipe.loader import DataLoaderX
    from fastpipe.prefetch import DataPrefetcher
    from fastpipe.profiling import profile
    from fastpipe.recipe import Recipe

__all__ = [
    "DataLoaderX",
    "DataPrefetcher",
    "DeviceUnavailableError",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Recipe",
    "__version__",
    "image_loader",
    "profile",
]

# Loaded on first attribute access (PEP 562): torch and the optional dependencies (h5py, lmdb,
# DALI) stay unimported until the part that needs them is used.
_SUBPACKAGES = ("bench", "dali", "data", "ops", "pack", "profiling")
_LAZY = {"DataLoaderX": "fastpipe.loader", "DataPrefetcher": "fastpipe.prefetch",
         "DeviceUnavailableError": "fastpipe._hardware",
         "Recipe": "fastpipe.recipe", "image_loader": "fastpipe.factory",
         "profile": "fastpipe.profiling"}


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"fastpipe.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBPACKAGES) | set(_LAZY))
