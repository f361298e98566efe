"""fastpipe tune: measure loader settings on a dataset, print them ranked and the best as code."""

from __future__ import annotations

import argparse

from fastpipe._cli import CommandError
from fastpipe._cli._args import (
    PROGRESS_HELP,
    add_dataset_arguments,
    check_plot,
    int_list,
    non_negative_float,
    positive_int,
    resolve,
    say_why,
)

HELP = "find the fastest DataLoader settings for a dataset within a time budget"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataset_arguments(parser)
    parser.add_argument("--batch-size", type=positive_int, default=64,
                        help="the batch size you train with (default 64)")
    parser.add_argument("--budget", type=non_negative_float, default=60.0,
                        help="total seconds to spend measuring (default 60)")
    parser.add_argument("--workers", type=int_list, default=None, metavar="N,N,...",
                        help="num_workers values to try (default 0,1,2,4,... up to twice the "
                             "cores)")
    parser.add_argument("--batch-sizes", type=int_list, default=None, metavar="N,N,...",
                        help="batch sizes to try (default half, equal to and double --batch-size)")
    parser.add_argument("--prefetch-factors", type=int_list, default=[2, 4], metavar="N,N,...",
                        help="prefetch_factor values to try (default 2,4)")
    parser.add_argument("--wrappers", default="DataLoader,DataLoaderX,DataLoaderX+DataPrefetcher",
                        help="loaders to try, comma-separated (default all three)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="interleaved runs of each setting; a setting wins only when each of "
                             "its rounds beats each round of the simpler one (default 3)")
    parser.add_argument("--step-ms", type=non_negative_float, default=0.0,
                        help="sleep after each batch, standing in for your training step "
                             "(default 0)")
    parser.add_argument("--plot", metavar="FILE.png", help="save samples/s against num_workers")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--no-progress", action="store_true", help=PROGRESS_HELP)


def run(args: argparse.Namespace) -> int:
    from fastpipe.profiling import tune
    from fastpipe.profiling._settings import WRAPPERS
    from fastpipe.profiling._workload import Spelling, check_measurable

    wrappers = [w.strip() for w in args.wrappers.split(",") if w.strip()]
    if not wrappers or any(w not in WRAPPERS for w in wrappers):
        raise CommandError(f"--wrappers must be among {', '.join(WRAPPERS)}; got {args.wrappers!r}")
    if args.budget <= 0:
        raise CommandError(f"--budget must be more than 0 seconds, got {args.budget:g}")
    if args.batch_sizes is not None and 0 in args.batch_sizes:
        raise CommandError("--batch-sizes must be >= 1")
    if 0 in args.prefetch_factors:
        raise CommandError("--prefetch-factors must be >= 1")
    check_plot(args.plot)
    source = resolve(args)
    try:
        check_measurable(len(source.dataset), args.batch_size,
                         Spelling(batch="--batch-size"))
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    try:
        result = tune(
            source, batch_size=args.batch_size, num_workers=args.workers,
            batch_sizes=args.batch_sizes, prefetch_factors=args.prefetch_factors,
            wrappers=wrappers, budget=args.budget, step_seconds=args.step_ms / 1000,
            rounds=args.rounds,
            progress=not args.no_progress,
        )
    except ValueError as exc:  # nothing could be measured: the message says why
        raise CommandError(str(exc)) from exc
    except KeyboardInterrupt as exc:
        say_why(exc, "fastpipe tune")
        raise
    if args.plot:
        result.plot(args.plot)
    if args.json:
        print(result.to_json())
    else:
        print(f"dataset: {source.description}\n")
        print(result)
        if args.plot:
            print(f"\nplot: {args.plot}")
    return 0
