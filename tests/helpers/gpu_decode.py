"""The recording stand-in of GPU decode's decoder library, for the CPU lane.

:class:`RecordingDecoder` takes the place of nvImageCodec behind ``fastpipe.gpu_decode``
(patched in as ``fastpipe.gpu_decode._backends.open_backend``, as RecordingStreams is patched in
for the CUDA streams): the same calls, each logged (one ``decode`` per batch, the stream it was
queued on, whether buffers were passed back for reuse), decoding on the CPU with libjpeg-turbo
at full size (chroma replicated or smooth, as the backend was opened), into buffers it keeps and
reuses from batch to batch as nvImageCodec does. ``refuse`` makes it return None for some
images, as nvImageCodec does for what it has no GPU decoder for.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastpipe.gpu_decode import _backends


def full_decode(data: np.ndarray, fast_upsample: bool) -> np.ndarray:
    """``(H, W, 3)`` uint8: a JPEG at full size through simplejpeg (libjpeg-turbo, chroma
    replicated when ``fast_upsample``), anything else through PIL."""
    raw = bytes(data)
    if raw[:2] == b"\xff\xd8":
        import simplejpeg

        return simplejpeg.decode_jpeg(raw, colorspace="rgb", fastupsample=fast_upsample)
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as image:
        return np.array(image.convert("RGB"))


class RecordingDecoder:
    """A backend of fastpipe.gpu_decode that decodes on the CPU and logs every call."""

    name = "stand-in decoder"

    def __init__(self, fancy_upsampling: bool = False,
                 refuse: Callable[[bytes], bool] | None = None,
                 log: list | None = None, streams: Any = None) -> None:
        self.fancy_upsampling = fancy_upsampling
        self.refuse = refuse or (lambda data: False)
        self.log = log if log is not None else []  # ("decode", n, stream, reused)
        self.streams = streams  # a RecordingStreams: its outputs stand for GPU tensors
        self.buffers: list[torch.Tensor] = []  # one per slot of the batch, reused
        self.closed = False
        self.releases = 0
        self.allocations = 0  # buffers made: one per slot, and one each time a slot grows
        self.images = 0  # images decoded

    def decode(self, requests: list[_backends.Request], stream: Any) -> list[torch.Tensor | None]:
        assert not self.closed, "decode after close()"
        reused = len(self.buffers) >= len(requests)
        self.log.append(("decode", len(requests), stream, reused))
        out: list[torch.Tensor | None] = []
        for slot, request in enumerate(requests):
            if self.refuse(bytes(request.data)):
                out.append(None)
                continue
            pixels = full_decode(request.data, fast_upsample=not self.fancy_upsampling)
            top, left, height, width = request.region
            assert pixels.shape[:2] == request.size, (pixels.shape, request.size)
            region = torch.from_numpy(np.ascontiguousarray(
                pixels[top:top + height, left:left + width]))
            needed = region.numel()
            self.images += 1
            if slot >= len(self.buffers):
                self.buffers.append(torch.empty(needed, dtype=torch.uint8))
                self.allocations += 1
            elif self.buffers[slot].numel() < needed:  # grows, as nvImageCodec's Image does
                self.buffers[slot] = torch.empty(needed, dtype=torch.uint8)
                self.allocations += 1
            view = self.buffers[slot][:needed].view(height, width, 3)
            view.copy_(region)
            if self.streams is not None:
                self.streams.mark_on_gpu(view)
            out.append(view)
        return out

    def kept_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    def release(self) -> None:
        self.releases += 1
        self.buffers = []

    def close(self) -> None:
        self.closed = True
        self.buffers = []


class StandIn:
    """Opens :class:`RecordingDecoder` s in place of the real backends (``opened`` lists them),
    with the options the decode asked for."""

    def __init__(self, refuse: Callable[[bytes], bool] | None = None, streams: Any = None,
                 log: list | None = None) -> None:
        self.refuse, self.streams = refuse, streams
        self.log = log if log is not None else []
        self.opened: list[RecordingDecoder] = []
        self.asked: list[dict[str, Any]] = []

    def __call__(self, name: str, device: torch.device, *, hardware: bool,
                 fancy_upsampling: bool) -> RecordingDecoder:
        self.asked.append({"name": name, "device": device, "hardware": hardware,
                           "fancy_upsampling": fancy_upsampling})
        decoder = RecordingDecoder(fancy_upsampling, self.refuse, self.log, self.streams)
        self.opened.append(decoder)
        return decoder


def use_stand_in(monkeypatch, **kwargs: Any) -> StandIn:
    """Puts a :class:`StandIn` in place of fastpipe.gpu_decode's backends; returns it."""
    stand_in = StandIn(**kwargs)
    monkeypatch.setattr(_backends, "open_backend", stand_in)
    return stand_in
