"""The model-step bench (fastpipe.bench.model_step, `fastpipe bench --device`): a real training
step, the loaders it compares, its time budget."""

from __future__ import annotations

import pytest

from fastpipe.bench.variants import VARIANTS


def test_train_step_trains_the_model_on_its_synthetic_labels():
    import torch

    from fastpipe.bench.model_step import TrainStep

    step = TrainStep("tiny", torch.device("cpu"), batch_size=4)
    before = [p.detach().clone() for p in step.model.parameters()]
    images = torch.rand(4, 3, 32, 32)
    step(images)
    after = list(step.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "SGD changed nothing"
    assert step.targets.shape == (4,) and int(step.targets.max()) < 1000
    step(torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8))  # a partial uint8 batch


def test_cuda_suite_decodes_with_dali_on_the_gpu_and_keeps_the_factory_row():
    import torch

    from fastpipe.bench.model_step import model_variants

    keys = {v.key: v for v in model_variants(torch.device("cuda"))}
    assert keys["dali"].name == "DALI (mixed decode)"
    assert [v.key for v in model_variants(torch.device("cpu"))] == [v.key for v in VARIANTS]
    assert "factory" in keys


def test_the_dali_gpu_row_is_skipped_when_its_decode_would_run_on_the_cpu(monkeypatch, tmp_path):
    # Without nvJPEG, DALI's "mixed" decode runs on the CPU: the row would time libjpeg-turbo
    # under the GPU decode's name.
    import torch

    from fastpipe import _doctor
    from fastpipe.bench.model_step import model_variants
    from fastpipe.bench.variants import BenchConfig, Skip

    problem = "nvImageCodec 0.9.0.20 finds no loadable libnvjpeg.so.13, ..."
    monkeypatch.setattr(_doctor, "nvjpeg_state", lambda: {"loads": False, "problem": problem})
    (dali,) = [v for v in model_variants(torch.device("cuda")) if v.key == "dali"]
    config = BenchConfig(root=tmp_path, batch_size=8, num_workers=1, size=32,
                         pack_dir=tmp_path, device="cuda")
    with pytest.raises(Skip, match="no loadable libnvjpeg"):
        dali.build(config)
    assert "crop_decode=False" in dali.description  # not the decode of nvImageCodec#55


@pytest.mark.slow
def test_model_bench_skips_the_loaders_past_its_time_budget(sample_root):
    from fastpipe.bench.model_step import run_model_bench

    report = run_model_bench(sample_root, device="cpu", model="tiny", batch_size=8, size=32,
                             seconds=0.1, variants=("dataloader", "dataloaderx"),
                             budget_seconds=0.0)
    assert [r.key for r in report.rows] == ["dataloader", "dataloaderx"]
    for row in report.rows:
        assert row.images_per_second is None and row.ratio is None
        assert row.skipped == "time budget of 0 s used up"
