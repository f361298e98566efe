"""The ``fastpipe`` command. Each subcommand is a module in this package that defines

* ``HELP``: one line for ``fastpipe --help``;
* ``add_arguments(parser)``: its argparse arguments;
* ``run(args) -> int``: parses nothing, calls library functions, returns the exit code.

Modules are found automatically, so adding a subcommand touches no other file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence


class CommandError(Exception):
    """A bad argument or a missing path: printed as one line, exit code 2."""


def _commands() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            found[info.name] = importlib.import_module(f"{__name__}.{info.name}")
    return dict(sorted(found.items()))


def build_parser() -> argparse.ArgumentParser:
    from fastpipe._version import __version__

    parser = argparse.ArgumentParser(
        prog="fastpipe",
        description="Keep the GPU fed: measure, tune and pack PyTorch input pipelines.",
    )
    parser.add_argument("--version", action="version", version=f"fastpipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in _commands().items():
        help_line = module.HELP  # type: ignore[attr-defined]
        command = sub.add_parser(name, help=help_line, description=help_line)
        module.add_arguments(command)  # type: ignore[attr-defined]
        command.set_defaults(_run=module.run)  # type: ignore[attr-defined]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except CommandError as error:
        print(f"fastpipe {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastpipe {args.command}: interrupted", file=sys.stderr)
        return 130
