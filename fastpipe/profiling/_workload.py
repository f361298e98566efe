"""Whether a dataset and a batch size make a workload worth running, with the numbers to change
when they do not: one rule for ``fastpipe bench``, ``tune``, ``profile`` and ``image_loader``.

A batch larger than the dataset makes every epoch one short batch (or none with ``drop_last``):
a loader then spends its time starting and stopping workers, which is what a measurement would
time, and a training loop would see batches of another size than it asked for. Under
:data:`MIN_BATCHES` batches an epoch, restarts still weigh on every measured rate.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

# Batches an epoch below which a measured rate is mostly the epoch's start and end.
MIN_BATCHES = 3


@dataclass(frozen=True)
class Spelling:
    """How the caller names the batch size and the amount of data (a command's options or a
    function's arguments), so that a message names what to change where the user types it."""

    where: str = ""  # the function's name, or "" where the command names itself
    batch: str = "batch_size"
    data: str | None = None  # the option that sets the number of samples, if there is one

    def says(self, text: str) -> str:
        return f"{self.where}: {text}" if self.where else text

    def set_batch(self, value: int) -> str:
        return f"{self.batch} {value}" if self.batch.startswith("--") else f"{self.batch}={value}"

    def more_data(self, samples: int) -> str:
        if self.data is None:
            return f"a dataset of at least {samples} samples"
        if self.data.startswith("--"):
            return f"{self.data} {samples}"
        return f"{self.data}={samples}"


def batches_per_epoch(samples: int, batch_size: int, drop_last: bool = False) -> int:
    full, rest = divmod(samples, batch_size)
    return full + (1 if rest and not drop_last else 0)


def suggested_batch_size(samples: int) -> int:
    """The largest power of two that gives :data:`MIN_BATCHES` full batches of ``samples``."""
    size = 1
    while size * 2 * MIN_BATCHES <= samples:
        size *= 2
    return size


def check_measurable(samples: int, batch_size: int, spelling: Spelling) -> str | None:
    """For a measurement: raises ValueError when ``batch_size`` is larger than ``samples``;
    returns a note when an epoch holds fewer than :data:`MIN_BATCHES` batches, else None."""
    if samples < 1:
        raise ValueError(spelling.says("the dataset is empty; nothing to measure"))
    smaller = suggested_batch_size(samples)
    if batch_size > samples:
        raise ValueError(spelling.says(
            f"{spelling.set_batch(batch_size)} is larger than the dataset's "
            f"{samples} samples: every epoch would be one short batch of {samples}, and the "
            "measurement would time workers starting and stopping. Pass "
            f"{spelling.set_batch(smaller)} ({batches_per_epoch(samples, smaller)} batches an "
            f"epoch), or {spelling.more_data(MIN_BATCHES * batch_size)}"))
    count = batches_per_epoch(samples, batch_size)
    if count >= MIN_BATCHES:
        return None
    return (f"{samples} samples make {count} batch{'es' if count != 1 else ''} of {batch_size} "
            "an epoch: the loader restarts every few batches and the rates include it; "
            f"{spelling.set_batch(smaller)} or {spelling.more_data(MIN_BATCHES * batch_size)} "
            "measures a steady stream")


def check_loader_batches(loader: Any, batch_size: int, drop_last: bool, world_size: int,
                         where: str) -> Any:
    """For a training loader: ``loader`` itself, with a warning when ``batch_size`` is larger
    than this rank's share of the dataset (every epoch one short batch); closed and refused
    when that leaves no batch at all (``drop_last``)."""
    try:
        samples = len(loader.dataset)
    except (AttributeError, TypeError):
        return loader
    share = -(-samples // world_size)
    if batch_size <= share:
        return loader
    of = f"the {samples} samples" if world_size == 1 else (
        f"this rank's {share} of the {samples} samples ({world_size} ranks)")
    if drop_last:
        close = getattr(loader, "close", None)
        if callable(close):
            close()
        raise ValueError(
            f"{where}: batch_size={batch_size} is larger than {of}, and drop_last=True leaves "
            f"no batch at all; pass batch_size={share} or less, or drop_last=False")
    warnings.warn(
        f"{where}: batch_size={batch_size} is larger than {of}: every epoch is one batch of "
        f"{share}, not {batch_size}; pass batch_size={suggested_batch_size(share)} (or at most "
        f"{share}), or use more data", RuntimeWarning, stacklevel=3)
    return loader
