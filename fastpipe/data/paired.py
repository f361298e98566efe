"""PairedFolders: aligned image folders (LR/HR, image/mask) read as records of named fields."""

from __future__ import annotations

import hashlib
import operator
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastpipe import _validate as check
from fastpipe.data._augment import PerSample
from fastpipe.data._decode import CorruptImageError, decode_rgb
from fastpipe.data._joint_kernels import check_fields, decode_stored, joint_record
from fastpipe.data._listing import IMG_EXTENSIONS
from fastpipe.data._random import forked_default_generator, sample_seed
from fastpipe.data.fields import FieldError, ImageField
from fastpipe.data.folder import _read_file
from fastpipe.data.joint import JOINT_STREAM, JointCrop
from fastpipe.data.roles import Mask, Role

__all__ = ["PairedFolders"]

# Unmatched names shown in an error; the rest are counted.
_SHOWN = 5


class PairedFolders(PerSample, torch.utils.data.Dataset):
    """A map-style dataset over folders of aligned images: ``dataset[i] -> {"lr": ..., "hr": ...}``.

    ``roots`` maps each field name to a folder (``{"lr": "DIV2K/LR_x2", "hr": "DIV2K/HR"}``,
    ``{"image": "images", "mask": "masks"}``). Files pair by their path relative to their folder
    without the extension (``a/0001.png`` with ``a/0001.jpg``), found recursively and sorted;
    ``templates`` gives a folder's file names around that key, BasicSR's ``filename_tmpl``
    (``{"lr": "{}x2"}`` pairs ``LR_x2/0001x2.png`` with ``HR/0001.png``). A file with no partner in
    every other folder is an error giving their count and the first names;
    ``on_unmatched="skip"`` leaves them out, with a warning, and lists them in ``unmatched``.

    ``roles`` gives a folder's files a role (:mod:`fastpipe.data.roles`):
    ``{"mask": Mask()}`` for segmentation masks, kept as stored (channels, dtype, palette
    indices, 16-bit values) and never interpolated; the others are :class:`~fastpipe.data.Image`.
    ``fields`` holds each folder's field with its role.

    ``joint`` (a :class:`~fastpipe.data.JointCrop`) crops, flips and turns every field together,
    one draw per sample from ``(seed, epoch, index)``: the same crops on any number of process or
    thread workers (``DataLoaderX``) and after a mid-epoch resume. PNG fields decode only the rows
    of their crop. Image fields come back as uint8 ``(3, H, W)`` tensors, mask fields (and a
    ``"nearest"`` field of the crop) as stored ``(C, H, W)``; without ``joint``, every field is
    decoded whole the same way. ``transform`` then runs on the dict, under the per-sample seed.

    Picklable (spawn workers); :meth:`pack_source` hands the stored bytes to
    ``fastpipe.pack.pack``, which packs them unchanged as image fields for
    ``H5Dataset(pack, joint=...)`` (``pack(..., fields=folders.fields)`` stores the roles).
    """

    def __init__(
        self,
        roots: Mapping[str, str | os.PathLike],
        joint: JointCrop | None = None,
        transform: Any = None,
        seed: int | None = None,
        *,
        templates: Mapping[str, str] | None = None,
        roles: Mapping[str, Role] | None = None,
        on_unmatched: str = "raise",
        extensions: Iterable[str] = IMG_EXTENSIONS,
    ) -> None:
        where = "PairedFolders"
        if not isinstance(roots, Mapping) or not roots:
            raise TypeError(f"{where}: roots must be a dict of field name -> folder (e.g. "
                            f"{{'lr': 'DIV2K/LR_x2', 'hr': 'DIV2K/HR'}}), got {roots!r}")
        if joint is not None and not isinstance(joint, JointCrop):
            raise TypeError(f"{where}: joint must be a fastpipe.data.JointCrop or None, got "
                            f"{type(joint).__name__}")
        check.choice("on_unmatched", on_unmatched, ("raise", "skip"), where=where)
        self.roots = {str(name): Path(root) for name, root in roots.items()}
        templates = dict(templates or {})
        for name, template in templates.items():
            if name not in self.roots:
                raise ValueError(f"{where}: templates names {name!r}, which is not in roots "
                                 f"({list(self.roots)})")
            if not isinstance(template, str) or template.count("{}") != 1:
                raise ValueError(f"{where}: templates[{name!r}] must hold '{{}}' once, where the "
                                 f"shared name goes (e.g. '{{}}x2'), got {template!r}")
        self.templates = templates
        self.fields = _fields(self.roots, roles, where)
        self.joint = joint
        if joint is not None:
            check_fields(joint, self.fields, where)
        self._init_per_sample(transform, None, seed)
        extensions = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
        listed = {name: _list(root, templates.get(name), extensions, name)
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
            warnings.warn(f"{where}: left out {message}", stacklevel=2)
        if not keys:
            raise FileNotFoundError(f"{where}: no image pairs in {self._roots_text()} (extensions "
                                    f"{', '.join(extensions)})")
        # One byte buffer plus offsets per folder, not Python lists (pytorch#13246).
        self._paths = {}
        for name, files in listed.items():
            encoded = [os.fsencode(files[key]) for key in keys]
            offsets = np.concatenate(([0], np.cumsum([len(e) for e in encoded]))).astype(np.int64)
            self._paths[name] = (offsets, np.frombuffer(b"".join(encoded), np.uint8))
        self._count = len(keys)

    def _roots_text(self) -> str:
        return ", ".join(f"{n}={str(r)!r}" for n, r in self.roots.items())

    def __len__(self) -> int:
        return self._count

    def _check_index(self, index: int) -> int:
        index = operator.index(index)
        if not -self._count <= index < self._count:
            raise IndexError(f"sample index {index} out of range for a PairedFolders of "
                             f"{self._count} pairs")
        return index % self._count

    def _path(self, name: str, index: int) -> str:
        offsets, data = self._paths[name]
        relative = os.fsdecode(data[offsets[index]:offsets[index + 1]].tobytes())
        return os.path.join(self.roots[name], relative)

    def paths(self, index: int) -> dict[str, str]:
        """The files of sample ``index``, per field."""
        i = self._check_index(index)
        return {name: self._path(name, i) for name in self.roots}

    def describe(self, index: int) -> str:
        """Names sample ``index`` for messages: its files."""
        return ", ".join(f"{n}={p}" for n, p in self.paths(index).items())

    def encoded(self, index: int) -> dict[str, bytes]:
        """The stored bytes of each file of sample ``index``, unchanged."""
        i = self._check_index(index)
        return {name: _read_file(self._path(name, i)) for name in self.roots}

    def pack_source(self) -> PairedBytes:
        """What ``fastpipe.pack.pack`` packs: every sample as ``{field: encoded bytes}``, stored
        as they are (image fields), for ``H5Dataset(pack, joint=...)`` to read."""
        return PairedBytes(self)

    def __getitem__(self, index: int) -> dict[str, Any]:
        epoch = self._epoch_of(index)
        i = self._check_index(index)
        data = {name: _read_file(self._path(name, i)) for name in self.roots}
        where = f"sample {i} of PairedFolders ({self.describe(i)})"
        if self.joint is not None:
            record = joint_record(self.joint, data, self.fields,
                                  sample_seed(self.seed, epoch, i, JOINT_STREAM), where)
        else:
            record = {}
            for name, value in data.items():
                try:
                    if isinstance(self.fields[name].role, Mask):
                        record[name] = decode_stored(value, self._path(name, i))
                        continue
                    pixels = decode_rgb(value, self._path(name, i))
                except CorruptImageError as exc:
                    raise CorruptImageError(f"{where}: {exc}") from exc
                record[name] = torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
        if self._transform is None:
            return record
        with forked_default_generator(sample_seed(self.seed, epoch, i, 1)):
            return self._transform(record)

    def fingerprint(self) -> str:
        """A short hash of the folders and the paired files, which a saved loader state must
        match (fastpipe.data._resume)."""
        digest = hashlib.sha256(self._roots_text().encode())
        for name in self.roots:
            offsets, data = self._paths[name]
            digest.update(offsets.tobytes())
            digest.update(data.tobytes())
        return digest.hexdigest()[:16]

    def __repr__(self) -> str:
        return (f"PairedFolders({self._roots_text()}, pairs={len(self)}, joint={self.joint!r}, "
                f"seed={self.seed})")


class PairedBytes(torch.utils.data.Dataset):
    """The samples of a :class:`PairedFolders` as ``{field: encoded bytes}``: a pack source."""

    def __init__(self, folders: PairedFolders) -> None:
        self.folders = folders

    def __len__(self) -> int:
        return len(self.folders)

    def __getitem__(self, index: int) -> dict[str, bytes]:
        return self.folders.encoded(index)

    def describe(self, index: int) -> str:
        return self.folders.describe(index)


def _fields(roots: Mapping[str, Path], roles: Mapping[str, Role] | None,
            where: str) -> dict[str, ImageField]:
    """Each folder's image field, with the role ``roles`` gives it (Image otherwise)."""
    if roles is None:
        roles = {}
    if not isinstance(roles, Mapping):
        raise TypeError(f"{where}: roles must be a dict of field name -> role (e.g. "
                        f"{{'mask': Mask()}}), got {roles!r}")
    for name in roles:
        if name not in roots:
            raise ValueError(f"{where}: roles names {name!r}, which is not in roots "
                             f"({list(roots)})")
    fields = {}
    for name in roots:
        try:
            fields[name] = ImageField(role=roles.get(name))
        except FieldError as exc:
            raise ValueError(f"{where}: roles[{name!r}]: {exc}") from exc
    return fields


def _list(root: Path, template: str | None, extensions: tuple[str, ...],
          name: str) -> dict[str, str]:
    """``{key: path relative to root}`` of the images under ``root``; the key is the relative
    path without the extension, with ``template``'s text around the name removed."""
    if not root.is_dir():
        raise FileNotFoundError(f"PairedFolders: roots[{name!r}] = {str(root)!r} is not a folder")
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
                raise ValueError(f"PairedFolders: {str(root)!r} holds {files[key]!r} and "
                                 f"{relative!r}, which pair with the same name {key!r}; keep one")
            files[key] = relative
    if unfit:
        raise ValueError(f"PairedFolders: {len(unfit)} files of roots[{name!r}] do not fit "
                         f"templates[{name!r}] = {template!r}: "
                         f"{', '.join(sorted(unfit)[:_SHOWN])}")
    return dict(sorted(files.items()))
