"""What training frameworks see of DataPrefetcher: the loader it wraps, under Lightning,
accelerate and torchrun.

Lightning reads a loader's ``sampler`` (to call ``set_epoch``) and ``dataset``; accelerate's
prepared loaders keep their end-of-data state (for gradient accumulation and
``gather_for_metrics``) in the loader, set as they read ahead; and neither shards a loader that
sits inside a DataPrefetcher. The private accelerate calls go through ``fastpipe._compat``.
"""

from __future__ import annotations

import warnings
from typing import Any

from fastpipe._compat import accelerate_add_dataloader, accelerate_remove_dataloader

__all__ = ["AccelerateTracking", "LoaderAttributes", "accelerate_tracking", "check_sharded"]


class LoaderAttributes:
    """``len()``, ``dataset``, ``sampler``, ``batch_sampler``, ``batch_size``, ``drop_last``,
    ``num_workers``, ``skipped`` and ``set_epoch`` of ``self.loader``, for a wrapper that should
    read like the loader it wraps."""

    loader: Any

    def __len__(self) -> int:
        return len(self.loader)

    def _loader_attribute(self, name: str) -> Any:
        try:
            return getattr(self.loader, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__} has no {name!r}: the loader it wraps "
                f"({type(self.loader).__name__}) has none"
            ) from None

    @property
    def dataset(self) -> Any:
        """The wrapped loader's ``dataset``."""
        return self._loader_attribute("dataset")

    @property
    def sampler(self) -> Any:
        """The wrapped loader's ``sampler`` (Lightning calls ``set_epoch`` on it)."""
        return self._loader_attribute("sampler")

    @property
    def batch_sampler(self) -> Any:
        """The wrapped loader's ``batch_sampler``."""
        return self._loader_attribute("batch_sampler")

    @property
    def batch_size(self) -> int | None:
        """The wrapped loader's ``batch_size``."""
        return self._loader_attribute("batch_size")

    @property
    def drop_last(self) -> bool:
        """The wrapped loader's ``drop_last``."""
        return self._loader_attribute("drop_last")

    @property
    def num_workers(self) -> int:
        """The wrapped loader's ``num_workers``."""
        return self._loader_attribute("num_workers")

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The samples the wrapped loader skipped in its last epoch (``on_error="skip"``)."""
        return self._loader_attribute("skipped")

    def set_epoch(self, epoch: int) -> None:
        """Passes ``epoch`` to the loader's ``set_epoch``, or else to its samplers' and
        dataset's."""
        set_epoch = getattr(self.loader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return
        batch_sampler = getattr(self.loader, "batch_sampler", None)
        targets = (
            getattr(self.loader, "sampler", None),
            batch_sampler,
            getattr(batch_sampler, "sampler", None),
            getattr(self.loader, "dataset", None),
        )
        seen: set[int] = set()
        for target in targets:
            method = getattr(target, "set_epoch", None)
            if target is not None and callable(method) and id(target) not in seen:
                seen.add(id(target))
                method(epoch)


def check_sharded(loader: Any) -> None:
    """Refuses an unsharded shuffled loader in a distributed run: every rank would train on the
    whole dataset, silently."""
    import torch.distributed as dist
    from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    dataset = getattr(loader, "dataset", None)
    if dataset is None or isinstance(dataset, IterableDataset):
        return
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", sampler)
    for candidate in (sampler, batch_sampler, inner):
        for name in ("num_replicas", "world_size", "num_processes"):
            value = getattr(candidate, name, None)
            if isinstance(value, int) and value > 1:
                return
    if not isinstance(inner, (RandomSampler, SequentialSampler)):  # fastpipe's are subclasses
        return  # a sampler of the user's own: trust it
    world = dist.get_world_size()
    what = (
        f"DataPrefetcher wraps a {type(loader).__name__} whose sampler, a "
        f"{type(inner).__name__}, is not sharded, in a distributed run of {world} processes: "
        "every process would "
        "iterate the whole dataset. Lightning and accelerate shard only the DataLoaders they are "
        "given directly, not one inside a DataPrefetcher. Fix: with Lightning, return the "
        "DataLoader(X) itself from *_dataloader() and move/normalize the batch in "
        "on_after_batch_transfer (fastpipe.ops.normalize), or shard it yourself with "
        "sampler=DistributedSampler(dataset) (Lightning then calls set_epoch through "
        "DataPrefetcher.sampler); with accelerate, wrap the prepared loader: "
        "DataPrefetcher(accelerator.prepare(loader)); with torchrun, pass "
        "sampler=DistributedSampler(dataset) and call prefetcher.set_epoch(epoch) every epoch"
    )
    if isinstance(inner, RandomSampler):
        raise RuntimeError(what)
    warnings.warn(what + " (if every process should see every sample, ignore this warning)",
                  UserWarning, stacklevel=3)


class AccelerateTracking:
    """Makes accelerate's end-of-data state describe the batch being handed over, not the one
    read ahead.

    accelerate's loader reads one batch ahead itself and sets ``end_of_dataloader`` when that
    read finds the end, then leaves the gradient state when it is exhausted; reading further
    ahead (``prefetch_depth`` batches) would move both earlier. So each hand-over sets the flag,
    registering the loader with the gradient state again if it already left; :meth:`close`
    takes it out again at the end of the epoch.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._registered = False

    def hand_over(self, last: bool) -> None:
        """The batch handed over now is the epoch's last (``last``) or not."""
        state = self.loader.gradient_state
        if not any(ref is self.loader for ref in state.dataloader_references):
            accelerate_add_dataloader(self.loader)
            self._registered = True
        self.loader.end_of_dataloader = last

    def close(self) -> None:
        if self._registered:
            accelerate_remove_dataloader(self.loader)


def accelerate_tracking(loader: Any) -> AccelerateTracking | None:
    """An :class:`AccelerateTracking` when ``loader`` is one of accelerate's prepared loaders
    (they have ``end_of_dataloader`` and ``gradient_state``), else None."""
    if hasattr(loader, "end_of_dataloader") and hasattr(loader, "gradient_state"):
        return AccelerateTracking(loader)
    return None
