"""fastpipe.bench.report: the loaders' table and what its notes say about the noise."""

from __future__ import annotations

from fastpipe.bench.report import BenchReport, loader_table, noise_notes, verdict
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


def report_of(table):
    machine = {"cpu": "test CPU", "cores": 2, "python": "3.11", "fastpipe": "0.1.0"}
    return BenchReport(machine, {"command": "fastpipe bench"}, table)


def test_the_verdict_is_the_last_line_and_in_the_json():
    table = table_of(dataloader=[100.0, 102.0], dataloaderx=[150.0, 151.0],
                     prefetcher=[231.0, 226.0])
    report = report_of(table)
    last = str(report).splitlines()[-1]
    # 228.5 / 101.0: the ratio of the printed medians; 226 > 102: beyond the noise.
    assert last == ("verdict: fastest: Prefetcher, 2.26x DataLoader (228.5 images/s), beyond "
                    "the noise (its slowest round, 226.0, beats DataLoader's fastest, 102.0)")
    assert report.to_dict()["verdict"] == last


def test_the_verdict_names_the_loaders_tied_with_the_fastest():
    table = table_of(dataloader=[100.0, 102.0], dataloaderx=[225.0, 230.0],
                     prefetcher=[228.0, 233.0])
    line = verdict(table)
    assert line.startswith("verdict: fastest: Prefetcher, 2.28x DataLoader (230.5 images/s), "
                           "beyond the noise")
    assert line.endswith("; tied with it within the noise: DataLoaderX 2.25x")


def test_a_verdict_within_the_noise_says_so():
    table = table_of(dataloader=[100.0, 130.0], dataloaderx=[110.0, 125.0],
                     prefetcher=[90.0, 95.0])
    line = verdict(table)
    assert line.startswith("verdict: fastest: DataLoaderX, 1.02x DataLoader (117.5 images/s), "
                           "within the noise (its rounds overlap DataLoader's: 110.0-125.0 "
                           "against 100.0-130.0)")
    assert "DataLoader 1.00x" not in line


def test_the_verdict_with_one_round_or_without_a_dataloader_row():
    one = table_of(dataloader=[100.0], dataloaderx=[150.0], prefetcher=[120.0])
    assert verdict(one) == ("verdict: fastest: DataLoaderX, 1.50x DataLoader (150.0 images/s); "
                            "one round per loader, so whether that is beyond the noise was not "
                            "measured (--rounds 3 measures it)")
    slowest = table_of(dataloader=[300.0, 301.0], dataloaderx=[150.0, 151.0],
                       prefetcher=[120.0, 130.0])
    assert verdict(slowest) == ("verdict: the plain DataLoader was the fastest here (300.5 "
                                "images/s), beyond the noise of every other loader")
    no_base = loader_table([Row("Fast", [10.0], key="fast")])
    assert verdict(no_base) == ("verdict: fastest: Fast (10.0 images/s); no DataLoader row to "
                                "compare it with")
    skipped = loader_table([Row("DataLoader", key="dataloader", skipped="no torch")])
    assert verdict(skipped) == "verdict: no loader ran; see the skipped rows"
