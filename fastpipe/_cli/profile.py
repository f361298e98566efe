"""fastpipe profile: run a loader under a simulated training step and say where the time goes."""

from __future__ import annotations

import argparse

from fastpipe._cli import CommandError
from fastpipe._cli._args import (
    PROGRESS_HELP,
    add_dataset_arguments,
    check_output,
    check_plot,
    non_negative_float,
    positive_int,
    resolve,
    say_why,
)

HELP = "profile a loader on a dataset: data-wait share, steps/s, verdict and advice"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataset_arguments(parser)
    parser.add_argument("--batch-size", type=positive_int, default=64, help="(default 64)")
    parser.add_argument("--workers", type=int, default=2, help="num_workers (default 2)")
    parser.add_argument("--prefetch-factor", type=positive_int, default=2,
                        help="batches each worker keeps ready (default 2)")
    parser.add_argument("--persistent-workers", action="store_true")
    parser.add_argument("--pin-memory", action="store_true")
    parser.add_argument("--loader", default="DataLoader",
                        choices=["DataLoader", "DataLoaderX", "DataLoaderX+DataPrefetcher"],
                        help="which loader to profile (default DataLoader)")
    parser.add_argument("--steps", type=positive_int, default=50,
                        help="steps to measure after the first batch (default 50)")
    parser.add_argument("--step-ms", type=non_negative_float, default=20.0,
                        help="sleep per step, standing in for the model's step (default 20)")
    parser.add_argument("--csv", metavar="FILE", help="write the per-step timeline as CSV")
    parser.add_argument("--plot", metavar="FILE.png", help="save the timeline plot")
    parser.add_argument("--json", action="store_true", help="print summary and timeline as JSON")
    parser.add_argument("--no-progress", action="store_true", help=PROGRESS_HELP)


def run(args: argparse.Namespace) -> int:
    from fastpipe.profiling import LoaderSettings
    from fastpipe.profiling._runner import close_loader, run_loader
    from fastpipe.profiling._workload import Spelling, check_measurable

    if args.workers < 0:
        raise CommandError(f"--workers must be >= 0, got {args.workers}")
    check_output(args.csv, "CSV")
    check_plot(args.plot)
    source = resolve(args)
    try:
        note = check_measurable(len(source.dataset), args.batch_size,
                                Spelling(batch="--batch-size"))
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    settings = LoaderSettings(
        num_workers=args.workers, batch_size=args.batch_size,
        prefetch_factor=args.prefetch_factor if args.workers else None,
        pin_memory=args.pin_memory, persistent_workers=args.persistent_workers and args.workers > 0,
        wrapper=args.loader,
    )
    loader = settings.build(source.dataset, source.collate_fn)
    try:
        summary = run_loader(loader, steps=args.steps, step_seconds=args.step_ms / 1000,
                             progress=not args.no_progress)
    except KeyboardInterrupt as exc:
        say_why(exc, "fastpipe profile")
        raise
    finally:
        close_loader(loader)
    if args.csv:
        summary.to_csv(args.csv)
    if args.plot:
        summary.plot(args.plot)
    if args.json:
        print(summary.to_json())
    else:
        workers = f"{args.workers} worker{'s' if args.workers != 1 else ''}"
        print(f"dataset: {source.description}; {settings.wrapper_name}, {workers}, "
              f"batch {args.batch_size}, {args.step_ms:g} ms simulated step\n")
        print(summary)
        if note is not None:
            print(f"note: {note}")
        for path, what in ((args.csv, "timeline"), (args.plot, "plot")):
            if path:
                print(f"{what}: {path}")
    return 0
