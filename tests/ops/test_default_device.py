"""The ops draw their random parameters on the CPU whatever torch's default device is.

``torch.set_default_device("cuda")`` (common in LLM training scripts) makes every factory call
without a ``device=`` allocate on the GPU: a draw made there comes from another generator (a CPU
``generator=`` cannot even be passed to it), and its values cannot be read as NumPy. The ops must
give, for one seed, the same result under any default device. ``meta`` stands in for ``cuda``
here: a draw that follows the default device lands on ``meta`` and fails, as it would land on the
GPU (the cuda lane repeats the check with ``"cuda"``).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from fastpipe import ops

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _images(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (6, 3, 17, 13), dtype=dtype, generator=g)
    return torch.randn(6, 3, 17, 13, generator=g).to(dtype)


def _targets() -> torch.Tensor:
    return torch.tensor([0, 3, 1, 9, 3, 2])


# name -> call(images, targets, generator): every random op and batch transform, with an
# explicit generator and with torch's global one (seeded before the call or the construction).
CALLS = {
    "cutout": lambda x, t, g: ops.cutout(x, 2, 5, fill=(1, 2, 3), generator=g),
    "cutout inplace": lambda x, t, g: ops.cutout(x, 3, 4, generator=g, inplace=True),
    "cutout global": lambda x, t, g: ops.cutout(x, 2, 5),
    "random_erasing": lambda x, t, g: ops.random_erasing(x, p=0.9, value=3, max_count=2,
                                                          generator=g),
    "random_erasing rand": lambda x, t, g: ops.random_erasing(x, p=1.0, value="rand",
                                                               max_count=3, generator=g),
    "random_erasing pixel": lambda x, t, g: ops.random_erasing(x, p=1.0, value="random",
                                                                generator=g),
    "random_erasing global": lambda x, t, g: ops.random_erasing(x, p=1.0, min_count=2,
                                                                 max_count=3),
    "mixup": lambda x, t, g: ops.mixup(x, t, 0.4, 10, label_smoothing=0.1, generator=g),
    "mixup global": lambda x, t, g: ops.mixup(x, t, 0.4, 10),
    "cutmix": lambda x, t, g: ops.cutmix(x, t, 1.0, 10, generator=g),
    "cutmix global": lambda x, t, g: ops.cutmix(x, t, 1.0, 10),
    "Mixup batch": lambda x, t, g: ops.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=10,
                                             generator=g)(x, t),
    "Mixup pair": lambda x, t, g: ops.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, mode="pair",
                                            num_classes=10, generator=g)(x, t),
    "Mixup elem": lambda x, t, g: ops.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem",
                                            num_classes=10, generator=g)(x, t),
    "Mixup minmax": lambda x, t, g: ops.Mixup(cutmix_minmax=(0.2, 0.8), mode="elem",
                                              num_classes=10, generator=g)(x, t),
    "Mixup global": lambda x, t, g: ops.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0,
                                              num_classes=10)(x, t),
    "RandomErasing": lambda x, t, g: ops.RandomErasing(probability=1.0, mode="pixel",
                                                       max_count=2, generator=g)(x),
    "RandomErasing rand": lambda x, t, g: ops.RandomErasing(probability=1.0, mode="rand",
                                                            generator=g)(x, t),
    "RandomErasing global": lambda x, t, g: ops.RandomErasing(probability=1.0)(x),
    "normalize": lambda x, t, g: ops.normalize(x, MEAN, STD),
    "normalize half channels_last": lambda x, t, g: ops.normalize(
        x, MEAN, STD, dtype=torch.float16, channels_last=True),
}


def _run(name: str, dtype: torch.dtype, how: str | None = None):
    """The call on CPU images made outside the default-device context, the call inside it."""
    images, targets = _images(dtype), _targets()
    generator = torch.Generator().manual_seed(3)
    torch.manual_seed(7)  # the global generator, for the calls that use it
    with _default_device(how):
        return CALLS[name](images, targets, generator)


@contextlib.contextmanager
def _default_device(how: str | None):
    if how is None:
        yield
        return
    if how == "context":
        with torch.device("meta"):
            yield
        return
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("how", ["context", "set_default_device"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("name", list(CALLS))
def test_one_seed_gives_the_same_result_whatever_the_default_device(name, dtype, how, backend):
    expected = _run(name, dtype)
    got = _run(name, dtype, how)
    for a, b in zip(torch.utils._pytree.tree_leaves(got),
                    torch.utils._pytree.tree_leaves(expected), strict=True):
        assert a.device.type == "cpu" and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b), name


def test_the_default_device_is_left_as_it_was():
    images = _images(torch.float32)
    with torch.device("meta"):
        ops.cutout(images, 1, 4)
        assert torch.empty(1).device.type == "meta"
    assert torch.empty(1).device.type == "cpu"
