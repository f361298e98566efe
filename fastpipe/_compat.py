"""The private APIs of other libraries that fastpipe relies on, each behind one wrapper.

Private APIs change without notice. Keeping every use here means one place to fix when a new
torch, Python, DALI or accelerate release moves one, and ``tests/test_compat.py`` checks each
wrapper against the installed versions, so such a release fails CI loudly instead of degrading
silently.
Each wrapper falls back to the public behaviour where one exists.
"""

from __future__ import annotations

import atexit
import collections
import functools
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
    # No explicit generator=None: torch.compile with dynamic shapes fails on it.
    if generator is None:
        return torch._standard_gamma(concentration)
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


@functools.cache
def _torch_pytree() -> Any:
    try:
        from torch.utils import _pytree
    except ImportError:
        return None
    if not (callable(getattr(_pytree, "tree_leaves", None))
            and callable(getattr(_pytree, "tree_map_only", None))):
        return None
    return _pytree


# The containers torch's pytree walks into; the fallback below walks these (by exact type, as
# torch does: a dict subclass of the user's own is a leaf) and namedtuples.
_NODES = (tuple, list, dict, collections.OrderedDict, collections.defaultdict, collections.deque)


def _is_node(tree: Any) -> bool:
    return type(tree) in _NODES or (isinstance(tree, tuple) and hasattr(tree, "_fields"))


def _children(tree: Any) -> list[Any]:
    return list(tree.values()) if isinstance(tree, dict) else list(tree)


def _rebuilt(tree: Any, children: list[Any]) -> Any:
    if isinstance(tree, dict):
        pairs = zip(tree.keys(), children, strict=True)
        if type(tree) is collections.defaultdict:
            return collections.defaultdict(tree.default_factory, pairs)
        return type(tree)(pairs)
    if type(tree) is collections.deque:
        return collections.deque(children, maxlen=tree.maxlen)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*children)
    return type(tree)(children)


def _walked_leaves(tree: Any) -> list[Any]:
    if not _is_node(tree):
        return [tree]
    return [leaf for child in _children(tree) for leaf in _walked_leaves(child)]


def _walked_map_only(cls: type, fn: Callable[[Any], Any], tree: Any) -> Any:
    if _is_node(tree):
        return _rebuilt(tree, [_walked_map_only(cls, fn, child) for child in _children(tree)])
    return fn(tree) if isinstance(tree, cls) else tree


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of a nested batch (tuples, lists, dicts, namedtuples, and whatever else torch
    registers), in order: ``torch.utils._pytree.tree_leaves``, for which torch has no public
    spelling. Falls back to walking the standard containers."""
    pytree = _torch_pytree()
    if pytree is None:
        return _walked_leaves(tree)
    return pytree.tree_leaves(tree)


def tree_map_only(cls: type, fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``fn`` applied to each leaf that is a ``cls``, the structure rebuilt around
    them: ``torch.utils._pytree.tree_map_only``. Falls back to walking the standard containers."""
    pytree = _torch_pytree()
    if pytree is None:
        return _walked_map_only(cls, fn, tree)
    return pytree.tree_map_only(cls, fn, tree)


def accelerate_add_dataloader(loader: Any) -> bool:
    """Makes accelerate's prepared ``loader`` the active one of its ``gradient_state`` again,
    as the loader's own iteration does on its first batch (``GradientState._add_dataloader``,
    which ``begin()`` calls after resetting the loader's end-of-data state). Returns False when
    that method is gone and the public ``dataloader_references`` list was assigned instead."""
    state = loader.gradient_state
    add = getattr(state, "_add_dataloader", None)
    if callable(add):
        add(loader)
        return True
    state.dataloader_references = [*state.dataloader_references, loader]
    return False


def accelerate_remove_dataloader(loader: Any) -> bool:
    """Takes ``loader`` out of its ``gradient_state``'s active loaders, as the loader does when
    it is exhausted (``GradientState._remove_dataloader``). Returns False when that method is
    gone and the public ``dataloader_references`` list was assigned instead."""
    state = loader.gradient_state
    remove = getattr(state, "_remove_dataloader", None)
    if callable(remove):
        remove(loader)
        return True
    state.dataloader_references = [
        ref for ref in state.dataloader_references if ref is not loader
    ]
    return False


def auto_augment_with_fast_ops(base: type, fast_op: Callable[..., Any], module: str) -> type:
    """A subclass of the torchvision.transforms.v2 policy ``base`` (RandAugment, AutoAugment,
    TrivialAugmentWide, AugMix) whose image ops first try ``fast_op(image, transform_id,
    magnitude)``; when it returns None, torchvision's own op runs. The hook is the private
    ``_apply_image_or_video_transform``, which every v2 policy calls once per op it applies (the
    draws stay torchvision's). ``module`` is the subclass's ``__module__``, so it pickles."""
    own = base._apply_image_or_video_transform

    def apply(self, image, transform_id, magnitude, interpolation, fill):
        out = fast_op(image, transform_id, magnitude)
        if out is not None:
            return out
        return own(self, image, transform_id, magnitude, interpolation, fill)

    return type("Fast" + base.__name__, (base,),
                {"_apply_image_or_video_transform": apply, "__module__": module})


def s3_request(fs: Any, method: str, **kwargs: Any) -> Any:
    """The coroutine of one S3 API call through the client of s3fs's file system ``fs``
    (``S3FileSystem._call_s3``: its session, credentials, endpoint and error translation), for
    the calls s3fs has no public method for (a GET whose answer's headers fastpipe reads, and
    whose body it reads in pieces)."""
    call = getattr(fs, "_call_s3", None)
    if call is None:
        import s3fs

        raise RuntimeError(f"s3fs {s3fs.__version__} has no S3FileSystem._call_s3, which "
                           "fastpipe reads s3:// objects through; install an s3fs fastpipe "
                           "supports (pip install 'fastpipe[s3]')")
    return call(method, **kwargs)


def quiet_lost_descriptor_transfers() -> bool:
    """Keeps this process's ``multiprocessing.resource_sharer`` thread from printing a
    connection lost while it hands a descriptor over: a worker process sends each tensor in
    shared memory to the main process that way (torch's ``file_descriptor`` strategy), and a
    main process that ends meanwhile (Ctrl-C) leaves it a reset connection, which it prints as a
    traceback (``sys.excepthook``) although nothing was lost: the receiver reports its own side.
    Every other error, of that thread or any other, is passed on. False where the thread's
    function (``_ResourceSharer._serve``) is not found, and nothing was changed."""
    import sys
    from multiprocessing import resource_sharer

    serve = getattr(getattr(resource_sharer, "_ResourceSharer", None), "_serve", None)
    code = getattr(serve, "__code__", None)
    if code is None:
        return False
    passed_on = sys.excepthook
    if getattr(passed_on, "quiets_lost_descriptor_transfers", False):
        return True

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not (issubclass(kind, (ConnectionError, EOFError)) and tb is not None
                and tb.tb_frame.f_code is code):
            passed_on(kind, value, tb)

    hook.quiets_lost_descriptor_transfers = True  # type: ignore[attr-defined]
    sys.excepthook = hook
    return True
