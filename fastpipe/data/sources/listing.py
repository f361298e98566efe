"""The one listing of an ImageFolder tree, shared by ImageFolder, the packer and DALI's FileList.

It is torchvision's ``ImageFolder`` listing, so sample ``i`` and its label are the same file in
torchvision and in every fastpipe loader: classes are the root's sub-folders sorted by name
(hidden ones included, as torchvision does), files are taken in ``sorted(os.walk(...))`` order with
sorted names, and an extension matches case-insensitively. A tree in object storage (a folder
URL) is listed in the same order.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from pathlib import Path

from fastpipe.data.remote.filesystems import ObjectInfo, list_objects
from fastpipe.data.remote.options import RemoteOptions

# torchvision's IMG_EXTENSIONS.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def list_image_folder(
    root: str | os.PathLike, extensions: Iterable[str] = IMG_EXTENSIONS
) -> tuple[list[str], list[str], list[int]]:
    """``(classes, paths, labels)`` of the tree ``root/<class>/**/<image>``; paths relative to root.

    Both lists may come back empty; callers say what that means for them.
    """
    root = Path(root)
    suffixes = tuple(e.lower() for e in extensions)
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        for dirpath, _, filenames in sorted(os.walk(root / name, followlinks=True)):
            rel = os.path.relpath(dirpath, root)
            found = [os.path.join(rel, f) for f in sorted(filenames)
                     if f.lower().endswith(suffixes)]
            paths.extend(found)
            labels.extend([label] * len(found))
    return classes, paths, labels


def list_remote_image_folder(
    root: str, extensions: Iterable[str], options: RemoteOptions
) -> tuple[list[str], list[str], list[int], list[ObjectInfo]]:
    """``(classes, paths, labels, infos)`` of the tree under the folder URL ``root``, in the
    order :func:`list_image_folder` gives a local tree (classes sorted, each class's files by
    folder then name); paths relative to root, infos the objects' sizes and ETags. One listing
    of everything under ``root``."""
    root = root.rstrip("/") + "/"
    suffixes = tuple(e.lower() for e in extensions)
    found = list_objects(root, options)
    per_class: dict[str, list[tuple[str, str, ObjectInfo]]] = {}
    for url, info in found.items():
        relative = url[len(root):] if url.startswith(root) else None
        if not relative or "/" not in relative:
            continue  # not under root, or a file beside the class folders
        name = relative.split("/", 1)[0]
        entries = per_class.setdefault(name, [])
        if relative.lower().endswith(suffixes):
            entries.append((posixpath.dirname(relative), posixpath.basename(relative), info))
    classes = sorted(per_class)
    paths: list[str] = []
    labels: list[int] = []
    infos: list[ObjectInfo] = []
    for label, name in enumerate(classes):
        for folder, base, info in sorted(per_class[name], key=lambda e: (e[0], e[1])):
            paths.append(posixpath.join(folder, base))
            labels.append(label)
            infos.append(info)
    return classes, paths, labels, infos
