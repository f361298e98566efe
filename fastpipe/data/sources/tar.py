"""WebDataset tar shards as a source, read in place.

A shard is a plain tar file; consecutive members sharing a key (the path up to the first dot of
the file name) are one sample, and each member's extension names its field (``xxx.jpg`` +
``xxx.cls`` is a sample with fields ``jpg`` and ``cls``), as the webdataset package groups them.
An index of every member's offset and size is built once per shard (a scan of the tar headers)
and cached beside it as ``<shard>.fastpipe-index.npz``, or, where the shard's folder cannot be
written (a read-only mount), in the cache folder (``RemoteOptions.cache_dir``: built once per
node, under a lock, and shared by every process); the source reads it when built and keeps it
(worker processes do not read it again), and a batch's members are read through the reader
engine, one pread each, without the GIL.

Shards named by URLs (``s3://bucket/train/shard-{000000..000099}.tar``, a folder, a pattern)
are read through the node's cache (fastpipe.data.remote): their indexes are built once per node
into the cache folder, and each batch's shards are downloaded where the cache does not hold
them, and kept from eviction while read.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe._progress import progress_bar
from fastpipe.data.format import fields as F
from fastpipe.data.format.layout import PackFormatError
from fastpipe.data.remote import locks
from fastpipe.data.remote.cache import add_unpin_hook
from fastpipe.data.remote.files import RemoteFiles, in_threads, is_remote
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.urls import entry_key, parent, redact
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources._engine import (
    FilePool,
    Pieces,
    ShortRead,
    read_pieces,
)
from fastpipe.data.sources.shardlist import KIND as SHARD_LIST_KIND
from fastpipe.data.sources.shardlist import ShardList, is_shard_list, read_shard_list
from fastpipe.data.sources.tarheaders import Headers, plain_headers

__all__ = ["INDEX_SUFFIX", "TarSource", "index_folder", "list_shards", "shard_index",
           "write_shard_list"]

INDEX_SUFFIX = ".fastpipe-index.npz"
INDEX_VERSION = 2  # 2: every header chain tarfile reads, with its CRC-32 (1 is rescanned)

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


def _scan(shard: Path, name: str | None = None) -> dict[str, np.ndarray]:
    """Every sample of a shard: keys, and per member its sample, field, data offset and size;
    and every header chain tarfile reads (see :func:`_index_fits`).

    Bounded: a member whose size is negative (base-256) or reaches past the end of the file, or
    whose header does not move forward (on which tarfile would seek back to the same header for
    ever), a long-name or pax header declaring more bytes than the file holds (tarfile would
    read that many), ends the scan with an error naming the shard and the member; a sparse
    member (GNU sparse: its data is a map plus the blocks it lists, not the file's bytes) is
    refused. Messages name the shard ``name`` (its URL), or its path.

    A shard of plain headers only (nearly all) is read without tarfile (see
    :mod:`~fastpipe.data.sources.tarheaders`), to the same index."""
    shown = name or str(shard)
    end = shard.stat().st_size
    plain = plain_headers(str(shard), end)
    if plain is not None:
        return _plain_index(shard, plain, end, shown)
    return _tarfile_index(shard, end, shown)


def _tarfile_index(shard: Path, end: int, shown: str) -> dict[str, np.ndarray]:
    """:func:`_scan`'s index as tarfile reads the shard's headers."""
    files: list[tuple[str, int, int, int]] = []
    chain_start, chain_len = [], []
    last = -1
    start = 0  # where tarfile reads the next member's headers (its L, K, x and g headers first)
    try:
        with open(shard, "rb") as f, tarfile.open(fileobj=_Bounded(f, end, shown),
                                                  mode="r:") as tar:
            for member in tar:
                where = f"{shown}: member {member.name!r}"
                if member.offset <= last or member.offset < start:
                    raise PackFormatError(f"{where} does not follow the one before it (header at "
                                          f"byte {member.offset}); the tar file is damaged")
                last = member.offset
                if member.size < 0 or member.offset_data + member.size > end:
                    raise PackFormatError(f"{where} declares {member.size} bytes at byte "
                                          f"{member.offset_data} of a {end}-byte file; the tar "
                                          "file is damaged or cut short")
                if member.issparse():
                    raise PackFormatError(f"{where} is a sparse file, stored as a map of its "
                                          "blocks: fastpipe reads members as they are stored; "
                                          "write the shard without sparse files (tar without -S)")
                chain_start.append(start)
                chain_len.append(member.offset_data - start)
                start = tar.offset
                if member.isfile():
                    files.append((member.name, member.offset_data, member.size,
                                  len(chain_start) - 1))
            after = tar.offset
            _check_end(shard, after, end, shown)
    except (tarfile.TarError, OSError, ValueError, EOFError, OverflowError,
            MemoryError) as exc:
        if isinstance(exc, PackFormatError):
            raise
        # OverflowError, MemoryError: a size tarfile took from a header (a long-name or pax
        # header's) past what a read can ask for or this machine can hold.
        raise PackFormatError(f"{shown} is not a readable tar file: reading the member headers "
                              f"at byte {start} raised {type(exc).__name__}: {exc}; the tar "
                              "file is damaged") from exc
    starts = np.array(chain_start, np.int64)
    lengths = np.array(chain_len, np.int64)
    crcs = _chain_crcs(shard, starts, lengths)
    if crcs is None:
        raise PackFormatError(f"{shown} changed while it was scanned (a short read); scan it "
                              "again once it is written")
    return _index(files, starts, lengths, crcs, after)


def _plain_index(shard: Path, plain: Headers, end: int, shown: str) -> dict[str, np.ndarray]:
    """The index :func:`_scan` makes, of a shard whose headers are all plain (a member's header
    chain: its pax header, if any, and its own)."""
    _check_end(shard, plain.end, end, shown)
    files = [(name, at, size, k) for k, (name, at, size) in enumerate(
        zip(plain.names, plain.data, plain.sizes, strict=True)) if name is not None]
    starts = np.array(plain.starts, np.int64)
    return _index(files, starts, np.array(plain.data, np.int64) - starts,
                  np.array(plain.crcs, np.int64), plain.end)


def _index(files: list[tuple[str, int, int, int]], chain_start: np.ndarray,
           chain_len: np.ndarray, chain_crc: np.ndarray, end: int) -> dict[str, np.ndarray]:
    """The index of a shard's regular ``files`` (name, data offset, size, header chain), in
    order: a sample is consecutive members sharing a key; names without an extension are no
    member of any."""
    keys: list[str] = []
    samples, fields, offsets, sizes, chain_of = [], [], [], [], []
    for name, offset, size, chain in files:
        split = _split(name)
        if split is None:
            continue
        key, field = split
        if not keys or keys[-1] != key:
            keys.append(key)
        samples.append(len(keys) - 1)
        fields.append(field)
        offsets.append(offset)
        sizes.append(size)
        chain_of.append(chain)
    return {"keys": np.array(keys, dtype=str), "sample": np.array(samples, np.int64),
            "field": np.array(fields, dtype=str), "offset": np.array(offsets, np.int64),
            "size": np.array(sizes, np.int64), "chain": np.array(chain_of, np.int64),
            "chain_start": chain_start, "chain_len": chain_len, "chain_crc": chain_crc,
            "end": np.array([end], np.int64)}


class _Bounded:
    """The shard's file as tarfile reads it: a read of more than the file holds past a block
    (a long-name or pax header's declared size, which tarfile reads whole, allocating it first),
    or of a negative size (read to the end), is damage, refused before anything is allocated."""

    def __init__(self, f: Any, size: int, shown: str) -> None:
        self._f, self._size, self._shown = f, size, shown

    def read(self, n: int = -1) -> bytes:
        at = self._f.tell()
        if n is None or n < 0 or n > tarfile.BLOCKSIZE and n > self._size - at:
            raise PackFormatError(
                f"{self._shown}: the header before byte {at} declares {n} bytes of extended "
                f"header data (a long name or pax records), past the end of the {self._size}-"
                "byte file; the tar file is damaged or cut short")
        return self._f.read(n)

    def seek(self, *args: int) -> int:
        return self._f.seek(*args)

    def tell(self) -> int:
        return self._f.tell()


# Header chains are read and checked this many bytes at a time.
_CHAIN_READ = 8 << 20


def _chain_crcs(shard: Path, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """The CRC-32 of each byte range ``[starts[k], starts[k] + lengths[k])`` of ``shard`` (the
    ranges in order, not overlapping), read through the reader engine a few MiB at a time; None
    where the file ends first."""
    out = np.zeros(len(starts), np.int64)
    pool = FilePool([os.path.realpath(shard)])
    pool.close()  # a descriptor or mapping of an earlier file at this path is not this one's
    try:
        first = 0
        while first < len(starts):
            ends = np.cumsum(lengths[first:])
            stop = first + max(1, int(np.searchsorted(ends, _CHAIN_READ, side="right")))
            sizes = lengths[first:stop]
            dest = np.cumsum(sizes) - sizes
            buf = np.empty(int(sizes.sum()), np.uint8)
            read_pieces(pool, Pieces(np.zeros(len(sizes), np.int64), starts[first:stop], sizes,
                                     dest), buf)
            view = memoryview(buf)
            out[first:stop] = [zlib.crc32(view[a:a + n]) for a, n in zip(
                dest.tolist(), sizes.tolist(), strict=True)]
            first = stop
    except ShortRead:
        return None
    finally:
        pool.close()
    return out


def _check_end(shard: Path, after: int, end: int, shown: str) -> None:
    """tarfile stops quietly at a header cut short or damaged past the first member: what
    follows the last member it read must be the end of the archive (zero blocks, padding)."""
    rest = end - after
    if rest <= 0:
        return
    with open(shard, "rb") as f:
        f.seek(after)
        tail = f.read(min(rest, 1 << 20))
    if rest > len(tail) or tail.count(0) != len(tail):
        raise PackFormatError(
            f"{shown}: {rest} bytes after byte {after}, where the members tarfile can read end, "
            "are not the end of a tar archive: a header there is cut short or damaged, and the "
            "members after it would be lost; the shard is damaged")


# Per member: "sample", "field", "offset" (of its data), "size", "chain" (its header chain);
# per header chain (every member tarfile reads, skipped ones too): "chain_start", "chain_len"
# (the bytes from where tarfile reads its first header to where its data begins) and
# "chain_crc"; "end", where tarfile stopped (zero blocks from there on).
_INDEX_KEYS = ("keys", "sample", "field", "offset", "size", "chain", "chain_start", "chain_len",
               "chain_crc", "end")


def index_folder(options: RemoteOptions | None = None) -> Path:
    """Where indexes go that cannot be written beside their shard (a read-only folder, a
    remote shard): ``indexes/`` in the cache folder."""
    return Path(RemoteOptions.of(options).cache_dir) / "indexes"


def shard_index(shard: Path, remote: RemoteOptions | None = None) -> dict[str, np.ndarray]:
    """The shard's index: from its cache when the cache is one of this shard (this index
    version, same size and mtime, unedited, and every header tarfile read at the same place with
    the same bytes: :func:`_index_fits`; a shard rewritten with its size and mtime kept, or a
    forged cache, is scanned again), else
    scanned and cached: beside the shard, or, where its folder cannot be written, in
    :func:`index_folder` (built there once per node: other processes wait for it)."""
    st = shard.stat()
    stamp = np.array([INDEX_VERSION, st.st_size, st.st_mtime_ns], np.int64)
    beside = shard.with_name(shard.name + INDEX_SUFFIX)
    real = os.path.realpath(shard)
    elsewhere = index_folder(remote) / (entry_key("file://" + real) + INDEX_SUFFIX)
    for cache in (beside, elsewhere):
        index = _load_index(cache, stamp, None)
        if index is not None and _index_fits(shard, index, st.st_size):
            return index
    if os.access(shard.parent, os.W_OK):
        index = _scan(shard)
        if _save_index(beside, stamp, index, None):
            return index
    else:
        index = None
    # A read-only folder: the index goes to the cache folder, built by one process of the node.
    os.makedirs(elsewhere.parent, exist_ok=True)
    fd = locks.lock(str(elsewhere) + ".lock", shared=False)
    try:
        found = _load_index(elsewhere, stamp, None)
        if found is not None and _index_fits(shard, found, st.st_size):
            return found
        index = index if index is not None else _scan(shard)
        _save_index(elsewhere, stamp, index, None)
    finally:
        locks.unlock(fd)
    return index


def _load_index(path: Path, stamp: np.ndarray, etag: str | None) -> dict[str, np.ndarray] | None:
    """The index saved at ``path`` where its stamp (and the object's ETag) is ``stamp``."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            if not np.array_equal(saved["stamp"], stamp):
                return None
            if etag is not None and str(saved["etag"]) != etag:
                return None
            index = {k: saved[k] for k in _INDEX_KEYS}
            if str(saved["digest"]) != _digest(index):
                return None  # edited or damaged since it was written
            return index
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None  # no cache yet, one of another shard state, or damaged: rebuild


def _digest(index: dict[str, np.ndarray]) -> str:
    """A hash of the index's arrays as the scan made them: what the shard's headers cannot
    vouch for (a member's exact size within its last block) is vouched for by the scan."""
    digest = hashlib.sha256()
    for key in _INDEX_KEYS:
        array = np.ascontiguousarray(index[key])
        digest.update(f"{key}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _save_index(path: Path, stamp: np.ndarray, index: dict[str, np.ndarray],
                etag: str | None) -> bool:
    """Writes the index (whole, then renamed into place); False where the folder refuses."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    extra = {} if etag is None else {"etag": np.array(etag)}
    extra["digest"] = np.array(_digest(index))
    try:
        with open(tmp, "wb") as f:
            np.savez(f, stamp=stamp, **extra, **index)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # a read-only file system refuses even the unlink of nothing
            pass
        return False
    return True


def _remote_indexes(files: RemoteFiles) -> list[dict[str, np.ndarray]]:
    """Every remote shard's index (:func:`_remote_index`), ``files.at_once()`` at a time. A
    shard not indexed on this node yet is downloaded to be indexed, which can take long for a
    large dataset: the progress goes to stderr, as the commands' does."""
    missing = sum(not _index_path(files, k).exists() for k in range(len(files.paths)))
    with progress_bar(bool(missing), total=len(files.paths), unit="shards",
                      desc=f"indexing {missing} remote tar shards (each downloaded once per "
                           "node; later builds read the indexes; a shard list avoids this: "
                           "docs/object-storage.md)") as bar:
        return in_threads(lambda k, stop: _remote_index(files, k, stop),
                          range(len(files.paths)), files.at_once(), done=lambda: bar.update(1))


def _index_path(files: RemoteFiles, k: int) -> Path:
    """Where remote shard ``k``'s index is kept in the node's cache."""
    return index_folder(files.options) / (entry_key(files.infos[k].url,
                                                    files.options.endpoint()) + INDEX_SUFFIX)


def _remote_index(files: RemoteFiles, k: int, stop: threading.Event | None = None
                  ) -> dict[str, np.ndarray]:
    """The index of remote shard ``k``: from the cache folder (keyed by the object's URL, size
    and ETag; checked against the shard's member headers when the shard is in the cache), else
    built from the shard, downloaded into the cache, by one process of the node."""
    found = files.infos[k]
    url = found.url
    path = _index_path(files, k)
    stamp = np.array([INDEX_VERSION, found.size, 0], np.int64)
    etag = found.etag or ""
    cache = files.cache
    index = _load_index(path, stamp, etag)
    if index is not None and not cache.holds(url):
        return index  # the size and ETag name the bytes it was built from
    if index is not None:
        with files.pinned([k], stop=stop) as (local,):
            if _index_fits(Path(local), index, found.size):
                return index
    os.makedirs(path.parent, exist_ok=True)
    fd = locks.lock(str(path) + ".lock", shared=False, stop=stop)
    try:
        index = _load_index(path, stamp, etag)
        with files.pinned([k], stop=stop) as (local,):
            if index is None or not _index_fits(Path(local), index, found.size):
                index = _scan(Path(local), redact(url))
                _save_index(path, stamp, index, etag)
    finally:
        locks.unlock(fd)
    return index


def _index_fits(shard: Path, index: dict[str, np.ndarray], size: int) -> bool:
    """Whether a cached index describes ``shard`` (of ``size`` bytes) as a scan of it would: the
    arrays consistent, every header chain tarfile read when it was built (long-name, pax and
    global headers, the member's own, skipped members' too) holding the same bytes at the same
    place (its CRC-32; all read a few MiB at a time), each member's data right after its chain
    and, for the members indexed, the next chain right after their data (so that their sizes
    are the file's, without parsing a size field), and zero blocks from where tarfile stopped
    to the end of the file. The same header bytes at the same places are read the same way by
    tarfile: the scan would find what the index holds."""
    keys, sample, field = index["keys"], index["sample"], index["field"]
    offset, length, chain = index["offset"], index["size"], index["chain"]
    start, span, crc, end = (index["chain_start"], index["chain_len"], index["chain_crc"],
                             index["end"])
    ints = (sample, offset, length, chain, start, span, crc, end)
    n, m = len(sample), len(start)
    if not (keys.dtype.kind == field.dtype.kind == "U" and all(a.dtype.kind == "i" for a in ints)
            and all(a.ndim == 1 for a in (keys, field, *ints))
            and len(field) == len(offset) == len(length) == len(chain) == n
            and len(span) == len(crc) == m and len(end) == 1):
        return False
    stop = int(end[0])
    if not m:
        return n == 0 and len(keys) == 0 and stop == 0 and _zeros_after(shard, 0, size)
    if not ((start >= 0).all() and (start <= size).all() and (span <= size).all()):
        return False  # (no sum below can overflow)
    chain_end = start + span
    if not (start[0] == 0 and (span >= 512).all() and (start % 512 == 0).all()
            and (span % 512 == 0).all() and (start[1:] >= chain_end[:-1]).all()
            and chain_end[-1] <= stop <= size):
        return False
    if n and not (sample[0] == 0 and (np.diff(sample) >= 0).all()
                  and (np.diff(sample) <= 1).all() and sample[-1] == len(keys) - 1
                  and (chain >= 0).all() and (chain < m).all() and (np.diff(chain) > 0).all()
                  and (length >= 0).all() and (length <= size).all()):
        return False
    if not n and len(keys):
        return False
    following = np.append(start[1:], stop)
    if n and not ((offset == chain_end[chain]).all()
                  and (following[chain] == offset + (length + 511) // 512 * 512).all()):
        return False
    found = _chain_crcs(shard, start, span)
    return found is not None and np.array_equal(found, crc) and _zeros_after(shard, stop, size)


def _zeros_after(shard: Path, stop: int, size: int) -> bool:
    try:
        _check_end(shard, stop, size, str(shard))
    except (PackFormatError, OSError):
        return False
    return True


class TarSource(Source):
    """The samples of tar shards, one record per key, fields named by extension: images
    (``jpg``, ``png``, ...) and other bytes as stored, ``cls``/``index``/``id``/``label`` as ints,
    ``txt``/``json`` strings, ``npy`` arrays; pickles refused. ``names`` picks the fields (the
    first sample's by default); every sample needs each of them once.

    ``shards`` may be a shard list (a ``.json`` file: fastpipe.data.sources.shardlist): then
    only the first shard is indexed here, each other one when it is first read."""

    def __init__(self, shards: str | os.PathLike | Sequence[str | os.PathLike],
                 names: Sequence[str] | None = None,
                 remote: RemoteOptions | None = None) -> None:
        if isinstance(names, str):
            raise TypeError(f"fields must be a list of field names, got the string {names!r}")
        self.remote: RemoteFiles | None = None
        self._options = remote
        listed = read_shard_list(shards, remote) if is_shard_list(shards) else None
        spec = listed.shards if listed is not None else shards
        if is_remote(spec):
            options = RemoteOptions.of(remote)
            self.remote = RemoteFiles.listed(spec, options, (".tar",), "tar shards")
            self.shards = [Path(p) for p in self.remote.paths]
            self.names = self.remote.names()
            self.where = redact(str(shards)) if isinstance(shards, str) else self.names[0]
        else:
            self.shards = list_shards(spec)
            self.names = [str(s) for s in self.shards]
            self.where = str(shards) if isinstance(shards, (str, os.PathLike)) else str(
                self.shards[0])
        if listed is not None:
            self._list_name = listed.where  # the shard list, as messages name it
            self._check_sizes(listed)
            counts = listed.counts
            first = int(np.argmax(counts > 0)) if counts.any() else 0
            indexes = {first: self._index_of([first])[0]}
        else:
            self._list_name = ""
            everything = (_remote_indexes(self.remote) if self.remote is not None
                          else [shard_index(s, remote) for s in self.shards])
            indexes = dict(enumerate(everything))
            counts = np.array([len(index["keys"]) for index in everything], np.int64)
            first = int(np.argmax(counts > 0)) if counts.any() else 0
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.count = int(self._starts[-1])
        head = indexes[first]
        order = list(names) if names is not None else sorted(
            set(head["field"][head["sample"] == 0].tolist())) if len(head["keys"]) else []
        found = {name: field_of(name, f"{self.names[first]}: {name!r}") for name in order}
        # Per field, each sample's member: its shard is the sample's, its bytes ``size`` at byte
        # ``offset`` (-1 until the shard is indexed in this process).
        self._offsets = {name: np.full(self.count, -1, np.int64) for name in order}
        self._sizes = {name: np.zeros(self.count, np.int64) for name in order}
        self._shard_keys: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(self.shards)
        self._indexed = np.zeros(len(self.shards), bool)
        for k, index in indexes.items():
            self._fill(k, index)
        fields = {n: found[n] for n in order}
        for name, field in fields.items():
            if field is None:
                fields[name] = self._npy_field(name)
        plan = hashlib.sha256()
        if self.remote is not None:
            self.remote.digest(plan)
        for shard in self.shards if self.remote is None else ():
            st = shard.stat()
            plan.update(f"{shard.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\1".encode())
        self.meta = {"count": self.count, "order": order, "record": "dict", "tar": True,
                     "fields": {n: f.to_json() for n, f in fields.items()},
                     "plan": plan.hexdigest()[:24]}
        self.schema = Schema(fields, "tuple" if names is not None else "dict")

    def _check_sizes(self, listed: ShardList) -> None:
        """A shard whose size is not the list's has changed since the list was written."""
        for k, size in enumerate(listed.sizes):
            if size is None:
                continue
            actual = (self.remote.infos[k].size if self.remote is not None
                      else self.shards[k].stat().st_size)
            if actual != size:
                raise PackFormatError(
                    f"{self.names[k]} is {actual} bytes where the shard list {listed.where} "
                    f"says {size}: the shard changed after the list was written; write the "
                    "list again (fastpipe.data.write_shard_list)")

    def _index_of(self, shards: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """The indexes of shards ``shards`` (built where the node does not have them yet), in
        this thread: a loader's thread whose consumer is gone cancels the downloads
        (``cancelled_by``)."""
        if self.remote is not None:
            return [_remote_index(self.remote, k) for k in shards]
        return [shard_index(self.shards[k], self._options) for k in shards]

    def _fill(self, k: int, index: dict[str, np.ndarray]) -> None:
        """Shard ``k``'s members of every field read, from its index, checked: each sample has
        each field once, and as many samples as the shard list says."""
        shard, first = self.names[k], int(self._starts[k])
        n = len(index["keys"])
        if n != self._starts[k + 1] - first:
            raise PackFormatError(
                f"{shard} holds {n} samples where the shard list {self._list_name} says "
                f"{int(self._starts[k + 1] - first)}: the shard changed after the list was "
                "written; write the list again (fastpipe.data.write_shard_list)")
        for name in self._offsets:
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
            self._offsets[name][first:first + n] = index["offset"][rows][order]
            self._sizes[name][first:first + n] = index["size"][rows][order]
        encoded = [key.encode("utf-8", "surrogateescape") for key in index["keys"].tolist()]
        self._shard_keys[k] = (np.frombuffer(b"".join(encoded), np.uint8),
                               np.concatenate([[0], np.cumsum([len(e) for e in encoded])]
                                              ).astype(np.int64))
        self._indexed[k] = True

    def _ensure_indexed(self, shards: np.ndarray) -> None:
        """Indexes, in this process, those of ``shards`` not indexed yet (with a shard list).
        Threads reading at once index their shards in parallel: each fills its shards' own
        rows, and one shard indexed twice fills the same values (the node's lock builds its
        index once, the other thread loads it)."""
        if self._indexed[shards].all():
            return
        todo = _distinct(shards[~self._indexed[shards]])
        for k, index in zip(todo, self._index_of(todo), strict=True):
            self._fill(k, index)

    def _npy_field(self, name: str) -> Any:
        """An ``.npy`` member's field: its dtype and shape from the first sample's header,
        variable along the first axis."""
        if not self.count:
            return F.ArrayField("uint8", (None,))
        raw = self._read_members(np.array([0], np.int64), name)[0]
        array = _npy(raw, f"the {name!r} member of {self.describe(0)}")
        return F.ArrayField(array.dtype.name, (None, *array.shape[1:]) if array.ndim else ())

    def _open(self) -> FilePool:
        return FilePool([os.path.realpath(s) for s in self.shards])

    def _close(self, handles: FilePool) -> None:
        handles.close()

    def _read_members(self, indices: np.ndarray, name: str) -> list[np.ndarray]:
        shard = np.searchsorted(self._starts, indices, side="right") - 1
        self._ensure_indexed(shard)
        sizes = self._sizes[name][indices]
        dest = np.cumsum(sizes) - sizes
        flat = np.empty(int(sizes.sum()), np.uint8)
        pieces = Pieces(shard, self._offsets[name][indices], sizes, dest)
        try:
            if self.remote is None:
                read_pieces(self._handles(), pieces, flat)
            else:  # the batch's shards in the cache, kept there while they are read
                with self.remote.pinned(_distinct(pieces.files)):
                    read_pieces(self._handles(), pieces, flat)
        except ShortRead as exc:
            raise PackFormatError(f"{self._name_of(exc.path)} is truncated: a member of it runs "
                                  "past its end (short read)") from None
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
        if field.kind == "str":
            try:
                raw.tobytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PackFormatError(
                    f"the {name!r} member of {self.describe(index)} is not UTF-8 text ({exc}); "
                    "read it as bytes by naming the member's field another extension, or leave "
                    "it out with fields=[...]") from exc
            return raw
        if field.kind == "int":
            text = raw.tobytes().strip()
            try:
                value = int(text)
            except ValueError as exc:
                raise PackFormatError(f"the {name!r} member of {self.describe(index)} is "
                                      f"{text[:40]!r}, not an integer") from exc
            if not -(1 << 63) <= value < 1 << 63:
                raise PackFormatError(f"the {name!r} member of {self.describe(index)} is "
                                      f"{text[:40]!r}, not an integer an int64 holds")
            return np.asarray(value, "<i8")
        if field.kind == "array":
            array = _npy(raw, f"the {name!r} member of {self.describe(index)}")
            try:
                return field.encode(array, f"the {name!r} member of {self.describe(index)}")
            except F.FieldError as exc:
                raise PackFormatError(str(exc)) from exc
        return raw

    def _name_of(self, path: str) -> str:
        """The shard (its URL, for a remote one) whose local file is ``path``."""
        for shard, name in zip(self.shards, self.names):
            if os.path.realpath(shard) == path:
                return name
        return path

    def shard_sizes(self) -> np.ndarray:
        """Samples per shard, in index order."""
        return np.diff(self._starts)

    def prefetch(self, shards: Sequence[int], released: Sequence[int] | None = None,
                 progress: Callable[[], int] | None = None):
        """Downloads remote shards ``shards`` (positions in ``self.shards``) into the node's
        cache in this order, ``ahead`` of the readers (``released``, ``progress``:
        :meth:`ShardCache.prefetch`); returns the prefetch (``close()`` stops it). Local
        shards: None."""
        return None if self.remote is None else self.remote.prefetch(list(shards), released,
                                                                     progress)

    def describe(self, index: int) -> str:
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        local = index - int(self._starts[k])
        keys = self._shard_keys[k]
        if keys is None:  # not read in this process yet
            return f"{self.names[k]} (its sample {local})"
        key = keys[0][keys[1][local]:keys[1][local + 1]].tobytes()
        return f"{self.names[k]}:{key.decode('utf-8', 'surrogateescape')}"

    def fingerprint(self) -> str:
        return hashlib.sha256(str(self.meta["plan"]).encode()).hexdigest()[:16]


def write_shard_list(shards: str | os.PathLike | Sequence[str | os.PathLike],
                     out: str | os.PathLike, remote: RemoteOptions | None = None) -> Path:
    """Writes the shard list of ``shards`` (as :class:`~fastpipe.data.TarDataset` takes them:
    a folder, a pattern, a list, local or URLs) to the local file ``out``, and returns its path.

    Each shard is indexed to count its samples (a remote one downloaded once, into the cache
    of ``remote``). Shards in the folder of ``out`` (or, for URLs, in one folder) are named by
    their file name, so the list goes beside them: upload it next to remote shards; others by
    their full path or URL. ``TarDataset(".../shards.json")`` then builds without reading the
    shards."""
    source = TarSource(shards, remote=remote)
    out = Path(out)
    if source.remote is not None:
        urls = source.remote.urls
        folders = {parent(u) for u in urls}
        names = [u.rsplit("/", 1)[1] if len(folders) == 1 else u for u in urls]
        sizes = [info.size for info in source.remote.infos]
    else:
        here = out.resolve().parent
        paths = [s.resolve() for s in source.shards]
        names = [p.name if p.parent == here else str(p) for p in paths]
        sizes = [p.stat().st_size for p in paths]
    doc = {"__kind__": SHARD_LIST_KIND, "wids_version": 1, "name": out.stem,
           "shardlist": [{"url": name, "nsamples": int(count), "filesize": int(size)}
                         for name, count, size in zip(names, source.shard_sizes(), sizes,
                                                      strict=True)]}
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    return out


_NPY_MAGIC = b"\x93NUMPY"


def _npy(raw: np.ndarray, where: str) -> np.ndarray:
    """The array of a ``.npy`` member; anything else (empty, cut short, a zip: np.load would
    open an ``.npz``) is an error naming it."""
    data = raw.tobytes()
    if not data.startswith(_NPY_MAGIC):
        raise PackFormatError(f"{where} is not a .npy array (it does not start with the .npy "
                              f"magic: {data[:8]!r})")
    fmt = np.lib.format
    try:
        f = io.BytesIO(data)
        version = fmt.read_magic(f)
        # Version 3's header is version 2's in UTF-8: its shape and itemsize read alike.
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read(f)
        # np.load allocates the declared shape before it reads: a few bytes may declare any.
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if need > len(data) - f.tell():
            raise ValueError(f"its header declares {dtype} {shape} ({need} bytes), more than "
                             f"the {len(data) - f.tell()} bytes after it")
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError, OverflowError, zipfile.BadZipFile) as exc:
        raise PackFormatError(f"{where} is not a .npy array ({type(exc).__name__}: "
                              f"{exc})") from exc


def _forget_mapping(path: str) -> None:
    """The reader engine drops its mapping and descriptor of a cached file this process no
    longer pins, so that the file's space is given back when it is evicted."""
    FilePool([os.path.realpath(path)]).close()


add_unpin_hook(_forget_mapping)


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct ``values``, sorted. Not np.unique: its first call in a process imports
    numpy.ma, which each worker process of each epoch would import again."""
    return sorted(set(values.tolist()))
