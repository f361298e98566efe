"""Where the encoded images are in a batch, and the batch without the rows a decode left out."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fastpipe._batch import Attr, place, replace_at
from fastpipe.data.collate.encoded import EncodedBatch

__all__ = ["encoded_paths", "index_on", "without_rows"]

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


def index_on(rows: list[int], device: torch.device) -> torch.Tensor:
    """``rows`` as an int64 index on ``device``: to a GPU from page-locked memory, queued without
    blocking the thread (a copy from pageable memory waits for the device, stalling the training
    thread when a batch had a fallback or a skip)."""
    index = torch.tensor(rows, dtype=torch.int64)
    if device.type != "cuda":
        return index.to(device)
    return index.pin_memory().to(device, non_blocking=True)


def without_rows(batch: Any, kept: list[int], count: int, skip: list[Path]) -> Any:
    """``batch`` with only the rows ``kept`` of its ``count``-row entries: tensors and arrays
    whose first axis is ``count``, and lists of ``count`` values of any kind (strings, numbers,
    per-sample tensors or dicts; a list that holds an encoded entry is the batch's structure);
    the entries at ``skip`` (the decoded images, already of the kept rows) left as they are. An
    entry of ``count`` values that cannot be told from structure (a tuple of ``count`` plain
    values, an object of length ``count``) is a TypeError naming it: leaving it whole would
    misalign it with the rest."""
    indices: dict[torch.device, torch.Tensor] = {}
    ancestors = {path[:depth] for path in skip for depth in range(len(path))}

    def rows_of(tensor: torch.Tensor) -> torch.Tensor:
        index = indices.get(tensor.device)
        if index is None:
            index = indices[tensor.device] = index_on(kept, tensor.device)
        return tensor.index_select(0, index)

    def select(node: Any, path: Path) -> Any:
        if path in skip:
            return node
        if isinstance(node, torch.Tensor):
            return rows_of(node) if node.dim() and node.shape[0] == count else node
        if isinstance(node, np.ndarray):
            return node[kept] if node.ndim and node.shape[0] == count else node
        if isinstance(node, list) and len(node) == count and path not in ancestors:
            return [node[k] for k in kept]
        children = _children(node)
        if _per_sample_unknown(node, children, count):
            raise TypeError(
                f"DataPrefetcher: GPU decode left {count - len(kept)} corrupt sample(s) out of a "
                f"batch of {count} (on_error='skip'), and cannot leave their rows out of "
                f"{place(path)}, a {type(node).__name__} of {count} values; make it a list or a "
                "tensor (one row per sample) in the collate function, so that it stays aligned")
        new = node
        for step, value in children:
            changed = select(value, (*path, step))
            if changed is not value:
                new = replace_at(new, (step,), changed)
        return new

    return select(batch, ())


def _per_sample_unknown(node: Any, children: list[tuple[Any, Any]], count: int) -> bool:
    """Whether ``node`` holds ``count`` values that may be one per sample and cannot be cut: a
    tuple (not a namedtuple) of ``count`` plain values, or an object of length ``count`` that is
    no container."""
    if isinstance(node, (str, bytes, Mapping)) or dataclasses.is_dataclass(node):
        return False
    if isinstance(node, tuple) and not hasattr(type(node), "_fields"):
        return len(node) == count and not any(
            isinstance(value, (torch.Tensor, np.ndarray, list, tuple, Mapping))
            or dataclasses.is_dataclass(value) for _, value in children)
    if children or not hasattr(node, "__len__"):
        return False
    try:
        return len(node) == count
    except TypeError:
        return False
