"""The corrupt-sample policy of the loaders (``on_error="skip"``): what is skipped, how the skip
travels with its batch, and the epoch's record of it.

A sample whose dataset raises :class:`~fastpipe.data.CorruptImageError` (or its subclass
``ImageTooLargeError``) is left out of its batch; any other exception still raises. The fetch runs
wherever the loader fetches (a worker process, a worker thread, the loader's own thread), so the
skip cannot be a side effect there: :class:`SkippingDataset` returns a :class:`Skipped` marker in
the sample's place, and :class:`SkippingCollate` collates the rest into an :class:`Outcome`, the
batch and its skips together, which the loader unpacks where the training loop receives it
(:class:`SkipRecord`), so that the record, like the resume position, is the loop's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastpipe._compat import tree_map_only
from fastpipe.data.decode.budget import CorruptImageError

__all__ = [
    "ON_ERROR",
    "Outcome",
    "SkipRecord",
    "Skipped",
    "SkippingCollate",
    "SkippingDataset",
    "Unpacked",
    "check_on_error",
]

ON_ERROR = ("raise", "skip")

# How many skipped samples the end-of-epoch warning names before "... and N more".
_NAMED = 5


def check_on_error(value: Any) -> str:
    """``on_error`` as given, or ValueError naming the choices."""
    if value not in ON_ERROR:
        raise ValueError(
            f"on_error must be 'raise' (a corrupt sample stops the epoch with CorruptImageError, "
            f"the default) or 'skip' (it is left out of its batch, counted and reported at the "
            f"end of the epoch), got {value!r}"
        )
    return value


@dataclass(frozen=True)
class Skipped:
    """A sample left out: its dataset ``index``, what the dataset calls it (``sample``:
    ``dataset.describe(index)``, else ``dataset.path(index)``, else None) and the ``reason`` (the
    error's message)."""

    index: int
    sample: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "sample": self.sample, "reason": self.reason}

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> Skipped:
        return cls(int(entry["index"]), entry.get("sample"), str(entry["reason"]))


def _name_of(dataset: Any, index: int) -> str | None:
    for method in ("describe", "path"):
        name = getattr(dataset, method, None)
        if callable(name):
            try:
                return str(name(index))
            except Exception:  # noqa: BLE001 - a name is a courtesy; the skip is recorded anyway
                return None
    return None


class SkippingDataset:
    """A map-style dataset that returns a :class:`Skipped` marker in place of a sample whose
    read raises CorruptImageError. Other attributes are the wrapped dataset's (reading them;
    what a ``worker_init_fn`` sets, it sets on ``.dataset``)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        try:
            return self.dataset[index]
        except CorruptImageError as exc:
            return Skipped(int(index), _name_of(self.dataset, int(index)), str(exc))

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if callable(getitems):
            try:
                samples = getitems(list(indices))
                # A list is passed on as it is: a Rows list names the batch blocks its samples
                # were read into, which fast_collate then returns without a copy.
                return samples if isinstance(samples, list) else list(samples)
            except CorruptImageError:
                # The batched read does not say which sample failed: read them one by one (the
                # per-sample randomness is a function of (seed, epoch, index), so the good ones
                # come out the same).
                pass
        return [self[i] for i in indices]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not yet set (while unpickling)
            raise AttributeError(name)
        return getattr(self.dataset, name)


class Outcome:
    """A batch (None when every sample of it was skipped) and the samples skipped from it.

    Pinned by DataLoader's pinning thread through :meth:`pin_memory`, like a tensor."""

    __slots__ = ("batch", "skipped")

    def __init__(self, batch: Any, skipped: list[Skipped]) -> None:
        self.batch, self.skipped = batch, skipped

    def pin_memory(self, device: Any = None) -> Outcome:
        if self.batch is None:
            return self
        import torch

        from fastpipe.data.collate.arena import ArenaBatch

        if isinstance(self.batch, ArenaBatch):  # a worker's batch in its arena
            return Outcome(self.batch.pin_memory(device), self.skipped)
        pinned = tree_map_only(torch.Tensor, lambda t: t.pin_memory(), self.batch)
        return Outcome(pinned, self.skipped)


class SkippingCollate:
    """``collate_fn`` over the samples that are not :class:`Skipped`, as an :class:`Outcome`.
    ``batched``: whether the loader collates lists of samples (``batch_size`` given) or converts
    one sample at a time (``batch_size=None``)."""

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool) -> None:
        self.collate_fn, self.batched = collate_fn, batched

    def __call__(self, samples: Any) -> Outcome:
        if not self.batched:
            if isinstance(samples, Skipped):
                return Outcome(None, [samples])
            return Outcome(self.collate_fn(samples), [])
        kept = [s for s in samples if not isinstance(s, Skipped)]
        skipped = [s for s in samples if isinstance(s, Skipped)]
        if not skipped:
            return Outcome(self.collate_fn(samples), [])
        return Outcome(self.collate_fn(kept) if kept else None, skipped)


class SkipRecord:
    """The samples skipped in one epoch, as far as the training loop received its batches."""

    def __init__(self, entries: Sequence[Skipped] = ()) -> None:
        self.entries: list[Skipped] = list(entries)

    def received(self, outcome: Outcome) -> None:
        self.entries.extend(outcome.skipped)

    def state(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.entries]

    @classmethod
    def from_state(cls, state: Sequence[dict[str, Any]]) -> SkipRecord:
        return cls([Skipped.from_dict(entry) for entry in state])

    def report(self, owner: str) -> None:
        """Warns once, at the end of the epoch, when samples were skipped."""
        if not self.entries:
            return
        named = "; ".join(
            f"{s.sample or f'sample {s.index}'}: {s.reason}" for s in self.entries[:_NAMED])
        more = len(self.entries) - _NAMED
        warnings.warn(
            f"{owner}(on_error='skip') skipped {len(self.entries)} corrupt "
            f"sample{'s' if len(self.entries) != 1 else ''} this epoch ({named}"
            f"{f'; ... and {more} more' if more > 0 else ''}); the full list is "
            f"{owner}.skipped. Remove or replace the files, or repack without them",
            RuntimeWarning, stacklevel=3,
        )


class Unpacked:
    """An epoch's iterator of :class:`Outcome` as the training loop sees it: the batches, with
    each outcome's skips recorded as it is received, and a batch with nothing left passed over
    (``on_received`` is still called for it: the loop's position counts every batch of the
    sampler). ``on_end`` runs once when the epoch ends."""

    def __init__(self, outcomes: Iterator[Outcome], record: SkipRecord,
                 on_received: Callable[[], None], on_end: Callable[[], None]) -> None:
        self._outcomes, self._record = outcomes, record
        self._on_received, self._on_end = on_received, on_end
        self._ended = False

    def __iter__(self) -> Unpacked:
        return self

    def __next__(self) -> Any:
        while True:
            try:
                outcome = next(self._outcomes)
            except StopIteration:
                if not self._ended:
                    self._ended = True
                    self._on_end()
                raise
            self._record.received(outcome)
            self._on_received()
            if outcome.batch is not None:
                return outcome.batch

    def __getattr__(self, name: str) -> Any:
        if name in ("_outcomes", "_record", "_on_received", "_on_end", "_ended"):
            raise AttributeError(name)
        return getattr(self._outcomes, name)
