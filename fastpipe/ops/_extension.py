"""Loads the compiled operators (fastpipe._C) and records which ops have kernels on which devices."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings

import torch

from fastpipe._compat import dispatch_has_kernel

# The image ops, with a kernel per device.
OP_NAMES = ("normalize", "erase", "erase_", "mixup", "mixup_", "cutmix", "cutmix_")
# Parameter ops: CPU only, since random parameters are always computed on the CPU.
PARAM_OP_NAMES = ("erasing_boxes",)

BUILD_HINT = (
    "build it with `pip install --no-build-isolation -e .` in a fastpipe source checkout, with "
    "torch and a C++ compiler installed (see docs/ops.md)"
)


def _load() -> tuple[bool, str]:
    if importlib.util.find_spec("fastpipe._C") is None:
        return False, "is not built"
    try:
        importlib.import_module("fastpipe._C")  # registers torch.ops.fastpipe.*
    except (ImportError, OSError) as exc:
        # Typically built against another torch version: rebuilding fixes it.
        return False, f"failed to load ({exc}); rebuild it"
    return True, ""


LOADED, _LOAD_PROBLEM = _load()


def _kernels() -> frozenset[tuple[str, str]]:
    if not LOADED:
        return frozenset()
    found = set()
    for name in OP_NAMES + PARAM_OP_NAMES:
        if not hasattr(torch.ops.fastpipe, name):
            continue  # an older build of the extension
        for device_type, key in (("cpu", "CPU"), ("cuda", "CUDA")):
            if dispatch_has_kernel(f"fastpipe::{name}", key):
                found.add((name, device_type))
    return frozenset(found)


# (op name, device type) pairs with a compiled kernel; computed once, so that checking it under
# torch.compile is a constant lookup.
KERNELS = _kernels()

_warned = False


def has_kernel(name: str, device: torch.device) -> bool:
    return (name, device.type) in KERNELS


def warn_fallback(name: str, device: torch.device) -> None:
    """Warns, once per process, that an op runs on the pure-PyTorch reference."""
    global _warned
    if _warned or torch.compiler.is_compiling():
        return
    _warned = True
    if not LOADED:
        problem = f"the compiled extension fastpipe._C {_LOAD_PROBLEM}"
    else:
        problem = (
            f"fastpipe._C has no {device.type} kernel for {name} (built without CUDA, or an "
            "older build)"
        )
    warnings.warn(
        f"fastpipe.ops: {problem}, so the ops use their pure-PyTorch reference (same results, "
        f"slower); to use the compiled kernels, {BUILD_HINT}",
        RuntimeWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The stacklevel of the first frame outside fastpipe.ops: the user's call."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    return level
