"""fastpipe tune: measure loader settings on your dataset instead of guessing them.

This module is the search only: the datasets come from ``_datasets``, each setting is built by
``_settings.LoaderSettings`` and measured by ``_runner.measure`` into a row of the result table
that ``fastpipe bench`` prints too (``_table``).

The search is coordinate descent inside a time budget: first num_workers (the setting that
matters most), then batch size, prefetch_factor, persistent_workers, pin_memory (with CUDA only)
and the wrapper (DataLoaderX, DataPrefetcher), each tried on top of the best found so far.

Every stage measures its candidates and the current best side by side in ``rounds`` interleaved
rounds (each round a fresh loader, the order reversed every other round so that a drift of the
machine's load falls on all of them). A candidate replaces the current best only when every one
of its rounds beats every round of the current best by more than ``min_gain``: for two equally
fast settings that happens by chance once in ``comb(2 * rounds, rounds)`` (1 in 20 with 3
rounds), so noise does not pick settings, and otherwise the simpler setting stays.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fastpipe._hardware import usable_cores
from fastpipe.profiling._datasets import DatasetSource, is_map_dataset, resolve_dataset
from fastpipe.profiling._runner import measure, settings_row
from fastpipe.profiling._settings import WRAPPERS, LoaderSettings
from fastpipe.profiling._table import Column, ResultTable, Row
from fastpipe.profiling._workload import Spelling, check_measurable, suggested_batch_size
from fastpipe.profiling.decode_choice import DecodeChoice


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
    rounds: int = 3
    short_stages: dict[str, int] = field(default_factory=dict)
    workload_notes: list[str] = field(default_factory=list)
    #: Where the images should decode (the CPU path, GPU decode, DALI), measured on the dataset
    #: after the loader settings; None for a dataset that is not a fastpipe image dataset.
    decode: DecodeChoice | None = None

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
        notes = [self.decision_note(), *self.workload_notes]
        if self.decode is not None:
            notes.append(f"decode: {self.decode.decode} ({self.decode.why}); "
                         f"image_loader(decode='{self.decode.decode}') builds it"
                         if self.decode.decode != "dali" else
                         f"decode: DALI ({self.decode.why}); image_loader(backend='dali')")
        for stage, done in self.short_stages.items():
            chance = (f"1 time in {math.comb(2 * done, done)}" if done > 1
                      else "with no noise measured")
            notes.append(f"the budget allowed {done} of {self.rounds} rounds for {stage}: its "
                         f"choice is less sure ({chance}); a larger budget measures all.")
        noise = self.noise_note()
        if noise:
            notes.append(noise)
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

    def decision_note(self) -> str:
        """How the recommendation was chosen, with the chance that noise alone chose it."""
        if self.rounds == 1:
            return ("* = recommended: the fastest, unless a simpler setting was within "
                    f"{self.min_gain:.0%} of it; one round per setting, so the noise was not "
                    "measured (rounds=3 measures it)")
        return (f"* = recommended: a setting replaced a simpler one only when each of its "
                f"{self.rounds} interleaved rounds beat each round of the simpler one by more "
                f"than {self.min_gain:.0%} (two equally fast settings do that by chance 1 time "
                f"in {math.comb(2 * self.rounds, self.rounds)}); otherwise the simpler one "
                "stayed.")

    def noise(self) -> tuple[float, float] | None:
        """The measured noise: the median and the largest spread of a setting's rounds
        ((max - min) / median, over the settings measured more than once); None without
        repeated rounds."""
        spreads = [(t.high - t.low) / t.median for t in self.trials
                   if t.median and len(t.per_round) > 1]
        if not spreads:
            return None
        return statistics.median(spreads), max(spreads)

    def noise_note(self) -> str | None:
        noise = self.noise()
        if noise is None:
            return None
        typical, worst = noise
        return (f"noise measured here: the rounds of one setting spread by {typical:.0%} "
                f"(median) and up to {worst:.0%} (min-max over median); rates closer than that "
                "are not told apart.")

    def to_dict(self) -> dict[str, Any]:
        noise = self.noise()
        return {
            "rounds": self.rounds,
            "short_stages": dict(self.short_stages),
            "noise": None if noise is None else {"median_spread": noise[0],
                                                 "max_spread": noise[1]},
            "best": self.best.to_dict(self.result_table().rate_field),
            "code": self.code,
            "dataset": self.source.description if self.source is not None else None,
            "budget_seconds": self.budget,
            "seconds": self.seconds,
            "step_seconds": self.step_seconds,
            "decode": None if self.decode is None else self.decode.to_dict(),
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
    rounds: int = 3,
    seconds_per_run: float | None = None,
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
        budget: total seconds, shared among the runs still planned (less what starting and
            stopping a loader has cost per run so far); settings that do not fit are listed as
            skipped.
        step_seconds: a sleep after each batch, standing in for the training step.
        min_gain: a setting replaces the best so far only when each of its rounds is this much
            faster (0.03 = 3%) than each round of the best so far.
        rounds: interleaved measurements of each setting of a stage (with the best so far
            measured again beside them); 1 measures each setting once and the noise not at all.
        seconds_per_run: how long each run measures after its first batch; default a share of
            the budget.
        progress: a progress bar on a terminal, a line every few seconds otherwise.

    Returns:
        A :class:`TuneResult`: ranked trials, ``best``, ``code`` to paste, ``plot()``.
    """
    source = _as_source(dataset, collate_fn)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if budget <= 0:
        raise ValueError(f"budget must be a positive number of seconds, got {budget}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if seconds_per_run is not None and not seconds_per_run > 0:
        raise ValueError(f"seconds_per_run must be more than 0, got {seconds_per_run}")
    if not 0 <= min_gain < 1:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain}")
    grid = _Grid.make(batch_size, num_workers, batch_sizes, prefetch_factors,
                      persistent_workers, pin_memory, wrappers)
    grid, workload_notes = grid.within(len(source.dataset), batch_size)
    planned = grid.planned * rounds

    from fastpipe._progress import progress_bar

    bar = progress_bar(progress, total=planned, desc="fastpipe tune", unit="run")
    started = time.perf_counter()
    short_stages: dict[str, int] = {}
    try:
        trials, best = _search(grid, grid.start(batch_size), started, budget,
                               lambda settings, stage, seconds: measure(
                                   source, settings, seconds, step_seconds, stage=stage),
                               min_gain, bar, rounds, short_stages, seconds_per_run)
        bar.total = bar.n  # the plan was an upper bound: stages without candidates ran nothing
    finally:
        bar.close()
    if best is None:
        reasons = sorted({t.skipped or "no batches" for t in trials.values()})
        raise ValueError(
            f"no loader setting could be measured ({'; '.join(reasons) or 'no trials ran'}); "
            "check that the dataset loads with a plain DataLoader"
        )
    ranked = sorted(trials.values(), key=lambda t: -(t.samples_per_second or -1.0))
    decode = place_decode(source.dataset, best.settings.num_workers, best.settings.batch_size,
                          step_seconds)
    return TuneResult(ranked, best, source, budget, time.perf_counter() - started, step_seconds,
                      batch_size, min_gain, rounds, short_stages, workload_notes, decode)


def place_decode(dataset: Any, num_workers: int, batch_size: int,
                 step_seconds: float = 0.0) -> DecodeChoice | None:
    """Where ``dataset``'s images should decode: the CPU path, GPU decode or DALI, measured on
    its first images (fastpipe.profiling.decode_choice); None when it is not a fastpipe image
    dataset (a recipe's ImageDecoder), whose decode is its own."""
    from fastpipe.profiling.decode_choice import (
        choose_decode,
        decode_candidates,
        image_dataset_recipe,
        measure_decode,
    )

    recipe = image_dataset_recipe(dataset)
    if recipe is None:
        return None
    path = getattr(dataset, "root", None) or getattr(dataset, "file", None)
    kind = None
    if path is not None:
        from fastpipe.data.sources.resolve import kind_of

        kind = kind_of(path)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    candidates, unavailable = decode_candidates(recipe, device, kind)
    if path is None and "dali" in candidates:
        candidates.remove("dali")
        unavailable["dali"] = "DALI reads a path, and this dataset names none"
    step_rate = batch_size / step_seconds if step_seconds > 0 else None
    return choose_decode(candidates, unavailable, lambda name: measure_decode(
        name, dataset, path, recipe, device, num_workers, batch_size), step_rate=step_rate)


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

    def within(self, samples: int, batch_size: int) -> tuple[_Grid, list[str]]:
        """The grid without batch sizes larger than the dataset (each epoch one short batch:
        the run would time workers starting), and notes on what that and a small dataset mean;
        refused when ``batch_size`` itself is larger."""
        note = check_measurable(samples, batch_size, Spelling("tune"))
        notes = [] if note is None else [note]
        kept = [n for n in self.batch_sizes if n <= samples]
        dropped = [n for n in self.batch_sizes if n > samples]
        if not kept:
            raise ValueError(f"tune: every batch size to try ({', '.join(map(str, dropped))}) "
                             f"is larger than the dataset's {samples} samples; try "
                             f"{suggested_batch_size(samples)}")
        if dropped:
            notes.append(f"batch sizes larger than the dataset's {samples} samples were not "
                         f"tried: {', '.join(map(str, dropped))}")
        return replace(self, batch_sizes=kept), notes

    @property
    def planned(self) -> int:
        """An upper bound on the measurements of one round: every worker count, then every
        value of each later stage that has more than one (the best so far is measured again
        beside its rivals)."""
        return sum(self.planned_per_stage())

    def planned_per_stage(self) -> list[int]:
        """The terms of :attr:`planned`, one per stage of :meth:`stages`."""
        others = (self.batch_sizes, self.prefetch_factors, self.persistent_workers,
                  self.pin_memory, self.wrappers)
        return [len(self.workers)] + [len(v) if len(v) > 1 else 0 for v in others]

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
            run: Callable[[LoaderSettings, str, float], Row], min_gain: float, bar: Any,
            rounds: int = 3, short_stages: dict[str, int] | None = None,
            seconds_per_run: float | None = None,
            ) -> tuple[dict[LoaderSettings, Row], Row | None]:
    """Coordinate descent: each stage measures its new candidates and the best so far in
    ``rounds`` interleaved rounds, then walks the candidates in order (simplest first): one
    replaces the current choice only when it :func:`clearly_beats` it in this stage's rounds.

    The budget is shared among the runs still planned, less what starting and stopping a
    loader has cost per run so far (the first stage, before that is known, leaves a third of
    each share for it). A stage whose runs no longer fit records its candidates as skipped; one
    whose later rounds do not fit stops after fewer rounds, noted in ``short_stages`` (stage:
    rounds run)."""
    if short_stages is None:
        short_stages = {}
    trials: dict[LoaderSettings, Row] = {}
    best: Row | None = None
    runs_done, asked, spent = 0, 0.0, 0.0
    planned_left = grid.planned * rounds
    for (stage, candidates), stage_planned in zip(grid.stages(), grid.planned_per_stage()):
        if best is None and stage != "num_workers":
            break  # nothing measured to build on; the caller reports it
        incumbent = best.settings if best is not None else None
        stage_settings = candidates(incumbent if incumbent is not None else base)
        new = [s for s in stage_settings if s not in trials]
        share_left = max(planned_left, 1)
        planned_left -= stage_planned * rounds
        if not new:
            continue
        measured = ([incumbent] if incumbent is not None else []) + new
        elapsed = time.perf_counter() - started
        overhead = max(0.0, (spent - asked) / runs_done) if runs_done else 0.0
        if seconds_per_run is not None:
            seconds = seconds_per_run
        elif runs_done:
            seconds = max(0.2, (budget - elapsed) / share_left - overhead)
        else:
            seconds = max(0.2, budget / share_left * 2 / 3)
        if best is not None and elapsed + len(measured) * rounds * (seconds + overhead) > budget:
            for settings in new:
                trials[settings] = settings_row(settings, stage, skipped="over the time budget")
            bar.update(len(measured) * rounds)
            continue
        runs: dict[LoaderSettings, list[Row]] = {s: [] for s in measured}
        for round_index in range(rounds):
            elapsed = time.perf_counter() - started
            overhead = max(0.0, (spent - asked) / runs_done) if runs_done else 0.0
            if round_index and elapsed + len(measured) * (seconds + overhead) > budget:
                # The budget ends this stage's rounds early: its choice rests on fewer.
                short_stages[stage] = round_index
                bar.update(len(measured) * (rounds - round_index))
                break
            # Reversed every other round: a machine growing busier slows no setting alone.
            for settings in measured if round_index % 2 == 0 else measured[::-1]:
                bar.set_postfix_str(settings.label, refresh=False)
                begun = time.perf_counter()
                runs[settings].append(run(settings, stage, seconds))
                runs_done, asked = runs_done + 1, asked + seconds
                spent += time.perf_counter() - begun
                bar.update(1)
        for settings in new:
            trials[settings] = Row.merged(runs[settings])
        rates = {s: [r.samples_per_second for r in rows] for s, rows in runs.items()}
        if best is not None:
            if None in rates[best.settings]:  # measured before; this stage's run gave no rate
                rates[best.settings] = list(best.per_round)
            else:
                best = trials[best.settings] = Row.merged([best, *runs[best.settings]])
        choice = incumbent
        for settings in stage_settings:
            if settings == incumbent or settings not in runs or None in rates[settings]:
                continue
            if choice is None or clearly_beats(rates[settings], rates[choice], min_gain):
                choice = settings
        if choice is not None:
            best = trials[choice]
    return trials, best


def clearly_beats(challenger: Sequence[float], current: Sequence[float], min_gain: float) -> bool:
    """True when every round of ``challenger`` is more than ``min_gain`` faster than every round
    of ``current`` (rounds measured interleaved, so that the two saw the same machine)."""
    return min(challenger) > max(current) * (1 + min_gain)
