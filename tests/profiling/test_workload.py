"""fastpipe.profiling._workload: a batch larger than the dataset, or too few batches an epoch,
refused or noted with the numbers to change, in the spelling of whoever asked; and what
``profile`` prints when nothing could be measured."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fastpipe.profiling import profile, tune
from fastpipe.profiling._workload import (
    Spelling,
    check_measurable,
    suggested_batch_size,
)
from tests.helpers.tune import SleepyDataset


def test_suggested_batch_sizes_give_three_batches():
    assert [suggested_batch_size(n) for n in (1, 5, 6, 200, 768, 1000)] == [1, 1, 2, 64, 256, 256]


def test_a_batch_larger_than_the_dataset_is_refused_with_the_numbers():
    with pytest.raises(ValueError) as info:
        check_measurable(200, 256, Spelling(batch="--batch-size", data="--num-images"))
    assert str(info.value) == (
        "--batch-size 256 is larger than the dataset's 200 samples: every epoch would be one "
        "short batch of 200, and the measurement would time workers starting and stopping. Pass "
        "--batch-size 64 (4 batches an epoch), or --num-images 768")
    with pytest.raises(ValueError, match=r"^tune: batch_size=9 is larger than the dataset's 8 "
                                         r".* Pass batch_size=2 \(4 batches an epoch\), or a "
                                         r"dataset of at least 27 samples$"):
        check_measurable(8, 9, Spelling("tune"))
    with pytest.raises(ValueError, match="the dataset is empty"):
        check_measurable(0, 1, Spelling())


def test_few_batches_an_epoch_are_noted_and_enough_pass():
    note = check_measurable(200, 100, Spelling(batch="--batch-size"))
    assert note == ("200 samples make 2 batches of 100 an epoch: the loader restarts every few "
                    "batches and the rates include it; --batch-size 64 or a dataset of at least "
                    "300 samples measures a steady stream")
    assert check_measurable(200, 64, Spelling()) is None  # 4 batches


def test_tune_refuses_a_batch_larger_than_the_dataset():
    with pytest.raises(ValueError, match="batch_size=128 is larger than the dataset's 64"):
        tune(SleepyDataset(length=64), batch_size=128, num_workers=[0], budget=1)


@pytest.mark.timeout(60)
def test_tune_leaves_out_batch_sizes_larger_than_the_dataset_and_says_so(no_thread_leak):
    dataset = SleepyDataset(length=64, item_seconds=0.0, batch_seconds=0.0)
    result = tune(dataset, batch_size=48, num_workers=[0], wrappers=["DataLoader"],
                  prefetch_factors=[2], persistent_workers=[False], rounds=1,
                  seconds_per_run=0.05, budget=30)
    tried = {t.settings.batch_size for t in result.trials}
    assert tried == {24, 48}
    notes = result.notes()
    assert "batch sizes larger than the dataset's 64 samples were not tried: 96" in notes
    assert any(n.startswith("64 samples make 2 batches of 48 an epoch") for n in notes)
    with pytest.raises(ValueError, match=r"every batch size to try \(128\) is larger than the "
                                         r"dataset's 64 samples; try 16"):
        tune(dataset, batch_size=8, batch_sizes=[128], num_workers=[0], budget=1)


def _profiled(loader, **kwargs) -> str:
    out = io.StringIO()
    for _ in profile(loader, report=out, device="cpu", **kwargs):
        pass
    return out.getvalue()


def test_a_profile_of_one_warm_up_batch_says_why_and_what_to_change():
    # The README's loop on a dataset smaller than one batch: it printed "nan steps/s", "nan%".
    dataset = TensorDataset(torch.zeros(200, 3), torch.zeros(200))
    text = _profiled(DataLoader(dataset, batch_size=256))
    assert "nan" not in text
    assert text.startswith("fastpipe.profile: nothing measured: the loop received 1 batch, all "
                           "of it warm-up (warmup=1")
    assert ("batch_size=256 is larger than the dataset's 200 samples, so each epoch is one "
            "batch: pass batch_size=64 (4 batches), or use at least 768 samples") in text
    assert "prof.wrap(loader)" in text and "warmup=0" in text
    summary_text = _profiled(DataLoader(dataset, batch_size=100))  # 2 batches: 1 counted
    assert "fastpipe.profile: 1 step in" in summary_text
    assert "only 1 step after the warm-up" in summary_text


def test_a_profile_of_no_batch_says_so():
    text = _profiled(DataLoader(TensorDataset(torch.zeros(0, 3)), batch_size=4))
    assert text == ("fastpipe.profile: nothing measured: the loop received no batch (an empty "
                    "loader, or one that ended at once)\n")


@pytest.mark.slow
def test_image_loader_warns_of_a_batch_larger_than_the_dataset(sample_root, no_thread_leak):
    from fastpipe import image_loader

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = image_loader(sample_root, 64, train=True, size=32, device="cpu", num_workers=0)
    loader.close()
    messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert messages == ["image_loader: batch_size=64 is larger than the 48 samples: every epoch "
                        "is one batch of 48, not 64; pass batch_size=16 (or at most 48), or use "
                        "more data"]
    assert caught[0].filename == __file__
    with pytest.raises(ValueError, match="drop_last=True leaves no batch at all; pass "
                                         "batch_size=48 or less, or drop_last=False"):
        image_loader(sample_root, 64, train=True, size=32, device="cpu", num_workers=0,
                     drop_last=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        image_loader(sample_root, 48, train=True, size=32, device="cpu", num_workers=0).close()
