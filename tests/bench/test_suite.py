"""The bench suite (fastpipe.bench.suite): rounds, medians, ratios of the printed medians, skipped
variants. The model-step bench is in test_model_step.py."""

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
@pytest.mark.slow
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
