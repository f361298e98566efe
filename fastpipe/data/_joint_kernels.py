"""Applying one :class:`~fastpipe.data.JointCrop` draw to a sample's fields: pixels and boxes.

The image fields are read from their encoded bytes: the size from the header first (PNG's IHDR,
a JPEG's frame header), so the draw is known before anything is decoded; a PNG then decodes only
the rows of its crop (fastpipe.data._png), a JPEG only the region around it
(fastpipe._jpeg). Then, per field: the crop (the reference box times the
field's factor, by slicing: exactly aligned), the resize of ``mode="resized"``, the flips, rot90,
and a contiguous tensor out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fastpipe import _geometry as geometry
from fastpipe.data import _png
from fastpipe.data._decode import _decode_jpeg_crop, _jpeg_size, decode_rgb
from fastpipe.data.joint import JointCrop, JointParams

try:
    from fastpipe._resize import resize as _resize_pixels
except ImportError:  # built without fastpipe._resize: torch resizes
    _resize_pixels = None

_FILTER_CODES = {"bilinear": 0, "bicubic": 1}


def header_size(data: Any) -> tuple[int, int] | None:
    """``(height, width)`` of a PNG or JPEG from its header, None for other formats."""
    return _png.png_size(data) or _jpeg_size(data)


def _rgb8_png(data: Any) -> bool:
    header = _png._read_header(data)
    return header is not None and header.color_type == 2 and header.depth == 8


# Columns and rows decoded around a JPEG crop: smooth chroma upsampling reads the neighbours of
# the crop's edge pixels, and with one 2x-subsampled iMCU on each side the crop is pixel for pixel
# the crop of the whole decode (tests/data/test_joint.py). Wider subsampling is refused by the
# region decode, and such files are decoded whole.
_JPEG_MARGIN = 16


def decode_region(data: Any, source: str, stored: bool, box: tuple[int, int, int, int] | None,
                  seekable: bool = False) -> tuple[np.ndarray, int, int]:
    """Pixels of an encoded image that cover ``box`` ``(top, left, height, width)`` (all with
    None), and the image coordinates ``(top, left)`` of their first pixel.

    ``stored``: a PNG's stored pixels (channels, dtype and values as the file holds them: a
    mask's palette indices or 16-bit values); other formats decode to RGB. Otherwise uint8 RGB,
    as fastpipe decodes images everywhere (fastpipe.data._decode.decode_rgb). A PNG decodes only
    the rows of the box (fastpipe.data._png; from the segment holding them with ``seekable``,
    for a pack fastpipe wrote with ``transcode``), a JPEG only the region around it."""
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


def move_boxes(boxes: torch.Tensor, params: JointParams, canvas: tuple[int, int],
               where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes ``(N, 4)`` xyxy on the reference grid (of size ``canvas``) moved as the pixels are,
    and the mask of those kept (a side and an area of at least 1 pixel, inside the output):
    torchvision v2's crop, resize, flips and ``SanitizeBoundingBoxes(min_size=1)``."""
    if not isinstance(boxes, torch.Tensor):
        boxes = torch.as_tensor(np.asarray(boxes))
    if boxes.ndim != 2 or boxes.shape[1] != 4 or not boxes.is_floating_point():
        raise ValueError(f"{where}: a box field holds float (N, 4) boxes (x1, y1, x2, y2); got "
                         f"{boxes.dtype} {tuple(boxes.shape)} (store boxes as float32)")
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


def joint_record(crop: JointCrop, record: Mapping[str, Any], images: Sequence[str],
                 seed: int | None, where: str, seekable: bool = False) -> dict[str, Any]:
    """``record`` with its image fields (encoded bytes in ``record``) decoded and cropped by one
    draw of ``crop`` seeded ``seed``, and its box fields moved; other fields as they are.
    ``seekable``: the record comes from a pack fastpipe wrote with ``transcode``."""
    sizes: dict[str, tuple[int, int]] = {}
    decoded: dict[str, np.ndarray] = {}
    for name in images:
        size = header_size(record[name])
        if size is None:  # a format without a header read here: decode it whole first
            decoded[name] = decode_region(record[name], f"{where}[{name!r}]",
                                          crop.filter_of(name) == "nearest", None)[0]
            size = decoded[name].shape[:2]
        sizes[name] = tuple(size)
    params = crop.make_params(sizes, seed, where)
    out = dict(record)
    for name in images:
        factor = crop.factor_of(name)
        pixels, origin = decoded.get(name), (0, 0)
        if pixels is None:
            box = tuple(v * factor for v in params.box)
            pixels, *origin = decode_region(record[name], f"{where}[{name!r}]",
                                            crop.filter_of(name) == "nearest", box, seekable)
        out[name] = crop_pixels(pixels, params, factor, crop.filter_of(name), tuple(origin))
    reference = next(sizes[n] for n in images if crop.factor_of(n) == 1)
    for box_name, per_box in crop.boxes.items():
        moved, keep = move_boxes(record[box_name], params, reference, f"{where}[{box_name!r}]")
        out[box_name] = moved
        for name in per_box:
            value = record[name]
            if not isinstance(value, (torch.Tensor, np.ndarray)) or len(value) != len(keep):
                raise ValueError(
                    f"{where}: per-box field {name!r} must hold one row per box of "
                    f"{box_name!r} ({len(keep)}); got {type(value).__name__} of length "
                    f"{len(value) if hasattr(value, '__len__') else '?'}")
            out[name] = value[keep.numpy() if isinstance(value, np.ndarray) else keep]
    return out
