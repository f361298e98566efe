"""Collating records: a batch of dicts (or tuples) of fields into a dict (or tuple) of batches.

Tensors of one shape are stacked in their dtype (uint8 images stay uint8); tensors whose first
axis varies are refused unless padding was asked for, which pads them with zeros to the longest
and adds their lengths; Python and numpy scalars become tensors of their dtype; strings and bytes
stay lists.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
import torch

from fastpipe.data.collate.encoded import EncodedImage, collate_encoded

Allocate = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


class Memory(NamedTuple):
    """Where a batch's tensors go: ``empty`` allocates one, ``holds`` says whether a tensor
    already lies in such memory (a block a dataset read its rows into, see :func:`rows_block`)."""

    empty: Allocate
    holds: Callable[[torch.Tensor], bool]

# Dtypes numpy holds bit for bit; others (bfloat16, float8, ...) are stacked by torch.
_NUMPY_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64,
    torch.complex128})

LENGTHS_SUFFIX = "_lengths"


def is_record_batch(batch: Sequence[Any]) -> bool:
    """Records (dicts, or tuples other than ``(image, label)``) rather than image pairs."""
    first = batch[0]
    if isinstance(first, Mapping):
        return True
    if not isinstance(first, (tuple, list)):
        return False
    if len(first) != 2:
        return True
    label = first[1]  # an (image, label) pair has one integer label
    return isinstance(label, (torch.Tensor, np.ndarray)) and label.ndim > 0


def collate_records(batch: Sequence[Any], pad: bool | Collection[str], memory: Memory) -> Any:
    blocks = getattr(batch, "blocks", {})
    handed = getattr(batch, "rows", {})
    first = batch[0]
    if isinstance(first, Mapping):
        keys = list(first)
        for k, sample in enumerate(batch):
            if not isinstance(sample, Mapping) or list(sample) != keys:
                raise ValueError(f"fast_collate needs records with the same fields: sample 0 has "
                                 f"{keys}, sample {k} has "
                                 f"{list(sample) if isinstance(sample, Mapping) else sample!r}")
        out: dict[str, Any] = {}
        for key in keys:
            values = [sample[key] for sample in batch]
            padded = pad is True or (not isinstance(pad, bool) and key in pad)
            collated = _collate_field(key, values, padded, memory, blocks.get(key),
                                      handed.get(key))
            if isinstance(collated, _Padded):
                out[key], out[key + LENGTHS_SUFFIX] = collated.values, collated.lengths
            else:
                out[key] = collated
        return out
    width = len(first)
    if not all(map(isinstance, batch, repeat((tuple, list)))) or set(map(len, batch)) != {width}:
        raise ValueError(f"fast_collate needs records with the same fields: sample 0 has {width} "
                         "values and another sample does not")
    fields = []
    for position in range(width):
        padded = pad is True or (not isinstance(pad, bool) and position in pad)
        collated = _collate_field(str(position), [s[position] for s in batch], padded, memory,
                                  blocks.get(position), handed.get(position))
        fields.append((collated.values, collated.lengths) if isinstance(collated, _Padded)
                      else collated)
    return tuple(fields)


class _Padded:
    def __init__(self, values: torch.Tensor, lengths: torch.Tensor) -> None:
        self.values, self.lengths = values, lengths


def stack_into(values: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """``torch.stack(values, out=out)``, copied by numpy one sample at a time where it can.

    torch splits a large copy across its intra-op threads; loader threads collating at the same
    time then oversubscribe the cores, and each batch waits on the others' threads (a 10 MB batch
    took tens of milliseconds instead of one on a busy 2-core machine). numpy copies in the
    calling thread with the GIL released, so thread workers collate side by side.
    """
    if out.device.type != "cpu" or out.dtype not in _NUMPY_DTYPES or any(
            v.device.type != "cpu" or v.requires_grad or v.is_conj() or v.is_neg()
            for v in values):
        return torch.stack(list(values), out=out)
    np.stack([v.numpy() for v in values], out=out.numpy())
    return out


class Rows(list):
    """The samples fastpipe's readers' ``__getitems__`` return when they read some fields' rows
    straight into one batch block each: ``blocks`` maps a field (a dict key, a tuple position; 0
    for the image of ``(image, label)``) to its ``(N, ...)`` block, whose row ``k`` sample ``k``
    holds. :func:`~fastpipe.data.fast_collate` then returns the block instead of stacking a copy:
    the batch shares its memory with the samples (which nothing else holds), as a block must be
    memory no one else writes."""

    def __init__(self, samples: Sequence[Any], blocks: Mapping[Any, torch.Tensor],
                 rows: Mapping[Any, Sequence[torch.Tensor]] | None = None) -> None:
        super().__init__(samples)
        self.blocks = dict(blocks)
        # The row tensors the reader handed out per field: values that are these very objects,
        # in order, are the block's rows without looking at each one's memory.
        self.rows = dict(rows or {})


def rows_block(values: Sequence[Any], block: torch.Tensor | None,
               handed: Sequence[torch.Tensor] | None = None) -> torch.Tensor | None:
    """``block`` when ``values`` are exactly its rows, in order (a wrapper may have dropped or
    replaced samples since), else None. ``handed``: the row tensors the reader made (the rows of
    a :class:`Rows`); values that are those objects need no other check."""
    if (block is None or len(values) != block.shape[0] or block.device.type != "cpu"
            or not block.is_contiguous() or len(values) == 0):
        return None
    if handed is not None and len(handed) == len(values) and all(
            map(operator.is_, values, handed)):
        return block
    row = block[0].numel() * block.element_size()
    base = block.data_ptr()
    for k, value in enumerate(values):
        # A view with a lazy conjugation or negation shares the block's memory, not its values.
        if (not isinstance(value, torch.Tensor) or value.layout != torch.strided
                or value.device.type != "cpu" or value.dtype != block.dtype
                or value.shape != block.shape[1:] or not value.is_contiguous()
                or value.requires_grad or value.is_conj() or value.is_neg()
                or value.data_ptr() != base + k * row):
            return None
    return block


def _collate_field(name: str, values: list[Any], pad: bool, memory: Memory,
                   block: torch.Tensor | None = None,
                   handed: Sequence[torch.Tensor] | None = None) -> Any:
    if handed is not None and (held := rows_block(values, block, handed)) is not None \
            and memory.holds(held):
        return held  # the rows the reader made, untouched: the block is the batch
    first = values[0]
    if isinstance(first, (str, bytes)):
        return list(values)
    if isinstance(first, EncodedImage):  # decode="gpu": DataPrefetcher decodes the field
        return collate_encoded(values, memory.empty)
    if isinstance(first, np.ndarray):
        values = [torch.from_numpy(np.ascontiguousarray(v)) for v in values]
        first = values[0]
    if not isinstance(first, torch.Tensor):
        return _scalars(name, values)
    for k, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or v.dtype != first.dtype or v.dim() != first.dim():
            raise ValueError(f"fast_collate: field {name!r} of sample {k} is "
                             f"{_what(v)}, sample 0's is {_what(first)}")
    shapes = {tuple(v.shape) for v in values}
    if len(shapes) == 1:
        if (held := rows_block(values, block)) is not None and memory.holds(held):
            return held
        return stack_into(values, memory.empty((len(values), *first.shape), first.dtype))
    trailing = {s[1:] for s in shapes}
    if len(trailing) != 1 or first.dim() == 0:
        raise ValueError(f"fast_collate: field {name!r} has shapes {sorted(shapes)[:4]} in one "
                         "batch; only the first axis may vary (and then only with pad=True)")
    if not pad:
        raise ValueError(f"fast_collate: field {name!r} varies in length within the batch "
                         f"({sorted(s[0] for s in shapes)[:6]}...); pass "
                         f"collate_fn=functools.partial(fast_collate, pad=True) to pad it with "
                         f"zeros to the longest and get its lengths as {name + LENGTHS_SUFFIX!r}")
    lengths = torch.tensor([v.shape[0] for v in values], dtype=torch.int64)
    out = memory.empty((len(values), int(lengths.max()), *first.shape[1:]), first.dtype)
    out.zero_()
    for k, v in enumerate(values):
        out[k, :v.shape[0]] = v
    return _Padded(out, lengths)


def _scalars(name: str, values: list[Any]) -> torch.Tensor:
    first = values[0]
    if isinstance(first, np.generic):
        return torch.from_numpy(np.asarray(values, dtype=first.dtype))
    if isinstance(first, bool):
        dtype = torch.bool
    elif isinstance(first, int):
        dtype = torch.int64
    elif isinstance(first, float):
        dtype = torch.float64
    else:
        raise TypeError(f"fast_collate: field {name!r} is a {type(first).__name__}; records "
                        "hold tensors, arrays, numbers, strings and bytes")
    if any(type(v) is not type(first) for v in values):
        raise ValueError(f"fast_collate: field {name!r} mixes "
                         f"{sorted({type(v).__name__ for v in values})} in one batch")
    return torch.tensor(values, dtype=dtype)


def _what(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__
