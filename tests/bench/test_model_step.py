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
