"""Parquet files (and the Hugging Face Hub's image datasets) as a source, read in place.

One record per row; each column a field (:mod:`fastpipe.data.format.fields`) with its role: an
image column (the Hub's ``{"bytes", "path"}`` struct, or plain binary holding encoded images) is
an :class:`~fastpipe.data.format.fields.ImageField` decoded by the datasets' fast path, a
``ClassLabel`` column a label (its class names from the file's ``huggingface`` metadata), numbers
scalars, lists arrays. A folder laid out as the Hub stores a dataset
(``data/train-00000-of-00294.parquet``, ...) opens whole, one split of it.

A row group is the smallest part of a Parquet file that can be read, so it is the unit of random
access: each process keeps the row groups it decoded (the columns read only) in a cache bounded
in bytes (:data:`ROW_GROUP_CACHE`), evicting the least recently used; a batch reads each row
group it needs once. A shuffled order that jumps between row groups reads a row group per sample
(counted; warned about once), which a shard-aware order (``window=``, fastpipe.data.sampling.order)
avoids. Files are opened per process (at most :data:`_OPEN_FILES` at a time), safe under fork,
spawn and threads; pyarrow is imported on first use (``pip install 'fastpipe[parquet]'``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe._optional import require
from fastpipe.data.format import fields as F
from fastpipe.data.format.layout import PackFormatError
from fastpipe.data.format.roles import Label
from fastpipe.data.sources._base import Schema, Source

__all__ = ["ROW_GROUP_CACHE", "ParquetSource", "list_parquet"]

# Bytes of decoded row groups one process keeps (the columns read). Larger row groups than this
# are still read, one at a time.
ROW_GROUP_CACHE = 512 << 20
# Parquet files one process holds open; more are opened and closed as needed.
_OPEN_FILES = 16
# The Hub's shard names: data/train-00000-of-00294.parquet.
_HUB_NAME = re.compile(r"^(?P<split>.+?)-(?P<index>\d{5})-of-(?P<total>\d{5})$")
# Folder names that name a split (the Hub's converted layout: <config>/<split>/0000.parquet).
_SPLIT_FOLDERS = {"train", "training", "validation", "valid", "val", "dev", "test", "testing",
                  "eval", "evaluation"}
# A warning once a process read this many row groups for fewer than this many samples each.
_THRASH_READS, _THRASH_ROWS = 64, 4


def _pq() -> Any:
    return require("pyarrow.parquet", extra="parquet", package="pyarrow",
                   feature="Reading Parquet files")


def _split_of(relative: Path) -> str | None:
    match = _HUB_NAME.match(relative.stem)
    if match:
        return match["split"]
    folders = [p for p in relative.parts[:-1] if p.lower() in _SPLIT_FOLDERS]
    return folders[-1] if folders else None


def list_parquet(source: str | os.PathLike | Sequence[str | os.PathLike],
                 split: str | None = None) -> tuple[list[Path], Path | None]:
    """The Parquet files to read, and the folder they were found in (None for files given).

    ``source``: a file, a list of files, a glob, or a folder (its ``*.parquet`` files at any depth,
    in name order). A folder holding several splits (the Hub's ``train-*``/``validation-*`` files,
    or ``train/``, ``test/`` folders) needs ``split=``; a split whose Hub names
    (``-00003-of-00010``) show files missing is refused, naming them."""
    if not isinstance(source, (str, os.PathLike)):
        files = [Path(p) for p in source]
        if not files:
            raise ValueError("ParquetSource needs at least one Parquet file")
        for p in files:
            if not p.is_file():
                raise FileNotFoundError(f"no such Parquet file: {p}")
        root = None
    else:
        path = Path(source)
        root = path if path.is_dir() else None
        if path.is_file():
            files = [path]
        elif root is not None:
            files = sorted(p for p in path.rglob("*.parquet") if p.is_file())
            if not files:
                raise FileNotFoundError(f"{path} holds no .parquet files")
        else:
            files = sorted(Path(p) for p in glob.glob(str(source), recursive=True))
            if not files:
                raise FileNotFoundError(f"no Parquet files match {source}")
    where = "the files given" if not isinstance(source, (str, os.PathLike)) else str(source)
    relative = [p.relative_to(root) if root is not None else Path(p.name) for p in files]
    return [files[k] for k in _of_split(relative, split, where)], root


def _of_split(relative: list[Path], split: str | None, where: str) -> list[int]:
    """Which of the files (named relative to the folder given) hold ``split``."""
    splits = [_split_of(r) for r in relative]
    named = sorted({s for s in splits if s is not None})
    if split is None:
        if len(named) > 1 or (named and None in splits):
            shown = ", ".join(repr(s) for s in named)
            raise ValueError(f"{where} holds the splits {shown}"
                             f"{' and files of no split' if None in splits else ''}; pick one "
                             f"with split= (e.g. split={named[0]!r}), or name its files (a "
                             "glob such as 'data/train-*.parquet')")
        chosen = list(range(len(relative)))
    else:
        if split not in named:
            raise ValueError(f"{where} holds no split {split!r} (found: "
                             f"{', '.join(repr(s) for s in named) or 'none'})")
        chosen = [k for k, s in enumerate(splits) if s == split]
    _check_complete([relative[k] for k in chosen], where)
    return chosen


def _check_complete(relative: list[Path], where: str) -> None:
    """Refuses a Hub split with shards missing (``-00003-of-00010`` names say how many)."""
    groups: dict[tuple[Path, str, int], set[int]] = {}
    for p in relative:
        match = _HUB_NAME.match(p.stem)
        if match:
            key = (p.parent, match["split"], int(match["total"]))
            groups.setdefault(key, set()).add(int(match["index"]))
    for (folder, name, total), have in groups.items():
        missing = sorted(set(range(total)) - have)
        if missing:
            shown = ", ".join(f"{name}-{i:05d}-of-{total:05d}.parquet" for i in missing[:3])
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise FileNotFoundError(
                f"{where}: {len(missing)} of the {total} files of {(folder / name).as_posix()} "
                f"are missing ({shown}{more}); finish the download, or pass the files to read "
                "as a list")


def _remote_files(source: Any, split: str | None, options: Any) -> tuple[Any, list[str]]:
    """The remote Parquet objects ``source`` names (URLs: a folder, read recursively as the Hub
    lays a dataset out; a pattern; a list; one object), one split of them, and their names
    relative to the folder."""
    from fastpipe.data.remote.files import RemoteFiles
    from fastpipe.data.remote.filesystems import list_objects
    from fastpipe.data.remote.urls import redact

    if isinstance(source, (list, tuple)) or glob.has_magic(os.fspath(source).split("://", 1)[1]) \
            or os.fspath(source).endswith(".parquet"):
        files = RemoteFiles.listed(source if isinstance(source, (list, tuple)) else os.fspath(
            source), options, (".parquet",), "Parquet files")
        relative = [u.rsplit("/", 1)[-1] for u in files.urls]
        where = redact(os.fspath(source)) if not isinstance(source, (list, tuple)) \
            else "the files given"
    else:
        folder = os.fspath(source).rstrip("/") + "/"
        found = {u: i for u, i in list_objects(folder, options).items() if u.endswith(".parquet")}
        if not found:
            raise FileNotFoundError(f"{redact(folder)} holds no .parquet files")
        files = RemoteFiles(list(found.values()), options)
        relative = [u[len(folder):] for u in files.urls]
        where = redact(folder)
    chosen = _of_split([Path(r) for r in relative], split, where)
    return RemoteFiles([files.infos[k] for k in chosen], options), [relative[k] for k in chosen]


def _remote_footer(files: Any, k: int, stop: Any = None) -> Any:
    """The footer (FileMetaData) of remote Parquet object ``k``, read by ranges: its last bytes
    say the footer's length, the footer is read, nothing else."""
    import pyarrow as pa

    from fastpipe.data.remote.filesystems import read_range
    from fastpipe.data.remote.retry import attempt

    found = files.infos[k]
    url, size = found.url, found.size
    if size < 12:
        raise PackFormatError(f"{files.names()[k]} is not a Parquet file ({size} bytes)")
    tail_size = min(size, 64 << 10)
    tail = attempt(lambda: read_range(url, size - tail_size, size, files.options, stop), url,
                   "reading its footer", files.options, stop)
    if len(tail) != tail_size or tail[-4:] != b"PAR1":
        raise PackFormatError(f"{files.names()[k]} is not a Parquet file (no PAR1 at its end)")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise PackFormatError(f"{files.names()[k]} is not a readable Parquet file (a footer of "
                              f"{length} bytes in {size})")
    if length + 8 > len(tail):
        tail = attempt(lambda: read_range(url, size - length - 8, size, files.options, stop),
                       url, "reading its footer", files.options, stop)
    try:
        return _pq().read_metadata(pa.BufferReader(b"PAR1" + tail[-length - 8:]))
    except (OSError, ValueError) as exc:
        raise PackFormatError(f"{files.names()[k]} is not a readable Parquet file "
                              f"({type(exc).__name__}: {exc})") from exc


# ------------------------------------------------------------------------ columns as fields


@dataclass(frozen=True)
class _Column:
    """How a field is read from its column: ``kind`` "binary" (flat bytes per row: images,
    bytes, strings; ``struct`` the child holding them), "scalar" or "array" (numbers, ``depth``
    levels of lists above the values)."""

    name: str
    kind: str
    struct: str | None = None
    depth: int = 0


def _hf_features(schema: Any) -> dict[str, Any]:
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if not raw:
        return {}
    try:
        features = json.loads(raw)["info"]["features"]
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


def _field_of(name: str, arrow_type: Any, feature: Any, looks_like_image: Any,
              where: str) -> tuple[Any, _Column, list[str] | None]:
    """The field of a column, how to read it, and its class names (a ClassLabel)."""
    import pyarrow as pa

    t = arrow_type
    hf = feature.get("_type") if isinstance(feature, dict) else None
    if pa.types.is_struct(t):
        children = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
        if "bytes" in children and _is_binary(children["bytes"]) and set(children) <= {
                "bytes", "path"}:
            # The Hub's Image (and Audio) layout: the file's bytes and its original name.
            image = hf == "Image" or (hf is None and looks_like_image(name, "bytes"))
            field = F.ImageField() if image else F.BytesField()
            return field, _Column(name, "binary", struct="bytes"), None
        raise PackFormatError(f"{where}: column {name!r} is a struct ({t}), which fastpipe does "
                              "not read as a field; leave it out with fields=[...]")
    if _is_binary(t):
        image = hf == "Image" or (hf is None and looks_like_image(name, None))
        return (F.ImageField() if image else F.BytesField()), _Column(name, "binary"), None
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(
            pa.types, "is_string_view", lambda _: False)(t):
        return F.StrField(), _Column(name, "binary"), None
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        dtype = np.dtype(t.to_pandas_dtype()).name
        if hf == "ClassLabel":
            names = [str(n) for n in feature.get("names") or []]
            return F.IntField(dtype, role=Label()), _Column(name, "scalar"), names
        return F.IntField(dtype), _Column(name, "scalar"), None
    if pa.types.is_floating(t):
        return F.FloatField(np.dtype(t.to_pandas_dtype()).name), _Column(name, "scalar"), None
    shape, value_type = _list_shape(t)
    if shape is not None:
        if pa.types.is_boolean(value_type) or pa.types.is_integer(value_type) or \
                pa.types.is_floating(value_type):
            declared = feature.get("shape") if isinstance(feature, dict) and str(hf).startswith(
                "Array") else None
            if declared is not None and len(declared) == len(shape):
                shape = [None if s is None else int(s) for s in declared]
            dtype = np.dtype(value_type.to_pandas_dtype()).name
            if any(s is None for s in shape[1:]):
                raise PackFormatError(
                    f"{where}: column {name!r} is a list of lists of varying length ({t}); an "
                    "array field varies along its first axis only; leave it out with "
                    "fields=[...]")
            return F.ArrayField(dtype, tuple(shape)), _Column(name, "array",
                                                              depth=len(shape)), None
    raise PackFormatError(f"{where}: column {name!r} has the type {t}, which fastpipe does not "
                          "read as a field; leave it out with fields=[...]")


def _is_binary(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(
        t) or getattr(pa.types, "is_binary_view", lambda _: False)(t)


def _list_shape(t: Any) -> tuple[list[int | None] | None, Any]:
    """The shape of nested lists (None: a length that varies) and their value type."""
    import pyarrow as pa

    shape: list[int | None] = []
    while True:
        if pa.types.is_fixed_size_list(t):
            shape.append(t.list_size)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            shape.append(None)
        else:
            return (shape or None), t
        t = t.value_type


# ------------------------------------------------------------------------- decoded row groups


class _Group:
    """One row group's columns as numpy arrays (views of pyarrow's buffers)."""

    def __init__(self, table: Any, columns: Mapping[str, _Column]) -> None:
        self.nbytes = int(table.nbytes)
        self.rows = table.num_rows
        self.values: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        self.paths: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None
        for name, column in columns.items():
            array = table.column(name).combine_chunks()
            if column.struct is not None:
                children = dict(zip([array.type.field(i).name
                                     for i in range(array.type.num_fields)],
                                    array.flatten(), strict=True))
                if "path" in children and self.paths is None:
                    self.paths = _binary(children["path"])
                array = children[column.struct]
            if column.kind == "binary":
                self.values[name] = _binary(array)
            elif column.kind == "scalar":
                filler = False if array.type.id == _BOOL_ID else 0
                self.values[name] = (np.asarray(array.fill_null(filler)), _no_offsets,
                                     _validity(array))
            else:
                self.values[name] = _lists(array, column.depth)


_no_offsets = np.zeros(0, np.int64)
_BOOL_ID = 1  # pyarrow's type id of bool (pa.bool_().id), without importing pyarrow here


def _validity(array: Any) -> np.ndarray | None:
    return None if array.null_count == 0 else np.asarray(array.is_valid())


def _binary(array: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(offsets (n + 1) int64, data uint8, valid or None) of a binary or string array."""
    import pyarrow as pa

    t = array.type
    if pa.types.is_fixed_size_binary(t) or not (
            pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t)
            or pa.types.is_large_string(t)):
        array = array.cast(pa.large_binary())  # fixed-size and view layouts
        t = array.type
    buffers = array.buffers()
    n = len(array)
    wide = pa.types.is_large_binary(t) or pa.types.is_large_string(t)
    offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)[
        array.offset:array.offset + n + 1].astype(np.int64)
    data = (np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None
            else np.zeros(0, np.uint8))
    return offsets, data, _validity(array)


def _lists(array: Any, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(offsets (n + 1) of each row's first-axis items, values (items, *inner), valid) of nested
    lists; inner lengths are checked to be one shape."""
    import pyarrow as pa
    import pyarrow.compute as pc

    valid = _validity(array)
    lengths = [np.asarray(pc.list_value_length(array).fill_null(0), np.int64)]
    flat = array
    for _ in range(depth):
        flat = pc.list_flatten(flat)
        if pa.types.is_list(flat.type) or pa.types.is_large_list(flat.type) or \
                pa.types.is_fixed_size_list(flat.type):
            lengths.append(np.asarray(pc.list_value_length(flat).fill_null(0), np.int64))
    if flat.null_count:
        raise ValueError("a null inside an array value")
    values = np.asarray(flat.to_numpy(zero_copy_only=False))
    inner = []
    for level in lengths[1:]:
        if len(level) and (level != level[0]).any():
            raise ValueError("inner lists of different lengths")
        inner.append(int(level[0]) if len(level) else 0)
    offsets = np.concatenate([[0], np.cumsum(lengths[0])]).astype(np.int64)
    return offsets, values.reshape(-1, *inner), valid


class _Reader:
    """One process's open files and cached row groups (shared by its threads)."""

    def __init__(self, source: ParquetSource) -> None:
        self.source = source
        self.lock = threading.Lock()
        self.files: OrderedDict[int, Any] = OrderedDict()
        self.groups: OrderedDict[int, _Group] = OrderedDict()
        self.loading: dict[int, threading.Lock] = {}
        self.cached = 0
        self.reads = 0
        self.rows_read = 0
        self.warned = False

    def group(self, g: int) -> _Group:
        with self.lock:
            found = self.groups.get(g)
            if found is not None:
                self.groups.move_to_end(g)
                return found
            loading = self.loading.setdefault(g, threading.Lock())
        with loading:  # one read per row group, whichever thread asks first
            with self.lock:
                found = self.groups.get(g)
                if found is not None:
                    return found
            group = self._read(g)
            with self.lock:
                self.groups[g] = group
                self.cached += group.nbytes
                while self.cached > self.source.cache_bytes and len(self.groups) > 1:
                    _, dropped = self.groups.popitem(last=False)
                    self.cached -= dropped.nbytes
                self.loading.pop(g, None)
                self.reads += 1
        return group

    def _read(self, g: int) -> _Group:
        source = self.source
        k, rg = int(source._group_file[g]), int(source._group_index[g])
        with source._local(k) as local:
            # A local file stays open for the next row groups; a remote one's cached copy is
            # read while pinned and closed, so that the cache may evict it afterwards.
            keep = source.remote is None
            with self.lock:
                handle = self.files.pop(k, None) if keep else None
            try:
                if handle is None:
                    handle = _pq().ParquetFile(local, memory_map=False, pre_buffer=False)
                table = handle.read_row_group(rg, columns=source._arrow_columns,
                                              use_threads=False)
                group = _Group(table, source._columns)
            except (OSError, ValueError) as exc:
                raise PackFormatError(f"{source.files[k]}: row group {rg} cannot be read "
                                      f"({type(exc).__name__}: {exc}); the file is damaged or "
                                      "truncated") from exc
            finally:
                if handle is not None and not keep:
                    handle.close()
                elif handle is not None:
                    with self.lock:
                        self.files[k] = handle
                        while len(self.files) > _OPEN_FILES:
                            _, old = self.files.popitem(last=False)
                            old.close()
        if group.rows != source._group_rows[g]:
            raise PackFormatError(f"{source.files[k]}: row group {rg} holds {group.rows} rows, "
                                  f"its footer said {source._group_rows[g]}; the file changed "
                                  "while being read")
        return group

    def served(self, rows: int) -> None:
        """Counts rows served, and warns once when row groups are read for few rows each."""
        with self.lock:
            self.rows_read += rows
            thrash = (not self.warned and self.reads >= _THRASH_READS
                      and self.rows_read < _THRASH_ROWS * self.reads
                      and self.source._rows_per_group >= 2 * _THRASH_ROWS)
            if thrash:
                self.warned = True
        if thrash:
            warnings.warn(
                f"{self.source.where}: {self.reads} row groups (of about "
                f"{self.source._rows_per_group:.0f} rows) were read for {self.rows_read} samples:"
                " the order jumps between row groups faster than this process's row group cache "
                f"({self.source.cache_bytes >> 20} MiB) holds them. Read in a shard-aware order "
                "(window= in fastpipe's samplers, docs/object-storage.md) or give the dataset a "
                "larger cache_bytes=", RuntimeWarning, stacklevel=4)

    def close(self) -> None:
        with self.lock:
            for handle in self.files.values():
                handle.close()
            self.files.clear()
            self.groups.clear()
            self.cached = 0


# ------------------------------------------------------------------------------- the source


class ParquetSource(Source):
    """The rows of Parquet files, one record per row, a field per column (all, or ``names`` in
    that order as a tuple).

    ``source``: a file, a list of files, a glob or a folder (see :func:`list_parquet`; ``split``
    picks one of a folder's splits), or the same named by URLs (``s3://``, ``gs://``,
    ``https://``, ``hf://datasets/...``), read through the node's cache as ``remote`` (a
    ``RemoteOptions``) says: their footers by ranges when the source is built, each file
    downloaded whole when a row group of it is first read (``prefetch``, which the samplers
    drive, fetches them ahead in the order they are read). Every file must have the first one's
    columns. ``cache_bytes``: decoded row groups each process keeps (:data:`ROW_GROUP_CACHE`).
    """

    def __init__(self, source: str | os.PathLike | Sequence[str | os.PathLike],
                 names: Sequence[str] | None = None, *, split: str | None = None,
                 cache_bytes: int = ROW_GROUP_CACHE, remote: Any = None) -> None:
        pq = _pq()
        from fastpipe.data.remote.files import in_threads, is_remote
        from fastpipe.data.remote.options import RemoteOptions
        from fastpipe.data.remote.urls import redact

        if isinstance(names, str):
            raise TypeError(f"fields must be a list of field names, got the string {names!r}")
        if not isinstance(cache_bytes, int) or isinstance(cache_bytes, bool) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be an int >= 0, got {cache_bytes!r}")
        self.cache_bytes = cache_bytes
        self.remote = None
        if is_remote(source):
            options = RemoteOptions.of(remote)
            self.remote, self._names = _remote_files(source, split, options)
            self.files = self.remote.names()
            self.root = None
            self.where = redact(os.fspath(source)) if isinstance(source, (str, os.PathLike)) \
                else self.files[0]
            metas = in_threads(lambda k, stop: _remote_footer(self.remote, k, stop),
                               list(range(len(self.files))), options.downloads)
            sizes = [i.size for i in self.remote.infos]
        else:
            if remote is not None:
                raise ValueError("remote= says how URLs are read; these are local files (give "
                                 "URLs, or leave remote=None)")
            self.files, self.root = list_parquet(source, split)
            self._names = [(p.relative_to(self.root) if self.root is not None else p).as_posix()
                           for p in self.files]
            self.where = str(source) if isinstance(source, (str, os.PathLike)) \
                else str(self.files[0])
            metas = []
            for path in self.files:
                try:
                    metas.append(pq.read_metadata(path))
                except (OSError, ValueError) as exc:
                    raise PackFormatError(f"{path} is not a readable Parquet file "
                                          f"({type(exc).__name__}: {exc})") from exc
            sizes = [p.stat().st_size for p in self.files]
        arrow = metas[0].schema.to_arrow_schema()
        for path, meta in zip(self.files[1:], metas[1:], strict=True):
            other = meta.schema.to_arrow_schema()
            if not other.equals(arrow, check_metadata=False):
                raise PackFormatError(f"{path} has other columns than {self.files[0]}: "
                                      f"{_columns_text(other)} against {_columns_text(arrow)}")
        group_rows, group_file, group_index = [], [], []
        for k, meta in enumerate(metas):
            for rg in range(meta.num_row_groups):
                group_rows.append(meta.row_group(rg).num_rows)
                group_file.append(k)
                group_index.append(rg)
        self._group_rows = np.array(group_rows, np.int64)
        self._group_file = np.array(group_file, np.int64)
        self._group_index = np.array(group_index, np.int64)
        self._group_starts = np.concatenate([[0], np.cumsum(self._group_rows)]).astype(np.int64)
        self.count = int(self._group_starts[-1])
        self._file_starts = np.concatenate(
            [[0], np.cumsum([m.num_rows for m in metas])]).astype(np.int64)
        self._rows_per_group = self.count / max(1, len(group_rows))

        available = list(arrow.names)
        wanted = list(names) if names is not None else available
        if unknown := [n for n in wanted if n not in available]:
            raise ValueError(f"{self.where} has no column {unknown[0]!r}; it has "
                             f"{', '.join(available)}")
        features = _hf_features(arrow)
        fields, classes, self._columns = {}, {}, {}
        for name in wanted:
            field, column, names_of = _field_of(
                name, arrow.field(name).type, features.get(name),
                lambda c, child: self._looks_like_image(metas[0], c, child), f"{self.files[0]}")
            fields[name], self._columns[name] = field, column
            if names_of:
                classes[name] = names_of
        self._arrow_columns = list(wanted)
        self.schema = Schema(fields, "tuple" if names is not None else "dict", classes)
        plan = hashlib.sha256()
        if self.remote is not None:
            self.remote.digest(plan)
        for name, size, meta in zip(self._names, sizes, metas, strict=True):
            if self.root is None and self.remote is None:
                name = Path(name).name  # files given by path: their names, not where they are
            rows = ",".join(str(meta.row_group(i).num_rows) for i in range(meta.num_row_groups))
            plan.update(f"{name}\0{size}\0{rows}\1".encode())
        plan.update(str(arrow.remove_metadata()).encode())
        self.meta = {"count": self.count, "order": list(wanted), "record": "dict",
                     "parquet": True, "fields": {n: f.to_json() for n, f in fields.items()},
                     "plan": plan.hexdigest()[:24]}

    @contextlib.contextmanager
    def _local(self, k: int) -> Iterator[str]:
        """The local file of file ``k``: itself, or a remote one's copy in the node's cache
        (downloaded where it is not there), kept from eviction while it is read."""
        if self.remote is None:
            yield str(self.files[k])
            return
        with self.remote.pinned([k]) as (path,):
            yield path

    def _looks_like_image(self, meta: Any, column: str, child: str | None) -> bool:
        """Whether a binary column holds encoded images: its statistics' smallest and largest
        values, or its first value, start as an image file does."""
        path = column if child is None else f"{column}.{child}"
        for rg in range(meta.num_row_groups):
            chunk = next((meta.row_group(rg).column(i) for i in range(meta.num_columns)
                          if meta.row_group(rg).column(i).path_in_schema == path), None)
            stats = chunk.statistics if chunk is not None else None
            if stats is not None and stats.has_min_max:
                return all(_is_image(bytes(v) if not isinstance(v, str) else v.encode(
                    "latin-1", "replace")) for v in (stats.min, stats.max))
        with self._local(0) as local:
            table = next(_pq().ParquetFile(local).iter_batches(batch_size=8, columns=[column]),
                         None)
        if table is None:
            return False
        array = table.column(0)
        if child is not None:
            array = array.field(child)
        first = next((v for v in array.to_pylist() if v), None)
        return first is not None and _is_image(first)

    def prefetch(self, shards: Sequence[int], released: Sequence[int] | None = None,
                 progress: Callable[[], int] | None = None) -> Any:
        """Downloads remote files ``shards`` (positions in ``files``) into the node's cache in
        this order, a few ahead of the readers (``released``, ``progress``:
        :meth:`ShardCache.prefetch`); returns the prefetch (``close()`` stops it). Local
        files: None."""
        return None if self.remote is None else self.remote.prefetch(list(shards), released,
                                                                     progress)

    # ------------------------------------------------------------------------------ reading

    def shard_sizes(self) -> np.ndarray:
        """Rows per file, in index order: the shards a shard-aware order shuffles."""
        return np.diff(self._file_starts)

    def _open(self) -> _Reader:
        return _Reader(self)

    def _close(self, handles: _Reader) -> None:
        handles.close()

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        return self._read_batch(np.array([index], np.int64), names, {})[0]

    def _read_batch(self, indices: np.ndarray, names: Sequence[str],
                    blocks: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        reader: _Reader = self._handles()
        groups = np.searchsorted(self._group_starts, indices, side="right") - 1
        out: list[dict[str, Any]] = [{} for _ in range(len(indices))]
        for g in dict.fromkeys(groups.tolist()):
            group = reader.group(g)
            for k in np.flatnonzero(groups == g).tolist():
                row = int(indices[k] - self._group_starts[g])
                for name in names:
                    value = self._value(group, name, row, int(indices[k]))
                    if name in blocks:
                        blocks[name][k] = value
                    else:
                        out[k][name] = value
        reader.served(len(indices))
        return out

    def _value(self, group: _Group, name: str, row: int, index: int) -> Any:
        column = self._columns[name]
        first, second, valid = group.values[name]
        if valid is not None and not valid[row]:
            if self.schema.fields[name].kind == "image":
                return np.zeros(0, np.uint8)  # no image: the decode refuses it, naming the row
            raise PackFormatError(f"{self.describe(index)}: column {name!r} is null; fastpipe "
                                  "reads no value there (fill it, or leave the column out with "
                                  "fields=[...])")
        if column.kind == "binary":
            return second[first[row]:first[row + 1]]
        if column.kind == "scalar":
            return first[row]
        values = second[first[row]:first[row + 1]]
        field = self.schema.fields[name]
        if values.shape[1:] != tuple(field.shape[1:]) or (
                not field.variable and len(values) != field.shape[0]):
            raise PackFormatError(f"{self.describe(index)}: column {name!r} holds an array of "
                                  f"shape {values.shape}; the field's shape is {field.shape}")
        return values

    def labels(self) -> np.ndarray | None:
        """The label column of every file, as int64 (None when it holds nulls or there is
        none, and for remote files, whose labels would need every file downloaded)."""
        label = self.schema.label
        if label is None or self.schema.fields[label].kind != "int" or self.remote is not None:
            return None
        pq = _pq()
        parts = []
        for path in self.files:
            column = pq.read_table(path, columns=[label], use_threads=False).column(0)
            if column.null_count:
                return None
            parts.append(np.asarray(column.to_numpy(), np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def describe(self, index: int) -> str:
        k = int(np.searchsorted(self._file_starts, index, side="right")) - 1
        row = index - int(self._file_starts[k])
        text = f"{self._names[k]}[row {row}]"
        g = int(np.searchsorted(self._group_starts, index, side="right")) - 1
        try:
            group = self._handles().group(g)
        except Exception:  # noqa: BLE001 - a name must not fail on a damaged file
            return text
        local = index - int(self._group_starts[g])
        if group.paths is not None:
            offsets, data, valid = group.paths
            if valid is None or valid[local]:
                stored = data[offsets[local]:offsets[local + 1]].tobytes().decode(
                    "utf-8", "replace")
                if stored:
                    text += f" ({stored})"
        for name, field in self.schema.fields.items():
            valid = group.values[name][2]
            if field.kind == "image" and valid is not None and not valid[local]:
                text += f" (no image stored in {name!r})"
        return text

    def fingerprint(self) -> str:
        return hashlib.sha256(str(self.meta["plan"]).encode()).hexdigest()[:16]


def _is_image(data: bytes) -> bool:
    return F._is_encoded_image(data[:16])


def _columns_text(schema: Any) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)
