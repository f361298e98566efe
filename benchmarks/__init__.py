"""Comparisons against fastpipe's peers, each run as ``python -m benchmarks.NAME`` from the
repository root; ``_harness`` is how they measure, their tables go to docs/benchmarks.md."""
