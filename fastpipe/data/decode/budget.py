"""What every decode refuses, in one place: the errors (:class:`CorruptImageError`,
:class:`ImageTooLargeError`) and the pixel budget, checked from an image's header before anything
its size decides is allocated; and the flat byte view every decoder reads. The JPEG and PNG
decoders (image.py, png.py) both import it, neither the other's internals."""

from __future__ import annotations

import os

import numpy as np

# The pixel budget of every decode: a file whose frame declares more pixels is refused from its
# header, before anything its size decides is allocated (ImageTooLargeError). The default is
# Pillow's (it raises DecompressionBombError past 2 * Image.MAX_IMAGE_PIXELS), which fits real
# photos; set_max_image_pixels changes it (FASTPIPE_MAX_IMAGE_PIXELS, which it sets, carries it to
# worker processes started later). PIL-decoded files also meet Pillow's own limit.
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
_BUDGET_VARIABLE = "FASTPIPE_MAX_IMAGE_PIXELS"


def _budget_from_environment() -> int:
    text = os.environ.get(_BUDGET_VARIABLE)
    if text is None:
        return DEFAULT_MAX_IMAGE_PIXELS
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{_BUDGET_VARIABLE}={text!r} is not a number of pixels") from None
    if value < 1:
        raise ValueError(f"{_BUDGET_VARIABLE}={value}: the pixel budget must be at least 1")
    return value


MAX_IMAGE_PIXELS = _budget_from_environment()


def set_max_image_pixels(pixels: int | None) -> None:
    """Sets the pixel budget of every decode: an image whose header declares more than
    ``pixels`` pixels is refused before anything is allocated for it (``ImageTooLargeError``, a
    ``CorruptImageError``: ``on_error="skip"`` skips it, the packer skips and names it). ``None``
    restores the default, 178,956,970 (Pillow's limit). Applies to this process and, through the
    environment variable ``FASTPIPE_MAX_IMAGE_PIXELS`` it sets, to worker processes started after
    the call (fork and spawn); a DataLoader's persistent workers started earlier keep theirs."""
    global MAX_IMAGE_PIXELS
    if pixels is None:
        os.environ.pop(_BUDGET_VARIABLE, None)
        MAX_IMAGE_PIXELS = DEFAULT_MAX_IMAGE_PIXELS
        return
    if not isinstance(pixels, (int, np.integer)) or isinstance(pixels, bool) or pixels < 1:
        raise ValueError(f"set_max_image_pixels: the pixel budget is a positive int, got "
                         f"{pixels!r}")
    os.environ[_BUDGET_VARIABLE] = str(int(pixels))
    MAX_IMAGE_PIXELS = int(pixels)


def max_image_pixels() -> int:
    """The pixel budget of every decode in this process (see :func:`set_max_image_pixels`)."""
    return MAX_IMAGE_PIXELS


ImageBytes = bytes | bytearray | memoryview | np.ndarray | np.void


class CorruptImageError(ValueError):
    """An image could not be decoded; the message names its source (file path or pack index)."""


class ImageTooLargeError(CorruptImageError):
    """An image declares more pixels than the pixel budget (a decompression bomb; see
    :func:`set_max_image_pixels`), or, inside it, a side longer than ImageDecoder resizes
    (2**24 pixels)."""


def _check_pixels(height: int, width: int, source: str) -> None:
    """Refuses an image whose header declares more than :data:`MAX_IMAGE_PIXELS` pixels."""
    if height * width > MAX_IMAGE_PIXELS:
        raise ImageTooLargeError(
            f"image {source} declares {height}x{width} pixels, more than the pixel budget of "
            f"{MAX_IMAGE_PIXELS}: a decompression bomb is refused before it is decoded; raise the "
            "budget with fastpipe.data.set_max_image_pixels(n) if the image is genuine"
        )


def _bytes_of(data: ImageBytes, source: str) -> bytes | bytearray | memoryview:
    """A flat byte buffer over ``data`` without copying: h5py hands packed images over as numpy
    uint8 arrays or ``np.void`` scalars, which simplejpeg and PIL take only as bytes."""
    if isinstance(data, (bytes, bytearray)):
        return data
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(
            f"image {source}: expected encoded image bytes (bytes, bytearray, memoryview or a "
            f"numpy array), got {type(data).__name__}"
        ) from None
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")
