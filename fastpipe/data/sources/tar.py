"""WebDataset tar shards as a source, read in place.

A shard is a plain tar file; consecutive members sharing a key (the path up to the first dot of
the file name) are one sample, and each member's extension names its field (``xxx.jpg`` +
``xxx.cls`` is a sample with fields ``jpg`` and ``cls``), as the webdataset package groups them.
An index of every member's offset and size is built once per shard (a scan of the tar headers)
and cached beside it as ``<shard>.fastpipe-index.npz``; the source reads it when built and keeps
it (worker processes do not read it again), and a batch's members are read through the reader
engine, one pread each, without the GIL.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data import fields as F
from fastpipe.data._format import PackFormatError
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources._engine import (
    DEFAULT_OPEN_FILES,
    Extents,
    FilePool,
    ShortRead,
    read_pieces,
)

__all__ = ["INDEX_SUFFIX", "TarSource", "list_shards", "shard_index"]

INDEX_SUFFIX = ".fastpipe-index.npz"
INDEX_VERSION = 1

_IMAGES = {"jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff", "gif"}
_INTS = {"cls", "cls2", "index", "id", "label"}
_STRS = {"txt", "text", "json", "caption"}
_PICKLES = {"pyd", "pickle", "pkl", "pth", "mp", "msgpack"}
_NPY = "npy"


def list_shards(shards: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The shard files: a list as given, a folder's ``*.tar`` files (sorted), or a glob."""
    if isinstance(shards, (str, os.PathLike)):
        path = Path(shards)
        if path.is_dir():
            found = sorted(path.glob("*.tar"))
            if not found:
                raise FileNotFoundError(f"{path} holds no .tar shards")
            return found
        if path.is_file():
            return [path]
        found = sorted(Path(p) for p in glob.glob(str(shards)))
        if not found:
            raise FileNotFoundError(f"no tar shards match {shards}")
        return found
    paths = [Path(p) for p in shards]
    if not paths:
        raise ValueError("TarDataset needs at least one shard")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"no such shard: {p}")
    return paths


def field_of(extension: str, where: str) -> Any:
    """The field a member's extension implies (the last part after a dot decides); ``.npy``
    members are arrays, whose dtype and shape the first sample's header gives."""
    last = extension.rsplit(".", 1)[-1].lower()
    if last in _PICKLES:
        raise PackFormatError(f"{where} is a {last} member: fastpipe does not unpickle (it would "
                              "run code from the file); leave the field out with fields=[...]")
    if last in _IMAGES:
        return F.ImageField()
    if last in _INTS:
        return F.IntField("int64")
    if last in _STRS:
        return F.StrField()
    if last == _NPY:
        return None  # from the first member's header
    return F.BytesField()


def _split(name: str) -> tuple[str, str] | None:
    """(key, field) of a member name; None for names without an extension."""
    directory, _, base = name.rpartition("/")
    if "." not in base or base.startswith("."):
        return None
    stem, extension = base.split(".", 1)
    return (f"{directory}/{stem}" if directory else stem), extension


def _scan(shard: Path) -> dict[str, np.ndarray]:
    """Every sample of a shard: keys, and per member its sample, field, data offset and size."""
    keys: list[str] = []
    samples, fields, offsets, sizes = [], [], [], []
    try:
        with tarfile.open(shard, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                split = _split(member.name)
                if split is None:
                    continue
                key, field = split
                if not keys or keys[-1] != key:
                    keys.append(key)
                samples.append(len(keys) - 1)
                fields.append(field)
                offsets.append(member.offset_data)
                sizes.append(member.size)
    except tarfile.TarError as exc:
        raise PackFormatError(f"{shard} is not a readable tar file ({exc})") from exc
    return {"keys": np.array(keys, dtype=str), "sample": np.array(samples, np.int64),
            "field": np.array(fields, dtype=str), "offset": np.array(offsets, np.int64),
            "size": np.array(sizes, np.int64)}


def shard_index(shard: Path) -> dict[str, np.ndarray]:
    """The shard's index, from its cache when the shard is unchanged (same size and mtime)."""
    st = shard.stat()
    stamp = np.array([INDEX_VERSION, st.st_size, st.st_mtime_ns], np.int64)
    cache = shard.with_name(shard.name + INDEX_SUFFIX)
    try:
        with np.load(cache, allow_pickle=False) as saved:
            if np.array_equal(saved["stamp"], stamp):
                return {k: saved[k] for k in ("keys", "sample", "field", "offset", "size")}
    except (OSError, ValueError, KeyError):
        pass  # no cache yet, or one of another shard state: rebuild
    index = _scan(shard)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, stamp=stamp, **index)
        os.replace(tmp, cache)
    except OSError:  # a read-only folder: the index lives in memory only
        tmp.unlink(missing_ok=True)
    return index


class TarSource(Source):
    """The samples of tar shards, one record per key, fields named by extension: images
    (``jpg``, ``png``, ...) and other bytes as stored, ``cls``/``index``/``id``/``label`` as ints,
    ``txt``/``json`` strings, ``npy`` arrays; pickles refused. ``names`` picks the fields (the
    first sample's by default); every sample needs each of them once."""

    def __init__(self, shards: str | os.PathLike | Sequence[str | os.PathLike],
                 names: Sequence[str] | None = None, *,
                 open_files: int = DEFAULT_OPEN_FILES) -> None:
        self.shards = list_shards(shards)
        self.where = str(shards) if isinstance(shards, (str, os.PathLike)) else str(self.shards[0])
        self.open_files = open_files
        if isinstance(names, str):
            raise TypeError(f"fields must be a list of field names, got the string {names!r}")
        starts = [0]
        per_field: dict[str, list[tuple[np.ndarray, np.ndarray, int]]] = {}
        found: dict[str, Any] = {}
        keys, key_offsets = [], [np.zeros(1, np.int64)]
        for k, shard in enumerate(self.shards):
            index = shard_index(shard)
            n = len(index["keys"])
            wanted = list(names) if names is not None else (
                sorted(set(index["field"][index["sample"] == 0].tolist())) if not found and n
                else list(found))
            for name in wanted:
                rows = np.flatnonzero(index["field"] == name)
                have = np.zeros(n, bool)
                have[index["sample"][rows]] = True
                if not have.all():
                    missing = int(np.flatnonzero(~have)[0])
                    raise PackFormatError(
                        f"sample {str(index['keys'][missing])!r} of {shard} has no {name!r} "
                        "member; every sample needs the fields read (pick them with "
                        "fields=[...])")
                if len(rows) != n:
                    raise PackFormatError(f"a sample of {shard} has several {name!r} members")
                order = np.argsort(index["sample"][rows], kind="stable")
                per_field.setdefault(name, []).append(
                    (index["offset"][rows][order], index["size"][rows][order], k))
                if name not in found:
                    found[name] = field_of(name, f"{shard}: {name!r}")
            encoded = [key.encode("utf-8", "surrogateescape") for key in index["keys"].tolist()]
            keys.append(b"".join(encoded))
            key_offsets.append(key_offsets[-1][-1] + np.cumsum([len(e) for e in encoded],
                                                               dtype=np.int64))
            starts.append(starts[-1] + n)
        self.count = starts[-1]
        self._starts = np.array(starts, np.int64)
        self._keys = np.frombuffer(b"".join(keys), np.uint8)
        self._key_offsets = np.concatenate(key_offsets)
        order = list(names) if names is not None else list(found)
        # Each member is a run of bytes of its shard: a field is an Extents of one-byte rows, its
        # sample i the rows offsets[i]:offsets[i+1] of a virtual flat array of the members.
        self._columns: dict[str, tuple[Extents, np.ndarray]] = {}
        for name in order:
            parts = per_field.get(name, [])
            member_offsets = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, int)
            member_sizes = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, int)
            shard_of = np.concatenate([np.full(len(p[0]), p[2], np.int64) for p in parts]) \
                if parts else np.zeros(0, np.int64)
            ends = np.concatenate([[0], np.cumsum(member_sizes, dtype=np.int64)])
            extents = Extents(ends, shard_of, member_offsets.astype(np.int64), 1)
            self._columns[name] = (extents, ends)
        fields = {n: found[n] for n in order}
        for name, field in fields.items():
            if field is None:
                fields[name] = self._npy_field(name)
        plan = hashlib.sha256()
        for shard in self.shards:
            st = shard.stat()
            plan.update(f"{shard.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\1".encode())
        self.meta = {"count": self.count, "order": order, "record": "dict", "tar": True,
                     "fields": {n: f.to_json() for n, f in fields.items()},
                     "plan": plan.hexdigest()[:24]}
        self.schema = Schema(fields, "tuple" if names is not None else "dict")

    def _npy_field(self, name: str) -> Any:
        """An ``.npy`` member's field: its dtype and shape from the first sample's header,
        variable along the first axis."""
        if not self.count:
            return F.ArrayField("uint8", (None,))
        self.schema = Schema({name: F.BytesField()})
        raw = self._read_members(np.array([0], np.int64), name)[0]
        try:
            array = np.load(io.BytesIO(raw.tobytes()), allow_pickle=False)
        except ValueError as exc:
            raise PackFormatError(f"the {name!r} member of {self.describe(0)} is not a .npy "
                                  f"array ({exc})") from exc
        return F.ArrayField(array.dtype.name, (None, *array.shape[1:]) if array.ndim else ())

    def _open(self) -> FilePool:
        return FilePool([str(s) for s in self.shards], self.open_files)

    def _close(self, handles: FilePool) -> None:
        handles.close()

    def _read_members(self, indices: np.ndarray, name: str) -> list[np.ndarray]:
        extents, ends = self._columns[name]
        first, stop = ends[indices], ends[indices + 1]
        sizes = stop - first
        dest = np.cumsum(sizes) - sizes
        flat = np.empty(int(sizes.sum()), np.uint8)
        try:
            read_pieces(self._handles(), extents.pieces(first, stop, dest), flat)
        except ShortRead as exc:
            raise PackFormatError(f"{exc.path} is truncated: a member of it runs past its end "
                                  "(short read)") from None
        return [flat[a:a + n] for a, n in zip(dest.tolist(), sizes.tolist(), strict=True)]

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        return self._read_batch(np.array([index], np.int64), names, {})[0]

    def _read_batch(self, indices: np.ndarray, names: Sequence[str],
                    blocks: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{} for _ in range(len(indices))]
        for name in names:
            field = self.schema.fields[name]
            for k, raw in enumerate(self._read_members(indices, name)):
                value = self._stored(field, raw, name, int(indices[k]))
                if name in blocks:
                    blocks[name][k] = value
                else:
                    out[k][name] = value
        return out

    def _stored(self, field: Any, raw: np.ndarray, name: str, index: int) -> Any:
        if field.kind == "int":
            text = raw.tobytes().strip()
            try:
                return np.asarray(int(text), "<i8")
            except ValueError as exc:
                raise PackFormatError(f"the {name!r} member of {self.describe(index)} is "
                                      f"{text[:40]!r}, not an integer") from exc
        if field.kind == "array":
            try:
                array = np.load(io.BytesIO(raw.tobytes()), allow_pickle=False)
            except ValueError as exc:
                raise PackFormatError(f"the {name!r} member of {self.describe(index)} is not a "
                                      f".npy array ({exc})") from exc
            try:
                return field.encode(array, f"the {name!r} member of {self.describe(index)}")
            except F.FieldError as exc:
                raise PackFormatError(str(exc)) from exc
        return raw

    def describe(self, index: int) -> str:
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        key = self._keys[self._key_offsets[index]:self._key_offsets[index + 1]].tobytes()
        return f"{self.shards[k]}:{key.decode('utf-8', 'surrogateescape')}"

    def fingerprint(self) -> str:
        return hashlib.sha256(str(self.meta["plan"]).encode()).hexdigest()[:16]
