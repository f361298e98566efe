"""Random erasing's fill modes and fastpipe.ops.RandomErasing against timm 1.0's RandomErasing.

timm draws from Python's ``random`` and ``torch.normal_``, fastpipe from a torch generator: each
comparison hands timm fastpipe's draws (counts, box sizes and corners, colours) and checks that
timm then erases the same pixels with the same values.
"""

from __future__ import annotations

import math

import pytest
import torch

from fastpipe import ops
from fastpipe.ops import _params

timm_erasing = pytest.importorskip("timm.data.random_erasing", exc_type=ImportError)

pytestmark = pytest.mark.timeout(120)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


class _ForcedRandom:
    """Stands in for the ``random`` module timm's RandomErasing draws from, answering with the
    values that make timm erase fastpipe's boxes (one sample after the other)."""

    def __init__(self, boxes, height, width, min_count, max_count):
        self.answers = []
        area = height * width
        for sample in boxes.tolist():
            drawn = [b for b in sample if b[2] > b[0] and b[3] > b[1]]
            if not drawn:
                self.answers.append(("random", 1.0))  # > probability: not erased
                continue
            self.answers.append(("random", 0.0))
            count = len(drawn)
            if min_count != max_count:
                self.answers.append(("randint", count))
            for top, left, bottom, right in drawn:
                h, w = bottom - top, right - left
                # timm: h = round(sqrt(area_frac * area / count * aspect)), w alike.
                self.answers.append(("uniform", h * w * count / area))
                self.answers.append(("uniform", math.log(h / w)))
                self.answers += [("randint", top), ("randint", left)]

    def _next(self, kind):
        expected, value = self.answers.pop(0)
        assert expected == kind, f"timm asked for {kind}, fastpipe's next draw is {expected}"
        return value

    def random(self):
        return self._next("random")

    def randint(self, a, b):
        return self._next("randint")

    def uniform(self, a, b):
        return self._next("uniform")


def _timm_erase(images, params, kwargs, monkeypatch):
    n, c, h, w = images.shape
    splits = kwargs.get("num_splits", 0)
    start = n // splits if splits > 1 else 0  # timm draws nothing for its clean split
    assert not params["boxes"][:start].any()
    boxes, fill = params["boxes"][start:], params["fill"]
    forced = _ForcedRandom(boxes, h, w, kwargs.get("min_count", 1), kwargs.get("max_count") or 1)
    monkeypatch.setattr(timm_erasing, "random", forced)
    colours = []
    if fill.dim() == 3:
        for i, sample in enumerate(boxes.tolist()):
            colours += [fill[start + i, k] for k, b in enumerate(sample)
                        if b[2] > b[0] and b[3] > b[1]]
    colours.reverse()

    def pixels(per_pixel, rand_color, patch_size, dtype=torch.float32, device="cpu"):
        if rand_color:
            return colours.pop().view(-1, 1, 1).to(dtype)
        assert not per_pixel
        return torch.zeros((patch_size[0], 1, 1), dtype=dtype)

    monkeypatch.setattr(timm_erasing, "_get_pixels", pixels)
    eraser = timm_erasing.RandomErasing(device="cpu", **kwargs)
    out = eraser(images.clone())
    assert not forced.answers and not colours, "timm did not use every fastpipe draw"
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(probability=0.7, mode="const"),
        dict(probability=0.9, mode="rand"),
        dict(probability=1.0, mode="rand", min_count=2, max_count=4, max_area=0.5),
        dict(probability=0.8, mode="const", min_count=1, max_count=3, min_aspect=0.5,
             max_aspect=3.0),
        dict(probability=0.8, mode="rand", num_splits=2),
    ],
    ids=str,
)
def test_random_erasing_equals_timm_for_forced_draws(kwargs, backend):
    eraser = ops.RandomErasing(generator=_gen(0), **kwargs)
    erased_kinds = set()
    for seed in range(6):
        images = torch.randn(8, 3, 20, 16, generator=_gen(seed))
        params = eraser.make_params(images)
        ours = eraser.transform(images, params)
        with pytest.MonkeyPatch.context() as timm_patch:
            theirs = _timm_erase(images, params, kwargs, timm_patch)
        assert torch.equal(ours, theirs)
        counts = ((params["boxes"][..., 2] > params["boxes"][..., 0]).sum(1)).tolist()
        erased_kinds |= set(counts)
    assert 0 in erased_kinds or kwargs["probability"] == 1.0
    assert max(erased_kinds) >= kwargs.get("min_count", 1)


def test_rand_mode_gives_one_normal_colour_per_box_and_channel(backend):
    images = torch.zeros(400, 3, 24, 24)
    out = ops.random_erasing(images, p=1.0, value="rand", max_count=1, generator=_gen(1))
    colours = []
    for sample in out:
        mask = sample.abs().sum(0) > 0
        if mask.any():
            values = sample[:, mask]  # (C, pixels): one colour per channel in the box
            assert torch.equal(values, values[:, :1].expand_as(values))
            colours.append(values[:, 0])
    colours = torch.stack(colours)
    assert len(colours) > 350
    assert abs(colours.mean()) < 0.1 and abs(colours.std() - 1) < 0.1
    assert not torch.equal(colours[:, 0], colours[:, 1])  # channels differ


def test_rand_mode_on_uint8_images_draws_bytes(backend):
    images = torch.zeros(200, 3, 16, 16, dtype=torch.uint8)
    out = ops.random_erasing(images, p=1.0, value="rand", generator=_gen(2))
    assert out.dtype == torch.uint8 and 100 < out.float()[out > 0].mean() < 155


def test_pixel_is_torchvisions_random_and_fills_the_same_boxes_as_const():
    images = torch.zeros(16, 3, 20, 20)
    timm_ratio = (0.3, 1 / 0.3)  # timm's max_aspect is 1 / min_aspect, torchvision's 3.3
    kwargs = dict(p=0.8, ratio=timm_ratio, max_count=2)
    pixel = ops.random_erasing(images, value="pixel", generator=_gen(4), **kwargs)
    random = ops.random_erasing(images, value="random", generator=_gen(4), **kwargs)
    const = ops.random_erasing(images, value=1.0, generator=_gen(4), **kwargs)
    assert torch.equal(pixel, random)
    assert torch.equal(pixel != 0, const != 0)
    mode_pixel = ops.RandomErasing(0.8, mode="pixel", max_count=2, generator=_gen(4))(images)
    assert torch.equal(mode_pixel, pixel)


def test_count_is_uniform_between_min_count_and_max_count():
    boxes = _params.erasing_boxes(6000, 60, 50, 1.0, (0.01, 0.05), (0.5, 2.0), 5, _gen(3),
                                  min_count=2)
    counts = (boxes[..., 2] > boxes[..., 0]).sum(1)
    assert counts.min() == 2 and counts.max() == 5
    for k in range(2, 6):
        assert abs((counts == k).double().mean() - 0.25) < 0.03


def test_random_erasing_class_forms():
    images = torch.randn(4, 3, 10, 10)
    eraser = ops.RandomErasing(1.0, mode="rand", generator=_gen(0))
    out, targets = eraser(images, torch.arange(4))  # a DataPrefetcher batch_transform
    assert torch.equal(targets, torch.arange(4)) and not torch.equal(out, images)
    single = ops.RandomErasing(1.0, generator=_gen(0))(images[0])
    assert single.shape == (3, 10, 10)
    inplace = ops.RandomErasing(1.0, generator=_gen(0), inplace=True)
    own = images.clone()
    assert inplace(own) is own and not torch.equal(own, images)
    state = eraser.state_dict()
    again = ops.RandomErasing(1.0, mode="rand")
    again.load_state_dict(state)
    assert torch.equal(again(images), eraser(images))
    with pytest.raises(ValueError, match="differently configured"):
        ops.RandomErasing(0.5).load_state_dict(state)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ops.RandomErasing(mode="noise"), "'const', 'rand' or 'pixel'"),
        (lambda: ops.RandomErasing(probability=2), "probability"),
        (lambda: ops.RandomErasing(min_count=3, max_count=2), "min_count"),
        (lambda: ops.RandomErasing(min_area=0.5, max_area=0.1), "min_area"),
        (lambda: ops.random_erasing(torch.zeros(1, 3, 4, 4), value="const"), "'rand'"),
        (lambda: ops.random_erasing(torch.zeros(1, 3, 4, 4), min_count=0), "min_count"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("n, c", [(4, 3), (2, 3), (3, 1), (3, 3)])
def test_backward_of_a_per_box_fill_for_any_batch_size_and_channels(backend, n, c):
    # 'rand' fills each box with its own colour, a (N, K, C) fill: the gradient is zero inside
    # the boxes and passes through elsewhere, whatever N is against C.
    images = torch.rand(n, c, 12, 10, requires_grad=True)
    out = ops.random_erasing(images, p=1.0, value="rand", max_count=2, generator=_gen(n * 10 + c))
    out.backward(torch.ones_like(out))
    erased = out.detach() != images.detach()
    assert erased.any()
    assert torch.equal(images.grad, (~erased).to(images.grad.dtype))
    eraser = ops.RandomErasing(probability=1.0, mode="rand", max_count=2, generator=_gen(c))
    out = eraser(images)
    (grad,) = torch.autograd.grad(out.sum(), images)
    assert torch.equal(grad, (out.detach() == images.detach()).to(grad.dtype))
