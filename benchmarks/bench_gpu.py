"""The GPU half of fastpipe, measured in parts of a few seconds, one JSON line per part.

    python -m benchmarks.bench_gpu                          # every part, on the GPU
    python -m benchmarks.bench_gpu --parts h2d,ops --out gpu.jsonl
    python -m benchmarks.bench_gpu --device cpu --quick     # the smoke run of the tests

Parts (``--parts``, in this order):
  env           the machine: torch, the GPU, whether fastpipe's CUDA kernels serve it
  h2d           host-to-device GB/s of one 256x3x224x224 uint8 batch, from pinned and from
                pageable memory (wall time of each copy, the GPU synchronized after it)
  ops           each fastpipe.ops op on that batch against the eager torch expression it
                replaces (timm's and torchvision's, written here): GPU ms per call (CUDA events)
                and host ms per call (what the training thread pays, no synchronization)
  feed-2ms, feed-6ms, feed-resnet50
                a training loop fed from the same pinned uint8 batches three ways: the copy
                (and normalization) inside the step, the apex-style prefetcher of the reference
                scripts (one side stream, wait_stream), DataPrefetcher (depth 1 and 2, and from
                pageable memory); with a step of 2 ms and of 6 ms of GPU work
                (torch.cuda._sleep) and a ResNet-50 AMP channels_last training step: ms per
                step, and the share of the copy's time hidden behind the step (against the same
                step on batches already on the GPU)
  nosync        a DataPrefetcher epoch under torch.cuda.set_sync_debug_mode("error")

Every part runs even when one before it failed (its line then holds "error"); the exit code is
1 if any part failed, 2 for bad arguments. Variants of a part are timed in interleaved rounds in
this process (``_harness.interleaved``): the median, and the min-max of the rounds.

With ``--device cpu`` the same code runs on the CPU (no pinned memory, no streams, the steps are
host sleeps and the model ``tiny``): its numbers mean nothing, it checks that the benchmark runs.
It has run once on a GPU, an H200; its numbers are in docs/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import _harness
from fastpipe._constants import IMAGENET_MEAN as MEAN
from fastpipe._constants import IMAGENET_STD as STD

PARTS = ("env", "h2d", "ops", "feed-2ms", "feed-6ms", "feed-resnet50", "nosync")
NUM_CLASSES = 1000
ALONE = "on the device already (the step alone)"


@dataclass
class Config:
    device: torch.device
    batch_size: int
    size: int
    steps: int  # training steps per way and round (ResNet-50: a fifth)
    rounds: int
    reps: int  # calls per op and round
    model: str
    quick: bool

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch_size, 3, self.size, self.size)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


# ---- timing ---------------------------------------------------------------------------------

def synchronize(cfg: Config) -> None:
    if cfg.cuda:
        torch.cuda.synchronize(cfg.device)


def device_ms(cfg: Config, fn: Callable[[], object], reps: int) -> float:
    """Median device time of one call of ``fn`` in ms: CUDA events around each call, one
    synchronization after all of them (the host's clock on the CPU)."""
    if not cfg.cuda:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    pairs = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize(cfg.device)
    return statistics.median(start.elapsed_time(end) for start, end in pairs)


def host_ms(cfg: Config, fn: Callable[[], object], reps: int) -> float:
    """Median host time of one call of ``fn`` in ms, without synchronizing between calls."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    synchronize(cfg)
    return statistics.median(times)


def spread(values: list[float], scale: float = 1.0) -> dict[str, float]:
    """Median and min-max of one variant's rounds."""
    return {"median": round(statistics.median(values) * scale, 4),
            "min": round(min(values) * scale, 4), "max": round(max(values) * scale, 4)}


# ---- the parts ------------------------------------------------------------------------------

def part_env(cfg: Config) -> dict[str, Any]:
    from fastpipe import ops
    from fastpipe.ops import _extension

    info: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                            "device": str(cfg.device), "batch": list(cfg.shape),
                            "kernels": ops.extension_available(cfg.device),
                            "kernel_archs": _extension.CUDA_ARCHS}
    if cfg.cuda:
        props = torch.cuda.get_device_properties(cfg.device)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1))
    return info


def part_h2d(cfg: Config) -> dict[str, Any]:
    batch = torch.randint(0, 256, cfg.shape, dtype=torch.uint8)
    target = torch.empty(cfg.shape, dtype=torch.uint8, device=cfg.device)
    sources = {"pageable": batch}
    if cfg.cuda:
        sources["pinned"] = batch.pin_memory()

    def copy_of(source: torch.Tensor) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            for _ in range(cfg.reps):
                target.copy_(source, non_blocking=True)
                synchronize(cfg)
            return (time.perf_counter() - start) / cfg.reps
        return run

    rounds = _harness.interleaved({name: copy_of(s) for name, s in sources.items()}, cfg.rounds)
    gigabytes = batch.numel() / 1e9
    out: dict[str, Any] = {"megabytes": round(gigabytes * 1e3, 1)}
    for name, seconds in rounds.items():
        out[f"{name}_ms"] = spread(seconds, 1e3)
        out[f"{name}_gb_per_s"] = round(gigabytes / statistics.median(seconds), 2)
    return out


# Eager expressions the ops replace, as the reference scripts write them, on the batch's device.

def _eager_cutout_(x: torch.Tensor, size: int) -> torch.Tensor:
    """The Cutout paper's transform, one sample at a time, in place."""
    _, _, h, w = x.shape
    for i in range(x.shape[0]):
        y, c = random.randrange(h), random.randrange(w)
        x[i, :, max(y - size // 2, 0):min(y + size // 2, h),
          max(c - size // 2, 0):min(c + size // 2, w)] = 0
    return x


def _eager_erasing_(x: torch.Tensor, pixel: bool) -> torch.Tensor:
    """timm's RandomErasing(probability=1), one sample at a time, in place, values made on the
    batch's device (timm's device argument)."""
    n, c, h, w = x.shape
    log_ratio = (math.log(0.3), math.log(1 / 0.3))
    for i in range(n):
        for _ in range(10):
            area = random.uniform(0.02, 1 / 3) * h * w
            aspect = math.exp(random.uniform(*log_ratio))
            bh, bw = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if bh < h and bw < w:
                top, left = random.randint(0, h - bh), random.randint(0, w - bw)
                if pixel:
                    fill = torch.empty((c, bh, bw), dtype=x.dtype, device=x.device).normal_()
                else:
                    fill = torch.zeros((c, 1, 1), dtype=x.dtype, device=x.device)
                x[i, :, top:top + bh, left:left + bw] = fill
                break
    return x


def _smoothed(targets: torch.Tensor, smoothing: float = 0.1) -> torch.Tensor:
    off = smoothing / NUM_CLASSES
    y = torch.full((targets.shape[0], NUM_CLASSES), off, device=targets.device)
    return y.scatter_(1, targets.view(-1, 1), 1.0 - smoothing + off)


def _eager_mixup_(x: torch.Tensor, targets: torch.Tensor):
    """timm's Mixup in 'batch' mode: one lam, the batch blended with its reverse in place, the
    smoothed one-hot targets mixed alike."""
    lam = random.betavariate(0.4, 0.4)
    x.mul_(lam).add_(x.flip(0).mul_(1.0 - lam))
    y = _smoothed(targets)
    return x, y * lam + y.flip(0) * (1.0 - lam)


def _eager_cutmix_(x: torch.Tensor, targets: torch.Tensor):
    """timm's CutMix in 'batch' mode: one box from the reversed batch, in place."""
    _, _, h, w = x.shape
    lam = random.betavariate(1.0, 1.0)
    cut = math.sqrt(1.0 - lam)
    cy, cx = random.randrange(h), random.randrange(w)
    top, bottom = max(cy - int(h * cut) // 2, 0), min(cy + (int(h * cut) + 1) // 2, h)
    left, right = max(cx - int(w * cut) // 2, 0), min(cx + (int(w * cut) + 1) // 2, w)
    x[:, :, top:bottom, left:right] = x.flip(0)[:, :, top:bottom, left:right]
    lam = 1.0 - (bottom - top) * (right - left) / (h * w)
    y = _smoothed(targets)
    return x, y * lam + y.flip(0) * (1.0 - lam)


def _op_cases(cfg: Config) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (the fastpipe op, the eager expression it replaces), on one batch."""
    from fastpipe import ops

    g = torch.Generator().manual_seed(0)
    u8 = torch.randint(0, 256, cfg.shape, dtype=torch.uint8, generator=g).to(cfg.device)
    mean = torch.tensor(MEAN, device=cfg.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=cfg.device).view(1, 3, 1, 1)
    x = ops.normalize(u8, MEAN, STD, channels_last=True)  # the batch the random ops see
    half = x.half()
    targets = torch.randint(0, NUM_CLASSES, (cfg.batch_size,), generator=g).to(cfg.device)
    hole = max(1, cfg.size // 14)  # 16 pixels at 224
    cases = {
        "normalize uint8 -> float32": (
            lambda: ops.normalize(u8, MEAN, STD),
            lambda: (u8.float() / 255 - mean) / std),
        "normalize uint8 -> float16 channels_last": (
            lambda: ops.normalize(u8, MEAN, STD, dtype=torch.float16, channels_last=True),
            lambda: ((u8.float() / 255 - mean) / std).half().contiguous(
                memory_format=torch.channels_last)),
        f"cutout 1 hole of {hole}, in place": (
            lambda: ops.cutout(x, 1, hole, inplace=True),
            lambda: _eager_cutout_(x, hole)),
        "random_erasing p=1, zeros, in place": (
            lambda: ops.random_erasing(x, p=1.0, inplace=True),
            lambda: _eager_erasing_(x, pixel=False)),
        "random_erasing p=1, per-pixel noise, in place": (
            lambda: ops.random_erasing(x, p=1.0, value="random", inplace=True),
            lambda: _eager_erasing_(x, pixel=True)),
        "mixup float16, in place": (
            lambda: ops.mixup(half, targets, 0.4, NUM_CLASSES, 0.1, inplace=True),
            lambda: _eager_mixup_(half, targets)),
        "cutmix float16, in place": (
            lambda: ops.cutmix(half, targets, 1.0, NUM_CLASSES, 0.1, inplace=True),
            lambda: _eager_cutmix_(half, targets)),
    }
    try:
        from timm.data import Mixup as TimmMixup
    except ImportError:
        return cases
    ours = ops.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=NUM_CLASSES, inplace=True)
    theirs = TimmMixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=NUM_CLASSES)
    if cfg.batch_size % 2 == 0:  # timm asserts an even batch
        cases["Mixup (timm's arguments) against timm.data.Mixup, float16"] = (
            lambda: ours(half, targets), lambda: theirs(half, targets))
    return cases


def part_ops(cfg: Config) -> dict[str, Any]:
    rows = []
    for name, (ours, eager) in _op_cases(cfg).items():
        timed = {"fastpipe": ours, "eager": eager}
        for fn in timed.values():  # warm-up: kernels loaded, allocator primed
            fn()
        synchronize(cfg)
        rounds = _harness.interleaved(
            {k: (lambda fn=fn: device_ms(cfg, fn, cfg.reps) / 1e3) for k, fn in timed.items()},
            cfg.rounds, warmup=0)
        host = {k: host_ms(cfg, fn, cfg.reps) for k, fn in timed.items()}
        gpu = {k: statistics.median(v) * 1e3 for k, v in rounds.items()}
        rows.append({"case": name,
                     "device_ms": {k: round(v, 4) for k, v in gpu.items()},
                     "device_ms_spread": {k: spread(v, 1e3) for k, v in rounds.items()},
                     "host_ms": {k: round(v, 4) for k, v in host.items()},
                     "eager_over_fastpipe": round(gpu["eager"] / max(gpu["fastpipe"], 1e-9), 2)})
    return {"clock": "CUDA events" if cfg.cuda else "host", "cases": rows}


# ---- feeding a training step ----------------------------------------------------------------

def _cycles_per_ms() -> float:
    torch.cuda._sleep(1_000_000)  # the first launch loads the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def _sleep_step(cfg: Config, ms: float) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A step of ``ms`` of GPU work that reads its batch first (a host sleep on the CPU)."""
    if not cfg.cuda:
        def host_step(images, targets):
            images[0, 0, 0, 0].item()
            time.sleep(ms / 1e3)
        return host_step
    cycles = int(_cycles_per_ms() * ms)

    def step(images, targets):
        images.sum()  # reads the whole batch on the step's stream
        torch.cuda._sleep(cycles)
    return step


def _model_step(cfg: Config) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A training step: cfg.model in channels_last, autocast, cross-entropy, SGD."""
    from fastpipe.bench.model_step import build_model

    model = build_model(cfg.model, NUM_CLASSES).to(cfg.device,
                                                  memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(cfg.device.type, enabled=cfg.cuda)
    amp_dtype = torch.float16 if cfg.cuda else torch.bfloat16
    if cfg.cuda:
        torch.backends.cudnn.benchmark = True

    def step(images, targets):
        images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(cfg.device.type, dtype=amp_dtype):
            loss = torch.nn.functional.cross_entropy(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return step


class _ApexPrefetcher:
    """The data_prefetcher of NVIDIA apex's ImageNet example (and the reference scripts that
    copied it): one side stream, the copy and normalization there, wait_stream, record_stream."""

    def __init__(self, batches: list, device: torch.device) -> None:
        self.batches = iter(batches)
        self.stream = torch.cuda.Stream(device)
        self.mean = torch.tensor([m * 255 for m in MEAN], device=device).view(1, 3, 1, 1)
        self.std = torch.tensor([s * 255 for s in STD], device=device).view(1, 3, 1, 1)
        self.device = device
        self.preload()

    def preload(self) -> None:
        try:
            images, targets = next(self.batches)
        except StopIteration:
            self.images = self.targets = None
            return
        with torch.cuda.stream(self.stream):
            self.images = images.to(self.device, non_blocking=True).float().sub_(
                self.mean).div_(self.std)
            self.targets = targets.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator:
        while True:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            images, targets = self.images, self.targets
            if images is None:
                return
            images.record_stream(torch.cuda.current_stream(self.device))
            targets.record_stream(torch.cuda.current_stream(self.device))
            self.preload()
            yield images, targets


def _copy_in_step(batches: list, device: torch.device) -> Iterator:
    """The plain loop: each batch copied and normalized on the step's own stream."""
    mean = torch.tensor([m * 255 for m in MEAN], device=device).view(1, 3, 1, 1)
    std = torch.tensor([s * 255 for s in STD], device=device).view(1, 3, 1, 1)
    for images, targets in batches:
        yield (images.to(device, non_blocking=True).float().sub_(mean).div_(std),
               targets.to(device, non_blocking=True))


def _ways(cfg: Config, pinned: list, pageable: list, resident: list) -> dict[str, Callable]:
    """way -> a function of the batch list that yields normalized float batches on the device."""
    from fastpipe import DataPrefetcher

    def prefetcher(source: list, depth: int):
        return lambda: DataPrefetcher(source, device=cfg.device, mean=MEAN, std=STD,
                                      prefetch_depth=depth)

    ways = {
        ALONE: lambda: iter(resident),
        "copy inside the step": lambda: _copy_in_step(pinned, cfg.device),
    }
    if cfg.cuda:
        ways["apex-style prefetcher (side stream, wait_stream)"] = lambda: _ApexPrefetcher(
            pinned, cfg.device)
    ways["DataPrefetcher, depth 1"] = prefetcher(pinned, 1)
    ways["DataPrefetcher, depth 2"] = prefetcher(pinned, 2)
    ways["DataPrefetcher, depth 1, pageable memory"] = prefetcher(pageable, 1)
    return ways


def part_feed(cfg: Config, step_name: str) -> dict[str, Any]:
    model = step_name == "resnet50"
    steps = max(2, cfg.steps // 5) if model else cfg.steps
    step = _model_step(cfg) if model else _sleep_step(cfg, float(step_name.rstrip("ms")))
    # Four distinct batches, each in the three places, cycled over the steps.
    g = torch.Generator().manual_seed(0)
    pageable = [(torch.randint(0, 256, cfg.shape, dtype=torch.uint8, generator=g),
                 torch.randint(0, NUM_CLASSES, (cfg.batch_size,), generator=g))
                for _ in range(min(steps, 4))]
    pinned = [(x.pin_memory(), y.pin_memory()) for x, y in pageable] if cfg.cuda else pageable
    resident = list(_copy_in_step(pinned, cfg.device))
    synchronize(cfg)

    def cycled(batches: list) -> list:
        return (batches * steps)[:steps]

    ways = _ways(cfg, cycled(pinned), cycled(pageable), cycled(resident))

    def run(make: Callable) -> float:
        synchronize(cfg)
        start = time.perf_counter()
        count = 0
        for images, targets in make():
            step(images, targets)
            count += 1
        synchronize(cfg)
        assert count == steps, f"{count} batches for {steps}"
        return (time.perf_counter() - start) / steps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the pageable way's warning about unpinned batches
        rounds = _harness.interleaved({name: (lambda make=make: run(make))
                                       for name, make in ways.items()}, cfg.rounds)
    copy_ms = _copy_ms(cfg, pinned[0])
    alone = statistics.median(rounds[ALONE]) * 1e3
    rows = []
    for name, seconds in rounds.items():
        row: dict[str, Any] = {"way": name, "ms_per_step": spread(seconds, 1e3)}
        if name != ALONE:
            # The step's time beyond the step alone is copy time the way did not hide.
            exposed = max(0.0, statistics.median(seconds) * 1e3 - alone)
            row.update(exposed_copy_ms=round(exposed, 3),
                       hidden_share=round(min(1.0, max(0.0, 1 - exposed / copy_ms)), 3))
        rows.append(row)
    return {"step": step_name, "steps": steps, "batch": list(cfg.shape),
            "copy_and_normalize_ms": round(copy_ms, 3), "ways": rows}


def _copy_ms(cfg: Config, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The time the copy of one batch and its normalization take alone, in ms."""
    def once():
        for pair in _copy_in_step([batch], cfg.device):
            del pair
    once()
    synchronize(cfg)
    start = time.perf_counter()
    for _ in range(cfg.reps):
        once()
        synchronize(cfg)
    return (time.perf_counter() - start) / cfg.reps * 1e3


def part_nosync(cfg: Config) -> dict[str, Any]:
    if not cfg.cuda:
        return {"skipped": "torch's sync debug mode needs CUDA"}
    from fastpipe import DataPrefetcher

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, cfg.shape, dtype=torch.uint8, generator=g).pin_memory(),
                torch.full((cfg.batch_size,), i).pin_memory()) for i in range(6)]
    for _ in DataPrefetcher(batches[:2], device=cfg.device, mean=MEAN, std=STD):
        pass  # warm-up: the statistics copied once, the kernels loaded
    synchronize(cfg)
    torch.cuda.set_sync_debug_mode("error")
    try:
        count = sum(1 for _ in DataPrefetcher(batches, device=cfg.device, mean=MEAN, std=STD))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"batches": count, "synchronized": False}


RUNNERS: dict[str, Callable[[Config], dict[str, Any]]] = {
    "env": part_env, "h2d": part_h2d, "ops": part_ops,
    "feed-2ms": lambda cfg: part_feed(cfg, "2ms"), "feed-6ms": lambda cfg: part_feed(cfg, "6ms"),
    "feed-resnet50": lambda cfg: part_feed(cfg, "resnet50"), "nosync": part_nosync,
}


# ---- the command ----------------------------------------------------------------------------

def parse(argv: list[str] | None) -> tuple[Config, list[str], Path | None]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default), or cpu for a smoke run whose numbers mean nothing")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, from: {', '.join(PARTS)} (default: all)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="(default 256; --quick 8)")
    parser.add_argument("--size", type=int, default=None, help="(default 224; --quick 32)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per way and round; ResNet-50 a fifth (default 30; "
                        "--quick 3)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds; the median counts (default 3; --quick 1)")
    parser.add_argument("--model", default=None,
                        help="the model of feed-resnet50: a torchvision name or tiny (default "
                        "resnet50; tiny on the CPU)")
    parser.add_argument("--quick", action="store_true", help="small batches, few repeats")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE.jsonl",
                        help="also append the lines to this file")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        parser.error(f"--parts: unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    quick = args.quick
    batch_size = args.batch_size if args.batch_size is not None else (8 if quick else 256)
    size = args.size if args.size is not None else (32 if quick else 224)
    steps = args.steps if args.steps is not None else (3 if quick else 30)
    rounds = args.rounds if args.rounds is not None else (1 if quick else 3)
    for name, value, low in (("--batch-size", batch_size, 2), ("--size", size, 16),
                             ("--steps", steps, 2), ("--rounds", rounds, 1)):
        if value < low:
            parser.error(f"{name} must be at least {low}, got {value}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here; --device cpu --quick runs the "
                     "benchmark's code on the CPU (a smoke run)")
    if args.out is not None and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: the folder {args.out.parent} does not exist")
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    model = args.model or ("resnet50" if args.device == "cuda" else "tiny")
    cfg = Config(device=device, batch_size=batch_size, size=size, steps=steps, rounds=rounds,
                 reps=3 if quick else 20, model=model, quick=quick)
    return cfg, parts, args.out


def main(argv: list[str] | None = None) -> int:
    cfg, parts, out = parse(argv)
    if "feed-resnet50" in parts:
        from fastpipe.bench.model_step import build_model

        try:
            build_model(cfg.model)  # an unknown name fails before any part runs
        except (ValueError, ImportError) as error:
            print(f"python -m benchmarks.bench_gpu: error: --model: {error}", file=sys.stderr)
            return 2
    failed = False
    for part in PARTS:
        if part not in parts:
            continue
        started = time.perf_counter()
        try:
            line = {"part": part, **RUNNERS[part](cfg)}
        except Exception:  # noqa: BLE001 - reported on the part's line; the next part runs
            failed = True
            line = {"part": part, "error": traceback.format_exc(limit=4)[-1500:]}
        line["seconds"] = round(time.perf_counter() - started, 2)
        text = json.dumps(line)
        print(text, flush=True)
        if out is not None:
            with out.open("a") as f:
                f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
