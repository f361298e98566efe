"""Every public signature held to the vocabulary table (docs/vocabulary.md).

For every name in ``__all__`` of fastpipe, fastpipe.data, fastpipe.ops, fastpipe.dali and
fastpipe.pack (the factory ``image_loader`` is in fastpipe's): no parameter, and no public attribute
or method of a public class, may use another spelling of a concept the table names (``max_prefetch``
for ``prefetch_depth``, ``flip`` for ``hflip``, ...), and every table name that appears has the
table's default where the table fixes one.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import fastpipe
from tests.helpers.dali import dali_installed

# Other spellings of a table concept -> the table's name.
ALIASES = {
    "max_prefetch": "prefetch_depth", "depth": "prefetch_depth",
    "prefetch_queue_depth": "prefetch_depth", "read_ahead": "prefetch_depth",
    "queue_depth": "prefetch_depth",
    "flip": "hflip", "flip_prob": "hflip", "hflip_prob": "hflip", "mirror": "hflip",
    "layout": "channels_last", "memory_format": "channels_last", "nhwc": "channels_last",
    "shard_id": "rank", "num_shards": "world_size", "num_replicas": "world_size",
    "shard": "rank and world_size",
    "num_threads": "num_workers", "workers": "num_workers", "threads": "num_workers",
    "n_workers": "num_workers",
    "labels": "targets",
    "cutout": "cutout_holes", "cutout_prob": "cutout_holes",
    "interp": "interpolation", "interp_type": "interpolation", "resize_mode": "interpolation",
    "aa": "auto_augment", "autoaugment": "auto_augment", "auto_aug": "auto_augment",
    "img_size": "size", "image_size": "size", "input_size": "size", "output_size": "size",
    "resolution": "size",
    "random_seed": "seed", "rng_seed": "seed", "rng": "seed",
    "device_id": "device",
    "crop_ratio": "crop_pct", "crop_fraction": "crop_pct",
    "shuffle_block_size": "window", "shuffle_window": "window", "block_size": "window",
}
# Members (attributes, methods) of public classes: the same, plus ``source(i)`` for ``path(i)``.
MEMBER_ALIASES = {**ALIASES, "source": "path"}

# Defaults the table fixes; per-callable entries where the table gives one per part.
DEFAULTS = {
    "device": None, "drop_last": False, "seed": None, "generator": None, "rank": None,
    "world_size": None, "size": 224, "scale": (0.08, 1.0), "ratio": (3 / 4, 4 / 3),
    "crop_pct": 0.875, "hflip": 0.5, "interpolation": "bilinear", "auto_augment": None,
    "transform": None, "batch_transform": None, "mean": None, "std": None,
    "channels_last": False, "num_holes": 1, "cutout_holes": 0, "cutout_size": 16,
    "train": True, "backend": "auto",
}
PER_CALLABLE_DEFAULTS = {
    ("DataLoaderX", "prefetch_depth"): 2,
    ("DataLoaderX", "worker_method"): "process",
    ("image_loader", "worker_method"): None,
    ("image_loader", "train"): None,  # required, unless recipe= says it
    ("DataPrefetcher", "prefetch_depth"): 1,
    ("DALILoader", "prefetch_depth"): 2,
    ("image_loader", "prefetch_depth"): 2,
    ("DALILoader", "num_workers"): 2,
    ("image_loader", "num_workers"): None,
    ("image_loader", "mean"): fastpipe.IMAGENET_MEAN,
    ("image_loader", "std"): fastpipe.IMAGENET_STD,
    ("cutout", "size"): 16,  # the op's hole side, in pixels
}
# Same name, another concept, kept on purpose (explained in docs/vocabulary.md).
EXEMPT = {
    ("random_erasing", "scale"): "torchvision RandomErasing's erased-area range",
    ("random_erasing", "ratio"): "torchvision RandomErasing's aspect range",
    ("sample_images", "seed"): "makes a fixed data set: the same bytes every time",
    ("verify", "seed"): "which samples a check reads: reproducible by default",
    ("extension_available", "device"): "a question about one device type, not a destination",
    ("H5Dataset", "layout"): "the stored array layout of a pack file, not a memory format",
    ("LMDBDataset", "layout"): "the stored array layout of a pack file, not a memory format",
    ("TarDataset", "layout"): "the pack datasets' stored layout (None: tar shards hold records)",
    ("ParquetDataset", "layout"): "the record dataset's stored layout (None: rows are records)",
    ("ImageFolder", "layout"): "the record dataset's stored layout ('encoded': image files)",
    ("PairedFolders", "layout"): "the record dataset's stored layout (None: records)",
    ("EncodedSource", "rank"): "a building block: the share is explicit (DALILoader resolves it)",
    ("EncodedSource", "world_size"): "a building block: the share is explicit",
    ("EncodedSource", "seed"): "the order seed all ranks share: explicit, default 0",
    ("shard_order", "rank"): "a pure function of its arguments: the share is explicit",
    ("shard_order", "world_size"): "a pure function of its arguments: the share is explicit",
    ("shard_order", "seed"): "a pure function of its arguments: the order seed is explicit",
    ("image_pipeline", "rank"): "a DALI pipeline for driving DALI yourself: the share is explicit",
    ("image_pipeline", "world_size"): "a DALI pipeline for driving DALI yourself: the share is "
                                      "explicit",
    ("pack", "size"): "the stored arrays' size (None keeps each image's own), not an output size",
    ("PackOptions", "size"): "the stored arrays' size (None keeps each image's own)",
}

MODULES = ["fastpipe", "fastpipe.data", "fastpipe.ops", "fastpipe.dali", "fastpipe.pack"]
VOCABULARY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "vocabulary.md"


def _modules():
    for name in MODULES:
        if name == "fastpipe.dali" and not dali_installed():
            continue
        yield importlib.import_module(name)


def _public_objects():
    """(name, object, module name) of every callable in the public ``__all__`` lists."""
    seen = set()
    for module in _modules():
        for name in module.__all__:
            obj = getattr(module, name)
            if not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield name, obj, module.__name__


def _signature(obj):
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def _parameters():
    """(owner, parameter, inspect.Parameter, module) for every public signature, including the
    public methods of public classes (owner ``Class.method``)."""
    for name, obj, module in _public_objects():
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        callables = [(name, obj)]
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    callables.append((f"{name}.{attr}", member))
        for owner, target in callables:
            signature = _signature(target)
            if signature is None:
                continue
            for parameter in signature.parameters.values():
                if parameter.name in ("self", "cls") or parameter.kind in (
                        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                    continue
                yield owner, parameter, module


_ASSIGNED = re.compile(r"\bself\.([a-z][a-z0-9_]*)\s*(?::[^=\n]+)?=(?!=)")


def _members():
    """(class name, member name) of the public attributes and methods of public classes,
    including instance attributes assigned in their (or their fastpipe bases') source."""
    for name, obj, _ in _public_objects():
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        found = set()
        for klass in obj.__mro__:
            if not klass.__module__.startswith("fastpipe"):
                continue
            found |= {m for m in vars(klass) if not m.startswith("_")}
            try:
                found |= set(_ASSIGNED.findall(inspect.getsource(klass)))
            except (OSError, TypeError):
                pass
        for member in sorted(found):
            yield name, member


PARAMETERS = list(_parameters())


@pytest.mark.parametrize("owner, parameter, module", [
    pytest.param(owner, parameter, module, id=f"{owner}-{parameter.name}")
    for owner, parameter, module in PARAMETERS
])
def test_parameter_uses_the_vocabulary_name(owner, parameter, module):
    name = parameter.name
    assert name not in ALIASES, (
        f"{owner}({name}=...): the vocabulary name is {ALIASES[name]!r} (docs/vocabulary.md)"
    )
    if name == "generator":
        assert module == "fastpipe.ops", (
            f"{owner}(generator=...): loaders and datasets take seed=; only functional ops "
            "take a torch.Generator (docs/vocabulary.md)"
        )


@pytest.mark.parametrize("owner, parameter, module", [
    pytest.param(owner, parameter, module, id=f"{owner}-{parameter.name}")
    for owner, parameter, module in PARAMETERS
    if parameter.name in DEFAULTS or (owner, parameter.name) in PER_CALLABLE_DEFAULTS
])
def test_parameter_has_the_vocabulary_default(owner, parameter, module):
    key = (owner.split(".")[-1], parameter.name)
    if key in EXEMPT or parameter.default is inspect.Parameter.empty:
        return  # a required argument, or the same name for another concept
    expected = PER_CALLABLE_DEFAULTS.get(key, DEFAULTS.get(parameter.name))
    default = parameter.default
    if isinstance(default, list):
        default = tuple(default)
    assert default == expected, (
        f"{owner}({parameter.name}={parameter.default!r}): the vocabulary default is "
        f"{expected!r} (docs/vocabulary.md)"
    )


def _is_method(owner: str, member: str) -> bool:
    classes = {name: obj for name, obj, _ in _public_objects()}
    return callable(getattr(classes.get(owner), member, None))


def test_members_use_the_vocabulary_names():
    members = list(_members())
    assert len(members) > 50  # the scan reads the public classes' members
    # ``source`` is a dataset's source object (fastpipe.data.sources); ``source(i)`` for a
    # sample's file is the old spelling of ``path(i)``.
    offenders = [f"{owner}.{member}: the vocabulary name is {MEMBER_ALIASES[member]!r}"
                 for owner, member in members
                 if member in MEMBER_ALIASES and (owner, member) not in EXEMPT
                 and (member != "source" or _is_method(owner, member))]
    assert not offenders, f"{offenders} (docs/vocabulary.md)"


def test_every_checked_name_is_in_the_table():
    page = VOCABULARY_PAGE.read_text()
    names = set(DEFAULTS) | {name for _, name in PER_CALLABLE_DEFAULTS}
    names |= {target for target in ALIASES.values() if " " not in target}
    missing = sorted(n for n in names if f"`{n}`" not in page and f"`{n}(" not in page)
    assert not missing, f"names the test holds code to but the table does not list: {missing}"


def test_the_exceptions_are_explained_on_the_page():
    page = VOCABULARY_PAGE.read_text()
    for owner, name in EXEMPT:
        assert f"`{owner}`" in page and f"`{name}`" in page, (
            f"docs/vocabulary.md should explain {owner}({name}=...)")
