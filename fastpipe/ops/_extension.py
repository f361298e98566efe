"""Loads the compiled operators (fastpipe._C) and records which ops have kernels on which
devices."""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import os
import re
import sys
import warnings

import torch

from fastpipe import _cuda_archs
from fastpipe._compat import dispatch_has_kernel

# The image ops, with a kernel per device.
OP_NAMES = ("normalize", "erase", "erase_", "mixup", "mixup_", "cutmix", "cutmix_",
            "resize_crops")
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



def _built_cuda_archs() -> str | None:
    """The TORCH_CUDA_ARCH_LIST fastpipe._C's CUDA kernels were built for ("7.5,...,12.0+PTX"),
    or None when it has no CUDA kernels or does not record it (an older build)."""
    if not LOADED or not any(device == "cuda" for _, device in KERNELS):
        return None
    try:
        library = ctypes.CDLL(sys.modules["fastpipe._C"].__file__)  # already loaded: no reload
        function = library.fastpipe_cuda_archs
    except (OSError, AttributeError, KeyError):
        return None
    function.restype = ctypes.c_char_p
    return function().decode() or None


CUDA_ARCHS = _built_cuda_archs()


@torch.compiler.assume_constant_result
def cuda_kernels_fit(index: int) -> bool:
    """Whether the CUDA kernel images fit GPU ``index``'s architecture (True when the build does
    not say which architectures it has: an older build, trusted as before)."""
    return _cuda_kernels_fit(index, CUDA_ARCHS)


@functools.cache
def _cuda_kernels_fit(index: int, archs: str | None) -> bool:
    if archs is None:
        return True
    fits = _cuda_archs.kernel_image_fits(torch.cuda.get_device_capability(index), archs)
    return fits is not False


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_warned = False


def has_kernel(name: str, device: torch.device) -> bool:
    """Whether ``name`` has a compiled kernel for ``device`` that can run there: on CUDA, one
    whose kernel image fits the GPU (``device``, or the current one for a bare "cuda"; without
    a GPU, whether the kernels were built)."""
    if (name, device.type) not in KERNELS:
        return False
    if device.type != "cuda":
        return True
    if device.index is None:  # "cuda" asked by name; a tensor's device always has its index
        if not torch.cuda.is_available():
            return True
        device = torch.device("cuda", torch.cuda.current_device())
    # CUDA is initialized by now (a tensor is on the GPU, or is_available()), never at import.
    return cuda_kernels_fit(device.index)


def warn_fallback(name: str, device: torch.device) -> None:
    """Warns, once per process, that an op runs on the pure-PyTorch reference."""
    global _warned
    if _warned or torch.compiler.is_compiling():
        return
    _warned = True
    if not LOADED:
        problem = f"the compiled extension fastpipe._C {_LOAD_PROBLEM}"
    elif (name, device.type) in KERNELS and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(_device_index(device))
        problem = (
            f"fastpipe._C's CUDA kernels were built for {CUDA_ARCHS}, which cannot run on this "
            f"GPU (compute capability {major}.{minor}); "
        )
        release = re.match(r"(\d+)\.(\d+)", torch.version.cuda or "")
        if release and not _cuda_archs.release_builds(
            (major, minor), (int(release[1]), int(release[2]))
        ):
            # The rebuild needs an nvcc of torch's CUDA major, which cannot build this arch.
            problem += (f"CUDA {torch.version.cuda} (torch's) cannot build for {major}.{minor}, "
                        "so no rebuild helps")
        else:
            problem += f'rebuild with TORCH_CUDA_ARCH_LIST="{major}.{minor}" (see docs/gpu.md)'
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
