"""DALILoader's augmentation recipes in DALI's CPU mode: auto_augment policies, interpolation."""

from __future__ import annotations

import pytest
import torch

from fastpipe.recipe import Policy
from tests.helpers.dali import DALI_MISSING

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)

from fastpipe.dali import DALILoader  # noqa: E402

pytestmark = [pytest.mark.dali, pytest.mark.timeout(180)]

SIZE = 40
# A fixed crop: the whole image (area 1; DALI falls back to the full image whatever the aspect
# draws), no flip. Only the policy can change pixels from one run to the other. An aspect draw
# within a pixel of the image's own gives a crop a pixel short instead: the wide range makes that
# rare, and the seeds below (the draws are a function of them) draw none.
FIXED = {"scale": (1.0, 1.0), "ratio": (0.01, 100.0), "hflip": 0.0, "size": SIZE,
         "device": "cpu"}


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


@pytest.mark.parametrize("policy", ["ra", "ta_wide", "imagenet", "rand-m9-n2-inc1-p1"])
@pytest.mark.slow
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


@pytest.mark.slow
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
        ("augmix-m5-w4", "timm's 'augmix' policies are not implemented"),
        ("rand-m9-mstd0.5", "mstd"),
        ("rand-m9-mmax10", "not 'mmax10'"),
        ("rand-m12", "m must be an int in 0-10"),
        ("rand-m9-n2-inc1", "probability 0.5.*'-p1'"),
        ("original", "not implemented.*'imagenet'"),
        ("cutmix", "unknown auto_augment policy"),
    ],
)
def test_unsupported_policy_fails_at_construction(index_list, policy, message):
    with pytest.raises(ValueError, match=message):
        DALILoader(index_list, batch_size=4, device="cpu", auto_augment=policy)


def test_policy_is_a_train_option(index_list):
    with pytest.raises(ValueError, match="augmentation is for training"):
        DALILoader(index_list, batch_size=4, device="cpu", train=False, auto_augment="ra")
    with pytest.raises(TypeError, match="auto_augment must be"):
        DALILoader(index_list, batch_size=4, device="cpu", auto_augment=9)


def test_policy_names_map_to_the_reference_settings(monkeypatch):
    """The parsed policy, and the nvidia.dali.auto_aug call it becomes (recorded)."""
    from fastpipe.dali import pipelines

    calls = []
    for module, name in ((pipelines.rand_augment, "rand_augment"),
                         (pipelines.trivial_augment, "trivial_augment_wide"),
                         (pipelines.auto_augment, "auto_augment")):
        monkeypatch.setattr(module, name, lambda images, _n=name, **kw: calls.append((_n, kw)))
    for name in ("ra", "ta_wide", "imagenet", "rand-m7-n3-mstd0-inc1-p1", "rand-m9-p1"):
        pipelines._apply_policy(Policy.parse(name), None, (40, 40), seed=3)
    ra, ta, imagenet, timm, timm_decreasing = calls
    assert ra[0] == "rand_augment" and (ra[1]["n"], ra[1]["m"], ra[1]["num_magnitude_bins"]) == (
        2, 9, 31)
    assert ta[0] == "trivial_augment_wide" and ta[1]["max_translate_abs"] == 32
    assert imagenet[0] == "auto_augment" and imagenet[1]["policy_name"] == "image_net"
    # timm: magnitudes 0-10 (11 bins), n ops, inc1 = the increasing (monotonic) ranges.
    settings = (timm[1]["n"], timm[1]["m"], timm[1]["num_magnitude_bins"],
                timm[1]["monotonic_mag"])
    assert settings == (3, 7, 11, True)
    assert timm_decreasing[1]["monotonic_mag"] is False
    assert Policy.parse(None) is None


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
