"""What ``pack`` reads, and how one input becomes the stored rows of the pack's fields.

The source is one of fastpipe.data.sources (``resolve`` answers what a path names: an image folder,
a list file, a ``#fields`` list, ``.npy`` files, tar shards, a pack), a source given as it is, or
a map-style dataset (a Hugging Face dataset included). The source keeps what it lists in numpy
buffers (paths in one byte buffer plus offsets, labels in an int64 array), so the parent holds no
Python object per input and a task names only its range of inputs.

An ``(image, label)`` source (record ``"pair"``) is packed as the record ``{"image", "label"}``
whose image the options shape: encoded bytes kept, re-encoded (``max_side``) or transcoded, or
decoded to uint8 ``(3, H, W)`` arrays (``storage="array"``, ``size``); any other source is packed
as its records, every field as stored.

An input that cannot be read (an unreadable or empty file, a corrupt image, a dataset's
``__getitem__`` raising) is a :class:`SkipInput`; a value that does not fit its field
(fastpipe.data.format.fields.FieldError), or a label below -1, is a :class:`PackError`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.decode.budget import CorruptImageError, ImageTooLargeError
from fastpipe.data.decode.image import decode_rgb
from fastpipe.data.format import fields as F
from fastpipe.data.format.layout import INTERNAL, unsealed_reason
from fastpipe.data.format.roles import Image, Label, Mask
from fastpipe.data.sources._base import Schema, Source
from fastpipe.data.sources._engine import resource_error
from fastpipe.data.sources.dataset import DatasetSource
from fastpipe.data.sources.folder import PathTable
from fastpipe.pack._errors import PackError, SourceError

NO_LABEL = -1
LABEL_RANGE = "labels are class indices (0 and up), or -1 for a sample without one"
# Inputs tried for the first readable one, which gives the shape of array storage.
_PROBES = 64
# The kinds whose plan sees every input file (so a rewritten file is packed again, and an
# interrupted run resumes by default); datasets and other sources resume only when asked.
FILE_KINDS = ("folder", "list", "images", "arrays", "columns", "tar", "hdf5", "lmdb")


class SkipInput(Exception):
    """This input is unreadable or corrupt: skip it (or stop with ``strict``)."""


class DatasetRaised(Exception):
    """A dataset's ``__getitem__`` raised: the input is skipped, not the packing stopped."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"dataset[{index}] raised {type(error).__name__}: {error}")


class _Guarded:
    """A user's map-style dataset, whose own errors are told apart from the packer's (a value
    that does not fit its field, a record of other fields): what its ``__getitem__`` raises
    becomes :class:`DatasetRaised`. Everything else is the dataset's."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - a user dataset may raise anything for a bad sample
            raise DatasetRaised(index, exc) from exc

    def describe(self, index: int) -> str:
        describe = getattr(self.dataset, "describe", None)
        if callable(describe):  # fastpipe's datasets name a sample's origin (shard:key, file[i])
            return str(describe(index))
        return f"{type(self.dataset).__name__}[{index}]"

    def __getattr__(self, name: str) -> Any:
        try:
            dataset = self.__dict__["dataset"]
        except KeyError:  # while unpickling
            raise AttributeError(name) from None
        return getattr(dataset, name)


@dataclass(frozen=True)
class Shaping:
    """The options that shape an ``(image, label)`` pack's images (PackOptions' image part)."""

    storage: str = "bytes"
    max_side: int | None = None
    size: tuple[int, int] | None = None
    quality: int = 90
    check: bool = True
    transcode: bool = False


@dataclass
class Inputs:
    """The inputs of one pack: the source, the fields the pack stores (``schema``), and how an
    input becomes their stored rows (:meth:`load`). Picklable: sent once to each worker
    process."""

    source: Source
    schema: Schema
    kind: str  # "folder", "list", "tar", ..., "dataset" or "source"
    shaping: Shaping

    @property
    def count(self) -> int:
        return len(self.source)

    @property
    def pair(self) -> bool:
        return self.schema.record == "pair"

    @property
    def names(self) -> list[str]:
        return self.schema.names

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "description": self.source.where, "inputs": self.count}

    def name(self, index: int) -> str:
        """What the pack stores as input ``index``'s source: its path as listed (relative to a
        folder's root, as written in a list file), or how the source names it."""
        paths = getattr(self.source, "paths", None)
        if paths is not None:
            return paths(index, index + 1)[0]
        return self.source.describe(index)

    # --------------------------------------------------------------------------------- reading

    def read(self, index: int) -> dict[str, Any]:
        """Input ``index`` as the source stores it; :class:`SkipInput` when it cannot be read."""
        try:
            return self.source.read(index, self.names)
        except (KeyboardInterrupt, SystemExit):
            raise
        except DatasetRaised as exc:
            raise SkipInput(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - sources raise what their files give
            if resource_error(exc):
                raise  # a limit of the machine, never a bad input
            field = field_error(exc)
            if field is not None:
                raise PackError(str(field)) from exc
            if self.kind == "dataset":  # the packer's own check of a dataset's sample
                raise PackError(str(exc)) from exc
            raise SkipInput(f"unreadable: {getattr(exc, 'strerror', None) or exc}") from exc

    def load(self, index: int, name: str) -> dict[str, np.ndarray]:
        """The stored rows of input ``index`` (named ``name`` in messages), one per field."""
        record = self.read(index)
        if self.schema.record == "pair":
            image, label = self.schema.names
            where = f"dataset[{index}]" if self.kind == "dataset" else name
            return {image: self._image(record[image], name),
                    label: np.asarray(_label(record[label], where), "<i8")}
        return self._record(record, name)

    def _image(self, value: Any, source: str) -> np.ndarray:
        field = self.schema.fields[self.names[0]]
        value = _as_array(value)
        if field.kind == "image":
            if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
                value = value.tobytes()
            if isinstance(value, bytes):
                if not value:
                    raise SkipInput("empty file")
                return np.frombuffer(self._rewritten(self._encoded(value, source), source),
                                     np.uint8)
            if value.dtype == np.uint8 and (value.ndim == 2 or _is_image(value)):
                return np.frombuffer(self._encode_array(value), np.uint8)
            raise PackError(
                f"{source} is a {value.dtype} array of shape {value.shape}: bytes storage holds "
                "encoded images (bytes, or uint8 HxW / HxWx3 arrays); use storage='array' for "
                "other arrays")
        if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
            value = value.tobytes()
        if isinstance(value, bytes):
            if not value:
                raise SkipInput("empty file")
            value = decode(value, source)
        array = np.asarray(value)
        chw = isinstance(field.role, Image)
        if chw:
            if array.dtype == np.uint8 and array.ndim == 2:
                array = np.repeat(array[:, :, None], 3, axis=2)
            if not _is_image(array):
                raise PackError(f"{source} is a {array.dtype} array of shape {array.shape}, not "
                                "an HxWx3 uint8 image like the first input of this pack")
            if self.shaping.size is not None:
                array = fit_image(array, self.shaping.size)
            array = array.transpose(2, 0, 1)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        if tuple(array.shape) != tuple(field.shape) or array.dtype != np.dtype(field.dtype):
            got, want = tuple(array.shape), tuple(field.shape)
            if chw:
                got, want = got[1:], want[1:]
            hint = " pass size=(H, W) to resize images to one size" if chw else ""
            raise PackError(
                f"array storage needs one shape and dtype for all samples: {source} is "
                f"{array.dtype} {got}, the pack holds {field.dtype} {want};{hint}")
        return np.asarray(array, field.stored_dtype, order="C")

    def _record(self, record: dict[str, Any], source: str) -> dict[str, np.ndarray]:
        rows = {}
        for name in self.names:
            field = self.schema.fields[name]
            row = np.asarray(record[name], field.stored_dtype, order="C")
            trailing = row.shape[1:] if field.variable else row.shape
            if trailing != tuple(field.row_shape) or (field.variable and row.ndim == 0):
                raise PackError(f"{source}: field {name!r} has stored shape {row.shape}, the "
                                f"field's rows are {tuple(field.row_shape)}")
            rows[name] = row
        for name in self.names:
            if self.schema.fields[name].kind != "image":
                continue
            data = rows[name].tobytes()
            if self.shaping.check:
                try:
                    decode(data, f"{source}[{name!r}]")
                except SkipInput as exc:
                    raise SkipInput(f"field {name!r}: {exc}") from exc
            if self.shaping.transcode:
                from fastpipe.pack._transcode import transcoded

                rows[name] = np.frombuffer(transcoded(data, f"{source}[{name!r}]"), np.uint8)
        return rows

    # ------------------------------------------------------------------ an image's stored bytes

    def _rewritten(self, data: bytes, source: str) -> bytes:
        """With ``transcode``, the image rewritten losslessly for crops (fastpipe.pack._transcode);
        anything else as it is."""
        if not self.shaping.transcode:
            return data
        from fastpipe.pack._transcode import transcoded

        return transcoded(data, source)

    def _encoded(self, data: bytes, source: str) -> bytes:
        """The image's stored bytes: as they are, or re-encoded at ``max_side``. fastpipe's
        decoder judges the file (its damage verdict, the pixel budget, the bound on a PNG's
        declared size): Pillow, which decodes damaged files through (a PNG cut short comes back
        with zero rows, then would be re-encoded as a valid file), only resizes and re-encodes
        the pixels it gave."""
        max_side = self.shaping.max_side
        if max_side is None or not self.shaping.check and _fits(data, max_side):
            if self.shaping.check:
                decode(data, source)
            return data  # check=False trusts an input it need not decode
        pixels = decode(data, source)
        height, width = pixels.shape[:2]
        short = min(height, width)
        if short <= max_side:
            return data  # already small enough: keep the original bytes, bit for bit
        from PIL import Image as PILImage

        scale = max_side / short
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        resized = PILImage.fromarray(pixels).resize(size, PILImage.Resampling.BICUBIC,
                                                    reducing_gap=3.0)
        out = io.BytesIO()
        if bytes(data[:3]) == b"\xff\xd8\xff":
            resized.save(out, format="JPEG", quality=self.shaping.quality)
        else:
            resized.save(out, format="PNG")
        return out.getvalue()

    def _encode_array(self, array: np.ndarray) -> bytes:
        from PIL import Image as PILImage

        image = PILImage.fromarray(array)
        max_side = self.shaping.max_side
        if max_side is not None and min(image.size) > max_side:
            scale = max_side / min(image.size)
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, PILImage.Resampling.BICUBIC)
        out = io.BytesIO()
        image.save(out, format="PNG")  # lossless: what the dataset returned is what comes back
        return out.getvalue()

    # ------------------------------------------------------------------------------- the plan

    def fingerprint(self) -> str:
        """What a resumed run must match: the source's own fingerprint (its files' names and
        labels, a pack's plan) and, for sources of files, each file's size and modification time
        (a file rewritten in place is packed again); for a dataset its type and length (its
        contents are invisible to the plan)."""
        digest = hashlib.sha256(self.kind.encode())
        if self.kind in ("dataset", "source"):
            inner = getattr(self.source, "dataset", self.source)
            inner = getattr(inner, "dataset", inner)  # the user's, inside the guard
            kind = type(inner)
            digest.update(f"\0{kind.__module__}.{kind.__name__}\0{self.count}".encode())
            return digest.hexdigest()
        digest.update(self.source.fingerprint().encode())
        digest.update(json.dumps({n: list(c) for n, c in self.source.schema.classes.items()},
                                 sort_keys=True).encode())
        for table in _file_tables(self.source):
            _digest_stats(digest, table)
        for path in _pack_files(self.source):
            st = os.stat(path)
            digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\1".encode())
        return digest.hexdigest()


def field_error(exc: BaseException) -> F.FieldError | None:
    """The FieldError behind ``exc`` (a source reports one as a ValueError), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, F.FieldError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _label(value: Any, where: str) -> int:
    label = int(value)
    if label < NO_LABEL:
        raise PackError(f"{where} has label {label}; {LABEL_RANGE}")
    return label


def _file_tables(source: Source) -> list[PathTable]:
    """The tables of input files of a source of files (one per column of a ``#fields`` list or
    per folder of paired images)."""
    tables = []
    for attribute in ("files", "_files"):
        value = source.__dict__.get(attribute)
        if isinstance(value, PathTable):
            tables.append(value)
        elif isinstance(value, Mapping):
            tables.extend(v for v in value.values() if isinstance(v, PathTable))
    return tables


def _pack_files(source: Source) -> list[str]:
    """The files of an HDF5 or LMDB file read as a source (with the part files of a virtual
    merge)."""
    if _kind_of_source(source) not in ("hdf5", "lmdb"):
        return []
    path = Path(source.path)
    files = [str(path.resolve())]
    for part in source.meta.get("parts") or []:
        if isinstance(part, dict) and isinstance(part.get("file"), str):
            files.append(str((path.parent / part["file"]).resolve()))
    return files


def _digest_stats(digest: Any, table: PathTable, block: int = 4096) -> None:
    """Each file's size and modification time into ``digest``, a block at a time (no Python
    object per file is kept); names are looked up relative to the table's root folder as bytes,
    without building each path."""
    n = len(table)
    root = os.open(table.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if table.root \
        else None
    try:
        for start in range(0, n, block):
            stop = min(n, start + block)
            first = int(table.offsets[start])
            raw = table.data[first:int(table.offsets[stop])].tobytes()
            ends = (table.offsets[start:stop + 1] - first).tolist()
            stats = np.empty((stop - start, 2), "<i8")
            for k in range(stop - start):
                try:
                    st = os.stat(raw[ends[k]:ends[k + 1]], dir_fd=root)
                    stats[k] = st.st_size, st.st_mtime_ns
                except OSError:  # unreadable inputs are skipped (or refused) when packing
                    stats[k] = -1, -1
            digest.update(stats.tobytes())
    finally:
        if root is not None:
            os.close(root)


# ---------------------------------------------------------------------------------------------
# Opening the source


def open_inputs(source: Any, fields: Mapping[str, F.Field] | Sequence[str] | None,
                shaping: Shaping) -> Inputs:
    """The inputs of ``pack(source, ..., fields=fields)``: the source resolved, the pack's fields
    decided (an image pack's image field by the options, from its first readable input for array
    storage)."""
    opened, kind = _open(source, fields)
    if kind in ("hdf5", "lmdb"):
        reason = unsealed_reason(opened.meta, opened.where)
        if reason is not None:  # packed again, the edited metadata would get a new checksum
            raise SourceError(f"{reason}. pack refuses it as a source: the new pack would "
                              "store its fields as they now read under a new checksum")
    if not len(opened):
        raise SourceError(f"the source {opened.where} has no inputs")
    schema = opened.schema
    if kind != "dataset" and fields is not None:
        schema = _declared(schema, fields, opened.where)
    if schema.record == "pair":
        probe = Inputs(opened, schema, kind, shaping)
        image, label = schema.names
        classes = schema.classes.get(label, ())
        schema = Schema({image: _image_field(probe, shaping),
                         label: F.IntField("int64", role=Label())}, "pair",
                        {label: list(classes)})
    else:
        _check_record_options(shaping)
        for name in schema.names:
            check_name(name)
        schema = Schema({n: _with_label_role(f, n in schema.classes)
                         for n, f in schema.fields.items()}, schema.record, schema.classes)
    return Inputs(opened, schema, kind, shaping)


def _open(source: Any, fields: Any) -> tuple[Source, str]:
    from fastpipe.data.sources.resolve import resolve

    if isinstance(source, Source):
        return source, _kind_of_source(source)
    if isinstance(source, (str, os.PathLike)):
        if not os.path.lexists(source) and not any(c in os.fspath(source) for c in "*?["):
            raise FileNotFoundError(
                f"pack source {source} does not exist (expected an ImageFolder tree, a list "
                "file, a folder of .npy files, tar shards or a pack)")
        names = list(fields) if isinstance(fields, Sequence) and not isinstance(
            fields, str) else None
        try:
            opened = resolve(source, fields=names)
        except (PackError, FileNotFoundError):
            raise
        except F.FieldError as exc:
            raise PackError(str(exc)) from exc
        except ValueError as exc:  # nothing to pack, or not a source: the input's mistake
            raise SourceError(str(exc)) from exc
        kind = _kind_of_source(opened)
        if fields is not None and kind not in ("tar", "hdf5", "lmdb"):
            raise PackError(f"fields= applies to datasets and to the records of tar shards and "
                            f"packs; {source} is a {kind} source, whose fields come from its "
                            "files")
        return opened, kind
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(p, (str, os.PathLike)) for p in source):
        from fastpipe.data.sources.tar import TarSource

        try:
            return TarSource(source, list(fields) if fields is not None else None), "tar"
        except ValueError as exc:
            raise SourceError(str(exc)) from exc
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        try:
            opened = DatasetSource(source, fields, raw=True)
        except F.FieldError as exc:
            raise PackError(str(exc)) from exc
        except ValueError as exc:
            raise SourceError(str(exc)) from exc
        # Read through the guard from now on: the dataset's own errors skip its input.
        opened.dataset = _Guarded(source)
        return opened, "dataset"
    raise TypeError(
        f"pack source must be a folder, a list file, tar shards, a pack or a map-style dataset "
        f"(with __len__ and __getitem__ returning (image, label) or records), got "
        f"{type(source).__name__}")


def _kind_of_source(source: Source) -> str:
    from fastpipe.data.sources.arrays import ArrayFilesSource, ColumnsSource
    from fastpipe.data.sources.folder import FolderSource, ListSource
    from fastpipe.data.sources.paired import PairedSource
    from fastpipe.data.sources.tar import TarSource

    kinds = ((FolderSource, "folder"), (ListSource, "list"), (PairedSource, "images"),
             (ArrayFilesSource, "arrays"), (ColumnsSource, "columns"), (TarSource, "tar"),
             (DatasetSource, "dataset"))
    for cls, kind in kinds:
        if isinstance(source, cls):
            return kind
    from fastpipe.data.sources.h5 import H5Source
    from fastpipe.data.sources.lmdb import LMDBSource

    if isinstance(source, H5Source):
        return "hdf5"
    if isinstance(source, LMDBSource):
        return "lmdb"
    return "source"


def _declared(schema: Schema, fields: Any, where: str) -> Schema:
    """The fields ``fields=`` names (picked, in order) or declares for a source with its own
    schema: a declared field must be stored as the source's is; it may give the role."""
    if not isinstance(fields, Mapping):
        return schema.select(list(fields), where)
    out = dict(schema.fields)
    for name, field in fields.items():
        if name not in out:
            raise PackError(f"fields declares {name!r}, which {where} does not have (it has "
                            f"{', '.join(out)})")
        if not isinstance(field, F.Field):
            raise PackError(f"fields[{name!r}] is {field!r}; declare a field with ImageField(), "
                            "ArrayField(dtype, shape), IntField(), FloatField(), BytesField() "
                            "or StrField()")
        if _storage(field) != _storage(out[name]):
            raise PackError(f"fields[{name!r}] is {field!r}, but {where} stores {out[name]!r}; "
                            "a declared field of a source's records may give its role, not "
                            "another kind, dtype or shape")
        out[name] = field
    return Schema(out, schema.record, schema.classes)


def _storage(field: F.Field) -> dict[str, Any]:
    data = field.to_json()
    data.pop("role", None)
    return data


def _with_label_role(field: F.Field, has_classes: bool) -> F.Field:
    """An int field with class names and no role of its own is a Label (what the readers of
    version 2 made of it), so the role is stored with it."""
    if has_classes and field.kind == "int" and type(field.role) is F.IntField.default_role:
        return F.IntField(field.dtype, role=Label())
    return field


def check_name(name: str) -> str:
    if not name or "/" in name or name.startswith(INTERNAL) or name in (".", ".."):
        raise PackError(f"field name {name!r} cannot name an HDF5 dataset at the root (no '/', "
                        f"not empty, not starting with {INTERNAL!r})")
    return name


def _check_record_options(shaping: Shaping) -> None:
    """Refuses the image-pack options a records pack cannot honour."""
    image_only = {"storage": shaping.storage != "bytes", "max_side": shaping.max_side is not None,
                  "size": shaping.size is not None}
    if given := [name for name, set_ in image_only.items() if set_]:
        raise PackError(f"{', '.join(given)} apply to (image, label) packs; a records pack keeps "
                        "every field as the dataset returned it")


def _image_field(inputs: Inputs, shaping: Shaping) -> F.Field:
    """The image field of an ``(image, label)`` pack: encoded bytes, or for array storage decoded
    uint8 ``(3, H, W)`` images (role Image) or raw arrays, as the first readable input of the
    whole source shows (so that every part of a multi-machine pack agrees)."""
    if shaping.storage == "bytes":
        return F.ImageField()
    if shaping.size is not None and inputs.kind != "dataset":
        return F.ArrayField("uint8", (3, *shaping.size), role=Image())
    reasons = []
    image = inputs.names[0]
    for index in range(min(inputs.count, _PROBES)):
        name = inputs.name(index)
        try:
            value = _as_array(inputs.read(index)[image])
            if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
                value = value.tobytes()
            if isinstance(value, bytes):
                if not value:
                    raise SkipInput("empty file")
                value = decode(value, name)
        except SkipInput as exc:
            reasons.append(f"{name}: {exc}")
            continue
        array = np.asarray(value)
        if array.dtype == np.uint8 and array.ndim == 2:
            array = np.repeat(array[:, :, None], 3, axis=2)
        if _is_image(array):
            h, w = shaping.size if shaping.size is not None else array.shape[:2]
            return F.ArrayField("uint8", (3, int(h), int(w)), role=Image())
        if shaping.size is not None:
            raise PackError(f"size=(H, W) resizes images, but {name} is a {array.dtype} array of "
                            f"shape {array.shape}; pack arrays without size")
        try:
            return F.ArrayField(array.dtype.name, tuple(int(s) for s in array.shape))
        except F.FieldError as exc:
            raise PackError(f"{name} is an array of {array.dtype}; array storage holds plain "
                            "numeric arrays") from exc
    raise PackError(f"array storage needs one readable input to learn the sample shape; the first "
                    f"{len(reasons)} inputs failed: {'; '.join(reasons[:3])}")


# ---------------------------------------------------------------------------------------------
# Images


def decode(data: bytes, source: str) -> np.ndarray:
    """The image's pixels, or :class:`SkipInput` saying why it does not decode."""
    try:
        return decode_rgb(data, source)
    except ImageTooLargeError as exc:  # a decompression bomb, refused from its header
        raise SkipInput(f"too large: {exc}") from exc
    except CorruptImageError as exc:
        raise SkipInput(f"corrupt image: {exc}") from exc


def _fits(data: bytes, max_side: int) -> bool:
    """Whether the image's header says its short side is at most ``max_side`` (False when it
    cannot tell: the decode then says what is wrong)."""
    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(data)) as image:  # reads the header only
            return min(image.size) <= max_side
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception:  # noqa: BLE001 - PIL raises many types for bad data
        return False


def _as_array(value: Any) -> np.ndarray | bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if hasattr(value, "convert") and hasattr(value, "size") and hasattr(value, "mode"):  # PIL image
        return np.asarray(value.convert("RGB"))
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # torch tensor
        return value.detach().cpu().numpy()
    if isinstance(value, (tuple, list, dict)):
        raise PackError(
            f"a sample's image is a {type(value).__name__} of {len(value)} values; an image pack "
            "holds (image, label) pairs. To pack several arrays per sample, return a flat tuple "
            "(e.g. (mix, zone0, label)) or a dict: it packs as a record of fields")
    return np.asarray(value)


def _is_image(array: np.ndarray) -> bool:
    return array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3


def fit_image(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Resizes an (H, W, 3) uint8 image so it covers ``shape`` (aspect kept, bicubic) and crops
    the centre."""
    from PIL import Image as PILImage

    th, tw = shape
    h, w = image.shape[:2]
    if (h, w) == (th, tw):
        return image
    scale = max(th / h, tw / w)
    nh, nw = max(th, round(h * scale)), max(tw, round(w * scale))
    resized = np.asarray(PILImage.fromarray(image).resize((nw, nh), PILImage.Resampling.BICUBIC))
    top, left = (nh - th) // 2, (nw - tw) // 2
    return resized[top:top + th, left:left + tw]


def image_fields(schema: Schema) -> list[str]:
    """The fields of encoded images that decode (roles Image and Mask)."""
    return [n for n, f in schema.fields.items()
            if f.kind == "image" and isinstance(f.role, (Image, Mask))]
