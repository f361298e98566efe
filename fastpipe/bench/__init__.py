"""The suite behind ``fastpipe bench``: :func:`run_bench` returns a :class:`BenchReport`."""

from fastpipe.bench.suite import BenchReport, BenchRow, run_bench

__all__ = ["BenchReport", "BenchRow", "run_bench"]
