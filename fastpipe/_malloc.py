"""Keeps glibc from handing freed image buffers back to the kernel between images.

Every decoded image allocates and frees the same few buffers (libjpeg-turbo's sample rows, the
region's pixels, the resize's planes, the output). With glibc's defaults, a free that leaves more
than the trim threshold at the top of a heap returns those pages to the kernel, and blocks above
the mmap threshold are unmapped on free: the next image then takes a page fault per 4 KiB it
writes, and the kernel zeroes every page. Both thresholds adapt upwards as the program frees
large blocks, up to 32 MiB (mmap) and 64 MiB (trim) on 64-bit systems; this sets them there at
once, before the first image, as glibc would have itself after a large enough free. The cost is
up to 64 MiB of freed memory kept per malloc arena instead of returned to the system. The
measurements are in docs/cpu-path.md ("Memory").

Left alone: other C libraries than glibc, and processes whose user chose the thresholds
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``) or turned this off
(``FASTPIPE_MALLOC=default``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's own ceilings for its adaptive thresholds on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX
# and twice it, which is what a free at that size sets the trim threshold to).
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20

_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

_lock = threading.Lock()
state: str | None = None  # None until decided; then "set", or why it was left alone


def _mallopt():
    """glibc's ``mallopt``, or None elsewhere; one function so tests can record the calls."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        function = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def keep_freed_memory() -> str:
    """Sets glibc's mmap and trim thresholds to their adaptive ceilings, once per process (forked
    workers inherit them). Returns ``"set"`` or the reason they were left alone."""
    global state
    if state is not None:
        return state
    with _lock:
        if state is not None:
            return state
        if os.environ.get("FASTPIPE_MALLOC", "").lower() == "default":
            state = "FASTPIPE_MALLOC=default"
        elif (any(name in os.environ for name in _USER_SETTINGS)
              or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")):
            state = "the environment sets malloc's thresholds"
        else:
            mallopt = _mallopt()
            if mallopt is None:
                state = "not glibc"
            elif mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD,
                                                                      TRIM_THRESHOLD):
                state = "set"
            else:
                state = "mallopt refused"
        return state
