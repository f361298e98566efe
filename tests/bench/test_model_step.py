"""The model-step bench (fastpipe.bench.model_step, `fastpipe bench --device`): a real training
step, the loaders it compares, its time budget."""

from __future__ import annotations

import time

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


def test_the_cuda_bench_defaults_are_the_lent_machines_shape(monkeypatch, tmp_path, capsys):
    # The lent GPU machine: 16 cores, one 10-minute command for the GPU kit's checks and the
    # bench. Every core a worker for every loader (16 against 16), batch 256, ResNet-50 with
    # AMP, and a budget that leaves the kit its time.
    from fastpipe._cli import main
    from fastpipe._cli.bench import MODEL_DEFAULTS

    calls = []

    class Report:
        def to_json(self, path=None):
            return "{}"

        def __str__(self):
            return "table"

    def run_model_bench(root, **kwargs):
        calls.append(kwargs)
        return Report()

    monkeypatch.setattr("fastpipe.bench.model_step.run_model_bench", run_model_bench)
    save = str(tmp_path / "bench.json")
    assert main(["bench", "--device", "cuda", "--save", save]) == 0
    (got,) = calls
    assert got["num_workers"] is None  # run_model_bench: the usable cores, for every loader
    assert (got["batch_size"], got["model"], got["amp"]) == (256, "resnet50", True)
    assert got["num_images"] is None  # 3 x batch x workers: 12,288 images for 16 workers
    seconds, budget = got["seconds"], got["budget_seconds"]
    assert (seconds, budget) == (15.0, 240.0) == (MODEL_DEFAULTS["cuda"]["seconds"],
                                                  MODEL_DEFAULTS["cuda"]["budget"])
    # The last loader starts by the budget and runs its seconds, with room for its start and
    # for the kit's build, doctor and lane in one 10-minute command.
    assert budget + seconds + 60 <= 330
    assert main(["bench", "--device", "cuda", "--save", save, "--budget", "100"]) == 0
    assert calls[-1]["budget_seconds"] == 100.0
    capsys.readouterr()
    assert main(["bench", "--budget", "100"]) == 2
    assert "--budget applies to the model-step bench" in capsys.readouterr().err


def test_the_budget_counts_the_sample_sets_generation(monkeypatch, tmp_path):
    # A budget used up by the generation skips every loader rather than starting one late.
    from fastpipe.bench import model_step

    def slow_samples(num_images):
        time.sleep(0.3)
        (tmp_path / "c0").mkdir(exist_ok=True)
        return tmp_path

    monkeypatch.setattr("fastpipe.data.samples.sample_images", slow_samples)
    report = model_step.run_model_bench(device="cpu", model="tiny", batch_size=8, size=32,
                                        num_workers=1, seconds=0.1,
                                        variants=("dataloader",), budget_seconds=0.2)
    assert report.rows[0].skipped == "time budget of 0.2 s used up"
    assert report.settings["budget_seconds"] == 0.2


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
