"""GpuDecoder: one batch of encoded images (bytes and drawn geometry) to the uint8 batch the CPU
path would have given, decoded on the GPU.

One call of the backend per batch (nvImageCodec: only each crop's region where it can), then one
``fastpipe.ops.resize_crops`` over the decoded regions (the CPU path's filters and antialiasing,
the flips), on the stream current when it is called (DataPrefetcher's side stream). An image the
GPU decoder does not decode (a format it has no GPU decoder for, a JPEG it refuses) is decoded by
the CPU path's decoder from the same seed, so its pixels are the CPU path's, and counted; one the
CPU decoder refuses too is corrupt: raised, or left out with ``on_error="skip"``.
"""

from __future__ import annotations

import collections
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from fastpipe.data.collate.encoded import EncodedBatch
from fastpipe.data.decode.budget import CorruptImageError
from fastpipe.data.decode.gpu import ROUTE_GPU
from fastpipe.data.sampling.skip import Skipped
from fastpipe.gpu_decode import _backends
from fastpipe.gpu_decode._options import GpuDecode
from fastpipe.ops import resize_crops
from fastpipe.ops._resize import input_span

__all__ = ["DecodeStats", "Decoded", "GpuDecoder"]

# Columns decoded on each side of an eval region beyond those the resize reads, as the CPU path
# does (fastpipe.data.decode.image._EVAL_REGION_MARGIN): a region decode's edge columns may
# upsample chroma differently from a whole decode's.
_EVAL_REGION_MARGIN = 4


@dataclass
class DecodeStats:
    """What the GPU decode did: batches, images decoded on the GPU, images decoded on the CPU
    instead (``cpu``, with the reasons counted in ``fallback_reasons``), corrupt images skipped,
    and how often the buffers kept for reuse went past the cap and were let go."""

    batches: int = 0
    gpu: int = 0
    cpu: int = 0
    skipped: int = 0
    released: int = 0
    fallback_reasons: collections.Counter = field(default_factory=collections.Counter)

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "gpu": self.gpu, "cpu": self.cpu,
                "skipped": self.skipped, "released": self.released,
                "fallback_reasons": dict(self.fallback_reasons)}


class Decoded(NamedTuple):
    """A decoded batch: ``images`` ``(K, 3, H, W)`` uint8 on the device for the rows ``kept``
    (None: every row, K = N), and the samples skipped as corrupt."""

    images: torch.Tensor
    kept: list[int] | None
    skipped: list[Skipped]


class GpuDecoder:
    """Decodes :class:`~fastpipe.data.collate.encoded.EncodedBatch` es on one device.

    The backend opens at the first batch (its chroma upsampling follows that batch's recipe, as
    the CPU path's does), keeps its decode buffers between batches up to ``options.memory_cap``
    bytes (over it, it lets them go and counts it), and holds nothing after :meth:`close`.
    """

    def __init__(self, options: GpuDecode, device: torch.device) -> None:
        self.options = options
        self.device = device
        self.stats = DecodeStats()
        self._backend: _backends.Backend | None = None
        self._warned_all_fell_back = False

    def decode(self, batch: EncodedBatch, stream: Any, on_error: str = "raise") -> Decoded:
        """The batch's images, decoded, resized and flipped as the CPU path would, on the
        current stream (``stream``, passed to the backend)."""
        recipe = batch.decoder.recipe
        plans = batch.plans.tolist()
        count = len(plans)
        on_gpu = [i for i in range(count) if plans[i][9] == ROUTE_GPU]
        fallback = {i: "only the CPU path decodes it as the CPU path does (a CMYK or YCCK "
                       "JPEG, one cut short or with bytes after its end, or a header only PIL "
                       "reads)" for i in range(count) if plans[i][9] != ROUTE_GPU}
        requests, resize_rows = [], []
        for i in on_gpu:
            region, row = _region_and_plan(plans[i], recipe)
            requests.append(_backends.Request(batch.bytes_of(i), region, tuple(plans[i][:2])))
            resize_rows.append(row)
        results = self._open(batch).decode(requests, stream) if requests else []
        if len(results) != len(requests):
            raise RuntimeError(f"GPU decode: {self._backend.name} returned {len(results)} images "
                               f"for a batch of {len(requests)}")
        decoded, images, rows = [], [], []
        for i, image, row in zip(on_gpu, results, resize_rows):
            if image is None:
                fallback[i] = f"{self._backend.name} did not decode it on the GPU"
            else:
                decoded.append(i)
                images.append(image)
                rows.append(row)
        self._warn_if_nothing_decoded(batch, on_gpu, decoded)
        gpu_out = (resize_crops(images, torch.tensor(rows, dtype=torch.int64), recipe.size,
                                recipe.interpolation) if images else None)
        cpu_out, skipped = self._decode_on_cpu(batch, fallback, on_error)
        self._count(len(decoded), fallback, skipped)
        self._keep_within_cap()
        if not cpu_out and not skipped:
            return Decoded(gpu_out, None, [])
        kept = sorted(decoded + list(cpu_out))
        device = gpu_out.device if gpu_out is not None else self.device
        out = torch.empty((len(kept), 3, *recipe.size), dtype=torch.uint8, device=device)
        position = {row: k for k, row in enumerate(kept)}
        if gpu_out is not None:
            out.index_copy_(0, torch.tensor([position[i] for i in decoded], device=device),
                            gpu_out)
        for i, image in cpu_out.items():
            out[position[i]].copy_(_host_ready(image, device), non_blocking=True)
        return Decoded(out, kept if len(kept) < count else None, skipped)

    def close(self) -> None:
        """Lets go of the backend and every buffer it kept."""
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()

    @property
    def backend_name(self) -> str | None:
        return None if self._backend is None else self._backend.name

    def kept_bytes(self) -> int:
        return 0 if self._backend is None else self._backend.kept_bytes()

    # ------------------------------------------------------------------------------ the parts

    def _open(self, batch: EncodedBatch) -> _backends.Backend:
        if self._backend is None:
            self._backend = _backends.open_backend(
                self.options.backend, self.device, hardware=self.options.hardware,
                fancy_upsampling=not batch.decoder.fast_upsample)
        return self._backend

    def _decode_on_cpu(self, batch: EncodedBatch, fallback: dict[int, str],
                       on_error: str) -> tuple[dict[int, torch.Tensor], list[Skipped]]:
        """The CPU path's output for each fallback image, from its seed; the corrupt ones raised
        or, with ``on_error="skip"``, listed."""
        out: dict[int, torch.Tensor] = {}
        skipped: list[Skipped] = []
        for i, reason in sorted(fallback.items()):
            source = batch.sources[i]
            try:
                out[i] = batch.decoder._from_seed(batch.bytes_of(i), source,
                                                  int(batch.seeds[i]))
            except CorruptImageError as exc:
                message = (f"{source} does not decode: {reason}, and the CPU decoder refuses "
                           f"it too: {exc}")
                if on_error != "skip":
                    raise type(exc)(message) from exc
                skipped.append(Skipped(int(batch.indices[i]), source, message))
        return out, skipped

    def _count(self, on_gpu: int, fallback: dict[int, str], skipped: list[Skipped]) -> None:
        stats = self.stats
        stats.batches += 1
        stats.gpu += on_gpu
        stats.cpu += len(fallback) - len(skipped)
        stats.skipped += len(skipped)
        stats.fallback_reasons.update(fallback.values())

    def _keep_within_cap(self) -> None:
        backend = self._backend
        if backend is not None and backend.kept_bytes() > self.options.memory_cap:
            backend.release()
            self.stats.released += 1

    def _warn_if_nothing_decoded(self, batch: EncodedBatch, on_gpu: list[int],
                                 decoded: list[int]) -> None:
        """A batch of JPEGs none of which the GPU decoded: nvImageCodec without nvJPEG decodes
        nothing on the GPU, and every image would go to the CPU without a word."""
        jpegs = [i for i in on_gpu if bytes(batch.bytes_of(i)[:2]) == b"\xff\xd8"]
        if self._warned_all_fell_back or len(jpegs) < 2 or any(i in decoded for i in jpegs):
            return
        self._warned_all_fell_back = True
        warnings.warn(
            f"GPU decode: {self._backend.name} decoded none of the batch's {len(jpegs)} JPEGs on "
            "the GPU, so they were decoded on the CPU (slower, and the CPU path's pixels). "
            "nvImageCodec decodes JPEGs on the GPU only with nvJPEG: pip install nvidia-nvjpeg "
            "(`fastpipe doctor` says whether it loads)", RuntimeWarning, stacklevel=4)


def _region_and_plan(plan: list[int], recipe: Any) -> tuple[tuple[int, int, int, int],
                                                            list[int]]:
    """The region to decode (top, left, height, width) and its resize_crops plan row: train, the
    crop box, resized as an image of its own; eval, the pixels the centre crop of the resized
    image reads (and a margin of columns), as a box of the whole image."""
    height, width, top, left, box_h, box_w, resize_h, resize_w, flip, _ = plan
    if resize_h == 0:  # train: the box is the image, resized to the output size
        return (top, left, box_h, box_w), [0, 0, box_h, box_w, 0, 0, *recipe.size, flip]
    filter_ = 1 if recipe.interpolation == "bicubic" else 0
    rows = input_span(height, resize_h, top, box_h, filter_)
    cols = input_span(width, resize_w, left, box_w, filter_)
    col_lo = max(cols[0] - _EVAL_REGION_MARGIN, 0)
    col_hi = min(cols[0] + cols[1] + _EVAL_REGION_MARGIN, width)
    region = (rows[0], col_lo, rows[1], col_hi - col_lo)
    return region, [rows[0], col_lo, height, width, top, left, resize_h, resize_w, flip]


def _host_ready(image: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU-decoded image in page-locked memory when it goes to a GPU (a queued copy, not a
    blocking one)."""
    return image.pin_memory() if device.type == "cuda" else image
