"""fastpipe tune: measure loader settings on your dataset instead of guessing them.

The search is coordinate descent inside a time budget: first num_workers (the setting that
matters most), then batch size, prefetch_factor, persistent_workers, pin_memory (with CUDA only)
and the wrapper (DataLoaderX, DataPrefetcher), each tried on top of the best found so far. A
change is kept only when it is faster by more than ``min_gain``, so noise does not pick settings.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fastpipe.profiling.profiler import LoaderInfo, Profiler, ProfileSummary

WRAPPERS = ("DataLoader", "DataLoaderX", "DataLoaderX+DataPrefetcher")
H5_SUFFIXES = (".h5", ".hdf5")


@dataclass
class DatasetSource:
    """A dataset to tune, how to collate it, and how to write it in the recommended code."""

    dataset: Any
    collate_fn: Callable[[list[Any]], Any] | None
    description: str
    code: str
    imports: list[str] = field(default_factory=list)
    collate_code: str | None = None


def _import_factory(spec: str) -> Any:
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ValueError(f"{spec!r} is not module:function")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise FileNotFoundError(f"{path} does not exist")
            name = f"_fastpipe_factory_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            # Registered so that worker processes started with spawn can unpickle its classes.
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            # Like `python -m`: modules next to where the command runs are importable.
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except (ImportError, FileNotFoundError) as exc:
        raise ValueError(f"cannot import {module_name!r} for the dataset factory {spec!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r} (from {spec!r})") from None


def resolve_dataset(spec: str | os.PathLike, size: int = 224, train: bool = True) -> DatasetSource:
    """Turns what the user named into a dataset.

    ``spec`` is one of:

    * an ImageFolder directory (``root/<class>/<image>``): read with the fast CPU path
      (``fastpipe.data.ImageFolder`` + ``fast_collate``), or torchvision's ImageFolder with
      uint8 output where that is not available;
    * a pack file (``.h5``/``.hdf5``, from ``fastpipe pack``): ``fastpipe.data.H5Dataset``;
    * ``module:function`` or ``path/to/file.py:function``: a function that takes no arguments
      and returns a map-style dataset (with ``__len__`` and ``__getitem__``).

    Raises ValueError (or FileNotFoundError for a missing path) with what to pass instead.
    """
    source = _resolve(os.fspath(spec), size, train)
    if len(source.dataset) == 0:
        raise ValueError(f"{os.fspath(spec)} is empty: the dataset has no samples")
    return source


def _resolve(text: str, size: int, train: bool) -> DatasetSource:
    path = Path(text)
    if not path.exists() and ":" in text and not text.endswith(":"):
        factory = _import_factory(text)
        dataset = factory() if callable(factory) and not _is_map_dataset(factory) else factory
        if not _is_map_dataset(dataset):
            raise ValueError(
                f"{text} returned {type(dataset).__name__}, not a map-style dataset; it must return "
                "an object with __len__ and __getitem__ (a torch.utils.data.Dataset)"
            )
        return DatasetSource(
            dataset, None, f"{type(dataset).__name__} from {text} ({len(dataset)} samples)",
            code="dataset", imports=[], collate_code=None,
        )
    if not path.exists():
        raise FileNotFoundError(
            f"{text} does not exist; pass an ImageFolder directory, a .h5 pack file, or "
            "module:function returning a dataset"
        )
    if path.is_dir():
        return _folder_source(path, size, train)
    if path.suffix.lower() in H5_SUFFIXES:
        return _pack_source(path, size, train)
    raise ValueError(
        f"{text} is a file but not a pack (.h5/.hdf5); pass an ImageFolder directory, a .h5 pack "
        "file, or module:function returning a dataset"
    )


def _is_map_dataset(value: Any) -> bool:
    return not isinstance(value, type) and hasattr(value, "__len__") and hasattr(value, "__getitem__")


def _folder_source(root: Path, size: int, train: bool) -> DatasetSource:
    try:
        from fastpipe.data import ImageFolder, fast_collate
    except ImportError as missing:
        fast_path_missing = missing
    else:
        dataset = ImageFolder(str(root), train=train, size=size)
        return DatasetSource(
            dataset, fast_collate, f"fastpipe.data.ImageFolder({root}), {len(dataset)} images",
            code=f"ImageFolder({str(root)!r}, train={train}, size={size})",
            imports=["from fastpipe.data import ImageFolder, fast_collate"],
            collate_code="fast_collate",
        )
    try:
        from torchvision import datasets, transforms
    except ImportError as exc:
        raise ValueError(
            f"reading the folder {root} needs fastpipe's fast CPU path ({fast_path_missing}) or "
            f"torchvision ({exc}); install torchvision"
        ) from exc
    if train:
        ops = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
        ops_code = f"transforms.RandomResizedCrop({size}), transforms.RandomHorizontalFlip()"
    else:
        ops = [transforms.Resize(size * 8 // 7), transforms.CenterCrop(size)]
        ops_code = f"transforms.Resize({size * 8 // 7}), transforms.CenterCrop({size})"
    dataset = datasets.ImageFolder(str(root), transform=transforms.Compose([*ops, transforms.PILToTensor()]))
    return DatasetSource(
        dataset, None, f"torchvision ImageFolder({root}) with uint8 output, {len(dataset)} images",
        code=(f"datasets.ImageFolder({str(root)!r}, transform=transforms.Compose(["
              f"{ops_code}, transforms.PILToTensor()]))"),
        imports=["from torchvision import datasets, transforms"],
    )


def _pack_source(path: Path, size: int, train: bool) -> DatasetSource:
    from fastpipe.data import H5Dataset, ImageDecoder, fast_collate

    dataset = H5Dataset(str(path), decoder=ImageDecoder(train=train, size=size))
    return DatasetSource(
        dataset, fast_collate, f"fastpipe.data.H5Dataset({path}), {len(dataset)} samples",
        code=f"H5Dataset({str(path)!r}, decoder=ImageDecoder(train={train}, size={size}))",
        imports=["from fastpipe.data import H5Dataset, ImageDecoder, fast_collate"],
        collate_code="fast_collate",
    )


@dataclass(frozen=True)
class LoaderSettings:
    """One point of the grid."""

    num_workers: int = 0
    batch_size: int = 64
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    wrapper: str = "DataLoader"

    @property
    def wrapper_name(self) -> str:
        return self.wrapper.replace("+", " + ")

    def loader_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "num_workers": self.num_workers}
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor or 2
            kwargs["persistent_workers"] = self.persistent_workers
        if self.pin_memory:
            kwargs["pin_memory"] = True
        return kwargs

    def build(self, dataset: Any, collate_fn: Callable | None, shuffle: bool = True) -> Any:
        from torch.utils.data import DataLoader

        from fastpipe import DataLoaderX, DataPrefetcher

        kwargs = self.loader_kwargs()
        if collate_fn is not None:
            kwargs["collate_fn"] = collate_fn
        cls = DataLoader if self.wrapper == "DataLoader" else DataLoaderX
        loader = cls(dataset, shuffle=shuffle, drop_last=False, **kwargs)
        if self.wrapper.endswith("DataPrefetcher"):
            return DataPrefetcher(loader)
        return loader

    def code(self, source: DatasetSource | None = None) -> str:
        """Python to paste into a training script."""
        names = ["DataLoaderX"] if self.wrapper != "DataLoader" else []
        if self.wrapper.endswith("DataPrefetcher"):
            names.append("DataPrefetcher")
        lines = []
        if self.wrapper == "DataLoader":
            lines.append("from torch.utils.data import DataLoader")
        else:
            lines.append(f"from fastpipe import {', '.join(names)}")
        if source is not None:
            lines += source.imports
        lines.append("")
        dataset = source.code if source is not None else "dataset"
        if source is not None and source.code != "dataset":
            lines.append(f"dataset = {dataset}")
            dataset = "dataset"
        args = [dataset] + [f"{k}={v!r}" for k, v in self._ordered_kwargs()]
        if source is not None and source.collate_code:
            args.append(f"collate_fn={source.collate_code}")
        cls = "DataLoader" if self.wrapper == "DataLoader" else "DataLoaderX"
        lines.append(_wrap_call(f"loader = {cls}(", args))
        if self.wrapper.endswith("DataPrefetcher"):
            lines.append(
                "loader = DataPrefetcher(loader)  # mean=..., std=... to normalize on the device"
            )
        return "\n".join(lines)

    def _ordered_kwargs(self) -> list[tuple[str, Any]]:
        kwargs = self.loader_kwargs()
        kwargs["shuffle"] = True
        order = ["batch_size", "shuffle", "num_workers", "prefetch_factor", "persistent_workers",
                 "pin_memory"]
        return [(k, kwargs[k]) for k in order if k in kwargs]


def _wrap_call(opening: str, args: list[str], width: int = 96) -> str:
    one_line = opening + ", ".join(args) + ")"
    if len(one_line) <= width:
        return one_line
    indent = " " * len(opening)
    lines, current = [], opening
    for i, arg in enumerate(args):
        piece = arg + (", " if i < len(args) - 1 else ")")
        if len(current) + len(piece.rstrip()) > width and current.strip() != opening.strip():
            lines.append(current.rstrip())
            current = indent
        current += piece
    lines.append(current)
    return "\n".join(lines)


@dataclass
class Trial:
    """The measurement of one setting. ``samples_per_second`` is None when it did not run."""

    settings: LoaderSettings
    stage: str
    samples_per_second: float | None = None
    batches: int = 0
    seconds: float = 0.0
    first_batch_seconds: float | None = None
    wait_share: float | None = None
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["settings"] = asdict(self.settings)
        return out


def run_loader(
    loader: Any,
    seconds: float | None = None,
    step_seconds: float = 0.0,
    min_batches: int = 3,
    steps: int | None = None,
    progress: bool = False,
) -> ProfileSummary:
    """Iterates ``loader`` (epoch after epoch), profiled, for ``seconds`` or ``steps``.

    The first batch (starting workers) is the profile's warm-up, reported apart; ``seconds`` and
    ``steps`` count from after it. Epochs repeat until done, so the cost of restarting workers
    each epoch counts when the dataset is small. With ``seconds``, at least ``min_batches`` are
    counted unless that takes over three times ``seconds``. With ``step_seconds`` each batch is
    followed by a sleep, standing in for a training step during which the host is idle (as
    while a GPU computes).
    """
    if (seconds is None) == (steps is None):
        raise ValueError("pass exactly one of seconds or steps")
    profiler = Profiler(None, warmup=1, device="cpu", report=False)
    epochs = profiler.wrap(_epochs(loader))
    profiler.loader_info = LoaderInfo.of(loader)  # not of the epoch generator
    from fastpipe._progress import progress_bar

    bar = progress_bar(progress and steps is not None, only_on_terminal=True, total=(steps or 0) + 1, unit="step",
                       desc="fastpipe profile")
    counted, first = 0, True
    deadline = hard_deadline = math.inf
    try:
        for _ in epochs:
            if step_seconds:
                time.sleep(step_seconds)
            bar.update(1)
            now = time.perf_counter()
            if first:
                first = False
                if seconds is not None:
                    deadline, hard_deadline = now + seconds, now + 3 * seconds
            else:
                counted += 1
            if steps is not None:
                if counted >= steps:
                    break
            elif (now >= deadline and counted >= min_batches) or now >= hard_deadline:
                break
    finally:
        epochs.close()  # ends the last step, and stops the loader's iterator
        bar.close()
    return profiler.summary()


def close_loader(loader: Any) -> None:
    """Stops the threads of a loader (and of the loader a DataPrefetcher wraps)."""
    for item in (loader, getattr(loader, "loader", None)):
        close = getattr(item, "close", None)
        if callable(close):
            close()


def measure(
    source: DatasetSource,
    settings: LoaderSettings,
    seconds: float,
    step_seconds: float = 0.0,
    min_batches: int = 3,
    stage: str = "",
) -> Trial:
    """Builds the loader for ``settings`` and measures it with :func:`run_loader`."""
    with warnings.catch_warnings():
        # More workers than cores is a deliberate point of the grid, not a mistake to warn about.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = settings.build(source.dataset, source.collate_fn)
        try:
            summary = run_loader(loader, seconds, step_seconds, min_batches)
        finally:
            close_loader(loader)
            del loader
            gc.collect()  # so persistent workers end now, not during the next trial
    if not summary.steps:
        return Trial(settings, stage, skipped="the dataset gave no batch")
    if summary.steps_counted == 0:
        return Trial(settings, stage, None, 0, 0.0, summary.warmup_seconds,
                     skipped="the dataset gave only one batch; use a smaller batch size")
    return Trial(
        settings, stage, summary.samples_per_second, summary.steps_counted, summary.seconds,
        summary.warmup_seconds, summary.wait_share,
    )


def _epochs(loader: Any) -> Iterator[Any]:
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return


@dataclass
class TuneResult:
    """All trials, ranked fastest first; ``best`` is the recommendation."""

    trials: list[Trial]
    best: Trial
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

    def table(self) -> str:
        best_rate = self.best.samples_per_second or 1.0
        header = (f"{'rank':>5}  {'samples/s':>10}  {'vs best':>7}  {'workers':>7}  {'batch':>5}  "
                  f"{'prefetch':>8}  {'persistent':>10}  {'pin':>5}  {'loader':<28}  first batch")
        lines = [header, "-" * len(header)]
        for rank, t in enumerate(self.trials, 1):
            s = t.settings
            rate = f"{t.samples_per_second:10.1f}" if t.samples_per_second is not None else f"{'-':>10}"
            ratio = (f"{t.samples_per_second / best_rate:6.2f}x" if t.samples_per_second is not None
                     else f"{'-':>7}")
            first = f"{t.first_batch_seconds:.2f} s" if t.first_batch_seconds is not None else "-"
            prefetch = str(s.prefetch_factor or 2) if s.num_workers else "-"
            persistent = str(s.persistent_workers) if s.num_workers else "-"
            mark = "*" if t is self.best else " "
            line = (f"{rank:>4}{mark}  {rate}  {ratio}  {s.num_workers:>7}  {s.batch_size:>5}  "
                    f"{prefetch:>8}  {persistent:>10}  {s.pin_memory!s:>5}  {s.wrapper_name:<28}  {first}")
            if t.skipped:
                line += f"  (skipped: {t.skipped})"
            lines.append(line)
        return "\n".join(lines)

    def notes(self) -> list[str]:
        notes = ["* = recommended: the fastest, unless a simpler setting was within "
                 f"{self.min_gain:.0%} of it (differences that small are noise)."]
        if self.best.settings.batch_size != self.requested_batch_size:
            notes.append(
                f"batch_size={self.best.settings.batch_size} loads fastest, but the batch size also "
                f"changes training: keep {self.requested_batch_size} if it was chosen for the model."
            )
        if not torch.cuda.is_available():
            notes.append("No CUDA here: pin_memory was not tried, and DataPrefetcher moved nothing.")
        if self.step_seconds == 0:
            notes.append(
                "Measured with no training step between batches (pass step_seconds / --step-ms to "
                "stand in for your model), so overlap with the step was not measured."
            )
        return notes

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.to_dict(),
            "code": self.code,
            "dataset": self.source.description if self.source is not None else None,
            "budget_seconds": self.budget,
            "seconds": self.seconds,
            "step_seconds": self.step_seconds,
            "notes": self.notes(),
            "trials": [t.to_dict() for t in self.trials],
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
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
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
    if isinstance(dataset, DatasetSource):
        source = dataset
    elif isinstance(dataset, (str, os.PathLike)):
        source = resolve_dataset(dataset)
    elif _is_map_dataset(dataset):
        source = DatasetSource(dataset, collate_fn, f"{type(dataset).__name__} ({len(dataset)} samples)",
                               code="dataset")
    else:
        raise TypeError(
            f"tune() needs a map-style dataset (with __len__ and __getitem__), a path or "
            f"module:function, got {type(dataset).__name__}"
        )
    if collate_fn is not None:
        source.collate_fn = collate_fn
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if budget <= 0:
        raise ValueError(f"budget must be a positive number of seconds, got {budget}")
    unknown = [w for w in wrappers if w not in WRAPPERS]
    if unknown or not wrappers:
        raise ValueError(f"wrappers must be among {WRAPPERS}, got {list(wrappers)}")
    workers = sorted(set(num_workers if num_workers is not None else default_worker_counts()))
    if not workers or min(workers) < 0:
        raise ValueError(f"num_workers must be counts >= 0, got {list(workers)}")
    if batch_sizes is None:
        batch_sizes = sorted({max(1, batch_size // 2), batch_size, batch_size * 2})
    if min(batch_sizes) < 1:
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    if pin_memory is None:
        pin_memory = (False, True) if torch.cuda.is_available() else (False,)

    start_bs = batch_size if batch_size in batch_sizes else sorted(batch_sizes)[len(batch_sizes) // 2]
    base = LoaderSettings(batch_size=start_bs, wrapper=wrappers[0])
    stages: list[tuple[str, Callable[[LoaderSettings], list[LoaderSettings]]]] = [
        ("num_workers", lambda b: [replace(b, num_workers=w, prefetch_factor=2 if w else None)
                                   for w in workers]),
        ("batch_size", lambda b: [replace(b, batch_size=n) for n in batch_sizes]),
        ("prefetch_factor", lambda b: [replace(b, prefetch_factor=p) for p in prefetch_factors]
         if b.num_workers else []),
        ("persistent_workers", lambda b: [replace(b, persistent_workers=p) for p in persistent_workers]
         if b.num_workers else []),
        ("pin_memory", lambda b: [replace(b, pin_memory=p) for p in pin_memory]),
        ("wrapper", lambda b: [replace(b, wrapper=w) for w in wrappers]),
    ]
    # Upper bound on the number of trials, to share the budget; a third of each share is
    # left for starting and stopping workers.
    planned = len(workers) + sum(max(len(v) - 1, 0) for v in (
        batch_sizes, prefetch_factors, persistent_workers, pin_memory, wrappers))
    trial_seconds = max(0.3, budget / planned * 2 / 3)

    from fastpipe._progress import progress_bar

    bar = progress_bar(progress, only_on_terminal=True, total=planned, desc="fastpipe tune", unit="trial")
    started = time.perf_counter()
    trials: dict[LoaderSettings, Trial] = {}
    best: Trial | None = None
    try:
        for stage, candidates in stages:
            if best is None and stage != "num_workers":
                break  # nothing measured to build on; reported below
            for settings in candidates(best.settings if best is not None else base):
                if settings in trials:
                    continue
                elapsed = time.perf_counter() - started
                if best is not None and elapsed + trial_seconds > budget:
                    trials[settings] = Trial(settings, stage, skipped="over the time budget")
                    bar.update(1)
                    continue
                bar.set_postfix_str(_short(settings), refresh=False)
                trial = measure(source, settings, trial_seconds, step_seconds, stage=stage)
                trials[settings] = trial
                bar.update(1)
                if trial.samples_per_second is None:
                    continue
                if best is None or best.samples_per_second is None or (
                        trial.samples_per_second > best.samples_per_second * (1 + min_gain)):
                    best = trial
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


def _short(s: LoaderSettings) -> str:
    return (f"workers={s.num_workers} batch={s.batch_size} prefetch={s.prefetch_factor} "
            f"persistent={s.persistent_workers} pin={s.pin_memory} {s.wrapper}")
