"""What this machine offers a loader: the device batches go to, and the cores loading may use.

One home for both, so that ``image_loader``, ``DataPrefetcher``, ``fastpipe.profile``, DALI,
the tuner and the CLI agree on what ``device=None`` means and on how many cores there are.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = [
    "DeviceUnavailableError",
    "as_device",
    "cores_per_local_rank",
    "resolve_device",
    "usable_cores",
]


class DeviceUnavailableError(RuntimeError, ValueError):
    """A device was asked for that this machine does not have (a ``RuntimeError``, as torch
    raises for it, and a ``ValueError``, as for any other bad argument)."""


def as_device(device: Any, *, where: str) -> torch.device:
    """``device`` (a string, a ``torch.device``) parsed, of type ``"cpu"`` or ``"cuda"``; whether
    this machine has it is :func:`resolve_device`'s question."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"{where}: unknown device {device!r}; pass 'cpu', 'cuda', 'cuda:N', a torch.device, "
            "or None (CUDA when it is available)"
        ) from exc
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"{where} supports 'cpu' and 'cuda' devices, got {device!r}")
    return resolved


def resolve_device(device: Any, *, where: str) -> torch.device:
    """``device`` as a ``torch.device`` of type ``"cpu"`` or ``"cuda"`` that this machine has.

    ``None`` is CUDA when torch sees a GPU, else the CPU. ``"cuda"`` keeps no index (the caller
    decides when "the current device" is read). Raises ValueError naming ``where`` for a device
    that is not a device or one of another type, and :class:`DeviceUnavailableError` for CUDA
    without a GPU or an index past the last GPU.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = as_device(device, where=where)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"{where}: device {device!r} was asked for, but CUDA is not available here "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); pass "
                "device='cpu' or device=None"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(
                f"{where}: device {device!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    return resolved


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers and ``taskset``
    narrow), not all the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cores_per_local_rank() -> int:
    """This process's share of :func:`usable_cores` when a launcher runs ``LOCAL_WORLD_SIZE``
    processes on this machine (torchrun, Lightning and accelerate set it); at least 1."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    local = int(value) if value.isdigit() and int(value) > 0 else 1
    return max(1, usable_cores() // local)
