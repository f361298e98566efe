"""Batches loaded by a pool of threads in this process, in sampler order.

For datasets whose per-sample work releases the GIL (fastpipe's JPEG decode and resize do), threads
load as fast as worker processes without their costs: no shared-memory collate, no pickling of
batches between processes, no worker start-up each epoch.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any


def _load(dataset: Any, indices: Sequence[int], collate_fn: Callable[[list], Any],
          pin_memory: bool) -> Any:
    getitems = getattr(dataset, "__getitems__", None)
    samples = getitems(list(indices)) if callable(getitems) else [dataset[i] for i in indices]
    batch = collate_fn(samples)
    if pin_memory:
        from torch.utils.data._utils.pin_memory import pin_memory as pin

        batch = pin(batch)
    return batch


def thread_batches(
    dataset: Any,
    batch_indices: Iterable[Sequence[int]],
    collate_fn: Callable[[list], Any],
    num_threads: int,
    in_flight: int,
    pin_memory: bool = False,
    name: str = "fastpipe-loader",
) -> Iterator[Any]:
    """Yields ``collate_fn([dataset[i] for i in indices])`` for each ``indices`` of
    ``batch_indices``, in order, loading up to ``in_flight`` batches ahead on ``num_threads``
    threads. An exception raised while loading a batch is raised at that batch. The threads stop
    when the generator is exhausted, closed or garbage collected: batches not started are
    cancelled and the ones being loaded are waited for.
    """
    pool = concurrent.futures.ThreadPoolExecutor(num_threads, thread_name_prefix=name)
    pending: collections.deque[concurrent.futures.Future] = collections.deque()
    indices = iter(batch_indices)
    try:
        exhausted = False
        while True:
            while not exhausted and len(pending) < in_flight:
                batch = next(indices, None)
                if batch is None:
                    exhausted = True
                    break
                pending.append(pool.submit(_load, dataset, batch, collate_fn, pin_memory))
            if not pending:
                return
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
