"""The GPU decode rows of `fastpipe bench --device cuda` (fastpipe/bench/model_step.py), wired
and refused on the CPU (they have run on an H200: docs/gpu.md)."""

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


def _stand_in_row(sample_root, tmp_path, monkeypatch, refuse):
    """A GPU decode row run end to end on the CPU: ImageFolder(decode='gpu'), DataLoaderX and
    DataPrefetcher, the decoder library replaced by the recording stand-in (refusing what
    ``refuse`` says, as nvImageCodec returns None for what it does not decode on the GPU)."""
    from fastpipe import DataLoaderX, DataPrefetcher
    from fastpipe.bench.variants import Variant
    from fastpipe.data import ImageFolder, fast_collate
    from tests.helpers.gpu_decode import use_stand_in

    use_stand_in(monkeypatch, refuse=refuse)

    def build(config):
        dataset = ImageFolder(str(config.root), train=True, size=config.size, decode="gpu")
        return DataPrefetcher(DataLoaderX(dataset, collate_fn=fast_collate, batch_size=8),
                              device="cpu")

    variant = Variant("gpu-decode", "GPU decode (nvImageCodec)", "the stand-in", build)
    with pytest.warns(RuntimeWarning) if refuse(b"\xff\xd8") else _no_warning():
        return run_model_variant(variant, _config(sample_root, tmp_path),
                                 model_step.TrainStep("tiny", torch.device("cpu"), 8), 0.2, 1)


def _no_warning():
    import contextlib

    return contextlib.nullcontext()


def test_a_row_that_decoded_on_the_gpu_records_what_its_decoder_did(sample_root, tmp_path,
                                                                    monkeypatch):
    row = _stand_in_row(sample_root, tmp_path, monkeypatch, refuse=lambda data: False)
    assert not row.skipped and row.median > 0
    stats = row.to_dict()["gpu_decode_stats"]
    assert stats["gpu"] > 0 and stats["cpu"] == 0 and stats["backend"] == "stand-in decoder"


def test_a_row_whose_every_image_fell_back_to_the_cpu_fails(sample_root, tmp_path, monkeypatch):
    """Every image decoded on the CPU (nvImageCodec without nvJPEG decodes no JPEG on the GPU):
    the row timed the CPU decoder and must not be published as GPU decode's rate."""
    row = _stand_in_row(sample_root, tmp_path, monkeypatch, refuse=lambda data: True)
    assert row.skipped.startswith("failed: none of its") and "on the GPU" in row.skipped
    assert "stand-in decoder did not decode it on the GPU" in row.skipped
    assert row.per_round == [] and row.median is None
    stats = row.to_dict()["gpu_decode_stats"]
    assert stats["gpu"] == 0 and stats["cpu"] > 0


def test_gpu_decode_problem():
    from fastpipe.bench.model_step import gpu_decode_problem

    assert gpu_decode_problem(None).startswith("failed: GPU decode decoded no batch")
    assert gpu_decode_problem({"gpu": 10, "cpu": 0, "fallback_reasons": {}}) is None
    assert gpu_decode_problem({"gpu": 9, "cpu": 1, "fallback_reasons": {"png": 1}}) is None
    assert "2: no nvJPEG" in gpu_decode_problem({"gpu": 0, "cpu": 2,
                                                 "fallback_reasons": {"no nvJPEG": 2}})


def test_a_row_asked_for_by_name_that_did_not_run_fails_the_command(monkeypatch, tmp_path,
                                                                    capsys):
    """`fastpipe bench --variants ...` exits 1 where a row it names was skipped or failed (the
    GPU kit's bench step then fails); rows not named do not count."""
    from types import SimpleNamespace

    from fastpipe._cli import main
    from fastpipe.profiling._table import Row

    def report_of(rows):
        return SimpleNamespace(rows=rows, to_json=lambda path=None: "{}",
                               __str__=lambda self: "report")

    failed = Row("GPU decode (nvImageCodec)", key="gpu-decode", description="")
    failed.skipped = "failed: none of its 8 image(s) was decoded on the GPU"
    other = Row("DataLoader", key="dataloader", description="")
    other.skipped = "time budget used up"
    for rows, asked, code in (([failed], "gpu-decode", 1), ([other], "fast-cpu", 0)):
        monkeypatch.setattr(model_step, "run_model_bench", lambda *a, rows=rows, **k: report_of(
            rows))
        assert main(["bench", "--device", "cpu", "--variants", asked, "--save",
                     str(tmp_path / "b.json")]) == code
    assert "gpu-decode did not run: failed: none of its" in capsys.readouterr().err
