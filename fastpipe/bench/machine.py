"""A description of the machine a benchmark ran on, so numbers are never read without it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_machine() -> dict[str, Any]:
    """CPU, cores, memory, GPU and the versions that matter for loader speed."""
    import torch

    from fastpipe._hardware import usable_cores
    from fastpipe._version import __version__

    gpu = None
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    dali = next(
        (v for v in (_version("nvidia-dali-cuda130"), _version("nvidia-dali-cuda120")) if v),
        None)
    memory = _memory_gib()
    return {
        "cpu": _cpu_model(),
        "cores": usable_cores(),
        "logical_cpus": os.cpu_count(),
        "memory_gib": round(memory, 1) if memory is not None else None,
        "gpu": gpu,
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "pillow": _version("pillow"),
        "simplejpeg": _version("simplejpeg"),
        "dali": dali,
        "fastpipe": __version__,
        "fastpipe_extension": importlib.util.find_spec("fastpipe._C") is not None,
    }


def machine_line(machine: dict[str, Any]) -> str:
    """One line for the top of a table."""
    memory = f", {machine['memory_gib']} GiB" if machine.get("memory_gib") else ""
    gpu = machine.get("gpu") or "no GPU"
    versions = ", ".join(
        f"{name} {machine[name]}"
        for name in ("torch", "torchvision", "pillow", "simplejpeg", "dali") if machine.get(name)
    )
    ops = "compiled ops" if machine.get("fastpipe_extension") else "pure-PyTorch ops"
    return (f"{machine['cpu']}, {machine['cores']} cores{memory}, {gpu}; Python "
            f"{machine['python']}, {versions}, fastpipe {machine['fastpipe']} ({ops})")
