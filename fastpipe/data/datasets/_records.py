"""RecordDataset: a map-style dataset over any source (fastpipe.data.sources), the one dataset
behind ``H5Dataset``, ``LMDBDataset`` and ``TarDataset``.

A source gives records in their stored form; this turns them into samples: image fields decoded
(fastpipe's fast path with a recipe, a decoder of the user's, or a full decode), or cropped with
the other fields by a joint crop; other fields as their field returns them; then ``auto_augment``
and ``transform``, every draw a pure function of ``(seed, epoch, index)``. A batch of fixed-shape
fields is read straight into one block per field, which fast_collate returns without a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fastpipe._constants import DEFAULT_INTERPOLATION
from fastpipe.data.collate.batch import batch_empty
from fastpipe.data.collate.encoded import EncodedImage
from fastpipe.data.collate.records import Rows
from fastpipe.data.datasets.per_sample import PerSample
from fastpipe.data.decode.budget import CorruptImageError
from fastpipe.data.decode.gpu import gpu_plan
from fastpipe.data.decode.image import ImageDecoder, decode_rgb
from fastpipe.data.format.roles import Image, Mask
from fastpipe.data.joint.crop import JOINT_STREAM, JointCrop
from fastpipe.data.joint.kernels import check_fields, decode_stored, joint_record, moved_fields
from fastpipe.data.sampling.seeds import forked_default_generator, sample_seed
from fastpipe.data.sources._base import Schema, Source, check_index, check_indices
from fastpipe.recipe import Recipe

__all__ = ["RecordDataset", "decode_chw"]


def decode_chw(data: bytes | memoryview | np.ndarray, source: str = "<bytes>") -> torch.Tensor:
    """The default decoder: full decode to a uint8 ``(3, H, W)`` tensor."""
    return torch.from_numpy(decode_rgb(data, source)).permute(2, 0, 1).contiguous()


def _torch_dtype(dtype: np.dtype) -> torch.dtype | None:
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError:  # a dtype torch lacks (uint16 on old torch, ...): read per sample
        return None


class RecordDataset(PerSample, Dataset):
    """A map-style dataset over a source: ``dataset[i]`` is record ``i`` as a dict of its fields
    (a tuple for ``fields=[...]``, which picks and orders them, or for a source of tuples), or an
    ``(image, label)`` pair for a source of pairs (an image pack, an image folder).

    Image fields go through ``decoder`` (``decoder(data, source)`` on the stored bytes; default:
    a full decode to a uint8 ``(3, H, W)`` tensor) or, with ``recipe=`` (a
    :class:`~fastpipe.Recipe`), fastpipe's :class:`~fastpipe.data.ImageDecoder` for it; decoded
    arrays come back as tensors. Other fields come back as their field returns them (arrays as
    tensors of their dtype, see :mod:`fastpipe.data.format.fields`). Then ``auto_augment`` (on the
    one image field) and ``transform`` (on the image of a pair, on the whole record otherwise).
    ``joint=`` (a :class:`~fastpipe.data.JointCrop`) crops, flips and turns the image fields
    together (and moves its box fields), instead of the decoder. Every random draw of sample
    ``i`` is a pure function of ``(seed, epoch, i)``.

    ``decode="gpu"`` leaves the image fields encoded: each is an
    :class:`~fastpipe.data.collate.encoded.EncodedImage`, the stored bytes and the recipe's draw
    for that sample (the crop box and flip the CPU path would use, from the same seed), which
    :func:`~fastpipe.data.fast_collate` batches and ``DataPrefetcher`` decodes on the GPU. It
    needs a recipe, and no ``auto_augment`` or ``transform`` (they need decoded pixels here).

    Safe with DataLoader workers under fork and spawn and with threads: the source opens its
    handles in each process on first use.
    """

    def __init__(
        self,
        source: Source,
        decoder: Callable[[np.ndarray, str], Any] | None = None,
        transform: Callable[[Any], Any] | None = None,
        auto_augment: str | None = None,
        seed: int | None = None,
        *,
        recipe: Recipe | None = None,
        fields: Sequence[str] | None = None,
        joint: JointCrop | None = None,
        decode: str = "cpu",
    ) -> None:
        where = type(self).__name__
        self.source = source
        schema = source.schema.select(fields, source.where) if fields is not None else \
            source.schema
        if joint is not None:
            _check_joint(joint, where, decoder=decoder, recipe=recipe, auto_augment=auto_augment)
        self.joint = joint
        if recipe is not None:
            if decoder is not None:
                raise ValueError(f"{where}: pass recipe= (fastpipe's decoder for it) or decoder=, "
                                 "not both")
            recipe = Recipe.resolve(recipe, RecordDataset.__init__, where,
                                    auto_augment=auto_augment)
            decoder = ImageDecoder(recipe=recipe)
        elif isinstance(decoder, ImageDecoder):
            recipe = decoder.recipe.replace(auto_augment=auto_augment)
        self.decoder = decoder
        self.decode = _check_decode(decode, where, decoder, transform, recipe, joint)
        # Without a recipe, auto_augment's geometric ops resize with the decoder's filter.
        self._init_per_sample(transform, recipe, seed, auto_augment,
                              getattr(decoder, "interpolation", DEFAULT_INTERPOLATION))
        self.schema: Schema = schema
        self.fields = dict(schema.fields)
        self._names = schema.names
        self._pair = schema.record == "pair"
        self._as_tuple = schema.record != "dict"
        self._images = [n for n in self._names if self.fields[n].kind == "image"
                        and isinstance(self.fields[n].role, (Image, Mask))]
        masks = [n for n in self._images if isinstance(self.fields[n].role, Mask)]
        if masks and decoder is not None:
            raise ValueError(
                f"{where}: {masks} are Mask fields, decoded as stored and never resized; decoder= "
                "and recipe= resize and crop the image fields alone, which would misalign them: "
                "crop them together with joint=JointCrop(...), or leave the masks out with "
                "fields=[...]")
        image = self.fields[self._names[0]] if self._pair else None
        self.storage = ("fields" if image is None else
                        "bytes" if image.kind == "image" else "array")
        if self.storage == "array" and decoder is not None:
            raise ValueError(
                f"{source.where} holds decoded arrays of one size, which cannot be cropped and "
                "resized per sample: a decoder applies to bytes storage only (and recipe= builds "
                "one); pack with storage='bytes' (fastpipe pack --storage bytes), or pass a "
                "transform instead")
        if joint is not None:
            if self._pair:
                raise ValueError(f"{source.where} is an (image, label) pack; joint= crops the "
                                 "image fields of a records pack or a plain HDF5 file")
            check_fields(joint, self.fields, where)
        if self._policy is not None and not self._pair and len(self._images) != 1:
            raise ValueError(f"auto_augment applies to one image field; {source.where} returns "
                             f"{len(self._images)} ({self._images}): pick the fields with "
                             "fields=[...]")
        labels = source.labels() if hasattr(source, "labels") else None
        self.targets: np.ndarray | None = labels
        label = getattr(source, "stored_label", source.schema.label)
        self.classes: list[str] = list(source.schema.classes.get(label, ())) if label else []
        # Fixed-shape numeric fields a batch reads straight into one block (__getitems__).
        self._blocks: dict[str, torch.dtype] = {}
        moved = moved_fields(joint, self.fields) if joint is not None else set()
        for name in self._names:
            f = self.fields[name]
            if (f.kind == "array" and not f.variable and np.dtype(f.stored_dtype).isnative
                    and name not in moved):
                dtype = _torch_dtype(np.dtype(f.stored_dtype))
                if dtype is not None:
                    self._blocks[name] = dtype
        # Every field a block and nothing done per sample (no images, no transform): a batch's
        # samples are the blocks' rows as they are.
        self._rows_only = (not self._pair and joint is None and bool(self._names)
                           and all(n in self._blocks for n in self._names))
        # Written with transcode=True: its PNGs are fastpipe's seekable rewrites, whose index
        # a crop may follow (fastpipe/pack/_transcode.py); never for a file of unknown origin.
        options = source.meta.get("options")
        self._seekable = isinstance(options, dict) and options.get("transcode") is True

    # ----------------------------------------------------------------------- what users see

    @property
    def meta(self) -> dict[str, Any]:
        """What the source stores about itself (a pack's JSON metadata)."""
        return self.source.meta

    @property
    def layout(self) -> str | None:
        """An image pack's samples: ``"encoded"`` files, ``"CHW"`` images or ``"raw"`` arrays
        (decoded, of one shape); None for records."""
        if not self._pair:
            return None
        return "encoded" if self.storage == "bytes" else self.meta.get("layout", "raw")

    @property
    def sample_shape(self) -> tuple[int, ...] | None:
        """The shape of an image pack's decoded arrays; None for encoded images and records."""
        if self.storage != "array":
            return None
        return tuple(self.fields[self._names[0]].shape)

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """Inputs left out when packing: ``{"index", "source", "reason"}`` dicts."""
        return list(self.meta.get("skipped") or [])

    def __len__(self) -> int:
        return len(self.source)

    def fingerprint(self) -> str:
        """A short hash of what the source holds (a pack's plan, which names the source files and
        options, and the labels), which a saved loader state must match
        (fastpipe.data.sampling.resume)."""
        return self.source.fingerprint()

    def describe(self, index: int) -> str:
        """Names sample ``index`` for error messages: the file, the index and where it came
        from."""
        return self.source.describe(index)

    def path(self, index: int) -> str:
        """Where sample ``index`` was packed from (path relative to the source root, as
        listed)."""
        i = check_index(index, len(self.source), self.source.where)
        paths = getattr(self.source, "paths", None)
        return paths(i, i + 1)[0] if paths is not None else self.source.describe(i)

    def encoded(self, index: int) -> tuple[np.ndarray, int]:
        """The stored bytes of sample ``index`` (uint8 1-D array, e.g. a JPEG file) and its label:
        what a DALI external source feeds to its decoder. Encoded image packs only."""
        if self.storage != "bytes":
            raise ValueError(f"{self.source.where} holds {self.storage} storage: encoded() needs "
                             "bytes storage (an (image, label) pack of encoded images)")
        i = check_index(index, len(self.source), self.source.where)
        record = self.source.read(i, self._names)
        return record[self._names[0]], int(record[self._names[1]])

    def close(self) -> None:
        """Closes this process's handles (reopened on next access)."""
        self.source.close()

    def __repr__(self) -> str:
        if not self._pair:
            return (f"{type(self).__name__}({self.source.where!r}, samples={len(self)}, "
                    f"fields={self._names})")
        shape = f", sample_shape={self.sample_shape}" if self.sample_shape else ""
        return (f"{type(self).__name__}({self.source.where!r}, samples={len(self)}, "
                f"storage={self.storage!r}{shape}, classes={len(self.classes)})")

    # ------------------------------------------------------------------------------- reading

    def __getitem__(self, index: int) -> Any:
        i = check_index(index, len(self.source), self.source.where)
        record = self.source.read(i, self._names)
        return self._sample(record, i, self._epoch_of(index))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch read at once: the fixed-shape fields straight into one block each."""
        checked = check_indices(indices, len(self.source), self.source.where)
        blocks = {name: batch_empty((len(checked), *self.fields[name].row_shape), dtype)
                  for name, dtype in self._blocks.items()}
        records = self.source.read_batch(checked, {n: b.numpy() for n, b in blocks.items()},
                                         self._names)
        if self._rows_only and not self._needs_fork():
            columns = [block.unbind(0) for block in blocks.values()]
            out = (list(zip(*columns)) if self._as_tuple
                   else [dict(zip(blocks, row)) for row in zip(*columns)])
            key = {n: self._names.index(n) if self._as_tuple else n for n in blocks}
            return Rows(out, {key[n]: block for n, block in blocks.items()},
                        {key[n]: column for n, column in zip(blocks, columns, strict=True)})
        epochs = [self._epoch_of(i) for i in indices]
        rows = {}
        for name, block in blocks.items():
            rows[name] = block.unbind(0)  # one call for every row's view
            for record, row in zip(records, rows[name], strict=True):
                record[name] = row
        out = [self._sample(record, i, epoch)
               for record, i, epoch in zip(records, checked.tolist(), epochs, strict=True)]
        if not blocks:
            return out
        key = {n: self._names.index(n) if self._as_tuple else n for n in blocks}
        return Rows(out, {key[n]: block for n, block in blocks.items()},
                    {key[n]: rows[n] for n in blocks})

    def _sample(self, record: dict[str, Any], index: int, epoch: int) -> Any:
        """Record ``index`` (stored values; block rows as tensors) as the dataset returns it."""
        values = {}
        fork = self._needs_fork() or (self.decoder is not None
                                      and not isinstance(self.decoder, ImageDecoder))
        for name in self._names:
            stored = record[name]
            field = self.fields[name]
            if isinstance(stored, torch.Tensor):
                values[name] = stored  # a row of a batch block
            elif name in self._images and self.joint is None:
                if fork:
                    values[name] = stored  # decoded under the sample's generator, below
                else:
                    values[name] = self._decode(stored, index, epoch, name)
            elif name in self._images:
                values[name] = stored  # decoded by the joint crop, below
            else:
                values[name] = field.value(stored)
        if self.joint is not None:
            values = joint_record(self.joint, values, self.fields,
                                  sample_seed(self.seed, epoch, index, JOINT_STREAM),
                                  self._naming(index), self._seekable)
        if not fork:
            return self._assemble(values)
        with forked_default_generator(sample_seed(self.seed, epoch, index, 1)):
            if self.joint is None:
                for name in self._images:
                    values[name] = self._decode(values[name], index, epoch, name)
            if self._pair:
                image, label = self._names
                values[image] = self._augmented(values[image])
                return values[image], values[label]
            if self._policy is not None:
                values[self._images[0]] = self._policy(values[self._images[0]])
            sample = self._assemble(values)
            return self._transform(sample) if self._transform is not None else sample

    def _assemble(self, values: dict[str, Any]) -> Any:
        return tuple(values.values()) if self._as_tuple else values

    def _decode(self, data: np.ndarray, index: int, epoch: int, name: str) -> Any:
        where = self.source.where
        source = f"{where}[{index}]" if self._pair else f"{where}[{index}][{name!r}]"
        try:
            if isinstance(self.fields[name].role, Mask):
                return decode_stored(data, source)  # a mask: as stored, never resampled
            if self.decode == "gpu":  # the bytes and the draw; DataPrefetcher decodes
                seed = sample_seed(self.seed, epoch, index)
                data, plan = gpu_plan(self.decoder, data, source, seed)
                return EncodedImage(data, plan, seed, index, self._naming(index), self.decoder)
            if isinstance(self.decoder, ImageDecoder):
                return self.decoder._from_seed(data, source, sample_seed(self.seed, epoch, index))
            return (self.decoder or decode_chw)(data, source)
        except CorruptImageError as exc:
            raise CorruptImageError(f"{self._naming(index)} does not decode: {exc}") from exc

    def _naming(self, index: int) -> str:
        """Sample ``index`` in messages: its source, and the file it was packed from."""
        paths = getattr(self.source, "paths", None)
        if paths is None:
            return f"sample {index} of {self.source.describe(index)}"
        try:
            packed = paths(index, index + 1)[0]
            return f"sample {index} of {self.source.where} (packed from {packed})"
        except Exception:  # noqa: BLE001 - a message must not fail on a damaged path index
            return f"sample {index} of {self.source.where}"


def _check_decode(decode: Any, where: str, decoder: Any, transform: Any,
                  recipe: Recipe | None, joint: Any = None) -> str:
    """``decode`` as given; "gpu" only where the GPU decode can run what the dataset would."""
    if decode not in ("cpu", "gpu"):
        raise ValueError(f"{where}: decode must be 'cpu' (the workers decode) or 'gpu' "
                         "(DataPrefetcher decodes on the GPU), got "
                         f"{decode!r}" + ("; 'auto' is image_loader's, which measures and picks"
                                          if decode == "auto" else ""))
    if decode == "cpu":
        return decode
    if joint is not None:
        raise ValueError(f"{where}(decode='gpu'): joint= crops the image fields together with "
                         "the masks and boxes on the CPU, and the GPU decode decodes a recipe's "
                         "crop of one image field: pass decode='cpu' with joint=")
    if not isinstance(decoder, ImageDecoder):
        raise ValueError(f"{where}(decode='gpu') needs recipe= (or the image keywords of "
                         "ImageFolder): the GPU decode crops, resizes and flips as a recipe says, "
                         "and a decoder of your own (or a full decode) runs on the CPU")
    if transform is not None:
        raise ValueError(f"{where}(decode='gpu'): transform= runs on decoded pixels in the "
                         "dataset, and the GPU decode decodes in DataPrefetcher: pass "
                         "decode='cpu', or move the transform to DataPrefetcher's "
                         "batch_transform (it runs on the device)")
    (recipe or decoder.recipe).check("gpu")
    return decode


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
