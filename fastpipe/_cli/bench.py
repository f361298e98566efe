"""fastpipe bench: the loaders side by side on the built-in sample dataset."""

from __future__ import annotations

import argparse
import shlex
import sys

from fastpipe._cli import CommandError
from fastpipe._cli._args import (
    PROGRESS_HELP,
    check_output,
    check_plot,
    non_negative_float,
    positive_int,
)

HELP = "run the loaders side by side on the built-in sample dataset and print a table"

QUICK = {"num_images": 32, "batch_size": 8, "workers": 1, "size": 64, "seconds": 0.3, "rounds": 1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fastpipe.bench.variants import VARIANTS

    keys = ", ".join(v.key for v in VARIANTS)
    parser.add_argument("--root",
                        help="an ImageFolder directory to use instead of the sample dataset")
    parser.add_argument("--num-images", type=positive_int, default=None,
                        help="sample dataset size (default 256; with --device: 1024 on cuda, "
                        "256 on cpu, at least 3 x batch x workers; generated once and cached)")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="(default 32)")
    parser.add_argument("--workers", type=int, default=None,
                        help="num_workers (DataLoader processes, DALI threads) (default: the "
                             "usable cores)")
    parser.add_argument("--size", type=positive_int, default=None, help="crop size (default 224)")
    parser.add_argument("--seconds", type=non_negative_float, default=None,
                        help="seconds per loader and round, after its first batch (default 4)")
    parser.add_argument("--rounds", type=positive_int, default=None,
                        help="runs of every loader, interleaved; the median counts (default 2)")
    parser.add_argument("--step-ms", type=non_negative_float, default=10.0,
                        help="pause after each batch standing in for a GPU step (default 10)")
    parser.add_argument("--variants", default=None, help=f"comma-separated subset of: {keys}")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds: 32 small images, 1 worker, 0.3 s per loader, "
                        "1 round")
    parser.add_argument("--plot", metavar="FILE.png", help="save a bar chart of images/s")
    parser.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--no-progress", action="store_true", help=PROGRESS_HELP)
    model = parser.add_argument_group(
        "model step (--device)",
        "feed a real training step instead of a simulated one: images/s, data wait and GPU "
        "utilisation per loader; a table, and the JSON in --save")
    model.add_argument("--device", choices=("cuda", "cpu"), default=None,
                       help="run the loaders into a model step on this device")
    model.add_argument("--model", default=None,
                       help="a torchvision model name, or 'tiny' (default resnet50 on cuda, "
                       "tiny on cpu)")
    model.add_argument("--no-amp", action="store_true", help="float32 instead of mixed precision")
    model.add_argument("--save", metavar="FILE.json", default=None,
                       help="where to write the JSON (default fastpipe-bench-DEVICE.json)")
    model.add_argument("--budget", type=non_negative_float, default=None, metavar="SECONDS",
                       help="skip the loaders that would start after this many seconds, the "
                       "sample set's generation included (default 240 on cuda: with the GPU "
                       "kit's other checks it fits one 10-minute run; 540 on cpu)")


def _pick(value, quick: bool, key: str, default):
    if value is not None:
        return value
    return QUICK[key] if quick else default


def _command_line(args: argparse.Namespace) -> str:
    """The options that shape the measurement, to print beside the numbers."""
    words = ["fastpipe", "bench"] + (["--quick"] if args.quick else [])
    for option in ("root", "num_images", "batch_size", "workers", "size", "seconds", "rounds",
                   "variants", "budget"):
        value = getattr(args, option)
        if value is not None:
            words += [f"--{option.replace('_', '-')}", str(value)]
    if args.step_ms != 10.0:
        words += ["--step-ms", f"{args.step_ms:g}"]
    return shlex.join(words)


# Defaults of the model-step bench: per device, and for --quick.
# num_images None: at least 1,024, and 3 x batch x workers (fastpipe.bench.model_step).
# On CUDA, seven loaders of 15 s each after their start-up and warm-up, and the 12,288 sample
# images of 16 workers, fit the budget of 240 s.
MODEL_DEFAULTS = {
    "cuda": {"num_images": None, "batch_size": 256, "size": 224, "seconds": 15.0,
             "budget": 240.0},
    "cpu": {"num_images": None, "batch_size": 32, "size": 224, "seconds": 4.0, "budget": 540.0},
    "quick": {"num_images": 32, "batch_size": 8, "size": 64, "seconds": 0.3, "budget": 540.0},
}


def _run_model_step(args: argparse.Namespace) -> int:
    from fastpipe.bench.model_step import run_model_bench

    for option in ("rounds", "plot", "markdown"):
        if getattr(args, option) is not None:
            raise CommandError(f"--{option} applies to the simulated-step bench; leave it out "
                               "with --device")
    defaults = MODEL_DEFAULTS["quick" if args.quick else args.device]
    if args.workers is not None and args.workers < 0:
        raise CommandError(f"--workers must be >= 0, got {args.workers}")
    seconds = args.seconds if args.seconds is not None else defaults["seconds"]
    if seconds <= 0:
        raise CommandError(f"--seconds must be more than 0, got {seconds:g}")
    if args.root is not None and args.num_images is not None:
        raise CommandError("--num-images applies to the sample dataset; leave it out with --root")
    variants = None
    if args.variants is not None:
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    model = args.model or ("resnet50" if args.device == "cuda" else "tiny")
    save = args.save or f"fastpipe-bench-{args.device}.json"
    check_output(save, "JSON report")
    try:
        report = run_model_bench(
            args.root,
            device=args.device,
            model=model,
            num_images=args.num_images or defaults["num_images"],
            batch_size=args.batch_size or defaults["batch_size"],
            num_workers=1 if args.quick and args.workers is None else args.workers,
            size=args.size or defaults["size"],
            seconds=seconds,
            warmup=1 if args.quick else 5,
            amp=not args.no_amp,
            variants=variants,
            budget_seconds=args.budget if args.budget is not None else defaults["budget"],
            command=f"{_command_line(args)} --device {args.device} --model {model}",
        )
    except (FileNotFoundError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    report.to_json(save)
    if args.json:
        print(report.to_json())
    else:
        print(report)
        print(f"\njson: {save}")
    # A loader asked for by name that did not run measured nothing: a run that checks it (the GPU
    # kit) must not pass.
    missed = [row for row in report.rows if row.key in variants and row.skipped] if variants else []
    if missed:
        print("fastpipe bench: " + "; ".join(f"{row.key} did not run: {row.skipped}"
                                             for row in missed), file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    if args.device is not None:
        return _run_model_step(args)
    if args.budget is not None:
        raise CommandError("--budget applies to the model-step bench (--device)")
    from fastpipe.bench.suite import run_bench

    workers = _pick(args.workers, args.quick, "workers", None)
    if workers is not None and workers < 0:
        raise CommandError(f"--workers must be >= 0, got {workers}")
    seconds = _pick(args.seconds, args.quick, "seconds", 4.0)
    if seconds <= 0:
        raise CommandError(f"--seconds must be more than 0, got {seconds:g}")
    if args.size is not None and args.size < 8:
        raise CommandError(f"--size must be >= 8, got {args.size}")
    if args.root is not None and args.num_images is not None:
        raise CommandError("--num-images applies to the sample dataset; leave it out with --root")
    variants = None
    if args.variants is not None:
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    check_plot(args.plot)
    check_output(args.markdown, "Markdown table")
    try:
        report = run_bench(
            args.root,
            num_images=_pick(args.num_images, args.quick, "num_images", 256),
            batch_size=_pick(args.batch_size, args.quick, "batch_size", 32),
            num_workers=workers,
            size=_pick(args.size, args.quick, "size", 224),
            seconds=seconds,
            step_ms=args.step_ms,
            rounds=_pick(args.rounds, args.quick, "rounds", 2),
            variants=variants,
            min_batches=2 if args.quick else 3,
            progress=not args.no_progress,
            command=_command_line(args),
        )
    except (FileNotFoundError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    if args.plot:
        report.plot(args.plot)
    if args.markdown:
        report.to_markdown(args.markdown)
    if args.json:
        print(report.to_json())
    else:
        # Printed before the report's last line, its verdict.
        if any(r.skipped for r in report.rows):
            report.notes.append("skipped loaders need their parts installed or built; see "
                                "docs/dependencies.md")
        report.notes += [f"{what}: {path}" for path, what in
                         ((args.plot, "plot"), (args.markdown, "markdown")) if path]
        print(report)
    return 0
