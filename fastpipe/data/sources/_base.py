"""The source interface: what every place records come from offers, declared once.

A source is a fixed number of records (samples), each a record of named fields described by its
:class:`Schema` (fields with their roles, fastpipe.data.format.fields). fastpipe's packs (HDF5,
LMDB), plain HDF5 files, WebDataset tar shards, image folders and list files, paired folders,
folders of ``.npy`` files and Hugging Face datasets are sources; the datasets (``H5Dataset``,
``ImageFolder``, ...), the packer, ``verify``, DALI's readers and the profiler read through this
interface, so a new place data lives is one new file here (docs/architecture.md, "Where a change
goes").

A source is picklable and holds no open handle when pickled: handles (file descriptors, an h5py
file, an LMDB environment) open on first use in each process (:meth:`Source._handles`), so a
source built in the main process reads in DataLoader workers under fork and spawn, and threads of
one process share its handles. Index arrays a source reads at construction (offsets, labels,
where each chunk lies) stay in the object: worker processes inherit them under fork without a
copy, instead of reading them again.

Values are read in their stored form (what :meth:`fastpipe.data.format.fields.Field.value` turns
into what a dataset returns): a variable field (an encoded image, bytes, a string, an array whose
first axis varies) as a numpy array of its rows (flat uint8 for images, bytes and strings), a fixed
field as its row, a scalar as a 0-d array.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RECORD_KINDS", "Schema", "Source", "check_index", "check_indices"]

RECORD_KINDS = ("dict", "tuple", "pair")

# Held while a source opens its handles in this process (rare: once per source and process). A
# child of a fork gets a new one: another thread of the parent may have held it at the fork.
_OPEN_LOCK = threading.Lock()


def _new_open_lock() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_open_lock)


@dataclass(frozen=True)
class Schema:
    """The fields of a source's records, in order, with what a dataset needs to return them.

    ``fields``: name -> :class:`~fastpipe.data.format.fields.Field` (its storage and its role), in
    the order a record holds them. ``record``: ``"dict"`` (a dataset returns ``{name: value}``),
    ``"tuple"`` (values in field order: a dataset of tuples, fields picked by name) or ``"pair"``
    (an image and its label, as an image pack or an image folder holds them: a dataset returns
    ``(image, label)`` and its transform applies to the image). ``classes``: the class names of
    label fields, by field.
    """

    fields: Mapping[str, Any]
    record: str = "dict"
    classes: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.record == "pair" and len(self.fields) != 2:
            raise ValueError(f"Schema: a pair holds an image and a label, got {list(self.fields)}")
        if self.record not in RECORD_KINDS:
            raise ValueError(f"Schema: record must be one of {RECORD_KINDS}, got {self.record!r}")
        object.__setattr__(self, "fields", dict(self.fields))
        object.__setattr__(self, "classes",
                           {k: tuple(v) for k, v in dict(self.classes).items()})
        if unknown := [n for n in self.classes if n not in self.fields]:
            raise ValueError(f"Schema: classes name {unknown[0]!r}, which is not a field")

    @property
    def names(self) -> list[str]:
        return list(self.fields)

    def select(self, names: Sequence[str] | None, where: str) -> Schema:
        """The schema of the fields ``names`` in that order (a tuple record), or this one for
        None; an unknown name is an error naming what the source has."""
        if names is None:
            return self
        if isinstance(names, str):
            raise TypeError(f"fields must be a list of field names, got the string {names!r}")
        names = list(names)
        if unknown := [n for n in names if n not in self.fields]:
            raise ValueError(f"{where} has no field {unknown[0]!r}; it has "
                             f"{', '.join(self.fields)}")
        return Schema({n: self.fields[n] for n in names}, "tuple",
                      {n: c for n, c in self.classes.items() if n in names})

    @property
    def label(self) -> str | None:
        """The field a dataset's ``targets`` and ``classes`` come from: a pair's label, else the
        field whose role is Label; for files that cannot store roles (a plain HDF5 file, tar
        shards), an int field named ``label``."""
        from fastpipe.data.format.roles import Label

        if self.record == "pair":
            return self.names[1]
        for name, f in self.fields.items():
            if isinstance(getattr(f, "role", None), Label):
                return name
        f = self.fields.get("label")
        return "label" if f is not None and f.kind == "int" else None

    def fixed(self) -> list[str]:
        """The fields whose stored rows have one shape in every record (blocks of a batch)."""
        return [n for n, f in self.fields.items() if not f.variable]

    def to_json(self) -> dict[str, Any]:
        return {"fields": {n: f.to_json() for n, f in self.fields.items()},
                "order": list(self.fields), "record": self.record,
                "classes": {n: list(c) for n, c in self.classes.items()}}


def check_index(index: Any, count: int, where: str) -> int:
    """``index`` as an int in ``[0, count)`` (negative from the end), or TypeError/IndexError
    naming ``where``."""
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise TypeError(f"{where}: a sample index must be an int, got {type(index).__name__}")
    i = int(index)
    if i < 0:
        i += count
    if not 0 <= i < count:
        raise IndexError(f"index {index} is out of range for {where} with {count} samples")
    return i


def check_indices(indices: Sequence[Any], count: int, where: str) -> np.ndarray:
    """:func:`check_index` of every index, as an int64 array, in one step where they are ints."""
    try:
        array = np.asarray(indices)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim != 1 or (array.dtype.kind not in "iu" and len(array)):
        return np.fromiter((check_index(i, count, where) for i in indices), np.int64,
                           len(indices))
    array = array.astype(np.int64, copy=True)
    array[array < 0] += count
    if len(array) and (array.min() < 0 or array.max() >= count):
        for i in indices:  # the first bad one, named as check_index names it
            check_index(i, count, where)
    return array


class Source:
    """Base of the sources: records read by index, in their stored form.

    Subclasses set ``schema`` and ``count`` in ``__init__`` (reading what they need once), and
    implement :meth:`_read` (one record) and, where they can read a batch faster than record by
    record, :meth:`_read_batch`; handles a subclass opens go through :meth:`_handles`, which opens
    them once per process (:meth:`_open`) and drops what was inherited across a fork.

    Attributes: ``schema`` (:class:`Schema`), ``meta`` (what the source stores about itself: a
    pack's metadata; ``{}`` elsewhere), ``where`` (how messages name the source).
    """

    schema: Schema
    count: int
    meta: dict[str, Any]
    where: str

    def __len__(self) -> int:
        return self.count

    # ------------------------------------------------------------------ what subclasses give

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        """Fields ``names`` of record ``index`` (checked), stored form."""
        raise NotImplementedError

    def _read_batch(self, indices: np.ndarray, names: Sequence[str],
                    blocks: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        """Records ``indices``: the fields in ``blocks`` written into their rows (row ``k`` for
        ``indices[k]``), the others in the returned dicts. Record by record unless overridden."""
        out = []
        for k, index in enumerate(indices.tolist()):
            record = self._read(index, names)
            for name, block in blocks.items():
                block[k] = record.pop(name)
            out.append(record)
        return out

    def describe(self, index: int) -> str:
        """Names record ``index`` for messages (the file or member it came from)."""
        return f"{self.where}[{index}]"

    def fingerprint(self) -> str:
        """A short hash of what the source holds, which a saved loader state must match."""
        raise NotImplementedError

    def _open(self) -> Any:
        """This process's handles (opened on first use; see :meth:`_handles`)."""
        return None

    def _close(self, handles: Any) -> None:
        """Closes what :meth:`_open` returned."""

    # -------------------------------------------------------------------------- the interface

    def read(self, index: int, names: Sequence[str] | None = None) -> dict[str, Any]:
        """Record ``index``: ``{name: stored value}`` for ``names`` (all fields by default)."""
        i = check_index(index, self.count, self.where)
        return self._read(i, self.schema.names if names is None else list(names))

    def read_batch(self, indices: Sequence[int], blocks: Mapping[str, np.ndarray] | None = None,
                   names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Records ``indices``: each fixed field named in ``blocks`` written into its block
        (``(len(indices), *row_shape)`` of the stored dtype, C-contiguous: row ``k`` for
        ``indices[k]``), every other field of ``names`` (default: all) in the returned dicts,
        one per index, in the order asked."""
        checked = check_indices(indices, self.count, self.where)
        names = self.schema.names if names is None else list(names)
        blocks = dict(blocks or {})
        for name, block in blocks.items():
            f = self.schema.fields[name]
            want = (len(checked), *f.row_shape)
            if (f.variable or block.shape != want or block.dtype != np.dtype(f.stored_dtype)
                    or not block.flags.c_contiguous or not block.flags.writeable):
                raise ValueError(f"{self.where}: the block of field {name!r} must be a writable "
                                 f"C-contiguous {np.dtype(f.stored_dtype)} array of shape {want}, "
                                 f"got {block.dtype} {block.shape}")
        return self._read_batch(checked, names, blocks)

    def _handles(self) -> Any:
        """This process's handles, opened on first use; a copy inherited through fork is dropped
        (the parent's stay open) and this process opens its own."""
        state = self.__dict__.get("_opened")
        pid = os.getpid()
        if state is not None and state[0] == pid:
            return state[1]
        with _OPEN_LOCK:
            state = self.__dict__.get("_opened")
            if state is not None and state[0] == pid:
                return state[1]
            handles = self._open()
            self.__dict__["_opened"] = (pid, handles)
            return handles

    def close(self) -> None:
        """Closes this process's handles (they reopen on the next read)."""
        state = self.__dict__.pop("_opened", None)
        if state is not None and state[0] == os.getpid():
            self._close(state[1])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_opened", None)
        return state

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, half-built objects
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r}, samples={self.count}, " \
               f"fields={self.schema.names})"
