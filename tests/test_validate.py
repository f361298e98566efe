"""fastpipe._validate: one behaviour for every argument check (bools refused everywhere)."""

from __future__ import annotations

import pytest

from fastpipe import _validate as check


@pytest.mark.parametrize("helper", [check.positive_int, check.non_negative_int])
@pytest.mark.parametrize("flag", [True, False])
def test_ints_refuse_bools_and_say_so(helper, flag):
    with pytest.raises(TypeError, match=r"num_workers must be .* got the bool .*not a flag"):
        helper("num_workers", flag)


@pytest.mark.parametrize("helper", [check.probability, check.positive_float])
def test_numbers_refuse_bools_and_name_the_fix(helper):
    with pytest.raises(TypeError, match=r"hflip must be .* got the bool True.*hflip=0.5"):
        helper("hflip", True)


def test_positive_int():
    assert check.positive_int("batch_size", 3) == 3
    import numpy as np

    assert type(check.positive_int("batch_size", np.int64(4))) is int
    with pytest.raises(ValueError, match=r"batch_size must be a positive int \(>= 1\), got 0"):
        check.positive_int("batch_size", 0)
    with pytest.raises(TypeError, match=r"batch_size must be a positive int, got 2.0 \(float\)"):
        check.positive_int("batch_size", 2.0)
    with pytest.raises(TypeError, match="batch_size=2"):
        check.positive_int("batch_size", "2")


def test_non_negative_int():
    assert check.non_negative_int("num_workers", 0) == 0
    with pytest.raises(ValueError, match="num_workers must be an int >= 0, got -1"):
        check.non_negative_int("num_workers", -1)


def test_probability():
    assert check.probability("hflip", 0) == 0.0 and check.probability("hflip", 1) == 1.0
    for bad in (-0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="hflip must be a probability in"):
            check.probability("hflip", bad)
    with pytest.raises(TypeError, match="hflip must be a probability"):
        check.probability("hflip", "0.5")


def test_positive_float():
    assert check.positive_float("alpha", 0.2) == 0.2
    with pytest.raises(ValueError, match="alpha must be a positive number, got 0.0"):
        check.positive_float("alpha", 0)


def test_pair():
    assert check.pair("scale", (0.08, 1)) == (0.08, 1.0)
    assert check.pair("scale", [0.5, 0.5]) == (0.5, 0.5)
    assert check.pair("shift", (0, 1), strict_low=False) == (0.0, 1.0)
    with pytest.raises(ValueError, match=r"scale must be \(low, high\) with high >= low > 0"):
        check.pair("scale", (0.9, 0.1))
    with pytest.raises(ValueError, match="scale must be .* > 0"):
        check.pair("scale", (0, 1))
    with pytest.raises(ValueError, match="got 3 values"):
        check.pair("scale", (0.1, 0.2, 0.3))
    with pytest.raises(TypeError, match="pair of numbers"):
        check.pair("scale", "ab")
    with pytest.raises(TypeError, match="got the bool"):
        check.pair("scale", (True, 1))


def test_size_pair():
    assert check.size_pair("size", 224) == (224, 224)
    assert check.size_pair("size", (32, 40)) == (32, 40)
    with pytest.raises(TypeError, match="got the bool"):
        check.size_pair("size", True)
    with pytest.raises(ValueError, match="size must be a positive int"):
        check.size_pair("size", (32, 0))
    with pytest.raises(TypeError, match=r"size must be an int or a \(height, width\) pair"):
        check.size_pair("size", (1, 2, 3))


def test_choice():
    assert check.choice("backend", "cpu", ("auto", "cpu")) == "cpu"
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'cpu'; got 'gpu'"):
        check.choice("backend", "gpu", ("auto", "cpu"))


def test_optional_seed():
    assert check.optional_seed("seed", None) is None
    assert check.optional_seed("seed", 5) == 5
    with pytest.raises(TypeError, match="got the bool"):
        check.optional_seed("seed", True)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        check.optional_seed("seed", -1)
