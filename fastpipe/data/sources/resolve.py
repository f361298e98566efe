"""What a path names: the one answer, for every part of fastpipe that takes a path (the
datasets' readers, ``image_loader``, DALI's readers, the profiler, ``pack`` and the command
line).

Decided from what is there, never from a name alone: an HDF5 or LMDB file by its first bytes, a
folder by what it holds, a text file by its lines. A URL is answered the same way, from its
store (fastpipe.data.sources.cached).
"""

from __future__ import annotations

import glob
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastpipe.data.format.layout import PackFormatError, sniff_format
from fastpipe.data.sources._base import Source
from fastpipe.data.sources.listing import IMG_EXTENSIONS

__all__ = ["KINDS", "kind_of", "resolve"]

# What kind_of answers, and the source class each kind opens.
KINDS = ("hdf5", "lmdb", "tar", "parquet", "folder", "images", "arrays", "list", "columns")


def kind_of(path: str | os.PathLike, remote: Any = None) -> str:
    """The kind of source ``path`` names (one of :data:`KINDS`), or FileNotFoundError /
    ValueError saying what it is not. A URL is asked of its store (``remote``: a
    :class:`~fastpipe.data.RemoteOptions`; fastpipe.data.sources.cached)."""
    from fastpipe.data.remote.urls import is_url, local_path_of

    if is_url(path):
        from fastpipe.data.remote.options import RemoteOptions
        from fastpipe.data.sources.cached import kind_of_url

        return kind_of_url(str(path), RemoteOptions.of(remote))
    text = os.fspath(local_path_of(path))
    path = Path(text)
    if not path.exists():
        if glob.has_magic(text) and (found := glob.glob(text, recursive=True)):
            return "parquet" if all(f.endswith(".parquet") for f in found) else "tar"
        raise FileNotFoundError(f"{text} does not exist (expected an image folder, a pack, tar "
                                "shards, Parquet files, a list file or a folder of .npy files)")
    if path.is_dir():
        if (path / "data.mdb").is_file():
            return "lmdb"
        from fastpipe.data.sources.arrays import ARRAY_EXTENSIONS, is_array_file

        # The first matching file decides: a folder of a million files is listed once, by the
        # source, not here.
        classes = [entry.path for entry in os.scandir(path) if entry.is_dir()]
        if any(_holds(c, IMG_EXTENSIONS) for c in classes):
            return "folder"
        if any(path.glob("*.tar")):
            return "tar"
        if any(_holds(c, ARRAY_EXTENSIONS) for c in classes):
            return "arrays"
        for _, _, files in os.walk(path, followlinks=True):
            if any(f.endswith(".parquet") for f in files):
                return "parquet"
            if any(f.lower().endswith(IMG_EXTENSIONS) for f in files):
                return "images"
            if any(is_array_file(f) and not f.endswith(".fastpipe-index.npz") for f in files):
                return "arrays"
        if classes:
            raise ValueError(f"{path} holds class folders but no images found in them "
                             f"({', '.join(IMG_EXTENSIONS)})")
        raise ValueError(f"{path} holds no images and no class folders (nor tar shards, Parquet "
                         "or .npy files): not a source fastpipe reads; an image folder is "
                         "root/<class>/<image>")
    if path.suffix.lower() == ".json":
        return "tar"  # a shard list (fastpipe.data.sources.shardlist), checked as it is read
    try:
        return sniff_format(path)  # HDF5 or LMDB, by their first bytes
    except PackFormatError:
        pass
    with open(path, "rb") as f:
        if f.read(4) == b"PAR1":
            return "parquet"
    if tarfile.is_tarfile(path):
        return "tar"
    return _list_kind(path)


def _holds(folder: str, suffixes: tuple[str, ...]) -> bool:
    """Whether ``folder`` or a folder under it holds a file ending in one of ``suffixes``."""
    for _, _, files in os.walk(folder, followlinks=True):
        if any(f.lower().endswith(suffixes) for f in files):
            return True
    return False


def _list_kind(path: Path) -> str:
    from fastpipe.data.sources.arrays import is_array_file
    from fastpipe.data.sources.folder import COLUMNS_HEADER

    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith(COLUMNS_HEADER):
                    return "columns"
                if line and not line.startswith("#"):
                    first = line.rsplit("\t", 1)[0] if "\t" in line else line.split()[0]
                    return "arrays" if is_array_file(first) else "list"
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is neither an HDF5 nor an LMDB pack, a tar file or a text list "
                         "of files: not a source fastpipe reads") from exc
    raise ValueError(f"{path} lists no files (expected 'path [label]' per line)")


def resolve(source: Any, *, fields: Mapping[str, Any] | Sequence[str] | None = None,
            remote: Any = None) -> Source:
    """``source`` as a :class:`~fastpipe.data.sources._base.Source`: a source as it is; a path
    or a URL (see :func:`kind_of`; ``remote``: how URLs are read); a list of tar shards; or a
    map-style dataset (a Hugging Face dataset included). ``fields`` picks the fields of a file's
    records (an HDF5 file's datasets), or declares those of a dataset's."""
    from fastpipe.data.remote.urls import is_url

    if isinstance(source, Source):
        return source
    if is_url(source):
        from fastpipe.data.remote.options import RemoteOptions
        from fastpipe.data.sources.cached import open_url

        names = fields if fields is None or isinstance(fields, Sequence) else list(fields)
        return open_url(source, kind_of(source, remote), names, RemoteOptions.of(remote))
    if isinstance(source, (str, os.PathLike)):
        return _open(source, kind_of(source), fields)
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(p, (str, os.PathLike)) for p in source):
        from fastpipe.data.sources.tar import TarSource

        return TarSource(source, fields, remote)
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        from fastpipe.data.sources.dataset import DatasetSource

        return DatasetSource(source, fields)
    raise TypeError(f"a source is a path (a folder, a pack, tar shards, a list file), a list of "
                    f"tar shards or a map-style dataset, got {type(source).__name__}")


def _open(path: str | os.PathLike, kind: str, fields: Any) -> Source:
    names = fields if fields is None or isinstance(fields, Sequence) else list(fields)
    if kind == "hdf5":
        from fastpipe.data.sources.h5 import H5Source

        return H5Source(path, names)
    if kind == "lmdb":
        from fastpipe.data.sources.lmdb import LMDBSource

        return LMDBSource(path, names)
    if kind == "tar":
        from fastpipe.data.sources.tar import TarSource

        return TarSource(path, names)
    if kind == "parquet":
        from fastpipe.data.sources.parquet import ParquetSource

        return ParquetSource(path, names)
    if kind == "folder":
        from fastpipe.data.sources.folder import FolderSource

        return FolderSource(path)
    if kind == "images":
        from fastpipe.data.sources.paired import PairedSource

        return PairedSource({"image": path}, where=str(path))
    if kind == "list":
        from fastpipe.data.sources.folder import ListSource

        return ListSource(path)
    if kind == "columns":
        from fastpipe.data.sources.arrays import ColumnsSource

        return ColumnsSource(path)
    from fastpipe.data.sources.arrays import ArrayFilesSource

    if Path(path).is_dir():
        return ArrayFilesSource(path)
    from fastpipe.data.sources.folder import ListSource

    listed = ListSource(path)  # the list's paths and labels, then the arrays they name
    return ArrayFilesSource([listed.files[i] for i in range(len(listed))], listed.labels_array,
                            listed.classes)
