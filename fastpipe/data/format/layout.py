"""The fastpipe pack format (HDF5 and LMDB): its names, version, metadata and its checks, shared
by the writer (fastpipe.pack) and the readers (fastpipe.data.sources).

The format is documented in ``docs/packing.md``; keep the two in step. fastpipe writes version 3
(:data:`VERSION`): every pack, an ``(image, label)`` pack included, is a record of named fields,
one dataset per field at the root of an HDF5 file (one key per field and sample in LMDB), each
field's role stored with it (:func:`schema_meta`). Versions 1 and 2 still read, through the same
readers.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "fastpipe-pack"
VERSION = 3  # what fastpipe writes, and the newest version it reads
IMAGE_VERSION = 1  # earlier (image, label) packs: the names below, one "data" and one "labels"
RECORDS_VERSION = 2  # earlier records: one dataset per field (the names after them), no roles
# Version 3, one record model: version 2's layout for every pack, an (image, label) pack being
# a record of two fields (record "pair"), each field's role stored with it. Versions 1 and 2 still
# read, through the same readers (fastpipe.data.sources).

# HDF5 names. Root attributes mark the file. Version 1 kept everything else in these datasets:
ATTR_FORMAT = "fastpipe_format"
ATTR_VERSION = "fastpipe_format_version"
META = "meta"  # scalar UTF-8 string dataset holding the JSON metadata (attributes cap at 64 KiB)
LABELS = "labels"  # int64 (N,)
CRC32 = "crc32"  # uint32 (N,): zlib.crc32 of each stored sample's bytes
OFFSETS = "offsets"  # int64 (N+1,), bytes storage only: sample i is data[offsets[i]:offsets[i+1]]
DATA = "data"  # uint8 (total_bytes,) for bytes storage; (N, *sample_shape) for array storage
PATH_OFFSETS = "path_offsets"  # int64 (N+1,)
PATH_DATA = "path_data"  # uint8 UTF-8 source paths, concatenated

# Versions 2 and 3 (records; from version 3 on every pack). Each field is a dataset at the root
# named after it, so that plain h5py reads ``f[field][i]``: fixed-shape fields ``(N, *shape)``,
# variable ones (encoded images, bytes, strings, arrays with a variable first axis) the rows of
# all samples, sample i being rows ``offsets[i]:offsets[i+1]``. fastpipe's own datasets live in
# one group beside them.
INTERNAL = "_fastpipe"
R_META = INTERNAL + "/meta"  # scalar UTF-8 JSON: count, fields, order, classes, plan, ...
R_OFFSETS = INTERNAL + "/offsets"  # group: int64 (N+1,) per variable field
R_CRC32 = INTERNAL + "/crc32"  # group: uint32 (N,) per field, zlib.crc32 of each stored row
R_PATH_OFFSETS = INTERNAL + "/path_offsets"
R_PATH_DATA = INTERNAL + "/path_data"

# The metadata key holding the CRC-32 of the rest of the metadata (:func:`sealed`), from version 3
# on (packs written before it have none: their metadata is unchecked).
META_CRC32 = "meta_crc32"

# LMDB keys: the metadata; version 1's labels and checksums (one array each), then per sample.
LMDB_META = b"__meta__"
LMDB_LABELS = b"__labels__"  # little-endian int64 array
LMDB_CRC32 = b"__crc32__"  # little-endian uint32 array


def lmdb_data_key(index: int) -> bytes:
    return b"data/%010d" % index


def lmdb_path_key(index: int) -> bytes:
    return b"path/%010d" % index


def lmdb_field_key(name: str, index: int) -> bytes:
    """Versions 2 and 3: the value of field ``name`` of sample ``index`` (its stored rows)."""
    return b"f/%s/%010d" % (name.encode(), index)


def lmdb_crc_key(name: str) -> bytes:
    """Versions 2 and 3: the little-endian uint32 checksums of field ``name``."""
    return b"__crc32__/" + name.encode()


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class PackFormatError(ValueError):
    """A file is not a readable fastpipe pack (wrong kind of file, damaged, or a missing key)."""


@dataclass
class Spec:
    """What one sample looks like in a pack."""

    storage: str  # "bytes" or "array"
    layout: str  # "encoded" (bytes), "CHW" (uint8 RGB image, array) or "raw" (any array)
    sample_shape: tuple[int, ...] | None = None
    dtype: str = "uint8"

    def to_json(self) -> dict[str, Any]:
        return {"storage": self.storage, "layout": self.layout,
                "sample_shape": None if self.sample_shape is None else list(self.sample_shape),
                "dtype": self.dtype}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Spec:
        shape = meta.get("sample_shape")
        return cls(meta["storage"], meta["layout"], None if shape is None else tuple(shape),
                   meta.get("dtype", "uint8"))


def sniff_format(path: str | os.PathLike) -> str:
    """``"hdf5"`` or ``"lmdb"`` from the file's content; raises :class:`PackFormatError`
    otherwise."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such pack: {path}")
    if path.is_dir():
        if (path / "data.mdb").is_file():
            return "lmdb"
        raise PackFormatError(f"{path} is a folder without data.mdb: not a fastpipe pack")
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(_HDF5_SIGNATURE):
        return "hdf5"
    # An LMDB data file starts with two meta pages holding the magic 0xBEEFC0DE.
    if len(head) >= 24 and np.frombuffer(head[16:20], "<u4")[0] == 0xBEEFC0DE:
        return "lmdb"
    raise PackFormatError(
        f"{path} is neither an HDF5 nor an LMDB file, so not a fastpipe pack "
        "(make one with: fastpipe pack SOURCE OUTPUT)"
    )


# A sample count no real pack reaches; larger ones are damage, refused before anything is sized
# from them.
MAX_COUNT = 1 << 48
LAYOUTS = ("encoded", "CHW", "raw")


def damaged(where: str, key: str, what: str) -> PackFormatError:
    """The error for a malformed metadata value: names the pack and the key."""
    return PackFormatError(f"{where}: the metadata value {key!r} {what}; the file is damaged "
                           "(run fastpipe verify on it)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_pair(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value)
            and 0 <= value[0] <= value[1])


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def parse_meta(raw: Any, where: str, name: str) -> dict[str, Any]:
    """The JSON metadata stored as ``raw`` (a string dataset's value or an LMDB value), checked."""
    if isinstance(raw, np.ndarray) and raw.shape == () and raw.dtype.kind in "OSU":
        raw = raw.item()
    if isinstance(raw, memoryview):
        raw = bytes(raw)
    if not isinstance(raw, (bytes, str)):
        raise PackFormatError(f"{where}: {name!r} holds {type(raw).__name__} data, not the JSON "
                              "metadata string; the file is damaged")
    try:
        meta = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise PackFormatError(f"{where}: the metadata {name!r} is not valid JSON ({exc}); the "
                              "file is damaged") from exc
    return check_meta(meta, where)


def check_meta(meta: Any, where: str) -> dict[str, Any]:
    """Checks every metadata value a reader uses (types and ranges), so that damage is a
    :class:`PackFormatError` naming the pack and the key, never a ``TypeError`` later."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PackFormatError(f"{where} has no fastpipe metadata: not a fastpipe pack")
    version = meta.get("version")
    if not _is_int(version) or version < IMAGE_VERSION:
        raise damaged(where, "version", f"is {version!r}, not a format version")
    if version > VERSION:
        raise PackFormatError(
            f"{where} is a fastpipe pack of format version {version}; this fastpipe reads up to "
            f"version {VERSION}: upgrade fastpipe"
        )
    required = ("count", "fields", "order") if version >= RECORDS_VERSION else (
        "storage", "layout", "count", "classes")
    for key in required:
        if key not in meta:
            raise PackFormatError(f"{where}: metadata lacks the key {key!r}; the file is damaged")
    count = meta["count"]
    if not _is_int(count) or not 0 <= count < MAX_COUNT:
        raise damaged(where, "count", f"is {count!r}, not a sample count")
    if not (meta.get("inputs") is None or _is_int(meta["inputs"]) and meta["inputs"] >= 0):
        raise damaged(where, "inputs", f"is {meta['inputs']!r}, not a number of inputs")
    if not isinstance(meta.get("skipped") or [], list):
        raise damaged(where, "skipped", "is not a list")
    for key in ("merge", "plan", "record"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise damaged(where, key, f"is {meta[key]!r}, not a string")
    if version >= RECORDS_VERSION:
        _check_record_meta(meta, where)
    else:
        _check_image_meta(meta, where)
    parts = meta.get("parts")
    if parts is not None and not (isinstance(parts, list)
                                  and all(isinstance(p, dict) for p in parts)):
        raise damaged(where, "parts", "is not a list of parts")
    return meta


def _check_image_meta(meta: dict[str, Any], where: str) -> None:
    if meta["storage"] not in ("bytes", "array"):
        raise PackFormatError(f"{where}: unknown storage {meta['storage']!r} (the metadata "
                              "value 'storage'); the file is damaged")
    if meta["layout"] not in LAYOUTS:
        raise damaged(where, "layout", f"is {meta['layout']!r}, not one of {', '.join(LAYOUTS)}")
    if not _str_list(meta["classes"]):
        raise damaged(where, "classes", f"is {_short(meta['classes'])}, not a list of class names")
    dtype = meta.get("dtype", "uint8")
    try:
        ok = isinstance(dtype, str) and np.dtype(dtype).kind in "biuf"
    except TypeError:
        ok = False
    if not ok:
        raise damaged(where, "dtype", f"is {dtype!r}, not a numeric dtype")
    shape = meta.get("sample_shape")
    if meta["storage"] == "array" or shape is not None:
        if not (isinstance(shape, list) and shape and all(_is_int(v) and 0 < v < MAX_COUNT
                                                          for v in shape)):
            raise damaged(where, "sample_shape",
                          f"is {_short(shape)}, not the positive sizes of a sample's axes")
    if meta["storage"] == "bytes" and np.dtype(dtype) != np.uint8:
        raise damaged(where, "dtype", f"is {dtype!r}; bytes storage holds uint8")


def _check_record_meta(meta: dict[str, Any], where: str) -> None:
    fields, order = meta["fields"], meta["order"]
    if not isinstance(fields, dict):
        raise damaged(where, "fields", f"is {_short(fields)}, not an object of fields")
    if not (_str_list(order) and order and len(set(order)) == len(order)):
        raise damaged(where, "order", f"is {_short(order)}, not a list of distinct field names")
    if missing := [n for n in order if n not in fields]:
        raise damaged(where, "order", f"names {missing[0]!r}, which 'fields' does not describe")
    record_fields(meta, where)
    classes = meta.get("classes") or {}
    if not (isinstance(classes, dict) and all(_str_list(v) for v in classes.values())):
        raise damaged(where, "classes", f"is {_short(classes)}, not class names per field")
    if unknown := [n for n in classes if n not in order]:
        raise damaged(where, "classes", f"names {unknown[0]!r}, which is not a field")


def record_fields(meta: dict[str, Any], where: str) -> dict[str, Any]:
    """The fields (:mod:`fastpipe.data.format.fields`) of checked records metadata, in order, with
    their roles. A version 2 pack stored no roles: its int field ``label`` with classes is a Label
    (what the readers of that version made of it), the others have their kind's role."""
    from fastpipe.data.format.fields import IntField, UnknownRoleError, field_from_json
    from fastpipe.data.format.roles import Label

    out = {}
    for name in meta["order"]:
        try:
            out[name] = field_from_json(meta["fields"][name])
        except UnknownRoleError:
            raise  # sound data whose role's module was not imported: not damage
        except Exception as exc:  # noqa: BLE001 - KeyError, TypeError of bad JSON
            raise damaged(where, "fields", f"describes the field {name!r} as "
                          f"{_short(meta['fields'][name])} ({type(exc).__name__}: {exc})"
                          ) from exc
    label = out.get("label")
    classes = meta.get("classes")
    if (meta["version"] == RECORDS_VERSION and isinstance(label, IntField)
            and isinstance(classes, dict) and "label" in classes):
        out["label"] = IntField(label.dtype, role=Label())
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_offsets(offsets: np.ndarray, end: int, where: str, what: str) -> None:
    """Offsets that a reader may slice with: from 0, never backwards, ending at ``end`` (the
    length of the data they index). ``what`` names them in the error."""
    if not len(offsets):
        raise PackFormatError(f"{where}: {what} are empty; the index is damaged")
    if offsets[0] != 0:
        raise PackFormatError(f"{where}: {what} start at {int(offsets[0])}, not 0; the index is "
                              "damaged (run fastpipe verify on it)")
    backwards = np.diff(offsets) < 0
    if backwards.any():
        i = int(np.argmax(backwards))
        raise PackFormatError(
            f"{where}: {what} run backwards at sample {i} ({int(offsets[i])} then "
            f"{int(offsets[i + 1])}); the index is damaged (run fastpipe verify on it)")
    if offsets[-1] != end:
        raise PackFormatError(
            f"{where}: {what} end at {int(offsets[-1])} but the data they index holds {end}; the "
            "index or the data is damaged (run fastpipe verify on it)")


def check_labels(labels: np.ndarray, classes: list[str], where: str, field: str | None = None,
                 ) -> None:
    """Labels within the classes (-1, unlabelled, only in a pack without classes)."""
    n = len(classes)
    bad = ((labels < 0) | (labels >= n)) if n else (labels < -1)
    if bad.any():
        i = int(np.argmax(bad))
        within = f"outside the {n} classes" if n else "below -1 in a pack without classes"
        of = f"field {field!r}: " if field else ""
        raise PackFormatError(
            f"{where}: {of}sample {i} has the label {int(labels[i])}, {within} (and "
            f"{int(bad.sum()) - 1} more); the labels are damaged (run fastpipe verify on it)")


def meta_json(meta: Mapping[str, Any]) -> str:
    """The metadata as it is stored: JSON with sorted keys, non-ASCII kept. Parsing it and
    writing it again gives the same text, which is what its checksum covers."""
    return json.dumps(meta, sort_keys=True, ensure_ascii=False)


def _meta_crc32(meta: Mapping[str, Any]) -> int:
    body = {k: v for k, v in meta.items() if k != META_CRC32}
    return zlib.crc32(meta_json(body).encode("utf-8", "surrogatepass"))


def sealed(meta: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` with :data:`META_CRC32`, the CRC-32 of the rest of it (any earlier one replaced):
    what the writers store, so that ``verify`` finds a value edited or damaged afterwards (a
    field's kind or role changed, a class renamed), which the readers' type and range checks
    cannot tell from a value fastpipe wrote."""
    return {**{k: v for k, v in meta.items() if k != META_CRC32}, META_CRC32: _meta_crc32(meta)}


def unsealed_reason(meta: Mapping[str, Any], where: str) -> str | None:
    """Why the checked metadata ``meta`` fails its checksum, or None when it holds (or has
    none: :func:`has_checksum` says which)."""
    if META_CRC32 not in meta:
        return None  # null (or any non-int) is damage, not an absent key
    stored = meta[META_CRC32]
    if not _is_int(stored) or stored != _meta_crc32(meta):
        return (f"{where}: its metadata does not match the checksum fastpipe stored with it "
                f"({META_CRC32!r}): a value was edited or damaged after the pack was written, and "
                "the readers would take it as it now reads (a field's kind, role or classes "
                "included); restore the file from a good copy, or pack it again")
    return None


def has_checksum(meta: Mapping[str, Any]) -> bool:
    """Whether ``meta`` carries :data:`META_CRC32` (packs written before it do not)."""
    return META_CRC32 in meta


# Metadata keys a version 1 pack used for its one image field; version 3 writes them too for an
# (image, label) pack (readers and tools of those keys keep working): ``storage``, ``layout``,
# ``sample_shape``, ``dtype``.
IMAGE_KEYS = ("storage", "layout", "sample_shape", "dtype")


def schema_meta(fields: Mapping[str, Any], record: str,
                classes: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The metadata keys that describe a version 3 pack's records: ``fields`` (each field's JSON,
    its role included: :meth:`fastpipe.data.format.fields.Field.to_json`), ``order``, ``record``
    (``"pair"`` for an ``(image, label)`` pack, ``"dict"`` or ``"tuple"``), ``classes`` (class
    names per field); for a pair, its image field in version 1's terms as well
    (:data:`IMAGE_KEYS`)."""
    meta: dict[str, Any] = {"fields": {n: f.to_json() for n, f in fields.items()},
                            "order": list(fields), "record": record,
                            "classes": {n: list(c) for n, c in classes.items()}}
    if record == "pair":
        meta.update(image_keys(next(iter(fields.values()))))
    return meta


def image_keys(image: Any) -> dict[str, Any]:
    """An (image, label) pack's image field in version 1's metadata terms: encoded bytes, decoded
    uint8 ``(3, H, W)`` images (role Image), or raw arrays."""
    from fastpipe.data.format.roles import Image

    if image.kind == "image":
        return {"storage": "bytes", "layout": "encoded", "sample_shape": None, "dtype": "uint8"}
    return {"storage": "array", "layout": "CHW" if isinstance(image.role, Image) else "raw",
            "sample_shape": list(image.shape), "dtype": image.dtype}
