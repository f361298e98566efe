"""Fields: what one named part of a record holds, and how it is stored.

A record (one sample) is a dict of named fields. Each field has a kind (an encoded image, an array,
an int or float scalar, bytes, a string), and arrays a dtype and a shape whose first axis may vary
(``None``). Kinds, dtypes and shapes are declared (``pack(..., fields={...})``) or taken from the
first sample; a later sample that does not fit is an error naming the sample and the field, never
a cast: the pack returns exactly what the dataset gave.

Stored form, the same in every format: fixed-shape fields (arrays of one shape, scalars) as rows
of a ``(N, *shape)`` array; variable fields (images, bytes, strings, arrays with a variable first
axis) as one flat array of all samples' rows plus offsets.

Each field also has a role (:mod:`fastpipe.data.format.roles`): what its values are (an image, a
mask, boxes, a label), checked against the kind once when the field is made and stored with it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fastpipe.data.format.roles import Array, Bytes, Image, Role, Text, find_role

__all__ = ["ArrayField", "BytesField", "Field", "FloatField", "ImageField", "IntField", "StrField",
           "UnknownRoleError", "field_from_json", "infer_field"]

# Encoded image signatures: bytes starting with one of these are an image field, kept as they are.
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"II*\x00", b"MM\x00*")


class FieldError(ValueError):
    """A sample's value does not fit its field (kind, dtype or shape), or a field is declared
    wrong."""


class UnknownRoleError(FieldError):
    """A stored field names a role that no imported module registered: the data is sound, the
    module that registers the role was not imported (not a damaged file)."""


@dataclass(frozen=True, repr=False)
class Field:
    """Base of the field kinds; use :class:`ImageField`, :class:`ArrayField`, :class:`IntField`,
    :class:`FloatField`, :class:`BytesField` or :class:`StrField`.

    ``role`` (keyword only): what the values are, a :class:`~fastpipe.data.Role` instance
    (``ImageField(role=Mask())``, ``ArrayField("float32", (None, 4),
    role=BoundingBoxes("xywh"))``); ``None`` gives the kind's default (``default_role``: Image for
    an image field, Array for array, int and float fields, Bytes, Text). A role that does not fit
    the kind is a :class:`FieldError` here, when the field is made."""

    role: Role | None = dataclasses.field(default=None, kw_only=True)
    kind: ClassVar[str] = ""
    default_role: ClassVar[type[Role]] = Array

    def __post_init__(self) -> None:
        role = self.role
        if role is None:
            object.__setattr__(self, "role", self.default_role())
            return
        if isinstance(role, type) and issubclass(role, Role):
            raise FieldError(f"{type(self).__name__}: role is a role instance; pass "
                             f"{role.__name__}(), not the class")
        if not isinstance(role, Role):
            raise FieldError(f"{type(self).__name__}: role must be a fastpipe.data Role "
                             "(Image(), Mask(), BoundingBoxes(...), Label(), Array(), Bytes(), "
                             f"Text() or a registered one), got {role!r}")
        try:
            role.check(self)
        except ValueError as exc:
            raise FieldError(f"{type(self).__name__} cannot have the role {role!r}: {exc}") \
                from exc

    @property
    def variable(self) -> bool:
        """Stored as a flat array plus offsets (one row per sample otherwise)."""
        return True

    @property
    def stored_dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The stored shape after the sample axis: a fixed field's row, or a variable field's
        trailing axes."""
        return ()

    def encode(self, value: Any, where: str) -> np.ndarray:
        """The stored row of ``value`` (a contiguous array), or :class:`FieldError`."""
        raise NotImplementedError

    def value(self, stored: Any) -> Any:
        """What a reader returns for a stored row: the inverse of :meth:`encode`."""
        return stored

    def to_json(self) -> dict[str, Any]:
        """``{"kind": ..., <the kind's settings>, "role": ...}``; the role only when it is not
        the kind's default, so that a field without one reads back as it was written (and packs
        written before roles read as they were)."""
        data = {"kind": self.kind, **self._settings()}
        if self.role != self.default_role():
            data["role"] = self.role.to_json()
        return data

    def _settings(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        # The kind's settings first, the role only when it is not the kind's default.
        parts = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if f.name != "role"]
        if self.role != self.default_role():
            parts.append(f"role={self.role!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


@dataclass(frozen=True, repr=False)
class ImageField(Field):
    """An encoded image (JPEG, PNG, ...), stored as its bytes; readers decode it (fastpipe's fast
    path for JPEG). Its role is :class:`~fastpipe.data.Image` (decoded to uint8 RGB) or
    :class:`~fastpipe.data.Mask` (decoded as stored: ``ImageField(role=Mask())``)."""

    kind: ClassVar[str] = "image"
    default_role: ClassVar[type[Role]] = Image

    def encode(self, value: Any, where: str) -> np.ndarray:
        data = _as_bytes(value)
        if data is None:
            raise FieldError(f"{where} is {_describe(value)}; an image field holds encoded "
                             "bytes (a JPEG or PNG file's content)" + _PIL_HINT * _is_pil(value))
        if not data:
            raise FieldError(f"{where} is empty; an image field holds an encoded image")
        return np.frombuffer(data, np.uint8)


@dataclass(frozen=True, repr=False)
class BytesField(Field):
    """Any bytes (e.g. JSON metadata, an audio file), stored and returned as they are."""

    kind: ClassVar[str] = "bytes"
    default_role: ClassVar[type[Role]] = Bytes

    def encode(self, value: Any, where: str) -> np.ndarray:
        data = _as_bytes(value)
        if data is None:
            raise FieldError(f"{where} is {_describe(value)}; a bytes field holds bytes")
        return np.frombuffer(data, np.uint8)

    def value(self, stored: Any) -> bytes:
        return stored.tobytes() if isinstance(stored, (np.ndarray, np.void)) else bytes(stored)


@dataclass(frozen=True, repr=False)
class StrField(Field):
    """A string, stored as UTF-8."""

    kind: ClassVar[str] = "str"
    default_role: ClassVar[type[Role]] = Text

    def encode(self, value: Any, where: str) -> np.ndarray:
        if not isinstance(value, str):
            raise FieldError(f"{where} is {_describe(value)}; a str field holds strings")
        return np.frombuffer(value.encode("utf-8", "surrogatepass"), np.uint8)

    def value(self, stored: Any) -> str:
        if isinstance(stored, str):
            return stored
        raw = stored.tobytes() if isinstance(stored, np.ndarray) else bytes(stored)
        return raw.decode("utf-8", "surrogatepass")


@dataclass(frozen=True, repr=False)
class ArrayField(Field):
    """An array of one dtype; ``shape`` fixed, or with ``None`` as its first axis for a length
    that varies per sample (e.g. ``ArrayField("float32", (None, 40))`` for T frames of 40
    features)."""

    dtype: str
    shape: tuple[int | None, ...]
    kind: ClassVar[str] = "array"

    def __post_init__(self) -> None:
        try:
            dtype = np.dtype(self.dtype)
        except TypeError as exc:
            raise FieldError(f"ArrayField: {self.dtype!r} is not a numpy dtype") from exc
        if dtype.hasobject or dtype.kind not in "biufc":
            raise FieldError(f"ArrayField holds numbers and booleans; {dtype} is not one "
                             "(use BytesField or StrField for other data)")
        object.__setattr__(self, "dtype", dtype.name)
        shape = tuple(self.shape)
        if any(s is None for s in shape[1:]) or any(
                s is not None and (not isinstance(s, (int, np.integer)) or s < 0) for s in shape):
            raise FieldError(f"ArrayField shape must be non-negative ints, with None allowed only "
                             f"as the first axis; got {shape}")
        object.__setattr__(self, "shape", tuple(None if s is None else int(s) for s in shape))
        super().__post_init__()

    @property
    def variable(self) -> bool:
        return bool(self.shape) and self.shape[0] is None

    @property
    def stored_dtype(self) -> np.dtype:
        return np.dtype(self.dtype).newbyteorder("<")

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[1:]) if self.variable else tuple(self.shape)

    def encode(self, value: Any, where: str) -> np.ndarray:
        array = _as_array(value)
        if array is None:
            raise FieldError(f"{where} is {_describe(value)}; an array field holds arrays")
        if array.dtype != np.dtype(self.dtype):
            raise FieldError(
                f"{where} is {array.dtype}, the field holds {self.dtype}; fastpipe does not cast "
                f"(declare the field as ArrayField({str(array.dtype)!r}, ...) or convert in the "
                "dataset)")
        want = self.shape
        got = array.shape
        if len(got) != len(want) or any(w is not None and g != w
                                        for g, w in zip(got, want, strict=True)):
            hint = ""
            if len(got) == len(want) and got[1:] == tuple(want[1:]) and not self.variable:
                hint = (f"; for a length that varies per sample declare "
                        f"ArrayField({self.dtype!r}, (None, {', '.join(map(str, want[1:]))}))")
            shown = tuple("*" if s is None else s for s in want)
            raise FieldError(f"{where} has shape {got}, the field's shape is {shown}{hint}")
        return np.asarray(array, self.stored_dtype, order="C")

    def value(self, stored: Any) -> Any:
        import torch

        array = np.asarray(stored)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        if not array.flags.writeable:
            array = array.copy()
        return torch.from_numpy(array)

    def _settings(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True, repr=False)
class _ScalarField(Field):
    dtype: str = ""

    def __post_init__(self) -> None:
        try:
            dtype = np.dtype(self.dtype or self._default)
        except TypeError as exc:
            raise FieldError(f"{type(self).__name__}: {self.dtype!r} is not a numpy dtype") from exc
        if dtype.kind not in self._kinds:
            raise FieldError(f"{type(self).__name__} cannot hold {dtype}")
        object.__setattr__(self, "dtype", dtype.name)
        super().__post_init__()

    _default: ClassVar[str] = ""
    _kinds: ClassVar[str] = ""

    @property
    def variable(self) -> bool:
        return False

    @property
    def stored_dtype(self) -> np.dtype:
        return np.dtype(self.dtype).newbyteorder("<")

    def value(self, stored: Any) -> Any:
        # Python's own int and float for the dtypes they are; a numpy scalar keeps any other.
        scalar = np.asarray(stored).astype(np.dtype(self.dtype)).reshape(())[()]
        return scalar.item() if self.dtype in ("int64", "float64", "bool") else scalar

    def _settings(self) -> dict[str, Any]:
        return {"dtype": self.dtype}


@dataclass(frozen=True, repr=False)
class IntField(_ScalarField):
    """An integer (or boolean) scalar, e.g. a class label; ``dtype`` defaults to int64."""

    kind: ClassVar[str] = "int"
    _default: ClassVar[str] = "int64"
    _kinds: ClassVar[str] = "biu"

    def encode(self, value: Any, where: str) -> np.ndarray:
        dtype = np.dtype(self.dtype)
        if isinstance(value, (bool, int)) and not isinstance(value, np.generic):
            if dtype.kind == "b" and not isinstance(value, bool):
                raise FieldError(f"{where} is the int {value}; the field holds bool")
            if dtype.kind != "b" and not (np.iinfo(dtype).min <= value <= np.iinfo(dtype).max):
                raise FieldError(f"{where} is {value}, outside {dtype}'s range")
            return np.asarray(value, self.stored_dtype)
        array = _as_array(value)
        if array is None or array.shape != () or array.dtype.kind not in "biu":
            raise FieldError(f"{where} is {_describe(value)}; an int field holds one integer")
        if array.dtype != dtype:
            raise FieldError(f"{where} is {array.dtype}, the field holds {dtype}; fastpipe does "
                             f"not cast (declare IntField({str(array.dtype)!r}))")
        return np.asarray(array, self.stored_dtype, order="C")


@dataclass(frozen=True, repr=False)
class FloatField(_ScalarField):
    """A floating-point scalar; ``dtype`` defaults to float64 (what a Python float is)."""

    kind: ClassVar[str] = "float"
    _default: ClassVar[str] = "float64"
    _kinds: ClassVar[str] = "f"

    def encode(self, value: Any, where: str) -> np.ndarray:
        dtype = np.dtype(self.dtype)
        if isinstance(value, float) and not isinstance(value, np.generic):
            stored = np.asarray(value, dtype)
            if stored.item() != value and not (math.isnan(value) and np.isnan(stored)):
                raise FieldError(f"{where} is {value!r}, which {dtype} cannot hold exactly; "
                                 "declare FloatField('float64')")
            return np.asarray(stored, self.stored_dtype, order="C")
        array = _as_array(value)
        if array is None or array.shape != () or array.dtype.kind != "f":
            raise FieldError(f"{where} is {_describe(value)}; a float field holds one float")
        if array.dtype != dtype:
            raise FieldError(f"{where} is {array.dtype}, the field holds {dtype}; fastpipe does "
                             f"not cast (declare FloatField({str(array.dtype)!r}))")
        return np.asarray(array, self.stored_dtype, order="C")


_KINDS: dict[str, type[Field]] = {cls.kind: cls for cls in
                                  (ImageField, BytesField, StrField, ArrayField, IntField,
                                   FloatField)}


def field_from_json(data: dict[str, Any]) -> Field:
    """The field :meth:`Field.to_json` described; without a ``"role"``, the kind's default. A
    role name no imported module registered is a :class:`FieldError` naming it."""
    cls = _KINDS.get(data.get("kind", ""))
    if cls is None:
        raise FieldError(f"unknown field kind {data.get('kind')!r}")
    role = None
    if (stored := data.get("role")) is not None:
        try:
            role = Role.from_json(stored)
        except ValueError as exc:
            unknown = isinstance(stored, dict) and find_role(stored.get("name")) is None
            raise (UnknownRoleError if unknown else FieldError)(str(exc)) from exc
    if cls is ArrayField:
        return ArrayField(data["dtype"], tuple(data["shape"]), role=role)
    if issubclass(cls, _ScalarField):
        return cls(data["dtype"], role=role)
    return cls(role=role)


def infer_field(value: Any, where: str) -> Field:
    """The field a first sample's value implies: encoded image bytes are an image, other bytes
    bytes, a str a string, Python and numpy scalars int/float, arrays and tensors an array of
    their dtype and shape (fixed: declare ``ArrayField(dtype, (None, ...))`` for a variable first
    axis)."""
    if isinstance(value, str):
        return StrField()
    data = _as_bytes(value)
    if data is not None:
        return ImageField() if _is_encoded_image(data) else BytesField()
    if isinstance(value, bool):
        return IntField("bool")
    if isinstance(value, int):
        return IntField("int64")
    if isinstance(value, float):
        return FloatField("float64")
    array = _as_array(value)
    if array is None:
        raise FieldError(
            f"{where} is {_describe(value)}; a field holds an array, a tensor, a number, bytes or "
            "a str (return a flat dict or tuple of those from the dataset)"
            + _PIL_HINT * _is_pil(value))
    if array.dtype.hasobject or array.dtype.kind not in "biufc":
        raise FieldError(f"{where} is an array of {array.dtype}; array fields hold numbers and "
                         "booleans")
    if array.shape == ():
        return (FloatField if array.dtype.kind == "f" else
                IntField if array.dtype.kind in "biu" else
                lambda d: ArrayField(d, ()))(array.dtype.name)
    return ArrayField(array.dtype.name, array.shape)


def _is_encoded_image(data: bytes) -> bool:
    return data.startswith(_IMAGE_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


_PIL_HINT = (". A decoded PIL image has lost its file's bytes, and fastpipe does not re-encode "
             "behind your back: return the encoded bytes (with Hugging Face datasets, "
             "dataset.cast_column(name, datasets.Image(decode=False)))")


def _is_pil(value: Any) -> bool:
    return all(hasattr(value, a) for a in ("mode", "size", "getpixel"))


def _as_bytes(value: Any) -> bytes | None:
    """Bytes as they are; a Hugging Face ``Image(decode=False)`` value (``{"bytes", "path"}``)
    as its stored bytes, or its file's bytes when only the path is stored."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if _is_pil(value) and isinstance(getattr(value, "filename", None), str) \
            and os.path.isfile(value.filename):
        with open(value.filename, "rb") as f:  # the file it was decoded from, bytes unchanged
            return f.read()
    if isinstance(value, dict) and set(value) == {"bytes", "path"}:
        if value["bytes"] is not None:
            return bytes(value["bytes"])
        if value["path"]:
            with open(value["path"], "rb") as f:
                return f.read()
    return None


def _as_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        try:
            return value.detach().cpu().numpy()
        except TypeError as exc:  # bfloat16 and other dtypes numpy lacks
            raise FieldError(f"a {value.dtype} tensor has no numpy dtype to store it as; "
                             "convert it in the dataset (.view(torch.int16) keeps the bits)"
                             ) from exc
    return None


def _describe(value: Any) -> str:
    array = _as_array(value)
    if array is not None:
        return f"a {array.dtype} array of shape {array.shape}"
    return f"a {type(value).__name__}"
