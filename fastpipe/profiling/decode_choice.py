"""Where images decode: the CPU path, GPU decode in DataPrefetcher, or DALI, chosen from
measurements on the user's own images (``image_loader(decode="auto")``, ``fastpipe tune``).

Each candidate that can run here is measured on the same samples: the CPU path's decode per
image on one core times the workers it will have; GPU decode's batch (decode, resize, flip) on
the device; DALI's loader. GPU decode and DALI take GPU time from the training step, so the CPU
path is kept unless one of them feeds clearly more (``min_gain``), or unless it cannot feed the
step when the step is known (``step_seconds``). Without a CUDA device the CPU path is the only
candidate, and the choice says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fastpipe.recipe import Recipe

__all__ = ["DecodeChoice", "choose_decode", "decode_candidates"]

# A faster decode off the CPU must feed this much more to be worth the GPU time it takes.
MIN_GAIN = 0.10
# What DALI's readers take (fastpipe.dali.sources.open_source); the CPU path reads every kind of
# fastpipe.data.datasets.images.CLASSIFICATION_KINDS.
DALI_KINDS = ("folder", "list", "hdf5", "lmdb")


@dataclass(frozen=True)
class DecodeChoice:
    """Where the images will decode (``decode``: ``"cpu"``, ``"gpu"`` or ``"dali"``) and
    ``why``, with the rates measured (images/s per candidate) and why the other candidates were
    not measured."""

    decode: str
    why: str
    rates: dict[str, float] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"decode={self.decode!r}: {self.why}"

    def to_dict(self) -> dict[str, Any]:
        return {"decode": self.decode, "why": self.why, "rates": dict(self.rates),
                "unavailable": dict(self.unavailable)}


def decode_candidates(recipe: Recipe, device: torch.device, kind: str | None = None
                      ) -> tuple[list[str], dict[str, str]]:
    """The candidates that can run here, and why each other one cannot."""
    unavailable: dict[str, str] = {}
    candidates = ["cpu"]
    if device.type != "cuda":
        reason = f"needs a CUDA device, and the batches go to {device}" + (
            "" if torch.cuda.is_available() else " (no CUDA device here)")
        return candidates, {"gpu": reason, "dali": reason}
    from fastpipe.gpu_decode import available_backends

    problems = available_backends()
    try:
        recipe.check("gpu")
        if all(problems.values()):
            unavailable["gpu"] = "; ".join(f"{k}: {v}" for k, v in problems.items())
        else:
            candidates.append("gpu")
    except ValueError as exc:
        unavailable["gpu"] = str(exc)
    dali = _dali_problem(recipe, kind)
    if dali is None:
        candidates.append("dali")
    else:
        unavailable["dali"] = dali
    return candidates, unavailable


def _dali_problem(recipe: Recipe, kind: str | None) -> str | None:
    import importlib.util

    try:
        if importlib.util.find_spec("nvidia.dali") is None:
            return "DALI is not installed (pip install 'fastpipe[dali]')"
    except (ImportError, ValueError):
        return "DALI is not installed (pip install 'fastpipe[dali]')"
    if kind is not None and kind not in DALI_KINDS:
        return f"DALI's readers do not read {kind} data"
    try:
        recipe.check("dali")
    except ValueError as exc:
        return str(exc)
    try:
        from nvidia.dali import backend

        if int(backend.GetCUDADeviceCount()) < 1:
            return "DALI sees no GPU (a wheel for another CUDA major version?)"
    except Exception as exc:  # noqa: BLE001 - a broken DALI is a reason, not a crash
        return f"DALI does not load: {exc}"
    return None


def choose_decode(
    candidates: list[str],
    unavailable: dict[str, str],
    measure: Callable[[str], float],
    *,
    step_rate: float | None = None,
    min_gain: float = MIN_GAIN,
) -> DecodeChoice:
    """The choice among ``candidates`` (``"cpu"`` first), measuring each with ``measure(name)
    -> images/s`` only where there is a choice. ``step_rate``: the images/s the training step
    takes, when known (the CPU path is kept when it feeds that)."""
    if candidates == ["cpu"]:
        why = "the CPU path is the only decode that can run here"
        if unavailable:
            why += " (" + "; ".join(f"{k}: {v}" for k, v in sorted(unavailable.items())) + ")"
        return DecodeChoice("cpu", why, {}, dict(unavailable))
    rates: dict[str, float] = {}
    for name in candidates:
        try:
            rates[name] = float(measure(name))
        except Exception as exc:  # noqa: BLE001 - a candidate that fails is not chosen, and why
            unavailable[name] = f"its measurement failed: {type(exc).__name__}: {exc}"
    if "cpu" not in rates:
        best = max(rates, key=rates.get) if rates else "cpu"
        return DecodeChoice(best, f"the CPU path could not be measured; {best} was",
                            rates, dict(unavailable))
    cpu = rates["cpu"]
    said = ", ".join(f"{name} {rate:,.0f} images/s" for name, rate in rates.items())
    if step_rate is not None and cpu >= step_rate:
        return DecodeChoice("cpu", f"measured {said}: the CPU path feeds the step's "
                                   f"{step_rate:,.0f} images/s, and keeps the GPU for it",
                            rates, dict(unavailable))
    best = max(rates, key=rates.get)
    if best != "cpu" and rates[best] > cpu * (1 + min_gain):
        return DecodeChoice(best, f"measured {said}: {best} feeds {rates[best] / cpu:.2f}x "
                                  "what the CPU path does", rates, dict(unavailable))
    return DecodeChoice("cpu", f"measured {said}: no other decode feeds more than "
                               f"{min_gain:.0%} beyond the CPU path, which leaves the GPU to "
                               "the step", rates, dict(unavailable))


# ----------------------------------------------------------------- the measurements (on a GPU)


def image_dataset_recipe(dataset: Any) -> Recipe | None:
    """The recipe a fastpipe image dataset decodes with (its ImageDecoder's), else None."""
    from fastpipe.data.decode.image import ImageDecoder

    decoder = getattr(dataset, "decoder", None)
    return decoder.recipe if isinstance(decoder, ImageDecoder) else None


def measure_decode(name: str, dataset: Any, path: str | os.PathLike | None, recipe: Recipe,
                   device: torch.device, num_workers: int, batch_size: int,
                   samples: int = 64) -> float:
    """Images/s of one decode on the first ``samples`` images of ``dataset`` (a fastpipe image
    dataset decoding on the CPU path): ``"cpu"``, its per-image time on one core times
    ``num_workers``; ``"gpu"``, GPU decode's batches of the same samples on ``device``;
    ``"dali"``, DALILoader's batches of ``path``."""
    count = max(1, min(samples, batch_size, len(dataset)))
    if name == "dali":
        if path is None:
            raise ValueError("DALI reads a path (a folder, a list file or a pack)")
        return _measure_dali(path, recipe, device, count)
    indices = list(range(count))
    if name == "cpu":
        dataset[indices[0]]  # warm-up: imports, caches
        started = time.perf_counter()
        for i in indices:
            dataset[i]
        per_image = (time.perf_counter() - started) / len(indices)
        return max(1, num_workers) / per_image
    from fastpipe.data import fast_collate
    from fastpipe.data.datasets._records import RecordDataset
    from fastpipe.gpu_decode import GpuDecode
    from fastpipe.gpu_decode._decoder import GpuDecoder

    fields = None if dataset.schema is dataset.source.schema else list(dataset.schema.names)
    encoded = RecordDataset(dataset.source, decoder=dataset.decoder, seed=dataset.seed,
                            fields=fields, decode="gpu")
    batch = fast_collate([encoded[i] for i in indices])
    encoded_batch = batch[0] if isinstance(batch, tuple) else next(
        v for v in batch.values() if hasattr(v, "plans"))
    decoder = GpuDecoder(GpuDecode(), device)
    try:
        stream = torch.cuda.current_stream(device)
        decoder.decode(encoded_batch, stream)  # warm-up: the library, its buffers
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(3):
            decoder.decode(encoded_batch, stream)
        torch.cuda.synchronize(device)
        return 3 * len(indices) / (time.perf_counter() - started)
    finally:
        decoder.close()


def _measure_dali(path: str | os.PathLike, recipe: Recipe, device: torch.device,
                  batch_size: int) -> float:
    from fastpipe.dali import DALILoader

    loader = DALILoader(str(path), batch_size=batch_size, recipe=recipe, device=str(device),
                        shuffle=False)
    try:
        batches = iter(loader)
        next(batches)
        torch.cuda.synchronize(device)
        started, seen = time.perf_counter(), 0
        for _ in range(3):
            images, _ = next(batches)
            seen += len(images)
        torch.cuda.synchronize(device)
        return seen / (time.perf_counter() - started)
    except StopIteration:
        raise ValueError("the dataset is too small to measure DALI: fewer than 4 batches") \
            from None
    finally:
        close = getattr(loader, "close", None)
        if callable(close):
            close()
