"""Where the time goes: :func:`profile` a training loop, :func:`tune` loader settings.

Plots need matplotlib (``pip install 'fastpipe[plot]'``), imported only when a plot is drawn.
"""

from fastpipe.profiling._datasets import resolve_dataset
from fastpipe.profiling._settings import LoaderSettings
from fastpipe.profiling.profiler import Profiler, ProfileSummary, Step, profile
from fastpipe.profiling.tuner import TuneResult, tune

__all__ = [
    "LoaderSettings",
    "ProfileSummary",
    "Profiler",
    "Step",
    "TuneResult",
    "profile",
    "resolve_dataset",
    "tune",
]
