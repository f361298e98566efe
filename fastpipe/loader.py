"""DataLoaderX: a DataLoader whose iteration runs in a background thread."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from fastpipe._background import BackgroundIterator
from fastpipe._compat import shutdown_dataloader_workers


class DataLoaderX(DataLoader):
    """A :class:`torch.utils.data.DataLoader` that fetches batches in a background thread.

    Takes every DataLoader argument, plus ``max_prefetch``: how many finished batches the
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
    closes the previous one's thread first.
    """

    def __init__(self, *args: Any, max_prefetch: int = 2, **kwargs: Any) -> None:
        if not isinstance(max_prefetch, int) or isinstance(max_prefetch, bool) or max_prefetch < 1:
            raise ValueError(
                f"max_prefetch must be a positive int (batches kept ready ahead), got {max_prefetch!r}"
            )
        super().__init__(*args, **kwargs)
        self.max_prefetch = max_prefetch
        self._epoch: weakref.ref[BackgroundIterator] | None = None
        self._epoch_thread: threading.Thread | None = None

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
            max_prefetch=self.max_prefetch,
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


def _batches(base: Iterator[Any], shut_down_workers: bool) -> Iterator[Any]:
    try:
        yield from base
    finally:
        # Without this, workers live on until the base iterator is garbage collected; when an
        # exception's traceback puts it in a reference cycle, that is a gc pass later, and torch's
        # shutdown from inside gc waits out a 5 s timeout per worker.
        if shut_down_workers:
            shutdown_dataloader_workers(base)
