"""The harness every benchmark shares: how a number is measured, and how it is reported.

- **A fresh interpreter per measurement** (:func:`run_rounds`): pipelines that share a process
  distort each other (a DALI pipeline alive beside a DataLoader moved both by up to a third). The
  child runs ``python -m benchmarks._harness child MODULE NAME``, which calls ``MODULE.measure(
  NAME, cfg)`` and hands back a JSON record.
- **Warm-up, then time** (:func:`time_batches`): the first batches (worker start-up, first reads)
  are not timed; CPU time is counted over the whole iteration (user + system of the process and
  of its joined children: DataLoader workers, process pools) and divided by every image.
- **Interleaved rounds, median and spread**: each round measures every row once, so a burst of
  load elsewhere lands on all of them; a row's number is its median over the rounds, printed with
  its min-max (:func:`interleaved` does the same for timings within one process).
- **The machine described** by :mod:`fastpipe.bench.machine`, above every table.
- **Before and after in one run** (``--baseline CHECKOUT``): every row is measured a second time
  in the same rounds with the fastpipe of another checkout (built in place) first on the import
  path, and each row's ratio current / baseline is printed with its per-round spread.

The child side (``child``, :func:`time_batches`, :func:`cpu_seconds`, :class:`Skip`) uses the
standard library only, and the benchmark modules' ``measure`` only fastpipe's public API: a
baseline child imports this tree's ``benchmarks`` and the baseline's ``fastpipe``. Which
fastpipe a child imported is checked against the one asked for, and a mismatch stops the run.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
BASELINE_SUFFIX = " [baseline]"
# A child that imported another fastpipe than the one asked for exits with this code.
WRONG_FASTPIPE = 3


class Skip(Exception):
    """A measurement that cannot run here; the message says why."""


# ---------------------------------------------------------------- in the measuring process

def cpu_seconds() -> float:
    """User + system time of this process and of its finished children (DataLoader workers are
    joined when their iterator is exhausted, a process pool when it shuts down)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_batches(batches: Iterable[Any], warmup: int,
                 check: Callable[[Any], None] | None = None) -> dict[str, float]:
    """Iterates ``batches`` to the end: samples/s after ``warmup`` batches, and the CPU
    milliseconds per sample of the whole iteration (from this call on: build the pipeline
    before calling, so that its one-time set-up is not counted). ``check`` sees every batch."""
    cpu_start = cpu_seconds()
    counted, total, start = 0, 0, None
    iterator = iter(batches)
    for i, batch in enumerate(iterator):
        if check is not None:
            check(batch)
        total += batch.shape[0]
        if i == warmup - 1:
            start = time.perf_counter()
        elif start is not None:
            counted += batch.shape[0]
    end = time.perf_counter()
    close = getattr(iterator, "close", None)
    if callable(close):
        close()
    del iterator, batches
    if start is None or counted == 0:
        raise RuntimeError("too few batches to time after the warm-up: raise --images or "
                           "--epochs, or lower --warmup")
    return {"rate": counted / (end - start), "cpu_ms": (cpu_seconds() - cpu_start) / total * 1e3}


def interleaved(timed: dict[str, Callable[[], float]], rounds: int,
                warmup: int = 1) -> dict[str, list[float]]:
    """Each timed function's result (seconds) per round, run round-robin in this process: one run
    of each per round, the order rotating from round to round so that no variant always follows
    the same one; ``warmup`` untimed runs of each first."""
    for fn in timed.values():
        for _ in range(warmup):
            fn()
    names = list(timed)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timed[name]())
    return times


def _child(argv: list[str]) -> int:
    """``child MODULE NAME --config JSON --result FILE [--fastpipe ROOT]``: one measurement."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks._harness child")
    parser.add_argument("module")
    parser.add_argument("name")
    parser.add_argument("--config", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--fastpipe", default=None,
                        help="the checkout whose fastpipe this child must import")
    args = parser.parse_args(argv)
    record: dict[str, Any] = {"name": args.name, "pid": os.getpid()}
    if args.fastpipe is not None:
        # Where ``import fastpipe`` will come from (None for a folder without __init__.py),
        # found without running the package.
        spec = importlib.util.find_spec("fastpipe")
        origin = spec.origin if spec is not None and spec.has_location else None
        imported = Path(origin).resolve().parent if origin else None
        if imported != Path(args.fastpipe).resolve() / "fastpipe":
            print(f"this child would import {imported or 'no fastpipe package'}, not the fastpipe "
                  f"of {args.fastpipe}: the measurement would not be of the checkout it names",
                  file=sys.stderr)
            return WRONG_FASTPIPE
        record["fastpipe"] = str(imported)
        # Compiled parts the checkout has built in place; a missing one changes what runs.
        record["extensions"] = sorted({p.name.split(".")[0] for p in imported.glob("_*.so")})
    module = importlib.import_module(f"benchmarks.{args.module}")
    cfg = types.SimpleNamespace(**json.loads(args.config))
    try:
        record.update(module.measure(args.name, cfg))
    except Skip as exc:
        record["note"] = f"skipped: {exc}"
    except Exception as exc:
        # Parts built elsewhere (DALI, HDF5, FFCV) must not sink the whole run: their failure is
        # a note in the table. The module lists them.
        if not getattr(module, "optional", lambda name: False)(args.name):
            raise
        record["note"] = f"failed: {type(exc).__name__}: {exc}"
    loaded = sys.modules.get("fastpipe")
    if args.fastpipe is not None and loaded is not None and (
            Path(loaded.__file__).resolve().parent != Path(record["fastpipe"])):
        print(f"this child measured the fastpipe of {loaded.__file__}, not the fastpipe of "
              f"{args.fastpipe}", file=sys.stderr)
        return WRONG_FASTPIPE
    Path(args.result).write_text(json.dumps(record))
    return 0


# ---------------------------------------------------------------- in the parent

def add_arguments(parser: argparse.ArgumentParser, *, repeat: int, quick_repeat: int = 1,
                  baseline: bool = True) -> None:
    """The options of the benchmarks that run each measurement in its own process: rounds, a row
    filter, where the tables go, and (``baseline``: for those that measure one) a baseline
    checkout."""
    parser.add_argument("--quick", action="store_true",
                        help="smoke run of a few seconds (its numbers mean nothing)")
    parser.add_argument("--repeat", type=int, default=None,
                        help=f"interleaved rounds; the median is reported (default {repeat}, "
                             f"quick {quick_repeat})")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only the rows whose name contains one of these words")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables here")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every measurement (with its process id) here")
    if not baseline:
        return
    parser.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT",
                        help="also measure every row with the fastpipe of this checkout (a git "
                             "worktree of another commit, its extensions built in place: python "
                             "setup.py build_ext --inplace there), interleaved in the same "
                             "rounds, and print the ratio current / baseline per row")


def rounds_of(args: argparse.Namespace, repeat: int, quick_repeat: int = 1) -> int:
    return args.repeat or (quick_repeat if args.quick else repeat)


def select(names: Iterable[str], only: Sequence[str] | None) -> list[str]:
    """The names that contain one of the words of ``--only`` (all without it)."""
    return [n for n in names if not only or any(w.lower() in n.lower() for w in only)]


def check_baseline(parser: argparse.ArgumentParser, baseline: Path | None) -> None:
    if baseline is not None and not (baseline / "fastpipe" / "__init__.py").is_file():
        parser.error(f"--baseline {baseline}: no fastpipe package there; pass the root of a "
                     "fastpipe checkout, its extensions built in place")


def describe_checkout(root: Path) -> str:
    """``ROOT (abc1234 subject)``: which fastpipe a row measured."""
    done = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True)
    commit = done.stdout.strip()[:70] or "not a git checkout"
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "fastpipe"],
                           capture_output=True, text=True).stdout.strip()
    return f"{root} ({commit}{', with uncommitted changes' if dirty else ''})"


def machine() -> str:
    """The machine, as ``fastpipe bench`` describes it."""
    from fastpipe.bench.machine import describe_machine, machine_line

    return machine_line(describe_machine())


@dataclass
class Runs:
    """Every record of a benchmark's rounds: ``current[name]`` with this checkout's fastpipe,
    ``baseline[name]`` with the baseline's."""

    current: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    baseline: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)

    def note(self, name: str, baseline: bool = False) -> str | None:
        runs = (self.baseline if baseline else self.current).get(name, [])
        return next((r["note"] for r in runs if "note" in r), None)


class Isolated:
    """Runs measurements in fresh interpreters. Each child starts in a folder holding only a
    link to this tree's ``benchmarks``, with the fastpipe checkout it measures on PYTHONPATH: so
    ``benchmarks`` is always this tree's, and ``fastpipe`` the checkout's (an editable install
    comes after PYTHONPATH)."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="fastpipe-bench-child-")
        os.symlink(BENCHMARKS, Path(self._folder.name) / "benchmarks")

    def close(self) -> None:
        self._folder.cleanup()

    def __enter__(self) -> Isolated:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, module: str, name: str, config: dict[str, Any], fastpipe: Path | None = REPO,
            python: str = sys.executable, timeout: float = 3600) -> dict[str, Any]:
        """One measurement; a child that fails is an error, unless it measured the baseline
        (whose fastpipe may lack what a row needs), where it is a note."""
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
            result = Path(out.name)
        command = [python, "-m", "benchmarks._harness", "child", module, name,
                   "--config", json.dumps(config), "--result", str(result)]
        env = dict(os.environ)
        if fastpipe is not None:
            command += ["--fastpipe", str(fastpipe)]
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(fastpipe), env.get("PYTHONPATH")) if p)
        try:
            done = subprocess.run(command, cwd=self._folder.name, env=env, timeout=timeout,
                                  stderr=subprocess.PIPE, text=True)
            sys.stderr.write(done.stderr[-4000:] if done.returncode else "")
            if done.returncode == WRONG_FASTPIPE:
                raise RuntimeError(f"{name}: {done.stderr.strip().splitlines()[-1]}")
            if done.returncode:
                if fastpipe is not None and fastpipe != REPO:
                    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    return {"name": name, "pid": None, "note": f"failed: {last}"}
                raise RuntimeError(f"{name} failed in its process (exit {done.returncode}); "
                                   "its error is above")
            return json.loads(result.read_text())
        finally:
            result.unlink(missing_ok=True)


def run_rounds(module: str, names: Sequence[str], config: dict[str, Any], rounds: int, *,
               baseline: Path | None = None, twin: Callable[[str], bool] = lambda name: True,
               python: Callable[[str], str] = lambda name: sys.executable,
               label: str = "", unit: str = "images/s", runs: Runs | None = None) -> Runs:
    """``rounds`` rounds; in each, every name in a fresh interpreter (``module.measure(name,
    cfg)``) and, with ``baseline``, right before or after it (alternating from round to round)
    the same name with the baseline's fastpipe, for the names ``twin`` accepts. ``python(name)``
    is the interpreter of a name, or raises :class:`Skip`: one other than this one (FFCV's) gets
    no fastpipe on its path. A name skipped or failed once is not run again. The child's ``cfg``
    is ``config`` and ``round`` (from 0, within this call), so that a bench can draw a random
    order per round."""
    runs = runs if runs is not None else Runs()
    with Isolated() as isolated:
        for round_ in range(rounds):
            for name in names:
                sides = [False] + ([True] if baseline is not None and twin(name) else [])
                for is_baseline in sides if round_ % 2 == 0 else sides[::-1]:
                    if runs.note(name, is_baseline):
                        continue
                    record = _run_one(isolated, module, name, {**config, "round": round_},
                                      python, baseline if is_baseline else None)
                    (runs.baseline if is_baseline else runs.current).setdefault(
                        name, []).append(record)
                    runs.records.append({"set": label, "round": round_, "baseline": is_baseline,
                                         **record})
                    per = unit.split("/")[0].removesuffix("s")
                    shown = (f"{record['rate']:8.1f} {unit} {record['cpu_ms']:6.2f} CPU ms/{per}"
                             if "rate" in record else record["note"])
                    where = f"{label}, " if label else ""
                    suffix = BASELINE_SUFFIX if is_baseline else ""
                    pid = f" (pid {record['pid']})" if record["pid"] else ""
                    print(f"[{where}round {round_ + 1}/{rounds}] {name + suffix:52s} {shown}{pid}",
                          flush=True)
    _warn_about_extensions(runs)
    return runs


def _run_one(isolated: Isolated, module: str, name: str, config: dict[str, Any],
             python: Callable[[str], str], baseline: Path | None) -> dict[str, Any]:
    try:
        interpreter = python(name)
    except Skip as exc:
        return {"name": name, "pid": None, "note": f"skipped: {exc}"}
    if baseline is not None:
        root: Path | None = baseline
    else:
        root = REPO if interpreter == sys.executable else None
    return isolated.run(module, name, config, root, python=interpreter)


def _warn_about_extensions(runs: Runs) -> None:
    built = {side: {tuple(r["extensions"]) for rs in store.values() for r in rs
                    if "extensions" in r}
             for side, store in (("current", runs.current), ("baseline", runs.baseline))}
    if built["baseline"] and built["baseline"] != built["current"]:
        print(f"warning: the checkouts have different compiled extensions (current "
              f"{sorted(built['current'])}, baseline {sorted(built['baseline'])}): build both "
              "in place", file=sys.stderr, flush=True)


def cpu_column(header: str = "CPU ms/image"):
    """The column of the median CPU milliseconds per sample of a row's rounds."""
    from fastpipe.profiling._table import Column

    return Column(header, lambda r: "-" if r.extra.get("cpu_ms") is None
                  else f"{r.extra['cpu_ms']:.2f}")


def rows(names: Sequence[str], runs: Runs, labels: Callable[[str], str] = lambda name: name,
         baseline_label: str = "the row above, with the baseline's fastpipe") -> list:
    """One table row per name (and its baseline twin after it, when measured): the rate per
    round, the median CPU ms per sample in ``extra["cpu_ms"]``, and why a row has no number in
    ``skipped``."""
    from fastpipe.profiling._table import Row

    out = []
    for name in names:
        for store, suffix in ((runs.current, ""), (runs.baseline, BASELINE_SUFFIX)):
            if name not in store:
                continue
            measured = [r for r in store[name] if "rate" in r]
            note = next((r["note"] for r in store[name] if "note" in r),
                        None if measured else "not run")
            cpu = [r["cpu_ms"] for r in measured if r.get("cpu_ms") is not None]
            out.append(Row(labels(name) + suffix, [r["rate"] for r in measured],
                           key=name + suffix, description=baseline_label if suffix else "",
                           skipped=note.removeprefix("skipped: ") if note else None,
                           extra={"cpu_ms": statistics.median(cpu) if cpu else None}))
    return out


def median_rate(runs: Runs, name: str) -> float | None:
    """The median rate of ``name``'s measured rounds (this checkout), None if none measured."""
    rates = [r["rate"] for r in runs.current.get(name, []) if "rate" in r]
    return statistics.median(rates) if rates else None


def rate_table(names: Sequence[str], runs: Runs, how: dict[str, str], *, unit: str, per: str,
               versus: str, base: float | None) -> list[str]:
    """Markdown: a row per pipeline with its median rate (min-max of the rounds), median CPU ms
    per ``per``, its ratio to the ``base`` rate (the ``versus`` pipeline's median) and ``how``."""
    lines = [f"| pipeline | {unit} (min-max) | CPU ms/{per} | vs {versus} | how |",
             "| --- | ---: | ---: | ---: | --- |"]
    for name in names:
        measured = [r for r in runs.current.get(name, []) if "rate" in r]
        if not measured:
            lines.append(f"| {name} | {runs.note(name) or 'not run'} | | | {how[name]} |")
            continue
        rates = [r["rate"] for r in measured]
        rate = statistics.median(rates)
        ratio = f"{rate / base:.2f}x" if base else "-"
        cpu = statistics.median(r["cpu_ms"] for r in measured)
        lines.append(f"| {name} | {rate:.0f} ({min(rates):.0f}-{max(rates):.0f}) | {cpu:.2f} | "
                     f"{ratio} | {how[name]} |")
    return lines


def before_after(names: Sequence[str], runs: Runs, labels: Callable[[str], str] = lambda n: n,
                 unit: str = "images/s") -> list[str]:
    """Markdown: each row's median with this checkout and with the baseline, their ratio (of the
    two medians), and the ratios of the rounds' pairs (min-max): the noise to read it against."""
    lines = [f"| row | current {unit} | baseline {unit} | current / baseline | per round "
             "(min-max) | slower in every round |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name in names:
        now = [r for r in runs.current.get(name, []) if "rate" in r]
        then = [r for r in runs.baseline.get(name, []) if "rate" in r]
        if not now or not then:
            if name in runs.baseline:
                note = runs.note(name, True) or runs.note(name) or "not measured"
                lines.append(f"| {labels(name)} | - | - | - | - | {note} |")
            continue
        a = statistics.median(r["rate"] for r in now)
        b = statistics.median(r["rate"] for r in then)
        pairs = [x["rate"] / y["rate"] for x, y in zip(now, then)]
        lines.append(f"| {labels(name)} | {a:.0f} | {b:.0f} | {a / b:.3f}x | "
                     f"{min(pairs):.3f}-{max(pairs):.3f}x | "
                     f"{'yes' if max(pairs) < 1 else 'no'} |")
    return lines


def finish(text: str, args: argparse.Namespace, runs: Runs | None = None) -> None:
    """Prints the tables and writes them (``--markdown``) and the records (``--json``)."""
    print()
    print(text)
    if getattr(args, "markdown", None):
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
        print(f"wrote {args.markdown}")
    if getattr(args, "json", None) and runs is not None:
        args.json.write_text(json.dumps({"parent_pid": os.getpid(),
                                         "measurements": runs.records}, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] != ["child"]:
        sys.exit("python -m benchmarks._harness child ...: one measurement, started by a "
                 "benchmark (python -m benchmarks.bench_cpu_path, ...)")
    # Run in the module the benchmarks import, not in this second copy of it (__main__): their
    # Skip must be the one the child catches.
    from benchmarks import _harness

    sys.exit(_harness._child(sys.argv[2:]))
