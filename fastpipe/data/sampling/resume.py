"""The resume kit every resumable loader shares: the state's version, the dataset check, and the
count of batches handed to the training loop.

A loader's ``state_dict()`` is ``{"version": STATE_VERSION, "dataset": dataset_fingerprint(...),
...}`` plus what that loader needs to find its place again; ``load_state_dict()`` calls
:func:`check_loader_state` first, so a state from another release or another dataset is refused
with the same words by every loader. The place saved is the training loop's, not the reader's:
loaders read ahead (a background queue, worker processes, a CUDA side stream), and the batches
read ahead but not yet received must come again after a restore. :class:`HandOff` counts what the
loop received.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from fastpipe._background import deferred_interrupt

__all__ = [
    "STATE_VERSION",
    "HandOff",
    "augmentation_state",
    "restore_augmentation",
    "StatesAhead",
    "WrappedHandOff",
    "check_loader_state",
    "dataset_fingerprint",
]

# The layout of the states fastpipe's loaders and samplers save; a state of another version is
# refused rather than misread.
STATE_VERSION = 1


def dataset_fingerprint(dataset: Any) -> dict[str, Any]:
    """What a state records of its dataset: ``{"length": len(dataset), "fingerprint": ...}``,
    the fingerprint being ``str(dataset.fingerprint())`` when the dataset has that method (a
    hash of its file list, say), else None."""
    fingerprint = getattr(dataset, "fingerprint", None)
    return {
        "length": len(dataset),
        "fingerprint": str(fingerprint()) if callable(fingerprint) else None,
    }


def augmentation_state(dataset: Any) -> dict[str, Any] | None:
    """The seed of a dataset's per-sample randomness (fastpipe's datasets: crops, flips,
    auto_augment are functions of ``(seed, epoch, index)``), which a state saves so that a
    restart replays the same crops even when the seed was drawn (``seed=None``)."""
    seed = getattr(dataset, "seed", None)
    if not hasattr(dataset, "_seed_drawn") or not isinstance(seed, int):
        return None
    return {"seed": seed}


def restore_augmentation(dataset: Any, saved: dict[str, Any] | None,
                         owner: str) -> Callable[[], None]:
    """Checks a saved augmentation seed against a dataset, changing nothing, and returns what
    applies it: a dataset whose seed was drawn takes the saved one; a seed the user chose that
    differs from it is refused (the replayed batches would not be the ones the run saw)."""
    if saved is None or augmentation_state(dataset) is None:
        return lambda: None
    seed = int(saved["seed"])
    if dataset.seed != seed and not dataset._seed_drawn:
        raise ValueError(
            f"{owner}.load_state_dict(): the state was saved with the dataset's seed {seed}, "
            f"this dataset was built with seed={dataset.seed}; build it with seed={seed} or "
            "seed=None (which takes the saved one)")

    def apply() -> None:
        dataset.seed = seed

    return apply


def check_loader_state(
    state: Any, dataset: Any, owner: str, *, entries: tuple[str, ...] = ()
) -> None:
    """Raises TypeError or ValueError, naming ``owner`` (the loader's class), unless ``state`` is
    a dict of :data:`STATE_VERSION` whose ``dataset`` entry is this dataset's
    :func:`dataset_fingerprint`, and which holds the loader's own ``entries``."""
    if not isinstance(state, dict) or any(key not in state for key in ("dataset", *entries)):
        keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise TypeError(
            f"{owner}.load_state_dict() takes a dict from {owner}.state_dict(), got {keys}"
        )
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"this {owner} state has version {state.get('version')!r}; this fastpipe reads "
            f"version {STATE_VERSION} (a state from another fastpipe release cannot be resumed)"
        )
    saved, here = state["dataset"], dataset_fingerprint(dataset)
    if saved != here:
        raise ValueError(
            f"this {owner} state was saved for another dataset: saved {saved}, this dataset "
            f"{here}; a state only resumes the dataset it was taken from"
        )


class HandOff:
    """What one epoch handed to the training loop: ``batches`` received, and ``end_seen``, whether
    the loop saw the epoch end.

    ``counted(epoch)`` wraps the epoch's iterator (whatever reads ahead sits inside it) and calls
    :meth:`handed` for each batch it returns and :meth:`ended` when it raises StopIteration.
    A loader that keeps more per batch extends those two.
    """

    def __init__(self) -> None:
        self.batches = 0
        self.end_seen = False

    def counted(self, epoch: Iterator[Any]) -> Iterator[Any]:
        """``epoch``, reporting to this object what the training loop receives from it."""
        return _Counted(epoch, self)

    def handed(self) -> None:
        """The loop received the next batch."""
        self.batches += 1

    def ended(self) -> None:
        """The loop saw the end of the epoch."""
        self.end_seen = True


class _Counted:
    """The epoch's iterator, telling a :class:`HandOff` what the training loop receives; other
    attributes (``close``, ``thread``) are the wrapped iterator's."""

    def __init__(self, epoch: Iterator[Any], hand_off: HandOff) -> None:
        self._batches, self._hand_off = epoch, hand_off

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._batches)
        except StopIteration:
            self._hand_off.ended()
            raise
        self._hand_off.handed()
        return batch

    def __getattr__(self, name: str) -> Any:
        if name in ("_batches", "_hand_off"):
            raise AttributeError(name)
        return getattr(self._batches, name)


class StatesAhead:
    """One stateful object's state after each batch read ahead, and the state as of the last batch
    the training loop received (``current``).

    For a loader that reads ahead of the loop from something with its own state (the loader it
    wraps; a batch transform with its own random draws): :meth:`take` runs where the batches are
    read, right after the object moved on by one batch (a background thread may call it), and
    :meth:`handed` runs when the loop receives the oldest batch read, making that batch's state
    current.
    """

    def __init__(self, state_dict: Callable[[], Any]) -> None:
        self._state_dict = state_dict
        self.current = state_dict()
        self._ahead: deque[Any] = deque()  # appended and popped from two threads: deque is safe

    def take(self) -> None:
        """Records the object's state after the batch just read."""
        self._ahead.append(self._state_dict())

    def handed(self) -> None:
        """The loop received the oldest batch read: its state becomes current."""
        if self._ahead:
            self.current = self._ahead.popleft()

    def caught_up(self) -> None:
        """The loop saw the end: with nothing read ahead, the object's state now is the loop's
        (a loader's state moves when its iterator finds the end, after its last batch)."""
        if not self._ahead:
            self.current = self._state_dict()


class WrappedHandOff(HandOff):
    """One epoch of a wrapper that reads ahead of a loader (DataPrefetcher): the wrapped
    loader's state, and a stateful batch transform's, as of each batch the loop receives.

    The wrapper takes its batches from :meth:`read` (in a background thread, if it likes), which
    records the loader's state after each, and calls :meth:`transformed` right after the
    transform ran on a batch. :meth:`loader_state` is None when the loader has no
    ``state_dict()`` that answers; :meth:`transform_state` when the transform has none.
    """

    def __init__(self, loader: Any, transform: Any) -> None:
        super().__init__()
        self._loader = loader
        self._loader_states: StatesAhead | None = None
        if callable(getattr(loader, "state_dict", None)):
            try:
                self._loader_states = StatesAhead(loader.state_dict)
            except Exception:  # noqa: BLE001 - a loader whose state_dict() cannot answer
                # (accelerate's DataLoaderShard has the method but raises without a stateful
                # DataLoader inside): the prefetcher's state_dict() asks it again and raises
                # there, where it was asked.
                pass
        # A batch_transform with randomness of its own (Mixup): its state after each batch.
        self._transform_states = (
            StatesAhead(transform.state_dict)
            if callable(getattr(transform, "state_dict", None)) else None
        )

    def read(self) -> Iterator[Any]:
        # iter() runs here, in the caller's thread, not at the first next() of a generator, which
        # may be a background thread's: a DataLoader's iter() forks its worker processes, and a
        # fork from one thread inherits the locks the others hold at that moment (logging's).
        # Ctrl-C is held back while the workers start (see deferred_interrupt), then raised.
        with deferred_interrupt():
            batches = iter(self._loader)
        return self._read(batches)

    def _read(self, batches: Iterator[Any]) -> Iterator[Any]:
        try:
            for batch in batches:
                if self._loader_states is not None:
                    self._loader_states.take()
                yield batch
        finally:
            # Closed with the epoch, so the loader's own thread (DataLoaderX) stops with it.
            close = getattr(batches, "close", None)
            if callable(close):
                close()

    def transformed(self) -> None:
        if self._transform_states is not None:
            self._transform_states.take()

    def handed(self) -> None:
        super().handed()
        for states in (self._loader_states, self._transform_states):
            if states is not None:
                states.handed()

    def ended(self) -> None:
        super().ended()
        if self._loader_states is not None:
            self._loader_states.caught_up()

    def loader_state(self) -> Any:
        return None if self._loader_states is None else self._loader_states.current

    def transform_state(self) -> Any:
        return None if self._transform_states is None else self._transform_states.current
