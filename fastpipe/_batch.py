"""Batches as nested structures: moving their tensors, and finding and replacing entries in them.

A batch is a tensor, or any nesting of dicts (and other mappings), lists, tuples, namedtuples and
dataclasses around tensors; each container is rebuilt with its own type (a dataclass through
``dataclasses.replace``, its ``init=False`` fields set after, as Lightning's
``apply_to_collection`` does; frozen ones too), and a container holding no tensor is kept as the
same object, as is every non-tensor leaf (strings, numbers, a ``meta`` dict of strings). Types
registered with torch's pytree are walked by it. A container the walker cannot see through (a
set, an object keeping tensors in its attributes) is refused with its type and the fix, never
left on the host.

An entry is named by its path, the steps from the batch down to it: a dict key or a sequence
index is a step as it is, an attribute (of a dataclass, a namedtuple, any object) is an
:class:`Attr`. ``()`` is the batch itself, ``("image",)`` a dict's entry, ``(0,)`` a tuple's first
item, ``(Attr("image"),)`` a dataclass's field.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fastpipe._compat import tree_leaves, tree_map_only

__all__ = [
    "Attr", "entries", "get_at", "image_paths", "is_image_sequence", "keys_of", "map_tensors",
    "place", "replace_at", "suggest_image_key", "target_paths", "tensors",
]

Path = tuple[Any, ...]

IMAGE_KEYS = ("image", "images", "input", "inputs")
TARGET_KEYS = ("target", "targets", "label", "labels")

_PLAIN_LEAVES = (str, bytes, int, float, complex, bool, type(None))
_IMAGE_DTYPES = (torch.uint8, torch.float32, torch.float16, torch.bfloat16, torch.float64)
_FIX = (
    "make it a dict, a list or tuple, a namedtuple or a dataclass of tensors (in the dataset's "
    "collate_fn), or move it to the device yourself in the training step"
)


class Attr(str):
    """A path step that is an attribute (a dataclass or namedtuple field), not an item."""

    __slots__ = ()


# --- walking a batch ---


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """``batch`` with ``fn`` applied to every tensor in it, each container rebuilt with its own
    type around the tensors that changed. A tensor that appears at several places is passed to
    ``fn`` once, and its one result put at each (one copy, and the aliasing kept)."""
    done: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def once(tensor: torch.Tensor) -> torch.Tensor:
        # The source is kept in the entry so its id cannot be reused during the walk.
        entry = done.get(id(tensor))
        if entry is None:
            entry = done[id(tensor)] = (tensor, fn(tensor))
        return entry[1]

    return _map(once, batch, ())


def tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor in ``batch``, in order (the order :func:`map_tensors` visits them)."""
    found: list[torch.Tensor] = []

    def collect(tensor: torch.Tensor) -> torch.Tensor:
        found.append(tensor)
        return tensor

    _map(collect, batch, ())
    return found


def _is_namedtuple(node: Any) -> bool:
    return isinstance(node, tuple) and hasattr(type(node), "_fields")


def _is_dataclass(node: Any) -> bool:
    return dataclasses.is_dataclass(node) and not isinstance(node, type)


def _map(fn: Callable[[torch.Tensor], torch.Tensor], node: Any, path: Path) -> Any:
    if isinstance(node, torch.Tensor):
        return fn(node)
    if isinstance(node, _PLAIN_LEAVES):
        return node
    if _is_dataclass(node):
        changed = {}
        for field in dataclasses.fields(node):
            if not hasattr(node, field.name):  # an init=False field never set
                continue
            value = getattr(node, field.name)
            new = _map(fn, value, (*path, Attr(field.name)))
            if new is not value:
                changed[field.name] = new
        return _dataclass_with(node, changed, path) if changed else node
    if isinstance(node, Mapping):
        changed = {}
        for key, value in node.items():
            new = _map(fn, value, (*path, key))
            if new is not value:
                changed[key] = new
        return _mapping_with(node, changed, path) if changed else node
    if isinstance(node, (tuple, list, collections.deque)):
        items = [_map(fn, value, (*path, index)) for index, value in enumerate(node)]
        if all(new is old for new, old in zip(items, node)):
            return node
        return _sequence_like(node, items, path)
    if isinstance(node, (set, frozenset)):
        if any(_holds_tensor(item) for item in node):
            raise _unsupported(node, path, "a set has no order or position to put a moved tensor "
                                           "back in")
        return node
    leaves = tree_leaves(node)
    if len(leaves) != 1 or leaves[0] is not node:  # a type registered with torch's pytree
        return tree_map_only(torch.Tensor, fn, node)
    if _holds_tensor(node):
        raise _unsupported(node, path, "it keeps tensors in its attributes, which fastpipe does "
                                       "not copy objects to reach")
    return node


def _holds_tensor(node: Any, depth: int = 0) -> bool:
    """Whether a tensor is reachable from ``node`` through containers and object attributes (a
    few levels down: enough to catch a batch object, cheap on a leaf)."""
    if isinstance(node, torch.Tensor):
        return True
    if depth > 4 or isinstance(node, _PLAIN_LEAVES):
        return False
    if isinstance(node, Mapping):
        children: Any = node.values()
    elif isinstance(node, (tuple, list, set, frozenset, collections.deque)):
        children = node
    else:
        attributes = getattr(node, "__dict__", None)
        children = list(attributes.values()) if isinstance(attributes, dict) else []
        slots = getattr(type(node), "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if isinstance(name, str) and not name.startswith("__") and hasattr(node, name):
                children.append(getattr(node, name))
    return any(_holds_tensor(child, depth + 1) for child in children)


def _unsupported(node: Any, path: Path, why: str) -> TypeError:
    return TypeError(
        f"DataPrefetcher cannot move the tensors in {place(path)}, a {type(node).__name__}: "
        f"{why}, so they would stay on the host. Fix: {_FIX}"
    )


def _dataclass_with(node: Any, values: dict[str, Any], path: Path) -> Any:
    """A copy of the dataclass ``node`` with ``values`` for some fields: ``dataclasses.replace``
    for the init fields (so ``__post_init__`` runs as on any instance), every ``init=False``
    field then set from ``values`` or ``node`` (frozen instances too)."""
    fields = dataclasses.fields(node)
    init = {field.name: values[field.name] for field in fields
            if field.init and field.name in values}
    try:
        new = dataclasses.replace(node, **init)
    except (TypeError, ValueError):  # an InitVar without default: replace() cannot rebuild it
        try:
            new = copy.copy(node)
        except Exception as error:
            raise _unsupported(node, path, "it cannot be copied") from error
        for name, value in init.items():
            object.__setattr__(new, name, value)
    for field in fields:
        if not field.init and hasattr(node, field.name):
            object.__setattr__(new, field.name, values.get(field.name, getattr(node, field.name)))
    return new


def _mapping_with(node: Mapping, values: dict[Any, Any], path: Path) -> Any:
    """A copy of ``node`` with ``values`` for some keys, of its own type (a dict subclass, an
    OrderedDict, a defaultdict with its factory, a UserDict)."""
    if type(node) is dict:
        return {**node, **values}
    try:
        new = copy.copy(node)
        for key, value in values.items():
            new[key] = value
    except Exception as error:
        raise _unsupported(node, path, "it cannot be copied with its entries replaced") from error
    return new


def _sequence_like(node: Any, items: list[Any], path: Path) -> Any:
    if _is_namedtuple(node):
        return type(node)(*items)
    if type(node) in (tuple, list):
        return type(node)(items)
    if isinstance(node, collections.deque):
        return type(node)(items, maxlen=node.maxlen)
    try:
        return type(node)(items)
    except Exception as error:
        raise _unsupported(node, path, "it cannot be rebuilt from its items") from error


# --- entries by path ---


def keys_of(batch: Any) -> list[Any]:
    """The top-level keys a user can name in ``batch``: a mapping's keys, a sequence's indices,
    a dataclass's or namedtuple's field names."""
    if _is_dataclass(batch):
        return [field.name for field in dataclasses.fields(batch) if hasattr(batch, field.name)]
    if isinstance(batch, Mapping):
        return list(batch)
    if _is_namedtuple(batch):
        return list(type(batch)._fields)
    if isinstance(batch, (tuple, list)):
        return list(range(len(batch)))
    return []


def entries(batch: Any) -> list[tuple[Any, Any]]:
    """(key as a user names it, value) for each top-level entry of ``batch``."""
    return [(key, get_at(batch, (_step(batch, key),))) for key in keys_of(batch)]


def _step(batch: Any, key: Any) -> Any | None:
    """The path step that ``key`` names in ``batch``, or None where it names nothing."""
    if _is_dataclass(batch):
        names = {field.name for field in dataclasses.fields(batch)}
        return Attr(key) if isinstance(key, str) and key in names and hasattr(batch, key) else None
    if isinstance(batch, Mapping):
        try:
            return key if key in batch else None
        except TypeError:  # an unhashable key
            return None
    if isinstance(batch, (tuple, list)):
        if _is_namedtuple(batch) and isinstance(key, str):
            return Attr(key) if key in type(batch)._fields else None
        if isinstance(key, int) and not isinstance(key, bool) and -len(batch) <= key < len(batch):
            return key % len(batch)
        return None
    if isinstance(key, str) and hasattr(batch, key):
        return Attr(key)
    return None


def get_at(batch: Any, path: Path) -> Any:
    """The entry of ``batch`` at ``path``."""
    for step in path:
        batch = getattr(batch, step) if isinstance(step, Attr) else batch[step]
    return batch


def replace_at(batch: Any, path: Path, value: Any) -> Any:
    """A copy of ``batch`` with ``value`` at ``path``, of the same types down to it (``batch``
    itself is left as it is)."""
    if not path:
        return value
    step, rest = path[0], path[1:]
    new = replace_at(get_at(batch, (step,)), rest, value)
    if _is_dataclass(batch):
        return _dataclass_with(batch, {str(step): new}, ())
    if isinstance(step, Attr):
        if _is_namedtuple(batch):
            return batch._replace(**{str(step): new})
        try:
            copied = copy.copy(batch)
            setattr(copied, step, new)
        except Exception as error:
            raise _unsupported(batch, (), "its attribute cannot be replaced on a copy") from error
        return copied
    if isinstance(batch, Mapping):
        return _mapping_with(batch, {step: new}, ())
    items = list(batch)
    items[step] = new
    return _sequence_like(batch, items, ())


def place(path: Path) -> str:
    """``path`` as it reads in code: ``batch['image']``, ``batch[0]``, ``batch.image``."""
    return "batch" + "".join(
        f".{step}" if isinstance(step, Attr) else f"[{step!r}]" for step in path
    )


# --- where the images and targets are ---


def is_image_sequence(value: Any) -> bool:
    """A tuple or list of tensors only (variable-size images, torchvision's detection batch)."""
    return (isinstance(value, (tuple, list)) and not _is_namedtuple(value) and len(value) > 0
            and all(isinstance(item, torch.Tensor) for item in value))


def _looks_like_images(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 4 and value.dtype in _IMAGE_DTYPES
    return is_image_sequence(value) and all(
        item.dim() in (3, 4) and item.dtype in _IMAGE_DTYPES for item in value
    )


def suggest_image_key(batch: Any, exclude: Sequence[Path] = ()) -> str:
    """The ``image_key=...`` that names the images of ``batch`` (an entry holding a 4-D uint8 or
    float tensor, or a tuple or list of 3-D or 4-D ones), said as a fix; or why there is none."""
    found = [key for key, value in entries(batch)
             if _looks_like_images(value) and (_step(batch, key),) not in exclude]
    if len(found) == 1:
        return f"pass image_key={found[0]!r}"
    if found:
        names = ", ".join(f"image_key={key!r}" for key in found)
        return (f"pass {names} (or several at once: image_key={tuple(found)!r}) "
                "for the entry that holds the images")
    return (f"no entry of this {type(batch).__name__} batch holds images (a 4-D (N, C, H, W) "
            "uint8 or float tensor, or a tuple or list of (C, H, W) images), so name the entry "
            "with image_key=..., or leave mean, std and dtype unset")


def _key_list(key: Any) -> list[Any]:
    return list(key) if isinstance(key, (tuple, list)) else [key]


def _named_paths(batch: Any, key: Any, what: str, option: str,
                 suggestion: Callable[[], str]) -> list[Path]:
    paths = []
    for one in _key_list(key):
        step = _step(batch, one)
        if step is None:
            names = ", ".join(repr(k) for k in keys_of(batch)) or "none"
            raise ValueError(
                f"{option}={one!r} names no entry of this {type(batch).__name__} batch (its "
                f"keys, indices or fields: {names}); {suggestion()}"
            )
        paths.append((step,))
    return paths


def image_paths(batch: Any, image_key: Any) -> list[Path]:
    """Where the images are. ``image_key`` (a dict key, a sequence index, an attribute name, or a
    tuple or list of them for several image entries) names them; by default: the batch itself
    when it is a tensor; the first of ``"image"``, ``"images"``, ``"input"``, ``"inputs"`` in a
    mapping, dataclass or namedtuple; else the first tensor entry of a tuple, list, dataclass or
    namedtuple; else its first tuple or list of tensors (variable-size images)."""
    if isinstance(batch, torch.Tensor):
        return [()]
    if image_key is not None:
        return _named_paths(batch, image_key, "images", "image_key",
                            lambda: suggest_image_key(batch))
    if isinstance(batch, Mapping) and not _is_dataclass(batch):
        key = next((k for k in IMAGE_KEYS if k in batch), None)
        if key is None:
            raise ValueError(
                "normalization needs to know which entry of the dict batch holds the images; "
                f"the batch has keys {sorted(map(str, batch))}. Pass image_key=... "
                f"({suggest_image_key(batch)})"
            )
        return [(key,)]
    named = _is_dataclass(batch) or _is_namedtuple(batch)
    if named:
        key = next((k for k in IMAGE_KEYS if _step(batch, k) is not None), None)
        if key is not None:
            return [(_step(batch, key),)]
    pairs = entries(batch)
    for test in (lambda v: isinstance(v, torch.Tensor), is_image_sequence):
        for key, value in pairs:
            if test(value):
                return [(_step(batch, key),)]
    raise TypeError(
        f"normalization found no image tensor in a batch of type {type(batch).__name__}; "
        f"{suggest_image_key(batch)}"
    )


def target_paths(batch: Any, images: Sequence[Path], target_key: Any = None) -> list[Path]:
    """Where the targets are, the images being at ``images``: those ``target_key`` names (in the
    same forms as ``image_key``); by default the first of the ``"target"``, ``"targets"``,
    ``"label"``, ``"labels"`` entries of a mapping, dataclass or namedtuple, else the first other
    tensor of a tuple, list, dataclass or namedtuple, else its first other entry that holds
    tensors (the target dicts of a detection batch)."""
    if target_key is not None and not isinstance(batch, torch.Tensor):
        def suggestion() -> str:
            names = [k for k, v in entries(batch) if _holds_tensor(v)
                     and (_step(batch, k),) not in images]
            return (f"entries with tensors besides the images: {names}" if names
                    else "the batch has no other entry with tensors")
        return _named_paths(batch, target_key, "targets", "target_key", suggestion)
    if isinstance(batch, Mapping) or _is_dataclass(batch) or _is_namedtuple(batch):
        key = next((k for k in TARGET_KEYS if _step(batch, k) is not None), None)
        if key is not None:
            return [(_step(batch, key),)]
    if not isinstance(batch, Mapping) or _is_dataclass(batch):
        others = [(key, value) for key, value in entries(batch)
                  if (_step(batch, key),) not in images]
        for test in (lambda v: isinstance(v, torch.Tensor), _holds_tensor):
            for key, value in others:
                if test(value):
                    return [(_step(batch, key),)]
    raise TypeError(
        "batch_transform needs (images, targets) batches: a tuple or list with a target "
        "tensor after the images, a dict, dataclass or namedtuple with a 'target', 'targets', "
        f"'label' or 'labels' entry, or target_key=... naming it; got a batch of type "
        f"{type(batch).__name__}"
    )
