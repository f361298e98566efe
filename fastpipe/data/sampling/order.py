"""The shard-aware order: shards shuffled every epoch, samples shuffled within a window of them.

Data in shards (tar shards, Parquet files) that streams through a cache of limited size cannot be
read in a uniformly random order: every sample would need its own shard present, and a cache
smaller than the dataset would fetch each shard once per sample it holds. The windowed order
keeps the shards in use few:

1. the shards are put in a random order, new every epoch;
2. consecutive shards of that order form windows of ``window`` shards (the last one may hold
   fewer);
3. the samples of each window are put in a random order, and the windows follow one another.

While a window is read, only its ``window`` shards are needed (and the next window's, fetched
ahead), whatever the number of ranks and workers: rank ``r`` of ``world_size`` reads every
``world_size``-th sample of this one global order (``shard_order``), so all ranks read from the
same window at the same time.

What it costs in randomness: a sample's neighbours in the order come from the ``window`` shards
of its window rather than from the whole dataset, so a batch mixes ``window`` shards (a shard
written in class order gives batches of few classes when ``window`` is small), and two samples of
different windows keep the order of their windows. ``window`` at least the number of shards is a
uniformly random permutation of the whole epoch.

The order is a pure function of ``(seed, epoch)`` and the shard sizes: random keys are a
splitmix64 hash of ``(seed, epoch, item, stream)`` (the function of
:func:`fastpipe.data.sampling.seeds.sample_seed`, vectorized), sorted; no generator's history, no
library version, the same on every machine.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fastpipe import _validate as check

__all__ = ["ShardPlan", "check_window", "shard_plan", "shard_sizes_of", "shard_starts",
           "sizes_digest", "windowed_permutation"]

_MASK64 = np.uint64((1 << 64) - 1)
# Streams of the keys: one for the shards' order, one for the samples' order in a window.
_SHARDS, _SAMPLES = 0x5348, 0x5341


def _mix(x: np.ndarray, part: int | np.ndarray) -> np.ndarray:
    """One splitmix64 step of :func:`fastpipe.data.sampling.seeds.sample_seed`, on arrays."""
    with np.errstate(over="ignore"):
        x = (x ^ (np.asarray(part, np.uint64) & _MASK64)) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _keys(seed: int, epoch: int, count: int, stream: int) -> np.ndarray:
    """The random key of items ``0..count-1``: ``sample_seed(seed, epoch, item, stream)``."""
    x = _mix(np.zeros((), np.uint64), seed)
    x = _mix(x, epoch)
    x = _mix(np.broadcast_to(x, (count,)), np.arange(count, dtype=np.uint64))
    return _mix(x, stream) >> np.uint64(1)


def check_window(window: Any) -> int | None:
    """``window`` as None or an int >= 1 (shards per window)."""
    if window is None:
        return None
    return check.positive_int("window", window)


def shard_starts(sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    """The first index of each shard, and the total: ``[0, s0, s0 + s1, ...]``."""
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, np.int64))]).astype(np.int64)


# The last few orders computed (a sampler asks for its epoch's order more than once: its length,
# then its indices), keyed by the shard sizes, window, seed and epoch.
_RECENT: OrderedDict[tuple[bytes, int, int, int], np.ndarray] = OrderedDict()
_RECENT_LOCK = threading.Lock()


def windowed_permutation(sizes: Sequence[int] | np.ndarray, window: int, seed: int,
                         epoch: int) -> np.ndarray:
    """The indices of an epoch in the windowed order (module docstring), as a read-only int64
    array.

    ``sizes``: the samples of each shard; shard ``k`` holds the indices
    ``sum(sizes[:k]) .. sum(sizes[:k + 1]) - 1``."""
    sizes = np.asarray(sizes, np.int64)
    key = (hashlib.sha256(sizes.tobytes()).digest(), int(window), int(seed), int(epoch))
    with _RECENT_LOCK:
        if key in _RECENT:
            _RECENT.move_to_end(key)
            return _RECENT[key]
    order = _windowed(sizes, window, seed, epoch)
    order.flags.writeable = False
    with _RECENT_LOCK:
        _RECENT[key] = order
        while len(_RECENT) > 2:
            _RECENT.popitem(last=False)
    return order


def _windowed(sizes: np.ndarray, window: int, seed: int, epoch: int) -> np.ndarray:
    shards = len(sizes)
    count = int(sizes.sum())
    shard_rank = np.empty(shards, np.int64)
    shard_rank[np.argsort(_keys(seed, epoch, shards, _SHARDS), kind="stable")] = np.arange(shards)
    window_of_sample = np.repeat(shard_rank // window, sizes)
    return np.lexsort((_keys(seed, epoch, count, _SAMPLES), window_of_sample))


class ShardPlan(NamedTuple):
    """One pass over shards, as a cache is told it (:func:`shard_plan`): ``shards`` in the
    order they are first needed; ``released[j]``, the place in ``shards`` where ``shards[j]`` is
    no longer needed; ``needed_by[p]``, the position in the order (every rank's) by which the
    shards of places ``0..p`` have all been first needed."""

    shards: list[int]
    released: list[int]
    needed_by: np.ndarray

    def reached(self, read: int) -> int:
        """The last place whose shard is first needed within the order's first ``read``
        positions (-1: none): where a pass stands once those are read, in the places
        ``released`` names."""
        return int(np.searchsorted(self.needed_by, read - 1, side="right")) - 1


def shard_plan(indices: Sequence[int] | np.ndarray, starts: np.ndarray,
               together: Sequence[int] | np.ndarray | None = None,
               margin: int = 0) -> ShardPlan:
    """The shards holding ``indices``, in the order they are first needed (what a cache fetches
    ahead, in that order), and for each, where it is no longer needed: the place in that
    sequence of the first shard first needed more than ``margin`` places after its last sample,
    ``len(sequence)`` where none is. ``together``: the order ``indices`` is one rank's share of
    (every rank's, read in step), which says when a shard is first and last needed; default
    ``indices``. ``margin``: how far in that order a reader may start a batch while one before
    it is yet to be read (the batches workers hold, times the ranks); 0 where the place is
    taken from what every reader has read (:meth:`ShardPlan.reached`)."""
    indices = np.asarray(indices, np.int64)
    if not len(indices):
        return ShardPlan([], [], np.zeros(0, np.int64))
    shards = np.searchsorted(starts, indices, side="right") - 1
    _, first = np.unique(shards, return_index=True)
    sequence = shards[np.sort(first)]
    needed = shards if together is None else (
        np.searchsorted(starts, np.asarray(together, np.int64), side="right") - 1)
    ids, first = np.unique(needed, return_index=True)
    _, from_end = np.unique(needed[::-1], return_index=True)
    at = np.searchsorted(ids, sequence)
    first, last = first[at], (len(needed) - 1 - from_end)[at]
    # The first place whose shard is first needed after ``last``: where the running maximum of
    # the first needs passes it (they need not rise along one rank's sequence).
    needed_by = np.maximum.accumulate(first)
    released = np.searchsorted(needed_by, last + margin, side="right")
    return ShardPlan(sequence.tolist(), released.tolist(), needed_by)


def shard_sizes_of(dataset: Any) -> np.ndarray:
    """The samples per shard of a dataset of shards (its ``shard_sizes()``, or its source's),
    checked against its length; a TypeError naming the fix for one without shards."""
    for owner in (dataset, getattr(dataset, "source", None)):
        sizes = getattr(owner, "shard_sizes", None)
        if callable(sizes):
            array = np.asarray(sizes(), np.int64)
            if array.ndim != 1 or (array < 0).any() or int(array.sum()) != len(dataset):
                raise ValueError(f"{type(dataset).__name__}.shard_sizes() gave {array.tolist()[:8]}"
                                 f"..., which does not add up to its {len(dataset)} samples")
            return array
    raise TypeError(
        f"window= orders a dataset of shards (TarDataset, ParquetDataset, or any dataset with a "
        f"shard_sizes() method giving the samples of each shard in index order); "
        f"{type(dataset).__name__} has none: leave window=None for a uniform shuffle")


def sizes_digest(sizes: np.ndarray) -> str:
    """A short hash of the shard sizes, which a saved order must match."""
    return hashlib.sha256(np.asarray(sizes, "<i8").tobytes()).hexdigest()[:16]
