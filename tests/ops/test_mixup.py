"""fastpipe.ops.Mixup against timm 1.0's Mixup (float images) and FastCollateMixup (uint8).

fastpipe draws its parameters from a torch generator and timm from NumPy, so each comparison
forces timm's draws to fastpipe's: its lam and CutMix choice (``_params_per_batch`` /
``_params_per_elem``) and its box centres (``np.random.randint``), then checks images and targets.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastpipe import ops
from fastpipe.ops import _extension

timm_mixup = pytest.importorskip("timm.data.mixup", exc_type=ImportError)

pytestmark = pytest.mark.timeout(120)

NUM_CLASSES = 7


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _batch(dtype, n=8, h=12, w=10, seed=0):
    g = _gen(seed)
    if dtype == torch.uint8:
        images = torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)
    else:
        images = torch.rand(n, 3, h, w, generator=g)
    return images, torch.randint(0, NUM_CLASSES, (n,), generator=g)


def _force_timm(timm_mixer, params, mode, minmax, monkeypatch):
    """Makes timm's next call draw fastpipe's ``params``."""
    lam = params["lam"].numpy()
    use_cutmix = params["use_cutmix"].numpy()
    if mode == "batch":
        timm_mixer._params_per_batch = lambda: (float(lam[0]), bool(use_cutmix[0]))
    else:
        timm_mixer._params_per_elem = lambda rows: (lam.astype(np.float32), use_cutmix.copy())
    # The integers timm's box functions ask np.random.randint for, in call order.
    draws = []
    for row in np.flatnonzero(use_cutmix):
        top, left, bottom, right = params["boxes"][row].tolist()
        if minmax is None:
            draws += params["centres"][row].tolist()
        else:
            draws += [bottom - top, right - left, top, left]
    values = iter(draws)
    monkeypatch.setattr(timm_mixup.np.random, "randint", lambda *a, **k: next(values))
    return values


def _timm_mix(kwargs, images, targets, params, monkeypatch):
    mode, minmax = kwargs["mode"], kwargs.get("cutmix_minmax")
    if images.dtype == torch.uint8:
        mixer = timm_mixup.FastCollateMixup(num_classes=NUM_CLASSES, **kwargs)
        left = _force_timm(mixer, params, mode, minmax, monkeypatch)
        batch = [(img.numpy().copy(), int(t)) for img, t in zip(images, targets)]
        out = mixer(batch)
    else:
        mixer = timm_mixup.Mixup(num_classes=NUM_CLASSES, **kwargs)
        left = _force_timm(mixer, params, mode, minmax, monkeypatch)
        out = mixer(images.clone(), targets.clone())
    assert next(left, None) is None, "timm drew fewer box integers than fastpipe made"
    monkeypatch.setattr(timm_mixup.np.random, "randint", np.random.randint)
    return out


RECIPES = {
    "mixup": dict(mixup_alpha=0.8, cutmix_alpha=0.0),
    "cutmix": dict(mixup_alpha=0.0, cutmix_alpha=1.0),
    "both": dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5),
    "minmax": dict(mixup_alpha=0.8, cutmix_alpha=0.0, cutmix_minmax=(0.2, 0.8)),
}


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("correct_lam", [True, False])
@pytest.mark.parametrize("prob", [1.0, 0.6])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_mixup_equals_timm_for_forced_lam_and_centres(
    mode, recipe, prob, correct_lam, dtype, backend, monkeypatch
):
    kwargs = dict(RECIPES[recipe], prob=prob, mode=mode, correct_lam=correct_lam,
                  label_smoothing=0.1)
    mixer = ops.Mixup(num_classes=NUM_CLASSES, generator=_gen(1), **kwargs)
    kinds = set()
    for seed in range(12):
        images, targets = _batch(dtype, seed=seed)
        params = mixer.make_params(images)
        mixed, soft = mixer.transform(images, targets, params)
        timm_images, timm_soft = _timm_mix(kwargs, images, targets, params, monkeypatch)
        kinds |= {("cutmix" if c else "mixup") if lam != 1 else "none"
                  for c, lam in zip(params["use_cutmix"].tolist(), params["lam"].tolist())}
        if dtype == torch.uint8 and mode == "batch":
            # timm blends with float32(1 - lam) where fastpipe's kernels take 1 - float32(lam):
            # an ulp apart, which can move a rounding of uint8 by one.
            assert (mixed.int() - timm_images.int()).abs().max() <= 1
        elif mode == "batch":
            torch.testing.assert_close(mixed, timm_images, rtol=0, atol=1e-6)
        else:
            assert torch.equal(mixed, timm_images)
        torch.testing.assert_close(soft, timm_soft)
    expected = {"mixup": {"mixup"}, "cutmix": {"cutmix"}, "both": {"mixup", "cutmix"},
                "minmax": {"mixup", "cutmix"}}[recipe]
    assert expected <= kinds
    assert ("none" in kinds) == (prob < 1)


def test_a_batch_left_unmixed_gets_label_smoothed_one_hot_targets(monkeypatch):
    mixer = ops.Mixup(mixup_alpha=1.0, prob=0.5, num_classes=NUM_CLASSES, generator=_gen(0))
    timm_mixer = timm_mixup.Mixup(mixup_alpha=1.0, prob=0.5, num_classes=NUM_CLASSES)
    unmixed = 0
    for seed in range(20):
        images, targets = _batch(torch.float32, seed=seed)
        params = mixer.make_params(images)
        if float(params["lam"][0]) != 1.0:
            continue
        unmixed += 1
        out, soft = mixer.transform(images, targets, params)
        assert torch.equal(out, images)
        expected = timm_mixup.mixup_target(targets, NUM_CLASSES, 1.0, 0.1)
        assert torch.equal(soft, expected)
        _force_timm(timm_mixer, params, "batch", None, monkeypatch)
        assert torch.equal(timm_mixer(images.clone(), targets)[1], soft)
    assert unmixed >= 3


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_kernels_and_reference_give_the_same_bits(mode, monkeypatch):
    for dtype in (torch.uint8, torch.float32, torch.bfloat16):
        images, targets = _batch(dtype if dtype != torch.bfloat16 else torch.float32, seed=3)
        images = images.to(dtype)
        results = []
        for kernels in (_extension.KERNELS, frozenset()):
            monkeypatch.setattr(_extension, "KERNELS", kernels)
            monkeypatch.setattr(_extension, "_warned", True)
            mixer = ops.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, mode=mode,
                              num_classes=NUM_CLASSES, generator=_gen(5))
            results.append([mixer(images, targets) for _ in range(6)])
        for (a, sa), (b, sb) in zip(*results):
            assert torch.equal(a, b) and torch.equal(sa, sb)


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_inplace_mixes_the_batch_itself_with_the_same_result(mode, backend):
    images, targets = _batch(torch.float32, seed=4)
    for seed in range(6):
        out, soft = ops.Mixup(0.8, 1.0, mode=mode, num_classes=NUM_CLASSES,
                              generator=_gen(seed))(images, targets)
        own = images.clone()
        out2, soft2 = ops.Mixup(0.8, 1.0, mode=mode, num_classes=NUM_CLASSES,
                                generator=_gen(seed), inplace=True)(own, targets)
        assert torch.equal(out, out2) and torch.equal(soft, soft2)
        assert out2.data_ptr() == own.data_ptr() or torch.equal(own, images)


def test_channels_last_and_odd_batches():
    images, targets = _batch(torch.float32, n=7, seed=2)
    for mode in ("batch", "pair", "elem"):
        mixer = ops.Mixup(0.8, 1.0, mode=mode, num_classes=NUM_CLASSES, generator=_gen(0))
        dense = mixer(images, targets)
        mixer.generator.manual_seed(0)
        cl_images, cl_soft = mixer(images.contiguous(memory_format=torch.channels_last), targets)
        assert cl_images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(cl_images, dense[0]) and torch.equal(cl_soft, dense[1])
        assert dense[1].shape == (7, NUM_CLASSES)
        torch.testing.assert_close(dense[1].sum(1), torch.ones(7))


def test_draws_follow_prob_switch_prob_and_beta():
    images = torch.zeros(2000, 1, 16, 16)
    mixer = ops.Mixup(0.4, 1.0, prob=0.7, switch_prob=0.3, mode="elem", num_classes=2,
                      generator=_gen(9))
    params = mixer.make_params(images)
    mixed = params["lam"] != 1.0
    assert 0.66 < mixed.double().mean() < 0.74
    assert 0.26 < params["use_cutmix"][mixed].double().mean() < 0.34
    blend = params["lam"][mixed & ~params["use_cutmix"]]
    # Beta(0.4, 0.4): mean 1/2, variance 1 / (4 (2 alpha + 1)) = 1/7.2
    assert abs(blend.mean() - 0.5) < 0.03 and abs(blend.var() - 1 / 7.2) < 0.02


def test_state_dict_resumes_the_draws():
    images, targets = _batch(torch.float32, seed=0)
    mixer = ops.Mixup(0.8, 1.0, mode="elem", num_classes=NUM_CLASSES, generator=_gen(3))
    mixer(images, targets)
    state = mixer.state_dict()
    assert state["version"] == 1
    expected = [mixer(images, targets) for _ in range(3)]
    other = ops.Mixup(0.8, 1.0, mode="elem", num_classes=NUM_CLASSES)
    other.load_state_dict(state)
    for (a, sa), (b, sb) in zip(expected, [other(images, targets) for _ in range(3)]):
        assert torch.equal(a, b) and torch.equal(sa, sb)
    with pytest.raises(ValueError, match="differently configured"):
        ops.Mixup(0.8, 1.0, mode="pair", num_classes=NUM_CLASSES).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        other.load_state_dict({"generator": state["generator"]})


def test_default_generator_is_seeded_from_torch_at_construction():
    images, targets = _batch(torch.float32, seed=0)
    torch.manual_seed(11)
    a = ops.Mixup(0.8, 1.0, num_classes=NUM_CLASSES)
    torch.manual_seed(11)
    b = ops.Mixup(0.8, 1.0, num_classes=NUM_CLASSES)
    for _ in range(4):
        assert torch.equal(a(images, targets)[0], b(images, targets)[0])


def test_mixup_enabled_false_stops_mixing():
    images, targets = _batch(torch.float32, seed=0)
    mixer = ops.Mixup(0.8, 1.0, mode="elem", num_classes=NUM_CLASSES, generator=_gen(0))
    mixer.mixup_enabled = False
    out, soft = mixer(images, targets)
    assert torch.equal(out, images)
    assert torch.equal(soft, timm_mixup.mixup_target(targets, NUM_CLASSES, 1.0, 0.1))


def test_float_images_are_differentiable():
    images = torch.rand(8, 3, 8, 8, requires_grad=True)
    mixer = ops.Mixup(0.8, 1.0, mode="pair", num_classes=3, generator=_gen(0))
    params = mixer.make_params(images)
    assert params["use_cutmix"].any() and (~params["use_cutmix"] & (params["lam"] < 1)).any()
    out, _ = mixer.transform(images, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), params)
    out.sum().backward()
    # A pair shares its weights (or its box), so each pixel's two shares add up to 1.
    torch.testing.assert_close(images.grad, torch.ones_like(images))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mixup_alpha=0.0, cutmix_alpha=0.0), "both 0"),
        (dict(mode="half"), "mode must be one of"),
        (dict(cutmix_minmax=(0.8, 0.2)), "cutmix_minmax"),
        (dict(prob=1.5), "prob"),
        (dict(label_smoothing=1.0), "label_smoothing"),
        (dict(mixup_alpha=-1.0), "mixup_alpha"),
        (dict(generator=0), "torch.Generator or None"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises((ValueError, TypeError, RuntimeError), match=message):
        ops.Mixup(**kwargs)


def test_bad_targets_are_named():
    mixer = ops.Mixup(num_classes=3)
    with pytest.raises(ValueError, match="class indices in"):
        mixer(torch.rand(2, 3, 4, 4), torch.tensor([0, 5]))


def test_cutmix_minmax_too_narrow_for_the_images_is_named():
    mixer = ops.Mixup(0.0, 1.0, cutmix_minmax=(0.3, 0.45), num_classes=NUM_CLASSES)
    with pytest.raises(ValueError, match="gives no box side for 4x4 images"):
        mixer(torch.rand(2, 3, 4, 4), torch.tensor([0, 1]))
