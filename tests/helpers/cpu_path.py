"""Test images for the CPU image path: JPEG bytes in the shapes and colour modes that matter."""

from __future__ import annotations

import importlib
import io
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from PIL import Image


def sample_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.jpg"))


def encode(image: Image.Image, fmt: str = "JPEG", **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def large_jpeg(sample: Path, factor: int = 4) -> bytes:
    """A photo-like JPEG ``factor`` times the size of ``sample`` (about 1700x2300 for 4), large
    enough that train crops decode at 1/2, 1/4 or 1/8 scale."""
    with Image.open(sample) as image:
        big = image.convert("RGB").resize((image.width * factor, image.height * factor),
                                          Image.BICUBIC)
    return encode(big, quality=90)


def pil_rgb(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def chw(image: Image.Image) -> np.ndarray:
    """PIL image -> (3, H, W) int32, for differences without uint8 wrap-around."""
    return np.asarray(image, dtype=np.int32).transpose(2, 0, 1)


def built_module(name: str, hint: str, required_by: str) -> ModuleType:
    """The compiled module ``name``; skips the test when it is not built, and fails instead when
    the environment variable ``required_by`` is 1 (CI builds it, so there it must exist)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        message = f"{name} is not built ({exc}); {hint}"
        if os.environ.get(required_by) == "1":
            pytest.fail(f"{message} ({required_by}=1)")
        pytest.skip(message)


def decoded(decoder, images: list[bytes], seed: int) -> list[torch.Tensor]:
    """``decoder``'s outputs for ``images`` after ``torch.manual_seed(seed)`` (the same draws)."""
    torch.manual_seed(seed)
    return [decoder(data, "x.jpg") for data in images]


def turns_inside_calls(call: Callable[[], object], seconds: float = 0.3) -> tuple[int, float]:
    """Runs ``call`` over and over in another thread for ``seconds`` while this thread spins;
    returns how many of this thread's turns fell inside a call, and the seconds spent in calls.
    A call that holds the GIL leaves no turn inside it; one that releases it leaves many."""
    calls: list[tuple[float, float]] = []

    def work() -> None:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            call()
            calls.append((start, time.perf_counter()))

    ticks: list[float] = []
    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    inside = sum(1 for t in ticks for start, end in calls if start < t < end)
    return inside, sum(end - start for start, end in calls)
