"""The GPU decode rows of `fastpipe bench --device cuda` (fastpipe/bench/model_step.py), wired
and refused on the CPU: they have never run on a GPU here."""

from __future__ import annotations

import pytest
import torch

import fastpipe.gpu_decode as gpu_decode
import fastpipe.prefetch as prefetch_module
from fastpipe import _doctor
from fastpipe.bench import model_step
from fastpipe.bench.model_step import (
    _build_gpu_decode,
    model_variants,
    run_model_bench,
    run_model_variant,
)
from fastpipe.bench.variants import BenchConfig, Skip


def test_on_cuda_the_gpu_decode_rows_follow_the_fast_cpu_path():
    keys = [v.key for v in model_variants(torch.device("cuda"))]
    at = keys.index("fast-cpu")
    assert keys[at + 1:at + 3] == ["gpu-decode", "gpu-decode-4"]
    assert {v.name for v in model_variants(torch.device("cuda"))} >= {
        "GPU decode (nvImageCodec)", "GPU decode (nvImageCodec), 4 workers"}
    assert not {"gpu-decode", "gpu-decode-4"} & {v.key for v in model_variants(
        torch.device("cpu"))}


def test_on_the_cpu_the_rows_are_refused_naming_the_device(sample_root):
    with pytest.raises(ValueError, match="decode on a CUDA GPU: run them with --device cuda"):
        run_model_bench(sample_root, device="cpu", model="tiny", variants=["gpu-decode"])


def _config(sample_root, tmp_path, workers=16) -> BenchConfig:
    return BenchConfig(root=sample_root, batch_size=8, num_workers=workers, size=32,
                       pack_dir=tmp_path, device="cuda")


def test_without_nvimagecodec_or_nvjpeg_the_row_is_skipped_with_the_reason(sample_root, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(gpu_decode, "available_backends",
                        lambda: {"nvimgcodec": "not installed: pip install "
                                               "'fastpipe[gpu-decode]'", "torchvision": None})
    with pytest.raises(Skip, match=r"nvImageCodec: not installed.*gpu-decode"):
        _build_gpu_decode(_config(sample_root, tmp_path))
    monkeypatch.setattr(gpu_decode, "available_backends",
                        lambda: {"nvimgcodec": None, "torchvision": None})
    monkeypatch.setattr(_doctor, "nvjpeg_state",
                        lambda: {"loads": False, "problem": "no libnvjpeg.so.13: pip install "
                                                            "nvidia-nvjpeg"})
    with pytest.raises(Skip, match="nvidia-nvjpeg"):
        _build_gpu_decode(_config(sample_root, tmp_path))
    variant = next(v for v in model_variants(torch.device("cuda")) if v.key == "gpu-decode")
    row = run_model_variant(variant, _config(sample_root, tmp_path),
                            model_step.TrainStep("tiny", torch.device("cpu"), 8), 1.0, 1)
    assert row.skipped.startswith("no libnvjpeg.so.13")


@pytest.mark.parametrize("key, workers", [("gpu-decode", 16), ("gpu-decode-4", 4)])
def test_the_row_builds_the_gpu_decode_loader(sample_root, tmp_path, monkeypatch, key, workers):
    monkeypatch.setattr(gpu_decode, "available_backends",
                        lambda: {"nvimgcodec": None, "torchvision": None})
    monkeypatch.setattr(_doctor, "nvjpeg_state", lambda: {"loads": True, "problem": None})
    built = {}

    def prefetcher(loader, **kwargs):
        built.update(loader=loader, **kwargs)
        return "prefetcher"

    monkeypatch.setattr(prefetch_module, "DataPrefetcher", prefetcher)
    variant = next(v for v in model_variants(torch.device("cuda")) if v.key == key)
    assert variant.build(_config(sample_root, tmp_path)) == "prefetcher"
    loader = built["loader"]
    assert loader.dataset.decode == "gpu" and loader.num_workers == workers
    assert loader.pin_memory and built["device"] == "cuda"
    assert built["gpu_decode"].backend == "nvimgcodec" and built["mean"] is not None
