"""The suite behind ``fastpipe bench``: :func:`run_bench` returns a :class:`BenchReport`, whose
table (``fastpipe.profiling._table.ResultTable``) is the one ``fastpipe tune`` prints too."""

from fastpipe.bench.report import BenchReport
from fastpipe.bench.suite import run_bench

__all__ = ["BenchReport", "run_bench"]
