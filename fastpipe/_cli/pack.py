"""fastpipe pack: pack an ImageFolder tree, a list file or shards into one HDF5 (or LMDB) file."""

from __future__ import annotations

import argparse
import json
import sys

from fastpipe._cli import CommandError

HELP = "pack an image folder or list file into one HDF5 (or LMDB) file; merge shards"

USAGE = """%(prog)s SOURCE OUTPUT [options]
       %(prog)s --merge-only OUTPUT SHARD [SHARD ...] [--merge virtual|copy] [options]"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="SOURCE (an ImageFolder root or a list file of 'path [label]' lines) and "
                             "OUTPUT; with --merge-only: OUTPUT then the shard packs")
    parser.add_argument("--storage", choices=("bytes", "array"), default="bytes",
                        help="bytes: keep encoded files (default); array: decoded fixed-shape uint8 arrays")
    parser.add_argument("--workers", type=int, default=1, help="processes packing in parallel (default 1)")
    parser.add_argument("--shard", metavar="I/N", help="pack only slice I of N (e.g. 0/4) for a multi-machine pack")
    parser.add_argument("--merge", choices=("virtual", "copy"), default=None,
                        help="virtual: HDF5 virtual dataset over the shard files (default for HDF5); "
                             "copy: one self-contained contiguous file (fastest reads)")
    parser.add_argument("--merge-only", action="store_true",
                        help="combine packs made with --shard (or any compatible packs) into OUTPUT")
    parser.add_argument("--max-side", type=int, metavar="N",
                        help="bytes storage: re-encode images whose shorter side exceeds N so it equals N")
    parser.add_argument("--shape", metavar="HxW", help="array storage: resize and centre-crop images to HxW")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality when re-encoding (default 90)")
    parser.add_argument("--strict", action="store_true", help="stop at the first unreadable or corrupt input")
    parser.add_argument("--no-check", action="store_true",
                        help="bytes storage: do not decode inputs to catch corrupt files (faster)")
    parser.add_argument("--format", choices=("hdf5", "lmdb"), default=None,
                        help="output format (default: lmdb if OUTPUT ends in .lmdb, else hdf5)")
    parser.add_argument("--shard-size", type=int, default=10_000, help="inputs per shard at most (default 10000)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from fastpipe._optional import MissingDependencyError
    from fastpipe.data._pack import PackError, merge_packs, pack

    try:
        if args.merge_only:
            if len(args.paths) < 2:
                raise CommandError("--merge-only needs OUTPUT and at least one SHARD")
            ignored = [flag for flag, value in (("--storage", args.storage != "bytes"), ("--workers", args.workers != 1),
                                                ("--shard", args.shard), ("--max-side", args.max_side),
                                                ("--shape", args.shape), ("--strict", args.strict)) if value]
            if ignored:
                raise CommandError(f"{', '.join(ignored)} do not apply to --merge-only (the shards are already packed)")
            report = merge_packs(args.paths[1:], args.paths[0], merge=args.merge, format=args.format,
                                 overwrite=args.overwrite, progress=not args.quiet)
        else:
            if len(args.paths) != 2:
                raise CommandError(f"expected SOURCE OUTPUT, got {len(args.paths)} paths "
                                   "(to combine shards use --merge-only OUTPUT SHARD ...)")
            report = pack(args.paths[0], args.paths[1], storage=args.storage, workers=args.workers,
                          shard=args.shard, merge=args.merge, max_side=args.max_side, shape=args.shape,
                          strict=args.strict, progress=not args.quiet, format=args.format,
                          quality=args.quality, check=not args.no_check, shard_size=args.shard_size,
                          overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError, MissingDependencyError) as exc:
        raise CommandError(str(exc)) from exc
    except PackError as exc:
        print(f"fastpipe pack: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_json(), indent=2) if args.json else report.summary())
    return 0
