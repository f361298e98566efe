"""fastpipe tune: measure loader settings on your dataset instead of guessing them.

This module is the search only: the datasets come from ``_datasets``, each setting is built by
``_settings.LoaderSettings`` and measured by ``_runner.measure`` into a row of the result table
that ``fastpipe bench`` prints too (``_table``).

The search is coordinate descent inside a time budget: first num_workers (the setting that
matters most), then batch size, prefetch_factor, persistent_workers, pin_memory (with CUDA only)
and the wrapper (DataLoaderX, DataPrefetcher), each tried on top of the best found so far. A
change is kept only when it is faster by more than ``min_gain``, so noise does not pick settings.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from fastpipe._hardware import usable_cores
from fastpipe.profiling._datasets import DatasetSource, is_map_dataset, resolve_dataset
from fastpipe.profiling._runner import measure, settings_row
from fastpipe.profiling._settings import WRAPPERS, LoaderSettings
from fastpipe.profiling._table import Column, ResultTable, Row


@dataclass
class TuneResult:
    """All trials (one table row each), ranked fastest first; ``best`` is the recommendation."""

    trials: list[Row]
    best: Row
    source: DatasetSource | None
    budget: float
    seconds: float
    step_seconds: float
    requested_batch_size: int
    min_gain: float = 0.03

    @property
    def code(self) -> str:
        """The recommended settings as code to paste."""
        return self.best.settings.code(self.source)

    def result_table(self) -> ResultTable:
        """The trials as a table: rank (``*`` the recommendation), loader, samples/s, the ratio
        to the recommendation, then the settings."""
        ranks = {id(t): f"{rank}{'*' if t is self.best else ' '}"
                 for rank, t in enumerate(self.trials, 1)}

        def setting(header: str, value: Callable[[LoaderSettings], Any]) -> Column:
            return Column(header, lambda t: str(value(t.settings)))

        def with_workers(value: Callable[[LoaderSettings], Any]) -> Callable[[LoaderSettings], Any]:
            # prefetch_factor and persistent_workers mean nothing without workers.
            return lambda s: value(s) if s.num_workers else "-"

        return ResultTable(
            self.trials, unit="samples/s", name_header="loader", baseline=self.best.key,
            ratio_header="vs best",
            before=[Column("rank", lambda t: ranks[id(t)])],
            after=[setting("workers", lambda s: s.num_workers),
                   setting("batch", lambda s: s.batch_size),
                   setting("prefetch", with_workers(lambda s: s.prefetch_factor or 2)),
                   setting("persistent", with_workers(lambda s: s.persistent_workers)),
                   setting("pin", lambda s: s.pin_memory),
                   Column("first batch", lambda t: "-" if t.first_batch_seconds is None
                          else f"{t.first_batch_seconds:.2f} s")],
        )

    def table(self) -> str:
        return self.result_table().text()

    def notes(self) -> list[str]:
        notes = ["* = recommended: the fastest, unless a simpler setting was within "
                 f"{self.min_gain:.0%} of it (differences that small are noise)."]
        if self.best.settings.batch_size != self.requested_batch_size:
            notes.append(
                f"batch_size={self.best.settings.batch_size} loads fastest, but the batch size "
                f"also changes training: keep {self.requested_batch_size} if it was chosen for "
                "the model."
            )
        if not torch.cuda.is_available():
            notes.append("No CUDA here: pin_memory was not tried, and DataPrefetcher moved "
                         "nothing.")
        if self.step_seconds == 0:
            notes.append(
                "Measured with no training step between batches (pass step_seconds / --step-ms to "
                "stand in for your model), so overlap with the step was not measured."
            )
        return notes

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.to_dict(self.result_table().rate_field),
            "code": self.code,
            "dataset": self.source.description if self.source is not None else None,
            "budget_seconds": self.budget,
            "seconds": self.seconds,
            "step_seconds": self.step_seconds,
            "notes": self.notes(),
            "trials": self.result_table().to_dicts(),
        }

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def plot(self, path: str | os.PathLike) -> Path:
        """Samples/s against num_workers as a PNG (needs matplotlib: ``fastpipe[plot]``)."""
        from fastpipe.profiling.plots import plot_tune

        return plot_tune(self.trials, self.best, path)

    def __str__(self) -> str:
        parts = [self.table(), "", "Recommended:", "", self.code]
        notes = self.notes()
        if notes:
            parts += [""] + [f"note: {n}" for n in notes]
        return "\n".join(parts)


def default_worker_counts(cores: int | None = None) -> list[int]:
    """0, 1, 2, 4, ... up to twice the usable cores (at most 32)."""
    if cores is None:
        cores = usable_cores()
    counts, n = [0], 1
    while n <= min(2 * cores, 32):
        counts.append(n)
        n *= 2
    return counts


def tune(
    dataset: Any,
    *,
    batch_size: int = 64,
    num_workers: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
    prefetch_factors: Sequence[int] = (2, 4),
    persistent_workers: Sequence[bool] = (False, True),
    pin_memory: Sequence[bool] | None = None,
    wrappers: Sequence[str] = WRAPPERS,
    budget: float = 60.0,
    step_seconds: float = 0.0,
    min_gain: float = 0.03,
    collate_fn: Callable | None = None,
    progress: bool = False,
) -> TuneResult:
    """Finds the fastest loader settings for ``dataset`` within ``budget`` seconds.

    Args:
        dataset: a map-style dataset, a :class:`DatasetSource`, or anything
            :func:`resolve_dataset` accepts (ImageFolder directory, ``.h5`` pack,
            ``module:function``).
        batch_size: the batch size you train with; ``batch_sizes`` defaults to half, it and
            double it.
        num_workers: worker counts to try; default 0, 1, 2, 4... up to twice the cores.
        prefetch_factors, persistent_workers: values tried once workers are chosen.
        pin_memory: values to try; default (False, True) with CUDA, (False,) without.
        wrappers: among "DataLoader", "DataLoaderX", "DataLoaderX+DataPrefetcher".
        budget: total seconds; each trial gets an equal share, and trials that do not fit
            are listed as skipped.
        step_seconds: a sleep after each batch, standing in for the training step.
        min_gain: a setting replaces the best so far only when this much faster (0.03 = 3%).

    Returns:
        A :class:`TuneResult`: ranked trials, ``best``, ``code`` to paste, ``plot()``.
    """
    source = _as_source(dataset, collate_fn)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if budget <= 0:
        raise ValueError(f"budget must be a positive number of seconds, got {budget}")
    grid = _Grid.make(batch_size, num_workers, batch_sizes, prefetch_factors,
                      persistent_workers, pin_memory, wrappers)
    # Each trial gets an equal share of the budget; a third of each share is left for starting
    # and stopping workers.
    trial_seconds = max(0.3, budget / grid.planned * 2 / 3)

    from fastpipe._progress import progress_bar

    bar = progress_bar(progress, only_on_terminal=True, total=grid.planned,
                       desc="fastpipe tune", unit="trial")
    started = time.perf_counter()
    try:
        trials, best = _search(grid, grid.start(batch_size), started, budget,
                               lambda settings, stage: measure(source, settings, trial_seconds,
                                                               step_seconds, stage=stage),
                               trial_seconds, min_gain, bar)
    finally:
        bar.close()
    if best is None:
        reasons = sorted({t.skipped or "no batches" for t in trials.values()})
        raise ValueError(
            f"no loader setting could be measured ({'; '.join(reasons) or 'no trials ran'}); "
            "check that the dataset loads with a plain DataLoader"
        )
    ranked = sorted(trials.values(), key=lambda t: -(t.samples_per_second or -1.0))
    return TuneResult(ranked, best, source, budget, time.perf_counter() - started, step_seconds,
                      batch_size, min_gain)


def _as_source(dataset: Any, collate_fn: Callable | None) -> DatasetSource:
    if isinstance(dataset, DatasetSource):
        source = dataset
    elif isinstance(dataset, (str, os.PathLike)):
        source = resolve_dataset(dataset)
    elif is_map_dataset(dataset):
        source = DatasetSource(dataset, collate_fn,
                               f"{type(dataset).__name__} ({len(dataset)} samples)",
                               code="dataset")
    else:
        raise TypeError(
            f"tune() needs a map-style dataset (with __len__ and __getitem__), a path or "
            f"module:function, got {type(dataset).__name__}"
        )
    if collate_fn is not None:
        source.collate_fn = collate_fn
    return source


@dataclass(frozen=True)
class _Grid:
    """The values each stage of the search tries, checked."""

    workers: list[int]
    batch_sizes: list[int]
    prefetch_factors: Sequence[int]
    persistent_workers: Sequence[bool]
    pin_memory: Sequence[bool]
    wrappers: Sequence[str]

    @classmethod
    def make(cls, batch_size: int, num_workers: Sequence[int] | None,
             batch_sizes: Sequence[int] | None, prefetch_factors: Sequence[int],
             persistent_workers: Sequence[bool], pin_memory: Sequence[bool] | None,
             wrappers: Sequence[str]) -> _Grid:
        unknown = [w for w in wrappers if w not in WRAPPERS]
        if unknown or not wrappers:
            raise ValueError(f"wrappers must be among {WRAPPERS}, got {list(wrappers)}")
        workers = sorted(set(num_workers if num_workers is not None
                             else default_worker_counts()))
        if not workers or min(workers) < 0:
            raise ValueError(f"num_workers must be counts >= 0, got {list(workers)}")
        if batch_sizes is None:
            batch_sizes = sorted({max(1, batch_size // 2), batch_size, batch_size * 2})
        if min(batch_sizes) < 1:
            raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
        if pin_memory is None:
            pin_memory = (False, True) if torch.cuda.is_available() else (False,)
        return cls(workers, list(batch_sizes), prefetch_factors, persistent_workers, pin_memory,
                   wrappers)

    @property
    def planned(self) -> int:
        """An upper bound on the number of trials: every worker count, then each other value
        but the one already measured."""
        others = (self.batch_sizes, self.prefetch_factors, self.persistent_workers,
                  self.pin_memory, self.wrappers)
        return len(self.workers) + sum(max(len(v) - 1, 0) for v in others)

    def start(self, batch_size: int) -> LoaderSettings:
        """The settings the first stage varies: your batch size (or the middle one), the first
        wrapper."""
        sizes = self.batch_sizes
        start = batch_size if batch_size in sizes else sorted(sizes)[len(sizes) // 2]
        return LoaderSettings(batch_size=start, wrapper=self.wrappers[0])

    def stages(self) -> list[tuple[str, Callable[[LoaderSettings], list[LoaderSettings]]]]:
        """(name, the candidates around the best settings so far), in search order."""

        def workers(b: LoaderSettings) -> list[LoaderSettings]:
            return [replace(b, num_workers=w, prefetch_factor=2 if w else None)
                    for w in self.workers]

        def with_workers(field: str, values: Sequence[Any]):
            # prefetch_factor and persistent_workers mean nothing without workers.
            return lambda b: [replace(b, **{field: v}) for v in values] if b.num_workers else []

        return [
            ("num_workers", workers),
            ("batch_size", lambda b: [replace(b, batch_size=n) for n in self.batch_sizes]),
            ("prefetch_factor", with_workers("prefetch_factor", self.prefetch_factors)),
            ("persistent_workers", with_workers("persistent_workers", self.persistent_workers)),
            ("pin_memory", lambda b: [replace(b, pin_memory=p) for p in self.pin_memory]),
            ("wrapper", lambda b: [replace(b, wrapper=w) for w in self.wrappers]),
        ]


def _search(grid: _Grid, base: LoaderSettings, started: float, budget: float,
            run: Callable[[LoaderSettings, str], Row], trial_seconds: float, min_gain: float,
            bar: Any) -> tuple[dict[LoaderSettings, Row], Row | None]:
    """Coordinate descent: each stage's candidates around the best so far; a candidate becomes
    the best only when ``min_gain`` faster. Trials that no longer fit the budget are recorded as
    skipped."""
    trials: dict[LoaderSettings, Row] = {}
    best: Row | None = None
    for stage, candidates in grid.stages():
        if best is None and stage != "num_workers":
            break  # nothing measured to build on; the caller reports it
        for settings in candidates(best.settings if best is not None else base):
            if settings in trials:
                continue
            elapsed = time.perf_counter() - started
            if best is not None and elapsed + trial_seconds > budget:
                trials[settings] = settings_row(settings, stage, skipped="over the time budget")
                bar.update(1)
                continue
            bar.set_postfix_str(settings.label, refresh=False)
            trial = run(settings, stage)
            trials[settings] = trial
            bar.update(1)
            if trial.samples_per_second is None:
                continue
            if best is None or best.samples_per_second is None or (
                    trial.samples_per_second > best.samples_per_second * (1 + min_gain)):
                best = trial
    return trials, best
