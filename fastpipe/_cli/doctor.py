"""fastpipe doctor: one screen on the environment and what fastpipe will use in it."""

from __future__ import annotations

import argparse
import json

HELP = ("show torch, CUDA, GPUs, the built kernels, DALI and JPEG decoding, and what fastpipe "
        "will pick here")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from fastpipe._doctor import environment_report, format_report

    report = environment_report()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
