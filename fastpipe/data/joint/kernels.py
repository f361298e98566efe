"""Applying one :class:`~fastpipe.data.JointCrop` draw to a sample's fields, by their roles.

A kernel applies the draw to one field's value; kernels are found by the field's role in a
registry that code outside fastpipe extends (:func:`register_joint_kernel`). Roles whose values
are pixels (Image, Mask) also give their size before anything is decoded, so the draw is known
first: a PNG's IHDR or a JPEG's frame header; then a PNG decodes only the rows of its crop
(fastpipe.data.decode.png), a JPEG only the region around it (fastpipe._jpeg). Per pixel field: the
crop (the reference box times the field's factor, by slicing: exactly aligned), the resize of
``mode="resized"``, the flips, rot90, and a contiguous tensor out. Boxes move in their own
format on their canvas, and a box that leaves the crop drops its rows of the per-box fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from fastpipe import _geometry as geometry
from fastpipe.data.decode import png as _png
from fastpipe.data.decode.image import _decode_jpeg_crop, _jpeg_size, decode_rgb
from fastpipe.data.format.fields import Field
from fastpipe.data.format.roles import Array, BoundingBoxes, Image, Mask, Role
from fastpipe.data.joint.crop import JointCrop, JointParams

__all__ = ["JointContext", "KeptRows", "check_fields", "joint_record", "moved_fields",
           "register_joint_kernel"]

try:
    from fastpipe._resize import resize as _resize_pixels
except ImportError:  # built without fastpipe._resize: torch resizes
    _resize_pixels = None

_FILTER_CODES = {"bilinear": 0, "bicubic": 1}


class JointContext(NamedTuple):
    """What a joint kernel is told about the field it moves, for one sample."""

    name: str
    """The field's name (for messages; a kernel never interprets it)."""
    field: Field
    """The field (kind, dtype, shape)."""
    role: Role
    """The role the kernel was found by (``field.role``; ``BoundingBoxes()`` for a plain
    array named in ``JointCrop(boxes=)``)."""
    factor: int
    """The field's size relative to the reference grid: the crop's ``factors`` for a pixel
    field, its canvas field's for a role with a ``canvas`` setting, else 1. The draw a kernel
    receives is already scaled by it."""
    interpolation: str
    """The resize filter of the field's pixels: the role's own (Mask: ``"nearest"``) or the
    crop's for the field; ``"nearest"`` keeps pixels as stored."""
    canvas: tuple[int, int] | None
    """``(height, width)`` of the grid the value lives on, this sample, before the draw: a
    pixel field's own size; for other roles, their ``canvas`` field's size, or the reference
    grid's. ``None`` while the sizes are being read."""
    where: str
    """Names the sample and the field, for error messages."""
    seekable: bool = False
    """The encoded value is from a pack fastpipe wrote with ``transcode``: a PNG's row index may
    be followed."""


class KeptRows(NamedTuple):
    """What a kernel returns when the draw drops rows of its field (boxes that left the crop):
    the rows kept, and the boolean mask of the original rows kept, which the same rows of the
    field's per-row fields (``JointCrop(boxes={field: (...)})``) follow."""

    value: Any
    keep: torch.Tensor


class _Kernel(NamedTuple):
    apply: Callable[[Any, JointParams, JointContext], Any]
    size_of: Callable[[Any, JointContext], tuple[tuple[int, int], Any]] | None


_KERNELS: dict[type[Role], _Kernel] = {}


def register_joint_kernel(role: type[Role], kernel: Callable[..., Any] | None = None, *,
                          size_of: Callable[..., Any] | None = None) -> Any:
    """Registers how fields of ``role`` (a :class:`~fastpipe.data.Role` subclass, and its
    subclasses) move with a :class:`~fastpipe.data.JointCrop`; usable as a decorator
    (``@register_joint_kernel(KeyPoints)``).

    ``kernel(value, params, context) -> new value``: ``value`` is the field's value as a reader
    returns it (a tensor for an array field), ``params`` the sample's
    :class:`~fastpipe.data.JointParams` on the field's own grid (the reference draw times
    ``context.factor``: ``box`` ``(top, left, height, width)``, ``out`` its size after the
    resize, ``hflip``, ``vflip``, then ``k`` counter-clockwise quarter turns), ``context`` a
    :class:`JointContext`. A kernel that drops rows returns :class:`KeptRows`.

    ``size_of(value, context) -> ((height, width), value)``, for roles whose values are pixels that
    set the draw (Image, Mask): the value's size before the draw (from an encoded header, without
    decoding), and the value the kernel then receives (the same, or its decoded pixels when the
    size needed a decode). Fields with a ``size_of`` are named in the crop's ``factors`` and
    ``interpolation``; the others live on a canvas (their role's ``canvas`` setting, else the
    reference grid).

    Registering a second kernel for one role class is refused (the same function again, from a
    reloaded module, replaces itself)."""
    if kernel is None:
        def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
            register_joint_kernel(role, function, size_of=size_of)
            return function
        return decorate
    if not (isinstance(role, type) and issubclass(role, Role)) or role is Role:
        raise TypeError(f"register_joint_kernel takes a Role subclass (the class, e.g. Mask), "
                        f"got {role!r}")
    for function, what in ((kernel, "kernel"), (size_of, "size_of")):
        if function is not None and not callable(function):
            raise TypeError(f"register_joint_kernel: {what} must be callable, got {function!r}")
    known = _KERNELS.get(role)
    if known is not None and _qualname(known.apply) != _qualname(kernel):
        raise ValueError(f"{role.__name__} already has the joint kernel {_qualname(known.apply)}; "
                         f"a role has one kernel (subclass the role for another)")
    _KERNELS[role] = _Kernel(kernel, size_of)
    return kernel


def _qualname(function: Any) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', function)}"


def _kernel_of(role: Role) -> _Kernel | None:
    for klass in type(role).__mro__:
        kernel = _KERNELS.get(klass)
        if kernel is not None:
            return kernel
    return None


_PLAIN_BOXES = BoundingBoxes()


class _Target(NamedTuple):
    name: str
    field: Field
    role: Role
    kernel: _Kernel


def _targets(crop: JointCrop, fields: Mapping[str, Field]) -> list[_Target]:
    """The fields a crop moves: those whose role has a kernel, pixel fields first (their sizes
    set the draw)."""
    out = []
    for name, field in fields.items():
        role = field.role
        if name in crop.boxes and type(role) is Array:
            role = _PLAIN_BOXES  # boxes= names a plain float (N, 4) field: xyxy, reference grid
        kernel = _kernel_of(role)
        if kernel is not None:
            out.append(_Target(name, field, role, kernel))
    return sorted(out, key=lambda t: t.kernel.size_of is None)


def moved_fields(crop: JointCrop, fields: Mapping[str, Field]) -> set[str]:
    """The names of the fields whose values ``crop`` changes: those it moves, and the per-box
    fields that drop rows with them (a reader must not hand their stored values to a batch)."""
    moved = {t.name for t in _targets(crop, fields)}
    return moved | {n for name in moved for n in crop.boxes.get(name, ())}


def _interpolation(crop: JointCrop, name: str, role: Role) -> str:
    return role.interpolation or crop.filter_of(name)


def check_fields(crop: JointCrop, fields: Mapping[str, Field], where: str) -> None:
    """Refuses, when a dataset is made rather than at its first sample, what ``crop`` cannot do
    with a record of ``fields`` (name -> field): names of ``factors``, ``interpolation`` and
    ``boxes`` that are not fields of the right role, a filter a mask would be interpolated with,
    box fields left out of ``boxes``, a canvas that is not a pixel field, no pixel field of
    factor 1."""
    targets = _targets(crop, fields)
    images = [t.name for t in targets if t.kernel.size_of is not None]
    others = [n for n in fields if n not in images]
    for name in list(crop.factors) + list(crop._filters):
        if name not in images:
            kind = "a field that is not an image" if name in fields else "no such field"
            raise ValueError(f"{where}: JointCrop names {name!r} (factors/interpolation), "
                             f"{kind}; the image fields are {images}")
    for name, chosen in crop._filters.items():
        fixed = fields[name].role.interpolation
        if fixed is not None and chosen != fixed:
            raise ValueError(
                f"{where}: JointCrop gives {name!r} interpolation {chosen!r}, but it is a "
                f"{type(fields[name].role).__name__}, resized only with {fixed!r} (a mask is "
                "never interpolated); leave it out of interpolation")
    moved = {t.name: t for t in targets}
    for box, per_box in crop.boxes.items():
        for name in (box, *per_box):
            if name not in others:
                kind = "an image field" if name in images else "no such field"
                raise ValueError(f"{where}: JointCrop boxes names {name!r}, {kind}; the other "
                                 f"fields are {others}")
        if box not in moved:
            raise ValueError(f"{where}: JointCrop boxes names {box!r}, whose role "
                             f"{fields[box].role!r} does not move with a crop (declare it "
                             "ArrayField(..., role=BoundingBoxes(...)))")
        if type(fields[box].role) is Array:
            try:
                BoundingBoxes().check(fields[box])
            except ValueError as exc:
                raise ValueError(f"{where}: JointCrop boxes names {box!r}, {fields[box]!r}: "
                                 f"{exc}") from exc
        for name in per_box:
            if name in moved:
                raise ValueError(f"{where}: per-box field {name!r} of {box!r} moves with the "
                                 f"crop itself ({moved[name].role!r}); per-box fields are "
                                 "plain rows (labels, scores)")
    for target in targets:
        if isinstance(target.role, BoundingBoxes) and target.name not in crop.boxes:
            raise ValueError(
                f"{where}: {target.name!r} holds boxes; name it and its per-box fields in "
                f"JointCrop(boxes={{{target.name!r}: (...)}}) so that they drop together "
                f"(boxes={{{target.name!r}: ()}} when none go with it)")
        canvas = getattr(target.role, "canvas", None)
        if target.kernel.size_of is None and canvas is not None and canvas not in images:
            raise ValueError(f"{where}: {target.name!r} is on the canvas {canvas!r} "
                             f"({target.role!r}), which is not an image field of this dataset; "
                             f"the image fields are {images}")
    if not images:
        raise ValueError(f"{where}: a JointCrop needs an image field; this dataset returns "
                         f"none (fields: {others})")
    if all(crop.factor_of(n) != 1 for n in images):
        raise ValueError(f"{where}: every image field has a factor above 1 in "
                         f"factors={crop.factors}; the fields of factor 1 are the reference "
                         "grid, so leave at least one out")


def joint_record(crop: JointCrop, record: Mapping[str, Any], fields: Mapping[str, Field],
                 seed: int | None, where: str, seekable: bool = False) -> dict[str, Any]:
    """``record`` with the fields a crop moves (by their roles in ``fields``, name -> field)
    moved by one draw of ``crop`` seeded ``seed``: pixel fields (encoded bytes, or decoded
    pixels) decoded and cropped, box fields moved with their per-box fields; other fields as
    they are. ``seekable``: the record comes from a pack fastpipe wrote with ``transcode``."""
    targets = _targets(crop, fields)
    sizes: dict[str, tuple[int, int]] = {}
    values: dict[str, Any] = {}
    for t in targets:
        if t.kernel.size_of is None:
            break
        context = JointContext(t.name, t.field, t.role, crop.factor_of(t.name),
                               _interpolation(crop, t.name, t.role), None,
                               f"{where}[{t.name!r}]", seekable)
        size, values[t.name] = t.kernel.size_of(record[t.name], context)
        sizes[t.name] = (int(size[0]), int(size[1]))
    params = crop.make_params(sizes, seed, where)
    reference = next(hw for n, hw in sizes.items() if crop.factor_of(n) == 1)
    out = dict(record)
    for t in targets:
        if t.kernel.size_of is not None:
            factor, canvas = crop.factor_of(t.name), sizes[t.name]
        elif (on := getattr(t.role, "canvas", None)) is not None:
            if on not in sizes:
                raise ValueError(f"{where}: {t.name!r} is on the canvas {on!r} ({t.role!r}), "
                                 f"which is not an image field of this record ({list(sizes)})")
            factor, canvas = crop.factor_of(on), sizes[on]
        else:
            factor, canvas = 1, reference
        context = JointContext(t.name, t.field, t.role, factor,
                               _interpolation(crop, t.name, t.role), canvas,
                               f"{where}[{t.name!r}]", seekable)
        moved = t.kernel.apply(values.get(t.name, record[t.name]), _scaled(params, factor),
                               context)
        if isinstance(moved, KeptRows):
            out[t.name] = moved.value
            _drop_rows(out, record, t.name, crop.boxes.get(t.name, ()), moved.keep, where)
        else:
            out[t.name] = moved
    return out


def _scaled(params: JointParams, factor: int) -> JointParams:
    if factor == 1:
        return params
    return params._replace(box=geometry.Box(*(v * factor for v in params.box)),
                           out=(params.out[0] * factor, params.out[1] * factor))


def _drop_rows(out: dict[str, Any], record: Mapping[str, Any], name: str, per_box: Any,
               keep: torch.Tensor, where: str) -> None:
    for other in per_box:
        value = record[other]
        if not isinstance(value, (torch.Tensor, np.ndarray)) or len(value) != len(keep):
            raise ValueError(
                f"{where}: per-box field {other!r} must hold one row per box of {name!r} "
                f"({len(keep)}); got {type(value).__name__} of length "
                f"{len(value) if hasattr(value, '__len__') else '?'}")
        out[other] = value[keep.numpy() if isinstance(value, np.ndarray) else keep]


# --- pixels ---------------------------------------------------------------------------------


def header_size(data: Any) -> tuple[int, int] | None:
    """``(height, width)`` of a PNG or JPEG from its header, None for other formats."""
    return _png.png_size(data) or _jpeg_size(data)


def _rgb8_png(data: Any) -> bool:
    header = _png._read_header(data)
    return header is not None and header.color_type == 2 and header.depth == 8


# Columns and rows decoded around a JPEG crop: smooth chroma upsampling reads the neighbours of
# the crop's edge pixels, and with one 2x-subsampled iMCU on each side the crop is pixel for pixel
# the crop of the whole decode (tests/data/joint/test_crop.py). Wider subsampling is refused by the
# region decode, and such files are decoded whole.
_JPEG_MARGIN = 16


def decode_region(data: Any, source: str, stored: bool, box: tuple[int, int, int, int] | None,
                  seekable: bool = False) -> tuple[np.ndarray, int, int]:
    """Pixels of an encoded image that cover ``box`` ``(top, left, height, width)`` (all with
    None), and the image coordinates ``(top, left)`` of their first pixel.

    ``stored``: a PNG's stored pixels (channels, dtype and values as the file holds them: a
    mask's palette indices or 16-bit values); other formats decode to RGB. Otherwise uint8 RGB,
    as fastpipe decodes images everywhere (fastpipe.data.decode.image.decode_rgb). A PNG decodes
    only the rows of the box (fastpipe.data.decode.png; from the segment holding them with
    ``seekable``, for a pack fastpipe wrote with ``transcode``), a JPEG only the region around
    it."""
    if _png.png_size(data) is not None and (stored or _rgb8_png(data)):
        if box is None:
            return _png.decode_png(data, source), 0, 0
        rows = (box[0], box[0] + box[2])
        return _png.decode_png(data, source, rows, seekable=seekable), box[0], 0
    if box is not None and (size := _jpeg_size(data)) is not None:
        top, left, h, w = box
        region = geometry.Box(max(0, top - _JPEG_MARGIN), max(0, left - _JPEG_MARGIN), 0, 0)
        region = region._replace(height=min(size[0], top + h + _JPEG_MARGIN) - region.top,
                                 width=min(size[1], left + w + _JPEG_MARGIN) - region.left)
        pixels = _decode_jpeg_crop(data, region, 1, False)
        if pixels is not None:
            return pixels, region.top, region.left
    return decode_rgb(data, source), 0, 0


def _resize(region: np.ndarray, out: tuple[int, int], interpolation: str) -> torch.Tensor:
    """``region`` ``(h, w[, C])`` resized to ``out``, as a ``(C, oh, ow)`` tensor of its dtype."""
    h, w = region.shape[:2]
    oh, ow = out
    if interpolation == "nearest":
        # torch's "nearest": source index floor(i * in / out), in exact integers.
        rows = (np.arange(oh) * h) // oh
        cols = (np.arange(ow) * w) // ow
        return _chw(region[rows][:, cols])
    if (_resize_pixels is not None and region.dtype == np.uint8 and region.ndim == 3
            and region.shape[2] == 3):
        if region.strides[1:] != (3, 1):  # whole 3-byte pixels, rows may be strided
            region = np.ascontiguousarray(region)
        resized = np.empty((3, oh, ow), np.uint8)
        _resize_pixels(region, (0, 0), (h, w), resized, (0, 0), (oh, ow), False,
                       _FILTER_CODES[interpolation])
        return torch.from_numpy(resized)
    # Other channel counts and 16-bit: torch's antialiased filter in float32, rounded back.
    pixels = _chw(region).unsqueeze(0).to(torch.float32)
    resized = torch.nn.functional.interpolate(pixels, size=(oh, ow), mode=interpolation,
                                              antialias=True, align_corners=False)[0]
    top = float(np.iinfo(region.dtype).max) if region.dtype.kind in "ui" else None
    resized = resized.round_()
    if top is not None:
        resized = resized.clamp_(0, top)
    return resized.to(_chw(region[:1, :1]).dtype)


def _chw(array: np.ndarray) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.unsqueeze(0) if tensor.ndim == 2 else tensor.permute(2, 0, 1)


def orient(tensor: torch.Tensor, params: JointParams) -> torch.Tensor:
    """The flips then the rot90 of ``params`` on a ``(..., H, W)`` tensor, contiguous."""
    if params.hflip:
        tensor = tensor.flip(-1)
    if params.vflip:
        tensor = tensor.flip(-2)
    if params.k:
        tensor = torch.rot90(tensor, params.k, (-2, -1))
    return tensor.contiguous()


def crop_pixels(pixels: np.ndarray, params: JointParams, factor: int, interpolation: str,
                origin: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """The joint crop of one field: ``pixels`` ``(h, w[, C])`` are the field's pixels from image
    coordinates ``origin`` ``(top, left)`` on; the box is the reference box times ``factor``."""
    top, left, h, w = (v * factor for v in params.box)
    top, left = top - origin[0], left - origin[1]
    region = pixels[top:top + h, left:left + w]
    out = (params.out[0] * factor, params.out[1] * factor)
    tensor = _chw(region) if out == (h, w) else _resize(region, out, interpolation)
    return orient(tensor, params)


def _is_decoded(value: Any) -> bool:
    """Decoded pixels ``(H, W[, C])`` (an array field's value, or what a size read decoded),
    rather than an encoded file's bytes."""
    return isinstance(value, torch.Tensor) or (isinstance(value, np.ndarray) and value.ndim >= 2)


def _as_numpy(pixels: Any) -> np.ndarray:
    return pixels.numpy() if isinstance(pixels, torch.Tensor) else pixels


def pixel_size(value: Any, context: JointContext) -> tuple[tuple[int, int], Any]:
    """The size of a pixel field's value from its header; a format without a header read here
    is decoded whole, and those pixels are what the crop then receives."""
    if _is_decoded(value):
        return tuple(value.shape[:2]), _as_numpy(value)
    size = header_size(value)
    if size is not None:
        return size, value
    pixels = decode_region(value, context.where, context.interpolation == "nearest", None)[0]
    return pixels.shape[:2], pixels


def crop_pixel_field(value: Any, params: JointParams, context: JointContext) -> torch.Tensor:
    """The kernel of Image and Mask fields: an encoded image decoded over the crop only (as
    stored with ``"nearest"``: a mask), or decoded pixels, cropped, resized, flipped, turned."""
    if _is_decoded(value):
        return crop_pixels(_as_numpy(value), params, 1, context.interpolation)
    pixels, top, left = decode_region(value, context.where, context.interpolation == "nearest",
                                      tuple(params.box), context.seekable)
    return crop_pixels(pixels, params, 1, context.interpolation, (top, left))


def decode_stored(data: Any, source: str) -> torch.Tensor:
    """A mask's encoded image decoded whole as stored (channels, dtype, palette indices): a
    ``(C, H, W)`` tensor, what a Mask field is without a joint crop."""
    return _chw(decode_region(data, source, True, None)[0])


# --- boxes ----------------------------------------------------------------------------------

def _box_tensor(boxes: Any, box_format: str, where: str) -> torch.Tensor:
    if not isinstance(boxes, torch.Tensor):
        boxes = torch.as_tensor(np.asarray(boxes))
    if boxes.ndim != 2 or boxes.shape[1] != 4 or not boxes.is_floating_point():
        corners = {"xyxy": "x1, y1, x2, y2", "xywh": "x, y, w, h",
                   "cxcywh": "cx, cy, w, h"}[box_format]
        raise ValueError(f"{where}: a box field holds float (N, 4) boxes ({corners}); got "
                         f"{boxes.dtype} {tuple(boxes.shape)} (store boxes as float32)")
    return boxes


def to_xyxy(boxes: torch.Tensor, box_format: str) -> torch.Tensor:
    """``(N, 4)`` boxes of ``box_format`` (``"xyxy"``, ``"xywh"``, ``"cxcywh"``) as corners."""
    if box_format == "xywh":
        return torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], 1)
    if box_format == "cxcywh":
        half = boxes[:, 2:] / 2
        return torch.cat([boxes[:, :2] - half, boxes[:, :2] + half], 1)
    return boxes


def from_xyxy(boxes: torch.Tensor, box_format: str) -> torch.Tensor:
    """The inverse of :func:`to_xyxy`."""
    if box_format == "xywh":
        return torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], 1)
    if box_format == "cxcywh":
        return torch.cat([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], 1)
    return boxes


def move_box_field(value: Any, params: JointParams, context: JointContext) -> KeptRows:
    """The kernel of BoundingBoxes fields: converted to corners, moved as the pixels of their
    canvas are (:func:`move_boxes`), converted back to their format; the kept rows."""
    box_format = context.role.format
    boxes = _box_tensor(value, box_format, context.where)
    moved, keep = move_boxes(to_xyxy(boxes, box_format), params, context.canvas, context.where)
    return KeptRows(from_xyxy(moved, box_format).contiguous(), keep)


register_joint_kernel(Image, crop_pixel_field, size_of=pixel_size)
register_joint_kernel(Mask, crop_pixel_field, size_of=pixel_size)
register_joint_kernel(BoundingBoxes, move_box_field)


def move_boxes(boxes: torch.Tensor, params: JointParams, canvas: tuple[int, int],
               where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes ``(N, 4)`` xyxy on a grid (of size ``canvas``) moved as its pixels are by ``params``
    (on that grid), and the mask of those kept (a side and an area of at least 1 pixel, inside
    the output): torchvision v2's crop, resize, flips and ``SanitizeBoundingBoxes(min_size=1)``."""
    boxes = _box_tensor(boxes, "xyxy", where)
    top, left, h, w = params.box
    b = boxes - torch.tensor([left, top, left, top], dtype=boxes.dtype)
    b[:, 0::2] = b[:, 0::2].clamp(0, w)
    b[:, 1::2] = b[:, 1::2].clamp(0, h)
    oh, ow = params.out
    if (oh, ow) != (h, w):
        ratios = torch.tensor([ow / w, oh / h, ow / w, oh / h])
        b = b.mul(ratios).to(boxes.dtype)
    if params.hflip:
        b = torch.stack([ow - b[:, 2], b[:, 1], ow - b[:, 0], b[:, 3]], 1)
    if params.vflip:
        b = torch.stack([b[:, 0], oh - b[:, 3], b[:, 2], oh - b[:, 1]], 1)
    height, width = oh, ow
    for _ in range(params.k):
        # One counter-clockwise turn of a (height, width) canvas: (x, y) -> (y, width - x).
        b = torch.stack([b[:, 1], width - b[:, 2], b[:, 3], width - b[:, 0]], 1)
        height, width = width, height
    ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    keep = (ws >= 1) & (hs >= 1) & (ws * hs >= 1) & (b >= 0).all(1)
    keep &= (b[:, 0] <= width) & (b[:, 2] <= width) & (b[:, 1] <= height) & (b[:, 3] <= height)
    return b[keep].contiguous(), keep
