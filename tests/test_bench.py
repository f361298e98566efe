"""The bench suite: rounds, medians, ratios of the printed medians, skipped variants."""

from __future__ import annotations

import pytest

from fastpipe.bench import run_bench
from fastpipe.bench.variants import VARIANTS, Skip, Variant
from fastpipe.profiling._table import Row


def test_rounds_merge_to_medians_and_a_skip_wins():
    rows = [Row("K", [v], key="k", description="d", wait_share=w, batches=3, seconds=1.0,
                first_batch_seconds=0.1, output="float32 (2,)")
            for v, w in ((100.0, 0.5), (300.0, 0.1), (200.0, 0.2))]
    merged = Row.merged(rows)
    assert merged.images_per_second == 200.0 and merged.wait_share == 0.2
    assert merged.per_round == [100.0, 300.0, 200.0] and merged.batches == 9
    assert (merged.low, merged.high) == (100.0, 300.0)
    skipped = Row("K", key="k", description="d", skipped="no DALI")
    assert Row.merged([rows[0], skipped]).skipped == "no DALI"


@pytest.mark.timeout(90)
def test_ratio_is_the_ratio_of_the_printed_medians(sample_root, monkeypatch, no_thread_leak):
    def broken(config):
        raise Skip("not here")

    monkeypatch.setattr("fastpipe.bench.suite.VARIANTS",
                        (*VARIANTS[:2], Variant("x", "X", "", broken)))
    report = run_bench(sample_root, batch_size=8, num_workers=0, size=32, seconds=0.2, rounds=2,
                       variants=("dataloader", "dataloaderx", "x"), min_batches=2)
    base, other, skipped = report.rows
    assert base.ratio == 1.0 and len(base.per_round) == 2 and len(other.per_round) == 2
    median = sum(other.per_round) / 2, sum(base.per_round) / 2
    assert other.images_per_second == pytest.approx(median[0])
    assert other.ratio == pytest.approx(median[0] / median[1])
    assert skipped.skipped == "not here" and skipped.images_per_second is None
    assert report.settings["rounds"] == 2 and report.settings["num_images"] == 48
    with pytest.raises(ValueError, match="listed twice"):
        run_bench(sample_root, variants=("dataloader", "dataloader"))


# --- the model-step bench (fastpipe bench --device) ---------------------------------------------

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


def test_model_bench_skips_the_loaders_past_its_time_budget(sample_root):
    from fastpipe.bench.model_step import run_model_bench

    report = run_model_bench(sample_root, device="cpu", model="tiny", batch_size=8, size=32,
                             seconds=0.1, variants=("dataloader", "dataloaderx"),
                             budget_seconds=0.0)
    assert [r.key for r in report.rows] == ["dataloader", "dataloaderx"]
    for row in report.rows:
        assert row.images_per_second is None and row.ratio is None
        assert row.skipped == "time budget of 0 s used up"
