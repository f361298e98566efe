"""fastpipe.ops on the CPU: the compiled op vs the pure-PyTorch reference vs per-sample Python
loops.

For each op on a 64x3x224x224 batch (by default):
  * ``ext``: the compiled kernel (fastpipe._C), as fastpipe.ops calls it;
  * ``ref``: the same public function on the pure-PyTorch reference (what runs without the
    extension);
  * ``loop``: how it is done today, written here (not imported): timm's RandomErasing per-sample
    loop (in place, no copy), the Cutout paper's per-sample loop, timm's Mixup 'elem' loop, and for
    normalize timm's PrefetchLoader expression ``x.float().sub_(mean).div_(std)``;
  * GB/s: bytes read plus bytes written by the functional op, over its time, against a ``clone()``
    of a tensor like the op's output, the memory-bandwidth ceiling.
Targets: ext >= 5x loop, ext >= 2x ref, and >= half of clone's GB/s for cutout,
random_erasing and normalize.

Allocator: glibc gives every freed block over its mmap threshold (at most 32 MiB) back to the
system, so with its defaults a new 38 MB float32 batch is often fresh pages that the kernel zeroes
as they are first written (whether it is depends on what the process allocated before), and a
clone() then measures page faults rather than memory bandwidth.
``--keep-memory`` runs the benchmark with glibc keeping freed memory for reuse (MALLOC_MMAP_MAX_=0,
MALLOC_TRIM_THRESHOLD_=4 GiB), as jemalloc, tcmalloc and PyTorch's CUDA caching allocator do;
every op and baseline in that run uses the same allocator.

Every variant of a row is timed in the same rounds, in one process (``_harness.interleaved``).

    python -m benchmarks.bench_ops                      # full run (about two minutes on 2 cores)
    python -m benchmarks.bench_ops --keep-memory        # the same, allocator keeping freed memory
    python -m benchmarks.bench_ops --quick              # smoke run: small batch, few repeats
    python -m benchmarks.bench_ops --markdown docs/ops-benchmark.md
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import fastpipe.ops as ops
from benchmarks import _harness
from fastpipe._constants import IMAGENET_MEAN as MEAN
from fastpipe._constants import IMAGENET_STD as STD
from fastpipe.ops import _extension

# glibc's environment settings (read once, at process start) that keep freed memory for reuse.
KEEP_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}

# ---- baselines, written the way they are used today ----


def timm_random_erasing_(
    x: torch.Tensor, p=0.5, min_area=0.02, max_area=1 / 3, min_aspect=0.3, mode="const"
):
    """timm.data.RandomErasing.__call__ on a batch: a Python loop over samples, in place."""
    batch, chan, img_h, img_w = x.shape
    log_ratio = (math.log(min_aspect), math.log(1 / min_aspect))
    for i in range(batch):
        if random.random() > p:
            continue
        area = img_h * img_w
        for _ in range(10):
            target_area = random.uniform(min_area, max_area) * area
            aspect = math.exp(random.uniform(*log_ratio))
            h = int(round(math.sqrt(target_area * aspect)))
            w = int(round(math.sqrt(target_area / aspect)))
            if w < img_w and h < img_h:
                top = random.randint(0, img_h - h)
                left = random.randint(0, img_w - w)
                if mode == "pixel":
                    fill = torch.empty((chan, h, w), dtype=x.dtype).normal_()
                else:
                    fill = torch.zeros((chan, 1, 1), dtype=x.dtype)
                x[i, :, top : top + h, left : left + w] = fill
                break
    return x


def cutout_loop_(x: torch.Tensor, num_holes=1, size=16):
    """The Cutout paper's transform applied per sample, in place."""
    _, _, h, w = x.shape
    for i in range(x.shape[0]):
        for _ in range(num_holes):
            y, xc = random.randrange(h), random.randrange(w)
            y1, y2 = max(y - size // 2, 0), min(y + size // 2, h)
            x1, x2 = max(xc - size // 2, 0), min(xc + size // 2, w)
            x[i, :, y1:y2, x1:x2] = 0
    return x


def timm_mixup_elem(x: torch.Tensor, alpha=1.0):
    """timm's Mixup in 'elem' mode: a per-sample loop over a clone."""
    x_orig = x.clone()
    batch = x.shape[0]
    for i in range(batch):
        lam = random.betavariate(alpha, alpha)
        x[i] = x[i] * lam + x_orig[batch - i - 1] * (1 - lam)
    return x


def timm_cutmix_elem(x: torch.Tensor, alpha=1.0):
    """timm's CutMix in 'elem' mode: a per-sample loop over a clone."""
    x_orig = x.clone()
    batch, _, h, w = x.shape
    for i in range(batch):
        lam = random.betavariate(alpha, alpha)
        ratio = math.sqrt(1 - lam)
        cut_h, cut_w = int(h * ratio), int(w * ratio)
        cy, cx = random.randrange(h), random.randrange(w)
        yl, yh = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
        xl, xh = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
        x[i][:, yl:yh, xl:xh] = x_orig[batch - i - 1][:, yl:yh, xl:xh]
    return x


def timm_prefetch_normalize(x: torch.Tensor):
    """timm's PrefetchLoader: mean and std in 0-255, uint8 batch to float, vectorized."""
    mean = torch.tensor([m * 255 for m in MEAN]).view(1, 3, 1, 1)
    std = torch.tensor([s * 255 for s in STD]).view(1, 3, 1, 1)
    return x.float().sub_(mean).div_(std)


def normalize_loop(x: torch.Tensor):
    """torchvision's per-sample ToTensor-style scaling and Normalize, one image at a time."""
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return torch.stack([(img.float().div(255) - mean) / std for img in x])


def timm_mixup_batch_(x: torch.Tensor, alpha=1.0):
    """timm's Mixup in 'batch' mode: one lambda, vectorized, in place (float only)."""
    lam = random.betavariate(alpha, alpha)
    x_flipped = x.flip(0).mul_(1.0 - lam)
    return x.mul_(lam).add_(x_flipped)


def timm_cutmix_batch_(x: torch.Tensor, alpha=1.0):
    """timm's CutMix in 'batch' mode: one box, vectorized, in place."""
    _, _, h, w = x.shape
    ratio = math.sqrt(1 - random.betavariate(alpha, alpha))
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    cy, cx = random.randrange(h), random.randrange(w)
    yl, yh = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
    xl, xh = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
    x[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
    return x


# ---- timing ----


def interleaved_ms(
    timed: dict[str, Callable[[], float]], repeat: int, warmup: int = 1
) -> dict[str, float]:
    """Median milliseconds of each timed function over ``repeat`` interleaved rounds.

    The machine's speed drifts (other virtual machines on the host), so the variants of one case
    are timed in the same rounds and their ratios compare like with like.
    """
    rounds = _harness.interleaved(timed, repeat, warmup)
    return {name: statistics.median(values) * 1e3 for name, values in rounds.items()}


def timed_call(fn: Callable[[], object]) -> Callable[[], float]:
    """Seconds one call of fn takes."""

    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


def timed_on_fresh_copy(
    fn: Callable[[torch.Tensor], object], images: torch.Tensor
) -> Callable[[], float]:
    """Seconds fn takes on a fresh copy of images (for in-place functions), the copy untimed."""

    def run() -> float:
        x = images.clone()
        start = time.perf_counter()
        fn(x)
        return time.perf_counter() - start

    return run


def on_reference(fn: Callable[[], object]) -> Callable[[], object]:
    """Runs a fastpipe.ops call on the pure-PyTorch reference, as without the extension."""

    def run():
        saved = _extension.KERNELS, _extension._warned
        _extension.KERNELS, _extension._warned = frozenset(), True
        try:
            return fn()
        finally:
            _extension.KERNELS, _extension._warned = saved

    return run


def cases(batch: int, size: int) -> list[dict]:
    """One dict per benchmark row: the op (functional and, for erasing, in place) and baselines."""
    g = torch.Generator().manual_seed(0)
    u8 = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=g)
    f32 = torch.rand(batch, 3, size, size, generator=g)
    targets = torch.randint(0, 1000, (batch,), generator=g)
    hole = max(1, size // 4)
    rows = []
    for x in (u8, f32):
        rows.append(
            dict(
                op=f"cutout (1 hole of {hole}x{hole})",
                images=x,
                ext=lambda x=x: ops.cutout(x, 1, hole),
                inplace=lambda x: ops.cutout(x, 1, hole, inplace=True),
                loop=lambda x: cutout_loop_(x, 1, hole),
                loop_label="Cutout paper's transform, per-sample loop, in place",
            )
        )
        rows.append(
            dict(
                op="random_erasing",
                images=x,
                ext=lambda x=x: ops.random_erasing(x),
                inplace=lambda x: ops.random_erasing(x, inplace=True),
                loop=timm_random_erasing_,
                loop_label="timm RandomErasing, per-sample loop, in place",
            )
        )
    rows.append(
        dict(
            op="random_erasing value='random'",
            images=f32,
            ext=lambda: ops.random_erasing(f32, value="random"),
            inplace=lambda x: ops.random_erasing(x, value="random", inplace=True),
            loop=lambda x: timm_random_erasing_(x, mode="pixel"),
            loop_label="timm RandomErasing mode='pixel', per-sample loop, in place",
        )
    )
    rows.append(
        dict(
            op="normalize to float32",
            images=u8,
            ext=lambda: ops.normalize(u8, MEAN, STD),
            loop=normalize_loop,
            loop_label="per-sample float / 255, Normalize (torchvision-style), stacked",
            vectorized=timm_prefetch_normalize,
            vectorized_label="timm PrefetchLoader x.float().sub_(mean).div_(std)",
        )
    )
    rows.append(
        dict(
            op="normalize to float16 channels_last",
            images=u8,
            ext=lambda: ops.normalize(u8, MEAN, STD, torch.float16, channels_last=True),
            loop=lambda x: normalize_loop(x).half().contiguous(memory_format=torch.channels_last),
            loop_label="per-sample Normalize, then .half() and channels_last",
            vectorized=lambda x: (
                timm_prefetch_normalize(x).half().contiguous(memory_format=torch.channels_last)
            ),
            vectorized_label="timm PrefetchLoader, then .half() and channels_last",
        )
    )
    for x in (u8, f32):
        rows.append(
            dict(
                op="mixup",
                images=x,
                ext=lambda x=x: ops.mixup(x, targets, 0.2, 1000),
                inplace=lambda x: ops.mixup(x, targets, 0.2, 1000, inplace=True),
                loop=timm_mixup_elem,
                loop_label="timm Mixup mode='elem', per-sample loop",
                vectorized=timm_mixup_batch_ if x.dtype == torch.float32 else None,
                vectorized_label="timm Mixup mode='batch', in place (float only)",
            )
        )
        rows.append(
            dict(
                op="cutmix",
                images=x,
                ext=lambda x=x: ops.cutmix(x, targets, 1.0, 1000),
                inplace=lambda x: ops.cutmix(x, targets, 1.0, 1000, inplace=True),
                loop=timm_cutmix_elem,
                loop_label="timm CutMix mode='elem', per-sample loop",
                vectorized=timm_cutmix_batch_,
                vectorized_label="timm CutMix mode='batch', in place",
            )
        )
    return rows


TARGET_BANDWIDTH = ("cutout", "random_erasing", "normalize")


def run(batch: int, size: int, repeat: int) -> list[dict]:
    results = []
    for case in cases(batch, size):
        images = case["images"]
        result = case["ext"]()
        output = result[0] if isinstance(result, tuple) else result
        # Bytes the functional op must touch: read the batch, write a new one. Its ceiling is a
        # clone() of a tensor like its output: both allocate (and page-fault) the same memory.
        moved_bytes = images.nbytes + output.nbytes
        row = dict(op=case["op"], dtype=str(images.dtype).replace("torch.", ""))
        timed = {
            "clone_ms": timed_call(output.clone),
            "ext_ms": timed_call(case["ext"]),
            "ref_ms": timed_call(on_reference(case["ext"])),
            "loop_ms": timed_on_fresh_copy(case["loop"], images),
        }
        if "inplace" in case:
            timed["inplace_ms"] = timed_on_fresh_copy(case["inplace"], images)
        if case.get("vectorized"):
            timed["vectorized_ms"] = timed_on_fresh_copy(case["vectorized"], images)
        row.update(inplace_ms=None, vectorized_ms=None)
        row.update(interleaved_ms(timed, repeat))
        row["loop_label"] = case["loop_label"]
        row["vectorized_label"] = case.get("vectorized_label") if case.get("vectorized") else None
        # In-place ops are compared with the in-place loops, functional ones with the rest.
        row["vs_loop"] = row["loop_ms"] / (row["inplace_ms"] or row["ext_ms"])
        row["vs_ref"] = row["ref_ms"] / row["ext_ms"]
        row["gbps"] = moved_bytes / row["ext_ms"] / 1e6
        row["clone_gbps"] = 2 * output.nbytes / row["clone_ms"] / 1e6
        row["of_clone"] = row["gbps"] / row["clone_gbps"]
        checks = [row["vs_loop"] >= 5, row["vs_ref"] >= 2]
        if row["op"].startswith(TARGET_BANDWIDTH):
            checks.append(row["of_clone"] >= 0.5)
        row["targets"] = "yes" if all(checks) else "no"
        results.append(row)
        extra = f" in place {row['inplace_ms']:7.2f} ms" if row["inplace_ms"] is not None else ""
        print(
            f"{row['op']:36s} {row['dtype']:8s} ext {row['ext_ms']:7.2f} ms{extra}  ref "
            f"{row['ref_ms']:7.2f} ms  loop {row['loop_ms']:7.2f} ms  x{row['vs_loop']:.1f} loop  "
            f"x{row['vs_ref']:.1f} ref  {row['gbps']:.1f} GB/s = {row['of_clone']:.0%} of clone  "
            f"targets met: {row['targets']}",
            flush=True,
        )
    return results


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def keeps_memory() -> bool:
    """Whether this process runs with glibc keeping freed memory (``--keep-memory``)."""
    return all(os.environ.get(name) == value for name, value in KEEP_MEMORY.items())


def allocator_description() -> str:
    if keeps_memory():
        settings = " ".join(f"{name}={value}" for name, value in KEEP_MEMORY.items())
        return f"glibc keeping freed memory for reuse ({settings})"
    return (
        "glibc's defaults (a freed block over 32 MiB goes back to the system: a new float32 "
        "batch is often fresh pages, faulted in as it is written)"
    )


def markdown(results: list[dict], batch: int, size: int, repeat: int) -> str:
    lines = [
        f"Batch {batch}x3x{size}x{size} on the CPU, median of {repeat} rounds (each round runs "
        "every variant of a row once, so a row's ratios compare runs made under the same "
        f"conditions); {torch.get_num_threads()} torch threads. Machine: {_harness.machine()}. "
        f"Allocator: {allocator_description()}.",
        "",
        "| op | dtype | C++ op (ms) | C++ in place (ms) | reference (ms) | per-sample loop (ms) "
        "| vectorized torch (ms) | x loop | x reference | GB/s | clone() (ms) | of clone() "
        "| targets met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['op']} | {r['dtype']} | {_ms(r['ext_ms'])} | {_ms(r['inplace_ms'])} | "
            f"{_ms(r['ref_ms'])} | {_ms(r['loop_ms'])} | {_ms(r['vectorized_ms'])} | "
            f"{r['vs_loop']:.1f} | {r['vs_ref']:.1f} | {r['gbps']:.1f} | {_ms(r['clone_ms'])} | "
            f"{r['of_clone']:.0%} | {r['targets']} |"
        )
    lines += [
        "",
        "- C++ op: the functional op (a new tensor); C++ in place: `inplace=True`. x loop compares "
        "the in-place op with the loops, which change the batch in place as timm's RandomErasing "
        "and Mixup do (normalize: the functional op); "
        "x reference compares the functional op with the same call on the pure-PyTorch reference.",
        "- GB/s: bytes the functional op reads and writes, over its time; of clone(): against the "
        "GB/s of a `clone()` of a tensor like the op's output (same size and dtype: the same "
        "allocation). Targets: x loop >= 5, x reference >= 2, and >= 50% of clone() for cutout, "
        "random_erasing and normalize.",
        "- Per-sample loops:",
    ]
    for label in dict.fromkeys(r["loop_label"] for r in results):
        lines.append(f"  - {label}")
    lines.append("- Vectorized torch:")
    for label in dict.fromkeys(r["vectorized_label"] for r in results if r["vectorized_label"]):
        lines.append(f"  - {label}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_ops",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: batch 8 of 64x64, 3 repeats"
    )
    parser.add_argument(
        "--markdown", type=Path, default=None, help="write the results table to this file"
    )
    parser.add_argument(
        "--keep-memory",
        action="store_true",
        help="run with glibc keeping freed memory for reuse (re-runs this benchmark with "
        + " ".join(f"{name}={value}" for name, value in KEEP_MEMORY.items())
        + "), so that clone() measures memory bandwidth rather than page faults",
    )
    args = parser.parse_args(argv)
    if args.keep_memory and not keeps_memory():
        if platform.libc_ver()[0] != "glibc":
            parser.error("--keep-memory sets glibc's malloc settings; this Python is not on glibc")
        # glibc reads these settings when a process starts: the benchmark runs in a new one.
        script_args = sys.argv[1:] if argv is None else list(argv)
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_ops", *script_args],
            cwd=_harness.REPO,
            env={**os.environ, **KEEP_MEMORY},
            check=False,
        )
        return child.returncode
    print(f"allocator: {allocator_description()}", flush=True)
    if args.quick:
        args.batch, args.size, args.repeat = 8, 64, 3
    if args.threads:
        torch.set_num_threads(args.threads)
    if not ops.extension_available("cpu"):
        print(
            f"fastpipe._C is not available ({_extension._LOAD_PROBLEM}): {_extension.BUILD_HINT}",
            file=sys.stderr,
        )
        return 1
    random.seed(0)
    torch.manual_seed(0)
    results = run(args.batch, args.size, args.repeat)
    _harness.finish(markdown(results, args.batch, args.size, args.repeat), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
