"""auto_augment= on the CPU path's datasets (fastpipe.data.datasets.per_sample): policies change
pixels, timm's strings are parsed as timm parses them, what cannot run is refused at construction,
and the faster ops give torchvision's pixels. The per-sample draws they run under are in
test_random.py."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from fastpipe.data import ImageFolder
from fastpipe.data.datasets.per_sample import TimmRandAugment, auto_augment_transform

pytestmark = pytest.mark.timeout(180)

SIZE = 48


# ---------------------------------------------------------------- auto_augment


@pytest.mark.parametrize("policy", ["ra", "ta_wide", "augmix", "imagenet", "rand-m9-mstd0.5-inc1",
                                    "rand-m7-n3-p1.0", "rand-m10-mstd101-mmax10-inc0"])
@pytest.mark.slow
def test_each_policy_changes_images_with_a_fixed_crop(sample_root, policy):
    """A crop that is always the whole image (area 1, any aspect ratio), no flip: only the
    policy changes pixels."""
    fixed = {"train": True, "size": SIZE, "scale": (1.0, 1.0), "ratio": (0.01, 100.0),
             "hflip": 0.0}
    plain = ImageFolder(sample_root, **fixed, seed=1)
    augmented = ImageFolder(sample_root, **fixed, auto_augment=policy, seed=2)
    changed = sum(not torch.equal(plain[i][0], augmented[i][0]) for i in range(12))
    assert changed >= 6, changed
    assert augmented[0][0].dtype == torch.uint8 and augmented[0][0].shape == (3, SIZE, SIZE)


@pytest.mark.parametrize("name, match", [
    ("randaugment", "unknown auto_augment policy"), ("rand-m9-x3", "section 'x3'"),
    ("rand-m9-tweights", "'tweights'"),
    ("rand-mfoo", "section 'mfoo'"), ("autoaug", "unknown auto_augment policy"),
    ("augmix-m5-w4-d2", "'augmix' policies are not implemented"),
    ("original-mstd0.5", "not implemented"),
])
def test_policies_that_cannot_run_fail_at_construction_listing_the_accepted(sample_root, name,
                                                                           match):
    with pytest.raises(ValueError, match=match) as info:
        ImageFolder(sample_root, auto_augment=name)
    assert "'ra', 'ta_wide', 'augmix', 'imagenet'" in str(info.value)


def test_timm_string_is_parsed_as_timm_parses_it():
    timm_aa = pytest.importorskip("timm.data.auto_augment")
    ours = auto_augment_transform("rand-m9-mstd0.5-inc1")
    theirs = timm_aa.rand_augment_transform("rand-m9-mstd0.5-inc1", {})
    assert isinstance(ours, TimmRandAugment)
    assert list(ours.ops) == [op.name for op in theirs.ops]
    assert (ours.magnitude, ours.magnitude_std, ours.prob, ours.num_layers) == (
        theirs.ops[0].magnitude, theirs.ops[0].magnitude_std, theirs.ops[0].prob,
        theirs.num_layers)
    assert list(auto_augment_transform("rand-m9").ops) == list(timm_aa._RAND_TRANSFORMS)
    assert auto_augment_transform("rand-mstd200").magnitude_std == float("inf")


@pytest.mark.parametrize("name", ["Invert", "Posterize", "PosterizeIncreasing", "Solarize",
                                  "SolarizeIncreasing", "SolarizeAdd"])
@pytest.mark.parametrize("magnitude", [0.0, 3.0, 9.0, 10.0])
def test_pointwise_ops_equal_timms_for_a_forced_magnitude(name, magnitude):
    """The ops without randomness or resampling, pixel for pixel against timm's PIL ops."""
    timm_aa = pytest.importorskip("timm.data.auto_augment")
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
    ours = TimmRandAugment()._apply(name, torch.from_numpy(pixels).permute(2, 0, 1), magnitude)
    try:
        theirs = timm_aa.AugmentOp(name, prob=1.0, magnitude=magnitude)(Image.fromarray(pixels))
    except ValueError:  # Pillow >= 10 refuses timm's posterize to 0 bits; here: all bits cleared
        assert name.startswith("Posterize") and not ours.any()
        return
    np.testing.assert_array_equal(ours.permute(1, 2, 0).numpy(), np.asarray(theirs))


def test_magnitude_noise_is_drawn_per_op_and_clipped(monkeypatch):
    """mstd is honoured, not dropped: magnitudes vary around m, within [0, mmax]."""
    policy = TimmRandAugment.from_string("rand-m9-mstd2-n4-p1.0")
    magnitudes = []
    monkeypatch.setattr(policy, "_apply", lambda name, image, m: magnitudes.append(m) or image)
    torch.manual_seed(0)
    for _ in range(50):
        policy(torch.zeros(3, 8, 8, dtype=torch.uint8))
    assert len(magnitudes) == 200 and len(set(magnitudes)) > 50
    assert 0.0 <= min(magnitudes) and max(magnitudes) == 10.0
    assert abs(np.mean(magnitudes) - 9) < 1.0


# ---------------------------------------------------------------- faster ops, same pixels


@pytest.mark.parametrize("factor", [0.0, 0.1, 0.5, 0.77, 1.0, 1.3, 1.9])
@pytest.mark.slow
def test_sharpness_equals_torchvisions_pixel_for_pixel(factor):
    from torchvision.transforms.v2 import functional as F

    from fastpipe.data.datasets.per_sample import _sharpness

    for seed in range(10):
        generator = torch.Generator().manual_seed(seed)
        image = torch.randint(0, 256, (3, 23 + seed, 31), dtype=torch.uint8, generator=generator)
        assert torch.equal(_sharpness(image, factor), F.adjust_sharpness(image, factor))
    batch = torch.randint(0, 256, (2, 3, 9, 8), dtype=torch.uint8)
    assert torch.equal(_sharpness(batch, factor), F.adjust_sharpness(batch, factor))


@pytest.mark.parametrize("threshold", [0.0, 0.5, 8.5, 127.0, 127.5, 200.1, 255.0,
                                       255 * float(torch.linspace(1.0, 0.0, 10)[3])])
def test_solarize_equals_torchvisions_pixel_for_pixel(threshold):
    from torchvision.transforms.v2 import functional as F

    from fastpipe.data.datasets.per_sample import _solarize

    image = torch.arange(256, dtype=torch.uint8).repeat(3, 2, 1)
    assert torch.equal(_solarize(image, threshold), F.solarize(image, threshold))


@pytest.mark.parametrize("policy, reference", [
    ("ra", "v2.RandAugment(interpolation=BILINEAR)"),
    ("ta_wide", "v2.TrivialAugmentWide(interpolation=BILINEAR)"),
    ("augmix", "v2.AugMix(interpolation=BILINEAR)"),
    ("imagenet", "v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET, interpolation=BILINEAR)")])
@pytest.mark.slow
def test_torchvision_policies_give_torchvisions_pixels_for_the_same_draws(policy, reference):
    """The policies run torchvision's own classes (faster Sharpness and Solarize only): for the
    same global seed, the same output, pixel for pixel."""
    from torchvision.transforms import InterpolationMode, v2

    ours = auto_augment_transform(policy)
    theirs = eval(reference, {"v2": v2, "BILINEAR": InterpolationMode.BILINEAR})
    generator = torch.Generator().manual_seed(0)
    for seed in range(30):
        image = torch.randint(0, 256, (3, 40, 48), dtype=torch.uint8, generator=generator)
        torch.manual_seed(seed)
        got = ours(image)
        torch.manual_seed(seed)
        assert torch.equal(got, theirs(image)), (policy, seed)
    assert pickle.loads(pickle.dumps(ours)).__class__ is type(ours)
