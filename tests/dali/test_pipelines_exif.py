"""DALI and the CPU decoder agree on photos with an EXIF orientation tag: both ignore it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fastpipe.data import ImageDecoder
from tests.helpers.dali import DALI_MISSING

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)

from fastpipe.dali import DALILoader  # noqa: E402

pytestmark = [pytest.mark.dali, pytest.mark.timeout(60)]


def test_exif_orientation_is_ignored_like_torchvision(tmp_path):
    pixels = np.zeros((64, 96, 3), dtype=np.uint8)
    pixels[:, 48:] = 255  # black left half, white right half
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    path = tmp_path / "cls" / "tagged.jpg"
    path.parent.mkdir()
    Image.fromarray(pixels).save(path, quality=95, exif=exif)

    with DALILoader(tmp_path, batch_size=1, train=False, size=32, crop_pct=1.0, shuffle=False,
                    device="cpu", dtype=torch.uint8) as loader:
        ((dali_image, _),) = list(loader)
    cpu_image = ImageDecoder(train=False, size=32, crop_pct=1.0)(path.read_bytes(), str(path))
    for image in (dali_image[0], cpu_image):
        # Dark on the left, bright on the right: the stored pixels, not the rotated view.
        assert image[:, :, :8].float().mean() < 40 and image[:, :, -8:].float().mean() > 215
