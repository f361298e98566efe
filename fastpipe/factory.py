"""``image_loader``: normalized image batches on your device, by the fastest path this machine has.

One set of arguments (the names of docs/vocabulary.md), or one :class:`~fastpipe.Recipe`, builds
either

* ``"dali"``: :class:`fastpipe.dali.DALILoader`, decoding on the GPU (DALI's ``"mixed"`` decode)
  when the device is CUDA, in DALI's CPU mode when it is the CPU;
* ``"cpu"``: the fast CPU path: :class:`~fastpipe.data.ImageFolder` (or
  :class:`~fastpipe.data.H5Dataset` / :class:`~fastpipe.data.LMDBDataset` for a pack file),
  :func:`~fastpipe.data.fast_collate`, :class:`~fastpipe.DataLoaderX` and
  :class:`~fastpipe.DataPrefetcher`, which moves the uint8 batch to the device and normalizes it
  there; with ``decode="gpu"`` the workers hand each sample's bytes and drawn geometry to the
  DataPrefetcher, which decodes the batch on the GPU (nvImageCodec).

Both give the same batches: ``images`` ``(N, 3, H, W)`` of ``dtype`` on ``device`` (with
``torch.channels_last`` strides when asked), normalized with ``mean``/``std``; ``labels`` ``(N,)``
int64 on ``device``; every sample of this rank's share once per epoch, reshuffled every epoch,
shards like ``DistributedSampler``; the same ``len``; in eval, the same crop of every image. The
recipe is built and checked once; what a backend cannot honour is refused by
``Recipe.check`` when the loader is built, never a silent difference.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fastpipe import _validate as check
from fastpipe._constants import (
    DEFAULT_CROP_PCT,
    DEFAULT_HFLIP,
    DEFAULT_INTERPOLATION,
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    DEFAULT_SIZE,
    IMAGENET_MEAN,
    IMAGENET_STD,
)
from fastpipe._hardware import cores_per_local_rank, resolve_device
from fastpipe._seed import checked_seed, draw_seed, order_seed
from fastpipe.recipe import Recipe

__all__ = ["image_loader"]

BACKENDS = ("auto", "cpu", "dali")
DECODES = (None, "cpu", "gpu", "auto")


def image_loader(
    source: str | os.PathLike,
    batch_size: int,
    *,
    train: bool | None = None,
    size: int | tuple[int, int] = DEFAULT_SIZE,
    device: str | torch.device | None = None,
    backend: str = "auto",
    scale: tuple[float, float] = DEFAULT_SCALE,
    ratio: tuple[float, float] = DEFAULT_RATIO,
    hflip: float = DEFAULT_HFLIP,
    auto_augment: str | None = None,
    interpolation: str = DEFAULT_INTERPOLATION,
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    seed: int | None = None,
    shuffle: bool | None = None,
    drop_last: bool = False,
    num_workers: int | None = None,
    worker_method: str | None = None,
    prefetch_depth: int = 2,
    crop_pct: float = DEFAULT_CROP_PCT,
    recipe: Recipe | None = None,
    crop_decode: bool | None = None,
    on_error: str = "raise",
    decode: str | None = None,
    remote: Any = None,
) -> Any:
    """Image classification batches from ``source``, built on the fastest path available.

    Args:
        source: an image folder in ImageFolder layout (``root/<class>/<image>``), a list file of
            ``path label`` lines, a fastpipe pack of (image, label) samples (HDF5 or LMDB, told
            by its content; see ``fastpipe pack``), or WebDataset tar shards (a folder of
            ``.tar`` files, a shard, a glob; their image and label members; the CPU backend).
            Or any of them in object storage, by URL (``s3://``, ``gs://``, ``https://``,
            ``hf://``; the CPU backend), read through the node's cache.
        batch_size: samples per batch.
        train: random-resized crop (``scale``, ``ratio``), flip (``hflip``) and ``auto_augment``;
            else eval: for a square ``size``, resize the shorter side to ``size / crop_pct`` and
            centre-crop ``size``; for ``(height, width)``, resize each side to
            ``side / crop_pct`` and centre-crop (timm's ``crop_mode="squash"``). Required unless
            ``recipe`` is given.
        size: output side, or ``(height, width)``.
        device: where batches end; ``None``: CUDA when available, else the CPU.
        backend: ``"auto"`` (DALI with GPU decoding when ``device`` is CUDA, DALI is installed
            and can run the recipe, else the fast CPU path), ``"dali"`` or ``"cpu"``.
        scale, ratio, hflip, auto_augment, interpolation, crop_pct: as torchvision's
            ``RandomResizedCrop`` / timm (docs/vocabulary.md); train-time options are unused in
            eval, except that ``auto_augment`` in eval is an error.
        mean, std: per channel, 0-1 scale; ``None`` for both: float images in 0-1 unnormalized.
        dtype: ``torch.float32``, ``float16``, ``bfloat16`` (CPU backend only), or ``torch.uint8``
            (raw pixels, with ``mean=std=None``).
        channels_last: ``torch.channels_last`` strides; the shape stays ``(N, 3, H, W)``.
        rank, world_size: this process's share for DDP; ``None``: from ``torch.distributed`` when
            it is initialized, else 0 and 1.
        seed: order and augmentation seed; ``None``: drawn once from torch's generator (0 for the
            order when sharded, so that all ranks agree on the permutation).
        shuffle: reshuffle every epoch; defaults to ``train``.
        drop_last: drop the last partial batch (and, sharded, the samples that do not divide
            evenly, as ``DistributedSampler(drop_last=True)``).
        num_workers: the CPU backend's workers (see ``worker_method``) or DALI's CPU threads;
            ``None``: this process's cores divided among the local ranks (``LOCAL_WORLD_SIZE``).
        worker_method: CPU backend: ``"process"`` (DataLoader's worker processes) or
            ``"thread"`` (threads of this process; see ``DataLoaderX``). ``None``: threads for
            up to 4 workers without ``auto_augment`` (fastpipe's decode and resize release the
            GIL, and threads skip the hand-over between processes: faster on the measured CPU
            runs, docs/benchmarks.md), else processes (with more threads, or Python-heavy
            augmentation, the GIL becomes the limit). DALI runs its own threads: ``"thread"``
            is an error there.
        prefetch_depth: batches prepared ahead of the training step (DALI's prefetch queue, or
            DataLoaderX's queue on the CPU backend, where the DataPrefetcher readies one more).
        recipe: a :class:`~fastpipe.Recipe` holding the image settings (``train``, ``size``,
            ``scale``, ``ratio``, ``hflip``, ``auto_augment``, ``interpolation``, ``crop_pct``,
            ``mean``, ``std``, ``dtype``, ``channels_last``) instead of those keywords, which
            build the same object; a keyword that contradicts it is an error.
        crop_decode: DALI backend, train: ``True`` decodes only the random crop window (DALI's
            fused decode); ``None`` (the default) and ``False`` decode whole images and crop
            them on the device, because the fused GPU decode may fail (NVIDIA/nvImageCodec#55;
            see :class:`fastpipe.dali.DALILoader`). The CPU backend has its own decoder: a value
            given there is ignored, with a warning.
        on_error: what a corrupt image (``fastpipe.data.CorruptImageError``) does: ``"raise"``
            stops the epoch with it; ``"skip"`` leaves it out of its batch (a partial batch),
            counts it and reports it at the end of the epoch (a RuntimeWarning;
            ``loader.loader.skipped`` lists them; resumable): see ``DataLoaderX``. The CPU
            backend only: DALI decodes inside its pipeline and cannot leave a sample out, so
            ``"auto"`` picks the CPU path and ``backend="dali"`` is an error.
        decode: where the images decode. ``None`` (the default): as ``backend`` says (DALI's
            decode, or the CPU path's workers). ``"cpu"``: the CPU path's workers.
            ``"gpu"``: the CPU path's workers read each image's bytes and draw its crop and
            flip (the same draws), and ``DataPrefetcher`` decodes the batch on the GPU with
            nvImageCodec (``pip install 'fastpipe[gpu-decode]'``; torchvision's
            ``decode_jpeg`` where it is absent): a CUDA device, and no ``auto_augment``.
            ``"auto"``: measures the decodes that can run here on the first images of
            ``source`` (the CPU path, GPU decode, DALI) and picks one, saying which and why in a
            UserWarning and in the loader's ``decode_choice``; without a CUDA device, the CPU
            path. See docs/gpu.md, "GPU decode".
        remote: how a URL ``source`` is read (a :class:`~fastpipe.data.RemoteOptions`:
            credentials, endpoint, the cache's folder and size, retries;
            docs/object-storage.md).

    Returns:
        An iterable of ``(images, labels)`` with ``len``, ``batch_size``, ``drop_last``,
        ``dataset`` and ``set_epoch``: a :class:`fastpipe.dali.DALILoader` or a
        :class:`fastpipe.DataPrefetcher`.
    """
    if recipe is None and train is None:
        raise TypeError("image_loader() needs train=True or train=False (or recipe=)")
    keywords = dict(size=size, scale=scale, ratio=ratio, hflip=hflip, auto_augment=auto_augment,
                    interpolation=interpolation, mean=mean, std=std, dtype=dtype,
                    channels_last=channels_last, crop_pct=crop_pct)
    if train is not None:
        keywords["train"] = train
    recipe = Recipe.resolve(recipe, image_loader, "image_loader", **keywords)
    options = _Options.check(
        source=source, batch_size=batch_size, recipe=recipe, device=device, backend=backend,
        rank=rank, world_size=world_size, seed=seed, shuffle=shuffle, drop_last=drop_last,
        num_workers=num_workers, worker_method=worker_method, prefetch_depth=prefetch_depth,
        crop_decode=crop_decode, on_error=on_error, decode=decode, remote=remote,
    )
    loader = _build_dali(options) if options.backend == "dali" else _build_cpu(options)
    if options.decode_choice is not None:
        loader.decode_choice = options.decode_choice
        warnings.warn(f"image_loader(decode='auto'): {options.decode_choice}", UserWarning,
                      stacklevel=2)
    from fastpipe.profiling._workload import check_loader_batches

    return check_loader_batches(loader, options.batch_size, options.drop_last,
                                options.world_size, "image_loader")


class _Options:
    """The arguments of :func:`image_loader` besides the recipe, checked and resolved once."""

    @classmethod
    def check(cls, **given: Any) -> _Options:
        o = cls()
        o.source = given["source"]
        if not isinstance(o.source, (str, os.PathLike)):
            raise TypeError(
                f"source must be a path to an image folder or a pack file, got "
                f"{type(o.source).__name__}; for a dataset object, build DataLoaderX + "
                "DataPrefetcher (or DALILoader) directly"
            )
        from fastpipe.data.remote.urls import is_url

        o.path = o.source if is_url(o.source) else Path(o.source)
        o.remote = given.get("remote")
        o.batch_size = check.positive_int("batch_size", given["batch_size"])
        o.recipe = given["recipe"]
        o.seed = checked_seed(given["seed"], where="image_loader")
        o.shuffle = o.recipe.train if given["shuffle"] is None else bool(given["shuffle"])
        o.drop_last = bool(given["drop_last"])
        o.rank, o.world_size = check.rank_and_world_size(given["rank"], given["world_size"])
        workers = given["num_workers"]
        o.num_workers = cores_per_local_rank() if workers is None else check.non_negative_int(
            "num_workers", workers)
        o.worker_method = given["worker_method"]
        if o.worker_method is not None:
            check.choice("worker_method", o.worker_method, ("process", "thread"))
        o.prefetch_depth = check.positive_int("prefetch_depth", given["prefetch_depth"])
        from fastpipe.data.sampling.skip import check_on_error

        o.on_error = check_on_error(given.get("on_error", "raise"))
        o.device = resolve_device(given["device"], where="image_loader")
        backend = check.choice("backend", given["backend"], BACKENDS)
        o.decode, o.decode_choice = check.choice("decode", given.get("decode"), DECODES), None
        if o.decode == "auto":
            backend = _auto_decode(backend, o)
        _check_decode(backend, o)
        if o.decode in ("cpu", "gpu") and backend == "auto":
            backend = "cpu"
        o.backend = _choose_backend(backend, o)
        o.crop_decode = given.get("crop_decode")
        if o.crop_decode is not None and not isinstance(o.crop_decode, bool):
            raise TypeError(f"crop_decode must be True or False, got {o.crop_decode!r}")
        if o.crop_decode is not None and o.backend != "dali":
            warnings.warn(
                f"image_loader: crop_decode={o.crop_decode} applies to the DALI backend; the "
                "CPU backend decodes with its own decoder and ignores it", RuntimeWarning,
                stacklevel=3,
            )
        # Unless asked for, no fused random-crop decode: it may fail on the GPU
        # (NVIDIA/nvImageCodec#55).
        o.crop_decode = bool(o.crop_decode)
        o.order_seed = order_seed(o.seed, o.world_size)
        o.augment_seed = draw_seed() if o.seed is None else o.seed
        return o


def _check_decode(backend: str, o: _Options) -> None:
    """Refuses a ``decode`` that the backend or the machine cannot honour, with the fix."""
    if o.decode is not None and backend == "dali":
        raise ValueError(
            f"image_loader: decode={o.decode!r} chooses where the CPU path's images decode, and "
            "backend='dali' decodes inside DALI: pass backend='cpu' (or 'auto'), or leave decode "
            "unset")
    if o.decode != "gpu":
        return
    if o.device.type != "cuda":
        raise ValueError(
            f"image_loader(decode='gpu'): GPU decode runs in DataPrefetcher on a CUDA device, and "
            f"the batches go to {o.device}"
            + ("" if torch.cuda.is_available() else " (no CUDA device here)")
            + ": pass decode='cpu', or decode='auto' to measure and pick")
    from fastpipe.gpu_decode import EXTRA, GpuDecodeUnavailable, available_backends

    problems = available_backends()
    if all(problems.values()):
        raise GpuDecodeUnavailable(
            "image_loader(decode='gpu') found no GPU decoder ("
            + "; ".join(f"{k}: {v}" for k, v in problems.items())
            + f"): pip install 'fastpipe[{EXTRA}]', or pass decode='cpu'")
    o.recipe.check("gpu")


def _auto_decode(backend: str, o: _Options) -> str:
    """decode='auto': measures the decodes that can run here and sets ``o.decode`` and
    ``o.decode_choice``; returns the backend that runs the choice."""
    if backend != "auto":
        raise ValueError(f"image_loader(decode='auto') picks the backend as well (DALI is one of "
                         f"its choices): leave backend='auto', or pass decode='cpu' or 'gpu' with "
                         f"backend={backend!r}")
    from fastpipe.data.datasets.images import image_dataset
    from fastpipe.data.sources.resolve import kind_of
    from fastpipe.profiling.decode_choice import choose_decode, decode_candidates, measure_decode

    candidates, unavailable = decode_candidates(o.recipe, o.device, kind_of(o.path))
    for reason in (("on_error='skip' is the CPU path's" if o.on_error == "skip" else None),
                   ("worker_method='thread' is the CPU path's" if o.worker_method == "thread"
                    else None)):
        if reason and "dali" in candidates:
            candidates.remove("dali")
            unavailable["dali"] = reason
    o.decode_choice = choose_decode(
        candidates, unavailable,
        lambda name: measure_decode(name, image_dataset(o.path, recipe=o.recipe.per_sample(),
                                                        seed=0), o.path, o.recipe, o.device,
                                    o.num_workers, o.batch_size))
    choice = o.decode_choice.decode
    o.decode = None if choice == "dali" else choice
    return "dali" if choice == "dali" else "cpu"


def _dali_installed() -> bool:
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def _dali_sees_a_gpu() -> bool:
    from nvidia.dali import backend as dali_backend

    try:
        return int(dali_backend.GetCUDADeviceCount()) > 0
    except Exception:  # noqa: BLE001 - a DALI build for another CUDA major version
        return False


def _choose_backend(backend: str, o: _Options) -> str:
    from fastpipe.data.remote.urls import is_url

    if backend == "dali" and is_url(o.path):
        raise ValueError("the DALI backend reads local files; a URL source is read by the CPU "
                         "backend through the node's cache: pass backend='cpu' (or 'auto')")
    if backend == "auto":
        backend = "cpu"
        # DALI cannot leave a sample out of a batch: on_error="skip" is the CPU path's; nor
        # read a URL.
        if (o.device.type == "cuda" and _dali_installed() and o.worker_method != "thread"
                and o.on_error == "raise" and not is_url(o.path)):
            if not _dali_sees_a_gpu():
                warnings.warn(
                    "image_loader: DALI is installed but sees no GPU (a wheel for another CUDA "
                    "version?), so the fast CPU path is used; install the DALI wheel for your "
                    "CUDA major version to decode on the GPU", RuntimeWarning, stacklevel=4,
                )
            else:
                try:
                    o.recipe.check("dali")
                    backend = "dali"
                except ValueError:
                    pass  # what DALI cannot run, the CPU path runs
    o.recipe.check(backend)
    if backend == "dali":
        if o.on_error == "skip":
            raise ValueError(
                "on_error='skip' is the CPU backend's: DALI decodes inside its pipeline and "
                "cannot leave a corrupt sample out of a batch. Pass backend='cpu' (or 'auto'), or "
                "repack without the corrupt files (fastpipe pack skips and lists them)"
            )
        if o.worker_method == "thread":
            raise ValueError(
                f"worker_method={o.worker_method!r} is the CPU backend's (DataLoaderX); DALI runs "
                "num_workers threads of its own. Pass backend='cpu', or leave worker_method unset"
            )
        if o.num_workers < 1:
            raise ValueError(
                "backend='dali' needs num_workers >= 1 (its CPU threads); num_workers=0 (load "
                "in the main process) exists on backend='cpu' only"
            )
    return backend




# ---------------------------------------------------------------------------- the DALI backend


def _build_dali(o: _Options) -> Any:
    from fastpipe.dali import DALILoader
    from fastpipe.data.sources.resolve import kind_of
    from fastpipe.profiling.decode_choice import DALI_KINDS

    kind = kind_of(o.path)  # FileNotFoundError / ValueError saying what the path is not
    if kind not in DALI_KINDS:
        raise ValueError(f"{o.path} holds {kind} data; the DALI backend reads an image folder, a "
                         "list file or a pack of encoded images: pass backend='cpu'")
    return DALILoader(
        str(o.path), batch_size=o.batch_size, recipe=o.recipe, num_workers=o.num_workers,
        device=str(o.device), shuffle=o.shuffle, drop_last=o.drop_last, seed=o.seed,
        rank=o.rank, world_size=o.world_size, prefetch_depth=o.prefetch_depth,
        crop_decode=o.crop_decode,
    )


# ----------------------------------------------------------------------- the fast CPU backend


def _build_cpu(o: _Options) -> Any:
    from fastpipe.data import DistributedSampler, fast_collate
    from fastpipe.loader import DataLoaderX
    from fastpipe.prefetch import DataPrefetcher

    dataset = _cpu_dataset(o)
    # DistributedSampler's order and sharding (also for one process), advancing its epoch at
    # every iter() as DALILoader does, and resumable through the loader's state_dict().
    sampler = DistributedSampler(dataset, world_size=o.world_size, rank=o.rank,
                                 shuffle=o.shuffle, seed=o.order_seed, drop_last=o.drop_last)
    loader = DataLoaderX(
        dataset, batch_size=o.batch_size, sampler=sampler, num_workers=o.num_workers,
        collate_fn=fast_collate, drop_last=o.drop_last, pin_memory=o.device.type == "cuda",
        # Not persistent: closing the loader then ends its worker processes with it.
        persistent_workers=False,
        worker_method=_cpu_worker_method(o), prefetch_depth=o.prefetch_depth,
        on_error=o.on_error,
    )
    # The dataset gives uint8 samples (or, with decode="gpu", the bytes and draws that the
    # prefetcher decodes); the recipe's batch part happens on the device.
    recipe = o.recipe
    return DataPrefetcher(
        loader, device=o.device, mean=recipe.mean, std=recipe.std,
        dtype=recipe.dtype if recipe.dtype != torch.uint8 else None,
        channels_last=recipe.channels_last, prefetch_depth=1,
    )


# Each sample holds the GIL for its Python steps, a few percent of its time on the fast path
# (docs/benchmarks.md): a few threads share it without waiting, many would queue for it.
_THREAD_WORKERS_UP_TO = 4


def _cpu_worker_method(o: _Options) -> str:
    if o.worker_method is not None:
        return o.worker_method
    if o.recipe.auto_augment is None and 0 < o.num_workers <= _THREAD_WORKERS_UP_TO:
        return "thread"
    return "process"


def _cpu_dataset(o: _Options) -> Any:
    from fastpipe.data.datasets.images import image_dataset

    return image_dataset(o.path, recipe=o.recipe.per_sample(), seed=o.augment_seed,
                         decode="gpu" if o.decode == "gpu" else "cpu", remote=o.remote)
