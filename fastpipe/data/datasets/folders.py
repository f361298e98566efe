"""``ImageFolder`` and ``PairedFolders``: a :class:`RecordDataset` over folders of image files
(fastpipe.data.sources.folder, fastpipe.data.sources.paired), with their image keywords."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from fastpipe._constants import (
    DEFAULT_CROP_PCT,
    DEFAULT_HFLIP,
    DEFAULT_INTERPOLATION,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    DEFAULT_SIZE,
)
from fastpipe.data.datasets._records import RecordDataset
from fastpipe.data.decode.image import ImageDecoder
from fastpipe.data.format.fields import FieldError, ImageField
from fastpipe.data.format.roles import Role
from fastpipe.data.joint.crop import JointCrop
from fastpipe.data.sources.folder import FolderSource
from fastpipe.data.sources.listing import IMG_EXTENSIONS
from fastpipe.data.sources.paired import PairedSource
from fastpipe.recipe import Recipe

__all__ = ["ImageFolder", "PairedFolders"]


class ImageFolder(RecordDataset):
    """A map-style dataset over ``root/<class>/**/<image>``, giving ``(uint8 (3, H, W), label)``.

    Same classes, order and labels as ``torchvision.datasets.ImageFolder``: class folders sorted by
    name get labels 0, 1, ...; files found recursively, sorted. Each sample follows the
    per-sample part of a :class:`~fastpipe.Recipe` (``recipe=``, or the keywords ``train``,
    ``size``, ``scale``, ``ratio``, ``hflip``, ``crop_pct``, ``interpolation`` and
    ``auto_augment``, which build one): an :class:`~fastpipe.data.ImageDecoder` (with
    ``reducing_gap`` and ``fast_upsample``) random-resized-crops and flips in train mode, resizes
    and centre-crops in eval, in one step after a reduced-scale JPEG decode; then
    ``auto_augment`` (``"ra"``, ``"ta_wide"``, ``"augmix"``, ``"imagenet"`` or timm's
    ``"rand-m9-mstd0.5-inc1"`` style) and ``transform`` (a callable on the uint8 ``(3, H, W)``
    tensor, e.g. torchvision.transforms.v2 ops) run on the result. The recipe's batch part
    (``mean``, ``std``, ``dtype``, ``channels_last``) is the loader's: collate batches with
    :func:`~fastpipe.data.fast_collate` and normalize on the device (``DataPrefetcher``).
    ``decode="gpu"`` hands each sample's bytes and drawn geometry to ``DataPrefetcher``, which
    decodes, crops, resizes and flips the batch on the GPU (see
    :class:`~fastpipe.data.datasets._records.RecordDataset`).

    Every random draw of sample ``i`` (crop, flip, auto_augment, torch draws of ``transform``) is
    a pure function of ``(seed, epoch, i)``: the same batches whatever ``num_workers``.
    ``seed=None`` draws one from torch's generator at construction; the epoch is the index's own
    (:class:`~fastpipe.data.SampleIndex`, from fastpipe's samplers) or ``set_epoch``'s.

    Per-sample metadata lives in numpy arrays (one byte buffer of paths plus offsets, and the
    labels), not Python lists, so DataLoader workers do not copy it page by page as reference
    counts change (pytorch#13246).

    ``root`` may be a folder URL (``"s3://bucket/train/"``, ``"https://..."``; ``remote=``: a
    :class:`~fastpipe.data.RemoteOptions`): listed once, in the same order, and each image read
    through the node's cache (an object per image: tar shards or a pack read much faster from
    object storage, docs/object-storage.md).

    Attributes:
        classes: class names, sorted. class_to_idx: name -> label. targets: int64 labels (N,).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        train: bool = True,
        size: int | tuple[int, int] = DEFAULT_SIZE,
        scale: tuple[float, float] = DEFAULT_SCALE,
        ratio: tuple[float, float] = DEFAULT_RATIO,
        hflip: float = DEFAULT_HFLIP,
        crop_pct: float = DEFAULT_CROP_PCT,
        interpolation: str = DEFAULT_INTERPOLATION,
        auto_augment: str | None = None,
        transform: Callable[[torch.Tensor], Any] | None = None,
        seed: int | None = None,
        reducing_gap: float | None = None,
        fast_upsample: bool | None = None,
        extensions: Iterable[str] = IMG_EXTENSIONS,
        *,
        recipe: Recipe | None = None,
        decode: str = "cpu",
        remote: Any = None,
    ) -> None:
        from fastpipe.data.remote.urls import is_url

        self.root = root if is_url(root) else Path(root)
        recipe = Recipe.resolve(
            recipe, ImageFolder.__init__, "ImageFolder", train=train, size=size, scale=scale,
            ratio=ratio, hflip=hflip, crop_pct=crop_pct, interpolation=interpolation,
            auto_augment=auto_augment)
        recipe.check("cpu")
        decoder = ImageDecoder(recipe=recipe, reducing_gap=reducing_gap,
                               fast_upsample=fast_upsample)
        super().__init__(FolderSource(self.root, extensions, remote), decoder, transform,
                         recipe.auto_augment, seed, decode=decode)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def path(self, index: int) -> str:
        """The file of sample ``index``."""
        return self.source.describe(self._check(index))

    def _check(self, index: int) -> int:
        from fastpipe.data.sources._base import check_index

        return check_index(index, len(self.source), "an ImageFolder")

    def __repr__(self) -> str:
        return (f"ImageFolder(root={self.source.where!r}, {len(self)} images, "
                f"{len(self.classes)} classes, decoder={self.decoder!r}, "
                f"auto_augment={self.auto_augment!r}, transform={self.transform!r}, "
                f"seed={self.seed})")


class PairedFolders(RecordDataset):
    """A map-style dataset over folders of aligned images: ``dataset[i] -> {"lr": ..., "hr": ...}``.

    ``roots`` maps each field name to a folder (``{"lr": "DIV2K/LR_x2", "hr": "DIV2K/HR"}``,
    ``{"image": "images", "mask": "masks"}``). Files pair by their path relative to their folder
    without the extension (``a/0001.png`` with ``a/0001.jpg``), found recursively and sorted;
    ``templates`` gives a folder's file names around that key, BasicSR's ``filename_tmpl``
    (``{"lr": "{}x2"}`` pairs ``LR_x2/0001x2.png`` with ``HR/0001.png``). A file with no partner in
    every other folder is an error giving their count and the first names;
    ``on_unmatched="skip"`` leaves them out, with a warning, and lists them in ``unmatched``.

    ``roles`` gives a folder's files a role (:mod:`fastpipe.data.format.roles`):
    ``{"mask": Mask()}`` for segmentation masks, kept as stored (channels, dtype, palette
    indices, 16-bit values) and never interpolated; the others are :class:`~fastpipe.data.Image`.
    ``fields`` holds each folder's field with its role.

    ``joint`` (a :class:`~fastpipe.data.JointCrop`) crops, flips and turns every field together,
    one draw per sample from ``(seed, epoch, index)``: the same crops on any number of process or
    thread workers (``DataLoaderX``) and after a mid-epoch resume. PNG fields decode only the rows
    of their crop. Image fields come back as uint8 ``(3, H, W)`` tensors, mask fields (and a
    ``"nearest"`` field of the crop) as stored ``(C, H, W)``; without ``joint``, every field is
    decoded whole the same way. ``transform`` then runs on the dict, under the per-sample seed.

    Picklable (spawn workers); :meth:`pack_source` is what ``fastpipe.pack.pack`` packs: the
    stored bytes unchanged, as image fields with their roles, for ``H5Dataset(pack, joint=...)``.
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
        source = PairedSource(roots, templates=templates, fields=_fields(roots, roles, where),
                              on_unmatched=on_unmatched, extensions=extensions, where=where)
        self.roots = source.roots
        self.templates = source.templates
        self.unmatched = source.unmatched
        super().__init__(source, transform=transform, seed=seed, joint=joint)

    def paths(self, index: int) -> dict[str, str]:
        """The files of sample ``index``, per field."""
        from fastpipe.data.sources._base import check_index

        i = check_index(index, len(self.source), "a PairedFolders")
        return {name: self.source.path(name, i) for name in self.roots}

    def encoded(self, index: int) -> dict[str, bytes]:  # type: ignore[override]
        """The stored bytes of each file of sample ``index``, unchanged."""
        from fastpipe.data.sources._base import check_index

        i = check_index(index, len(self.source), "a PairedFolders")
        return {name: value.tobytes() for name, value in self.source.read(i).items()}

    def pack_source(self) -> PairedSource:
        """What ``fastpipe.pack.pack`` packs: every sample's files as they are, as image fields
        with their roles, for ``H5Dataset(pack, joint=...)`` to read."""
        return self.source

    def _naming(self, index: int) -> str:
        return f"sample {index} of PairedFolders ({self.source.describe(index)})"

    def __repr__(self) -> str:
        return (f"PairedFolders({self.source.where}, pairs={len(self)}, joint={self.joint!r}, "
                f"seed={self.seed})")


def _fields(roots: Mapping[str, Any], roles: Mapping[str, Role] | None,
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
            fields[str(name)] = ImageField(role=roles.get(name))
        except FieldError as exc:
            raise ValueError(f"{where}: roles[{name!r}]: {exc}") from exc
    return fields
