"""fastpipe.ops: semantics, random parameters and argument checks (with or without the extension).

The compiled kernels are compared with the reference in tests/ops/test_extension.py; here the
reference itself is checked against naive per-sample implementations of the published
definitions (torchvision, timm, the Cutout paper), and the random parameters against their
distributions.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from fastpipe import ops
from fastpipe.ops import _extension, _functional, _params, _reference

pytestmark = pytest.mark.timeout(60)


def _images(n=4, c=3, h=12, w=10, dtype=torch.uint8, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)
    return torch.rand(n, c, h, w, generator=g).to(dtype)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---- the reference against naive implementations of the definitions ----


def _naive_erase(images, boxes, fill):
    out = images.clone()
    for n in range(images.shape[0]):
        for top, left, bottom, right in boxes[n].tolist():
            out[n, :, max(top, 0) : max(bottom, 0), max(left, 0) : max(right, 0)] = fill.view(
                -1, 1, 1
            )
    return out


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_reference_erase_fills_exactly_the_boxes(dtype):
    images = _images(dtype=dtype)
    boxes = torch.tensor(
        [
            [[0, 0, 3, 3], [2, 2, 5, 7]],  # overlapping boxes
            [[10, 8, 40, 40], [0, 0, 0, 5]],  # beyond the border; empty
            [[-3, -3, 2, 2], [5, 5, 5, 5]],  # before the border; empty
            [[0, 0, 12, 10], [0, 0, 1, 1]],  # the whole image
        ]
    )
    fill = torch.tensor([7, 8, 9]).to(dtype)
    assert torch.equal(_reference.erase(images, boxes, fill), _naive_erase(images, boxes, fill))


def test_reference_noise_is_keyed_by_seed_and_position_only():
    images = torch.zeros(3, 2, 6, 6)
    full = torch.tensor([[[0, 0, 6, 6]]] * 3)
    seeds = torch.tensor([5, 5, 6])
    out = _reference.erase(images, full, torch.zeros(2), seeds)
    assert torch.equal(out[0], out[1])  # same seed, same noise
    assert not torch.equal(out[0], out[2])
    # A smaller box shows the same noise where it overlaps: the noise depends on the position.
    part = _reference.erase(images, torch.tensor([[[2, 1, 5, 4]]] * 3), torch.zeros(2), seeds)
    assert torch.equal(part[:, :, 2:5, 1:4], out[:, :, 2:5, 1:4])
    assert bool((part[:, :, :2] == 0).all())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bfloat16])
def test_the_reference_has_no_data_dependent_shape_so_no_synchronization(dtype):
    # On a GPU an op whose output shape depends on the data (nonzero, boolean indexing) makes
    # the host wait for the GPU. meta tensors hold no data, so such an op cannot run on them:
    # every reference op, the noise of erase included, must.
    meta = torch.device("meta")
    images = torch.empty(4, 3, 16, 12, dtype=dtype, device=meta)
    boxes = torch.empty(4, 2, 4, dtype=torch.int64, device=meta)
    fill = torch.empty(3, dtype=dtype, device=meta)
    seeds = torch.empty(4, dtype=torch.int64, device=meta)
    per_box = torch.empty(4, 2, 3, dtype=dtype, device=meta)
    lam = torch.empty(4, dtype=torch.float32, device=meta)
    for out in (
        _reference.erase(images, boxes, fill, seeds),
        _reference.erase(images, boxes, fill),
        _reference.erase(images, boxes, per_box),
        _reference.mixup(images, lam),
        _reference.cutmix(images, boxes[:, 0]),
        _reference.normalize(images, fill.float(), fill.float()),
    ):
        assert out.device == meta and out.shape == images.shape
    _reference.erase_(images, boxes, fill, seeds)
    _reference.mixup_(images, lam)
    _reference.cutmix_(images, boxes[:, 0])


def test_reference_noise_in_a_large_batch_equals_the_noise_of_each_sample():
    # The noise is made a few samples at a time; the result must not depend on the grouping.
    images = torch.zeros(9, 3, 300, 301)
    boxes = torch.tensor([[[5, 7, 290, 280]]] * 9)
    seeds = torch.arange(100, 109)
    whole = _reference.erase(images, boxes, torch.zeros(3), seeds)
    for i in range(9):
        rows = slice(i, i + 1)
        one = _reference.erase(images[rows], boxes[rows], torch.zeros(3), seeds[rows])
        assert torch.equal(whole[rows], one)


def test_reference_normal_noise_moments():
    counter = torch.arange(200_000)
    z = _reference.noise_normal(torch.full_like(counter, 12345), counter).double()
    assert abs(z.mean().item()) < 0.01
    assert abs(z.std().item() - 1.0) < 0.01
    assert abs(((z - z.mean()) ** 3).mean().item()) < 0.03
    assert 2.8 < (z**4).mean().item() < 3.0  # Irwin-Hall(12): kurtosis 2.9
    assert z.abs().max().item() <= 6.0
    neighbours = torch.corrcoef(torch.stack((z[1:], z[:-1])))[0, 1].item()
    assert abs(neighbours) < 0.01
    b = _reference.noise_byte(torch.full_like(counter, 7), counter)
    counts = torch.bincount(b.long(), minlength=256).double()
    expected = counter.numel() / 256
    assert ((counts - expected) ** 2 / expected).sum().item() < 330  # chi2(255), p ~ 0.001


def test_reference_hash_matches_uint32_arithmetic():
    # The same steps in plain Python with explicit 32-bit wrap-around.
    def hash32(x):
        x ^= x >> 16
        x = (x * 0x21F0AAAD) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x735A2D97) & 0xFFFFFFFF
        return x ^ (x >> 15)

    values = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 123456789]
    got = _reference.hash32(torch.tensor(values)).tolist()
    assert got == [hash32(v) for v in values]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float16])
def test_reference_mixup_is_timms_blend(dtype):
    images = _images(n=5, dtype=dtype)
    lam = torch.tensor([0.3, 0.5, 0.7, 0.25, 1.0])
    out = _reference.mixup(images, lam)
    for i in range(5):
        j = 4 - i
        blend = images[i].float() * lam[i] + images[j].float() * (1 - lam[i])
        if dtype == torch.uint8:
            blend = torch.round(blend)  # timm's blend(..., round_output=True)
        assert torch.equal(out[i], blend.to(dtype))


def test_reference_cutmix_copies_the_box_from_the_flipped_batch():
    images = _images(n=3)
    boxes = torch.tensor([[1, 2, 5, 6], [0, 0, 12, 10], [3, 3, 3, 8]])
    out = _reference.cutmix(images, boxes)
    expected = images.clone()
    for i, (top, left, bottom, right) in enumerate(boxes.tolist()):
        expected[i, :, top:bottom, left:right] = images[2 - i, :, top:bottom, left:right]
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_reference_normalize_is_torchvisions(dtype):
    images = _images(dtype=dtype)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    x = images.float() / (255.0 if dtype == torch.uint8 else 1.0)
    expected = (x - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    torch.testing.assert_close(
        _reference.normalize(images, mean, std), expected, rtol=1e-6, atol=1e-6
    )


# ---- random parameters ----


def _ks_uniform_discrete(values: torch.Tensor, size: int) -> float:
    """Kolmogorov-Smirnov distance between integer samples and the uniform law on 0..size-1."""
    counts = torch.bincount(values, minlength=size).double()
    ecdf = counts.cumsum(0) / values.numel()
    cdf = torch.arange(1, size + 1, dtype=torch.float64) / size
    return (ecdf - cdf).abs().max().item()


def test_cutout_hole_centres_are_uniform_and_holes_are_clipped():
    h, w, size, n = 30, 40, 8, 20_000
    boxes = _params.cutout_boxes(n, h, w, 2, size, _gen(1)).view(-1, 4)
    top, left, bottom, right = boxes.unbind(-1)
    # The centre is top + size // 2, or bottom - size // 2 when the top edge was clipped.
    cy = torch.where(top > 0, top + size // 2, bottom - size // 2)
    cx = torch.where(left > 0, left + size // 2, right - size // 2)
    limit = 1.95 / math.sqrt(boxes.shape[0])  # KS critical value at p = 0.001
    assert _ks_uniform_discrete(cy, h) < limit
    assert _ks_uniform_discrete(cx, w) < limit
    assert bool(((bottom - top) <= size).all() and ((right - left) <= size).all())
    assert bool(
        (top >= 0).all() and (bottom <= h).all() and (left >= 0).all() and (right <= w).all()
    )
    inner = (cy >= size // 2) & (cy + size // 2 <= h)
    assert bool(((bottom - top)[inner] == size).all())
    assert bool(((bottom - top)[~inner] < size).all())  # clipped at a border


def _erasing(
    n=20_000, h=60, w=50, p=0.5, scale=(0.02, 1 / 3), ratio=(0.3, 3.3), max_count=1, seed=2
):
    return _params.erasing_boxes(n, h, w, p, scale, ratio, max_count, _gen(seed))


def test_random_erasing_probability_is_p():
    for p in (0.0, 0.25, 0.5, 1.0):
        boxes = _erasing(p=p)[:, 0]
        erased = ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).double()
        sigma = math.sqrt(p * (1 - p) / erased.numel())
        assert abs(erased.mean().item() - p) <= 4 * sigma + 1e-12, p


def test_random_erasing_areas_ratios_and_positions():
    h, w, scale, ratio = 60, 50, (0.05, 0.3), (0.5, 2.0)
    boxes = _erasing(h=h, w=w, p=1.0, scale=scale, ratio=ratio)[:, 0]
    top, left, bottom, right = boxes.unbind(-1)
    bh, bw = (bottom - top).double(), (right - left).double()
    assert bool((bh < h).all() and (bw < w).all() and (top >= 0).all() and (left >= 0).all())
    assert bool((bottom <= h).all() and (right <= w).all())
    # h and w are rounded from sqrt(area * aspect) and sqrt(area / aspect): allow half a pixel.
    area_hi = (torch.sqrt(torch.tensor(scale[1] * h * w * ratio[1])) + 0.5) * (
        torch.sqrt(torch.tensor(scale[1] * h * w / ratio[0])) + 0.5
    )
    assert bool((bh * bw <= area_hi).all())
    fraction = bh * bw / (h * w)
    assert scale[0] * 0.6 < fraction.min().item() and fraction.max().item() < scale[1] * 1.3
    assert abs(fraction.median().item() - sum(scale) / 2) < 0.03
    aspect = bh / bw
    assert ratio[0] * 0.8 < aspect.min().item() and aspect.max().item() < ratio[1] * 1.25
    assert abs(torch.log(aspect).mean().item() - sum(math.log(r) for r in ratio) / 2) < 0.02
    # The top-left corner is uniform over the positions where the box fits.
    slack = (h - bh).clamp(min=1)
    relative = (top.double() + 0.5) / (slack + 1)
    assert abs(relative.mean().item() - 0.5) < 0.01


def test_random_erasing_count_is_uniform_up_to_max_count_with_smaller_boxes():
    boxes = _erasing(p=1.0, max_count=3, scale=(0.02, 0.1))
    nonempty = (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])
    per_sample = torch.bincount(nonempty.sum(1), minlength=4).double() / boxes.shape[0]
    assert per_sample[0].item() == 0.0
    assert all(abs(per_sample[k].item() - 1 / 3) < 0.02 for k in (1, 2, 3))
    areas = ((boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])).double()
    count = nonempty.sum(1, keepdim=True).double()
    per_box = areas[nonempty] * count.expand_as(areas)[nonempty]
    # With count boxes, each has count times less area: area * count has the same distribution.
    single = _erasing(p=1.0, scale=(0.02, 0.1))
    single_area = (
        (single[:, 0, 2] - single[:, 0, 0]) * (single[:, 0, 3] - single[:, 0, 1])
    ).double()
    assert abs(per_box.mean().item() / single_area.mean().item() - 1) < 0.05


def test_cutout_boxes_are_the_same_in_numpy_and_under_torch_compile(monkeypatch):
    eager = [_params.cutout_boxes(500, 30, 20, k, size, _gen(k)) for k, size in ((1, 7), (3, 40))]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = [_params.cutout_boxes(500, 30, 20, k, size, _gen(k)) for k, size in ((1, 7), (3, 40))]
    for a, b in zip(eager, traced, strict=True):
        assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b)


def test_random_erasing_boxes_are_the_same_in_eager_mode_and_under_torch_compile(monkeypatch):
    # Eager code computes the boxes with the compiled fastpipe::erasing_boxes when the extension
    # is built (test_extension.py checks that op itself), torch.compile traces the torch
    # version.
    cases = [(0.7, (0.02, 1 / 3), (0.3, 3.3), 1), (1.0, (0.1, 0.9), (0.5, 4.0), 3)]
    eager = [_erasing(n=4000, p=p, scale=s, ratio=r, max_count=k) for p, s, r, k in cases]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = [_erasing(n=4000, p=p, scale=s, ratio=r, max_count=k) for p, s, r, k in cases]
    for a, b in zip(eager, traced, strict=True):
        assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b)


def test_random_erasing_gives_up_when_no_box_fits():
    boxes = _erasing(n=500, h=4, w=4, p=1.0, scale=(0.9, 1.0), ratio=(3.0, 3.3))
    assert bool((boxes == 0).all())


@pytest.mark.parametrize("alpha", [0.2, 1.0, 2.0])
def test_mix_lambda_is_beta_alpha_alpha(alpha):
    g = _gen(3)
    lam = torch.stack([_params.beta(alpha, g) for _ in range(4000)])
    var = 1 / (4 * (2 * alpha + 1))
    assert abs(lam.mean().item() - 0.5) < 4 * math.sqrt(var / lam.numel())
    assert abs(lam.var().item() - var) < 0.1 * var
    assert bool(((lam >= 0) & (lam <= 1)).all())
    if alpha == 1.0:  # Beta(1, 1) is uniform: Kolmogorov-Smirnov
        ecdf = torch.arange(1, lam.numel() + 1, dtype=torch.float64) / lam.numel()
        assert (ecdf - lam.sort().values).abs().max().item() < 1.95 / math.sqrt(lam.numel())


@pytest.mark.parametrize("alpha", [0.001, 0.005])
def test_mix_lambda_for_tiny_alpha_is_0_or_1_never_nan(alpha):
    """Beta(alpha, alpha) for tiny alpha puts its mass next to 0 and 1, half on each side; two
    Gamma(alpha) draws that both underflow to 0 must not make it 0 / 0. Near the ends its CDF is
    ~x**alpha / 2, so P(lam < x or lam > 1 - x) ~ x**alpha."""
    g = _gen(5)
    lam = torch.stack([_params.beta(alpha, g) for _ in range(4000)])
    assert not bool(lam.isnan().any())
    for x in (1e-6, 1e-3):
        expected = x**alpha
        share = float(((lam < x) | (lam > 1 - x)).double().mean())
        assert abs(share - expected) < 4 * math.sqrt(expected * (1 - expected) / lam.numel()) + 1e-3
    above = int((lam > 0.5).sum())
    assert abs(above - 2000) < 4 * math.sqrt(4000 * 0.25)


@pytest.mark.parametrize("name", ["mixup", "cutmix"])
def test_tiny_alpha_mixes_without_error(backend, name):
    images = torch.rand(4, 3, 8, 8)
    targets = torch.tensor([0, 1, 2, 3])
    for seed in range(30):
        mixed, soft = getattr(ops, name)(images, targets, 0.001, num_classes=4,
                                         generator=_gen(seed))
        assert not bool(mixed.isnan().any()) and not bool(soft.isnan().any())
        torch.testing.assert_close(soft.sum(1), torch.ones(4))


def test_mixup_uses_the_same_lambda_for_images_and_targets(backend):
    images = torch.stack((torch.zeros(3, 4, 4), torch.ones(3, 4, 4)))
    targets = torch.tensor([0, 1])
    for seed in range(20):
        mixed, soft = ops.mixup(images, targets, 0.4, num_classes=2, generator=_gen(seed))
        lam = soft[0, 0]
        torch.testing.assert_close(mixed[0], torch.full((3, 4, 4), 1 - lam.item()))
        torch.testing.assert_close(mixed[1], torch.full((3, 4, 4), lam.item()))
        torch.testing.assert_close(soft, torch.tensor([[lam, 1 - lam], [1 - lam, lam]]))


def test_cutmix_targets_use_the_area_of_the_clipped_box(backend):
    h, w = 16, 20
    images = torch.stack((torch.zeros(1, h, w), torch.ones(1, h, w)))
    targets = torch.tensor([0, 1])
    seen_clipped = False
    for seed in range(40):
        mixed, soft = ops.cutmix(images, targets, 1.0, num_classes=2, generator=_gen(seed))
        pasted = mixed[0].mean().item()  # sample 0 is zeros, with a box of ones from sample 1
        torch.testing.assert_close(soft[0, 1].item(), pasted)
        torch.testing.assert_close(soft[0, 0].item(), 1 - pasted)
        torch.testing.assert_close(mixed[1].mean().item(), 1 - pasted)
        seen_clipped |= 0 < pasted < 0.25
    assert seen_clipped


def test_cutmix_box_equals_timms_rand_bbox(monkeypatch):
    # timm 1.0's rand_bbox spans cy - cut // 2 to cy + (cut + 1) // 2 (for an odd cut, one pixel
    # more than cy + cut // 2). The centre is drawn from the generator, so it is replayed here and
    # handed to timm's np.random.randint.
    timm_mixup = pytest.importorskip("timm.data.mixup")
    sizes = ((40, 30), (7, 9), (1, 1), (224, 224), (33, 17))
    lams = (0.75, 0.5, 0.3, 0.01, 0.0, 0.999, 1.0)
    for seed, ((h, w), lam) in enumerate((s, lam) for s in sizes for lam in lams):
        lam_t = torch.tensor(lam, dtype=torch.float64)
        box, corrected = _params.cutmix_box(h, w, lam_t, _gen(seed))
        g = _gen(seed)
        centre = iter([int(torch.randint(0, h, (), generator=g)),
                       int(torch.randint(0, w, (), generator=g))])
        monkeypatch.setattr(timm_mixup.np.random, "randint", lambda *a, c=centre, **k: next(c))
        (yl, yh, xl, xh), timm_lam = timm_mixup.cutmix_bbox_and_lam((h, w), lam)
        assert box.tolist() == [int(yl), int(xl), int(yh), int(xh)], (h, w, lam)
        assert corrected.item() == timm_lam
        monkeypatch.undo()


def test_cutmix_box_is_the_same_in_python_and_under_torch_compile(monkeypatch):
    lams = [_params.beta(a, _gen(seed)) for seed, a in enumerate((0.2, 1.0, 3.0) * 20)]
    lams.append(torch.tensor(0.0, dtype=torch.float64))  # the box covers everything it can
    sizes = ((40, 30), (7, 9), (1, 1))
    eager = [_params.cutmix_box(h, w, lam, _gen(i)) for i, lam in enumerate(lams) for h, w in sizes]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = [_params.cutmix_box(h, w, lam, _gen(i))
              for i, lam in enumerate(lams) for h, w in sizes]
    for (box_a, lam_a), (box_b, lam_b) in zip(eager, traced, strict=True):
        assert box_a.dtype == box_b.dtype == torch.int64 and torch.equal(box_a, box_b)
        assert lam_a.dtype == lam_b.dtype == torch.float64 and torch.equal(lam_a, lam_b)


def test_soft_targets_from_class_indices_are_timms_formula_bit_for_bit():
    # Built from four float32 numbers instead of (N, K) passes: the bits must not change.
    g = _gen(5)
    for trial in range(300):
        n = int(torch.randint(0, 9, (), generator=g))
        classes = int(torch.randint(1, 6, (), generator=g))  # few classes: partners often match
        smoothing = 0.0 if trial % 3 == 0 else float(torch.rand((), generator=g)) * 0.5
        targets = torch.randint(0, classes, (n,), generator=g)
        targets = targets.to((torch.int64, torch.int32, torch.uint8)[trial % 3])
        lam = torch.rand((), generator=g) if trial % 10 else torch.tensor(float(trial % 20 == 0))
        off = smoothing / classes
        y = torch.full((n, classes), off).scatter(
            1, targets.long().view(-1, 1), 1 - smoothing + off
        )
        expected = y * lam + y.flip(0) * (1 - lam)
        got = _functional._soft_targets(targets, classes, lam, smoothing)
        assert got.dtype == torch.float32 and torch.equal(got, expected), (trial, got, expected)


def test_label_smoothing_matches_timm():
    images = torch.rand(4, 3, 8, 8)
    targets = torch.tensor([0, 2, 1, 3])
    mixed, soft = ops.mixup(
        images, targets, 1.0, num_classes=5, label_smoothing=0.1, generator=_gen()
    )
    lam = _params.beta(1.0, _gen()).float()
    off = 0.1 / 5
    on = 1 - 0.1 + off
    y = torch.full((4, 5), off).scatter(1, targets.view(-1, 1), on)
    torch.testing.assert_close(soft, y * lam + y.flip(0) * (1 - lam))
    torch.testing.assert_close(soft.sum(1), torch.ones(4))
    # Soft targets pass through a second mix.
    _, again = ops.cutmix(mixed, soft, 1.0, num_classes=5, generator=_gen(1))
    torch.testing.assert_close(again.sum(1), torch.ones(4))


# ---- public API: determinism, layouts, edge cases (any backend) ----


@pytest.mark.parametrize("name", ["cutout", "random_erasing", "mixup", "cutmix"])
def test_same_seed_same_result_different_seed_different_result(name, backend):
    images = _images(n=8, h=32, w=32, dtype=torch.float32)
    targets = torch.arange(8) % 4

    def run(seed):
        if name == "cutout":
            return ops.cutout(images, 2, 8, generator=_gen(seed))
        if name == "random_erasing":
            return ops.random_erasing(images, p=1.0, value="random", generator=_gen(seed))
        return getattr(ops, name)(images, targets, 1.0, 4, generator=_gen(seed))[0]

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))


def test_ops_do_not_modify_their_input(backend):
    images = _images(dtype=torch.float32)
    before = images.clone()
    ops.cutout(images, 3, 5)
    ops.random_erasing(images, p=1.0, value="random")
    ops.mixup(images, torch.zeros(4, dtype=torch.long), 1.0, 2)
    ops.cutmix(images, torch.zeros(4, dtype=torch.long), 1.0, 2)
    ops.normalize(images, (0.5,) * 3, (0.5,) * 3)
    assert torch.equal(images, before)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("n", [1, 4, 5])
@pytest.mark.parametrize("name", ["cutout", "random_erasing", "mixup", "cutmix"])
def test_inplace_gives_the_functional_result_in_the_batch_itself(name, n, dtype, backend):
    images = _images(n=n, dtype=dtype, seed=n)
    if name == "cutmix" or n == 4:  # channels_last too
        images = images.contiguous(memory_format=torch.channels_last)
    targets = torch.arange(n) % 3

    def call(x, inplace):
        gen = _gen(11)
        if name == "cutout":
            return ops.cutout(x, 2, 5, generator=gen, inplace=inplace)
        if name == "random_erasing":
            return ops.random_erasing(x, p=0.9, value="random", generator=gen, inplace=inplace)
        return getattr(ops, name)(x, targets, 0.7, 3, label_smoothing=0.1, generator=gen,
                                  inplace=inplace)

    expected = call(images, False)
    batch = images.clone()
    got = call(batch, True)
    if name in ("mixup", "cutmix"):
        assert torch.equal(got[1], expected[1])
        got, expected = got[0], expected[0]
    assert got is batch
    assert torch.equal(batch, expected)
    assert n == 1 or not torch.equal(batch, images)


@pytest.mark.parametrize("name", ["cutout", "random_erasing", "mixup", "cutmix", "Mixup",
                                  "RandomErasing"])
def test_inplace_refuses_images_whose_elements_may_share_memory(name, backend):
    # Rows of 4 elements 3 apart (not an expanded tensor): writing one element changes another.
    images = torch.zeros(200).as_strided((2, 3, 4, 4), (48, 16, 3, 1))
    targets = torch.tensor([0, 1])
    g = torch.Generator().manual_seed(0)
    call = {
        "cutout": lambda: ops.cutout(images, 1, 3, fill=1, generator=g, inplace=True),
        "random_erasing": lambda: ops.random_erasing(images, p=1.0, value=1, generator=g,
                                                     inplace=True),
        "mixup": lambda: ops.mixup(images, targets, 1.0, 2, generator=g, inplace=True),
        "cutmix": lambda: ops.cutmix(images, targets, 1.0, 2, generator=g, inplace=True),
        "Mixup": lambda: ops.Mixup(num_classes=2, generator=g, inplace=True)(images, targets),
        "RandomErasing": lambda: ops.RandomErasing(1.0, mode="pixel", generator=g,
                                                   inplace=True)(images),
    }[name]
    with pytest.raises(ValueError, match=r"inplace=True.*share memory.*clone\(\)"):
        call()


def test_empty_batch_and_zero_holes(backend):
    empty = torch.zeros(0, 3, 8, 8, dtype=torch.uint8)
    assert ops.cutout(empty, 2, 4).shape == empty.shape
    assert ops.random_erasing(empty, value="random").shape == empty.shape
    mixed, soft = ops.mixup(empty, torch.zeros(0, dtype=torch.long), 1.0, 3)
    assert mixed.shape == empty.shape and soft.shape == (0, 3)
    assert ops.cutmix(empty, torch.zeros(0, dtype=torch.long), 1.0, 3)[1].shape == (0, 3)
    assert ops.normalize(empty, (0.5,) * 3, (0.5,) * 3).shape == empty.shape
    images = _images()
    out = ops.cutout(images, num_holes=0)
    assert torch.equal(out, images) and out.data_ptr() != images.data_ptr()


def test_channels_last_is_kept(backend):
    images = _images(dtype=torch.float32).contiguous(memory_format=torch.channels_last)
    targets = torch.zeros(4, dtype=torch.long)
    for out in (
        ops.cutout(images),
        ops.random_erasing(images),
        ops.mixup(images, targets, 1.0, 2)[0],
        ops.cutmix(images, targets, 1.0, 2)[0],
        ops.normalize(images, (0.5,) * 3, (0.5,) * 3, channels_last=True),
    ):
        assert out.is_contiguous(memory_format=torch.channels_last)
    assert ops.normalize(images, (0.5,) * 3, (0.5,) * 3).is_contiguous()


def test_uint8_fill_is_rounded_and_random_fill_is_uniform_bytes(backend):
    images = torch.zeros(2, 3, 20, 20, dtype=torch.uint8)
    out = ops.cutout(images, 1, 100, fill=(10.4, 20.6, 255))
    assert out[:, :, 0, 0].tolist() == [[10, 21, 255]] * 2
    noisy = ops.random_erasing(images, p=1.0, scale=(0.9, 0.9), ratio=(1.0, 1.0), value="random")
    assert noisy.float().std().item() > 50


def test_fallback_warns_once_with_the_build_command(monkeypatch):
    monkeypatch.setattr(_extension, "KERNELS", frozenset())
    monkeypatch.setattr(_extension, "_warned", False)
    images = _images()
    with pytest.warns(RuntimeWarning, match=r"pip install --no-build-isolation -e \."):
        ops.cutout(images)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.cutout(images)
        ops.normalize(images, (0.5,) * 3, (0.5,) * 3)


# ---- moving parameters to a CUDA device (no GPU here: recording stand-ins) ----


class _RecordingTensor:
    def __init__(self):
        self.calls = []

    def contiguous(self):
        self.calls.append("contiguous")
        return self

    def pin_memory(self):
        self.calls.append("pin_memory")
        return self

    def to(self, device, non_blocking=False):
        self.calls.append(("to", str(device), non_blocking))
        return self


def test_parameters_reach_a_cuda_device_by_a_pinned_non_blocking_copy():
    # A pageable host-to-device copy would make the host wait for the GPU at every op call.
    recorder = _RecordingTensor()
    assert _functional._to_device(recorder, torch.device("cuda", 0)) is recorder
    assert recorder.calls == ["contiguous", "pin_memory", ("to", "cuda:0", True)]
    cpu = torch.arange(3)
    assert _functional._to_device(cpu, torch.device("cpu")) is cpu


@pytest.mark.parametrize(
    "name, expected",
    [
        ("normalize", 2),
        ("cutout", 2),
        ("random_erasing", 3),
        ("mixup", 1),
        ("mixup soft targets", 2),
        ("cutmix", 1),
    ],
)
def test_every_parameter_tensor_goes_to_the_device_through_the_pinned_copy(
    name, expected, monkeypatch
):
    moved = []

    def record(t, device):
        moved.append(tuple(t.shape))
        return t.to(device)

    monkeypatch.setattr(_functional, "_to_device", record)
    images, targets = _images(), torch.tensor([0, 1, 0, 1])
    calls = {
        "normalize": lambda: ops.normalize(images, (0.5,) * 3, (0.2,) * 3),  # mean, std
        "cutout": lambda: ops.cutout(images),  # fill, boxes
        "random_erasing": lambda: ops.random_erasing(images, value="random"),  # fill, seeds, boxes
        # Soft targets from class indices are built from scalars on the targets' device.
        "mixup": lambda: ops.mixup(images, targets, 1.0, 2),  # lam for images
        "mixup soft targets": lambda: ops.mixup(
            images, torch.full((4, 2), 0.5), 1.0, 2
        ),  # lam for images, lam for targets
        "cutmix": lambda: ops.cutmix(images, targets, 1.0, 2),  # boxes
    }
    calls[name]()
    assert len(moved) == expected, moved


# ---- bad input ----

_GOOD = _images()
_T = torch.zeros(4, dtype=torch.long)

BAD_CALLS = [
    ("3-D", lambda: ops.cutout(torch.zeros(3, 8, 8)), ValueError, "4-D"),
    ("not a tensor", lambda: ops.cutout([[1]]), TypeError, "torch.Tensor"),
    (
        "int32",
        lambda: ops.cutout(torch.zeros(1, 3, 8, 8, dtype=torch.int32)),
        TypeError,
        "uint8, float32",
    ),
    (
        "float64",
        lambda: ops.normalize(torch.zeros(1, 3, 8, 8, dtype=torch.float64), (0,) * 3, (1,) * 3),
        TypeError,
        "float16",
    ),
    (
        "num_holes < 0",
        lambda: ops.cutout(_GOOD, num_holes=-1),
        ValueError,
        "num_holes must be an int >= 0",
    ),
    ("num_holes float", lambda: ops.cutout(_GOOD, num_holes=1.5), ValueError, "num_holes"),
    ("size 0", lambda: ops.cutout(_GOOD, size=0), ValueError, "size must be a positive int"),
    (
        "fill length",
        lambda: ops.cutout(_GOOD, fill=(1, 2)),
        ValueError,
        "2 values but the images have 3 channels",
    ),
    ("fill range", lambda: ops.cutout(_GOOD, fill=300), ValueError, "outside 0-255"),
    ("fill type", lambda: ops.cutout(_GOOD, fill="red"), TypeError, "number or a sequence"),
    ("generator type", lambda: ops.cutout(_GOOD, generator="seed"), TypeError, "torch.Generator"),
    ("zero width", lambda: ops.cutout(torch.zeros(1, 3, 8, 0)), ValueError, "height and width"),
    ("p", lambda: ops.random_erasing(_GOOD, p=1.5), ValueError, "p must be a probability"),
    ("scale", lambda: ops.random_erasing(_GOOD, scale=(0.5, 0.1)), ValueError, "scale must be a"),
    (
        "ratio",
        lambda: ops.random_erasing(_GOOD, ratio=(0, 1)),
        ValueError,
        "ratio must be positive",
    ),
    ("value", lambda: ops.random_erasing(_GOOD, value="noise"), ValueError, "'random'"),
    ("max_count", lambda: ops.random_erasing(_GOOD, max_count=0), ValueError, "max_count"),
    (
        "mean length",
        lambda: ops.normalize(_GOOD, (0.5, 0.5), (0.2,) * 3),
        ValueError,
        "mean has 2 values",
    ),
    (
        "std length",
        lambda: ops.normalize(_GOOD, (0.5,) * 3, (0.2,) * 4),
        ValueError,
        "std has 4 values",
    ),
    ("std zero", lambda: ops.normalize(_GOOD, (0.5,) * 3, (0.2, 0, 0.2)), ValueError, "zeros"),
    ("std nan", lambda: ops.normalize(_GOOD, (0.5,) * 3, (0.2, float("nan"), 0.2)), ValueError,
     "non-finite"),
    ("mean inf", lambda: ops.normalize(_GOOD, (0.5, float("inf"), 0.5), (0.2,) * 3), ValueError,
     "mean must be finite"),
    (
        "out dtype",
        lambda: ops.normalize(_GOOD, (0.5,) * 3, (0.2,) * 3, dtype=torch.uint8),
        TypeError,
        "outputs float32",
    ),
    ("alpha", lambda: ops.mixup(_GOOD, _T, 0.0, 3), ValueError, "alpha must be a positive number"),
    (
        "mixup in place with grad",
        lambda: ops.mixup(torch.rand(4, 3, 8, 8, requires_grad=True), _T, 1.0, 3, inplace=True),
        ValueError,
        r"mixup\(inplace=True\) does not support autograd",
    ),
    (
        "cutmix in place with grad",
        lambda: ops.cutmix(torch.rand(4, 3, 8, 8, requires_grad=True), _T, 1.0, 3, inplace=True),
        ValueError,
        r"cutmix\(inplace=True\) does not support autograd",
    ),
    ("num_classes", lambda: ops.mixup(_GOOD, _T, 1.0, 0), ValueError, "num_classes"),
    (
        "smoothing",
        lambda: ops.cutmix(_GOOD, _T, 1.0, 3, label_smoothing=1.0),
        ValueError,
        "label_smoothing",
    ),
    (
        "targets shape",
        lambda: ops.mixup(_GOOD, torch.zeros(3, dtype=torch.long), 1.0, 3),
        ValueError,
        r"shape \(N,\)",
    ),
    (
        "targets range",
        lambda: ops.mixup(_GOOD, torch.tensor([0, 1, 2, 3]), 1.0, 3),
        ValueError,
        r"in \[0, 3\)",
    ),
    (
        "soft targets shape",
        lambda: ops.cutmix(_GOOD, torch.zeros(4, 2), 1.0, 3),
        ValueError,
        "num_classes",
    ),
    (
        "targets dtype",
        lambda: ops.mixup(_GOOD, torch.zeros(4, dtype=torch.bool), 1.0, 3),
        TypeError,
        "class indices",
    ),
]


@pytest.mark.parametrize(
    "call, error, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_input_gets_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()
