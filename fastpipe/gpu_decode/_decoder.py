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
from fastpipe.data.decode.image import EVAL_REGION_MARGIN
from fastpipe.data.sampling.skip import Skipped
from fastpipe.gpu_decode import _backends
from fastpipe.gpu_decode._batches import index_on
from fastpipe.gpu_decode._options import GpuDecode
from fastpipe.ops._resize import input_span, resize_planned
from fastpipe.recipe import RESIZE_FILTERS

__all__ = ["DecodeStats", "Decoded", "GpuDecoder"]


@dataclass
class DecodeStats:
    """What the GPU decode did: batches, images decoded on the GPU, images decoded on the CPU
    instead (``cpu``; the reasons counted in ``fallback_reasons``, which add up to it), corrupt
    images skipped (neither decoder decoded them: ``gpu + cpu + skipped`` is every image), and how
    often the buffers kept for reuse went past the cap and were let go."""

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

    A backend opens at the first batch that needs it: one per chroma upsampling (a batch's
    decoder upsamples as the CPU path's does, replicated in train and smooth in eval, so a train
    and an eval loader may share a prefetcher). Each keeps its decode buffers between batches;
    past ``options.memory_cap`` bytes kept in all, they are let go (and counted). Nothing is held
    after :meth:`close`.
    """

    def __init__(self, options: GpuDecode, device: torch.device) -> None:
        self.options = options
        self.device = device
        self.stats = DecodeStats()
        # Keyed by the batch decoder's fast_upsample.
        self._backends: dict[bool, _backends.Backend] = {}
        self._last: _backends.Backend | None = None
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
        backend = self._open(batch) if requests else None
        results = backend.decode(requests, stream) if backend is not None else []
        if len(results) != len(requests):
            raise RuntimeError(f"GPU decode: {backend.name} returned {len(results)} images "
                               f"for a batch of {len(requests)}")
        decoded, images, rows = [], [], []
        for i, image, row in zip(on_gpu, results, resize_rows):
            if image is None:
                fallback[i] = f"{backend.name} did not decode it on the GPU"
            else:
                decoded.append(i)
                images.append(image)
                rows.append(row)
        self._warn_if_nothing_decoded(batch, on_gpu, decoded)
        gpu_out = (resize_planned(images, torch.tensor(rows, dtype=torch.int64), recipe.size,
                                  RESIZE_FILTERS[recipe.interpolation]) if images else None)
        cpu_out, skipped = self._decode_on_cpu(batch, fallback, on_error)
        self._count(len(decoded), fallback, cpu_out)
        self._keep_within_cap()
        if not cpu_out and not skipped:
            return Decoded(gpu_out, None, [])
        kept = sorted(decoded + list(cpu_out))
        device = gpu_out.device if gpu_out is not None else self.device
        out = torch.empty((len(kept), 3, *recipe.size), dtype=torch.uint8, device=device)
        position = {row: k for k, row in enumerate(kept)}
        if gpu_out is not None:
            out.index_copy_(0, index_on([position[i] for i in decoded], device), gpu_out)
        for i, image in cpu_out.items():
            out[position[i]].copy_(_host_ready(image, device), non_blocking=True)
        return Decoded(out, kept if len(kept) < count else None, skipped)

    def close(self) -> None:
        """Lets go of the backends and every buffer they kept."""
        backends, self._backends = self._backends, {}
        self._last = None
        for backend in backends.values():
            backend.close()

    @property
    def backend_name(self) -> str | None:
        """The decoder library of the last batch (None before one)."""
        return None if self._last is None else self._last.name

    def kept_bytes(self) -> int:
        return sum(backend.kept_bytes() for backend in self._backends.values())

    # ------------------------------------------------------------------------------ the parts

    def _open(self, batch: EncodedBatch) -> _backends.Backend:
        fast_upsample = bool(batch.decoder.fast_upsample)
        backend = self._backends.get(fast_upsample)
        if backend is None:
            backend = self._backends[fast_upsample] = _backends.open_backend(
                self.options.backend, self.device, hardware=self.options.hardware,
                fancy_upsampling=not fast_upsample)
        self._last = backend
        return backend

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

    def _count(self, on_gpu: int, fallback: dict[int, str],
               cpu_out: dict[int, torch.Tensor]) -> None:
        """The batch's images: on the GPU, on the CPU (with why), and the rest of the fallback
        skipped as corrupt."""
        stats = self.stats
        stats.batches += 1
        stats.gpu += on_gpu
        stats.cpu += len(cpu_out)
        stats.skipped += len(fallback) - len(cpu_out)
        stats.fallback_reasons.update(fallback[i] for i in cpu_out)

    def _keep_within_cap(self) -> None:
        if self.kept_bytes() > self.options.memory_cap:
            for backend in self._backends.values():
                backend.release()
            self.stats.released += 1

    def _warn_if_nothing_decoded(self, batch: EncodedBatch, on_gpu: list[int],
                                 decoded: list[int]) -> None:
        """A batch of JPEGs none of which the GPU decoded: nvImageCodec without nvJPEG decodes
        nothing on the GPU, and every image would go to the CPU without a word."""
        if self._warned_all_fell_back or len(decoded) == len(on_gpu):
            return  # warned already, or nothing fell back: no need to look at the bytes
        jpegs = [i for i in on_gpu if bytes(batch.bytes_of(i)[:2]) == b"\xff\xd8"]
        if len(jpegs) < 2 or any(i in decoded for i in jpegs):
            return
        self._warned_all_fell_back = True
        warnings.warn(
            f"GPU decode: {self._last.name} decoded none of the batch's {len(jpegs)} JPEGs on "
            "the GPU, so they were decoded on the CPU (slower, and the CPU path's pixels). "
            "nvImageCodec decodes JPEGs on the GPU only with nvJPEG: pip install nvidia-nvjpeg "
            "(`fastpipe doctor` says whether it loads)", RuntimeWarning, stacklevel=4)


def _region_and_plan(plan: list[int], recipe: Any) -> tuple[tuple[int, int, int, int],
                                                            list[int]]:
    """The region to decode (top, left, height, width) and its resize_crops plan row: train, the
    crop box, resized as an image of its own; eval, the pixels the centre crop of the resized
    image reads, and :data:`EVAL_REGION_MARGIN` rows and columns on each side (a region decode's
    edge rows and columns may upsample chroma differently from a whole decode's; the margin is
    decoded, never read), as a box of the whole image."""
    height, width, top, left, box_h, box_w, resize_h, resize_w, flip, _ = plan
    if resize_h == 0:  # train: the box is the image, resized to the output size
        return (top, left, box_h, box_w), [0, 0, box_h, box_w, 0, 0, *recipe.size, flip]
    filter_ = RESIZE_FILTERS[recipe.interpolation]
    spans = (input_span(height, resize_h, top, box_h, filter_),
             input_span(width, resize_w, left, box_w, filter_))
    (row_lo, row_hi), (col_lo, col_hi) = (
        (max(start - EVAL_REGION_MARGIN, 0), min(start + length + EVAL_REGION_MARGIN, full))
        for (start, length), full in zip(spans, (height, width)))
    region = (row_lo, col_lo, row_hi - row_lo, col_hi - col_lo)
    return region, [row_lo, col_lo, height, width, top, left, resize_h, resize_w, flip]


def _host_ready(image: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU-decoded image in page-locked memory when it goes to a GPU (a queued copy, not a
    blocking one)."""
    return image.pin_memory() if device.type == "cuda" else image
