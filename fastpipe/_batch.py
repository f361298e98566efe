"""Batches as nested structures: moving their tensors, and finding and replacing entries in them.

A batch is a tensor, tuple, list, dict, namedtuple or any nesting of them; non-tensor leaves
(strings, a ``meta`` dict of strings) pass through unchanged. An entry is named by its path, the
keys and indices from the batch down to it: ``()`` is the batch itself, ``("image",)`` a dict's
entry, ``(0,)`` a tuple's first item.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastpipe._compat import tree_leaves, tree_map_only

__all__ = ["get_at", "image_path", "map_tensors", "place", "replace_at", "target_path", "tensors"]

Path = tuple[Any, ...]

IMAGE_KEYS = ("image", "images", "input", "inputs")
TARGET_KEYS = ("target", "targets", "label", "labels")


def tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor in ``batch``, in order."""
    return [leaf for leaf in tree_leaves(batch) if isinstance(leaf, torch.Tensor)]


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """``batch`` with ``fn`` applied to every tensor in it, the structure rebuilt around them."""
    return tree_map_only(torch.Tensor, fn, batch)


def get_at(batch: Any, path: Path) -> Any:
    """The entry of ``batch`` at ``path``."""
    for key in path:
        batch = batch[key]
    return batch


def replace_at(batch: Any, path: Path, value: Any) -> Any:
    """A copy of ``batch`` with ``value`` at ``path``, of the same types down to it (``batch``
    itself is left as it is)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(batch, dict):
        new = dict(batch)
        new[key] = replace_at(batch[key], rest, value)
        return type(batch)(new) if type(batch) is not dict else new
    items = list(batch)
    items[key] = replace_at(batch[key], rest, value)
    if hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*items)
    return type(batch)(items)


def place(path: Path) -> str:
    """``path`` as it reads in code: ``batch['image']``, ``batch[0]``."""
    return "batch" + "".join(f"[{key!r}]" for key in path)


def image_path(batch: Any, image_key: str | int | None) -> Path:
    """Where the images are: the batch itself when it is a tensor; the ``image_key`` entry of a
    dict (by default the first of ``"image"``, ``"images"``, ``"input"``, ``"inputs"`` present);
    the ``image_key`` item of a tuple or list (by default its first tensor)."""
    if isinstance(batch, torch.Tensor):
        return ()
    if isinstance(batch, dict):
        key = image_key
        if key is None:
            key = next((k for k in IMAGE_KEYS if k in batch), None)
        if key is None or key not in batch:
            raise ValueError(
                f"normalization needs to know which entry of the dict batch holds the images; "
                f"the batch has keys {sorted(map(str, batch))}. Pass image_key=..."
            )
        return (key,)
    if isinstance(batch, (tuple, list)):
        if image_key is not None:
            return (image_key,)
        for index, item in enumerate(batch):
            if isinstance(item, torch.Tensor):
                return (index,)
    raise TypeError(
        f"normalization found no image tensor in a batch of type {type(batch).__name__}; "
        "pass image_key=..., or leave mean, std and dtype unset"
    )


def target_path(batch: Any, images: Path) -> Path:
    """Where the targets are, the images being at ``images``: the first other tensor of a tuple
    or list, or the first of the ``"target"``, ``"targets"``, ``"label"``, ``"labels"`` entries
    of a dict."""
    if isinstance(batch, dict):
        key = next((k for k in TARGET_KEYS if k in batch), None)
        if key is not None:
            return (key,)
    elif isinstance(batch, (tuple, list)):
        for index, item in enumerate(batch):
            if (index,) != images and isinstance(item, torch.Tensor):
                return (index,)
    raise TypeError(
        "batch_transform needs (images, targets) batches: a tuple or list with a target "
        "tensor after the images, or a dict with a 'target', 'targets', 'label' or 'labels' "
        f"entry; got a batch of type {type(batch).__name__}"
    )
