"""Sources behind URLs that are read whole from the node's cache: a fastpipe pack (HDF5 or
LMDB: the file, or an LMDB folder's ``data.mdb``) downloaded once per node, every field of
every sample checked against the CRC-32 the pack stores of it before the copy enters the cache,
then read as a local pack; and what a URL names (``kind_of_url``), from the objects' first bytes
and the folders' names.

A source opened here carries its copy's hold as ``source.remote`` (a
:class:`~fastpipe.data.remote.files.RemoteFiles`): the copy stays out of eviction while the
source lives, in every process it is sent to (a spawned worker downloads it again where the
cache lost it).
"""

from __future__ import annotations

import glob
import zlib
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from fastpipe.data.format.layout import PackFormatError
from fastpipe.data.remote.files import RemoteFiles
from fastpipe.data.remote.filesystems import children, head, info
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.urls import expand_braces, redact
from fastpipe.data.sources._base import Source
from fastpipe.data.sources.listing import IMG_EXTENSIONS

__all__ = ["kind_of_url", "open_pack", "open_url", "pack_copy", "verify_copy"]

_HDF5 = b"\x89HDF\r\n\x1a\n"
# Samples checked at once after a download.
_BATCH = 256


def pack_copy(url: str, kind: str, options: RemoteOptions) -> tuple[str, RemoteFiles]:
    """The local copy of the pack at ``url`` (``kind`` ``"hdf5"`` or ``"lmdb"``), downloaded and
    checked where the cache does not hold it, and what holds it there."""
    try:
        found = info(url, options)
    except (FileNotFoundError, IsADirectoryError):
        if kind != "lmdb" or url.rstrip("/").endswith("/data.mdb"):
            raise
        url = url.rstrip("/") + "/data.mdb"  # an LMDB folder: its data is data.mdb
        found = info(url, options)
    files = RemoteFiles([found], options)
    return files.keep(0, partial(verify_copy, kind, url)), files


def open_pack(url: str, kind: str, names: Sequence[str] | None, options: RemoteOptions
              ) -> Source:
    """The pack at ``url`` as a source read from its copy in the node's cache."""
    local, files = pack_copy(url, kind, options)
    source = _pack_source(local, kind, names)
    source.where = redact(url)
    source.remote = files
    return source


def _pack_source(path: str, kind: str, names: Sequence[str] | None) -> Source:
    if kind == "hdf5":
        from fastpipe.data.sources.h5 import H5Source

        return H5Source(path, names)
    from fastpipe.data.sources.lmdb import LMDBSource

    return LMDBSource(path, names)


def verify_copy(kind: str, url: str, path: str) -> None:
    """Checks a downloaded pack before it enters the cache: it opens, it is one file (a virtual
    merge's samples are in part files beside it), and every field of every sample matches the
    CRC-32 the pack stores of it."""
    shown = redact(url)
    virtual = (f"{shown} is a virtual merge: its samples are in part files beside it, which a "
               "copy of the one file cannot read; pack it with merge='copy' for one "
               "self-contained file")
    try:
        source = _pack_source(path, kind, None)
    except (PackFormatError, OSError) as exc:
        if "virtual" in str(exc):
            raise PackFormatError(virtual) from None
        raise PackFormatError(f"{shown}: {str(exc).replace(str(path), shown)}") from None
    with source:
        if source.meta.get("merge") == "virtual":
            raise PackFormatError(virtual)
        stored = {n: c for n in source.schema.names if (c := source.crc32(n)) is not None}
        for start in range(0, source.count, _BATCH):
            batch = list(range(start, min(start + _BATCH, source.count)))
            for i, record in zip(batch, source.read_batch(batch, names=list(stored))):
                for name, crcs in stored.items():
                    if zlib.crc32(np.ascontiguousarray(record[name])) != int(crcs[i]):
                        raise PackFormatError(
                            f"{shown}: sample {i}, field {name!r} does not match its checksum "
                            "after the download: the pack is damaged where it is stored (run "
                            "fastpipe verify on it there)")


def kind_of_url(url: str, options: RemoteOptions) -> str:
    """What ``url`` names, as :func:`~fastpipe.data.sources.resolve.kind_of` answers for a path:
    a pattern (``*``, ``{000..099}``) tar shards or Parquet files by their suffix; an object by
    its first bytes (HDF5, Parquet, tar) or its name (``data.mdb``: LMDB), a text one a list; a
    folder by what it holds (``data.mdb``, ``.tar`` or ``.parquet`` objects, class folders of
    images)."""
    shown = redact(url)
    rest = url.split("://", 1)[1]
    names = expand_braces(url)
    if len(names) > 1 or glob.has_magic(rest):
        return "parquet" if url.endswith(".parquet") else "tar"
    if url.lower().endswith(".json"):
        return "tar"  # a shard list (fastpipe.data.sources.shardlist), checked as it is read
    if not url.endswith("/"):
        try:
            info(url, options)
        except (FileNotFoundError, IsADirectoryError):
            pass  # a folder named without its trailing slash
        else:
            return _object_kind(url, options)
    folder = url.rstrip("/") + "/"
    objects, folders = children(folder, options)
    if not objects and not folders:
        raise FileNotFoundError(f"{shown} does not exist (expected tar shards, a pack, Parquet "
                                "files, a list file or an image folder)")
    files = [u.rsplit("/", 1)[1] for u in objects]
    if "data.mdb" in files:
        return "lmdb"
    for suffix, kind in ((".tar", "tar"), (".parquet", "parquet")):
        if any(f.endswith(suffix) for f in files):
            return kind
    for sub in folders:
        inner, _ = children(sub, options)
        found = [u.rsplit("/", 1)[1].lower() for u in inner]
        if any(f.endswith(IMG_EXTENSIONS) for f in found):
            return "folder"
        if any(f.endswith(".parquet") for f in found):
            return "parquet"
    if any(f.lower().endswith(IMG_EXTENSIONS) for f in files):
        raise ValueError(f"{shown} holds images but no class folders: an image folder in object "
                         "storage is read as root/<class>/<image>; or list the images in a list "
                         "file")
    raise ValueError(f"{shown} holds no tar shards, pack, Parquet files or class folders of "
                     "images: not a source fastpipe reads")


def _object_kind(url: str, options: RemoteOptions) -> str:
    first = head(url, 4096, options)
    if first.startswith(_HDF5):
        return "hdf5"
    if first.startswith(b"PAR1"):
        return "parquet"
    if url.rstrip("/").endswith("/data.mdb") or (
            len(first) >= 24 and np.frombuffer(first[16:20], "<u4")[0] == 0xBEEFC0DE):
        return "lmdb"
    if len(first) >= 262 and first[257:262] == b"ustar":
        return "tar"
    from fastpipe.data.sources.folder import COLUMNS_HEADER

    try:
        text = first.decode("utf-8")
    except UnicodeDecodeError:
        if len(first) == 4096:  # cut inside a character: the text before it
            text = first[:-4].decode("utf-8", "ignore")
        else:
            raise ValueError(f"{redact(url)} is neither a pack, a tar file, a Parquet file nor "
                             "a text list of files: not a source fastpipe reads") from None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(COLUMNS_HEADER):
            return "columns"
        if line and not line.startswith("#"):
            return "list"
    raise ValueError(f"{redact(url)} lists no files (expected 'path [label]' per line)")


def open_url(url: str, kind: str, names: Sequence[str] | None, options: RemoteOptions) -> Any:
    """The source of kind ``kind`` at ``url``; the kinds a URL cannot be read as refused."""
    if kind == "tar":
        from fastpipe.data.sources.tar import TarSource

        return TarSource(url, names, options)
    if kind in ("hdf5", "lmdb"):
        return open_pack(url, kind, names, options)
    if kind == "parquet":
        from fastpipe.data.sources.parquet import ParquetSource

        return ParquetSource(url, names, remote=options)
    if kind == "folder":
        from fastpipe.data.sources.folder import FolderSource

        return FolderSource(url, remote=options)
    if kind == "list":
        from fastpipe.data.sources.folder import ListSource

        return ListSource(url, remote=options)
    raise ValueError(f"{redact(url)} holds {kind} data, which fastpipe reads from local files "
                     "only: copy it to local disk, or pack it (fastpipe pack) and read the pack")
