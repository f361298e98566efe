"""The map-style dataset shared by :class:`H5Dataset` and :class:`LMDBDataset`."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fastpipe._constants import DEFAULT_INTERPOLATION
from fastpipe.data import _format as fmt
from fastpipe.data._augment import PerSample
from fastpipe.data._collate_records import Rows
from fastpipe.data._decode import CorruptImageError, ImageDecoder, decode_rgb
from fastpipe.data._joint_kernels import check_fields, decode_stored, joint_record, moved_fields
from fastpipe.data._random import forked_default_generator, sample_seed
from fastpipe.data.collate import batch_empty
from fastpipe.data.joint import JOINT_STREAM, JointCrop
from fastpipe.data.roles import Image, Mask
from fastpipe.recipe import Recipe


def decode_chw(data: bytes | memoryview | np.ndarray, source: str = "<bytes>") -> torch.Tensor:
    """The default decoder: full decode to a uint8 ``(3, H, W)`` tensor."""
    return torch.from_numpy(decode_rgb(data, source)).permute(2, 0, 1).contiguous()


class PackDataset(PerSample, Dataset):
    """A map-style dataset over a fastpipe pack, opened lazily in each process.

    Each sample: ``decoder`` (bytes storage), then ``auto_augment``, then ``transform``; every
    random draw of sample ``i`` is a pure function of ``(seed, epoch, i)`` (see
    :class:`~fastpipe.data.ImageFolder`). With ``recipe=`` (a :class:`~fastpipe.Recipe`), the
    decoder is fastpipe's :class:`~fastpipe.data.ImageDecoder` for it and ``auto_augment`` the
    recipe's, as in ImageFolder; without one, ``decoder`` (default: a full decode to a uint8
    ``(3, H, W)`` tensor). ``file`` is the pack's path; ``path(i)`` names the file sample ``i``
    was packed from.

    Records (a records pack, a plain HDF5 file, tar shards): ``dataset[i]`` is a dict of the
    fields (a tuple with ``fields=[...]``, which picks and orders them, or for a pack of tuples);
    image fields go through the decoder (or the recipe's), the rest come back as stored (arrays
    as tensors of their dtype, see :mod:`fastpipe.data.fields`); ``auto_augment`` applies to the
    one image field, ``transform`` to the whole record. ``fields`` maps each name to its field;
    ``targets`` and ``classes`` come from a ``label`` int field when there is one.
    ``joint=`` (a :class:`~fastpipe.data.JointCrop`) crops, flips and turns the image fields
    together (and moves its box fields), drawn per sample from ``(seed, epoch, index)``, before
    ``transform``; it decodes the image fields itself (no decoder, recipe or auto_augment).

    The constructor opens the pack once to validate it and read the labels, then closes it, so
    nothing open is ever pickled or inherited: each DataLoader worker (fork or spawn) opens its own
    handle on first access, and a handle from before a fork is replaced in the child.
    """

    _format = ""

    def __init__(
        self,
        path: str | os.PathLike,
        decoder: Callable[[np.ndarray, str], Any] | None = None,
        transform: Callable[[Any], Any] | None = None,
        auto_augment: str | None = None,
        seed: int | None = None,
        *,
        recipe: Recipe | None = None,
        fields: Sequence[str] | None = None,
        joint: JointCrop | None = None,
    ) -> None:
        self.file = Path(path)
        if isinstance(fields, str):
            raise TypeError(f"fields must be a list of field names, got the string {fields!r}")
        self._fields_arg = None if fields is None else list(fields)
        where = type(self).__name__
        if joint is not None:
            _check_joint(joint, where, decoder=decoder, recipe=recipe, auto_augment=auto_augment)
        self.joint = joint
        if recipe is not None:
            if decoder is not None:
                raise ValueError(f"{where}: pass recipe= (fastpipe's decoder for it) or decoder=, "
                                 "not both")
            recipe = Recipe.resolve(recipe, PackDataset.__init__, where,
                                    auto_augment=auto_augment)
            decoder = ImageDecoder(recipe=recipe)
        elif isinstance(decoder, ImageDecoder):
            recipe = decoder.recipe.replace(auto_augment=auto_augment)
        self.decoder = decoder
        # Without a recipe, auto_augment's geometric ops resize with the decoder's filter.
        self._init_per_sample(transform, recipe, seed, auto_augment,
                              getattr(decoder, "interpolation", DEFAULT_INTERPOLATION))
        with self._open() as reader:
            self.meta: dict[str, Any] = reader.meta
            self._count = reader.count
            if not fmt.is_record_reader(reader):
                if joint is not None:
                    raise ValueError(f"{self.file} is an (image, label) pack; joint= crops the "
                                     "image fields of a records pack or a plain HDF5 file")
                if self._fields_arg is not None:
                    raise ValueError(f"{self.file} is an (image, label) pack; fields= picks the "
                                     "fields of a records pack or a plain HDF5 file")
                self.targets: np.ndarray | None = reader.labels
                self.classes: list[str] = reader.classes
                self.storage: str = reader.spec.storage
                self.layout: str | None = reader.spec.layout
                self.sample_shape = reader.spec.sample_shape
                self.fields: dict[str, Any] | None = None
            else:
                self._init_records(reader)
        if self.fields is None and decoder is not None and self.storage != "bytes":
            raise ValueError(
                f"{self.file} holds decoded arrays ({self.layout}) of one size, which cannot be "
                "cropped and resized per sample: a decoder applies to bytes storage only (and "
                "recipe= builds one); pack with storage='bytes' (fastpipe pack --storage bytes), "
                "or pass a transform instead")
        self._reader: fmt.PackReader | None = None
        self._pid: int | None = None

    def _init_records(self, reader: Any) -> None:
        """Record mode: the fields to return, in order, and the label field if there is one."""
        names = self._fields_arg or reader.order
        if unknown := [n for n in names if n not in reader.fields]:
            raise ValueError(f"{self.file} has no field {unknown[0]!r}; it has "
                             f"{', '.join(reader.order)}")
        self.fields = {n: reader.fields[n] for n in names}
        self._names = list(names)
        self._as_tuple = self._fields_arg is not None or reader.meta.get("record") == "tuple"
        self.storage, self.layout, self.sample_shape = "fields", None, None
        # Written with transcode=True: its PNGs are fastpipe's seekable rewrites, whose index
        # a crop may follow (fastpipe/pack/_transcode.py); never for a file of unknown origin.
        options = reader.meta.get("options")
        self._seekable = isinstance(options, dict) and options.get("transcode") is True
        # Fixed-shape numeric arrays a batch reads straight into one block (__getitems__).
        self._block_fields = {}
        moved = moved_fields(self.joint, self.fields) if self.joint is not None else set()
        if hasattr(reader, "reads_into"):
            for name in self._names:
                field = self.fields[name]
                if field.kind == "array" and not field.variable and field.stored_dtype.isnative \
                        and name not in moved:
                    try:
                        dtype = torch.from_numpy(np.empty(0, field.stored_dtype)).dtype
                    except TypeError:  # a dtype torch lacks: read per sample, as ever
                        continue
                    self._block_fields[name] = dtype
        label = reader.fields.get("label")
        self.targets = (np.asarray(reader.read_block("label", 0, reader.count), np.int64)
                        if label is not None and label.kind == "int" else None)
        self.classes = list(reader.classes.get("label", []))
        if self.joint is not None:
            check_fields(self.joint, self.fields, type(self).__name__)
        images = [n for n in names if self.fields[n].kind == "image"
                  and isinstance(self.fields[n].role, (Image, Mask))]
        masks = [n for n in images if isinstance(self.fields[n].role, Mask)]
        if masks and self.decoder is not None:
            raise ValueError(
                f"{type(self).__name__}: {masks} are Mask fields, decoded as stored and never "
                "resized; decoder= and recipe= resize and crop the image fields alone, which "
                "would misalign them: crop them together with joint=JointCrop(...), or leave "
                "the masks out with fields=[...]")
        if self._policy is not None and len(images) != 1:
            raise ValueError(f"auto_augment applies to one image field; {self.file} returns "
                             f"{len(images)} ({images}): pick the fields with fields=[...]")

    def _open(self) -> Any:
        try:
            found = fmt.sniff_format(self.file)
        except fmt.PackFormatError:
            found = None  # open_pack explains what the file is not
        if found is not None and found != self._format:
            reader = "LMDBDataset" if found == "lmdb" else "H5Dataset"
            raise fmt.PackFormatError(
                f"{self.file} is an {'LMDB' if found == 'lmdb' else 'HDF5'} file, but "
                f"{type(self).__name__} reads {'LMDB' if self._format == 'lmdb' else 'HDF5'} "
                f"packs: open it with fastpipe.data.{reader}")
        if self._format == "hdf5":
            from fastpipe.data.h5 import H5PackReader, H5RecordReader, h5_version

            version = h5_version(self.file)
            if version is None or version == fmt.RECORDS_VERSION:
                return H5RecordReader(self.file, plain=version is None, names=self._fields_arg)
            return H5PackReader(self.file)
        return fmt.open_pack(self.file, self._format)

    def _get_reader(self) -> Any:
        pid = os.getpid()
        if self._reader is None or self._pid != pid:
            if self._reader is not None:
                # Inherited through fork: close this process's copies of the parent's handles
                # (the parent's stay open) and open our own.
                try:
                    self._reader.close()
                except Exception:  # noqa: BLE001 - best effort on inherited handles
                    pass
            self._reader = None
            self._reader = self._open()
            self._pid = pid
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_pid"] = None
        return state

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> Any:
        reader = self._get_reader()
        i = reader._check_index(index)
        if self.fields is not None:
            return self._record(reader, i, self._epoch_of(index))
        return self._finish(reader, i, self._epoch_of(index), reader.read(i))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Batched read: samples are read in storage order, returned in the order asked."""
        reader = self._get_reader()
        checked = [reader._check_index(i) for i in indices]
        epochs = [self._epoch_of(i) for i in indices]
        order = np.argsort(checked, kind="stable")
        if self.fields is not None:
            blocks = self._read_blocks(reader, checked, order)
            out: list[Any] = [None] * len(checked)
            for k in order:
                out[k] = self._record(reader, checked[k], epochs[k],
                                      {name: block[k] for name, block in blocks.items()})
            if not blocks:
                return out
            return Rows(out, {self._names.index(n) if self._as_tuple else n: block
                              for n, block in blocks.items()})
        if self.storage == "array":
            dtype = torch.from_numpy(np.empty(0, reader.spec.dtype)).dtype
            rows = batch_empty((len(checked), *reader.spec.sample_shape), dtype)
            batch = rows.numpy()
            for k in order:
                reader.read(checked[k], batch[k])
            return Rows([self._finish(reader, i, epochs[k], None, rows[k])
                         for k, i in enumerate(checked)], {0: rows})
        data: list[np.ndarray | None] = [None] * len(checked)
        for k in order:
            data[k] = reader.read(checked[k])
        return [self._finish(reader, i, epochs[k], data[k]) for k, i in enumerate(checked)]

    def _finish(self, reader: fmt.PackReader, index: int, epoch: int, data: np.ndarray | None,
                tensor: torch.Tensor | None = None) -> tuple[Any, int]:
        # fastpipe's ImageDecoder draws from a generator it is given; any other decoder runs
        # under the forked global generator, as auto_augment and transform do.
        fused = isinstance(self.decoder, ImageDecoder)
        fork = self._needs_fork() or (self.decoder is not None and not fused)
        if not fork:
            return self._decoded(reader, index, epoch, data, tensor), int(self.targets[index])
        with forked_default_generator(sample_seed(self.seed, epoch, index, 1)):
            image = self._augmented(self._decoded(reader, index, epoch, data, tensor))
        return image, int(self.targets[index])

    def _read_blocks(self, reader: Any, indices: Sequence[int],
                     order: Sequence[int]) -> dict[str, torch.Tensor]:
        """The fixed-shape array fields of ``indices`` read straight into one batch block each
        (:func:`~fastpipe.data.collate.batch_empty`: fast_collate then returns the block instead
        of stacking a copy), in storage order; fields the reader cannot read so are left out."""
        blocks = {}
        for name, dtype in getattr(self, "_block_fields", {}).items():
            if not reader.reads_into(name):
                continue
            block = batch_empty((len(indices), *self.fields[name].row_shape), dtype)
            array = block.numpy()
            for k in order:
                reader.read_into(indices[k], name, array[k])
            blocks[name] = block
        return blocks

    def _record(self, reader: Any, index: int, epoch: int,
                read: dict[str, torch.Tensor] | None = None) -> Any:
        """Sample ``index`` as a dict of its fields (a tuple with ``fields=`` or for a pack of
        tuples): images through the decoder, the rest as :mod:`fastpipe.data.fields` returns
        them (``read``: fields already read, as tensors). auto_augment applies to the image
        field, transform to the whole record."""
        values = {}
        for name in self._names:
            field = self.fields[name]
            if read and name in read:
                values[name] = read[name]
                continue
            stored = reader.read(index, name)
            if self.joint is not None and field.kind == "image":
                values[name] = stored  # decoded by the joint crop, below
            elif field.kind == "image" and isinstance(field.role, (Image, Mask)):
                values[name] = self._decoded(reader, index, epoch, stored, None, name)
            else:
                values[name] = field.value(stored)
        if self.joint is not None:
            values = joint_record(self.joint, values, self.fields,
                                  sample_seed(self.seed, epoch, index, JOINT_STREAM),
                                  f"sample {index} of {self.file} (packed from "
                                  f"{reader.source(index)})", self._seekable)
        if not self._needs_fork():
            return tuple(values.values()) if self._as_tuple else values
        with forked_default_generator(sample_seed(self.seed, epoch, index, 1)):
            if self._policy is not None:
                name = next(n for n in self._names if self.fields[n].kind == "image")
                values[name] = self._policy(values[name])
            record = tuple(values.values()) if self._as_tuple else values
            return self._transform(record) if self._transform is not None else record

    def _decoded(self, reader: fmt.PackReader, index: int, epoch: int, data: np.ndarray | None,
                 tensor: torch.Tensor | None, field: str | None = None) -> Any:
        if self.storage == "array":
            return tensor if tensor is not None else torch.from_numpy(data)
        source = f"{self.file}[{index}]" + (f"[{field!r}]" if field is not None else "")
        try:
            if field is not None and isinstance(self.fields[field].role, Mask):
                return decode_stored(data, source)  # a mask: as stored, never resampled
            if isinstance(self.decoder, ImageDecoder):
                return self.decoder._from_seed(data, source, sample_seed(self.seed, epoch, index))
            return (self.decoder or decode_chw)(data, source)
        except CorruptImageError as exc:
            raise CorruptImageError(
                f"sample {index} of {self.file} (packed from {reader.source(index)}) does not "
                f"decode: {exc}"
            ) from exc

    def encoded(self, index: int) -> tuple[np.ndarray, int]:
        """The stored bytes of sample ``index`` (uint8 1-D array, e.g. a JPEG file) and its label.

        Bytes storage only; this is what a DALI external source feeds to its decoder.
        """
        if self.storage != "bytes":
            raise ValueError(f"{self.file} holds {self.storage} storage: encoded() needs bytes "
                             "storage (an (image, label) pack of encoded images)")
        reader = self._get_reader()
        i = reader._check_index(index)
        return reader.read(i), int(self.targets[i])

    def fingerprint(self) -> str:
        """A short hash of what the pack holds (its packing plan, which names the source files
        and options, and the labels), which a saved loader state must match
        (fastpipe.data._resume)."""
        digest = hashlib.sha256(str(self.meta.get("plan") or self.file).encode())
        if self.fields is not None:
            digest.update(f"{self._count}\0{self.meta.get('fields')}".encode())
        if self.targets is not None:
            digest.update(np.asarray(self.targets, dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def describe(self, index: int) -> str:
        """Names sample ``index`` for error messages: the pack, the index and the original file."""
        return f"{self.file}[{index}] (packed from {self.path(index)})"

    def path(self, index: int) -> str:
        """Where sample ``index`` was packed from (path relative to the source root, as listed)."""
        return self._get_reader().source(index)

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """Inputs left out when packing: ``{"index", "source", "reason"}`` dicts."""
        return list(self.meta.get("skipped") or [])

    def close(self) -> None:
        """Closes this process's handle (reopened on next access)."""
        if self._reader is not None and self._pid == os.getpid():
            self._reader.close()
        self._reader = None
        self._pid = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        if self.fields is not None:
            return (f"{type(self).__name__}({str(self.file)!r}, samples={len(self)}, "
                    f"fields={list(self.fields)})")
        shape = f", sample_shape={tuple(self.sample_shape)}" if self.sample_shape else ""
        return (f"{type(self).__name__}({str(self.file)!r}, samples={len(self)}, "
                f"storage={self.storage!r}"
                f"{shape}, classes={len(self.classes)})")


def _check_joint(joint: Any, where: str, **others: Any) -> None:
    """A joint crop decodes and crops the image fields itself: refuses what would also."""
    if not isinstance(joint, JointCrop):
        raise TypeError(f"{where}: joint must be a fastpipe.data.JointCrop or None, got "
                        f"{type(joint).__name__}")
    for name, value in others.items():
        if value is not None:
            raise ValueError(
                f"{where}: joint= and {name}= both shape the image fields and fastpipe does not "
                f"compose them; pass joint= alone (further per-sample steps go in transform=, "
                "which receives the cropped record)")
