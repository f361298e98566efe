"""The CPU image fast path: decode at a reduced DCT scale, then crop, resize and flip in uint8.

JPEGs decode through fastpipe._jpeg when it was built (libjpeg-turbo's own API: only the rows and
columns the output needs, see fastpipe/csrc/jpeg/region_decode.cpp), or whole through simplejpeg
(libjpeg-turbo bundled in its wheel); anything else, and the rare JPEG that both refuse (CMYK,
recoverable damage), through PIL. The crop is drawn from the image header before decoding, so the
decoder can skip the detail the resize would throw away and the pixels outside the crop.
fastpipe._resize (fastpipe/csrc/image/resize.cpp) then resizes straight into the (3, H, W)
output, flipped if asked; without it, torch's resize. See docs/cpu-path.md for the measurements
behind each choice.
"""

from __future__ import annotations

import io
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from fastpipe import _geometry as geometry
from fastpipe import _malloc
from fastpipe._constants import (
    DEFAULT_CROP_PCT,
    DEFAULT_HFLIP,
    DEFAULT_INTERPOLATION,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    DEFAULT_SIZE,
)
from fastpipe.data.decode import budget
from fastpipe.data.decode.budget import (
    CorruptImageError,
    ImageBytes,
    ImageTooLargeError,
    _bytes_of,
    _check_pixels,
)
from fastpipe.data.decode.png import decode_rgb_png, png_size
from fastpipe.data.sampling.seeds import reseeded
from fastpipe.recipe import RESIZE_FILTERS, Recipe

try:
    from fastpipe._jpeg import decode_region as _decode_region
except ImportError:  # built without libjpeg-turbo's headers (setup.py says so): whole-image decode
    _decode_region = None
try:
    from fastpipe._jpeg import decode_resize as _decode_resize
except ImportError:  # an extension without decode_resize: decode, then resize, in two calls
    _decode_resize = None
try:
    from fastpipe._jpeg import decode_train as _decode_train
except ImportError:  # an extension without decode_train: the crop is planned in Python
    _decode_train = None
try:
    from fastpipe._resize import input_box as _input_box
    from fastpipe._resize import resize as _resize_pixels
except ImportError:  # installed without extensions: torch's resize
    _input_box = _resize_pixels = None

_JPEG_MAGIC = b"\xff\xd8\xff"
_JPEG_END = b"\xff\xd9"
# simplejpeg decodes these to RGB without the Adobe inversion PIL applies; PIL is the reference.
_PIL_ONLY_COLORSPACES = ("CMYK", "YCCK")


def _jpeg_size(data: ImageBytes) -> tuple[int, int] | None:
    """``(height, width)`` of a JPEG that decodes to RGB on the fast path, else None (use PIL).
    Chroma layouts simplejpeg's header reader refuses (4:4:1 raises KeyError, 3x1 ValueError)
    are read from PIL's header parse, so they take the same path, the region decode, whether a
    seed or a generator draws the crop; damaged headers are then PIL's to report."""
    if bytes(data[:3]) != _JPEG_MAGIC:
        return None
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except (ValueError, KeyError):
        return _pil_jpeg_size(data)
    if colorspace in _PIL_ONLY_COLORSPACES:
        return None
    return height, width


def _pil_jpeg_size(data: ImageBytes) -> tuple[int, int] | None:
    """``(height, width)`` of a YCbCr, RGB or greyscale JPEG from PIL's header parse (no pixels
    decoded), else None."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                if image.format != "JPEG" or image.mode not in ("RGB", "L"):
                    return None
                width, height = image.size
    except Exception:  # noqa: BLE001 - PIL raises many types for bad data; PIL's decode reports it
        return None
    return height, width


# libjpeg-turbo decodes at any M/8 scale, but only 1/2, 1/4 and 1/8 have fast reduced inverse DCTs
# (SIMD 4x4 and 2x2, DC-only 1x1); the others (7/8, 3/4, ...) run plain C, slower than a full-size
# decode (docs/cpu-path.md), so they are never asked for.
DCT_SCALES = (8, 4, 2, 1)


def dct_scale(height: int, width: int, need_height: float, need_width: float) -> int:
    """The largest reduction ``k`` in 8, 4, 2, 1 at which the image ``height x width``, decoded at
    ``1/k`` of its size, is still at least ``need_height x need_width`` pixels, so the resize after
    the decode only ever shrinks."""
    for k in DCT_SCALES:
        if height / k >= need_height and width / k >= need_width:
            return k
    return 1


def _decoded_size(height: int, width: int, k: int) -> tuple[int, int]:
    """The size of a ``1/k`` DCT-scaled decode (libjpeg rounds up, simplejpeg and fastpipe._jpeg
    alike)."""
    return -(-height // k), -(-width // k)


def _decode_jpeg(
    data: ImageBytes, height: int, width: int, k: int, fast_upsample: bool = False
) -> np.ndarray | None:
    """The JPEG at ``1/k`` of its size (libjpeg-turbo DCT scaling), or None if simplejpeg refuses
    it. strict=True makes a truncated file an error instead of a grey-padded image.
    ``fast_upsample`` replicates chroma samples instead of interpolating them (see ImageDecoder)."""
    import simplejpeg

    min_height, min_width = _decoded_size(height, width, k)
    if _scale_is_ambiguous(height, width, k):
        # simplejpeg picks its scale from the size asked for, and another M/8 scale gives this
        # size too (images of a few pixels): the exact 1/k decode of fastpipe._jpeg, as the region
        # path does, else None (PIL, at full size).
        whole = _decode_jpeg_crop(data, geometry.Box(0, 0, min_height, min_width), k, fast_upsample)
        return None if whole is None else np.ascontiguousarray(whole)
    try:
        return simplejpeg.decode_jpeg(
            data, colorspace="rgb", min_height=min_height, min_width=min_width,
            strict=True, fastupsample=fast_upsample,
        )
    except (ValueError, KeyError):  # KeyError: a chroma layout simplejpeg does not know
        return None


def _scale_is_ambiguous(height: int, width: int, k: int) -> bool:
    """Whether a libjpeg-turbo scale M/8 other than 1/k (simplejpeg chooses among M = 1..16)
    decodes ``height x width`` to the same size as 1/k does: then simplejpeg may decode at
    that other scale, with other pixels."""
    size = _decoded_size(height, width, k)
    return any(m * k != 8 and (-(-height * m // 8), -(-width * m // 8)) == size
               for m in range(1, 17))


def _decoded_box(box: geometry.Box, full_size: tuple[int, int],
                 decoded_size: tuple[int, int]) -> geometry.Box:
    """``box`` (full-size pixels) in the pixels of a decode of size ``decoded_size``: a 1/k decode
    maps full-size pixel p to p / k, and snapping the edges to that grid moves them by at most
    k / 2 full-size pixels. Never empty, never outside the decoded image."""
    sy, sx = decoded_size[0] / full_size[0], decoded_size[1] / full_size[1]
    top, left = round(box.top * sy), round(box.left * sx)
    bottom = max(min(round((box.top + box.height) * sy), decoded_size[0]), top + 1)
    right = max(min(round((box.left + box.width) * sx), decoded_size[1]), left + 1)
    return geometry.Box(top, left, bottom - top, right - left)


def _decode_jpeg_crop(
    data: ImageBytes, box: geometry.Box, k: int, fast_upsample: bool
) -> np.ndarray | None:
    """Only ``box`` (in ``1/k``-decoded pixels) of the JPEG, an ``(h, w, 3)`` uint8 view (rows
    strided: libjpeg-turbo decodes whole iMCU columns, and the rows are not copied out), or
    None when fastpipe._jpeg is not built or refuses the data (the caller then decodes the whole
    image, which reports damage as before). Pixel for pixel the crop of the whole 1/k decode with
    ``fast_upsample``; with smooth upsampling the two columns at each side edge can differ (by up
    to ~20 grey levels, 0.0006 on average over the benchmark's crops), where libjpeg-turbo has no
    chroma neighbour outside the crop to interpolate from. The module refuses what it cannot crop
    exactly: progressive files missing scans, and chroma subsampled more than 2x with smooth
    upsampling. Files that do not end with the end-of-image marker (truncated, or with bytes
    appended) take the whole-image path."""
    # A region decode stops at the crop's last row, so a truncated file whose crop lies above the
    # cut would decode; without the end-of-image marker the whole-image path decides instead, and
    # a truncated file is an error for every crop, not only for some draws.
    if _decode_region is None or bytes(data[-2:]) != _JPEG_END:
        return None
    try:
        pixels, row_stride, column = _decode_region(
            data, k, box.top, box.left, box.height, box.width, fast_upsample,
            budget.MAX_IMAGE_PIXELS)
    except ValueError:
        return None
    rows = np.frombuffer(pixels, dtype=np.uint8, count=box.height * row_stride)
    return rows.reshape(box.height, row_stride // 3, 3)[:, column:column + box.width]


def _decode_pil(data: ImageBytes, source: str) -> np.ndarray:
    """Non-JPEG images, and the JPEGs the fast path refuses: PNGs through fastpipe._png (the
    same pixels as PIL's, docs/cpu-path.md; a PNG it calls damaged is a CorruptImageError with
    its reason, never PIL's to decode again), the rest through PIL."""
    from PIL import Image

    array = decode_rgb_png(data, source)
    if array is not None:
        return array
    try:
        with Image.open(io.BytesIO(data)) as image:
            _check_pixels(image.size[1], image.size[0], source)
            return np.array(image.convert("RGB"))
    except ImageTooLargeError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(
            f"image {source}: {exc} (Pillow's own limit, PIL.Image.MAX_IMAGE_PIXELS)") from exc
    except Image.UnidentifiedImageError as exc:
        # Pillow names the buffer it read (<_io.BytesIO object at 0x...>), not the file.
        raise CorruptImageError(
            f"cannot decode image {source}: not a format Pillow recognises. The file is damaged, "
            "truncated or not an image; remove it from the dataset or replace it"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad data
        raise CorruptImageError(
            f"cannot decode image {source}: {exc}. The file is damaged, truncated or not an image; "
            "remove it from the dataset or replace it"
        ) from exc


def decode_rgb(data: ImageBytes, source: str = "<bytes>") -> np.ndarray:
    """Decodes encoded image bytes (JPEG, PNG, ...) to an ``(H, W, 3)`` uint8 RGB array, full size.

    Raises :class:`CorruptImageError` naming ``source`` and the reason when the bytes are not a
    decodable image (for a PNG, fastpipe._png's reason: a file it calls damaged is not decoded
    by PIL either; see fastpipe.data.decode.png.decode_rgb_png).
    """
    data = _bytes_of(data, source)
    size = _jpeg_size(data)
    if size is not None:
        _check_pixels(*size, source)
        array = _decode_jpeg(data, size[0], size[1], 1)
        if array is not None:
            return array
    return _decode_pil(data, source)


class _Plan(NamedTuple):
    """What to do with one image, decided from its header: the crop (in full-size pixels), the
    size to resize the whole image to first (eval only), the flip, and the DCT reduction ``k``."""

    box: geometry.Box
    resize: tuple[int, int] | None
    flip: bool
    k: int


class _Pixels(NamedTuple):
    """Decoded pixels: ``array``, ``(h, w, 3)`` uint8 (rows may be strided, as in a crop view),
    is the box at ``at`` = (top, left) of an image of ``image_size`` = (height, width)."""

    array: np.ndarray
    at: tuple[int, int]
    image_size: tuple[int, int]

    @classmethod
    def whole(cls, array: np.ndarray) -> _Pixels:
        return cls(array, (0, 0), array.shape[:2])

    @classmethod
    def crop_of(cls, array: np.ndarray, box: geometry.Box) -> _Pixels:
        """``box`` of ``array`` as an image of its own (a view, no copy)."""
        view = array[box.top:box.top + box.height, box.left:box.left + box.width]
        return cls.whole(view)


# The longest side ImageDecoder resizes: fastpipe._resize takes sides up to 2**24 (so that its
# sums cannot overflow), and torch's resize, without it, is held to the same, one rule for both
# builds. A JPEG's sides stop at 65,535; a PNG or another format inside the pixel budget can be
# 1 pixel wide and taller than this (eval resizes the whole image; a train crop of it is small).
MAX_SIDE = 1 << 24


def _check_sides(size: tuple[int, int], source: str) -> None:
    """Refuses pixels of ``size`` (what the resize reads) with a side over :data:`MAX_SIDE`."""
    if max(size) > MAX_SIDE:
        raise ImageTooLargeError(
            f"image {source} is {size[0]}x{size[1]} pixels: a side longer than {MAX_SIDE:,} "
            "(2**24) pixels, the longest ImageDecoder resizes, though it is within the pixel "
            "budget; such an image is damaged or not a training image: remove it from the "
            "dataset")


# Columns decoded on each side of an eval region beyond those the resize reads: with smooth chroma
# upsampling libjpeg-turbo gets the two columns at a region's side edges differently from a whole
# decode (it has no neighbour outside to interpolate from), so those are decoded but never read.
# GPU decode's regions take it on every side (fastpipe.gpu_decode).
EVAL_REGION_MARGIN = 4


class ImageDecoder:
    """Callable ``(data: bytes, source: str) -> uint8 tensor (3, H, W)``, the fused path.

    It runs the geometry of a :class:`~fastpipe.Recipe` (``recipe=``, or the keywords ``train``,
    ``size``, ``scale``, ``ratio``, ``hflip``, ``crop_pct`` and ``interpolation``, which build
    one; the recipe's augmentation and batch settings are the datasets' and loaders' to apply).
    Train mode: a crop drawn like torchvision's ``RandomResizedCrop(size, scale, ratio)``,
    resized to ``size`` (antialiased, ``"bilinear"`` or ``"bicubic"``, PIL's filters), flipped
    horizontally with probability ``hflip``. Eval mode, for a square ``size``: the shorter side
    resized to ``floor(size / crop_pct)`` (256 for 224), then the centre crop, like
    ``Resize(256) + CenterCrop(224)``; for ``(height, width)``: each side resized to
    ``floor(side / crop_pct)``, then the centre crop (timm's ``crop_mode="squash"``).

    JPEGs decode at the smallest DCT scale (1/2, 1/4, 1/8) at which the crop is still at least
    ``reducing_gap`` times the output size (PIL's name and meaning). 1.0, the train default, is
    the fastest and keeps the resize a pure shrink, with output a little sharper than PIL's;
    2.0, the eval default, stays within half a grey level of PIL's on average, so validation
    numbers compare with PIL pipelines (docs/cpu-path.md has the measurements);
    ``float("inf")`` always decodes at full size. ``fast_upsample`` (default: on in train mode,
    off in eval) has libjpeg-turbo replicate the half-resolution chroma of 4:2:0 JPEGs instead of
    interpolating it: a little less decode time for a small mean difference on train crops, the
    largest at sharp colour edges (docs/cpu-path.md has both). Randomness comes from
    ``generator`` when the call passes one (fastpipe's datasets pass one seeded from (seed,
    epoch, index)), else from torch's default generator, one draw per image. The output stays
    uint8; normalize on the device (``DataPrefetcher(mean=..., std=...)`` or
    ``fastpipe.ops.normalize``).

    Raises :class:`CorruptImageError` naming ``source`` for bytes that are not a decodable image.
    """

    def __init__(
        self,
        train: bool = True,
        size: int | tuple[int, int] = DEFAULT_SIZE,
        scale: tuple[float, float] = DEFAULT_SCALE,
        ratio: tuple[float, float] = DEFAULT_RATIO,
        hflip: float = DEFAULT_HFLIP,
        crop_pct: float = DEFAULT_CROP_PCT,
        interpolation: str = DEFAULT_INTERPOLATION,
        reducing_gap: float | None = None,
        fast_upsample: bool | None = None,
        *,
        recipe: Recipe | None = None,
    ) -> None:
        recipe = Recipe.resolve(
            recipe, ImageDecoder.__init__, "ImageDecoder", train=train, size=size, scale=scale,
            ratio=ratio, hflip=hflip, crop_pct=crop_pct, interpolation=interpolation)
        if reducing_gap is None:
            reducing_gap = 1.0 if recipe.train else 2.0
        if not reducing_gap >= 1.0:
            raise ValueError(
                f"reducing_gap must be >= 1.0 (float('inf') never reduces), got {reducing_gap!r}"
            )
        self.recipe = recipe
        self.train = recipe.train
        self.fast_upsample = self.train if fast_upsample is None else bool(fast_upsample)
        self._out = recipe.size
        self.size = recipe.size[0] if recipe.square else recipe.size
        self.scale, self.ratio, self.hflip = recipe.scale, recipe.ratio, recipe.hflip
        self.crop_pct = recipe.crop_pct
        self.interpolation = recipe.interpolation
        self.reducing_gap = float(reducing_gap)
        self.resize_to = recipe.resize_to

    def __repr__(self) -> str:
        if self.train:
            return (f"ImageDecoder(train=True, size={self.size}, scale={self.scale}, "
                    f"ratio={self.ratio}, hflip={self.hflip}, "
                    f"interpolation={self.interpolation!r}, reducing_gap={self.reducing_gap}, "
                    f"fast_upsample={self.fast_upsample})")
        return (f"ImageDecoder(train=False, size={self.size}, crop_pct={self.crop_pct}, "
                f"interpolation={self.interpolation!r}, reducing_gap={self.reducing_gap}, "
                f"fast_upsample={self.fast_upsample})")

    def __call__(self, data: ImageBytes, source: str = "<bytes>", *,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        if _malloc.state is None:
            _malloc.keep_freed_memory()
        data = _bytes_of(data, source)
        size = _jpeg_size(data)
        if size is not None:
            _check_pixels(*size, source)
            plan = self._plan(*size, generator=generator)
            if _decode_resize is not None:
                resized = self._decode_resized(data, size, plan)
                if resized is not None:
                    return resized
                pixels = None  # refused by the region decode: the whole image, as below
            else:
                pixels = self._decode_region(data, size, plan)
            if pixels is None:
                array = _decode_jpeg(data, size[0], size[1], plan.k, self.fast_upsample)
                if array is None:
                    # simplejpeg refused it: PIL decodes recoverable damage, or raises naming the
                    # source.
                    array, plan = _decode_pil(data, source), plan._replace(k=1)
                pixels = self._pixels_of(array, size, plan)
        else:
            if not self.train and (size := png_size(data)) is not None:
                _check_sides(size, source)  # eval resizes the whole image: before its decode
            array = _decode_pil(data, source)
            plan = self._plan(*array.shape[:2], generator=generator)
            pixels = self._pixels_of(array, array.shape[:2], plan)
            _check_sides(pixels.image_size, source)
        return self._resized(pixels, plan)

    def _from_seed(self, data: ImageBytes, source: str, seed: int) -> torch.Tensor:
        """``self(data, source, generator=reseeded(seed))``, as fastpipe's datasets call it for
        a sample's seed. In train mode, the JPEGs the region decode takes go through one call of
        fastpipe._jpeg.decode_train, which draws the same crop in C++ from the same numbers
        (csrc/jpeg/train_plan.h) and decodes and resizes it: no Python, torch generator or
        release of the GIL per step, which loader threads would otherwise contend for. The rest
        (and every image it refuses) take the call above, as do subclasses, whose overrides
        the C++ plan would not see."""
        if self.train and _decode_train is not None and type(self) is ImageDecoder:
            if _malloc.state is None:
                _malloc.keep_freed_memory()
            data = _bytes_of(data, source)
            out = np.empty((3, *self._out), dtype=np.uint8)
            if _decode_train(data, seed, out, self.scale, self.ratio, self.hflip,
                             self.reducing_gap, self.fast_upsample,
                             RESIZE_FILTERS[self.interpolation], budget.MAX_IMAGE_PIXELS):
                return torch.from_numpy(out)
        return self(data, source, generator=reseeded(seed))

    def _plan(self, height: int, width: int, generator: torch.Generator | None = None) -> _Plan:
        # The recipe's draw (the one the GPU decode receives too), and the DCT scale for it.
        uniforms = geometry.draw_uniforms(generator) if self.train else None
        box, resize, flip = self.recipe.draw(height, width, uniforms)
        if resize is None:
            need = (height * self._out[0] / box.height, width * self._out[1] / box.width)
            return _Plan(box, None, flip, self._dct_scale(height, width, need))
        return _Plan(box, resize, False, self._dct_scale(height, width, resize))

    def _dct_scale(self, height: int, width: int, need: tuple[float, float]) -> int:
        """The DCT reduction for an image whose decoded size must stay at least ``need``."""
        gap = self.reducing_gap
        return dct_scale(height, width, need[0] * gap, need[1] * gap)

    def _region(self, full_size: tuple[int, int],
                plan: _Plan) -> tuple[geometry.Box, tuple[int, int], tuple[int, int]]:
        """The rectangle of the 1/k-decoded image to decode, and, for the resize, where it sits
        (top, left) in an image of what size: the train crop, an image of its own; or, in eval,
        the input pixels the centre crop reads, plus :data:`EVAL_REGION_MARGIN` columns each
        side (needs fastpipe._resize's input_box)."""
        decoded_size = _decoded_size(*full_size, plan.k)
        if plan.resize is None:
            box = _decoded_box(plan.box, full_size, decoded_size)
            return box, (0, 0), (box.height, box.width)
        top, left, height, width = _input_box(decoded_size, plan.resize, plan.box[:2], plan.box[2:],
                                              RESIZE_FILTERS[self.interpolation])
        right = min(left + width + EVAL_REGION_MARGIN, decoded_size[1])
        left = max(left - EVAL_REGION_MARGIN, 0)
        return geometry.Box(top, left, height, right - left), (top, left), decoded_size

    def _window(self, plan: _Plan) -> tuple[tuple[int, int], geometry.Box]:
        """The size the pixels are resized to, and the box of it that is the output."""
        if plan.resize is None:
            return self._out, geometry.Box(0, 0, *self._out)
        return plan.resize, plan.box

    def _decode_resized(self, data: ImageBytes, full_size: tuple[int, int],
                        plan: _Plan) -> torch.Tensor | None:
        """The output, decoded and resized by one call of fastpipe._jpeg.decode_resize (one
        release of the GIL, and no buffer handed back to Python in between), or None where the
        region decode refuses the data (the caller decodes the whole image). The pixels are those
        of :meth:`_decode_region` and :meth:`_resized`."""
        if bytes(data[-2:]) != _JPEG_END or (plan.resize is not None and _input_box is None):
            return None  # as _decode_region does
        box, at, image_size = self._region(full_size, plan)
        resized_size, window = self._window(plan)
        out = np.empty((3, window.height, window.width), dtype=np.uint8)
        try:
            _decode_resize(data, plan.k, tuple(box), self.fast_upsample, at, image_size, out,
                           window[:2], resized_size, plan.flip,
                           RESIZE_FILTERS[self.interpolation], budget.MAX_IMAGE_PIXELS)
        except ValueError:
            return None
        return torch.from_numpy(out)

    def _decode_region(self, data: ImageBytes, full_size: tuple[int, int],
                       plan: _Plan) -> _Pixels | None:
        """Only the pixels the output needs, through fastpipe._jpeg, or None (decode whole).

        Train: the crop. Eval: the input pixels the centre crop of the resized image reads, plus
        :data:`EVAL_REGION_MARGIN` columns each side, so the output equals the whole image's
        pixel for pixel; that needs fastpipe._resize, which resizes from a region.
        """
        if plan.resize is not None and _input_box is None:
            return None
        box, at, image_size = self._region(full_size, plan)
        crop = _decode_jpeg_crop(data, box, plan.k, self.fast_upsample)
        return None if crop is None else _Pixels(crop, at, image_size)

    def _pixels_of(self, array: np.ndarray, full_size: tuple[int, int], plan: _Plan) -> _Pixels:
        """What to resize from a whole decoded ``(h, w, 3)`` array (at the plan's DCT scale): the
        crop in train mode, the whole image in eval mode."""
        if plan.resize is not None:
            return _Pixels.whole(array)
        return _Pixels.crop_of(array, _decoded_box(plan.box, full_size, array.shape[:2]))

    def _resized(self, pixels: _Pixels, plan: _Plan) -> torch.Tensor:
        """Train: ``pixels`` (the crop) resized to ``size`` and flipped if planned. Eval:
        the planned centre crop of the image ``pixels`` belong to, resized to ``plan.resize``.

        Into a fresh tensor: decoding straight into the rows of a shared-memory batch (skipping
        fast_collate's copy) was slower per image (docs/cpu-path.md, "Batches"), the resize's
        scattered stores then landing in cold memory instead of a buffer the allocator just freed,
        still in cache.
        """
        resized_size, window = self._window(plan)
        if _resize_pixels is None:
            return _torch_resized(pixels, resized_size, window, plan.flip, self.interpolation)
        out = np.empty((3, window.height, window.width), dtype=np.uint8)
        _resize_pixels(pixels.array, pixels.at, pixels.image_size, out, window[:2], resized_size,
                       plan.flip, RESIZE_FILTERS[self.interpolation])
        return torch.from_numpy(out)


def _torch_resized(pixels: _Pixels, size: tuple[int, int], window: geometry.Box, flip: bool,
                   interpolation: str = "bilinear") -> torch.Tensor:
    """The fallback without fastpipe._resize: torch's antialiased bilinear or bicubic resize of
    the whole ``pixels`` (its uint8 SIMD kernel, the one torchvision.transforms.v2 uses, within a
    grey level of PIL's), then the window, flipped if asked; ``(3, h, w)`` contiguous."""
    if pixels.at != (0, 0) or pixels.array.shape[:2] != tuple(pixels.image_size):
        raise ValueError("torch's resize needs the whole image; a region needs fastpipe._resize")
    # A contiguous copy first: torch's uint8 kernel reads a strided view so much more slowly that
    # the copy saves more than it costs, with identical output (docs/cpu-path.md, per-image table).
    image = torch.from_numpy(np.ascontiguousarray(pixels.array)).permute(2, 0, 1).unsqueeze(0)
    if tuple(image.shape[-2:]) != tuple(size):
        image = F.interpolate(image, size=tuple(size), mode=interpolation, antialias=True,
                              align_corners=False)
    out = image[0, :, window.top:window.top + window.height, window.left:window.left + window.width]
    return out.flip(-1) if flip else out.contiguous()
