"""fastpipe.bench.report: the loaders' table and what its notes say about the noise."""

from __future__ import annotations

from fastpipe.bench.report import BenchReport, loader_table, noise_notes
from fastpipe.profiling._table import Row


def table_of(**rounds):
    return loader_table([Row(name, list(rates), key=name.lower()) for name, rates in
                         (("DataLoader", rounds["dataloader"]),
                          ("DataLoaderX", rounds["dataloaderx"]),
                          ("Prefetcher", rounds["prefetcher"]))])


def test_notes_give_the_spread_and_flag_rounds_that_disagree_or_overlap():
    table = table_of(dataloader=[431.0, 440.0, 420.0], dataloaderx=[444.2, 300.0, 450.0],
                     prefetcher=[600.0, 610.0, 590.0])
    notes = noise_notes(table, rounds=3)
    # Spreads (max - min) / median: 20/431 (5%), 150/444.2 (34%), 20/600 (3%).
    assert notes[0].startswith("note: noise: each loader's rounds spread by 5% (median) and up "
                               "to 34%")
    assert "compare the ratios of one run" in notes[0]
    assert any("DataLoaderX's rounds disagree (300.0-450.0 images/s, 34% apart, against 5%"
               in n for n in notes)
    # 444.2 against 431.0 is printed as 1.03x, but the rounds overlap: within the noise.
    assert any("DataLoaderX's rounds overlap DataLoader's (300.0-450.0 against 420.0-440.0"
               in n and "its 1.03x is within the noise" in n for n in notes)
    assert not any("Prefetcher's rounds" in n for n in notes)
    assert table.rows[1].ratio == 444.2 / 431.0  # the ratio of the printed medians


def test_one_round_says_the_noise_was_not_measured():
    table = table_of(dataloader=[431.0], dataloaderx=[444.2], prefetcher=[600.0])
    (note,) = noise_notes(table, rounds=1)
    assert "one round per loader, so the noise was not measured" in note
    assert "tens of percent" in note


def test_the_notes_follow_the_text_table_and_go_into_the_json():
    table = table_of(dataloader=[100.0, 101.0], dataloaderx=[150.0, 151.0],
                     prefetcher=[100.5, 102.0])
    notes = noise_notes(table, rounds=2)
    machine = {"cpu": "test CPU", "cores": 2, "python": "3.11", "fastpipe": "0.1.0"}
    report = BenchReport(machine, {"command": "fastpipe bench"}, table, notes=notes)
    text = str(report)
    assert text.index("min-max") < text.index("note: noise:")
    assert report.to_dict()["notes"] == notes
    assert any("Prefetcher's rounds overlap DataLoader's" in n for n in notes)
    assert not any("DataLoaderX's rounds overlap" in n for n in notes)
