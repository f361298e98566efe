"""fastpipe.profiling.tune: finds the clearly best setting, respects its budget, pastes code that
runs."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest
import torch

from fastpipe.profiling import LoaderSettings, resolve_dataset, tune
from fastpipe.profiling._datasets import DatasetSource
from fastpipe.profiling.tuner import default_worker_counts
from tests.helpers.tune import SleepyDataset


@pytest.mark.timeout(90)
def test_tune_finds_the_clearly_best_setting_of_a_synthetic_dataset(no_thread_leak, tmp_path):
    # 4 workers load about twice as fast as 2 and four times as fast as 0, and batches of 16
    # share the fixed per-batch cost four times better than batches of 4 (tests/helpers/tune.py).
    result = tune(
        "tests.helpers.tune:sleepy_dataset", batch_size=4, num_workers=(0, 2, 4),
        batch_sizes=(4, 16),
        prefetch_factors=(2,), persistent_workers=(False,), wrappers=("DataLoader", "DataLoaderX"),
        budget=10,
    )
    best = result.best.settings
    assert (best.num_workers, best.batch_size) == (4, 16)
    rates = {(t.settings.num_workers, t.settings.batch_size, t.settings.wrapper):
             t.samples_per_second for t in result.trials}
    # Ideally 2x each; a CPU saturated by other work delays every wake-up of the workers.
    assert rates[(4, 4, "DataLoader")] > 1.3 * rates[(2, 4, "DataLoader")]
    assert rates[(2, 4, "DataLoader")] > 1.3 * rates[(0, 4, "DataLoader")]
    # Ranked fastest first (a trial a loaded machine pushed over the budget has no rate).
    assert result.trials[0].samples_per_second == max(r for r in rates.values() if r is not None)
    assert "num_workers=4" in result.code and "batch_size=16" in result.code
    assert multiprocessing.active_children() == []  # every trial's workers have stopped

    png = result.plot(tmp_path / "tune.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(result.to_json())
    assert data["best"]["settings"]["num_workers"] == 4 and len(data["trials"]) == 5


@pytest.mark.timeout(60)
def test_tune_stays_within_its_budget_and_lists_what_it_skipped(no_thread_leak):
    started = time.perf_counter()
    result = tune(SleepyDataset(length=32, item_seconds=0.001, batch_seconds=0.001), batch_size=4,
                  num_workers=(0, 1), batch_sizes=(2, 4, 8, 16), budget=1.5)
    elapsed = time.perf_counter() - started
    # A trial may start just inside the budget; stopping and starting workers adds a little.
    assert elapsed < 1.5 + 3.0
    skipped = [t for t in result.trials if t.skipped]
    assert skipped and all(t.skipped == "over the time budget" for t in skipped)
    assert all(t.samples_per_second is None for t in skipped)
    assert result.trials[-1] in skipped  # ranked after every measured trial
    assert "skipped: over the time budget" in result.table()


def run_pasted(code: str, dataset) -> object:
    namespace = {"dataset": dataset}
    exec(compile(code, "<recommended>", "exec"), namespace)
    return namespace["loader"]


@pytest.mark.parametrize("settings", [
    LoaderSettings(num_workers=0, batch_size=4),
    LoaderSettings(num_workers=2, batch_size=8, prefetch_factor=4, persistent_workers=True,
                   wrapper="DataLoaderX"),
    LoaderSettings(num_workers=1, batch_size=3, wrapper="DataLoaderX+DataPrefetcher"),
])
@pytest.mark.timeout(60)
def test_recommended_code_runs_and_builds_the_measured_loader(settings, no_thread_leak):
    dataset = SleepyDataset(length=12, item_seconds=0, batch_seconds=0)
    source = DatasetSource(dataset, None, "sleepy", code="dataset")
    loader = run_pasted(settings.code(source), dataset)
    built = settings.build(dataset, None)
    assert type(loader) is type(built)
    inner, built_inner = getattr(loader, "loader", loader), getattr(built, "loader", built)
    for name in ("batch_size", "num_workers", "prefetch_factor", "persistent_workers",
                 "pin_memory"):
        assert getattr(inner, name) == getattr(built_inner, name), name
    images, labels = next(iter(loader))
    assert images.shape == (settings.batch_size, 3, 8, 8) and labels.dtype == torch.int64
    for item in (loader, built):
        inner = getattr(item, "loader", None)
        for close in (getattr(item, "close", None), getattr(inner, "close", None)):
            if close:
                close()
    del loader, built, inner, built_inner


def test_resolve_dataset_reads_a_folder_a_factory_and_a_file_path(sample_root, tmp_path):
    folder = resolve_dataset(sample_root, size=64)
    assert len(folder.dataset) == 48
    image, label = folder.dataset[5]
    assert image.dtype == torch.uint8 and image.shape == (3, 64, 64) and label in range(4)

    factory = resolve_dataset("tests.helpers.tune:tiny_sleepy_dataset")
    assert isinstance(factory.dataset, SleepyDataset) and len(factory.dataset) == 64

    script = tmp_path / "my_data.py"
    script.write_text("def make():\n    return list(range(10))\n")
    assert resolve_dataset(f"{script}:make").dataset == list(range(10))


def test_resolve_dataset_names_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; pass an ImageFolder directory"):
        resolve_dataset(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a pack"):
        resolve_dataset(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="cannot import 'no_such_module_xyz'"):
        resolve_dataset("no_such_module_xyz:make")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        resolve_dataset("tests.helpers.tune:nope")
    with pytest.raises(ValueError, match="not a map-style dataset"):
        resolve_dataset("tests.helpers.tune:not_a_dataset")


def test_bad_arguments_are_named():
    data = SleepyDataset(length=4)
    with pytest.raises(ValueError, match="wrappers"):
        tune(data, wrappers=("Fast",))
    with pytest.raises(ValueError, match="budget"):
        tune(data, budget=0)
    with pytest.raises(ValueError, match="num_workers"):
        tune(data, num_workers=(-1,))
    with pytest.raises(TypeError, match="map-style dataset"):
        tune(42)


def test_default_worker_counts_double_up_to_twice_the_cores():
    assert default_worker_counts(2) == [0, 1, 2, 4]
    assert default_worker_counts(6) == [0, 1, 2, 4, 8]
    assert default_worker_counts(64)[-1] == 32


@pytest.mark.timeout(60)
def test_recommended_code_for_an_image_folder_runs_as_pasted(sample_root, no_thread_leak):
    source = resolve_dataset(sample_root, size=32)
    code = LoaderSettings(num_workers=0, batch_size=4).code(source)
    namespace: dict = {}
    exec(compile(code, "<recommended>", "exec"), namespace)
    images, labels = next(iter(namespace["loader"]))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64
