"""Files of arrays and of columns as sources: a folder or list of ``.npy``/``.npz`` files (one
record per file), and a list file of records (``#fields: lr hr label``, then one line per sample
naming a file per column).

The fields come from the files: a ``.npy`` file is the field ``array``, a ``.npz`` file one field
per array it holds; the headers of every file give dtypes and shapes (an array whose first axis
differs between files is variable along it). Pickled objects are refused (``allow_pickle=False``:
loading them would run code from the file).
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.format import fields as F
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources.folder import (
    COLUMNS_HEADER,
    LABEL_RANGE,
    NO_LABEL,
    PathTable,
    _is_int,
    read_file,
)
from fastpipe.data.sources.listing import list_image_folder

__all__ = ["ARRAY_EXTENSIONS", "ArrayFilesSource", "ColumnsSource", "is_array_file",
           "load_array_file"]

ARRAY_EXTENSIONS = (".npy", ".npz")
LABEL = "label"


def is_array_file(name: str) -> bool:
    return name.lower().endswith(ARRAY_EXTENSIONS)


def load_array_file(path: str) -> dict[str, np.ndarray]:
    """A ``.npy`` file as ``{"array": ...}``, a ``.npz`` file as its arrays by name."""
    loaded = np.load(path, allow_pickle=False)
    if isinstance(loaded, np.ndarray):
        return {"array": loaded}
    with loaded:
        return {name: loaded[name] for name in loaded.files}


def array_headers(path: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of each array in a ``.npy``/``.npz`` file, from the headers only."""
    def header(f) -> tuple[tuple[int, ...], np.dtype]:
        major, _ = np.lib.format.read_magic(f)
        read = (np.lib.format.read_array_header_1_0 if major == 1 else
                np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(f)
        return tuple(shape), np.dtype(dtype)

    if path.lower().endswith(".npy"):
        with open(path, "rb") as f:
            return {"array": header(f)}
    out = {}
    with zipfile.ZipFile(path) as z:
        for member in z.namelist():
            if member.endswith(".npy"):
                with z.open(member) as f:
                    out[member[:-4]] = header(f)
    return out


def array_fields(files: Sequence[str], where: str) -> dict[str, Any]:
    """The fields of array files from every file's headers: an array whose first axis differs
    between files is declared variable along it (its other axes and dtype must agree)."""
    seen: dict[str, tuple[tuple[int, ...], np.dtype, str]] = {}
    variable: set[str] = set()
    for path in files:
        try:
            headers = array_headers(path)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            continue  # unreadable: an error naming it when read (pack skips and names it)
        for name, (shape, dtype) in headers.items():
            if name not in seen:
                seen[name] = (shape, dtype, path)
                continue
            shape0, dtype0, first = seen[name]
            if dtype != dtype0 or len(shape) != len(shape0) or shape[1:] != shape0[1:]:
                raise ValueError(
                    f"{path}: {name!r} is {dtype} {shape}, but {first} holds {dtype0} {shape0}; "
                    "the arrays of one source share their dtype and all axes but the first")
            if shape[:1] != shape0[:1]:
                variable.add(name)
    if not seen:
        raise ValueError(f"none of the {len(files)} array files of {where} could be read")
    fields: dict[str, Any] = {}
    for name, (shape, dtype, _) in seen.items():
        if dtype.hasobject or dtype.kind not in "biufc":
            raise ValueError(f"{name!r} holds {dtype}; array files must hold numbers or booleans")
        fields[name] = F.ArrayField(dtype.name, ((None,) + shape[1:]) if name in variable
                                    else shape)
    return fields


def _encoded(field: Any, value: Any, where: str) -> np.ndarray:
    try:
        return field.encode(value, where)
    except F.FieldError as exc:
        raise ValueError(str(exc)) from exc


class ArrayFilesSource(Source):
    """``.npy``/``.npz`` files, one record each: a folder of them (in class sub-folders, which
    label them, or not) or a list of paths (with labels, or not)."""

    def __init__(self, files: str | os.PathLike | Sequence[str],
                 labels: Sequence[int] | None = None, classes: Sequence[str] = ()) -> None:
        if isinstance(files, (str, os.PathLike)):
            root = Path(files)
            self.where = str(root)
            classes, names, found = list_image_folder(root, ARRAY_EXTENSIONS)
            if not names:
                classes = []
                names = sorted(os.path.relpath(os.path.join(d, f), root)
                               for d, _, fs in os.walk(root, followlinks=True) for f in fs
                               if is_array_file(f) and not f.endswith(".fastpipe-index.npz"))
                found = None
            if not names:
                raise FileNotFoundError(f"{root} holds no .npy or .npz files")
            labels = found
            self.files = PathTable(root, names)
        else:
            self.where = f"{len(files)} array files"
            self.files = PathTable("", [os.fspath(f) for f in files])
        self.count = len(self.files)
        self.labels_array = None if labels is None else np.asarray(labels, np.int64)
        fields = array_fields([self.files[i] for i in range(self.count)], self.where)
        classes_of = {}
        if self.labels_array is not None and (self.labels_array >= 0).any():
            fields[LABEL] = F.IntField("int64")
            if classes:
                classes_of[LABEL] = list(classes)
        self.meta = {}
        self.schema = Schema(fields, "dict", classes_of)

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        path = self.files[index]
        arrays = load_array_file(path)
        out = {}
        for name in names:
            field = self.schema.fields[name]
            if name == LABEL and name not in arrays:
                out[name] = self.labels_array[index]
            elif name not in arrays:
                raise ValueError(f"{path} has no array {name!r} (it has {sorted(arrays)}); every "
                                 "file of an array source holds the same arrays")
            else:
                out[name] = _encoded(field, arrays[name], f"{name!r} of {path}")
        return out

    def describe(self, index: int) -> str:
        return self.files[index]

    def paths(self, start: int, stop: int) -> list[str]:
        return [self.files.relative(i) for i in range(start, stop)]

    def labels(self) -> np.ndarray | None:
        return self.labels_array if LABEL in self.schema.fields else None

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.where.encode())
        self.files.digest(digest)
        if self.labels_array is not None:
            digest.update(self.labels_array.tobytes())
        return digest.hexdigest()[:16]


class ColumnsSource(Source):
    """A list file of records: a ``#fields: lr hr label`` line names the columns, then one line
    per sample (tab-separated when it has tabs, else whitespace). A ``label`` column holds
    integers or class names; every other column a file (images kept as bytes, ``.npy``/``.npz``
    arrays), relative to the list file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        names, rows = _columns(self.path)
        self.columns = [n for n in names if n != LABEL]
        base = self.path.parent
        self._files = {name: PathTable(base, [row[names.index(name)] for row in rows])
                       for name in self.columns}
        self.count = len(rows)
        classes: list[str] = []
        self.labels_array = None
        if LABEL in names:
            raw = [row[names.index(LABEL)] for row in rows]
            if all(_is_int(x) for x in raw):
                self.labels_array = np.asarray([int(x) for x in raw], np.int64)
                if (bad := np.flatnonzero(self.labels_array < NO_LABEL)).size:
                    raise ValueError(f"{self.path}: sample {int(bad[0])} has label "
                                     f"{int(self.labels_array[bad[0]])}; {LABEL_RANGE}")
            else:
                classes = sorted(set(raw))
                self.labels_array = np.asarray([classes.index(x) for x in raw], np.int64)
        fields: dict[str, Any] = {}
        for name in self.columns:
            files = [self._files[name][i] for i in range(self.count)]
            if all(is_array_file(f) for f in files):
                found = array_fields(files, f"column {name!r} of {self.path}")
                if len(found) != 1:
                    raise ValueError(f"column {name!r} of {self.path} names .npz files of several "
                                     f"arrays ({sorted(found)}); a column holds one array")
                fields[name] = next(iter(found.values()))
            elif any(is_array_file(f) for f in files):
                raise ValueError(f"column {name!r} of {self.path} names both array files and "
                                 "other files; a column holds one kind")
            else:
                fields[name] = F.ImageField() if _is_image_name(files[0]) else F.BytesField()
        if self.labels_array is not None:
            fields[LABEL] = F.IntField("int64")
        self.meta = {}
        self.schema = Schema(fields, "dict", {LABEL: classes} if classes else {})

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        out = {}
        for name in names:
            if name == LABEL:
                out[name] = self.labels_array[index]
                continue
            path = self._files[name][index]
            field = self.schema.fields[name]
            if field.kind == "array":
                arrays = load_array_file(path)
                out[name] = _encoded(field, next(iter(arrays.values())),
                                     f"column {name!r} ({path})")
            else:
                out[name] = np.frombuffer(read_file(path), np.uint8)
        return out

    def describe(self, index: int) -> str:
        return self._files[self.columns[0]][index] if self.columns else \
            f"{self.where}, line {index}"

    def paths(self, start: int, stop: int) -> list[str]:
        if not self.columns:
            return [f"line {i}" for i in range(start, stop)]
        return [self._files[self.columns[0]].relative(i) for i in range(start, stop)]

    def labels(self) -> np.ndarray | None:
        return self.labels_array

    def fingerprint(self) -> str:
        digest = hashlib.sha256(os.fsencode(os.path.abspath(self.path)))
        for name in self.columns:
            self._files[name].digest(digest)
        if self.labels_array is not None:
            digest.update(self.labels_array.tobytes())
        return digest.hexdigest()[:16]


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
                   ".gif")


def _is_image_name(path: str) -> bool:
    return path.lower().endswith(_IMAGE_SUFFIXES)


def _columns(path: Path) -> tuple[list[str], list[list[str]]]:
    """The column names and rows of a ``#fields:`` list file."""
    with open(path, encoding="utf-8") as f:
        lines = list(enumerate(f, 1))
    # The header is the first line that is not blank or a comment ('#fields:' is not one).
    header = next(((n, line.strip()) for n, line in lines if line.strip() and (
        line.strip().startswith(COLUMNS_HEADER) or not line.strip().startswith("#"))), (0, ""))
    if not header[1].startswith(COLUMNS_HEADER):
        raise ValueError(f"{path} does not start with a '{COLUMNS_HEADER}' line naming its "
                         "columns")
    names = header[1][len(COLUMNS_HEADER):].split()
    if len(names) < 1 or len(set(names)) != len(names):
        raise ValueError(f"{path}:{header[0]}: '{COLUMNS_HEADER}' needs distinct field names, got "
                         f"{names}")
    rows: list[list[str]] = []
    for number, line in lines:
        line = line.strip()
        if number <= header[0] or not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in (line.split("\t") if "\t" in line else line.split())]
        if len(parts) != len(names):
            raise ValueError(f"{path}:{number}: {len(parts)} columns, but the header names "
                             f"{len(names)} ({' '.join(names)})")
        rows.append(parts)
    if not rows:
        raise ValueError(f"{path} lists no samples after its '{COLUMNS_HEADER}' line")
    return names, rows
