"""WebDataset tar shards read in place: ``TarDataset`` (map-style, random access) and its reader.

A shard is a plain tar file; consecutive members sharing a key (the path up to the first dot of
the file name) are one sample, and each member's extension names its field (``xxx.jpg`` +
``xxx.cls`` is a sample with fields ``jpg`` and ``cls``), as the webdataset package groups them.
An index of every member's offset and size is built once per shard (a scan of the tar headers)
and cached beside it as ``<shard>.fastpipe-index.npz``, so samples are read at random with one
``os.preadv`` each, ``DistributedSampler`` shards them, and the fast image decode reads the
JPEG bytes straight from the tar.
"""

from __future__ import annotations

import glob
import hashlib
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data import fields as F
from fastpipe.data._format import PackFormatError
from fastpipe.data._pack_dataset import PackDataset

__all__ = ["TarDataset"]

INDEX_SUFFIX = ".fastpipe-index.npz"
INDEX_VERSION = 1

_IMAGES = {"jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff", "gif"}
_INTS = {"cls", "cls2", "index", "id", "label"}
_STRS = {"txt", "text", "json", "caption"}
_PICKLES = {"pyd", "pickle", "pkl", "pth", "mp", "msgpack"}


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


def field_of(extension: str, where: str) -> F.Field:
    """The field kind a member's extension implies (the last part after a dot decides)."""
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
    if last == "npy":
        return _NpyField()
    return F.BytesField()


class _NpyField(F.Field):
    """A ``.npy`` member: any dtype and shape, returned as a tensor."""

    kind = "npy"

    def value(self, stored: Any) -> Any:
        return F.ArrayField(stored.dtype.name, stored.shape).value(stored)


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


class TarReader:
    """Reads samples of tar shards at random in one process; the interface of the HDF5 records
    reader (``read(i, field)`` returns a field's stored form)."""

    def __init__(self, shards: Sequence[Path], names: Sequence[str] | None = None) -> None:
        self.shards = list(shards)
        self.path = self.shards[0]
        starts, member_of, fields_seen = [0], [], {}
        self._columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        per_field: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self._keys: list[np.ndarray] = []
        for k, shard in enumerate(self.shards):
            index = shard_index(shard)
            n = len(index["keys"])
            self._keys.append(index["keys"])
            wanted = names or (sorted(set(index["field"][index["sample"] == 0].tolist()))
                               if not fields_seen and n else list(fields_seen))
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
                shard_ids = np.full(n, k, np.int32)
                per_field.setdefault(name, []).append(
                    (shard_ids, index["offset"][rows][order], index["size"][rows][order]))
                fields_seen.setdefault(name, field_of(name, f"{shard}: {name!r}"))
            starts.append(starts[-1] + n)
            member_of.append(n)
        self.count = starts[-1]
        self._starts = np.array(starts, np.int64)
        self.order = list(names or fields_seen)
        self.fields = {n: fields_seen[n] for n in self.order}
        for name in self.order:
            parts = per_field[name]
            self._columns[name] = tuple(np.concatenate([p[j] for p in parts]) for j in range(3))
        plan = hashlib.sha256()
        for shard in self.shards:
            st = shard.stat()
            plan.update(f"{shard.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\1".encode())
        self.meta = {"count": self.count, "order": self.order, "record": "dict", "tar": True,
                     "fields": {n: {"kind": f.kind} for n, f in self.fields.items()},
                     "plan": plan.hexdigest()[:24]}
        self.classes: dict[str, list[str]] = {}
        self._fds: dict[int, int] = {}

    def _check_index(self, index: int) -> int:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        i = int(index) + (self.count if index < 0 else 0)
        if not 0 <= i < self.count:
            raise IndexError(f"index {index} is out of range for {self.count} samples")
        return i

    def _bytes(self, index: int, name: str) -> np.ndarray:
        shard_ids, offsets, sizes = self._columns[name]
        k = int(shard_ids[index])
        fd = self._fds.get(k)
        if fd is None:
            fd = self._fds[k] = os.open(self.shards[k], os.O_RDONLY)
        out = np.empty(int(sizes[index]), np.uint8)
        if out.nbytes and os.preadv(fd, [out], int(offsets[index])) != out.nbytes:
            raise PackFormatError(f"{self.shards[k]} is truncated (short read)")
        return out

    def read(self, index: int, name: str) -> Any:
        data = self._bytes(index, name)
        field = self.fields[name]
        if field.kind == "int":
            text = data.tobytes().strip()
            try:
                return np.asarray(int(text), "<i8")
            except ValueError as exc:
                raise PackFormatError(f"the {name!r} member of {self.source(index)} is "
                                      f"{text[:40]!r}, not an integer") from exc
        if field.kind == "npy":
            import io

            return np.load(io.BytesIO(data.tobytes()), allow_pickle=False)
        return data

    def read_block(self, name: str, start: int, stop: int) -> np.ndarray:
        return np.stack([self.read(i, name) for i in range(start, stop)])

    def source(self, index: int) -> str:
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        return f"{self.shards[k]}:{str(self._keys[k][index - self._starts[k]])}"

    def sources(self, start: int, stop: int) -> list[str]:
        return [self.source(i) for i in range(start, stop)]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TarDataset(PackDataset):
    """Reads WebDataset tar shards in place: ``dataset[i] -> {"jpg": image, "cls": label, ...}``.

    ``shards``: a folder (its ``*.tar`` files), a glob (``"train/shard-*.tar"``), a shard, or a
    list of shards. Fields are named by the members' extensions: images (``jpg``, ``png``, ...)
    decode like :class:`~fastpipe.data.H5Dataset`'s (``recipe=`` for fastpipe's fast path),
    ``cls``/``index``/``id`` are ints, ``txt``/``json`` strings, ``npy`` arrays, the rest bytes;
    pickles are refused. ``fields=["jpg", "cls"]`` picks and orders them and returns a tuple;
    ``joint=`` crops the image fields together, as in :class:`~fastpipe.data.H5Dataset`.

    The index is built once per shard and cached beside it; workers (fork, spawn, threads) open
    their own file descriptors.
    """

    _format = "tar"

    def __init__(self, shards: str | os.PathLike | Sequence[str | os.PathLike],
                 decoder: Any = None, transform: Any = None, auto_augment: str | None = None,
                 seed: int | None = None, *, recipe: Any = None,
                 fields: Sequence[str] | None = None, joint: Any = None) -> None:
        self._shards = list_shards(shards)
        super().__init__(self._shards[0], decoder, transform, auto_augment, seed, recipe=recipe,
                         fields=fields, joint=joint)
        self.file = Path(shards) if isinstance(shards, (str, os.PathLike)) else self._shards[0]

    def _open(self) -> TarReader:
        return TarReader(self._shards, self._fields_arg)

    def __repr__(self) -> str:
        return (f"TarDataset({len(self._shards)} shards, samples={len(self)}, "
                f"fields={list(self.fields or [])})")


class TarRecords:
    """The samples of tar shards as stored (images and other bytes unchanged, ``cls`` as ints,
    text as strings): what ``fastpipe.pack.pack`` packs from shards."""

    def __init__(self, shards: str | os.PathLike | Sequence[str | os.PathLike]) -> None:
        self.shards = list_shards(shards)
        with TarReader(self.shards) as reader:
            self._count = reader.count
        self._reader: TarReader | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> dict[str, Any]:
        reader = self._reader_here()
        i = reader._check_index(index)
        out = {}
        for name, field in reader.fields.items():
            stored = reader.read(i, name)
            out[name] = stored.tobytes() if field.kind == "image" else field.value(stored)
        return out

    def _reader_here(self) -> TarReader:
        if self._reader is None or self._pid != os.getpid():
            self._reader, self._pid = TarReader(self.shards), os.getpid()
        return self._reader

    def describe(self, index: int) -> str:
        """``shard:key`` of sample ``index``."""
        return self._reader_here().source(index)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _reader=None, _pid=None)
