"""DataLoaderX: a DataLoader whose iteration runs in a background thread."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from fastpipe import _validate as check
from fastpipe._background import BackgroundIterator, deferred_interrupt
from fastpipe._compat import quiet_lost_descriptor_transfers, shutdown_dataloader_workers
from fastpipe._seed import order_seed
from fastpipe._threads import ThreadEpoch, thread_batches
from fastpipe.data.collate import arena
from fastpipe.data.collate.batch import fast_collate
from fastpipe.data.sampling.resume import (
    STATE_VERSION,
    HandOff,
    augmentation_state,
    check_loader_state,
    dataset_fingerprint,
    restore_augmentation,
)
from fastpipe.data.sampling.sampler import RandomSampler, SequentialSampler, _ResumableSampler
from fastpipe.data.sampling.skip import (
    Outcome,
    SkippingCollate,
    SkippingDataset,
    SkipRecord,
    Unpacked,
    check_on_error,
)

_DATALOADER_SIGNATURE = inspect.signature(DataLoader.__init__)


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

    ``worker_method="thread"`` runs the ``num_workers`` workers as threads of this process
    instead of DataLoader's worker processes: each loads and collates whole batches, in sampler
    order, with no shared-memory hand-over, no pickling of batches and no worker start-up. It
    pays off for datasets whose per-sample work releases the GIL, as fastpipe's JPEG decode and
    resize do (measured in docs/benchmarks.md); Python-heavy transforms are better in processes.
    It needs a map-style dataset and ``batch_size``; ``worker_init_fn`` is refused (there are no
    worker processes), and the threads are started per epoch (``persistent_workers`` changes
    nothing). The threads are what runs ahead of the loop, with no background thread between
    them and it: each batch goes from the thread that loaded it to the loop, ``prefetch_depth``
    more batches in flight.

    Without ``sampler=`` / ``batch_sampler=`` (map-style datasets), the sampler is one of
    fastpipe's resumable samplers: ``shuffle=True`` gives ``fastpipe.data.RandomSampler`` seeded
    with the keyword ``seed: int | None`` (None: one draw from ``generator=``, else from torch's
    global generator, when the loader is built; 0 in a multi-process ``torch.distributed`` run,
    as ``DistributedSampler``'s default, so that all ranks agree; and the keyword
    ``window: int | None``, its shard-aware order, docs/object-storage.md), otherwise
    ``SequentialSampler``; so
    :meth:`state_dict` / :meth:`load_state_dict` can resume mid-epoch (docs/resume.md).

    ``on_error``: what a sample whose read raises ``fastpipe.data.CorruptImageError`` (or its
    subclass ``ImageTooLargeError``) does to the epoch. ``"raise"`` (the default): the error
    reaches the loop, as above. ``"skip"`` (map-style datasets): the sample is left out and its
    batch collated from the rest (a partial batch; a batch with nothing left is passed over, so
    an epoch may yield fewer than ``len()`` batches); at the end of the epoch one RuntimeWarning
    gives the count and names the first few, and :attr:`skipped` lists them all. Any other
    exception still raises. The record is the training loop's, like the resume position: its
    :meth:`state_dict` carries the skips of the batches received so far, so a resumed epoch
    reports the whole epoch's list (docs/loading.md).
    """

    def __init__(
        self, *args: Any, prefetch_depth: int = 2, worker_method: str = "process",
        on_error: str = "raise", **kwargs: Any
    ) -> None:
        prefetch_depth = check.positive_int("prefetch_depth", prefetch_depth)
        on_error = check_on_error(on_error)
        if worker_method not in ("process", "thread"):
            raise ValueError(
                f"worker_method must be 'process' (DataLoader's worker processes) or 'thread' "
                f"(threads of this process), got {worker_method!r}"
            )
        args, kwargs = _with_stateful_sampler(args, kwargs)
        super().__init__(*args, **kwargs)
        self.prefetch_depth = prefetch_depth
        self.worker_method = worker_method
        self.on_error = on_error
        if worker_method == "thread" and self.num_workers > 0:
            _check_thread_workers(self)
        if on_error == "skip" and isinstance(self.dataset, IterableDataset):
            raise ValueError(
                "on_error='skip' needs a map-style dataset (a corrupt sample is left out of the "
                "batch of indices it belongs to); an IterableDataset should skip its own bad "
                "samples, or use on_error='raise'"
            )
        self._skips = SkipRecord()
        self._restored_skips: SkipRecord | None = None
        self._epoch: weakref.ref[BackgroundIterator | ThreadEpoch] | None = None
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
        self._close_epoch(wait=True)
        self._position = self._begin_position()
        # Counted even when the position cannot be saved, so that every epoch's iterator is alike.
        hand_off = self._position if self._position is not None else HandOff()
        self._tell_reading_ahead(hand_off)
        skipping = self.on_error == "skip"
        # A restored state's skips belong to the epoch it resumes; a fresh epoch starts empty.
        self._skips = self._restored_skips or SkipRecord()
        self._restored_skips = None
        # The base iterator (and with it any worker processes) is created here in the caller's
        # thread; only next() runs in the background.
        stop = threading.Event()  # set when the epoch's iterator is closed
        if self.worker_method == "thread" and self.num_workers > 0:
            collate_fn, pin = _thread_collate(self.collate_fn, self.pin_memory)
            dataset = self.dataset
            if skipping:
                dataset, collate_fn = SkippingDataset(dataset), SkippingCollate(collate_fn, True)
            # The threads are what runs ahead of the loop: the loop takes each batch from the
            # thread that loaded it (ThreadEpoch), prefetch_depth more of them in flight.
            epoch: ThreadEpoch | BackgroundIterator = ThreadEpoch(thread_batches(
                dataset, self.batch_sampler, collate_fn, self.num_workers,
                in_flight=self.num_workers * (self.prefetch_factor or 2) + self.prefetch_depth,
                pin_memory=pin, name="fastpipe-DataLoaderX-worker", stop=stop,
            ), stop)
        else:
            # Ctrl-C is held back while the workers start (see deferred_interrupt), then raised.
            with (deferred_interrupt(), self._worker_start(), self._arena_fetch(),
                  self._skipping_fetch(skipping)):
                base = super().__iter__()
            epoch = BackgroundIterator(
                _batches(base, shut_down_workers=not self.persistent_workers,
                         arenas=self.num_workers > 0),
                prefetch_depth=self.prefetch_depth,
                name="fastpipe-DataLoaderX",
                stop=stop,
            )
            del base
        self._epoch = weakref.ref(epoch)
        self._epoch_thread = epoch.thread
        if not skipping:
            return hand_off.counted(epoch)
        record = self._skips

        def end() -> None:
            hand_off.ended()
            record.report("DataLoaderX")

        return Unpacked(epoch, record, hand_off.handed, end)

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """With ``on_error="skip"``: the samples skipped in the current (or, once it ended, the
        last) epoch, as far as the training loop received its batches: ``{"index", "sample",
        "reason"}`` dicts, ``sample`` being what the dataset calls it (``describe(index)``, else
        ``path(index)``, else None). Empty with ``on_error="raise"``."""
        return self._skips.state()

    @contextlib.contextmanager
    def _skipping_fetch(self, skipping: bool) -> Iterator[None]:
        """DataLoader's iterator reads ``dataset`` and ``collate_fn`` once, when it is built,
        and hands them to its fetcher (in each worker process, or in this process): while it is
        built they are the skipping ones, and the loader's own are restored right after."""
        if not skipping:
            yield
            return
        own = self.__dict__["dataset"], self.__dict__["collate_fn"]
        self.__dict__["dataset"] = SkippingDataset(own[0])
        self.__dict__["collate_fn"] = SkippingCollate(own[1], self._auto_collation)
        try:
            yield
        finally:
            self.__dict__["dataset"], self.__dict__["collate_fn"] = own

    @contextlib.contextmanager
    def _worker_start(self) -> Iterator[None]:
        """While DataLoader's iterator is built (and its worker processes with it): each worker
        first keeps quiet the descriptor transfers a main process ended by Ctrl-C leaves
        unfinished (:func:`fastpipe._compat.quiet_lost_descriptor_transfers`), then runs the
        user's ``worker_init_fn``."""
        if self.num_workers == 0 or (self.persistent_workers
                                     and getattr(self, "_iterator", None) is not None):
            yield
            return
        own = self.__dict__["worker_init_fn"]
        self.__dict__["worker_init_fn"] = _WorkerStart(own)
        try:
            yield
        finally:
            self.__dict__["worker_init_fn"] = own

    @contextlib.contextmanager
    def _arena_fetch(self) -> Iterator[None]:
        """While DataLoader's iterator is built (and its worker processes with it): an arena per
        worker (fastpipe.data.collate.arena), which each worker attaches to when it starts and
        its batches cross through. Persistent workers keep theirs."""
        if (self.num_workers == 0 or not arena.available()
                or (self.persistent_workers and getattr(self, "_iterator", None) is not None)):
            yield
            return
        try:
            arenas = arena.ArenaSet(self.num_workers)
        except OSError:  # no memfd here (a sandbox's filter, the descriptor limit): as before
            yield
            return
        own = self.__dict__["collate_fn"], self.__dict__["worker_init_fn"]
        self.__dict__["collate_fn"] = arena.ArenaCollate(own[0])
        self.__dict__["worker_init_fn"] = arena.ArenaWorkerInit(arenas, own[1])
        try:
            yield
        finally:
            self.__dict__["collate_fn"], self.__dict__["worker_init_fn"] = own

    def close(self) -> None:
        """Stops the background thread of the current epoch, if one is running. (Persistent
        worker processes live until the loader is garbage collected, as DataLoader's do.)"""
        self._close_epoch()

    def _close_epoch(self, wait: bool = False) -> None:
        epoch = self._epoch() if self._epoch is not None else None
        if epoch is not None:
            epoch.close()
        self._epoch = None
        # With persistent_workers the DataLoader resets and reuses one worker iterator, so the
        # epoch's thread must have stopped, however long its last batch takes, before that
        # iterator is touched again.
        if wait and self.persistent_workers and self._epoch_thread is not None:
            self._epoch_thread.join()

    def _fastpipe_describe(self) -> dict[str, Any]:
        """Tells ``fastpipe.profile`` what this is (it reads the DataLoader settings itself)."""
        return {"kind": "DataLoaderX", "worker_method": self.worker_method,
                "prefetch_depth": self.prefetch_depth}

    # Resume: the position is counted where the training loop receives batches, so the batches
    # waiting in the background queue or in the workers come again after a restore.

    _position: _Position | None = None

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the state after the last batch the training loop received.

        A plain dict (``torch.save``-able, and a ``torch.distributed.checkpoint`` ``Stateful``):
        ``version``, ``dataset`` (its length and ``fingerprint()``, if it has one) and
        ``sampler`` (its epoch, position, seed, and for DDP its rank and world size), and for
        fastpipe's datasets ``augmentation`` (the seed of their crops, drawn or given). Loaded into
        a fresh loader built the same way, the next ``iter()`` yields the batch after that one.
        Taken after an epoch's last batch, the next ``iter()`` ends that epoch without batches if
        the loop had not yet seen its end, and is the next epoch if it had (torchdata's rule).
        Needs one of fastpipe's samplers, which DataLoaderX builds itself unless ``sampler=`` or
        ``batch_sampler=`` is given (see docs/resume.md).
        """
        sampler, batch_size = self._resumable_sampler("state_dict")
        position = self._position
        if position is None:
            sampler_state = sampler._next_iteration_state()
        else:
            sampler_state = position.state(batch_size)
        state = {
            "version": STATE_VERSION,
            "dataset": self._dataset_fingerprint(),
            "sampler": sampler_state,
        }
        augmentation = augmentation_state(self.dataset)
        if augmentation is not None:
            state["augmentation"] = augmentation
        if self.on_error == "skip":
            state["skipped"] = self._skipped_state(position)
        return state

    def _skipped_state(self, position: _Position | None) -> list[dict[str, Any]]:
        """The skips of the epoch the state resumes: none once the loop saw its end (the state
        is the next epoch's), a restored record before the first iter()."""
        if position is None:
            return self._restored_skips.state() if self._restored_skips is not None else []
        return [] if position.end_seen else self._skips.state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict`; the next ``iter()`` continues from it.

        Raises ValueError, changing nothing, for a state of another version, another dataset
        (length or fingerprint) or another sampler setting. A state whose augmentation seed the
        dataset takes ends persistent worker processes already running (they hold the dataset as
        it was), and with them an epoch still being iterated (its iterator stops at its next
        batch): the next ``iter()`` starts them again.
        """
        sampler, _ = self._resumable_sampler("load_state_dict")
        check_loader_state(state, self.dataset, "DataLoaderX", entries=("sampler",))
        apply_seed = restore_augmentation(self.dataset, state.get("augmentation"), "DataLoaderX")
        skipped = state.get("skipped") or []
        if not isinstance(skipped, list):
            raise TypeError(f"DataLoaderX.load_state_dict(): 'skipped' must be a list of dicts "
                            f"from state_dict(), got {type(skipped).__name__}")
        restored = SkipRecord.from_state(skipped)
        sampler.load_state_dict(state["sampler"])
        seed = getattr(self.dataset, "seed", None)
        apply_seed()
        if getattr(self.dataset, "seed", None) != seed:
            self._end_persistent_workers()
        self._position = None
        self._restored_skips = restored

    def _end_persistent_workers(self) -> None:
        """Persistent worker processes hold the copy of the dataset made when they started: after
        the dataset changed here, the next ``iter()`` must start them again."""
        iterator = getattr(self, "_iterator", None)
        if iterator is None:
            return
        self._close_epoch(wait=True)
        shutdown_dataloader_workers(iterator)
        self._iterator = None

    def _dataset_fingerprint(self) -> dict[str, Any]:
        # Once per dataset: a fingerprint may hash every path, and DataPrefetcher asks per batch.
        cached = getattr(self, "_fingerprint_of", None)
        if cached is None or cached[0] is not self.dataset:
            cached = (self.dataset, dataset_fingerprint(self.dataset))
            self._fingerprint_of = cached
        return dict(cached[1])

    def _begin_position(self) -> _Position | None:
        try:
            sampler, _ = self._resumable_sampler("iter")
        except TypeError:
            return None
        return _Position(sampler._next_iteration_state(), sampler._iteration_length())

    def _tell_reading_ahead(self, hand_off: HandOff) -> None:
        """Tells a fastpipe sampler, for the iteration about to start, how far ahead of a batch
        not yet read its loader may be reading another: every batch it reads ahead of the
        training loop (a thread or worker process may wait on one while the others read on),
        and a step more (a rank may run ahead of another); and how many of its indices the loop
        has received (``hand_off``'s batches), so that a cache takes a shard for done with only
        once every batch that needs it is read (fastpipe.data.sampling.order.shard_plan). Not
        told behind a batch sampler that may hold indices back (any but torch's BatchSampler),
        nor with ``in_order=False``."""
        batches = self.batch_sampler if self._auto_collation else None
        sampler = self.sampler if batches is None else getattr(batches, "sampler", None)
        if not isinstance(sampler, _ResumableSampler):
            return
        if (batches is not None and type(batches) is not BatchSampler) or not getattr(
                self, "in_order", True):
            return
        size = batches.batch_size if batches is not None else 1
        if not self.num_workers:
            ahead = self.prefetch_depth + 1  # the background thread's queue and its hand
        elif self.worker_method == "thread":
            ahead = self.num_workers * (self.prefetch_factor or 2) + self.prefetch_depth
        else:  # the workers' batches, the background thread's queue and its hand
            ahead = self.num_workers * (self.prefetch_factor or 2) + self.prefetch_depth + 1
        sampler.reading_ahead = size * (ahead + 1)
        sampler.loop_received = lambda: hand_off.batches * size

    def _resumable_sampler(self, method: str) -> tuple[Any, int]:
        """The fastpipe sampler behind this loader, and how many of its indices make a batch."""
        if self._auto_collation:
            batches = self.batch_sampler
            if type(batches) is not BatchSampler:
                raise TypeError(
                    f"DataLoaderX.{method}() cannot know the position of a custom batch_sampler "
                    f"({type(batches).__name__}); pass batch_size= and sampler= instead"
                )
            sampler, batch_size = batches.sampler, batches.batch_size
        else:
            sampler, batch_size = self.sampler, 1
        if isinstance(self.dataset, IterableDataset):
            raise TypeError(
                f"DataLoaderX.{method}() needs a map-style dataset; an IterableDataset has no "
                "sampler whose position could be saved"
            )
        if not isinstance(sampler, _ResumableSampler):
            raise TypeError(
                f"DataLoaderX.{method}() cannot save or restore the position of a "
                f"{type(sampler).__module__}.{type(sampler).__name__}; leave sampler= unset (with "
                "shuffle=True/False DataLoaderX builds a resumable one) or pass "
                "fastpipe.data.RandomSampler, SequentialSampler or DistributedSampler"
            )
        return sampler, batch_size


class _WorkerStart:
    """The worker_init_fn DataLoaderX gives a DataLoader (see ``_worker_start``)."""

    def __init__(self, user: Any) -> None:
        self.user = user

    def __call__(self, worker_id: int) -> None:
        quiet_lost_descriptor_transfers()
        if self.user is not None:
            self.user(worker_id)


def _check_thread_workers(loader: DataLoaderX) -> None:
    """Refuses what thread workers cannot do as DataLoader's processes would."""
    if isinstance(loader.dataset, IterableDataset):
        raise ValueError(
            "worker_method='thread' needs a map-style dataset (each thread loads whole batches "
            "of indices); an IterableDataset needs worker_method='process'"
        )
    if not loader._auto_collation:
        raise ValueError("worker_method='thread' loads whole batches: pass batch_size= (not None)")
    if loader.worker_init_fn is not None:
        raise ValueError(
            "worker_init_fn runs in worker processes; with worker_method='thread' there are none "
            "(set up the dataset before building the loader, or use worker_method='process')"
        )


def _thread_collate(collate_fn: Any, pin_memory: bool) -> tuple[Any, bool]:
    """The collate function thread workers call, and whether they pin its batches after it.

    fast_collate writes the batch straight into pinned memory itself: pinning afterwards would
    allocate a second batch and copy it (37 MiB for 256x3x224x224 uint8). Without CUDA nothing
    is pinned, as DataLoader's workers do (it warned when it was built)."""
    if not pin_memory:
        return collate_fn, False
    if not torch.cuda.is_available():
        warnings.warn(
            "DataLoaderX(pin_memory=True) but no CUDA device is available: the thread workers' "
            "batches stay in ordinary memory (as DataLoader's worker processes do); leave "
            "pin_memory unset on this machine", UserWarning, stacklevel=3,
        )
        return collate_fn, False
    if collate_fn is fast_collate:
        return functools.partial(fast_collate, pin_memory=True), False
    return collate_fn, True


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


def _batches(base: Iterator[Any], shut_down_workers: bool, arenas: bool) -> Iterator[Any]:
    try:
        if not arenas:
            yield from base
            return
        for batch in base:  # the workers' batches come as references into their arenas
            if isinstance(batch, Outcome):
                yield Outcome(arena.materialize(batch.batch), batch.skipped)
            else:
                yield arena.materialize(batch)
    finally:
        # Without this, workers live on until the base iterator is garbage collected; when an
        # exception's traceback puts it in a reference cycle, that is a gc pass later, and torch's
        # shutdown from inside gc waits out a 5 s timeout per worker.
        if shut_down_workers:
            shutdown_dataloader_workers(base)


class _Position(HandOff):
    """One iteration's starting sampler state, and what the training loop received of it."""

    def __init__(self, origin: dict[str, Any], length: int) -> None:
        super().__init__()
        self.origin, self.length = origin, length

    def state(self, batch_size: int) -> dict[str, Any]:
        if self.end_seen:
            # The loop saw the end of the epoch: the next iter() is the next epoch's.
            state = dict(self.origin, epoch=self.origin["epoch"] + 1, position=0)
            if "history" in state:
                state["history"] = []
            return state
        # After the last batch but before the end was seen, as in torchdata: the restored loader
        # first ends this epoch (no batches), then goes on, so a loop that saved its own epoch
        # counter inside the epoch stays in step.
        position = min(self.origin["position"] + self.batches * batch_size, self.length)
        return dict(self.origin, position=position)


def _with_stateful_sampler(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """DataLoader arguments with ``shuffle`` replaced by one of fastpipe's resumable samplers.

    Only for a map-style dataset without ``sampler=`` / ``batch_sampler=``. ``shuffle=True`` gives
    a RandomSampler seeded with ``seed=``, else with one draw from ``generator=`` (else torch's
    global generator); otherwise a SequentialSampler. ``seed`` is taken out of ``kwargs``, and
    ``window`` (the RandomSampler's shard-aware order), which needs ``shuffle=True``.
    """
    kwargs = dict(kwargs)
    seed = kwargs.pop("seed", None)
    window = kwargs.pop("window", None)
    bound = _DATALOADER_SIGNATURE.bind_partial(None, *args, **kwargs)
    given = bound.arguments
    dataset = given.get("dataset")
    if (
        dataset is None
        or isinstance(dataset, IterableDataset)
        or given.get("sampler") is not None
        or given.get("batch_sampler") is not None
    ):
        if seed is not None:
            raise ValueError(
                "seed= seeds the sampler DataLoaderX builds for shuffle=True; with sampler=, "
                "batch_sampler= or an IterableDataset there is none: seed your sampler instead"
            )
        if window is not None:
            raise ValueError(
                "window= orders the sampler DataLoaderX builds for shuffle=True; with sampler=, "
                "batch_sampler= or an IterableDataset there is none: pass window= to your "
                "sampler (fastpipe.data.RandomSampler or DistributedSampler) instead"
            )
        return args, kwargs
    if given.get("shuffle"):
        if seed is None:
            seed = order_seed(None, generator=given.get("generator"))
        sampler: Any = RandomSampler(dataset, seed=seed, window=window)
    elif window is not None:
        raise ValueError("window= shuffles shards and the samples within windows of them: it "
                         "needs shuffle=True")
    else:
        sampler = SequentialSampler(dataset)
    given["shuffle"] = None
    given["sampler"] = sampler
    return bound.args[1:], bound.kwargs
