"""The bench suite: rounds, medians, ratios measured within a round, skipped variants."""

from __future__ import annotations

import pytest

from fastpipe.bench import BenchRow, run_bench
from fastpipe.bench.suite import _merge
from fastpipe.bench.variants import VARIANTS, Skip, Variant


def test_rounds_merge_to_medians_and_a_skip_wins():
    rows = [BenchRow("k", "K", "d", images_per_second=v, wait_share=w, batches=3, seconds=1.0,
                     first_batch_seconds=0.1, output="float32 (2,)")
            for v, w in ((100.0, 0.5), (300.0, 0.1), (200.0, 0.2))]
    merged = _merge(rows)
    assert merged.images_per_second == 200.0 and merged.wait_share == 0.2
    assert merged.per_round == [100.0, 300.0, 200.0] and merged.batches == 9
    skipped = BenchRow("k", "K", "d", skipped="no DALI")
    assert _merge([rows[0], skipped]).skipped == "no DALI"


@pytest.mark.timeout(90)
def test_ratio_is_the_median_of_ratios_within_each_round(sample_root, monkeypatch, no_thread_leak):
    def broken(config):
        raise Skip("not here")

    monkeypatch.setattr("fastpipe.bench.suite.VARIANTS", (*VARIANTS[:2], Variant("x", "X", "", broken)))
    report = run_bench(sample_root, batch_size=8, num_workers=0, size=32, seconds=0.2, rounds=2,
                       variants=("dataloader", "dataloaderx", "x"), min_batches=2)
    base, other, skipped = report.rows
    assert base.ratio == 1.0 and len(base.per_round) == 2 and len(other.per_round) == 2
    expected = sorted(o / b for o, b in zip(other.per_round, base.per_round, strict=True))
    assert other.ratio == pytest.approx(sum(expected) / 2)
    assert skipped.skipped == "not here" and skipped.images_per_second is None
    assert report.settings["rounds"] == 2 and report.settings["num_images"] == 48
    with pytest.raises(ValueError, match="listed twice"):
        run_bench(sample_root, variants=("dataloader", "dataloader"))
