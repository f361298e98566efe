"""Where the encoded images are in a batch, and the batch without the rows a decode left out."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from fastpipe._batch import Attr, replace_at
from fastpipe.data.collate.encoded import EncodedBatch

__all__ = ["encoded_paths", "without_rows"]

Path = tuple[Any, ...]


def _children(node: Any) -> list[tuple[Any, Any]]:
    """(path step, value) of a container's entries: a dict's keys, a dataclass's or namedtuple's
    fields, a list's or tuple's indices; none for anything else."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return [(Attr(f.name), getattr(node, f.name)) for f in dataclasses.fields(node)
                if hasattr(node, f.name)]
    if isinstance(node, Mapping):
        return list(node.items())
    if isinstance(node, tuple) and hasattr(type(node), "_fields"):
        return [(Attr(name), getattr(node, name)) for name in type(node)._fields]
    if isinstance(node, (tuple, list)):
        return list(enumerate(node))
    return []


def encoded_paths(batch: Any, path: Path = ()) -> list[Path]:
    """The paths (fastpipe._batch's) of the :class:`EncodedBatch` entries of ``batch``, in
    order: the batch itself, or entries of its containers at any depth."""
    if isinstance(batch, EncodedBatch):
        return [path]
    if isinstance(batch, (str, bytes, torch.Tensor)):
        return []
    found: list[Path] = []
    for step, value in _children(batch):
        found += encoded_paths(value, (*path, step))
    return found


def without_rows(batch: Any, kept: list[int], count: int, skip: list[Path]) -> Any:
    """``batch`` with only the rows ``kept`` of its ``count``-row entries: tensors whose first
    axis is ``count`` (index_select), and lists of ``count`` plain values (strings, numbers);
    the entries at ``skip`` (the decoded images, already of the kept rows) left as they are."""
    index = torch.tensor(kept, dtype=torch.int64)

    def select(node: Any, path: Path) -> Any:
        if path in skip:
            return node
        if isinstance(node, torch.Tensor):
            if node.dim() and node.shape[0] == count:
                return node.index_select(0, index.to(node.device))
            return node
        if isinstance(node, list) and len(node) == count and all(
                isinstance(v, (str, bytes, int, float, bool)) or v is None for v in node):
            return [node[k] for k in kept]
        new = node
        for step, value in _children(node):
            changed = select(value, (*path, step))
            if changed is not value:
                new = replace_at(new, (step,), changed)
        return new

    return select(batch, ())
