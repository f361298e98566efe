"""The fuzz lane: a mutational driver over fastpipe's native decoders and the Python layers
around them (docs/fuzzing.md)."""

from __future__ import annotations

import tracemalloc


class KnownIssue(Exception):
    """A finding of a class already reported and not yet fixed (docs/fuzzing.md lists each, with
    where it lies): the driver counts and names it in the run's summary without failing, so
    that the lane stays a check of everything else; a class not listed still fails it."""


class PeakMemory:
    """``with PeakMemory() as peak:`` ... ``peak.bytes``: the most bytes held through Python's
    allocators (numpy's buffers included) during the block. tracemalloc is started and stopped
    around it, which swaps Python's raw allocator with no lock against threads that free
    through it without the GIL (a Python thread starting or ending): the driver runs no thread
    beside a target for that reason (see harness.run)."""

    bytes = 0

    def __enter__(self) -> PeakMemory:
        tracemalloc.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
