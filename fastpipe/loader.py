"""DataLoaderX: a DataLoader whose iteration runs in a background thread."""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from fastpipe._background import BackgroundIterator
from fastpipe._compat import shutdown_dataloader_workers


class DataLoaderX(DataLoader):
    """A :class:`torch.utils.data.DataLoader` that fetches batches in a background thread.

    Takes every DataLoader argument, plus ``prefetch_depth``: how many finished batches the
    background thread keeps ready ahead of the training loop. Yields exactly the batches the
    DataLoader would, in the same order; ``len()`` is unchanged.

    The thread takes each batch from the DataLoader (with ``num_workers=0`` it loads and collates
    it; with workers it receives it from them and from torch's pinning thread), so that work
    overlaps with the training step instead of stalling it. With ``num_workers=0`` the dataset
    runs in that thread: random transforms that draw from torch's global generator then
    interleave with the training step's draws, so pass ``generator=`` (or use workers) when runs
    must be reproducible. An exception raised while loading reaches the
    loop as the same exception at the same batch, and ends the epoch. The thread (and the worker
    processes, unless ``persistent_workers``) stop when the epoch ends, on ``break``, when the
    iterator is garbage collected, on :meth:`close` and at interpreter exit. Starting a new epoch
    closes the previous one's thread first. Ctrl-C interrupts the loop at once: the thread is
    told to stop and is not waited for.

    It pickles and deep-copies like a DataLoader, also after iteration or :meth:`close` (the
    running epoch is not part of the copy), so Lightning's ``ddp_spawn`` can send it to its
    processes. Lightning re-creates it with a ``DistributedSampler`` and keeps
    ``prefetch_depth``; ``accelerate``'s ``prepare()`` rebuilds it as its own loader without the
    thread, and warns (use ``DataPrefetcher(accelerator.prepare(loader))``, see
    docs/training-scripts.md).

    Compared with prefetch_generator 1.0.3's ``BackgroundGenerator``, which also forwards
    exceptions: its thread stays blocked in ``put()`` after an early ``break`` (holding the
    batches and the DataLoader's workers), and it has no ``close()``.
    """

    def __init__(self, *args: Any, prefetch_depth: int = 2, **kwargs: Any) -> None:
        if (
            not isinstance(prefetch_depth, int)
            or isinstance(prefetch_depth, bool)
            or prefetch_depth < 1
        ):
            raise ValueError(
                "prefetch_depth must be a positive int (batches kept ready ahead), "
                f"got {prefetch_depth!r}"
            )
        super().__init__(*args, **kwargs)
        self.prefetch_depth = prefetch_depth
        self._epoch: weakref.ref[BackgroundIterator] | None = None
        self._epoch_thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The running epoch (a weak reference, a thread) is not part of the loader's state; a
        # copy starts its own epochs, as a copied DataLoader does.
        state = dict(self.__dict__)
        state["_epoch"] = None
        state["_epoch_thread"] = None
        return state

    @property
    def drop_last(self) -> bool:  # type: ignore[override]
        """DataLoader's ``drop_last``; reading it is how accelerate's ``prepare()`` is noticed."""
        _warn_if_rebuilt_by_accelerate()
        return self.__dict__["drop_last"]

    @drop_last.setter
    def drop_last(self, value: bool) -> None:
        # Kept under its own name in __dict__: Lightning re-creates loaders from vars(loader).
        self.__dict__["drop_last"] = value

    def __iter__(self) -> Iterator[Any]:
        # With persistent_workers the DataLoader resets and reuses one worker iterator, so the
        # previous epoch's thread must have stopped, however long its last batch takes, before
        # that iterator is touched again.
        self.close()
        if self.persistent_workers and self._epoch_thread is not None:
            self._epoch_thread.join()
        # The base iterator (and with it any worker processes) is created here in the caller's
        # thread; only next() runs in the background.
        base = super().__iter__()
        epoch = BackgroundIterator(
            _batches(base, shut_down_workers=not self.persistent_workers),
            prefetch_depth=self.prefetch_depth,
            name="fastpipe-DataLoaderX",
        )
        del base
        self._epoch = weakref.ref(epoch)
        self._epoch_thread = epoch.thread
        return epoch

    def close(self) -> None:
        """Stops the background thread of the current epoch, if one is running."""
        epoch = self._epoch() if self._epoch is not None else None
        if epoch is not None:
            epoch.close()
        self._epoch = None

    def _fastpipe_describe(self) -> dict[str, Any]:
        """Tells ``fastpipe.profile`` what this is (it reads the DataLoader settings itself)."""
        return {"kind": "DataLoaderX"}


def _warn_if_rebuilt_by_accelerate() -> None:
    # accelerate's prepare_data_loader reads drop_last (and the other DataLoader arguments) to
    # build its own DataLoaderShard over a plain DataLoader; the thread cannot come along. Two
    # frames up is the reader of the attribute; only accelerate's module is matched.
    caller = sys._getframe(2)
    if caller.f_globals.get("__name__") == "accelerate.data_loader":
        warnings.warn(
            "accelerate's prepare() rebuilds DataLoaderX as its own DataLoaderShard over a plain "
            "DataLoader: the background thread and prefetch_depth are dropped. Prepare a plain "
            "DataLoader and wrap the result instead: "
            "DataPrefetcher(accelerator.prepare(loader), device=accelerator.device)",
            RuntimeWarning,
            stacklevel=3,
        )


def _batches(base: Iterator[Any], shut_down_workers: bool) -> Iterator[Any]:
    try:
        yield from base
    finally:
        # Without this, workers live on until the base iterator is garbage collected; when an
        # exception's traceback puts it in a reference cycle, that is a gc pass later, and torch's
        # shutdown from inside gc waits out a 5 s timeout per worker.
        if shut_down_workers:
            shutdown_dataloader_workers(base)
