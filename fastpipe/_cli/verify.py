"""fastpipe verify: check a pack's metadata, checksums and images; non-zero exit on problems."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastpipe._cli import CommandError
from fastpipe._cli._args import PROGRESS_HELP, in_cli_spelling

HELP = "check a pack made by fastpipe pack: metadata, checksums, decoding; exit 1 on problems"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="an HDF5 or LMDB pack")
    parser.add_argument("--sample", type=int, metavar="K",
                        help="check K random samples instead of all")
    parser.add_argument("--seed", type=int, default=0, help="seed for --sample (default 0)")
    parser.add_argument("--no-progress", "--quiet", dest="no_progress", action="store_true",
                        help=PROGRESS_HELP)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from fastpipe.pack import verify

    if not Path(args.file).exists():
        raise CommandError(f"no such file: {args.file}")
    if args.sample is not None and args.sample < 1:
        raise CommandError(f"--sample must be >= 1, got {args.sample}")
    report = verify(args.file, args.sample, seed=args.seed,
                    progress=not args.no_progress and not args.json)
    # The library names merge='copy'; the command names its flag.
    print(json.dumps(report.to_json(), indent=2) if args.json
          else in_cli_spelling(report.summary(), {"merge='copy'": "--merge copy"}))
    return 0 if report.ok else 1
