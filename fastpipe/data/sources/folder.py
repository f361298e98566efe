"""Image files as a source: an ImageFolder tree (``root/<class>/**/<image>``) or a list file
(``path [label]`` per line), each sample an ``(image, label)`` pair of the file's bytes, kept as
they are, and its label.

Paths live in one byte buffer plus offsets and the labels in an int64 array, not Python lists, so
DataLoader workers do not copy them page by page as reference counts change (pytorch#13246), and
a million files cost their names' bytes, not a Python object each.

A tree or a list file in object storage (a URL; ``remote=`` says how it is read) is read through
the node's cache, file by file (fastpipe.data.remote); the paths are then URLs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.format import fields as F
from fastpipe.data.remote.files import RemoteFiles
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.urls import is_url, join, parent, redact
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources.listing import (
    IMG_EXTENSIONS,
    list_image_folder,
    list_remote_image_folder,
)

__all__ = ["FolderSource", "ListSource", "PathTable", "read_file"]

IMAGE, LABEL = "image", "label"
NO_LABEL = -1
LABEL_RANGE = "labels are class indices (0 and up), or -1 for a sample without one"


def read_file(path: str) -> bytes:
    """The file's bytes, with one open, fstat, read and close: about a third less time than
    ``open().read()`` (docs/cpu-path.md), which also builds a buffered file object. Unless the
    first read returns exactly the size fstat gave, it reads on to the end of the file, as
    ``read()`` does (a file still growing, a short read, or a file system that reports no
    size)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1)
        if len(data) != size:
            chunks = [data]
            while chunk := os.read(fd, max(size, 1 << 16)):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


class PathTable:
    """Paths relative to a root, in one byte buffer plus offsets."""

    def __init__(self, root: str | os.PathLike, relative: Sequence[str]) -> None:
        self.root = os.fspath(root)
        encoded = [os.fsencode(p) for p in relative]
        lengths = np.fromiter((len(p) for p in encoded), np.int64, len(encoded))
        self.offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        self.data = np.frombuffer(b"".join(encoded), np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def relative(self, index: int) -> str:
        return os.fsdecode(self.data[self.offsets[index]:self.offsets[index + 1]].tobytes())

    def __getitem__(self, index: int) -> str:
        return os.path.join(self.root, self.relative(index))

    def digest(self, h: Any) -> None:
        h.update(self.offsets.tobytes())
        h.update(self.data.tobytes())


class _Files(Source):
    """Image files with labels: reads each file whole, in this thread."""

    files: PathTable
    labels_array: np.ndarray
    remote: RemoteFiles | None = None  # the files' objects, for a tree or list behind a URL

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in names:
            if name == IMAGE:
                out[name] = np.frombuffer(self._bytes(index), np.uint8)
            else:
                out[name] = self.labels_array[index]
        return out

    def _bytes(self, index: int) -> bytes:
        if self.remote is not None:
            with self.remote.pinned([index]) as (local,):
                return read_file(local)
        path = self.files[index]
        try:
            return read_file(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} ({self.where}, sample {index}) does not "
                                    "exist") from None

    def describe(self, index: int) -> str:
        return self.files[index] if self.remote is None else redact(self.files[index])

    def paths(self, start: int, stop: int) -> list[str]:
        """The files of samples ``[start, stop)``, relative to the root."""
        return [self.files.relative(i) for i in range(start, stop)]

    def labels(self) -> np.ndarray:
        return self.labels_array


class FolderSource(_Files):
    """An ImageFolder tree, listed as torchvision's ``ImageFolder`` lists it (the one listing of
    fastpipe.data.sources.listing: classes sorted, files in sorted walk order, ``extensions``
    matched case-insensitively): sample ``i`` and its label are the same file in torchvision and in
    every fastpipe loader."""

    def __init__(self, root: str | os.PathLike,
                 extensions: Iterable[str] = IMG_EXTENSIONS,
                 remote: RemoteOptions | None = None) -> None:
        extensions = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
        if is_url(root):
            self.root = str(root).rstrip("/") + "/"
            self.where = redact(self.root)
            options = RemoteOptions.of(remote)
            classes, paths, labels, infos = list_remote_image_folder(self.root, extensions,
                                                                     options)
            if not classes:
                raise FileNotFoundError(
                    f"ImageFolder root {self.where!r} holds no class folders (or does not "
                    "exist); expected root/<class>/<image> (e.g. root/cat/001.jpg)")
            self.remote = RemoteFiles(infos, options)
        else:
            self.root = Path(root)
            self.where = str(self.root)
            if not self.root.is_dir():
                raise FileNotFoundError(
                    f"ImageFolder root {str(self.root)!r} is not a folder; pass the folder that "
                    "holds one sub-folder per class")
            classes, paths, labels = list_image_folder(self.root, extensions)
        if not classes:
            raise FileNotFoundError(
                f"ImageFolder root {str(self.root)!r} has no class sub-folders; expected "
                "root/<class>/<image> (e.g. root/cat/001.jpg)")
        if not paths:
            raise FileNotFoundError(
                f"no images with extensions {', '.join(extensions)} under the class folders of "
                f"{str(self.root)!r}; pass extensions=... if your files use another suffix")
        self.files = PathTable(self.root, paths)
        self.labels_array = np.asarray(labels, np.int64)
        self.count = len(paths)
        self.classes = classes
        self.meta = {}
        self.schema = Schema({IMAGE: F.ImageField(), LABEL: F.IntField("int64")}, "pair",
                             {LABEL: classes})

    def fingerprint(self) -> str:
        """The root, the files and their labels (as ImageFolder hashed them)."""
        digest = hashlib.sha256(os.fsencode(self.root if self.remote is None else self.where))
        self.files.digest(digest)
        digest.update(self.labels_array.tobytes())
        return digest.hexdigest()[:16]


class ListSource(_Files):
    """A list file of images: ``path [label]`` per line; ``#`` comments and blank lines skipped;
    tab-separated lines split on the last tab (paths with spaces), others on the last run of
    whitespace. Labels are integers (-1: none) or class names (sorted into ``classes``); every
    line has one or none does (all -1). Relative paths are relative to ``root``, or to the list
    file's folder."""

    def __init__(self, path: str | os.PathLike, root: str | os.PathLike | None = None,
                 remote: RemoteOptions | None = None) -> None:
        listed = None
        if is_url(path):  # the list itself read through the cache; its files are URLs
            listed = RemoteFiles.listed(str(path), RemoteOptions.of(remote), (), "list file")
            self.path = str(path)
            self.where = redact(self.path)
            with listed.pinned([0]) as (local,):
                names, raw = parse_list(Path(local), self.where)
        else:
            self.path = Path(path)
            self.where = str(self.path)
            names, raw = parse_list(self.path)
        given = [lab for lab in raw if lab is not None]
        if given and len(given) != len(raw):
            raise ValueError(f"{self.where}: some lines have a label and some do not; give every "
                             "line a label or none")
        classes: list[str] = []
        if not given:
            labels = np.full(len(names), NO_LABEL, np.int64)
        elif all(_is_int(lab) for lab in given):
            labels = np.asarray([int(lab) for lab in given], np.int64)
            if (bad := np.flatnonzero(labels < NO_LABEL)).size:
                raise ValueError(f"{self.where}: sample {int(bad[0])} has label "
                                 f"{int(labels[bad[0]])}; {LABEL_RANGE}")
        else:
            classes = sorted(set(given))
            index = {name: k for k, name in enumerate(classes)}
            labels = np.asarray([index[lab] for lab in given], np.int64)
        if listed is not None or is_url(root):
            base = str(root) if root is not None else parent(self.path)
            urls = [join(base, name) for name in names]
            self.files = PathTable("", urls)
            self.remote = RemoteFiles(urls, listed.options if listed else RemoteOptions.of(
                remote))
        else:
            base = Path(root) if root is not None else self.path.parent
            self.files = PathTable(base, names)  # absolute names stay absolute (os.path.join)
        self.labels_array = labels
        self.count = len(names)
        self.classes = classes
        self.meta = {}
        self.schema = Schema({IMAGE: F.ImageField(), LABEL: F.IntField("int64")}, "pair",
                             {LABEL: classes})

    def fingerprint(self) -> str:
        where = self.where if self.remote is not None else os.path.abspath(self.path)
        digest = hashlib.sha256(os.fsencode(where))
        self.files.digest(digest)
        digest.update(self.labels_array.tobytes())
        return digest.hexdigest()[:16]


COLUMNS_HEADER = "#fields:"


def parse_list(path: Path, where: str | None = None) -> tuple[list[str], list[str | None]]:
    """The paths and raw labels (None where a line has none) of a list file (named ``where`` in
    messages, its path by default)."""
    names: list[str] = []
    labels: list[str | None] = []
    shown = where or path
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if line.startswith(COLUMNS_HEADER):
                raise ValueError(f"{shown}:{number}: a '{COLUMNS_HEADER}' list names columns of "
                                 "several files per sample: read it as records (fastpipe pack "
                                 "packs it; fastpipe.data.sources.resolve opens it)")
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit("\t", 1) if "\t" in line else line.rsplit(None, 1)
            parts = [p.strip() for p in parts]
            if not parts[0]:
                raise ValueError(f"{shown}:{number}: empty path")
            names.append(parts[0])
            labels.append(parts[1] if len(parts) == 2 else None)
    if not names:
        raise ValueError(f"{shown} lists no files (expected 'path [label]' per line)")
    return names, labels


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
