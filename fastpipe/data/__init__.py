"""Datasets, decoding and collation: everything before the batch reaches the device.

Names are imported on first use, so ``import fastpipe.data`` stays cheap and optional
dependencies (h5py, lmdb) load only with the class that needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ArrayField": "fastpipe.data.fields",
    "BytesField": "fastpipe.data.fields",
    "FloatField": "fastpipe.data.fields",
    "ImageField": "fastpipe.data.fields",
    "IntField": "fastpipe.data.fields",
    "StrField": "fastpipe.data.fields",
    "Array": "fastpipe.data.roles",
    "BoundingBoxes": "fastpipe.data.roles",
    "Bytes": "fastpipe.data.roles",
    "Image": "fastpipe.data.roles",
    "Label": "fastpipe.data.roles",
    "Mask": "fastpipe.data.roles",
    "Role": "fastpipe.data.roles",
    "Text": "fastpipe.data.roles",
    "register_role": "fastpipe.data.roles",
    "CorruptImageError": "fastpipe.data._decode",
    "ImageTooLargeError": "fastpipe.data._decode",
    "max_image_pixels": "fastpipe.data._decode",
    "set_max_image_pixels": "fastpipe.data._decode",
    "FieldError": "fastpipe.data.fields",
    "shard_order": "fastpipe.data.sampler",
    "ImageDecoder": "fastpipe.data._decode",
    "decode_rgb": "fastpipe.data._decode",
    "ImageFolder": "fastpipe.data.datasets.folders",
    "JointCrop": "fastpipe.data.joint",
    "JointParams": "fastpipe.data.joint",
    "JointContext": "fastpipe.data._joint_kernels",
    "KeptRows": "fastpipe.data._joint_kernels",
    "register_joint_kernel": "fastpipe.data._joint_kernels",
    "PairedFolders": "fastpipe.data.datasets.folders",
    "fast_collate": "fastpipe.data.collate",
    "PackFormatError": "fastpipe.data._format",
    "SampleIndex": "fastpipe.data._random",
    "sample_generator": "fastpipe.data._random",
    "H5Dataset": "fastpipe.data.datasets.readers",
    "LMDBDataset": "fastpipe.data.datasets.readers",
    "TarDataset": "fastpipe.data.datasets.readers",
    "sample_images": "fastpipe.data.samples",
    "DistributedSampler": "fastpipe.data.sampler",
    "RandomSampler": "fastpipe.data.sampler",
    "SequentialSampler": "fastpipe.data.sampler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastpipe.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
