"""The GPU decoders GPU decode drives: nvImageCodec (batched, region decode, the hardware JPEG
engine), and torchvision's batched ``decode_jpeg(device="cuda")`` where nvImageCodec is absent.

A backend decodes one batch per call, on the stream it is given, and returns for each request
the pixels of the requested region as an ``(h, w, 3)`` uint8 tensor on the device, or None for
an image it does not decode (the caller decodes that one on the CPU). The calls that reach the
libraries are here and nowhere else, so the tests put a recording stand-in in their place
(:func:`open_backend`).
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

__all__ = ["EXTRA", "Backend", "GpuDecodeUnavailable", "Request", "available_backends",
           "open_backend"]

EXTRA = "gpu-decode"
INSTALL = (f"pip install 'fastpipe[{EXTRA}]' (nvidia-nvimgcodec-cu13 and nvidia-nvjpeg, "
           "about 30 MB)")


class GpuDecodeUnavailable(RuntimeError):
    """GPU decode cannot run here; the message names what is missing and the fix."""


class Request(NamedTuple):
    """One image to decode: its encoded bytes (uint8 1-D), the region wanted (top, left, height,
    width, in full-size pixels) and the image's full size (height, width)."""

    data: np.ndarray
    region: tuple[int, int, int, int]
    size: tuple[int, int]


class Backend(Protocol):
    """What :class:`~fastpipe.gpu_decode._decoder.GpuDecoder` asks of a decoder library."""

    name: str

    def decode(self, requests: list[Request], stream: Any) -> list[torch.Tensor | None]:
        """One call per batch, queued on ``stream``: each request's region as ``(h, w, 3)``
        uint8 on the device, or None where this library does not decode the image."""

    def kept_bytes(self) -> int:
        """Device memory held between batches for reuse (decode buffers)."""

    def release(self) -> None:
        """Lets go of the buffers kept for reuse."""

    def close(self) -> None:
        """Lets go of everything: the buffers and the library's decoder."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def available_backends() -> dict[str, str | None]:
    """Each GPU decoder and why it cannot run here (None: it can, as far as can be told without
    decoding): ``"nvimgcodec"`` and ``"torchvision"``."""
    cuda = torch.cuda.is_available()
    no_gpu = "no CUDA device visible to torch"
    nvimgcodec = None if _installed("nvidia.nvimgcodec") else f"not installed: {INSTALL}"
    if nvimgcodec is None and not cuda:
        nvimgcodec = no_gpu
    torchvision = None if _installed("torchvision") else "torchvision is not installed"
    if torchvision is None and not cuda:
        torchvision = no_gpu
    elif torchvision is None and torch.version.cuda is None:
        torchvision = "torch is a CPU build"
    return {"nvimgcodec": nvimgcodec, "torchvision": torchvision}


def open_backend(name: str, device: torch.device, *, hardware: bool, fancy_upsampling: bool
                 ) -> Backend:
    """The backend ``name`` ("auto": nvImageCodec, else torchvision) on ``device``; a
    :class:`GpuDecodeUnavailable` naming the missing part and the extra where none can run."""
    if device.type != "cuda":
        raise GpuDecodeUnavailable(
            f"GPU decode needs a CUDA device, and the batches go to {device}: build the dataset "
            "with decode='cpu' (the workers decode), or pass device='cuda'")
    problems = available_backends()
    order = ["nvimgcodec", "torchvision"] if name == "auto" else [name]
    for candidate in order:
        if problems[candidate] is None:
            if candidate == "nvimgcodec":
                return NvImageCodecBackend(device, hardware, fancy_upsampling)
            return TorchvisionBackend(device)
    said = "; ".join(f"{c}: {problems[c]}" for c in order)
    raise GpuDecodeUnavailable(
        f"GPU decode found no GPU decoder ({said}). Install nvImageCodec: {INSTALL}; or decode "
        "on the CPU (decode='cpu')")


def _stream_handle(stream: Any) -> int:
    """The cudaStream_t of a torch stream as an int (0, the legacy default stream, for None)."""
    return int(getattr(stream, "cuda_stream", 0) or 0)


class NvImageCodecBackend:
    """nvImageCodec's batched decoder: the hardware JPEG engine first (where the GPU has one and
    ``hardware``), then its CUDA decoder, then nvJPEG's hybrid; no CPU decoder (what these cannot
    decode comes back None, and the caller decodes it on the CPU, as fastpipe's CPU path does).
    Regions are decoded as sub code streams; EXIF orientation is not applied (the CPU path does
    not apply it); RGB, 8 bits. The decoded images of a batch are kept and passed back as the
    next batch's buffers (``images=``), so that buffers are reused, not reallocated, from batch
    to batch; nvImageCodec synchronizes its work with the stream it is given, before and after,
    so a buffer is rewritten only after the work queued on that stream has read it."""

    name = "nvImageCodec"

    def __init__(self, device: torch.device, hardware: bool, fancy_upsampling: bool) -> None:
        from nvidia import nvimgcodec

        self._nvimgcodec = nvimgcodec
        kinds = [nvimgcodec.BackendKind.GPU_ONLY, nvimgcodec.BackendKind.HYBRID_CPU_GPU]
        if hardware:
            kinds.insert(0, nvimgcodec.BackendKind.HW_GPU_ONLY)
        self.device = device
        # Smooth chroma upsampling where the CPU path uses it (eval), replicated where it does not
        # (train: fast_upsample): the same choice as libjpeg-turbo's on the CPU path.
        options = ":fancy_upsampling=1" if fancy_upsampling else ":fancy_upsampling=0"
        self._decoder = nvimgcodec.Decoder(
            device_id=device.index if device.index is not None else torch.cuda.current_device(),
            backends=[nvimgcodec.Backend(kind) for kind in kinds], options=options)
        self._decode_params = self._params()
        self._kept: list[Any] = []

    def _params(self) -> Any:
        """The decode parameters: RGB, 8 bits, EXIF orientation not applied (the CPU path does
        not apply it)."""
        nvimgcodec = self._nvimgcodec
        return nvimgcodec.DecodeParams(
            apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
            allow_any_depth=False, sample_format=nvimgcodec.SampleFormat.I_RGB)

    def _code_streams(self, requests: list[Request]) -> list[Any]:
        """A code stream per request: the whole image, or the sub code stream of its region."""
        nvimgcodec = self._nvimgcodec
        code_streams = []
        for request in requests:
            code_stream = nvimgcodec.CodeStream(request.data)
            top, left, height, width = request.region
            if (top, left, height, width) != (0, 0, *request.size):
                code_stream = code_stream.get_sub_code_stream(
                    region=nvimgcodec.Region(top, left, top + height, left + width))
            code_streams.append(code_stream)
        return code_streams

    def decode(self, requests: list[Request], stream: Any) -> list[torch.Tensor | None]:
        # The kept images are passed back only as a whole batch's worth: nvImageCodec takes
        # exactly one image to reuse per code stream.
        reuse = self._kept[:len(requests)] if len(self._kept) >= len(requests) else None
        images = self._decoder.decode(self._code_streams(requests), images=reuse,
                                      params=self._decode_params,
                                      cuda_stream=_stream_handle(stream))
        kept = list(self._kept)
        out: list[torch.Tensor | None] = []
        for k, image in enumerate(images):
            if image is None:  # slot k keeps its buffer for the next batch
                out.append(None)
                continue
            if k < len(kept):
                kept[k] = image
            else:
                kept.append(image)
            out.append(torch.as_tensor(image, device=self.device))
        self._kept = kept
        return out

    def kept_bytes(self) -> int:
        return sum(int(getattr(image, "capacity", 0)) for image in self._kept)

    def release(self) -> None:
        self._kept = []

    def close(self) -> None:
        self._kept = []
        self._decoder = None


class TorchvisionBackend:
    """torchvision's batched ``decode_jpeg(device="cuda")`` (nvJPEG through torch's CUDA): JPEGs
    only, whole images (no region decode: the region is a view of the whole decode), a new
    buffer per image (it takes none to reuse). What it refuses, and every other format, comes
    back None."""

    name = "torchvision decode_jpeg"

    def __init__(self, device: torch.device) -> None:
        from torchvision.io import ImageReadMode, decode_jpeg

        self.device = device
        self._decode_jpeg, self._mode = decode_jpeg, ImageReadMode.RGB

    def _decode(self, data: list[torch.Tensor]) -> list[torch.Tensor]:
        with warnings.catch_warnings():
            # torchvision 0.29 deprecates its decoders in favour of TorchCodec.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            return self._decode_jpeg(data, mode=self._mode, device=self.device)

    def decode(self, requests: list[Request], stream: Any) -> list[torch.Tensor | None]:
        jpegs = [k for k, r in enumerate(requests) if bytes(r.data[:2]) == b"\xff\xd8"]
        data = [torch.from_numpy(np.asarray(requests[k].data)) for k in jpegs]
        try:
            decoded: list[torch.Tensor | None] = list(self._decode(data)) if data else []
        except RuntimeError:  # one image it refuses fails the batch: decode them one by one
            decoded = []
            for tensor in data:
                try:
                    decoded.append(self._decode([tensor])[0])
                except RuntimeError:
                    decoded.append(None)
        out: list[torch.Tensor | None] = [None] * len(requests)
        for k, image in zip(jpegs, decoded):
            if image is None:
                continue
            top, left, height, width = requests[k].region
            out[k] = image[:, top:top + height, left:left + width].permute(1, 2, 0)
        return out

    def kept_bytes(self) -> int:
        return 0

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass
