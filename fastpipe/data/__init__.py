"""Datasets, decoding and collation: everything before the batch reaches the device.

Names are imported on first use, so ``import fastpipe.data`` stays cheap and optional
dependencies (h5py, lmdb) load only with the class that needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ArrayField": "fastpipe.data.format.fields",
    "BytesField": "fastpipe.data.format.fields",
    "FloatField": "fastpipe.data.format.fields",
    "ImageField": "fastpipe.data.format.fields",
    "IntField": "fastpipe.data.format.fields",
    "StrField": "fastpipe.data.format.fields",
    "Array": "fastpipe.data.format.roles",
    "BoundingBoxes": "fastpipe.data.format.roles",
    "Bytes": "fastpipe.data.format.roles",
    "Image": "fastpipe.data.format.roles",
    "Label": "fastpipe.data.format.roles",
    "Mask": "fastpipe.data.format.roles",
    "Role": "fastpipe.data.format.roles",
    "Text": "fastpipe.data.format.roles",
    "register_role": "fastpipe.data.format.roles",
    "CorruptImageError": "fastpipe.data.decode.budget",
    "ImageTooLargeError": "fastpipe.data.decode.budget",
    "max_image_pixels": "fastpipe.data.decode.budget",
    "set_max_image_pixels": "fastpipe.data.decode.budget",
    "FieldError": "fastpipe.data.format.fields",
    "shard_order": "fastpipe.data.sampling.sampler",
    "ImageDecoder": "fastpipe.data.decode.image",
    "decode_rgb": "fastpipe.data.decode.image",
    "ImageFolder": "fastpipe.data.datasets.folders",
    "JointCrop": "fastpipe.data.joint.crop",
    "JointParams": "fastpipe.data.joint.crop",
    "JointContext": "fastpipe.data.joint.kernels",
    "KeptRows": "fastpipe.data.joint.kernels",
    "register_joint_kernel": "fastpipe.data.joint.kernels",
    "PairedFolders": "fastpipe.data.datasets.folders",
    "fast_collate": "fastpipe.data.collate.batch",
    "PackFormatError": "fastpipe.data.format.layout",
    "SampleIndex": "fastpipe.data.sampling.seeds",
    "sample_generator": "fastpipe.data.sampling.seeds",
    "H5Dataset": "fastpipe.data.datasets.readers",
    "LMDBDataset": "fastpipe.data.datasets.readers",
    "TarDataset": "fastpipe.data.datasets.readers",
    "write_shard_list": "fastpipe.data.sources.tar",
    "ParquetDataset": "fastpipe.data.datasets.readers",
    "RemoteError": "fastpipe.data.remote.retry",
    "RemoteOptions": "fastpipe.data.remote.options",
    "ShardCache": "fastpipe.data.remote.cache",
    "sample_images": "fastpipe.data.samples",
    "DistributedSampler": "fastpipe.data.sampling.sampler",
    "RandomSampler": "fastpipe.data.sampling.sampler",
    "SequentialSampler": "fastpipe.data.sampling.sampler",
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
