"""The hand-off of GPU decode: each sample's encoded bytes and drawn geometry, and their batch.

With ``decode="gpu"`` a dataset does not decode: its image field is an :class:`EncodedImage`,
the stored bytes and what the recipe drew for that sample from ``(seed, epoch, index)`` (the
draw of the CPU path: the crop box, the resize, the flip), and :func:`fast_collate` gathers a
batch of them into one :class:`EncodedBatch`: the bytes in one uint8 tensor (shared memory in a
worker process, pinned by the loader's pinning thread), the plans, seeds and indices in int64
tensors. ``DataPrefetcher`` decodes it on the device (``fastpipe.gpu_decode``).

Plain containers: nothing here decodes or draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["EncodedBatch", "EncodedImage", "collate_encoded"]

class EncodedImage:
    """One sample's image, not decoded: ``data`` (its encoded bytes), ``plan`` (ten ints:
    fastpipe.data.decode.gpu.PLAN_FIELDS), the ``seed`` its draws came from (the CPU decoder
    reproduces the CPU path's pixels from it), its dataset ``index``, ``source`` (how errors
    name it) and the ``decoder`` (a ``fastpipe.data.ImageDecoder``: the recipe's size and
    filter). Not a tuple, so that no collate function mistakes it for a record of fields."""

    __slots__ = ("data", "plan", "seed", "index", "source", "decoder")

    def __init__(self, data: Any, plan: tuple[int, ...], seed: int, index: int, source: str,
                 decoder: Any) -> None:
        self.data, self.plan, self.seed, self.index = data, tuple(plan), seed, index
        self.source, self.decoder = source, decoder

    def __repr__(self) -> str:
        return f"EncodedImage({self.source}, {len(self.data)} bytes, plan={self.plan})"

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state):
            setattr(self, name, value)


class EncodedBatch:
    """A batch of :class:`EncodedImage`: ``data`` (every sample's bytes, one uint8 tensor),
    ``offsets`` (``(N + 1,)`` int64: sample i is ``data[offsets[i]:offsets[i + 1]]``),
    ``plans`` (``(N, 10)`` int64), ``seeds`` and ``indices`` (``(N,)`` int64), ``sources``
    (a list of str) and the ``decoder``. Pinned like a tensor by DataLoader's pinning thread
    (:meth:`pin_memory`); pickles its tensors through shared memory between processes."""

    __slots__ = ("data", "offsets", "plans", "seeds", "indices", "sources", "decoder")

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor, plans: torch.Tensor,
                 seeds: torch.Tensor, indices: torch.Tensor, sources: list[str],
                 decoder: Any) -> None:
        self.data, self.offsets, self.plans = data, offsets, plans
        self.seeds, self.indices, self.sources, self.decoder = seeds, indices, sources, decoder

    def __len__(self) -> int:
        return len(self.sources)

    def __repr__(self) -> str:
        return (f"EncodedBatch({len(self)} images, {int(self.offsets[-1])} bytes, "
                f"size={getattr(getattr(self.decoder, 'recipe', None), 'size', None)})")

    def bytes_of(self, i: int) -> np.ndarray:
        """Sample ``i``'s encoded bytes (a uint8 view of :attr:`data`)."""
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.data[start:end].numpy()

    def pin_memory(self, device: Any = None) -> EncodedBatch:
        return EncodedBatch(self.data.pin_memory(), self.offsets, self.plans, self.seeds,
                            self.indices, self.sources, self.decoder)

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state):
            setattr(self, name, value)


def collate_encoded(images: Sequence[EncodedImage],
                    empty: Any = None) -> EncodedBatch:
    """One :class:`EncodedBatch` of ``images`` (from one dataset: one decoder). ``empty(shape,
    dtype)`` allocates the bytes' tensor (fast_collate's memory: shared in a worker process);
    torch.empty without it."""
    decoder = images[0].decoder
    for image in images:
        if not isinstance(image, EncodedImage):
            raise TypeError(f"a batch mixes encoded images (decode='gpu') and "
                            f"{type(image).__name__} values; one dataset decodes one way")
        if image.decoder is not decoder and image.decoder != decoder:
            raise ValueError("a batch of encoded images from datasets with different recipes; "
                             "collate each dataset's samples in batches of their own")
    sizes = [len(image.data) for image in images]
    offsets = np.zeros(len(images) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    data = empty((total,), torch.uint8) if empty is not None else torch.empty(total,
                                                                              dtype=torch.uint8)
    buffer = data.numpy()
    for image, start, end in zip(images, offsets[:-1], offsets[1:]):
        buffer[start:end] = np.frombuffer(image.data, dtype=np.uint8) if not isinstance(
            image.data, np.ndarray) else image.data.reshape(-1).view(np.uint8)
    return EncodedBatch(
        data, torch.from_numpy(offsets),
        torch.tensor([image.plan for image in images], dtype=torch.int64),
        torch.tensor([image.seed for image in images], dtype=torch.int64),
        torch.tensor([image.index for image in images], dtype=torch.int64),
        [image.source for image in images], decoder)


def _default_collate(batch: Sequence[EncodedImage], *, collate_fn_map: Any = None) -> EncodedBatch:
    return collate_encoded(batch)


# A DataLoader without collate_fn (torch's default_collate) batches encoded images as
# fast_collate does, instead of failing on a type it does not know: the key is fastpipe's own
# type, so nothing else default_collate does changes.
try:
    from torch.utils.data._utils.collate import default_collate_fn_map
except ImportError:  # a torch without the map: fast_collate, as the docs say
    pass
else:
    default_collate_fn_map.setdefault(EncodedImage, _default_collate)
