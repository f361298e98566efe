"""Aligned folders of images (LR/HR, image/mask) as a source: one record per name found in every
folder, one image field per folder, each file's bytes kept as they are."""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.format import fields as F
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources.folder import PathTable, read_file
from fastpipe.data.sources.listing import IMG_EXTENSIONS

__all__ = ["PairedSource"]

# Unmatched names shown in an error; the rest are counted.
_SHOWN = 5


class PairedSource(Source):
    """Files of several folders paired by their path relative to their folder without the
    extension (``a/0001.png`` with ``a/0001.jpg``), found recursively and sorted.

    ``roots``: field name -> folder. ``templates``: a folder's file names around that key,
    BasicSR's ``filename_tmpl`` (``{"lr": "{}x2"}`` pairs ``LR_x2/0001x2.png`` with
    ``HR/0001.png``). ``fields``: the field of a folder's files (an ``ImageField`` with its role,
    e.g. ``ImageField(role=Mask())``; an image otherwise). A file with no partner in every other
    folder is an error giving their count and the first names; ``on_unmatched="skip"`` leaves
    them out, with a warning, and lists them in ``unmatched``.
    """

    def __init__(self, roots: Mapping[str, str | os.PathLike], *,
                 templates: Mapping[str, str] | None = None,
                 fields: Mapping[str, Any] | None = None, on_unmatched: str = "raise",
                 extensions: Iterable[str] = IMG_EXTENSIONS, where: str = "PairedFolders"
                 ) -> None:
        if not isinstance(roots, Mapping) or not roots:
            raise TypeError(f"{where}: roots must be a dict of field name -> folder (e.g. "
                            f"{{'lr': 'DIV2K/LR_x2', 'hr': 'DIV2K/HR'}}), got {roots!r}")
        if on_unmatched not in ("raise", "skip"):
            raise ValueError(f"{where}: on_unmatched must be 'raise' or 'skip', got "
                             f"{on_unmatched!r}")
        self.roots = {str(name): Path(root) for name, root in roots.items()}
        self.where = ", ".join(f"{n}={str(r)!r}" for n, r in self.roots.items())
        templates = dict(templates or {})
        for name, template in templates.items():
            if name not in self.roots:
                raise ValueError(f"{where}: templates names {name!r}, which is not in roots "
                                 f"({list(self.roots)})")
            if not isinstance(template, str) or template.count("{}") != 1:
                raise ValueError(f"{where}: templates[{name!r}] must hold '{{}}' once, where the "
                                 f"shared name goes (e.g. '{{}}x2'), got {template!r}")
        self.templates = templates
        extensions = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
        listed = {name: _list(root, templates.get(name), extensions, name, where)
                  for name, root in self.roots.items()}
        matched = set.intersection(*(set(files) for files in listed.values()))
        keys = sorted(matched)
        self.unmatched = sorted(f"{name}: {files[key]}" for name, files in listed.items()
                                for key in files if key not in matched)
        if self.unmatched:
            shown = ", ".join(self.unmatched[:_SHOWN])
            more = f" and {len(self.unmatched) - _SHOWN} more" if len(self.unmatched) > _SHOWN \
                else ""
            message = (f"{len(self.unmatched)} files have no partner in every other folder: "
                       f"{shown}{more}")
            if on_unmatched == "raise":
                raise ValueError(f"{where}: {message}. Files pair by their path without the "
                                 "extension (templates= for names like 0001x2.png); pass "
                                 "on_unmatched='skip' to leave them out")
            warnings.warn(f"{where}: left out {message}", stacklevel=3)
        if not keys:
            raise FileNotFoundError(f"{where}: no image pairs in {self.where} (extensions "
                                    f"{', '.join(extensions)})")
        self._files = {name: PathTable(self.roots[name], [files[key] for key in keys])
                       for name, files in listed.items()}
        self.count = len(keys)
        self.meta = {}
        given = dict(fields or {})
        if unknown := [n for n in given if n not in self.roots]:
            raise ValueError(f"{where}: fields names {unknown[0]!r}, which is not in roots "
                             f"({list(self.roots)})")
        self.schema = Schema({name: given.get(name) or F.ImageField() for name in self.roots})

    def path(self, name: str, index: int) -> str:
        return self._files[name][index]

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        return {name: np.frombuffer(read_file(self._files[name][index]), np.uint8)
                for name in names}

    def describe(self, index: int) -> str:
        return ", ".join(f"{n}={self._files[n][index]}" for n in self.roots)

    def fingerprint(self) -> str:
        """The folders and the paired files."""
        digest = hashlib.sha256(self.where.encode())
        for name in self.roots:
            self._files[name].digest(digest)
        return digest.hexdigest()[:16]


def _list(root: Path, template: str | None, extensions: tuple[str, ...], name: str,
          where: str) -> dict[str, str]:
    """``{key: path relative to root}`` of the images under ``root``; the key is the relative
    path without the extension, with ``template``'s text around the name removed."""
    if not root.is_dir():
        raise FileNotFoundError(f"{where}: roots[{name!r}] = {str(root)!r} is not a folder")
    prefix, suffix = template.split("{}") if template else ("", "")
    files: dict[str, str] = {}
    unfit = []
    for folder, _, names in os.walk(root, followlinks=True):
        for file in names:
            stem, ext = os.path.splitext(file)
            if ext.lower() not in extensions:
                continue
            relative = os.path.relpath(os.path.join(folder, file), root)
            if not (stem.startswith(prefix) and stem.endswith(suffix)
                    and len(stem) > len(prefix) + len(suffix)):
                unfit.append(relative)
                continue
            key = os.path.join(os.path.dirname(relative),
                               stem[len(prefix):len(stem) - len(suffix)]).replace(os.sep, "/")
            if key in files:
                raise ValueError(f"{where}: {str(root)!r} holds {files[key]!r} and "
                                 f"{relative!r}, which pair with the same name {key!r}; keep one")
            files[key] = relative
    if unfit:
        raise ValueError(f"{where}: {len(unfit)} files of roots[{name!r}] do not fit "
                         f"templates[{name!r}] = {template!r}: "
                         f"{', '.join(sorted(unfit)[:_SHOWN])}")
    return dict(sorted(files.items()))
