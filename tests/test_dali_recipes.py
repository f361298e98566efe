"""DALILoader's augmentation recipes in DALI's CPU mode: auto_augment policies, interpolation."""

from __future__ import annotations

import pytest
import torch
from dali_helpers import image_files, write_index_list

from fastpipe.dali import DALILoader
from fastpipe.dali.pipelines import AutoAugment

pytestmark = [pytest.mark.dali, pytest.mark.timeout(180)]

SIZE = 40
# A fixed crop: the whole image (area 1; DALI falls back to the full image whatever the aspect
# draws), no flip. Only the policy can change pixels from one run to the other.
FIXED = {"scale": (1.0, 1.0), "ratio": (0.5, 2.0), "hflip": 0.0, "size": SIZE, "device": "cpu"}


@pytest.fixture(scope="module")
def index_list(sample_root, tmp_path_factory):
    lists = tmp_path_factory.mktemp("lists")
    return write_index_list(lists / "index.txt", image_files(sample_root))


def epoch_by_label(loader) -> tuple[list[int], dict[int, torch.Tensor]]:
    order, images = [], {}
    for batch, labels in loader:
        for image, label in zip(batch, labels.tolist(), strict=True):
            order.append(label)
            images[label] = image.clone()
    return order, images


@pytest.fixture(scope="module")
def plain(index_list) -> dict[int, torch.Tensor]:
    with DALILoader(index_list, batch_size=16, seed=3, dtype=torch.uint8, **FIXED) as loader:
        order, images = epoch_by_label(loader)
    with DALILoader(index_list, batch_size=16, seed=4, dtype=torch.uint8, **FIXED) as loader:
        _, again = epoch_by_label(loader)
    # The crop really is fixed: another seed gives the same pixels without a policy.
    assert all(torch.equal(images[i], again[i]) for i in range(48))
    return images


@pytest.mark.parametrize("policy", ["ra", "ta_wide", "imagenet", "rand-m9-n2-inc1"])
def test_each_policy_changes_images_and_covers_every_sample_once(index_list, plain, policy):
    with DALILoader(index_list, batch_size=16, seed=3, dtype=torch.uint8, auto_augment=policy,
                    **FIXED) as loader:
        order, augmented = epoch_by_label(loader)
        assert sorted(order) == list(range(48)), "every sample once per epoch"
        second, _ = epoch_by_label(loader)
        assert sorted(second) == list(range(48)) and second != order
    assert augmented[0].shape == (3, SIZE, SIZE) and augmented[0].dtype == torch.uint8
    changed = sum(not torch.equal(augmented[i], plain[i]) for i in range(48))
    # Policies may draw the identity (TrivialAugment has it, the others skip ops by chance),
    # so not every image changes; most do.
    assert changed >= 36, f"{policy}: only {changed} of 48 images changed"


def test_policy_with_normalized_float_output(index_list):
    with DALILoader(index_list, batch_size=24, seed=0, auto_augment="ta_wide",
                    mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), **FIXED) as loader:
        images, labels = next(iter(loader))
    assert images.dtype == torch.float32 and images.shape == (24, 3, SIZE, SIZE)
    assert images.min() >= -2.0 - 1e-6 and images.max() <= 2.0 + 1e-6


@pytest.mark.parametrize(
    "policy, message",
    [
        ("augmix", "AugMix is not in nvidia.dali.auto_aug.*CPU path"),
        ("augmix-m5-w4", "AugMix"),
        ("rand-m9-mstd0.5", "mstd"),
        ("rand-m9-mmax10", "not 'mmax10'"),
        ("rand-m12", "m must be an int in 0-10"),
        ("original", "not a policy DALI can run.*'imagenet'"),
        ("cutmix", "not a policy DALI can run"),
    ],
)
def test_unsupported_policy_fails_at_construction(index_list, policy, message):
    with pytest.raises(ValueError, match=message):
        DALILoader(index_list, batch_size=4, device="cpu", auto_augment=policy)


def test_policy_is_a_train_option(index_list):
    with pytest.raises(ValueError, match="train augmentation"):
        DALILoader(index_list, batch_size=4, device="cpu", train=False, auto_augment="ra")
    with pytest.raises(TypeError, match="auto_augment must be"):
        DALILoader(index_list, batch_size=4, device="cpu", auto_augment=9)


def test_policy_names_map_to_the_reference_settings():
    ra = AutoAugment.parse("ra")
    assert (ra.kind, ra.num_ops, ra.magnitude, ra.num_magnitude_bins) == ("rand", 2, 9, 31)
    assert AutoAugment.parse("ta_wide").kind == "trivial"
    assert AutoAugment.parse("imagenet").kind == "auto"
    assert AutoAugment.parse(None) is None
    # timm: magnitudes 0-10 (11 bins), n ops, inc1 = the increasing (monotonic) ranges.
    timm = AutoAugment.parse("rand-m7-n3-mstd0-inc1")
    settings = (timm.num_ops, timm.magnitude, timm.num_magnitude_bins, timm.monotonic)
    assert settings == (3, 7, 11, True)
    assert AutoAugment.parse("rand-m9").monotonic is False


def test_bicubic_differs_from_bilinear(index_list):
    def first_batch(interpolation):
        with DALILoader(index_list, batch_size=8, train=False, size=SIZE, device="cpu",
                        interpolation=interpolation, dtype=torch.uint8) as loader:
            return next(iter(loader))[0]

    bilinear, bicubic = first_batch("bilinear"), first_batch("bicubic")
    from torchvision.transforms import InterpolationMode

    assert torch.equal(first_batch(InterpolationMode.BICUBIC), bicubic)
    difference = (bilinear.float() - bicubic.float()).abs()
    assert difference.mean() > 0.2 and difference.mean() < 8
