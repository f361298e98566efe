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


# Every part of fastpipe uses these checks: a flag passed where a number belongs is refused with a
# message naming the parameter, for the parameters that took ``True`` as 1 before the checks were
# shared (and for those that already refused it). One test per module family.

_BOOL = r"got the bool True"


def test_wrong_types_are_type_errors_that_old_value_error_handlers_still_catch():
    with pytest.raises(check.ArgumentTypeError) as caught:
        check.positive_int("batch_size", 1.5)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)
    with pytest.raises(ValueError, match="cutout: size must be a positive int"):
        check.positive_int("size", 0, where="cutout")
    # The fix names the parameter alone, not the prefix.
    with pytest.raises(TypeError, match=r"^cutout: size must be .*pass an int such as size=2$"):
        check.positive_int("size", "2", where="cutout")


def test_loaders_refuse_a_bool_prefetch_depth():
    import torch
    from torch.utils.data import TensorDataset

    from fastpipe import DataLoaderX, DataPrefetcher
    from fastpipe._background import BackgroundIterator

    data = TensorDataset(torch.zeros(4, 2))
    with pytest.raises(TypeError, match=f"prefetch_depth must be a positive int, {_BOOL}"):
        DataLoaderX(data, prefetch_depth=True)
    with pytest.raises(TypeError, match=f"prefetch_depth must be a positive int, {_BOOL}"):
        DataPrefetcher([torch.zeros(2, 3, 4, 4)], device="cpu", prefetch_depth=True)
    with pytest.raises(TypeError, match=f"prefetch_depth must be a positive int, {_BOOL}"):
        BackgroundIterator(iter([]), prefetch_depth=True)


def test_ops_refuse_bools_and_name_the_op():
    import torch

    from fastpipe import ops

    images = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    targets = torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match=f"^cutout: num_holes must be an int >= 0, {_BOOL}"):
        ops.cutout(images, num_holes=True)
    with pytest.raises(TypeError, match=f"^cutout: size must be a positive int, {_BOOL}"):
        ops.cutout(images, size=True)
    # p=True was taken as 1.0 before.
    with pytest.raises(TypeError, match=f"^random_erasing: p must be a probability .*{_BOOL}"):
        ops.random_erasing(images, p=True)
    with pytest.raises(TypeError, match=f"max_count must be a positive int, {_BOOL}"):
        ops.random_erasing(images, max_count=True)
    with pytest.raises(TypeError, match=f"^mixup: alpha must be a positive number, {_BOOL}"):
        ops.mixup(images.float(), targets, True, 3)
    with pytest.raises(TypeError, match=f"^mixup: num_classes must be a positive int, {_BOOL}"):
        ops.mixup(images.float(), targets, 1.0, True)
    # probability=True was taken as 1.0 before.
    with pytest.raises(TypeError, match=f"^RandomErasing: probability must be .*{_BOOL}"):
        ops.RandomErasing(probability=True)
    with pytest.raises(TypeError, match=f"^Mixup: prob must be a probability .*{_BOOL}"):
        ops.Mixup(num_classes=3, prob=True)
    with pytest.raises(TypeError, match=f"^Mixup: mixup_alpha must be a number >= 0, {_BOOL}"):
        ops.Mixup(num_classes=3, mixup_alpha=True)


def test_data_refuses_bools(tmp_path):
    from fastpipe.data import DistributedSampler, ImageDecoder, RandomSampler

    # hflip=True and scale=(True, 1) were taken as numbers before.
    with pytest.raises(TypeError, match=f"hflip must be a probability in \\[0, 1\\], {_BOOL}"):
        ImageDecoder(train=True, size=32, hflip=True)
    with pytest.raises(TypeError, match=f"scale must be .*{_BOOL}"):
        ImageDecoder(train=True, size=32, scale=(True, 1.0))
    with pytest.raises(TypeError, match=f"size must be a positive int, {_BOOL}"):
        ImageDecoder(train=True, size=True)
    with pytest.raises(ValueError, match=r"size must be a positive int \(>= 1\), got 0"):
        ImageDecoder(train=True, size=(32, 0))
    sampler = RandomSampler(range(4), seed=0)
    with pytest.raises(TypeError, match=f"epoch must be an int >= 0, {_BOOL}"):
        sampler.set_epoch(True)
    with pytest.raises(TypeError, match=f"seed must be an int >= 0, {_BOOL}"):
        RandomSampler(range(4), seed=True)
    # world_size=True was taken as 1 before.
    with pytest.raises(TypeError, match=f"world_size must be a positive int, {_BOOL}"):
        DistributedSampler(range(4), world_size=True, rank=0)


def test_dali_cpu_mode_refuses_bools(tmp_path):
    pytest.importorskip("nvidia.dali")
    from fastpipe.dali import DALILoader

    for name in ("batch_size", "num_workers", "prefetch_depth"):
        arguments = {"batch_size": 2, "device": "cpu", name: True}
        with pytest.raises(TypeError, match=f"{name} must be a positive int, {_BOOL}"):
            DALILoader(tmp_path, **arguments)
    # hflip=True was taken as 1.0 before.
    with pytest.raises(TypeError, match=f"hflip must be a probability .*{_BOOL}"):
        DALILoader(tmp_path, batch_size=2, device="cpu", hflip=True)


def test_pack_and_profile_refuse_bools(tmp_path):
    from fastpipe import profile
    from fastpipe.pack import PackOptions, pack

    with pytest.raises(TypeError, match=f"num_workers must be a positive int, {_BOOL}"):
        pack(tmp_path / "missing", tmp_path / "out.h5", num_workers=True)
    # shard_size=True was taken as 1 before.
    with pytest.raises(TypeError, match=f"shard_size must be a positive int, {_BOOL}"):
        PackOptions(shard_size=True)
    # batch_size=True was taken as 1 before.
    with pytest.raises(TypeError, match=f"batch_size must be a positive int, {_BOOL}"):
        profile([], batch_size=True, report=False)
    with pytest.raises(TypeError, match=f"warmup must be an int >= 0, {_BOOL}"):
        profile([], warmup=True, report=False)
