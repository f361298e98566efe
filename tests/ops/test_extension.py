"""The compiled extension fastpipe._C: bit-exact with the reference, opcheck, torch.compile,
autograd.

Without the extension these tests skip, unless FASTPIPE_REQUIRE_EXTENSION=1 (CI builds it, so a
missing extension there is a failure, not a skip).
"""

from __future__ import annotations

import math
import os
import resource
import subprocess
import threading

import pytest
import torch

from fastpipe import ops
from fastpipe.ops import _extension, _reference
from tests.helpers.ops import write_on_strided_copy

pytestmark = [pytest.mark.extension, pytest.mark.timeout(120)]

DTYPES = [torch.uint8, torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["contiguous", "channels_last", "sliced", "transposed"]
OPS = torch.ops.fastpipe if _extension.LOADED else None


@pytest.fixture(autouse=True)
def _extension_built():
    if not ops.extension_available("cpu"):
        problem = _extension._LOAD_PROBLEM or "has no CPU kernels"
        message = (
            f"fastpipe._C {problem}: build it with `python setup.py build_ext --inplace` "
            "or `pip install --no-build-isolation -e .`"
        )
        if os.environ.get("FASTPIPE_REQUIRE_EXTENSION") == "1":
            pytest.fail(f"{message} (FASTPIPE_REQUIRE_EXTENSION=1)")
        pytest.skip(message)


def _make(shape, dtype, layout, g):
    """A batch of ``shape`` in ``dtype`` and memory ``layout`` (the last two not dense)."""
    n, c, h, w = shape
    if layout == "sliced":
        w, h = w * 2, h + 1
    if layout == "transposed":
        h, w = w, h
    if dtype == torch.uint8:
        x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)
    else:
        x = (torch.randn(n, c, h, w, generator=g) * 2).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "sliced":
        x = x[:, :, 1:, ::2]
    elif layout == "transposed":
        x = x.transpose(2, 3)
    assert tuple(x.shape) == tuple(shape)
    return x


def _random_boxes(n, k, h, w, g):
    """Boxes anywhere, including outside the image, empty and inverted."""
    return torch.randint(-h // 2 - 1, h + w + 2, (n, k, 4), generator=g)


def _assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), f"max difference {(a.double() - b.double()).abs().max().item()}"
    if a.numel() > 1:
        assert a.is_contiguous(memory_format=torch.channels_last) == b.is_contiguous(
            memory_format=torch.channels_last
        )
        assert a.is_contiguous() == b.is_contiguous()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_equal_the_reference_bit_for_bit(dtype, layout):
    g = torch.Generator().manual_seed(hash((str(dtype), layout)) % 2**31)
    for _ in range(8):
        n, c, h, w = (int(v) for v in torch.randint(1, 19, (4,), generator=g))
        n, c = n % 6, c % 5 + 1
        x = _make((n, c, h, w), dtype, layout, g)
        k = int(torch.randint(0, 4, (), generator=g))
        boxes = _random_boxes(n, k, h, w, g)
        fill = _make((1, c, 1, 1), dtype, "contiguous", g).flatten()
        seeds = torch.randint(0, 2**32, (n,), generator=g)
        for s in (None, seeds):
            expected = _reference.erase(x, boxes, fill, s)
            _assert_same(OPS.erase(x, boxes, fill, s), expected)
            _assert_in_place("erase_", x, (boxes, fill, s), expected)
        # C values per box (random_erasing's value='rand'): the later box's where boxes overlap.
        box_fill = _make((n, k, c, 1), dtype, "contiguous", g).view(n, k, c)
        expected = _reference.erase(x, boxes, box_fill, None)
        _assert_same(OPS.erase(x, boxes, box_fill, None), expected)
        _assert_in_place("erase_", x, (boxes, box_fill, None), expected)
        lam = torch.rand(n, generator=g)
        expected = _reference.mixup(x, lam)
        _assert_same(OPS.mixup(x, lam), expected)
        _assert_in_place("mixup_", x, (lam,), expected)
        pair_boxes = _random_boxes(n, 1, h, w, g)[:, 0]
        for boxes_of_pairs in (pair_boxes, pair_boxes[:1].expand(n, 4)):  # per sample, or one box
            expected = _reference.cutmix(x, boxes_of_pairs)
            _assert_same(OPS.cutmix(x, boxes_of_pairs), expected)
            _assert_in_place("cutmix_", x, (boxes_of_pairs,), expected)
        mean, std = torch.rand(c, generator=g), torch.rand(c, generator=g) + 0.05
        for out_dtype in (torch.float32, torch.float16, torch.bfloat16):
            for channels_last in (False, True):
                args = (x, mean, std, out_dtype, channels_last)
                _assert_same(OPS.normalize(*args), _reference.normalize(*args))


def _assert_in_place(name, x, args, expected):
    """OPS.<name> (in place) on a copy of x with x's exact strides (inside a larger buffer when x
    is a view): the view ends up equal to expected, and nothing outside it changes."""
    view = write_on_strided_copy(x, lambda v: getattr(OPS, name)(v, *args))
    assert torch.equal(view, expected), f"{name}: {tuple(x.shape)} {x.stride()}"


EDGE_CASES = {
    # name: (shape, boxes (N, K, 4))
    "hole larger than the image": ((2, 3, 5, 7), [[[-10, -10, 20, 20]], [[-1, -1, 99, 99]]]),
    "hole at the corner": ((2, 3, 8, 8), [[[-3, -3, 2, 2]], [[6, 6, 11, 11]]]),
    "batch of one": ((1, 3, 9, 6), [[[2, 1, 6, 4]]]),
    "empty batch": ((0, 3, 9, 6), torch.zeros(0, 2, 4, dtype=torch.long)),
    "one pixel image": ((3, 1, 1, 1), [[[0, 0, 1, 1]], [[0, 0, 0, 0]], [[1, 1, 2, 2]]]),
    "huge coordinates": (
        (2, 2, 6, 6),
        [[[-(2**40), -(2**40), 2**40, 2**40]], [[2**40, 0, 2**41, 3]]],
    ),
}


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_cases_equal_the_reference(case, dtype):
    shape, boxes = EDGE_CASES[case]
    boxes = torch.as_tensor(boxes, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    for layout in ("contiguous", "channels_last", "sliced"):
        x = _make(shape, dtype, layout, g)
        fill = torch.arange(shape[1]).to(dtype)
        seeds = torch.arange(shape[0])
        box_fill = fill.view(1, 1, -1).expand(shape[0], boxes.shape[1], -1).contiguous() + 1
        for s, f in ((None, fill), (seeds, fill), (None, box_fill)):
            expected = _reference.erase(x, boxes, f, s)
            _assert_same(OPS.erase(x, boxes, f, s), expected)
            _assert_in_place("erase_", x, (boxes, f, s), expected)
        expected = _reference.cutmix(x, boxes[:, 0])
        _assert_same(OPS.cutmix(x, boxes[:, 0]), expected)
        _assert_in_place("cutmix_", x, (boxes[:, 0],), expected)
        lam = torch.linspace(0, 1, shape[0])
        expected = _reference.mixup(x, lam)
        _assert_same(OPS.mixup(x, lam), expected)
        _assert_in_place("mixup_", x, (lam,), expected)


@pytest.mark.slow
def test_inplace_mixes_split_across_threads_equal_the_reference():
    # 9 samples are 5 pairs: on two threads at::parallel_for splits them into two tasks, the
    # second starting in the middle of a sample (2.5 samples each, for both kernels and layouts),
    # and the middle sample of the odd batch lies in the second task.
    g = torch.Generator().manual_seed(9)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for dtype in (torch.uint8, torch.float32):
            for layout in ("contiguous", "channels_last"):
                x = _make((9, 3, 64, 80), dtype, layout, g)
                lam = torch.rand(9, generator=g)
                _assert_in_place("mixup_", x, (lam,), _reference.mixup(x, lam))
                boxes = _random_boxes(9, 1, 64, 80, g)[:, 0]
                for pair_boxes in (boxes, boxes[:1].expand(9, 4)):
                    expected = _reference.cutmix(x, pair_boxes)
                    _assert_in_place("cutmix_", x, (pair_boxes,), expected)
    finally:
        torch.set_num_threads(threads)


ERASING_CASES = [
    # (batch, height, width, p, scale, ratio, max_count[, min_count])
    (4000, 224, 224, 0.5, (0.02, 1 / 3), (0.3, 3.3), 1),  # torchvision's and timm's defaults
    (2000, 30, 20, 1.0, (0.1, 0.9), (0.5, 4.0), 3),  # several boxes, many attempts fail
    (500, 4, 4, 1.0, (0.9, 1.0), (3.0, 3.3), 1),  # nothing ever fits
    (500, 1, 50, 1.0, (0.0, 0.5), (0.01, 0.1), 2),  # a one-row strip
    (300, 17, 9, 0.0, (0.02, 1 / 3), (0.3, 3.3), 2),  # never erased
    (2000, 30, 20, 0.8, (0.02, 0.4), (0.3, 3.3), 4, 2),  # timm's min_count
]


@pytest.mark.parametrize("case", range(len(ERASING_CASES)))
def test_erasing_boxes_op_equals_the_traced_torch_version(case, monkeypatch):
    # Eager calls compute random erasing's boxes with fastpipe::erasing_boxes, torch.compile traces
    # the torch version: the same uniforms must give the same boxes.
    from fastpipe.ops import _params

    n, h, w, p, scale, ratio, k, *rest = ERASING_CASES[case]
    kwargs = {"min_count": rest[0]} if rest else {}
    assert _extension.has_kernel("erasing_boxes", torch.device("cpu"))
    calls = []
    compiled_op = OPS.erasing_boxes

    def counted(*args):
        calls.append(args[1:3])
        return compiled_op(*args)

    monkeypatch.setattr(OPS, "erasing_boxes", counted)
    gen = torch.Generator().manual_seed(case)
    eager = _params.erasing_boxes(n, h, w, p, scale, ratio, k, gen, **kwargs)
    assert calls == [(h, w)]  # the compiled op made these boxes
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    gen = torch.Generator().manual_seed(case)
    traced = _params.erasing_boxes(n, h, w, p, scale, ratio, k, gen, **kwargs)
    assert eager.dtype == traced.dtype == torch.int64 and eager.shape == (n, k, 4)
    assert torch.equal(eager, traced)


def test_fake_kernels_skip_ops_an_older_build_lacks():
    # An extension built before an op existed must still import (its calls fall back).
    from fastpipe.ops import _fake

    def fake():
        return None

    assert _fake._register_fake("no_such_op_in_this_build")(fake) is fake


def test_erase_fills_a_hole_larger_than_the_image_completely():
    x = torch.rand(2, 3, 5, 7)
    out = OPS.erase(
        x, torch.tensor([[[-10, -10, 20, 20]]] * 2), torch.tensor([1.0, 2.0, 3.0]), None
    )
    assert torch.equal(out, torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1).expand(2, 3, 5, 7))


def test_uint8_mixup_rounds_half_to_even_for_every_pair_of_values():
    a, b = torch.meshgrid(torch.arange(256), torch.arange(256), indexing="ij")
    pairs = torch.stack((a.flatten(), b.flatten())).to(torch.uint8).view(2, 1, 256, 256)
    for lam in (0.5, 0.25, 0.3, 0.999):
        weights = torch.tensor([lam, 1 - lam], dtype=torch.float32)
        _assert_same(OPS.mixup(pairs, weights), _reference.mixup(pairs, weights))
    half = OPS.mixup(pairs, torch.tensor([0.5, 0.5]))[0, 0]
    assert half[1, 2].item() == 2 and half[2, 3].item() == 2  # 1.5 -> 2, 2.5 -> 2


def test_inplace_ops_refuse_overlapping_memory():
    expanded = torch.zeros(1, 3, 1, 1).expand(2, 3, 4, 4)
    boxes = torch.zeros(2, 4, dtype=torch.long)
    for call in (
        lambda: OPS.erase_(expanded, boxes.unsqueeze(1), torch.zeros(3), None),
        lambda: OPS.mixup_(expanded, torch.rand(2)),
        lambda: OPS.cutmix_(expanded, boxes),
    ):
        with pytest.raises(RuntimeError, match="share memory"):
            call()


def _overlapping() -> torch.Tensor:
    """Rows of 4 elements 3 apart: neighbouring rows share one element. Not an expanded tensor
    (no stride 0), so at::has_internal_overlap answers TooHard, not Yes."""
    return torch.zeros(200).as_strided((2, 3, 4, 4), (48, 16, 3, 1))


def test_inplace_ops_refuse_strides_under_which_elements_may_share_memory():
    images = _overlapping()
    boxes = torch.tensor([[0, 0, 4, 4]] * 2)
    for call in (
        lambda: OPS.erase_(images, boxes.unsqueeze(1), torch.ones(3), None),
        lambda: OPS.erase_(images, boxes.unsqueeze(1), torch.ones(3), torch.tensor([1, 2])),
        lambda: OPS.mixup_(images, torch.tensor([0.25, 0.5])),
        lambda: OPS.cutmix_(images, boxes),
    ):
        with pytest.raises(RuntimeError, match="share memory"):
            call()
    assert not bool(images.any()), "a refused call wrote into the images"


def test_inplace_ops_accept_strided_views_whose_elements_are_apart():
    # Not dense either (TooHard for at::has_internal_overlap), but every element is its own.
    base = torch.zeros(2, 3, 9, 20)
    view = base[:, :, 1:, ::2]
    OPS.erase_(view, torch.tensor([[[0, 0, 8, 10]]] * 2), torch.ones(3), None)
    assert bool((view == 1).all()) and int(base.sum()) == view.numel()


def test_public_inplace_variants_write_into_the_batch():
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    for call in (
        lambda x, g: ops.cutout(x, 2, 6, fill=3, generator=g, inplace=True),
        lambda x, g: ops.random_erasing(x, p=1.0, value="random", generator=g, inplace=True),
        lambda x, g: ops.mixup(x, torch.arange(4), 0.4, 4, generator=g, inplace=True)[0],
        lambda x, g: ops.cutmix(x, torch.arange(4), 0.4, 4, generator=g, inplace=True)[0],
    ):
        batch = images.clone()
        out = call(batch, torch.Generator().manual_seed(0))
        assert out is batch
        copy = call(images.clone(), torch.Generator().manual_seed(0))
        assert torch.equal(out, copy) and not torch.equal(out, images)
    leaf = torch.rand(2, 3, 8, 8, requires_grad=True)
    with pytest.raises(ValueError, match="does not support autograd"):
        ops.cutout(leaf, inplace=True)


@pytest.mark.parametrize(
    "name",
    [
        "cutout",
        "random_erasing",
        "random_erasing_noise",
        "mixup",
        "cutmix",
        "mixup_inplace",
        "cutmix_inplace",
        "normalize",
    ],
)
def test_public_ops_give_the_same_result_with_and_without_the_extension(name, monkeypatch):
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (6, 3, 40, 30), dtype=torch.uint8, generator=g)
    images = images.contiguous(memory_format=torch.channels_last)
    targets = torch.arange(6) % 3

    def run():
        gen = torch.Generator().manual_seed(7)
        if name == "cutout":
            return ops.cutout(images, 3, 12, fill=(1, 2, 3), generator=gen)
        if name == "random_erasing":
            return ops.random_erasing(images, p=0.7, value=(4, 5, 6), max_count=2, generator=gen)
        if name == "random_erasing_noise":
            return ops.random_erasing(images.float() / 255, p=0.9, value="random", generator=gen)
        if name == "normalize":
            return ops.normalize(
                images, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), torch.float16
            )
        op, _, inplace = name.partition("_")
        mixed, soft = getattr(ops, op)(
            images.clone(), targets, 0.8, 3, label_smoothing=0.1, generator=gen,
            inplace=bool(inplace),
        )
        return torch.cat((mixed.flatten().float(), soft.flatten()))

    compiled = run()
    monkeypatch.setattr(_extension, "KERNELS", frozenset())
    monkeypatch.setattr(_extension, "_warned", True)
    _assert_same(compiled, run())


def _sample_inputs(name):
    """Arguments for opcheck: uint8 and float (requiring grad), dense, channels_last, strided,
    empty."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for dtype, layout, n in (
        (torch.uint8, "contiguous", 4),
        (torch.float32, "channels_last", 4),
        (torch.float16, "sliced", 3),
        (torch.float32, "contiguous", 0),
    ):
        x = _make((n, 3, 6, 5), dtype, layout, g)
        if dtype.is_floating_point:
            x = x.detach().requires_grad_(True)
        boxes = _random_boxes(n, 2, 6, 5, g)
        if name == "erase":
            fill = torch.arange(3).to(dtype)
            if layout == "sliced":  # C values per box
                fill = torch.arange(n * 2 * 3).view(n, 2, 3).to(dtype)
            cases.append((x, boxes, fill, torch.arange(n) if layout == "channels_last" else None))
        elif name == "mixup":
            cases.append((x, torch.rand(n, generator=g)))
        elif name == "cutmix":
            cases.append((x, boxes[:, 0]))
        else:
            cases.append(
                (
                    x,
                    torch.rand(3, generator=g),
                    torch.rand(3, generator=g) + 0.1,
                    torch.float32,
                    layout != "channels_last",
                )
            )
    return cases


def test_opcheck_erasing_boxes():
    g = torch.Generator().manual_seed(0)
    for n, k, min_count in ((6, 1, 1), (5, 3, 1), (0, 2, 1), (7, 4, 2)):
        uniforms = torch.rand(n, 2 + k * 22, dtype=torch.float64, generator=g)
        args = (uniforms, 12, 9, k, 0.7, 0.02, 0.4, math.log(0.3), math.log(3.3), min_count)
        torch.library.opcheck(OPS.erasing_boxes.default, args)


@pytest.mark.parametrize(
    "name", ["normalize", "erase", "erase_", "mixup", "mixup_", "cutmix", "cutmix_"]
)
@pytest.mark.slow
def test_opcheck(name):
    op = getattr(OPS, name).default
    for args in _sample_inputs(name.rstrip("_")):
        if name.endswith("_"):  # in place: no autograd, so inputs that do not require grad
            args = (args[0].detach().clone(), *args[1:])
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("name", ["normalize", "erase", "mixup", "cutmix"])
def test_gradients_equal_the_reference_autograd(name):
    for args in _sample_inputs(name):
        x = args[0]
        if not x.dtype.is_floating_point or x.numel() == 0:
            continue
        grad = torch.randn(x.shape).to(x.dtype)
        (ours,) = torch.autograd.grad(getattr(OPS, name)(*args), x, grad)
        (theirs,) = torch.autograd.grad(getattr(_reference, name)(*args), x, grad)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def _public_calls():
    targets = torch.tensor([0, 1, 2, 1])
    return {
        "normalize": lambda x: ops.normalize(
            x, (0.5, 0.4, 0.3), (0.2, 0.2, 0.2), channels_last=True
        ),
        "cutout": lambda x: ops.cutout(x, 2, 4, fill=(1, 2, 3)),
        "random_erasing": lambda x: ops.random_erasing(x, p=0.8, value=3, max_count=2),
        "random_erasing_noise": lambda x: ops.random_erasing(x.float(), p=0.8, value="random"),
        "random_erasing_colours": lambda x: ops.random_erasing(
            x.float(), p=0.8, value="rand", min_count=2, max_count=3
        ),
        "cutout_inplace": lambda x: ops.cutout(x, 2, 4, inplace=True),
        "random_erasing_inplace": lambda x: ops.random_erasing(
            x, p=0.9, value="random", inplace=True
        ),
        "mixup": lambda x: ops.mixup(x, targets, 0.4, 3, label_smoothing=0.1),
        "cutmix": lambda x: ops.cutmix(x, targets, 1.0, 3),
        "mixup_inplace": lambda x: ops.mixup(x, targets, 0.4, 3, inplace=True),
        "cutmix_inplace": lambda x: ops.cutmix(x, targets, 1.0, 3, inplace=True),
    }


@pytest.mark.parametrize("name", list(_public_calls()))
@pytest.mark.slow
def test_every_op_runs_in_torch_compile_fullgraph(name):
    torch._dynamo.reset()
    fn = _public_calls()[name]
    images = torch.randint(0, 256, (4, 3, 12, 10), dtype=torch.uint8)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.manual_seed(5)
    got = compiled(images.clone())
    torch.manual_seed(5)
    expected = fn(images.clone())
    for a, b in zip(
        torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected), strict=True
    ):
        _assert_same(a, b)


@pytest.mark.slow
def test_inductor_compiles_a_whole_augmentation_step():
    torch._dynamo.reset()

    def step(images, targets):
        images = ops.cutout(images, 1, 4)
        images, soft = ops.mixup(images, targets, 0.4, 3)
        images = ops.normalize(images, (0.5,) * 3, (0.25,) * 3)
        return ops.random_erasing(images, p=1.0, value="random"), soft

    images = torch.randint(0, 256, (4, 3, 12, 10), dtype=torch.uint8)
    targets = torch.tensor([0, 1, 2, 1])
    # Inductor has its own RNG unless told to fall back to eager's, which the comparison needs.
    with torch._inductor.config.patch(fallback_random=True):
        compiled = torch.compile(step, fullgraph=True)
        torch.manual_seed(9)
        got = compiled(images, targets)
    torch.manual_seed(9)
    expected = step(images, targets)
    for a, b in zip(got, expected, strict=True):
        _assert_same(a, b)


BAD_DIRECT_CALLS = [
    ("3-D images", lambda: OPS.mixup(torch.zeros(3, 4, 4), torch.zeros(3)), "4-D"),
    (
        "int32 images",
        lambda: OPS.cutmix(
            torch.zeros(1, 1, 2, 2, dtype=torch.int32), torch.zeros(1, 4, dtype=torch.long)
        ),
        "uint8, float32",
    ),
    (
        "boxes shape",
        lambda: OPS.erase(
            torch.zeros(2, 1, 2, 2), torch.zeros(2, 4, dtype=torch.long), torch.zeros(1), None
        ),
        "boxes must have shape",
    ),
    (
        "fill dtype",
        lambda: OPS.erase(
            torch.zeros(2, 1, 2, 2),
            torch.zeros(2, 1, 4, dtype=torch.long),
            torch.zeros(1, dtype=torch.uint8),
            None,
        ),
        "fill must be Float",
    ),
    (
        "seeds length",
        lambda: OPS.erase(
            torch.zeros(2, 1, 2, 2),
            torch.zeros(2, 1, 4, dtype=torch.long),
            torch.zeros(1),
            torch.zeros(3, dtype=torch.long),
        ),
        "seeds must have shape",
    ),
    (
        "lam length",
        lambda: OPS.mixup(torch.zeros(2, 1, 2, 2), torch.zeros(3)),
        "lam must have shape",
    ),
    (
        "mean length",
        lambda: OPS.normalize(
            torch.zeros(2, 3, 2, 2), torch.zeros(2), torch.ones(3), torch.float32, False
        ),
        "mean must have shape",
    ),
    (
        "uint8 output",
        lambda: OPS.normalize(
            torch.zeros(2, 3, 2, 2), torch.zeros(3), torch.ones(3), torch.uint8, False
        ),
        "outputs float32",
    ),
    (
        "erasing uniforms shape",
        lambda: OPS.erasing_boxes(
            torch.rand(4, 23, dtype=torch.float64), 8, 8, 1, 0.5, 0.02, 0.3, -1.0, 1.0
        ),
        r"uniforms must be a CPU float64 \(N, 24\) tensor",
    ),
    (
        "erasing uniforms dtype",
        lambda: OPS.erasing_boxes(torch.rand(4, 24), 8, 8, 1, 0.5, 0.02, 0.3, -1.0, 1.0),
        "uniforms must be a CPU float64",
    ),
]


@pytest.mark.parametrize(
    "call, message", [c[1:] for c in BAD_DIRECT_CALLS], ids=[c[0] for c in BAD_DIRECT_CALLS]
)
def test_direct_operator_calls_check_their_arguments(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


def test_extension_has_cuda_kernels_when_torch_and_nvcc_support_them():
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    if torch.version.cuda is None or not os.path.exists(nvcc):
        pytest.skip(
            "CPU-only torch or no CUDA toolkit: the extension is built without CUDA kernels"
        )
    release = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    if f"release {torch.version.cuda.split('.')[0]}." not in release:
        pytest.skip(f"nvcc is not CUDA {torch.version.cuda}: setup.py builds the CPU kernels only")
    assert ops.extension_available("cuda"), (
        "torch is a CUDA build and a matching nvcc exists, but fastpipe._C has no CUDA kernels: "
        "rebuild with `python setup.py build_ext --inplace` (FASTPIPE_NO_CUDA unset)"
    )


# ---------------------------------------------------------------- large outputs reuse freed memory

KEPT_SHAPE = (64, 3, 224, 224)  # 38.5 MB of float32: glibc maps (and unmaps) it fresh each time


def _storage_span(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_a_freed_normalize_output_is_reused_by_the_next_one():
    """Fresh pages for a 38 MB float batch cost a page fault per 4 KiB every batch (at least one
    per 2 MiB with transparent huge pages); the memory of a freed output is handed to the next
    output of the same size instead (kept_memory.cpp), which then takes no page faults."""
    g = torch.Generator().manual_seed(0)
    first, second = (torch.randint(0, 256, KEPT_SHAPE, dtype=torch.uint8, generator=g)
                     for _ in range(2))
    out = ops.normalize(first, (0.5, 0.4, 0.3), (0.2, 0.3, 0.4))
    where = out.data_ptr()
    del out
    faults = _page_faults()
    again = ops.normalize(second, (0.5, 0.4, 0.3), (0.2, 0.3, 0.4))
    faults = _page_faults() - faults
    assert again.data_ptr() == where and faults < 8, faults
    fresh = torch.empty_like(again)  # for comparison: glibc's fresh pages fault in as written
    faults = _page_faults()
    fresh.fill_(1.0)
    assert _page_faults() - faults >= 16
    reference = _reference.normalize(second, torch.tensor([0.5, 0.4, 0.3]),
                                     torch.tensor([0.2, 0.3, 0.4]))
    assert torch.equal(again, reference)


def test_memory_any_tensor_still_uses_is_never_reused():
    """A view (or any tensor sharing the storage) keeps its memory: later outputs go elsewhere
    and the view's values stay as they were."""
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, KEPT_SHAPE, dtype=torch.uint8, generator=g)
    out = ops.normalize(images, (0.5,) * 3, (0.25,) * 3)
    view = out[5, 1]
    expected = view.clone()
    held = _storage_span(view)
    del out
    later = [ops.normalize(images.flip(0), (0.1,) * 3, (0.5,) * 3) for _ in range(4)]
    for tensor in later:
        start, end = _storage_span(tensor)
        assert end <= held[0] or start >= held[1]
    assert torch.equal(view, expected)


def test_kept_outputs_resize_share_and_free_like_any_tensor():
    images = torch.randint(0, 256, KEPT_SHAPE, dtype=torch.uint8)
    out = ops.normalize(images, (0.5,) * 3, (0.25,) * 3)
    first = out[0].clone()
    out.resize_(KEPT_SHAPE[0] + 4, *KEPT_SHAPE[1:])  # grows: copied into a new block
    assert torch.equal(out[0], first)
    shared = ops.normalize(images, (0.5,) * 3, (0.25,) * 3).share_memory_()
    assert shared.is_shared() and torch.equal(shared[0], first)
    # Freed on another thread: the allocator's list of kept blocks is locked.
    outputs = [ops.normalize(images, (0.5,) * 3, (0.25,) * 3) for _ in range(3)]
    threads = [threading.Thread(target=outputs.pop) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert torch.equal(ops.normalize(images, (0.5,) * 3, (0.25,) * 3)[0], first)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.slow
def test_large_float_outputs_written_around_the_cache_equal_the_reference(layout, dtype):
    """float32 outputs of 16 MiB or more are written with non-temporal stores; odd row lengths
    (333 floats) start rows off 16-byte alignment, which the stores must step around."""
    g = torch.Generator().manual_seed(2)
    images = _make((16, 3, 331, 333), dtype, layout, g)
    mean, std = torch.tensor([0.4, 0.5, 0.6]), torch.tensor([0.2, 0.25, 0.3])
    for channels_last in (False, True):
        out = ops.normalize(images, mean, std, channels_last=channels_last)
        assert out.nbytes >= 16 << 20
        expected = _reference.normalize(images, mean, std, channels_last=channels_last)
        assert torch.equal(out, expected)


def _normalize_in_child(queue):
    torch.set_num_threads(1)  # libgomp's pool does not survive fork (plain torch hangs too)
    images = torch.randint(0, 256, KEPT_SHAPE, dtype=torch.uint8)
    outputs = [ops.normalize(images, (0.5,) * 3, (0.25,) * 3) for _ in range(3)]
    del outputs
    out = ops.normalize(images, (0.5,) * 3, (0.25,) * 3)
    queue.put(bool(torch.equal(
        out, _reference.normalize(images, torch.full((3,), 0.5), torch.full((3,), 0.25)))))


@pytest.mark.timeout(120)
def test_a_forked_child_allocates_and_frees_kept_outputs():
    """The kept blocks' lock is taken around fork() (pthread_atfork), so a child (a DataLoader
    worker) starts with it unlocked and can allocate and free large outputs."""
    import multiprocessing

    images = torch.randint(0, 256, KEPT_SHAPE, dtype=torch.uint8)
    ops.normalize(images, (0.5,) * 3, (0.25,) * 3)  # freed at once: a kept block before the fork
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_normalize_in_child, args=(queue,))
    child.start()
    assert queue.get(timeout=60) is True
    child.join(timeout=60)
    assert child.exitcode == 0
