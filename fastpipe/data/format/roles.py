"""Roles: what a record's field is (an image, a mask, boxes, a label), beside how it is stored.

A field's kind (:mod:`fastpipe.data.format.fields`) says how its values are stored; its role says
what they are, as torchvision's ``tv_tensors`` do (``Image``, ``Mask``, ``BoundingBoxes``). Readers
decode by the role and joint geometry picks each field's kernel by it (``register_joint_kernel``),
so no field name is ever interpreted. The role travels with the field in a pack's schema:
``{"kind": "array", ..., "role": {"name": "boxes", "format": "xywh", "canvas": "image"}}``.

Roles are found by name in a registry that code outside fastpipe extends (:func:`register_role`).
This module imports nothing of fastpipe: a role checks the field it is given by its attributes
(``kind``, ``dtype``, ``shape``), and :mod:`fastpipe.data.format.fields` turns a refusal into a
``FieldError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["Array", "BoundingBoxes", "Bytes", "Image", "Label", "Mask", "Role", "Text",
           "find_role", "register_role"]

BOX_FORMATS = ("xyxy", "xywh", "cxcywh")


@dataclass(frozen=True)
class Role:
    """Base of the roles: what a field's values are.

    A role is a frozen dataclass with a unique ``name`` (a class attribute, the key of the
    registry and of the stored schema); its dataclass fields are its settings, stored as they are
    in the pack's JSON (override :meth:`to_json` and :meth:`from_json` for settings JSON cannot
    hold). Subclass it, decorate the subclass with :func:`register_role` so that packs naming it
    read back, and register how it moves with a ``JointCrop``
    (:func:`~fastpipe.data.register_joint_kernel`).
    """

    name: ClassVar[str] = ""
    # A resize filter the role imposes whatever a JointCrop is given (Mask: "nearest").
    interpolation: ClassVar[str | None] = None

    def check(self, field: Any) -> None:
        """Raises ``ValueError`` saying why ``field`` (a :mod:`fastpipe.data.format.fields` field)
        cannot have this role; a field checks its role once, when it is made. Every field fits
        the base role."""

    def to_json(self) -> dict[str, Any]:
        """``{"name": ..., **settings}``: what a pack stores as the field's role."""
        return {"name": self.name,
                **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Role:
        """The role :meth:`to_json` described. On ``Role`` itself, the class is found by
        ``data["name"]`` among the registered roles; an unknown name is a ``ValueError`` that
        names it (the module that registers it was not imported)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a role is stored as an object with a 'name', got {data!r}")
        name = data.get("name")
        role = find_role(name) if cls is Role else cls
        if role is None:
            raise ValueError(
                f"unknown field role {name!r}: a role of that name is registered by code outside "
                "fastpipe; import the module that defines and registers it (register_role) "
                f"before reading this data (registered roles: {', '.join(sorted(_ROLES))})")
        if name != role.name:
            raise ValueError(f"{role.__name__}.from_json was given the role {name!r}")
        settings = {k: v for k, v in data.items() if k != "name"}
        try:
            return role(**settings)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the stored role {dict(data)!r} cannot be read: {exc}") from exc


_ROLES: dict[str, type[Role]] = {}


def find_role(name: Any) -> type[Role] | None:
    """The role class registered under ``name``, or None."""
    return _ROLES.get(name) if isinstance(name, str) else None


def register_role(role: type[Role]) -> type[Role]:
    """Registers a :class:`Role` subclass under its ``name``, so that a stored schema naming it
    reads back (usable as a class decorator). A name taken by another class is refused; the same
    class registered again (a reloaded module) replaces itself."""
    if not (isinstance(role, type) and issubclass(role, Role) and dataclasses.is_dataclass(role)):
        raise TypeError(f"register_role takes a Role subclass decorated with "
                        f"@dataclass(frozen=True), got {role!r}")
    name = role.name
    if not isinstance(name, str) or not name:
        raise ValueError(f"{role.__name__} needs a name: a class attribute "
                         "name: ClassVar[str] = '...', the key it is stored under")
    known = _ROLES.get(name)
    if known is not None and known is not role and (
            f"{known.__module__}.{known.__qualname__}" != f"{role.__module__}.{role.__qualname__}"):
        raise ValueError(f"the role name {name!r} is taken by {known.__module__}."
                         f"{known.__qualname__}; give {role.__qualname__} another name")
    _ROLES[name] = role
    return role


def _describe(field: Any) -> str:
    return f"{type(field).__name__} of kind {getattr(field, 'kind', '?')!r}"


def _check_pixels(role: Role, field: Any) -> None:
    if field.kind == "image":
        return
    if field.kind == "array" and field.dtype in ("uint8", "uint16") and len(field.shape) in (2, 3):
        return
    raise ValueError(f"{type(role).__name__}() is pixels: an encoded image (ImageField) or "
                     "decoded pixels (ArrayField of uint8 or uint16, shape (H, W) or (H, W, C)); "
                     f"got {_describe(field)}" + (f" ({field.dtype}, shape {field.shape})"
                                                  if field.kind == "array" else ""))


@register_role
@dataclass(frozen=True)
class Image(Role):
    """An image: an encoded image field, decoded to uint8 RGB ``(3, H, W)`` as fastpipe decodes
    everywhere, or decoded pixels ``(H, W[, C])`` of uint8 or uint16 kept as stored; resized with
    the ``JointCrop``'s filter (bilinear, bicubic). The role of every ``ImageField`` unless
    declared otherwise."""

    name: ClassVar[str] = "image"

    def check(self, field: Any) -> None:
        _check_pixels(self, field)


@register_role
@dataclass(frozen=True)
class Mask(Role):
    """A mask (segmentation labels, a depth map): pixels kept as stored (channels, dtype, a
    palette PNG's indices, 16-bit values), ``(C, H, W)``; resized only by nearest neighbour,
    whatever filter a ``JointCrop`` is given: a mask is never interpolated. An encoded image field
    or decoded pixels, as :class:`Image`."""

    name: ClassVar[str] = "mask"
    interpolation: ClassVar[str | None] = "nearest"

    def check(self, field: Any) -> None:
        _check_pixels(self, field)


@register_role
@dataclass(frozen=True)
class BoundingBoxes(Role):
    """Boxes: a float ``(N, 4)`` array field (``ArrayField("float32", (None, 4))``) in pixels.

    Args:
        format: ``"xyxy"`` (corners), ``"xywh"`` (top-left corner, width, height) or
            ``"cxcywh"`` (centre, width, height), torchvision's ``BoundingBoxFormat`` (which is
            also accepted, as are upper-case names).
        canvas: the name of the image field whose pixels the boxes are in (for a field of
            ``JointCrop`` factor ``s``, the boxes move with its crop, ``s`` times the reference
            grid's); ``None``: the reference grid (the fields of factor 1).
    """

    format: str = "xyxy"
    canvas: str | None = None
    name: ClassVar[str] = "boxes"

    def __post_init__(self) -> None:
        text = getattr(self.format, "value", self.format)  # torchvision's BoundingBoxFormat
        if not isinstance(text, str) or text.lower() not in BOX_FORMATS:
            raise ValueError(f"BoundingBoxes: format must be one of "
                             f"{', '.join(map(repr, BOX_FORMATS))}, got {self.format!r}")
        object.__setattr__(self, "format", text.lower())
        if self.canvas is not None and (not isinstance(self.canvas, str) or not self.canvas):
            raise ValueError(f"BoundingBoxes: canvas is the name of an image field or None, got "
                             f"{self.canvas!r}")

    def check(self, field: Any) -> None:
        shape = getattr(field, "shape", None)
        if (field.kind == "array" and field.dtype.startswith("float") and shape is not None
                and len(shape) == 2 and shape[1] == 4):
            return
        raise ValueError("BoundingBoxes holds float (N, 4) boxes: an ArrayField of a float dtype "
                         f"and shape (N, 4) or (None, 4); got {_describe(field)}"
                         + (f" ({field.dtype}, shape {shape})" if field.kind == "array" else ""))


@register_role
@dataclass(frozen=True)
class Label(Role):
    """A class label: an int field whose values index the field's classes."""

    name: ClassVar[str] = "label"

    def check(self, field: Any) -> None:
        if field.kind != "int":
            raise ValueError(f"Label is one class index: an IntField; got {_describe(field)}")


@register_role
@dataclass(frozen=True)
class Array(Role):
    """Numbers as stored (a tensor of the stored dtype, or a Python scalar): the role of array,
    int and float fields unless declared otherwise."""

    name: ClassVar[str] = "array"

    def check(self, field: Any) -> None:
        if field.kind in ("image", "bytes", "str"):
            raise ValueError(f"Array is numbers; an {_describe(field)} is not (its role is "
                             f"{'Image or Mask' if field.kind == 'image' else 'Bytes or Text'})")


@register_role
@dataclass(frozen=True)
class Bytes(Role):
    """Bytes returned as stored: the role of a ``BytesField``."""

    name: ClassVar[str] = "bytes"

    def check(self, field: Any) -> None:
        if field.kind != "bytes":
            raise ValueError(f"Bytes is the role of a BytesField; got {_describe(field)}")


@register_role
@dataclass(frozen=True)
class Text(Role):
    """A string: the role of a ``StrField``."""

    name: ClassVar[str] = "text"

    def check(self, field: Any) -> None:
        if field.kind != "str":
            raise ValueError(f"Text is the role of a StrField; got {_describe(field)}")
