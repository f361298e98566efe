"""The one listing of an ImageFolder tree, shared by ImageFolder, the packer and DALI's FileList.

It is torchvision's ``ImageFolder`` listing, so sample ``i`` and its label are the same file in
torchvision and in every fastpipe loader: classes are the root's sub-folders sorted by name
(hidden ones included, as torchvision does), files are taken in ``sorted(os.walk(...))`` order with
sorted names, and an extension matches case-insensitively.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

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
