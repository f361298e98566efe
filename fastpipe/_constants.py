"""Constants shared by every part of fastpipe, defined once."""

from __future__ import annotations

# Per-channel statistics of ImageNet-1k in the 0-1 scale (RGB), as torchvision and timm use them.
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

# Defaults that several parts share (the vocabulary table in docs/vocabulary.md).
DEFAULT_SIZE = 224
DEFAULT_SCALE: tuple[float, float] = (0.08, 1.0)
DEFAULT_RATIO: tuple[float, float] = (3 / 4, 4 / 3)
DEFAULT_CROP_PCT = 0.875
DEFAULT_HFLIP = 0.5
DEFAULT_INTERPOLATION = "bilinear"
DEFAULT_CUTOUT_SIZE = 16
