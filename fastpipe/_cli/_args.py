"""Argument types and checks shared by the bench, profile and tune subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from fastpipe._cli import CommandError

# Every long command shows progress by the same rule (fastpipe/_progress.py) and hides it with
# the same flag.
PROGRESS_HELP = ("hide the progress (a bar on a terminal, a line every few seconds in a log or "
                 "a pipe)")

DATASET_HELP = ("an ImageFolder directory, a .h5 pack file (from `fastpipe pack`), or "
                "module:function (or file.py:function) returning a map-style dataset")


def in_cli_spelling(text: str, spelling: Mapping[str, str]) -> str:
    """A library message with each Python spelling of an option (``overwrite=True``) replaced
    by the command's flag (``--overwrite``)."""
    for python, flag in spelling.items():
        text = text.replace(python, flag)
    return text


def int_list(text: str) -> list[int]:
    """argparse type for comma-separated non-negative ints: "0,2,4"."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", help=DATASET_HELP)
    parser.add_argument("--size", type=positive_int, default=224,
                        help="crop size for image folders and packs (default 224)")
    parser.add_argument("--eval", action="store_true",
                        help="eval-time transforms (resize + centre crop) instead of train-time")


def resolve(args: argparse.Namespace):
    """The dataset named on the command line, or a CommandError saying what to pass."""
    from fastpipe.profiling import resolve_dataset

    try:
        return resolve_dataset(args.dataset, size=args.size, train=not args.eval)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        raise CommandError(str(exc)) from exc


def check_output(path: str | None, what: str) -> None:
    """Fails before the long work, not after it, when an output file cannot be written."""
    if path is None:
        return
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise CommandError(f"cannot write the {what} to {path}: {parent} is not a directory")


def check_plot(path: str | None) -> None:
    check_output(path, "plot")
    if path is not None:
        from fastpipe._optional import MissingDependencyError, require

        try:
            require("matplotlib", extra="plot", feature="--plot")
        except MissingDependencyError as exc:
            raise CommandError(str(exc)) from exc


def say_why(interrupt: KeyboardInterrupt, command: str) -> None:
    """Prints what an interrupt that carries a reason says (a worker process stopped alone,
    ``fastpipe.profiling._runner.WorkerStopped``); the command's "interrupted" line follows."""
    if interrupt.args:
        print(f"{command}: {interrupt}", file=sys.stderr)
