"""fastpipe/profiling/decode_choice.py: where images decode, chosen from measurements."""

from __future__ import annotations

import pytest
import torch

from fastpipe import Recipe
from fastpipe.gpu_decode import _backends
from fastpipe.profiling import decode_choice
from fastpipe.profiling.decode_choice import choose_decode, decode_candidates


def _rates(**rates):
    asked = []

    def measure(name):
        asked.append(name)
        value = rates[name]
        if isinstance(value, Exception):
            raise value
        return value

    return measure, asked


def test_without_a_gpu_the_cpu_path_is_chosen_unmeasured_and_the_choice_says_why():
    candidates, unavailable = decode_candidates(Recipe(train=True), torch.device("cpu"))
    measure, asked = _rates()
    choice = choose_decode(candidates, unavailable, measure)
    assert choice.decode == "cpu" and asked == []
    assert "only decode that can run here" in choice.why
    assert "gpu: needs a CUDA device" in choice.why and "dali: needs a CUDA device" in choice.why


@pytest.mark.parametrize("rates, step_rate, chosen, words", [
    ({"cpu": 1000.0, "gpu": 1400.0}, None, "gpu", "1.40x"),
    ({"cpu": 1000.0, "gpu": 1050.0}, None, "cpu", "no other decode feeds more than 10%"),
    ({"cpu": 1000.0, "gpu": 3000.0}, 800.0, "cpu", "feeds the step's 800 images/s"),
    ({"cpu": 500.0, "gpu": 900.0, "dali": 1200.0}, 1000.0, "dali", "2.40x"),
    ({"cpu": 1000.0, "gpu": RuntimeError("CUDA out of memory")}, None, "cpu", "measured cpu"),
])
def test_the_choice_follows_the_measurements(rates, step_rate, chosen, words):
    measure, asked = _rates(**rates)
    unavailable: dict[str, str] = {}
    choice = choose_decode(list(rates), unavailable, measure, step_rate=step_rate)
    assert choice.decode == chosen and words in choice.why
    assert asked == list(rates)
    if isinstance(rates.get("gpu"), Exception):
        assert "CUDA out of memory" in choice.unavailable["gpu"]
    assert choice.to_dict()["decode"] == chosen


def test_on_a_gpu_the_candidates_are_what_is_installed_and_what_the_recipe_allows(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(_backends, "available_backends",
                        lambda: {"nvimgcodec": None, "torchvision": None})
    monkeypatch.setattr(decode_choice, "_dali_problem", lambda recipe, kind: None)
    import fastpipe.gpu_decode as gpu_decode

    monkeypatch.setattr(gpu_decode, "available_backends", _backends.available_backends)
    assert decode_candidates(Recipe(train=True), cuda)[0] == ["cpu", "gpu", "dali"]
    candidates, unavailable = decode_candidates(Recipe(train=True, auto_augment="ra"), cuda)
    assert candidates == ["cpu", "dali"] and "decode='cpu'" in unavailable["gpu"]
    monkeypatch.setattr(gpu_decode, "available_backends",
                        lambda: {"nvimgcodec": "not installed", "torchvision": "CPU build"})
    candidates, unavailable = decode_candidates(Recipe(train=True), cuda)
    assert candidates == ["cpu", "dali"] and "nvimgcodec: not installed" in unavailable["gpu"]


def test_the_tuner_places_the_decode_of_a_fastpipe_image_dataset(sample_root):
    from fastpipe.data import ImageFolder
    from fastpipe.profiling.tuner import place_decode

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the choice is measured")
    choice = place_decode(ImageFolder(sample_root, train=True, size=32), 2, 8)
    assert choice.decode == "cpu" and "needs a CUDA device" in choice.why
    assert place_decode(list(range(10)), 2, 8) is None  # not a fastpipe image dataset


@pytest.mark.timeout(60)
def test_fastpipe_tune_says_where_the_images_decode_and_why(capsys, sample_root, no_thread_leak):
    from fastpipe._cli import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the choice is measured")
    code = main(["tune", str(sample_root), "--size", "32", "--batch-size", "8", "--workers", "0",
                 "--batch-sizes", "8", "--wrappers", "DataLoader", "--budget", "1",
                 "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert ("note: decode: cpu (the CPU path is the only decode that can run here (dali: needs "
            "a CUDA device") in out
    assert "image_loader(decode='cpu') builds it" in out
