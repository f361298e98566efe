"""The private APIs of other libraries that fastpipe relies on, each behind one wrapper.

Private APIs change without notice. Keeping every use here means one place to fix when a new
torch, Python or DALI release moves one, and ``tests/test_compat.py`` checks each wrapper against
the installed versions, so such a release fails CI loudly instead of degrading silently.
Each wrapper falls back to the public behaviour where one exists.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

import torch


def register_before_thread_join(callback: Callable[[], None]) -> bool:
    """Runs ``callback`` at interpreter exit *before* Python joins non-daemon threads.

    Uses ``threading._register_atexit`` (the hook ``concurrent.futures`` uses): a plain
    ``atexit`` handler runs after the join, too late to unblock a producer thread waiting on a
    full queue. Returns False when the hook is missing and ``atexit`` was used instead.
    """
    hook = getattr(threading, "_register_atexit", None)
    if callable(hook):
        hook(callback)
        return True
    atexit.register(callback)
    return False


def shutdown_dataloader_workers(iterator: Any) -> bool:
    """Stops the worker processes of a DataLoader iterator now (``_shutdown_workers``) rather
    than when it is garbage collected. Returns False when the iterator has no such method
    (single-process iterators, or a torch that renamed it)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if not callable(shutdown):
        return False
    shutdown()
    return True


def shutdown_dali_pipeline(pipe: Any) -> bool:
    """Joins the threads of a DALI ``Pipeline`` now (``Pipeline._shutdown``) rather than whenever
    the pipeline is collected. Returns False when this DALI has no such method."""
    shutdown = getattr(pipe, "_shutdown", None)
    if not callable(shutdown):
        return False
    shutdown()
    return True


def dispatch_has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether the operator ``op`` (``"namespace::name"``) has a kernel registered for
    ``dispatch_key`` (``"CPU"``, ``"CUDA"``), through ``torch._C``."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, dispatch_key))


def standard_gamma(
    concentration: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Gamma(concentration, 1) draws from ``generator``: ``torch._standard_gamma``, the sampler
    behind ``torch.distributions.Gamma``, which (unlike the distribution) takes a generator."""
    return torch._standard_gamma(concentration, generator=generator)


def new_shared_storage(numel: int, dtype: torch.dtype) -> torch.Tensor | None:
    """An empty 1-D tensor of ``numel`` elements in shared memory, allocated there directly (as
    DataLoader's ``default_collate`` does in a worker) instead of ``share_memory_()``'s extra
    copy. None when the private storage API moved; callers then allocate normally."""
    try:
        storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
    except AttributeError:
        return None
    return torch.empty(0, dtype=dtype).set_(storage)
