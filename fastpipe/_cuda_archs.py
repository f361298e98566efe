"""The GPU architectures fastpipe._C's CUDA kernels are built for, and whether they fit a GPU.

Pure Python, no import of torch or of the package: setup.py loads this file by path to choose the
architecture list at build time, and fastpipe.ops reads it at run time to decide whether the
built kernel images can run on the GPU at hand (else the ops fall back to their reference).
"""

from __future__ import annotations

import re

# The GPUs users have, as torch's CUDA 13 wheels cover them: T4 (7.5), A100 (8.0), A10/RTX 30
# (8.6), L4/RTX 40 (8.9), H100 (9.0), B200 (10.0, also 10.3), Thor (11.0), RTX 50 (12.0, also
# 12.1). The newest is also built as PTX, which the driver compiles for GPUs newer than the list.
WANTED_ARCHS = ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "11.0", "12.0")

# When nvcc cannot list its architectures (--list-gpu-arch is missing before CUDA 11.x): the
# first release of each architecture.
_FIRST_RELEASE = {
    "7.5": (10, 0), "8.0": (11, 0), "8.6": (11, 1), "8.9": (11, 8), "9.0": (11, 8),
    "10.0": (12, 8), "11.0": (13, 0), "12.0": (12, 8),
}

_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def archs_of_nvcc_listing(listing: str) -> set[str]:
    """``{"7.5", "8.0", ...}`` from ``nvcc --list-gpu-arch`` output (``compute_75`` lines)."""
    found = set()
    for number in re.findall(r"compute_(\d+)\b", listing):
        found.add(f"{number[:-1]}.{number[-1]}")
    return found


def archs_of_release(release: tuple[int, int]) -> set[str]:
    """The architectures of WANTED_ARCHS that nvcc of CUDA ``release`` (major, minor) knows."""
    return {arch for arch, first in _FIRST_RELEASE.items() if release >= first}


def default_arch_list(supported: set[str]) -> str:
    """TORCH_CUDA_ARCH_LIST for an nvcc that supports ``supported``: WANTED_ARCHS it knows, the
    newest with +PTX. Empty when it knows none of them."""
    archs = [arch for arch in WANTED_ARCHS if arch in supported]
    if not archs:
        return ""
    return ";".join(archs[:-1] + [archs[-1] + "+PTX"])


def parse_arch_list(text: str) -> tuple[tuple[int, int, str, bool], ...] | None:
    """``(major, minor, suffix, ptx)`` per entry of an arch list ("7.5;8.0;12.0+PTX", separated
    by ``;``, ``,`` or spaces), or None when an entry is not of that form (a named list such as
    "Ampere": the archs are then unknown)."""
    entries = [e for e in re.split(r"[;,\s]+", text.strip()) if e]
    parsed = []
    for entry in entries:
        match = _ARCH.match(entry)
        if match is None:
            return None
        parsed.append((int(match[1]), int(match[2]), match[3], match[4] is not None))
    return tuple(parsed)


def kernel_image_fits(capability: tuple[int, int], arch_list: str) -> bool | None:
    """Whether kernels built for ``arch_list`` run on a GPU of compute ``capability``; None when
    the list is unknown.

    A cubin for X.Y runs on X.Z for Z >= Y (same major version); an arch-specific one (9.0a,
    10.0f) only on its own major.minor (a) or family (f); PTX for X.Y is compiled by the driver
    for any GPU of capability >= X.Y.
    """
    parsed = parse_arch_list(arch_list)
    if parsed is None:
        return None
    major, minor = capability
    for arch_major, arch_minor, suffix, ptx in parsed:
        if ptx and not suffix and (major, minor) >= (arch_major, arch_minor):
            return True
        if suffix == "a" and (major, minor) != (arch_major, arch_minor):
            continue
        if major == arch_major and minor >= arch_minor:
            return True
    return False
