"""``fastpipe bench --device``: the loaders side by side feeding a real training step.

Each loader of :data:`fastpipe.bench.variants.VARIANTS` (with DALI decoding on the GPU when the
device is CUDA, and the ``fastpipe.image_loader`` factory when this fastpipe has it) feeds the
same model step: a torchvision model (ResNet-50 by default) in ``channels_last`` with automatic
mixed precision (float16 on CUDA, bfloat16 on the CPU), cross-entropy on synthetic labels, SGD.
Per loader: images/s, the data-wait share, and the GPU utilisation. The times come from
:func:`fastpipe.profile`, which on CUDA reads CUDA events (the device's view, no synchronization
in the loop); the utilisation is NVML's (``torch.cuda.utilization``, when ``pynvml`` is
installed), else the share of device time not spent waiting for data.

It never ran on a GPU where it was written: the CPU version (``--device cpu --model tiny``) is
what the tests run.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fastpipe._constants import DEFAULT_SIZE
from fastpipe._hardware import usable_cores
from fastpipe.bench.machine import describe_machine
from fastpipe.bench.report import BenchReport, loader_table, workers
from fastpipe.bench.variants import (
    VARIANTS,
    BenchConfig,
    Skip,
    Variant,
)
from fastpipe.profiling._table import Column, Row

NUM_CLASSES = 1000

# The workload the bench needs per epoch: with fewer batches than 2 x workers, some DataLoader
# workers never work and every epoch starts with cold workers, a cost DALI's epoch-spanning
# reader never pays, so the ratios would measure the epoch boundary. The default dataset gives
# every worker three batches per epoch.
MIN_BATCHES_PER_WORKER = 2
DEFAULT_BATCHES_PER_WORKER = 3


def default_num_images(batch_size: int, num_workers: int, floor: int = 1024) -> int:
    """The sample dataset's size: ``floor`` images, or ``3 x batch x workers`` if more."""
    return max(floor, DEFAULT_BATCHES_PER_WORKER * batch_size * max(1, num_workers))


def check_workload(num_images: int, batch_size: int, num_workers: int) -> None:
    """Refuses an epoch of fewer than ``2 x workers`` batches (see MIN_BATCHES_PER_WORKER)."""
    batches = -(-num_images // batch_size)
    needed = MIN_BATCHES_PER_WORKER * max(1, num_workers)
    if batches < needed:
        raise ValueError(
            f"{num_images} images in batches of {batch_size} make {batches} batches per epoch, "
            f"fewer than 2 x {max(1, num_workers)} workers = {needed}: some workers would never "
            "work and every epoch would start cold, which inflates the ratios against DALI. Use "
            f"at least {needed * batch_size} images (the default is "
            f"{DEFAULT_BATCHES_PER_WORKER} x batch x workers = "
            f"{DEFAULT_BATCHES_PER_WORKER * batch_size * max(1, num_workers)}; --num-images, or "
            "a larger --root), a smaller --batch-size, or fewer --workers"
        )


def _utilization(row: Row) -> str:
    value = row.extra.get("gpu_utilization")
    if value is None:
        return "-"
    # ~: the share of device time not spent waiting for data, where NVML gave no number.
    return ("~" if row.extra.get("utilization_source") == "events" else "") + f"{value:.0%}"


# --- the model step ------------------------------------------------------------------------------

def tiny_model(num_classes: int = NUM_CLASSES) -> torch.nn.Module:
    """A two-convolution network: a model step that costs little, for CPU runs and tests."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


def build_model(name: str, num_classes: int = NUM_CLASSES) -> torch.nn.Module:
    """``"tiny"`` or a torchvision model name (``torchvision.models.list_models()``)."""
    if name == "tiny":
        return tiny_model(num_classes)
    from fastpipe._optional import require

    require("torchvision", extra="bench", feature="the torchvision models of fastpipe bench")
    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)
    if name not in known:
        raise ValueError(f"unknown model {name!r}; use 'tiny' or one of: {', '.join(known)}")
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


class TrainStep:
    """One training step on ``device``: channels_last, autocast, cross-entropy, SGD.

    Takes the loader's batch wherever it is (host batches are copied, non-blocking from pinned
    memory) and returns without synchronizing, as a training loop does.
    """

    def __init__(self, model: str, device: torch.device, batch_size: int, amp: bool = True,
                 channels_last: bool = True, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.device = device
        self.channels_last = channels_last
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.model = build_model(model).to(device, memory_format=self.memory_format).train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        self.amp = amp
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp and device.type == "cuda")
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, NUM_CLASSES, (batch_size,), generator=generator).to(device)

    def __call__(self, images: torch.Tensor) -> None:
        images = images.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        images = images.contiguous(memory_format=self.memory_format)
        targets = self.targets[: images.shape[0]]
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
            loss = torch.nn.functional.cross_entropy(self.model(images), targets)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()


# --- the loaders ---------------------------------------------------------------------------------

def _build_dali_gpu(config: BenchConfig) -> Any:
    from fastpipe._doctor import nvjpeg_state
    from fastpipe.dali import DALILoader

    nvjpeg = nvjpeg_state()
    if nvjpeg["loads"] is False:
        # The row would time libjpeg-turbo under the name of the GPU decode.
        raise Skip(nvjpeg["problem"])
    # The whole-image decode, image_loader's default: the fused random-crop decode may crash
    # the process (NVIDIA/nvImageCodec#55), and with it every row after this one.
    return DALILoader(str(config.root), batch_size=config.batch_size, train=True,
                      size=config.size, num_workers=max(1, config.num_workers), device="cuda",
                      crop_decode=False)


# The CPU cores GPU decode's second row gives its workers: the goal is that GPU decode
# with 4 cores feeds 90% of what the CPU path feeds with all of them.
GPU_DECODE_FEW_WORKERS = 4
GPU_DECODE_KEYS = ("gpu-decode", "gpu-decode-4")


def _build_gpu_decode(config: BenchConfig, workers: int | None = None) -> Any:
    """The fast CPU path with decode='gpu': the workers read bytes and draw crops, the
    DataPrefetcher decodes, resizes and flips on the GPU with nvImageCodec. Skipped where
    nvImageCodec is missing or cannot load nvJPEG: the row would time CPU decodes under the GPU
    decode's name."""
    from fastpipe._constants import IMAGENET_MEAN, IMAGENET_STD
    from fastpipe._doctor import nvjpeg_state
    from fastpipe.data import ImageFolder, fast_collate
    from fastpipe.gpu_decode import GpuDecode, available_backends
    from fastpipe.loader import DataLoaderX
    from fastpipe.prefetch import DataPrefetcher

    problem = available_backends()["nvimgcodec"]
    if problem is not None:
        raise Skip(f"nvImageCodec: {problem}")
    nvjpeg = nvjpeg_state()
    if nvjpeg["loads"] is False:
        raise Skip(nvjpeg["problem"])
    num_workers = config.num_workers if workers is None else min(workers, config.num_workers)
    dataset = ImageFolder(str(config.root), train=True, size=config.size, decode="gpu")
    loader = DataLoaderX(dataset, collate_fn=fast_collate, batch_size=config.batch_size,
                         shuffle=True, num_workers=num_workers,
                         persistent_workers=num_workers > 0, pin_memory=True)
    return DataPrefetcher(loader, device="cuda", mean=IMAGENET_MEAN, std=IMAGENET_STD,
                          gpu_decode=GpuDecode(backend="nvimgcodec"))


def gpu_decode_problem(stats: dict[str, Any] | None) -> str | None:
    """Why a GPU decode row did not time GPU decode (None: it did): no encoded batch reached the
    decoder, or none of its images was decoded on the GPU (every one fell back to the CPU: the
    reasons counted in ``stats``)."""
    if stats is None:
        return "failed: GPU decode decoded no batch (the loader handed over no encoded images)"
    if stats["gpu"] == 0:
        return (f"failed: none of its {stats['cpu']} image(s) was decoded on the GPU, so the row "
                f"timed the CPU decoder ({_fallback_reasons(stats)})")
    return None


def _fallback_reasons(stats: dict[str, Any]) -> str:
    reasons = sorted(stats["fallback_reasons"].items(), key=lambda kv: -kv[1])
    return "; ".join(f"{count}: {reason}" for reason, count in reasons) or "no reason recorded"


def model_variants(device: torch.device) -> list[Variant]:
    """The loaders of the suite (the factory ``fastpipe.image_loader`` among them) for
    ``device``: on CUDA, DALI decodes on the GPU, and the two rows of GPU decode (nvImageCodec
    in DataPrefetcher: every worker, and 4) come after the fast CPU path."""
    chosen = []
    for variant in VARIANTS:
        if variant.key == "dali" and device.type == "cuda":
            variant = Variant("dali", "DALI (mixed decode)",
                              "fastpipe.dali.DALILoader(device='cuda', crop_decode=False): "
                              "nvJPEG decode and augmentation on the GPU", _build_dali_gpu)
        chosen.append(variant)
        if variant.key == "fast-cpu" and device.type == "cuda":
            chosen.append(Variant(
                "gpu-decode", "GPU decode (nvImageCodec)",
                "fastpipe.data.ImageFolder(decode='gpu') + fast_collate, DataLoaderX + "
                "DataPrefetcher: the workers read bytes and draw crops, nvImageCodec decodes "
                "and fastpipe's kernel resizes on the GPU", _build_gpu_decode))
            chosen.append(Variant(
                "gpu-decode-4", f"GPU decode (nvImageCodec), {GPU_DECODE_FEW_WORKERS} workers",
                f"the same with {GPU_DECODE_FEW_WORKERS} workers (or fewer if fewer are asked): "
                "what GPU decode feeds from a few cores",
                lambda config: _build_gpu_decode(config, GPU_DECODE_FEW_WORKERS)))
    return chosen


def _images_of(batch: Any) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        for key in ("image", "images", "input", "inputs"):
            if key in batch:
                return batch[key]
        return next(v for v in batch.values() if isinstance(v, torch.Tensor))
    return batch[0]


class _Utilization:
    """NVML's GPU utilisation, sampled by a thread while the timed loop runs (pynvml needed)."""

    def __init__(self, device: torch.device, every: float = 0.2) -> None:
        self.device, self.every = device, every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def available(device: torch.device) -> bool:
        return device.type == "cuda" and importlib.util.find_spec("pynvml") is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fastpipe-bench-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.samples.append(torch.cuda.utilization(self.device) / 100.0)
            except Exception:  # noqa: BLE001 - NVML may refuse (containers): no number then
                return

    def stop(self) -> float | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return sum(self.samples) / len(self.samples) if self.samples else None


def run_model_variant(variant: Variant, config: BenchConfig, step: TrainStep, seconds: float,
                      warmup: int) -> Row:
    """Feeds ``step`` from ``variant``'s loader for ``seconds`` after ``warmup`` batches."""
    from fastpipe.profiling import profile
    from fastpipe.profiling._runner import close_loader, epochs, measured_row

    row = Row(variant.name, key=variant.key, description=variant.description)
    try:
        loader = variant.build(config)
    except (ImportError, Skip, RuntimeError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        row.skipped = reason
        return row
    device = step.device
    prof = profile(warmup=warmup, device=device, report=False)
    utilization = _Utilization(device) if _Utilization.available(device) else None
    batches = epochs(loader)
    counted, deadline, started = 0, None, time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            for index, batch in enumerate(prof.wrap(batches)):
                images = _images_of(batch)
                if row.output is None:
                    row.output = f"{images.dtype} {tuple(images.shape)} on {images.device}"
                    row.output = row.output.replace("torch.", "")
                step(images)
                del batch, images
                if index + 1 == warmup:
                    deadline = time.perf_counter() + seconds
                    if utilization is not None:
                        utilization.start()
                elif index + 1 > warmup:
                    counted += 1
                    now = time.perf_counter()
                    if now >= deadline and counted >= 2 or now - started > 3 * seconds + 120:
                        break
    finally:
        busy = utilization.stop() if utilization is not None else None
        batches.close()
        # Read before close(), which lets the decoder go.
        decode_stats = (getattr(loader, "gpu_decode_stats", None)
                        if variant.key in GPU_DECODE_KEYS else None)
        close_loader(loader)
        del loader
        gc.collect()
    summary = prof.summary()
    measured_row(summary, row, "no batch was timed after the warm-up; use more images or more "
                               "seconds")
    if row.skipped:
        return row
    if variant.key in GPU_DECODE_KEYS:
        # A row whose images were decoded on the CPU would be published as GPU decode's rate.
        row.extra["gpu_decode_stats"] = decode_stats
        problem = gpu_decode_problem(decode_stats)
        if problem is not None:
            row.skipped, row.per_round = problem, []
            return row
        if decode_stats["cpu"]:  # some fell back: the rate is not GPU decode's alone
            row.description += (f"; {decode_stats['cpu']} of "
                                f"{decode_stats['cpu'] + decode_stats['gpu']} images decoded on "
                                f"the CPU ({_fallback_reasons(decode_stats)})")
    row.extra["clock"] = summary.clock
    row.extra["gpu_utilization"] = row.extra["utilization_source"] = None
    if busy is not None:
        row.extra.update(gpu_utilization=busy, utilization_source="nvml")
    elif device.type == "cuda":
        row.extra.update(gpu_utilization=1.0 - summary.wait_share, utilization_source="events")
    return row


def run_model_bench(
    root: str | os.PathLike | None = None,
    *,
    device: str | torch.device = "cuda",
    model: str = "resnet50",
    num_images: int | None = None,
    batch_size: int = 256,
    num_workers: int | None = None,
    size: int = DEFAULT_SIZE,
    seconds: float = 15.0,
    warmup: int = 5,
    amp: bool = True,
    variants: Sequence[str] | None = None,
    budget_seconds: float = 240.0,
    command: str = "fastpipe bench --device cuda",
) -> BenchReport:
    """Runs every loader for ``seconds`` feeding ``model``'s training step on ``device``.

    ``num_images`` (the sample dataset's size) defaults to 1,024 on CUDA (256 on the CPU), or
    ``3 x batch_size x num_workers`` if more; a workload of fewer than ``2 x num_workers``
    batches per epoch (with ``root`` too) is refused with a ValueError (see
    :func:`check_workload`).

    Loaders run one after the other, each in a fresh state (the previous one closed); a loader
    that would start after ``budget_seconds`` (counted from the call, the first generation of the
    sample dataset included) is skipped, so the whole run stays within about
    ``budget_seconds + seconds`` and one loader's start-up.
    """
    started = time.perf_counter()  # the budget counts the dataset's generation too
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda needs a CUDA GPU, and torch sees none here; use "
                         "--device cpu --model tiny")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device}")
    if batch_size < 1 or seconds <= 0 or size < 8 or warmup < 1:
        raise ValueError(f"need batch_size >= 1, seconds > 0, size >= 8 and warmup >= 1; got "
                         f"batch_size={batch_size}, seconds={seconds}, size={size}, "
                         f"warmup={warmup}")
    known = {v.key: v for v in model_variants(device)}
    chosen = list(variants) if variants is not None else list(known)
    if device.type != "cuda" and any(k in GPU_DECODE_KEYS for k in chosen):
        raise ValueError("the GPU decode rows (gpu-decode, gpu-decode-4) decode on a CUDA GPU: "
                         "run them with --device cuda on a machine with one")
    unknown = [k for k in chosen if k not in known]
    if unknown or not chosen:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {', '.join(known)}")
    build_model(model)  # an unknown model name fails before any data is made
    from fastpipe.data.samples import default_cache_dir, sample_images

    if num_workers is None:
        num_workers = usable_cores()
    if root is None:
        if num_images is None:
            num_images = default_num_images(batch_size, num_workers,
                                            floor=1024 if device.type == "cuda" else 256)
        check_workload(num_images, batch_size, num_workers)
        root = sample_images(num_images=num_images)
    else:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory; pass an ImageFolder tree")
        num_images = sum(1 for p in root.glob("*/*") if p.is_file())
        check_workload(num_images, batch_size, num_workers)
    root = Path(root)
    # Packs of the cached sample dataset are cached beside it; others live for this run only.
    temporary = None if default_cache_dir() in root.parents else tempfile.mkdtemp(
        prefix="fastpipe-bench-")
    pack_dir = default_cache_dir() / "packs" if temporary is None else Path(temporary)
    config = BenchConfig(root=root, batch_size=batch_size, num_workers=num_workers, size=size,
                         pack_dir=pack_dir, device=device.type)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    settings = {"root": str(root), "num_images": num_images, "batch_size": batch_size,
                "num_workers": num_workers, "size": size, "seconds": seconds, "warmup": warmup,
                "device": str(device), "model": model, "amp": amp, "channels_last": True,
                "budget_seconds": budget_seconds, "command": command}
    rows = []
    try:
        for key in chosen:
            if time.perf_counter() - started > budget_seconds:
                rows.append(Row(known[key].name, key=key, description=known[key].description,
                                skipped=f"time budget of {budget_seconds:g} s used up"))
                continue
            step = TrainStep(model, device, batch_size, amp=amp)
            rows.append(run_model_variant(known[key], config, step, seconds, warmup))
            del step
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    settings["total_seconds"] = round(time.perf_counter() - started, 1)
    amp_name = "AMP" if amp else "float32"
    conditions = (f"{model} on {device}, channels_last, {amp_name}, batch {batch_size}, "
                  f"synthetic labels; {num_images} images, {workers(num_workers)}, {size}x{size} "
                  f"crops; {seconds:g} s per loader after {warmup} warm-up batches")
    setup = (f"step: {model} on {device}, channels_last, {amp_name}, batch {batch_size}, "
             f"synthetic labels; data: {num_images} JPEGs in {root}, {workers(num_workers)}, "
             f"{size}x{size} crops; {seconds:g} s per loader after {warmup} warm-up batches")
    if device.type == "cuda":
        setup += ("\nGPU util: NVML's; ~ marks the share of device time not spent waiting "
                  "for data (without pynvml). On DALI rows it includes DALI's own decode and "
                  "augmentation kernels, so it is not the model's share of the GPU: compare "
                  "images/s and the data wait")
    setup += ("\ndata wait: the share of the step time the "
              + ("GPU idled waiting for the batch (CUDA events)" if device.type == "cuda"
                 else "loop waited for the batch") + f"; {-(-num_images // batch_size)} batches "
              f"per epoch for {workers(num_workers)}")
    settings["batches_per_epoch"] = -(-num_images // batch_size)
    table = loader_table(rows, Column("GPU util", _utilization))
    report = BenchReport(describe_machine(), settings, table, setup, conditions)
    measured = [r for r in rows if r.wait_share is not None]
    if measured:
        report.notes.append("data-wait share: " + ", ".join(
            f"{r.name} {r.wait_share:.0%}" for r in measured))
    return report
