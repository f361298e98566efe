"""The worker's half of GPU decode: read an image's size from its header and draw its geometry,
without decoding it.

A dataset built with ``decode="gpu"`` calls :func:`gpu_plan` for each image: the recipe's draw
(:meth:`fastpipe.Recipe.draw`) from the same ``(seed, epoch, index)`` seed and the same image
size as the CPU path (:class:`~fastpipe.data.ImageDecoder`), so the GPU decode crops the box the
CPU path would have cropped and flips where it would have flipped. The pixel budget and headers
that cannot be read are refused here, as the CPU path refuses them (``CorruptImageError``, which
``on_error="skip"`` leaves out in the worker as before).
"""

from __future__ import annotations

import io
import warnings

from fastpipe._geometry import draw_uniforms
from fastpipe.data.decode.budget import (
    CorruptImageError,
    ImageBytes,
    ImageTooLargeError,
    _bytes_of,
    _check_pixels,
)
from fastpipe.data.decode.image import _JPEG_END, _JPEG_MAGIC, ImageDecoder, _jpeg_size
from fastpipe.data.sampling.seeds import reseeded

__all__ = ["PLAN_FIELDS", "ROUTE_CPU", "ROUTE_GPU", "gpu_plan"]

# A plan: the image's full size, the crop box in full-size pixels, the size the whole image is
# resized to first (0, 0 in train, where the box is resized to the output size), the flip, and
# where it decodes: ROUTE_GPU, or ROUTE_CPU for images only the CPU path decodes as the CPU path
# does (CMYK and YCCK JPEGs, whose colours PIL converts; JPEGs that do not end with their
# end-of-image marker, which it decodes strictly).
PLAN_FIELDS = ("height", "width", "top", "left", "box_height", "box_width", "resize_height",
               "resize_width", "flip", "route")
ROUTE_GPU = 0
ROUTE_CPU = 1


def gpu_plan(decoder: ImageDecoder, data: ImageBytes, source: str,
             seed: int) -> tuple[bytes | memoryview, tuple[int, ...]]:
    """``(data, plan)`` for one image: its bytes as the decoders take them, and its
    :data:`PLAN_FIELDS`, drawn by ``decoder.recipe`` from ``seed`` (the sample's seed, as
    ``ImageDecoder._from_seed`` receives it)."""
    data = _bytes_of(data, source)
    size = _jpeg_size(data)
    route = ROUTE_GPU
    if size is None:
        size = _header_size(data, source)
        if bytes(data[:3]) == _JPEG_MAGIC:
            route = ROUTE_CPU  # CMYK/YCCK, or a header only PIL reads: the CPU path's decode
    elif bytes(data[-2:]) != _JPEG_END:
        # Truncated, or bytes after the image: the CPU path decodes these strictly (a truncated
        # file is an error for every crop), where a GPU decoder might pad it without a word.
        route = ROUTE_CPU
    height, width = size
    _check_pixels(height, width, source)
    uniforms = draw_uniforms(reseeded(seed)) if decoder.recipe.train else None
    box, resize, flip = decoder.recipe.draw(height, width, uniforms)
    resize_height, resize_width = resize if resize is not None else (0, 0)
    return data, (height, width, box.top, box.left, box.height, box.width, resize_height,
                  resize_width, int(flip), route)


def _header_size(data: ImageBytes, source: str) -> tuple[int, int]:
    """``(height, width)`` from the image's header (PIL reads no pixels for it); a header PIL
    cannot read is a CorruptImageError naming ``source``, as the CPU path's decode raises."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            # The pixel budget is fastpipe's own (checked by the caller); Pillow's is twice it.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(
            f"image {source}: {exc} (Pillow's own limit, PIL.Image.MAX_IMAGE_PIXELS)") from exc
    except Image.UnidentifiedImageError as exc:
        raise CorruptImageError(
            f"cannot decode image {source}: not a format Pillow recognises. The file is damaged, "
            "truncated or not an image; remove it from the dataset or replace it") from exc
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad data
        raise CorruptImageError(
            f"cannot decode image {source}: {exc}. The file is damaged, truncated or not an "
            "image; remove it from the dataset or replace it") from exc
    return height, width
