"""The GPU architectures fastpipe._C's CUDA kernels are built for, and whether they fit a GPU.

Pure Python, no import of torch or of the package: setup.py loads this file by path to choose the
architecture list at build time, and fastpipe.ops reads it at run time to decide whether the
built kernel images can run on the GPU at hand (else the ops fall back to their reference).
"""

from __future__ import annotations

import re
from collections.abc import Callable

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


# The newest architecture torch.utils.cpp_extension of torch < 2.7 accepts in
# TORCH_CUDA_ARCH_LIST (2.4-2.6 raise "Unknown CUDA arch (10.0)"): used when the installed torch's
# own check cannot be asked.
_OLD_TORCH_NEWEST = (9, 0)


def archs_torch_accepts(
    candidates: tuple[str, ...], accepts: Callable[[str], bool | None] | None, torch_version: str
) -> set[str]:
    """The ``candidates`` the installed torch's cpp_extension builds for.

    ``accepts(arch)`` is torch's own check (True, False, or None when it cannot be asked, e.g.
    a torch that renamed it); where it cannot be asked, the rule of the release: torch < 2.7
    knows nothing past 9.0.
    """
    accepted = set()
    match = re.match(r"(\d+)\.(\d+)", torch_version)
    old_torch = match is not None and (int(match[1]), int(match[2])) < (2, 7)
    for arch in candidates:
        verdict = accepts(arch) if accepts is not None else None
        if verdict is None:
            major, minor = (int(p) for p in arch.split("."))
            verdict = not old_torch or (major, minor) <= _OLD_TORCH_NEWEST
        if verdict:
            accepted.add(arch)
    return accepted


def default_arch_list(supported: set[str], accepted: set[str] | None = None) -> str:
    """TORCH_CUDA_ARCH_LIST for an nvcc that supports ``supported`` and a torch whose
    cpp_extension accepts ``accepted`` (None: any): WANTED_ARCHS both know, the newest with
    +PTX. Empty when there is none."""
    archs = [
        arch for arch in WANTED_ARCHS
        if arch in supported and (accepted is None or arch in accepted)
    ]
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


# The architectures CUDA 13.0 removed (Maxwell, Pascal, Volta): its nvcc cannot build for them.
_REMOVED_IN = {(5, 0): (13, 0), (5, 2): (13, 0), (5, 3): (13, 0), (6, 0): (13, 0),
               (6, 1): (13, 0), (6, 2): (13, 0), (7, 0): (13, 0), (7, 2): (13, 0)}


def release_builds(capability: tuple[int, int], release: tuple[int, int]) -> bool:
    """Whether nvcc of CUDA ``release`` (major, minor) can build kernels for ``capability``:
    not for an architecture it predates (``_FIRST_RELEASE``) or one it removed (7.0 and older
    with CUDA 13)."""
    arch = f"{capability[0]}.{capability[1]}"
    if arch in _FIRST_RELEASE and release < _FIRST_RELEASE[arch]:
        return False
    removed = _REMOVED_IN.get(capability)
    return removed is None and capability >= (3, 5) or removed is not None and release < removed


# The oldest NVIDIA driver (Linux) each CUDA major version of torch needs (CUDA's minor version
# compatibility): a torch cu130 wheel on a 575 driver fails at its first CUDA call.
DRIVER_FLOOR = {13: (580, 0), 12: (525, 60), 11: (450, 80)}


def driver_floor(torch_cuda: str | None) -> tuple[int, int] | None:
    """The oldest driver for torch built with CUDA ``torch_cuda`` ("13.0"), or None if unknown."""
    match = re.match(r"(\d+)", torch_cuda or "")
    return DRIVER_FLOOR.get(int(match[1])) if match else None
