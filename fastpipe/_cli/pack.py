"""fastpipe pack: pack an ImageFolder tree or a list file into one HDF5 (or LMDB) file, or
merge packs."""

from __future__ import annotations

import argparse
import json
import sys

from fastpipe._cli import CommandError
from fastpipe._cli._args import PROGRESS_HELP, in_cli_spelling, positive_int
from fastpipe._hardware import usable_cores

HELP = "pack an image folder or list file into one HDF5 (or LMDB) file; merge packs"

USAGE = """%(prog)s SOURCE OUTPUT [options]
       %(prog)s --merge-only OUTPUT PACK [PACK ...] [--merge virtual|copy] [options]
       %(prog)s --upgrade OLD NEW [--format hdf5|lmdb] [--overwrite]"""

# The library's messages name options as Python spells them; the command names its flags.
SPELLING = {
    "overwrite=True": "--overwrite",
    "num_workers=1": "--workers 1",
    "num_workers > 1": "--workers > 1",
    "size=(H, W)": "--size HxW",
    "max_side=N": "--max-side N",
    "merge='copy'": "--merge copy",
    "part=(i, n)": "--part I/N",
    "max_side applies": "--max-side applies",
    "size applies": "--size applies",
    "transcode applies": "--transcode applies",
    "transcode needs": "--transcode needs",
    "part must look like 'i/n'": "--part must look like I/N",
    "part (i, n) needs 0 <= i < n": "--part I/N needs 0 <= I < N",
    "size must look like 'HxW'": "--size must look like HxW",
    "size must be positive": "--size must be positive",
    "pack arrays without size": "pack arrays without --size",
}


def quality(text: str) -> int:
    value = positive_int(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"expected a JPEG quality in 1..100, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="SOURCE (an ImageFolder root or a list file of 'path [label]' "
                             "lines) and OUTPUT; with --merge-only: OUTPUT then the packs")
    parser.add_argument("--storage", choices=("bytes", "array"), default="bytes",
                        help="bytes: keep encoded files (default); array: decoded fixed-shape "
                             "uint8 arrays")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="processes packing in parallel (default: the usable cores, "
                             f"{usable_cores()} here)")
    parser.add_argument("--part", metavar="I/N",
                        help="pack only part I of N of the inputs (e.g. 0/4) for a "
                             "multi-machine pack; combine the parts with --merge-only")
    parser.add_argument("--merge", choices=("virtual", "copy"), default=None,
                        help="virtual: HDF5 virtual dataset over the shard files (default for "
                             "HDF5); copy: one self-contained contiguous file (fastest reads)")
    parser.add_argument("--merge-only", action="store_true",
                        help="combine packs made with --part (or any compatible packs) into "
                             "OUTPUT")
    parser.add_argument("--upgrade", action="store_true",
                        help="rewrite the pack OLD (an earlier format version) as NEW in the "
                             "current one: the same samples, bit for bit, in one file")
    parser.add_argument("--max-side", type=positive_int, metavar="N",
                        help="bytes storage: re-encode images whose shorter side exceeds N so "
                             "it equals N")
    parser.add_argument("--size", metavar="HxW",
                        help="array storage: resize and centre-crop images to HxW")
    parser.add_argument("--quality", type=quality, default=90,
                        help="JPEG quality when re-encoding (default 90)")
    parser.add_argument("--transcode", action="store_true",
                        help="rewrite JPEGs (a restart marker per MCU) and PNGs (seekable "
                             "segments of rows) losslessly, so that crops decode only what they "
                             "show (same pixels)")
    parser.add_argument("--strict", action="store_true",
                        help="stop at the first unreadable or corrupt input")
    parser.add_argument("--no-check", action="store_true",
                        help="bytes storage: do not decode inputs to catch corrupt files (faster)")
    parser.add_argument("--format", choices=("hdf5", "lmdb"), default=None,
                        help="output format (default: lmdb if OUTPUT ends in .lmdb, else hdf5)")
    parser.add_argument("--shard-size", type=positive_int, default=10_000,
                        help="inputs per shard at most (default 10000)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT")
    parser.add_argument("--no-progress", "--quiet", dest="no_progress", action="store_true",
                        help=PROGRESS_HELP)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from fastpipe._optional import MissingDependencyError
    from fastpipe.pack import PackError

    try:
        report = (_upgrade(args) if args.upgrade else _merge(args) if args.merge_only
                  else _pack(args))
    except (ValueError, FileNotFoundError, FileExistsError, MissingDependencyError) as exc:
        raise CommandError(in_cli_spelling(str(exc), SPELLING)) from exc
    except PackError as exc:
        print(f"fastpipe pack: error: {in_cli_spelling(str(exc), SPELLING)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        # The library says what a rerun does with the finished shards; the command's own
        # "interrupted" line follows.
        if exc.args:
            print(f"fastpipe pack: {in_cli_spelling(str(exc), SPELLING)}", file=sys.stderr)
        raise
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.summary())
        travels = _travels_with(report.output) if report.merge == "virtual" else None
        if travels:
            print(travels)
    return 0


def _travels_with(output) -> str | None:
    """The last line after a virtual merge: the pack is a file plus the folders of its part
    files, which must travel with it; how to get one file instead."""
    from pathlib import Path

    from fastpipe.pack._write import read_meta

    output = Path(output)
    try:
        parts = read_meta(output).get("parts") or []
    except Exception:  # noqa: BLE001 - verify reports a pack it cannot read; this only informs
        return None
    files = [output.parent / p["file"] for p in parts
             if isinstance(p, dict) and isinstance(p.get("file"), str)]
    folders = sorted({f.relative_to(output.parent).parts[0] for f in files
                      if f.is_relative_to(output.parent) and f != output.parent / f.name})
    if not folders:
        return None
    size = sum(f.stat().st_size for f in files if f.is_file())
    listed = " and ".join(f"{folder}/" for folder in folders)
    return (f"{output.name} is a file plus {'a folder' if len(folders) == 1 else 'folders'}: its "
            f"samples are in the part files under {listed} ({size / 2**20:.1f} MiB) beside it, "
            f"which must stay next to it (move or copy them together); --merge copy writes one "
            "self-contained file instead")


def _merge(args: argparse.Namespace):
    from fastpipe.pack import merge_packs

    if len(args.paths) < 2:
        raise CommandError("--merge-only needs OUTPUT and at least one PACK")
    given = (("--storage", args.storage != "bytes"), ("--workers", args.workers is not None),
             ("--part", args.part), ("--max-side", args.max_side), ("--size", args.size),
             ("--strict", args.strict), ("--transcode", args.transcode))
    ignored = [flag for flag, value in given if value]
    if ignored:
        raise CommandError(f"{', '.join(ignored)} do not apply to --merge-only (the packs are "
                           "already packed)")
    return merge_packs(args.paths[1:], args.paths[0], merge=args.merge, format=args.format,
                       overwrite=args.overwrite, progress=not args.no_progress)


def _upgrade(args: argparse.Namespace):
    from fastpipe.pack import upgrade

    if len(args.paths) != 2:
        raise CommandError(f"--upgrade needs OLD NEW, got {len(args.paths)} paths")
    given = (("--merge-only", args.merge_only), ("--merge", args.merge),
             ("--storage", args.storage != "bytes"), ("--workers", args.workers is not None),
             ("--part", args.part), ("--max-side", args.max_side), ("--size", args.size),
             ("--strict", args.strict), ("--transcode", args.transcode))
    if ignored := [flag for flag, value in given if value]:
        raise CommandError(f"{', '.join(ignored)} do not apply to --upgrade (it copies the "
                           "samples as they are)")
    return upgrade(args.paths[0], args.paths[1], format=args.format, overwrite=args.overwrite,
                   progress=not args.no_progress)


def _pack(args: argparse.Namespace):
    from fastpipe.pack import pack

    if len(args.paths) != 2:
        raise CommandError(f"expected SOURCE OUTPUT, got {len(args.paths)} paths "
                           "(to combine packs use --merge-only OUTPUT PACK ...)")
    source, output = args.paths
    return pack(source, output, storage=args.storage,
                num_workers=args.workers if args.workers is not None else usable_cores(),
                part=args.part, merge=args.merge, max_side=args.max_side, size=args.size,
                strict=args.strict, progress=not args.no_progress, format=args.format,
                quality=args.quality, transcode=args.transcode, check=not args.no_check,
                shard_size=args.shard_size, overwrite=args.overwrite)
