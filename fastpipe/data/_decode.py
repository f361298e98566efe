"""Image decoding. (Interface stub: the fast path of the CPU-image issue replaces the bodies.)"""

from __future__ import annotations

import io

import numpy as np
import torch


class CorruptImageError(ValueError):
    """An image could not be decoded; the message names its source (file path or pack index)."""


def decode_rgb(data: bytes | memoryview | np.ndarray, source: str = "<bytes>") -> np.ndarray:
    """Decodes encoded image bytes (JPEG, PNG, ...) to an ``(H, W, 3)`` uint8 RGB array.

    Raises :class:`CorruptImageError` naming ``source`` when the bytes are not a decodable image.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data))) as image:
            return np.array(image.convert("RGB"))
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad data
        raise CorruptImageError(f"cannot decode image {source}: {exc}") from exc


class ImageDecoder:
    """Callable ``(data: bytes, source: str) -> uint8 tensor (3, size, size)``.

    Train mode: random resized crop + horizontal flip; eval mode: resize + centre crop.
    """

    def __init__(self, train: bool = True, size: int = 224) -> None:
        self.train = train
        self.size = size

    def __call__(self, data: bytes | memoryview | np.ndarray, source: str = "<bytes>") -> torch.Tensor:
        from PIL import Image

        image = Image.fromarray(decode_rgb(data, source)).resize((self.size, self.size))
        return torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
