"""``image_loader``: normalized image batches on your device, by the fastest path this machine has.

One set of arguments (the names of docs/vocabulary.md) builds either

* ``"dali"``: :class:`fastpipe.dali.DALILoader`, decoding on the GPU (DALI's ``"mixed"`` decode)
  when the device is CUDA, in DALI's CPU mode when it is the CPU;
* ``"cpu"``: the fast CPU path: :class:`~fastpipe.data.ImageFolder` (or
  :class:`~fastpipe.data.H5Dataset` / :class:`~fastpipe.data.LMDBDataset` for a pack file),
  :func:`~fastpipe.data.fast_collate`, :class:`~fastpipe.DataLoaderX` and
  :class:`~fastpipe.DataPrefetcher`, which moves the uint8 batch to the device and normalizes it
  there.

Both give the same batches: ``images`` ``(N, 3, H, W)`` of ``dtype`` on ``device`` (with
``torch.channels_last`` strides when asked), normalized with ``mean``/``std``; ``labels`` ``(N,)``
int64 on ``device``; every sample of this rank's share once per epoch, reshuffled every epoch,
shards like ``DistributedSampler``; the same ``len``. An option a backend cannot honour is an
error when the loader is built, never a silent difference.
"""

from __future__ import annotations

import importlib.util
import math
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
    DEFAULT_RATIO,
    DEFAULT_SCALE,
    DEFAULT_SIZE,
    IMAGENET_MEAN,
    IMAGENET_STD,
)

__all__ = ["image_loader"]

BACKENDS = ("auto", "cpu", "dali")
INTERPOLATIONS = ("bilinear", "bicubic")
_PACK_SUFFIXES = {".h5": "hdf5", ".hdf5": "hdf5", ".lmdb": "lmdb", ".mdb": "lmdb"}
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# What DALI's crop_mirror_normalize can write.
_DALI_DTYPES = (torch.float32, torch.float16, torch.uint8)


def image_loader(
    source: str | os.PathLike,
    batch_size: int,
    *,
    train: bool,
    size: int | tuple[int, int] = DEFAULT_SIZE,
    device: str | torch.device | None = None,
    backend: str = "auto",
    scale: tuple[float, float] = DEFAULT_SCALE,
    ratio: tuple[float, float] = DEFAULT_RATIO,
    hflip: float = DEFAULT_HFLIP,
    auto_augment: str | None = None,
    interpolation: str = "bilinear",
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
) -> Any:
    """Image classification batches from ``source``, built on the fastest path available.

    Args:
        source: an image folder in ImageFolder layout (``root/<class>/<image>``) or a fastpipe
            pack of encoded images (``.h5``/``.hdf5``, ``.lmdb``; see ``fastpipe pack``).
        batch_size: samples per batch.
        train: random-resized crop (``scale``, ``ratio``), flip (``hflip``) and ``auto_augment``;
            else eval: resize the shorter side to ``size / crop_pct`` and centre-crop ``size``.
        size: output side, or ``(height, width)``.
        device: where batches end; ``None``: CUDA when available, else the CPU.
        backend: ``"auto"`` (DALI with GPU decoding when ``device`` is CUDA and DALI is
            installed, else the fast CPU path), ``"dali"`` or ``"cpu"``.
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

    Returns:
        An iterable of ``(images, labels)`` with ``len``, ``batch_size``, ``drop_last``,
        ``dataset`` and ``set_epoch``: a :class:`fastpipe.dali.DALILoader` or a
        :class:`fastpipe.DataPrefetcher`.
    """
    options = _Options.check(
        source=source, batch_size=batch_size, train=train, size=size, device=device,
        backend=backend, scale=scale, ratio=ratio, hflip=hflip, auto_augment=auto_augment,
        interpolation=interpolation, mean=mean, std=std, dtype=dtype, channels_last=channels_last,
        rank=rank, world_size=world_size, seed=seed, shuffle=shuffle, drop_last=drop_last,
        num_workers=num_workers, worker_method=worker_method, prefetch_depth=prefetch_depth,
        crop_pct=crop_pct,
    )
    if options.backend == "dali":
        return _build_dali(options)
    return _build_cpu(options)


class _Options:
    """The arguments of :func:`image_loader`, checked and resolved once."""

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
        o.path = Path(o.source)
        o.batch_size = check.positive_int("batch_size", given["batch_size"])
        if not isinstance(given["train"], bool):
            raise TypeError(f"train must be True or False, got {given['train']!r}")
        o.train = given["train"]
        height, width = check.size_pair("size", given["size"])
        o.size = height if height == width else (height, width)
        o.scale = check.pair("scale", given["scale"])
        if o.scale[1] > 1:
            raise ValueError(f"scale is a fraction of the image area, at most 1; got {o.scale}")
        o.ratio = check.pair("ratio", given["ratio"])
        o.hflip = check.probability("hflip", given["hflip"])
        o.crop_pct = check.probability("crop_pct", given["crop_pct"])
        if o.crop_pct == 0:
            raise ValueError("crop_pct must be in (0, 1], got 0")
        o.auto_augment = given["auto_augment"]
        if o.auto_augment is not None and not isinstance(o.auto_augment, str):
            raise TypeError(f"auto_augment must be a policy name or None, got {o.auto_augment!r}")
        if o.auto_augment is not None and not o.train:
            raise ValueError(
                f"auto_augment={o.auto_augment!r} with train=False: augmentation is for training; "
                "pass auto_augment=None for evaluation"
            )
        interpolation = given["interpolation"]
        interpolation = getattr(interpolation, "value", interpolation)  # InterpolationMode
        o.interpolation = check.choice("interpolation", interpolation, INTERPOLATIONS)
        o.dtype = given["dtype"]
        check.choice("dtype", o.dtype, (*_FLOAT_DTYPES, torch.uint8))
        o.mean, o.std = _mean_std(given["mean"], given["std"], o.dtype)
        o.channels_last = bool(given["channels_last"])
        o.seed = check.optional_seed("seed", given["seed"])
        o.shuffle = o.train if given["shuffle"] is None else bool(given["shuffle"])
        o.drop_last = bool(given["drop_last"])
        o.rank, o.world_size = check.rank_and_world_size(given["rank"], given["world_size"])
        workers = given["num_workers"]
        o.num_workers = _default_workers() if workers is None else check.non_negative_int(
            "num_workers", workers)
        o.worker_method = given["worker_method"]
        if o.worker_method is not None:
            check.choice("worker_method", o.worker_method, ("process", "thread"))
        o.prefetch_depth = check.positive_int("prefetch_depth", given["prefetch_depth"])
        o.device = _resolve_device(given["device"])
        o.backend = _choose_backend(check.choice("backend", given["backend"], BACKENDS), o)
        if o.seed is None:
            o.order_seed = 0 if o.world_size > 1 else _draw_seed()
            o.augment_seed = _draw_seed()
        else:
            o.order_seed = o.augment_seed = o.seed
        return o


def _mean_std(mean: Any, std: Any, dtype: torch.dtype) -> tuple[Any, Any]:
    if (mean is None) != (std is None):
        raise ValueError("pass both mean and std to normalize, or neither (floats in 0-1)")
    if mean is None:
        return None, None
    if dtype == torch.uint8:
        raise ValueError(
            "dtype=torch.uint8 gives raw pixels, which cannot be normalized: pass mean=None, "
            "std=None, or a float dtype"
        )
    mean = tuple(float(m) for m in mean)
    std = tuple(float(s) for s in std)
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"mean and std need 3 values each (RGB, 0-1 scale), got {mean}, {std}")
    if not all(math.isfinite(v) for v in mean + std) or min(std) <= 0:
        raise ValueError(f"mean must be finite and std positive, got {mean}, {std}")
    return mean, std


def _default_workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, cores // max(1, local))


def _resolve_device(device: Any) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"unknown device {device!r}; pass 'cpu', 'cuda', 'cuda:N', a torch.device, or None"
        ) from exc
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"image_loader delivers to 'cpu' or 'cuda' devices, got {device!r}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r}, but CUDA is not available here; pass device='cpu' or device=None"
        )
    return resolved


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
    if backend == "auto":
        if o.device.type != "cuda" or not _dali_installed() or o.worker_method == "thread":
            return "cpu"  # thread workers are the CPU backend's
        if not _dali_sees_a_gpu():
            warnings.warn(
                "image_loader: DALI is installed but sees no GPU (a wheel for another CUDA "
                "version?), so the fast CPU path is used; install the DALI wheel for your CUDA "
                "major version to decode on the GPU", RuntimeWarning, stacklevel=3,
            )
            return "cpu"
        return "dali"
    if backend == "dali":
        if o.dtype not in _DALI_DTYPES:
            raise ValueError(
                f"backend='dali' cannot output {o.dtype}: DALI writes float32, float16 or uint8. "
                "Pass backend='cpu', or dtype=torch.float16 and convert on the device"
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


def _draw_seed() -> int:
    # From torch's generator, like DataLoader's base seed, so torch.manual_seed reproduces it.
    return int(torch.empty((), dtype=torch.int64).random_().item()) % 2**31


def _pack_kind(path: Path) -> str | None:
    kind = _PACK_SUFFIXES.get(path.suffix.lower())
    if kind is None and path.is_dir() and (path / "data.mdb").is_file():
        kind = "lmdb"
    return kind


# ---------------------------------------------------------------------------- the DALI backend


def _build_dali(o: _Options) -> Any:
    from fastpipe.dali import DALILoader

    source: Any = str(o.path)
    if _pack_kind(o.path) is None and not o.path.is_dir():
        raise FileNotFoundError(
            f"{str(o.path)!r} is neither an image folder nor a pack file (.h5, .hdf5, .lmdb)"
        )
    normalize: dict[str, Any] = {}
    if o.dtype != torch.uint8:
        # Without mean and std, DALI's normalize with mean 0 and std 1 (0-1 scale) gives x / 255:
        # the floats in 0-1 the CPU backend gives.
        normalize["mean"] = o.mean if o.mean is not None else (0.0, 0.0, 0.0)
        normalize["std"] = o.std if o.std is not None else (1.0, 1.0, 1.0)
    return DALILoader(
        source, batch_size=o.batch_size, train=o.train, size=o.size,
        num_workers=o.num_workers, device=str(o.device), shuffle=o.shuffle,
        drop_last=o.drop_last, seed=o.seed, dtype=o.dtype, channels_last=o.channels_last,
        rank=o.rank, world_size=o.world_size, scale=o.scale, ratio=o.ratio, hflip=o.hflip,
        crop_pct=o.crop_pct, auto_augment=o.auto_augment, interpolation=o.interpolation,
        prefetch_depth=o.prefetch_depth, **normalize,
    )


# ----------------------------------------------------------------------- the fast CPU backend


def _build_cpu(o: _Options) -> Any:
    from fastpipe import DataLoaderX, DataPrefetcher
    from fastpipe.data import DistributedSampler, fast_collate

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
    )
    float_out = o.dtype != torch.uint8
    return DataPrefetcher(
        loader, device=o.device, mean=o.mean, std=o.std,
        dtype=o.dtype if float_out else None, channels_last=o.channels_last, prefetch_depth=1,
    )


# Each sample holds the GIL for its Python steps, a few percent of its time on the fast path
# (docs/benchmarks.md): a few threads share it without waiting, many would queue for it.
_THREAD_WORKERS_UP_TO = 4


def _cpu_worker_method(o: _Options) -> str:
    if o.worker_method is not None:
        return o.worker_method
    if o.auto_augment is None and 0 < o.num_workers <= _THREAD_WORKERS_UP_TO:
        return "thread"
    return "process"


def _cpu_dataset(o: _Options) -> Any:
    kind = _pack_kind(o.path)
    options = dict(auto_augment=o.auto_augment, seed=o.augment_seed)
    decoding = dict(train=o.train, size=o.size, scale=o.scale, ratio=o.ratio, hflip=o.hflip,
                    crop_pct=o.crop_pct, interpolation=o.interpolation)
    if kind is None:
        from fastpipe.data import ImageFolder

        if not o.path.is_dir():
            raise FileNotFoundError(
                f"{str(o.path)!r} is neither an image folder nor a pack file (.h5, .hdf5, .lmdb)"
            )
        return ImageFolder(str(o.path), **decoding, **options)
    from fastpipe.data import ImageDecoder

    if kind == "hdf5":
        from fastpipe.data import H5Dataset as pack_class
    else:
        from fastpipe.data import LMDBDataset as pack_class
    dataset = pack_class(str(o.path), decoder=ImageDecoder(**decoding), **options)
    if dataset.storage != "bytes":
        raise ValueError(
            f"{o.path} stores decoded arrays of one size, so it cannot be cropped and resized "
            "per sample; pack with storage='bytes' (fastpipe pack --storage bytes)"
        )
    return dataset
